"""Running a TensorRT engine: GPU buffers, the profile for the feeds' shapes, execute_async_v3.

GPU memory comes from PyTorch when it is importable with CUDA (`torch.cuda`), else from
cuda-python (`cuda.bindings.runtime` / `cuda.cudart`), else `pick_device` raises saying what to
install. PyTorch first because it is what GPU machines most often already have (it brings its
own CUDA runtime and a caching allocator, so repeated runs do not call cudaMalloc); cuda-python
is NVIDIA's own thin binding, a small install where PyTorch is absent. Both are optional: the
tensorrt package itself allocates no tensors.

The engine is deserialized with `engine_host_code_allowed` when it was built
version-compatible (`host_code`), which TensorRT requires for such engines.

Per run: the profile is `profiles.select_profile` of the feeds' shapes (switched with
`set_optimization_profile_async(index, stream)` when it changes); every input is copied to
the device and bound with `set_input_shape` + `set_tensor_address` (shape-tensor inputs, for
which `engine.is_shape_inference_io` is true, stay in host memory as TensorRT requires); each
output gets a buffer of `context.get_tensor_shape`; `execute_async_v3` runs on the device's
stream, which is then synchronized and the outputs copied back in the model's output order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from infercc.backends.trt.profiles import Profile, select_profile
from infercc.errors import InferccError

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install PyTorch with CUDA (pip install torch) or NVIDIA's cuda-python "
    "(pip install cuda-python)"
)


# --------------------------------------------------------------------------- device memory


class TorchDevice:
    """GPU buffers as torch tensors on the current CUDA stream."""

    name = "torch"

    def __init__(self, torch: Any):
        self.torch = torch

    def stream(self) -> int:
        return int(self.torch.cuda.current_stream().cuda_stream)

    def to_device(self, array: np.ndarray) -> tuple[Any, int]:
        tensor = self.torch.from_numpy(np.ascontiguousarray(array)).to("cuda")
        return tensor, int(tensor.data_ptr())

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> tuple[Any, int]:
        torch_dtype = self.torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        tensor = self.torch.empty(tuple(shape), dtype=torch_dtype, device="cuda")
        return tensor, int(tensor.data_ptr())

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.cpu().numpy()

    def synchronize(self) -> None:
        self.torch.cuda.current_stream().synchronize()


class CudaPythonDevice:
    """GPU buffers from cuda-python's runtime API (cudaMalloc / cudaMemcpy, one stream)."""

    name = "cuda-python"

    def __init__(self, runtime: Any):
        self.rt = runtime
        self._stream = self._check(runtime.cudaStreamCreate())

    def _check(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise InferccError(f"CUDA call failed: {err}", "check the GPU with nvidia-smi")
        return rest[0] if rest else None

    def stream(self) -> int:
        return int(self._stream)

    def _alloc(self, nbytes: int) -> tuple[Any, int]:
        ptr = self._check(self.rt.cudaMalloc(max(1, nbytes)))
        return _CudaBuffer(self, ptr, nbytes), int(ptr)

    def to_device(self, array: np.ndarray) -> tuple[Any, int]:
        array = np.ascontiguousarray(array)
        buffer, ptr = self._alloc(array.nbytes)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, kind))
        return buffer, ptr

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> tuple[Any, int]:
        buffer, ptr = self._alloc(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        buffer.shape, buffer.dtype = tuple(shape), np.dtype(dtype)
        return buffer, ptr

    def to_host(self, buffer: Any) -> np.ndarray:
        out = np.empty(buffer.shape, dtype=buffer.dtype)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpy(out.ctypes.data, buffer.ptr, out.nbytes, kind))
        return out

    def synchronize(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self._stream))


class _CudaBuffer:
    def __init__(self, device: CudaPythonDevice, ptr: Any, nbytes: int):
        self.device, self.ptr, self.nbytes = device, ptr, nbytes
        self.shape: tuple[int, ...] = ()
        self.dtype = np.dtype(np.uint8)

    def __del__(self) -> None:
        try:
            self.device.rt.cudaFree(self.ptr)
        except Exception:  # interpreter shutdown
            pass


def pick_device() -> Any:
    """PyTorch with CUDA, else cuda-python, else InferccError (see the module doc)."""
    try:
        import torch

        if torch.cuda.is_available():
            return TorchDevice(torch)
    except ImportError:
        pass
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise InferccError(
                "running a TensorRT engine needs GPU buffers, and neither PyTorch with CUDA "
                "nor cuda-python is installed",
                INSTALL_HINT,
            ) from None
    return CudaPythonDevice(runtime)


# --------------------------------------------------------------------------- the runner


def numpy_dtype(trt: Any, trt_dtype: Any) -> np.dtype:
    """numpy's dtype for a TensorRT DataType (`trt.nptype`, which raises TypeError for types
    numpy lacks: bf16, fp8, fp4, int4)."""
    try:
        return np.dtype(trt.nptype(trt_dtype))
    except TypeError:
        raise InferccError(
            f"the engine has an input or output of TensorRT type {trt_dtype}, which numpy "
            "cannot hold",
            "keep the model's inputs and outputs float32/float16/int8/int32/int64/bool/uint8",
        ) from None


def make_runtime(trt: Any, logger: Any, host_code: bool = False) -> Any:
    """A trt.Runtime; `host_code` allows engines that carry host code, which every
    version-compatible engine does (its lean runtime): TensorRT refuses to deserialize one
    unless `engine_host_code_allowed` is set."""
    runtime = trt.Runtime(logger)
    if host_code:
        runtime.engine_host_code_allowed = True
    return runtime


class TrtRunner:
    """Runs a serialized engine: feeds by input name -> outputs in `output_names` order."""

    def __init__(
        self,
        trt: Any,
        plan: bytes,
        profiles: Sequence[Profile],
        output_names: Sequence[str] | None = None,
        device: Any = None,
        host_code: bool = False,
    ):
        self.trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = make_runtime(trt, self._logger, host_code)
        self.engine = self._runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise InferccError(
                "TensorRT could not deserialize the engine",
                "rebuild the artifact with this TensorRT and GPU (see the warnings above)",
            )
        self.context = self.engine.create_execution_context()
        self.profiles = list(profiles)
        self.device = device if device is not None else pick_device()
        self._profile = 0
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        engine_outputs = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self.output_names = list(output_names or engine_outputs)
        missing = sorted(set(self.output_names) - set(engine_outputs))
        if missing:
            raise InferccError(
                f"the engine has no output(s) {', '.join(map(repr, missing))}",
                "rebuild the artifact",
            )

    def _dtype(self, name: str) -> np.dtype:
        return numpy_dtype(self.trt, self.engine.get_tensor_dtype(name))

    def select(self, feeds: Mapping[str, np.ndarray]) -> int:
        shapes = {n: tuple(np.shape(feeds[n])) for n in self.input_names if n in feeds}
        return select_profile(self.profiles, shapes) if self.profiles else 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InferccError(
                f"no value for engine input(s) {', '.join(map(repr, missing))}",
                "feed every input the model declares",
            )
        stream = self.device.stream()
        self._use_profile(self.select(feeds), stream)
        keep = [self._bind_input(name, feeds[name]) for name in self.input_names]
        outputs = {name: self._bind_output(name) for name in self.output_names}
        if not self.context.execute_async_v3(stream):
            raise InferccError("TensorRT failed to run the engine", "see TensorRT's log above")
        self.device.synchronize()
        del keep
        return [self.device.to_host(outputs[name]) for name in self.output_names]

    def _use_profile(self, index: int, stream: int) -> None:
        if index != self._profile:
            self.context.set_optimization_profile_async(index, stream)
            self._profile = index

    def _bind_input(self, name: str, value: np.ndarray) -> Any:
        array = np.ascontiguousarray(value, dtype=self._dtype(name))
        if self.engine.is_shape_inference_io(name):
            self.context.set_tensor_address(name, array.ctypes.data)
            buffer: Any = array
        else:
            if not self.context.set_input_shape(name, array.shape):
                raise InferccError(
                    f"TensorRT refused shape {list(array.shape)} for input {name!r}",
                    "feed shapes inside the engine's optimization profiles",
                )
            buffer, ptr = self.device.to_device(array)
            self.context.set_tensor_address(name, ptr)
        return buffer

    def _bind_output(self, name: str) -> Any:
        shape = tuple(self.context.get_tensor_shape(name))
        if any(d < 0 for d in shape):
            raise InferccError(
                f"output {name!r} has a data-dependent shape {list(shape)}",
                "this runner needs output shapes known from the input shapes; use --backend ort",
            )
        buffer, ptr = self.device.empty(shape, self._dtype(name))
        self.context.set_tensor_address(name, ptr)
        return buffer
