"""A stand-in for the `tensorrt` module at the GPU boundary, recording every call.

It implements the slice of TensorRT's Python API that infercc's builder and runner use, with
the same names and call shapes. The "network" is read from the ONNX file; the "engine" is bytes
(a header, the flags and profiles, the model); executing it runs the model with onnxruntime on
the CPU, reading inputs from and writing outputs to `HostMemory`, the fake device memory that
`HostDevice` (the runner's allocator) hands out. Precision read-back: the inspector reports
"Half" for every layer when the FP16 flag was set or the graph holds float16, else "Float"
(`force_layer_type` overrides).

Where the real API's behaviour matters, the stand-in copies it (checked against TensorRT's
Python bindings, pyCore.cpp / pyOnnx.cpp / pyInt8.cpp, and the 10.x -> 11.x migration guide):
`__version__` has four parts ("10.3.0.26"); `nptype` raises TypeError for types numpy lacks;
`set_timing_cache` returns False for a cache it refuses (`refuse_timing_cache`); a
version-compatible plan deserializes only with `Runtime.engine_host_code_allowed` set;
TensorRT 11 has no FP16/BF16/INT8/FP8 builder flags, no EXPLICIT_BATCH network flag, no
calibrator classes, no `int8_calibrator` / `set_calibration_profile` (not even as attributes:
`hasattr` is False, as on the real 11), and its inspector JSON splits a tensor's
`"Format/Datatype"` into `"Format"` and `"DataType"` and lists `"I/O Tensors"` instead of
`"Bindings"`; `HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY` exists from 10.9 on.

`FakeTrt(version)` mirrors that TensorRT version: tests/backends/test_trt_api_surface.py
checks, for every recorded version (tests/data/tensorrt_api/), that every name the fake
exposes, less `TEST_ONLY`, is in that version's list, and that the fake has every name the
code uses on that version's path. No test lives here; the other test_tensorrt files import it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from infercc.backends.trt.fingerprint import Fingerprint

A100 = Fingerprint("10.3.0", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
MAGIC = b"FAKEPLAN\n"
# What the stand-in has that TensorRT has not, by class: the recording, the knobs tests turn,
# back references and the fake engine's insides. Everything else it exposes is TensorRT's.
TEST_ONLY = {
    "FakeTrt": {
        "calls",
        "memory",
        "unsupported",
        "force_layer_type",
        "build_fails",
        "refuse_timing_cache",
        "names",
        "major",
        "release",
    },
    "FakeBuilder": {"trt"},
    "FakeNetwork": {"flags", "inputs", "model_bytes"},
    "FakeParser": {"trt", "network", "errors"},
    "FakeTimingCache": {"entries"},
    "FakeConfig": {"trt", "flags", "profiles", "timing_cache"},
    "FakeConfig10": {"trt", "flags", "profiles", "timing_cache"},
    "FakeProfile": {"trt", "shapes"},
    "FakeRuntime": {"trt"},
    "FakeEngine": {"trt", "header", "io", "model_bytes", "fp16"},
    "FakeInspector": {"engine"},
    "FakeContext": {"shapes", "addresses"},
}


class _Enum:
    def __init__(self, owner: str, names: list[str]):
        for i, name in enumerate(names):
            setattr(self, name, _Value(f"{owner}.{name}", i))


class _Value:
    def __init__(self, text: str, number: int):
        self.text, self.number = text, number

    def __int__(self) -> int:
        return self.number

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Value) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class HostMemory:
    """Fake device memory: pointer -> numpy array."""

    def __init__(self):
        self.arrays: dict[int, np.ndarray] = {}
        self.next = 4096

    def add(self, array: np.ndarray) -> int:
        self.next += 4096
        self.arrays[self.next] = array
        return self.next


class HostDevice:
    """The runner's allocator interface over HostMemory."""

    name = "host"

    def __init__(self, memory: HostMemory):
        self.memory = memory

    def stream(self) -> int:
        return 7

    def to_device(self, array: np.ndarray):
        copy = np.array(array)
        return copy, self.memory.add(copy)

    def empty(self, shape, dtype):
        array = np.zeros(tuple(shape), dtype=dtype)
        return array, self.memory.add(array)

    def to_host(self, buffer):
        return np.array(buffer)

    def synchronize(self) -> None:
        pass


class FakeTrt:
    """The tensorrt module stand-in. `calls` records (what, details) in order."""

    def __init__(self, version: str = "10.3.0.26", unsupported: tuple[str, ...] = ()):
        self.__version__ = version
        self.major = int(version.split(".")[0])
        self.release = tuple(int(p) for p in version.split(".")[:3])
        self.calls: list[tuple[str, Any]] = []
        self.memory = HostMemory()
        self.unsupported = set(unsupported)
        self.force_layer_type: str | None = None
        self.build_fails = False
        self.refuse_timing_cache = False
        flags = ["FP16", "BF16", "INT8", "VERSION_COMPATIBLE", "REFIT", "TF32", "FP8"]
        if self.major >= 11:  # the weak-typing flags are gone
            flags = ["VERSION_COMPATIBLE", "REFIT", "TF32"]
        self.BuilderFlag = _Enum("BuilderFlag", flags)
        network = ["EXPLICIT_BATCH", "STRONGLY_TYPED"] if self.major < 11 else ["STRONGLY_TYPED"]
        self.NetworkDefinitionCreationFlag = _Enum("NetworkDefinitionCreationFlag", network)
        self.MemoryPoolType = _Enum("MemoryPoolType", ["WORKSPACE"])
        self.ProfilingVerbosity = _Enum(
            "ProfilingVerbosity", ["LAYER_NAMES_ONLY", "DETAILED", "NONE"]
        )
        levels = ["NONE", "AMPERE_PLUS"]
        if self.release >= (10, 9):  # TensorRT 10.9 added it
            levels.append("SAME_COMPUTE_CAPABILITY")
        self.HardwareCompatibilityLevel = _Enum("HardwareCompatibilityLevel", levels)
        self.LayerInformationFormat = _Enum("LayerInformationFormat", ["ONELINE", "JSON"])
        self.TensorIOMode = _Enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
        fake = self

        class Logger:
            WARNING = "WARNING"

            def __init__(self, severity: str = "WARNING"):
                self.severity = severity

        class _Calibrator:
            """TensorRT's calibrator bases: the methods are pure virtual (a subclass gives
            them; the base's raise, as pybind11's trampolines do)."""

            def __init__(self):
                fake.calls.append(("calibrator_init", type(self).__mro__[1].__name__))

            def get_batch_size(self) -> int:
                raise RuntimeError("Tried to call pure virtual function")

            def get_batch(self, names: Any) -> Any:
                raise RuntimeError("Tried to call pure virtual function")

            def read_calibration_cache(self) -> Any:
                raise RuntimeError("Tried to call pure virtual function")

            def write_calibration_cache(self, cache: Any) -> None:
                raise RuntimeError("Tried to call pure virtual function")

        class IInt8EntropyCalibrator2(_Calibrator):
            pass

        class IInt8MinMaxCalibrator(_Calibrator):
            pass

        self.Logger = Logger
        if self.major < 11:  # TensorRT 11 removed the calibrators
            self.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
            self.IInt8MinMaxCalibrator = IInt8MinMaxCalibrator

    # -- module functions and classes --

    def init_libnvinfer_plugins(self, logger: Any, namespace: str) -> bool:
        self.calls.append(("init_libnvinfer_plugins", namespace))
        return True

    def nptype(self, dtype: Any) -> type:
        """Like trt.nptype: the numpy type, TypeError for types numpy lacks."""
        if isinstance(dtype, type) and issubclass(dtype, np.generic):
            return dtype
        raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")

    def Builder(self, logger: Any) -> FakeBuilder:  # noqa: N802 (TensorRT's name)
        self.calls.append(("Builder", None))
        return FakeBuilder(self)

    def OnnxParser(self, network: FakeNetwork, logger: Any) -> FakeParser:  # noqa: N802
        return FakeParser(self, network)

    def Runtime(self, logger: Any) -> FakeRuntime:  # noqa: N802
        return FakeRuntime(self)

    def names(self, what: str) -> list[Any]:
        return [details for kind, details in self.calls if kind == what]


class FakeBuilder:
    def __init__(self, trt: FakeTrt):
        self.trt = trt

    def create_network(self, flags: int = 0) -> FakeNetwork:
        self.trt.calls.append(("create_network", flags))
        return FakeNetwork(flags)

    def create_builder_config(self) -> FakeConfig:
        return FakeConfig10(self.trt) if self.trt.major < 11 else FakeConfig(self.trt)

    def create_optimization_profile(self) -> FakeProfile:
        return FakeProfile(self.trt)

    def build_serialized_network(self, network: FakeNetwork, config: FakeConfig) -> Any:
        self.trt.calls.append(("build_serialized_network", None))
        if self.trt.build_fails:
            return None
        config.timing_cache.entries += 1
        header = {
            "flags": sorted(repr(f) for f in config.flags),
            "profiles": [p.shapes for p in config.profiles],
            "model": base64.b64encode(network.model_bytes).decode(),
        }
        return memoryview(MAGIC + json.dumps(header).encode())


class FakeTensor:
    def __init__(self, name: str, shape: tuple[int, ...], shape_tensor: bool = False):
        self.name, self.shape, self.is_shape_tensor = name, shape, shape_tensor


class FakeNetwork:
    def __init__(self, flags: int):
        self.flags = flags
        self.inputs: list[FakeTensor] = []
        self.model_bytes = b""

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> FakeTensor:
        return self.inputs[i]


class FakeError:
    def __init__(self, node: int, name: str, op: str, desc: str):
        self._node, self._name, self._op, self._desc = node, name, op, desc

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._name

    def node_operator(self) -> str:
        return self._op

    def desc(self) -> str:
        return self._desc


class FakeParser:
    def __init__(self, trt: FakeTrt, network: FakeNetwork):
        self.trt, self.network = trt, network
        self.errors: list[FakeError] = []

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> FakeError:
        return self.errors[i]

    def parse_from_file(self, path: str) -> bool:
        self.trt.calls.append(("parse_from_file", path))
        model = onnx.load(path)
        for i, node in enumerate(model.graph.node):
            if node.op_type in self.trt.unsupported:
                desc = f"No importer registered for op: {node.op_type}"
                self.errors.append(FakeError(i, node.name, node.op_type, desc))
        inits = {t.name for t in model.graph.initializer}
        for vi in model.graph.input:
            if vi.name not in inits:
                dims = vi.type.tensor_type.shape.dim
                shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
                self.network.inputs.append(FakeTensor(vi.name, shape))
        self.network.model_bytes = model.SerializeToString()
        return not self.errors


class FakeTimingCache:
    def __init__(self, data: bytes):
        if data and not data.startswith(b"TIMING"):
            raise RuntimeError("invalid timing cache")
        self.entries = int(data[6:] or 0) if data else 0

    def serialize(self) -> memoryview:
        return memoryview(b"TIMING" + str(self.entries).encode())


class FakeConfig:
    """IBuilderConfig as TensorRT 11 has it (FakeConfig10 adds what 10 has besides)."""

    builder_optimization_level = 3

    def __init__(self, trt: FakeTrt):
        self.trt = trt
        self.flags: set[Any] = set()
        self.profiles: list[FakeProfile] = []
        self.timing_cache = FakeTimingCache(b"")
        # TensorRT's defaults, set without recording a call
        object.__setattr__(self, "profiling_verbosity", trt.ProfilingVerbosity.LAYER_NAMES_ONLY)
        object.__setattr__(
            self, "hardware_compatibility_level", trt.HardwareCompatibilityLevel.NONE
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "int8_calibrator" and not isinstance(self, FakeConfig10):
            raise AttributeError("TensorRT 11 removed IBuilderConfig.int8_calibrator")
        if name in (
            "builder_optimization_level",
            "hardware_compatibility_level",
            "profiling_verbosity",
            "int8_calibrator",
        ):
            self.trt.calls.append((name, value))
        object.__setattr__(self, name, value)

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.trt.calls.append(("set_memory_pool_limit", (repr(pool), size)))

    def set_flag(self, flag: Any) -> None:
        self.trt.calls.append(("set_flag", repr(flag)))
        self.flags.add(flag)

    def add_optimization_profile(self, profile: FakeProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> FakeTimingCache:
        self.trt.calls.append(("create_timing_cache", bytes(data)))
        return FakeTimingCache(bytes(data))

    def set_timing_cache(self, cache: FakeTimingCache, ignore_mismatch: bool) -> bool:
        """Like TensorRT: False (and the cache not set) for a cache it refuses."""
        self.trt.calls.append(("set_timing_cache", ignore_mismatch))
        if self.trt.refuse_timing_cache and cache.entries and not ignore_mismatch:
            return False
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> FakeTimingCache:
        return self.timing_cache


class FakeConfig10(FakeConfig):
    """IBuilderConfig of TensorRT 10: the INT8 calibrator and its profile as well."""

    @property
    def int8_calibrator(self) -> Any:
        return self.__dict__.get("_int8_calibrator")

    @int8_calibrator.setter
    def int8_calibrator(self, value: Any) -> None:
        self.__dict__["_int8_calibrator"] = value

    def set_calibration_profile(self, profile: FakeProfile) -> None:
        self.trt.calls.append(("set_calibration_profile", self.profiles.index(profile)))


class FakeProfile:
    def __init__(self, trt: FakeTrt):
        self.trt = trt
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, name: str, lo, opt, hi) -> None:
        self.trt.calls.append(("set_shape", (name, tuple(lo), tuple(opt), tuple(hi))))
        self.shapes[name] = [list(lo), list(opt), list(hi)]

    def set_shape_input(self, name: str, lo, opt, hi) -> None:
        self.trt.calls.append(("set_shape_input", (name, tuple(lo), tuple(opt), tuple(hi))))


class FakeRuntime:
    def __init__(self, trt: FakeTrt):
        self.trt = trt
        self.engine_host_code_allowed = False

    def deserialize_cuda_engine(self, data: bytes) -> FakeEngine | None:
        """None for what TensorRT cannot deserialize, as the real one: not a plan, or a
        version-compatible plan (it carries a lean runtime) without engine_host_code_allowed."""
        self.trt.calls.append(("deserialize_cuda_engine", len(data)))
        data = bytes(data)
        if not data.startswith(MAGIC):
            return None
        header = json.loads(data[len(MAGIC) :])
        if "BuilderFlag.VERSION_COMPATIBLE" in header["flags"] and not (
            self.engine_host_code_allowed
        ):
            return None
        return FakeEngine(self.trt, header)


_ONNX_TO_NP = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
}


class FakeEngine:
    def __init__(self, trt: FakeTrt, header: dict[str, Any]):
        self.trt, self.header = trt, header
        self.model_bytes = base64.b64decode(header["model"])
        model = onnx.load_from_string(self.model_bytes)
        inits = {t.name for t in model.graph.initializer}
        ins = [vi for vi in model.graph.input if vi.name not in inits]
        self.io = [(vi.name, "INPUT", vi) for vi in ins] + [
            (vi.name, "OUTPUT", vi) for vi in model.graph.output
        ]
        self.fp16 = any(
            vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
            for vi in [*model.graph.value_info, *model.graph.output]
        ) or any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, i: int) -> str:
        return self.io[i][0]

    def _entry(self, name: str):
        return next(e for e in self.io if e[0] == name)

    def get_tensor_mode(self, name: str) -> Any:
        return getattr(self.trt.TensorIOMode, self._entry(name)[1])

    def get_tensor_dtype(self, name: str) -> type:
        return _ONNX_TO_NP[self._entry(name)[2].type.tensor_type.elem_type]

    def is_shape_inference_io(self, name: str) -> bool:
        return False

    def create_execution_context(self) -> FakeContext:
        return FakeContext(self)

    def create_engine_inspector(self) -> FakeInspector:
        return FakeInspector(self)


class FakeInspector:
    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.execution_context = None

    def get_engine_information(self, fmt: Any) -> str:
        trt = self.engine.trt
        trt.calls.append(("get_engine_information", repr(fmt)))
        half = "BuilderFlag.FP16" in self.engine.header["flags"] or self.engine.fp16
        kind = trt.force_layer_type or ("Half" if half else "Float")
        if self.execution_context is None:
            kind = "N/A due to dynamic shapes"
        names = [name for name, _, _ in self.engine.io]
        if trt.major >= 11:  # "Format/Datatype" split in two; "Bindings" -> "I/O Tensors"
            tensor = {"Format": "Row major linear format (kLINEAR)", "DataType": kind}
            io_key, io = "I/O Tensors", [{"Name": n} for n in names]
        else:
            tensor, io_key, io = {"Format/Datatype": kind}, "Bindings", names
        layer = {"Inputs": [tensor], "Outputs": [tensor]}
        layers = [dict(layer, Name=f"layer{i}") for i in range(3)]
        return json.dumps({"Layers": layers, io_key: io})


class FakeContext:
    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self._results: dict[str, np.ndarray] | None = None

    def set_input_shape(self, name: str, shape) -> bool:
        self.engine.trt.calls.append(("set_input_shape", (name, tuple(shape))))
        self.shapes[name] = tuple(shape)
        self._results = None
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        self._results = None
        return True

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        self.engine.trt.calls.append(("set_optimization_profile_async", index))
        return True

    def _run(self) -> dict[str, np.ndarray]:
        if self._results is None:
            memory = self.engine.trt.memory.arrays
            feeds = {
                n: memory[self.addresses[n]] for n, mode, _ in self.engine.io if mode == "INPUT"
            }
            session = ort.InferenceSession(
                self.engine.model_bytes, providers=["CPUExecutionProvider"]
            )
            names = [o.name for o in session.get_outputs()]
            self._results = dict(zip(names, session.run(None, feeds), strict=True))
        return self._results

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._run()[name].shape)

    def execute_async_v3(self, stream: int) -> bool:
        self.engine.trt.calls.append(("execute_async_v3", stream))
        memory = self.engine.trt.memory.arrays
        for name, mode, _ in self.engine.io:
            if mode == "OUTPUT":
                np.copyto(memory[self.addresses[name]], self._run()[name])
        return True


def write_model(path: Path, model: onnx.ModelProto) -> Path:
    onnx.save(model, str(path))
    return path
