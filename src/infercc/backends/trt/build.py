"""Building a TensorRT engine from the optimized ONNX model, and the artifact around it.

The build, step by step (`build_engine`; `trt` is the tensorrt module, passed in so that
tests can hand in a recording stand-in):

1. load plugin libraries (`ctypes.CDLL(path, RTLD_GLOBAL)`), then register TensorRT's own and
   theirs with `trt.init_libnvinfer_plugins(logger, "")`;
2. `precision.decide` -> network creation flags and builder flags;
3. `builder.create_network(flags)`, `trt.OnnxParser(network, logger).parse_from_file(model)`
   (the path form, so external weights beside the model are found). On failure every parser
   error is named: node, op type and TensorRT's reason, with the advice to use `--backend
   ort` or a plugin;
4. the builder config: workspace pool limit, optimization level, hardware compatibility level,
   VERSION_COMPATIBLE, the precision flags, `ProfilingVerbosity.DETAILED` (so the inspector
   can report layer precisions), the INT8 calibrator when a calibration cache is used;
5. one optimization profile per resolved profile (`profiles.add_profiles`);
6. the timing cache of this fingerprint loaded into the config (`caches.TimingCacheFile`);
7. `build_serialized_network`; the timing cache saved back;
8. the engine deserialized (with `engine_host_code_allowed` when built version-compatible,
   which TensorRT requires for such engines) and inspected: layers per precision
   (`precision.layer_precisions`, with an execution context at profile 0's opt shapes so
   dynamic shapes report formats), which must include the requested precision
   (`precision.check_layers`), and its I/O tensors.

`compile_artifact` puts that together with the engine cache: fingerprint this machine, warn
(or refuse, `strict_target`) when the GPU is not the target's, resolve profiles, look the
engine up by key, build on a miss, write `engine.plan` and `tensorrt.json`, and validate the
engine against onnxruntime on the CPU (random feeds at each profile's opt shapes,
`infercc.precisions.TOLERANCES` for the precision the engine computes in:
`precision.compute_precision`). `open_engine` is the load side: it checks the recorded
fingerprint against this machine's before deserializing.
"""

from __future__ import annotations

import ctypes
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.analysis.targets import Target
from infercc.backends.trt import caches, precision, profiles
from infercc.backends.trt.fingerprint import Fingerprint, check_loadable, detect, target_mismatch
from infercc.backends.trt.settings import BuildSettings, read_settings
from infercc.backends.trt.versions import tensorrt_majors, tensorrt_names
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError, ValidationError
from infercc.ir.wire import read_model
from infercc.precisions import tolerance
from infercc.runtime.backend import CompileOptions
from infercc.util import read_schema_json

log = logging.getLogger(__name__)

SCHEMA = "infercc.tensorrt/1"
PLAN_FILE = "engine.plan"
CONFIG_FILE = "tensorrt.json"
ORT_HINT = "use --backend ort (onnxruntime runs every standard ONNX op)"

LoadLibrary = Callable[[str], Any]


def load_library(path: str) -> Any:
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def load_plugins(trt: Any, logger: Any, plugins: Sequence[str], loader: LoadLibrary) -> list[Any]:
    """Load plugin libraries, then register all plugin creators with TensorRT."""
    handles = []
    for path in plugins:
        try:
            handles.append(loader(path))
        except OSError as exc:
            raise InferccError(
                f"cannot load TensorRT plugin library {path}: {exc}",
                "check that it was built for this TensorRT and CUDA",
            ) from exc
    trt.init_libnvinfer_plugins(logger, "")
    return handles


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParseProblem:
    node: int
    name: str
    op: str
    reason: str

    def phrase(self) -> str:
        if self.node < 0 and not self.name:
            return self.reason
        where = f"node {self.name!r}" if self.name else f"node #{self.node}"
        return f"{where} ({self.op or 'unknown op'}): {self.reason}"


def _call(obj: Any, name: str) -> Any:
    method = getattr(obj, name, None)
    try:
        return method() if callable(method) else None
    except Exception:  # older parsers lack a field or raise for graph-level errors
        return None


def parse_problems(parser: Any, nodes: Sequence[onnx.NodeProto]) -> list[ParseProblem]:
    """One ParseProblem per parser error; node name and op from TensorRT 10's
    `node_name()`/`node_operator()`, else from the model's node at `node()`."""
    found = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        index = _call(error, "node")
        index = int(index) if isinstance(index, int) else -1
        node = nodes[index] if 0 <= index < len(nodes) else None
        name = _call(error, "node_name") or (node.name if node is not None else "")
        op = _call(error, "node_operator") or (node.op_type if node is not None else "")
        found.append(ParseProblem(index, str(name), str(op), str(_call(error, "desc") or "")))
    return found


def parse_error(problems: Sequence[ParseProblem]) -> InferccError:
    ops = sorted({p.op for p in problems if p.op})
    head = f"TensorRT cannot parse the model: {len(problems)} error(s)"
    if ops:
        head += f" at op(s) {', '.join(ops)}"
    details = "; ".join(p.phrase() for p in problems) or "no reason given"
    return InferccError(
        f"{head}: {details}",
        f"{ORT_HINT}, or load a plugin implementing the op with --plugin LIB",
    )


def parse(trt: Any, network: Any, logger: Any, model: Path) -> Any:
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        raise parse_error(parse_problems(parser, list(read_model(model)[0].graph.node)))
    return parser


# --------------------------------------------------------------------------- configuring


HW_LEVELS = {
    "ampere+": "AMPERE_PLUS",
    # TensorRT 10.8 and older lack it (10.9.0.34 is the first bindings wheel that has it);
    # `_enum` then says so.
    "same-cc": tensorrt_names("SAME_COMPUTE_CAPABILITY", since="10.9"),
    "none": "NONE",
}


def _enum(owner: Any, name: str, what: str, version: str) -> Any:
    value = getattr(owner, name, None)
    if value is None:
        raise InferccError(
            f"TensorRT {version} has no {what} {name}", "upgrade tensorrt or drop the option"
        )
    return value


def network_flags(trt: Any, names: Sequence[str]) -> int:
    bits = 0
    for name in names:
        flag = getattr(trt.NetworkDefinitionCreationFlag, name, None)
        if flag is not None:
            bits |= 1 << int(flag)
    return bits


def configure(
    trt: Any, builder: Any, settings: BuildSettings, plan: precision.PrecisionPlan
) -> Any:
    version = str(trt.__version__)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    if settings.opt_level is not None:
        config.builder_optimization_level = settings.opt_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if settings.hw_compat != "none":
        levels = _enum(trt, "HardwareCompatibilityLevel", "hardware compatibility", version)
        name = HW_LEVELS[settings.hw_compat]
        config.hardware_compatibility_level = _enum(levels, name, "hardware level", version)
    if settings.version_compatible:
        config.set_flag(_enum(trt.BuilderFlag, "VERSION_COMPATIBLE", "builder flag", version))
    for name in plan.builder_flags:
        config.set_flag(_enum(trt.BuilderFlag, name, "builder flag", version))
    return config


# --------------------------------------------------------------------------- building


@dataclass
class BuildResult:
    plan: bytes
    layers: dict[str, int]
    io: list[dict[str, Any]]
    network_flags: list[str]
    builder_flags: list[str]
    notes: list[str]
    timing_cache: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def info(self) -> dict[str, Any]:
        return {
            "layers": self.layers,
            "io": self.io,
            "network_flags": self.network_flags,
            "builder_flags": self.builder_flags,
            "notes": self.notes,
        }


def build_engine(
    trt: Any,
    model: Path,
    settings: BuildSettings,
    resolved: Sequence[profiles.Profile],
    shape_values: Mapping[str, profiles.Range],
    timing: caches.TimingCacheFile | None,
    graph: set[str],
    loader: LoadLibrary = load_library,
) -> BuildResult:
    """Parse, configure, build, inspect (see the module doc)."""
    started = time.perf_counter()
    version = str(trt.__version__)
    logger = trt.Logger(trt.Logger.WARNING)
    load_plugins(trt, logger, settings.plugins, loader)
    plan = precision.decide(version, settings.precision, graph, settings.calib_cache is not None)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, plan.network_flags))
    parser = parse(trt, network, logger, model)
    config = configure(trt, builder, settings, plan)
    trt_profiles = profiles.add_profiles(builder, config, network, resolved, shape_values)
    if plan.calibrator:
        _use_calibrator(trt, config, settings, trt_profiles, version)
    timing_status = timing.load_into(config, settings.timing_cache_strict) if timing else "off"
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise InferccError(
            "TensorRT could not build an engine for the model (its log above says why)",
            f"{ORT_HINT}, or try a larger --workspace",
        )
    timing_info = {"status": timing_status}
    if timing is not None:
        timing_info.update(path=str(timing.path), bytes=timing.save_from(config))
    data = caches.host_bytes(serialized)
    del parser
    layers, io = inspect_engine(trt, logger, data, resolved, settings.version_compatible)
    precision.check_layers(layers, settings.precision)
    return BuildResult(
        plan=data,
        layers=layers,
        io=io,
        network_flags=list(plan.network_flags),
        builder_flags=list(plan.builder_flags),
        notes=list(plan.notes),
        timing_cache=timing_info,
        seconds=time.perf_counter() - started,
    )


@tensorrt_majors(10)
def _use_calibrator(
    trt: Any, config: Any, settings: BuildSettings, trt_profiles: list[Any], version: str
) -> None:
    from infercc.backends.trt.calibrator import make_calibrator

    config.int8_calibrator = make_calibrator(trt, settings.calib_cache or "", version)
    if trt_profiles and hasattr(config, "set_calibration_profile"):
        config.set_calibration_profile(trt_profiles[0])


def inspect_engine(
    trt: Any,
    logger: Any,
    data: bytes,
    resolved: Sequence[profiles.Profile],
    host_code: bool = False,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """(layers per precision, I/O tensors) of a serialized engine; `host_code` for
    version-compatible engines (see `runner.make_runtime`)."""
    from infercc.backends.trt.runner import make_runtime

    engine = make_runtime(trt, logger, host_code).deserialize_cuda_engine(data)
    if engine is None:
        raise InferccError("TensorRT built an engine it cannot deserialize", "rebuild it")
    io = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        io.append(
            {
                "name": name,
                "mode": "input" if is_input else "output",
                "dtype": _dtype_name(trt, engine.get_tensor_dtype(name)),
            }
        )
    inspector = engine.create_engine_inspector()
    context = engine.create_execution_context()
    if resolved and context is not None:
        for item in io:
            opt = resolved[0].get(item["name"])
            if item["mode"] == "input" and opt and not engine.is_shape_inference_io(item["name"]):
                context.set_input_shape(item["name"], opt[1])
        inspector.execution_context = context
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return precision.layer_precisions(info), io


def _dtype_name(trt: Any, trt_dtype: Any) -> str:
    """numpy's name for a TensorRT DataType; TensorRT's own name for those numpy lacks
    (`trt.nptype` raises TypeError for bf16 and fp8)."""
    try:
        return np.dtype(trt.nptype(trt_dtype)).name
    except TypeError:
        return str(trt_dtype)


# --------------------------------------------------------------------------- the artifact


@dataclass
class Hooks:
    """The GPU boundary, replaceable in tests: the fingerprint probe, the plugin loader and
    the device allocator for validation runs (None: `runner.pick_device`)."""

    fingerprint: Callable[[Any], Fingerprint] = detect
    loader: LoadLibrary = load_library
    device: Any = None


def model_digest(model: Path, proto: onnx.ModelProto) -> str:
    """sha256 over the model file and the external data files it names."""
    import hashlib

    from infercc.runtime.tuning import file_sha256

    parts = [file_sha256(model)]
    locations = sorted(
        {
            e.value
            for t in proto.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for e in t.external_data
            if e.key == "location"
        }
    )
    parts += [file_sha256(model.parent / loc) for loc in locations]
    return hashlib.sha256("".join(parts).encode()).hexdigest() if locations else parts[0]


def compile_artifact(
    trt: Any,
    model: Path,
    target: Target,
    shapes: Sequence[ShapeProfile],
    options: CompileOptions,
    cache: Any,
    out_dir: Path,
    hooks: Hooks | None = None,
) -> dict[str, Any]:
    """Build (or fetch from the engine cache) the engine; write engine.plan and tensorrt.json;
    return the manifest's backend section."""
    hooks = hooks or Hooks()
    model, out_dir = Path(model), Path(out_dir)
    step = options.on_step or (lambda _s: None)
    settings = read_settings(options, target.memory_bytes, out_dir, model)
    here = hooks.fingerprint(trt)
    portability = _check_target(target, here, settings.strict_target)
    proto = read_model(model)[0]
    more = [
        profiles.as_profiles(p, f"--trt-profile {i}") for i, p in enumerate(settings.profiles, 1)
    ]
    resolved = profiles.resolve_all(proto, shapes, more)
    shape_values = profiles.shape_input_values(settings.shape_inputs)
    graph = precision.graph_precisions(proto)
    jsonable = profiles.to_jsonable(resolved)
    builder_options = settings.builder_options()
    engines = caches.EngineCache(cache) if cache is not None else None
    key = caches.engine_key(
        model_digest(model, proto), jsonable, settings.precision, builder_options, here
    )
    hit = engines.get(key) if engines is not None else None
    if hit is not None:
        step("TensorRT engine: cache hit")
        data, info, status, timing = hit[0], hit[1], "hit", {"status": "not needed"}
    else:
        step("building the TensorRT engine")
        cache_dir = Path(cache.directory) if cache is not None else _cache_dir(settings)
        timing_file = caches.TimingCacheFile(cache_dir, here)
        built = build_engine(
            trt, model, settings, resolved, shape_values, timing_file, graph, hooks.loader
        )
        data, info, timing = built.plan, built.info(), built.timing_cache
        status = "miss" if engines is not None else "off"
        if engines is not None:
            engines.put(key, data, info, built.seconds)
    (out_dir / PLAN_FILE).write_bytes(data)
    config = {
        "schema": SCHEMA,
        "plan": PLAN_FILE,
        "fingerprint": here.to_dict(),
        "builder_options": builder_options,
        "workspace_rule": settings.workspace_rule,
        "precision": {"requested": settings.precision, "graph": sorted(graph), **info},
        "profiles": jsonable,
        "shape_inputs": {k: [list(x) for x in v] for k, v in shape_values.items()},
        "outputs": [o.name for o in proto.graph.output],
        "portability": portability,
        "engine_cache": status,
        "timing_cache": timing,
    }
    if settings.validate:
        step("validating the TensorRT engine against onnxruntime")
        config["validation"] = validate_engine(trt, model, proto, data, config, options, hooks)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return _section(config, str(trt.__version__))


def _cache_dir(settings: BuildSettings) -> Path:
    from infercc.runtime.tuning import default_cache_dir

    return Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()


def _check_target(target: Target, here: Fingerprint, strict: bool) -> dict[str, Any]:
    """Warn (or refuse with `strict`) when the GPU here is not the target's; both recorded."""
    why = target_mismatch(target.name, target.compute_capability, here)
    record = {
        "target": {"name": target.name, "compute_capability": target.compute_capability},
        "built_on": {"gpu": here.gpu, "compute_capability": here.compute_capability},
        "matches_target": why is None,
    }
    if why is None:
        return record
    if strict:
        raise InferccError(
            f"--strict-target: {why}; a TensorRT engine is tuned for the GPU that builds it",
            f"build on a {target.name}, or drop --strict-target (or --target) to build for "
            "this GPU",
        )
    log.warning(
        "TensorRT engines are not portable: %s; the engine is built and tuned for this GPU, "
        "not for %s (both are recorded in the manifest)",
        why,
        target.name,
    )
    record["warning"] = why
    return record


def _section(config: Mapping[str, Any], version: str) -> dict[str, Any]:
    keep = (
        "fingerprint",
        "builder_options",
        "precision",
        "profiles",
        "portability",
        "engine_cache",
        "timing_cache",
        "validation",
    )
    return {
        "name": "tensorrt",
        "version": version,
        "files": [PLAN_FILE, CONFIG_FILE],
        **{k: config[k] for k in keep if k in config},
        "points": [],
    }


# --------------------------------------------------------------------------- validation


def validate_engine(
    trt: Any,
    model: Path,
    proto: onnx.ModelProto,
    data: bytes,
    config: Mapping[str, Any],
    options: CompileOptions,
    hooks: Hooks,
) -> dict[str, Any]:
    """Compare the engine with onnxruntime (CPU) at each profile's opt shapes; ValidationError
    when an output differs beyond the precision's tolerance."""
    from infercc.backends.trt.runner import TrtRunner
    from infercc.check.compare import compare_outputs, run_model
    from infercc.data.feeds import make_inputs

    resolved = profiles.from_jsonable(config["profiles"])
    host_code = bool((config.get("builder_options") or {}).get("version_compatible"))
    runner = TrtRunner(
        trt, data, resolved, config["outputs"], device=hooks.device, host_code=host_code
    )
    feeds = [
        make_inputs(proto, {n: r[1] for n, r in p.items()}, seed=options.seed) for p in resolved
    ]
    expected = run_model(model, feeds)
    actual = [dict(zip(runner.output_names, runner.run(f), strict=True)) for f in feeds]
    computed = precision.compute_precision(
        config["precision"]["requested"], config["fingerprint"].get("compute_capability")
    )
    tol = tolerance(computed, options.atol, options.rtol, options.min_cosine)
    report = compare_outputs(expected, actual, *tol.as_tuple())
    if not report.passed:
        failure = report.failures()[0]
        raise ValidationError(
            f"the TensorRT engine's output {failure.name!r} differs from onnxruntime's: "
            f"{failure.reason}",
            "try --opt-level 0, a higher precision, or --backend ort",
        )
    return report.to_dict()


# --------------------------------------------------------------------------- loading


def read_config(directory: Path) -> dict[str, Any]:
    missing = (
        f"{directory} has no {CONFIG_FILE}: it was not built by the tensorrt backend",
        "rebuild it with infercc optimize MODEL -o DIR --backend tensorrt",
    )
    return read_schema_json(
        Path(directory) / CONFIG_FILE, SCHEMA, missing, "rebuild the artifact with this infercc"
    )


def check_config(config: Mapping[str, Any], here: Fingerprint) -> list[str]:
    """Raise when the engine cannot run here (fingerprint differences); the warnings."""
    built = Fingerprint.from_dict(config.get("fingerprint") or {})
    options = config.get("builder_options") or {}
    return check_loadable(
        built, here, bool(options.get("version_compatible")), str(options.get("hw_compat", "none"))
    )


def open_engine(trt: Any, directory: Path, hooks: Hooks | None = None) -> Any:
    """A TrtRunner for an artifact, after checking that it was built for this setup."""
    from infercc.backends.trt.runner import TrtRunner

    hooks = hooks or Hooks()
    config = read_config(directory)
    check_config(config, hooks.fingerprint(trt))
    options = config.get("builder_options") or {}
    plugins = [p["path"] for p in options.get("plugins", [])]
    load_plugins(trt, trt.Logger(trt.Logger.WARNING), plugins, hooks.loader)
    data = (Path(directory) / config.get("plan", PLAN_FILE)).read_bytes()
    resolved = profiles.from_jsonable(config.get("profiles") or [])
    host_code = bool(options.get("version_compatible"))
    return TrtRunner(
        trt, data, resolved, config.get("outputs"), device=hooks.device, host_code=host_code
    )
