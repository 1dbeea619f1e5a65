"""Model inputs: which ones to feed, their concrete shapes, random feeds and sample files.

Random feeds are meant to exercise a model the way real data would:

- floating inputs are standard normal; bool inputs are fair coin flips;
- an integer input that indexes an embedding table (it reaches the `indices` of a Gather whose
  `data` is a constant, directly or through Cast/Reshape/Unsqueeze/Squeeze/Flatten/Identity)
  is uniform in `[0, table.shape[axis])`, so `input_ids` stay inside the vocabulary;
- every other integer input is all ones, which is safe for attention masks, token type ids
  and lengths.

Symbolic dimensions take one value per symbol name across all inputs; unless pinned with
`--shape`, that value is 1 on axis 0 (batch) and 8 elsewhere.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infercc.errors import InferccError

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 1
DEFAULT_DIM = 8

# Ops that pass integer values through unchanged (up to layout), so an index can flow through.
_INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
_MAX_PASSTHROUGH_STEPS = 8

_SUPPORTED = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
    TensorProto.STRING: np.dtype(object),
}

Shapes = Mapping[str, tuple[int, ...]]


# --------------------------------------------------------------------------- which inputs


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that must be fed: those that are not also initializers (IR<4 lists both)."""
    initializers = {init.name for init in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initializers]


def elem_type_name(elem_type: int) -> str:
    """`TensorProto.FLOAT` -> `"float"`, for messages."""
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type {elem_type}"


def input_dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    """The numpy dtype onnxruntime expects for a tensor input; InferccError when unsupported."""
    elem_type = _tensor_type(vi).elem_type
    if elem_type not in _SUPPORTED:
        raise InferccError(
            f"input {vi.name!r} has element type {elem_type_name(elem_type)}, "
            "which infercc cannot feed from numpy",
            "supported: float, float16, double, (u)int8-64, bool, string",
        )
    return _SUPPORTED[elem_type]


def _tensor_type(vi: onnx.ValueInfoProto) -> onnx.TypeProto.Tensor:
    if vi.type.WhichOneof("value") != "tensor_type":
        raise InferccError(
            f"input {vi.name!r} is not a tensor ({vi.type.WhichOneof('value')})",
            "only tensor inputs can be generated or loaded",
        )
    return vi.type.tensor_type


# --------------------------------------------------------------------------- shapes


def declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The declared dims (int, symbol name, or None for unknown); None when the rank is unknown."""
    tensor_type = _tensor_type(vi)
    if not tensor_type.HasField("shape"):
        return None
    return [_declared_dim(dim) for dim in tensor_type.shape.dim]


def _declared_dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    kind = dim.WhichOneof("value")
    if kind == "dim_value":
        return dim.dim_value
    if kind == "dim_param" and dim.dim_param:
        return dim.dim_param
    return None


def resolve_shape(
    vi: onnx.ValueInfoProto, shapes: Shapes | None, symbols: dict[str, int]
) -> tuple[int, ...]:
    """Concrete shape for one input.

    A `--shape` pin wins (it must have the declared rank and agree with fixed dims); fixed dims
    stay; a symbolic dim takes the value already chosen for its symbol in `symbols` (shared
    across inputs, updated here), else 1 on axis 0 and 8 elsewhere. Unnamed unknown dims get
    the same defaults.
    """
    dims = declared_dims(vi)
    pinned = (shapes or {}).get(vi.name)
    if pinned is not None:
        return _check_pin(vi.name, dims, tuple(pinned), symbols)
    if dims is None:
        raise InferccError(
            f"input {vi.name!r} has no declared shape (unknown rank)",
            f"pin it with --shape {vi.name}=D0xD1x...",
        )
    return tuple(_resolve_dim(dim, axis, symbols) for axis, dim in enumerate(dims))


def _default_dim(axis: int) -> int:
    return DEFAULT_BATCH if axis == 0 else DEFAULT_DIM


def _resolve_dim(dim: int | str | None, axis: int, symbols: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim is None:
        return _default_dim(axis)
    return symbols.setdefault(dim, _default_dim(axis))


def _check_pin(
    name: str,
    dims: list[int | str | None] | None,
    pinned: tuple[int, ...],
    symbols: dict[str, int],
) -> tuple[int, ...]:
    if dims is None:
        return pinned
    if len(dims) != len(pinned):
        raise InferccError(
            f"--shape for {name!r} has rank {len(pinned)}, the model declares rank {len(dims)} "
            f"({_format_dims(dims)})",
            f"give {len(dims)} dimensions",
        )
    for axis, (dim, value) in enumerate(zip(dims, pinned, strict=True)):
        _check_pinned_dim(name, axis, dim, value, dims, symbols)
    return pinned


def _check_pinned_dim(
    name: str,
    axis: int,
    dim: int | str | None,
    value: int,
    dims: list[int | str | None],
    symbols: dict[str, int],
) -> None:
    if isinstance(dim, int) and dim != value:
        raise InferccError(
            f"--shape for {name!r} sets axis {axis} to {value}, "
            f"the model fixes it to {dim} ({_format_dims(dims)})",
            f"use {dim} on axis {axis}",
        )
    if isinstance(dim, str):
        chosen = symbols.setdefault(dim, value)
        if chosen != value:
            logger.warning(
                "--shape for %r sets symbol %r to %d, another input already uses %d",
                name,
                dim,
                value,
                chosen,
            )


def _format_dims(dims: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def resolve_shapes(
    model: onnx.ModelProto, shapes: Shapes | None = None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every real input; pinned inputs first so their symbols propagate."""
    inputs = real_inputs(model)
    _check_shape_names(inputs, shapes or {})
    symbols: dict[str, int] = {}
    pinned_first = sorted(inputs, key=lambda vi: vi.name not in (shapes or {}))
    resolved = {vi.name: resolve_shape(vi, shapes, symbols) for vi in pinned_first}
    return {vi.name: resolved[vi.name] for vi in inputs}


def _check_shape_names(inputs: list[onnx.ValueInfoProto], shapes: Shapes) -> None:
    known = {vi.name for vi in inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise InferccError(
            f"--shape names unknown input(s) {', '.join(map(repr, unknown))}",
            f"the model's inputs are: {', '.join(sorted(known)) or '(none)'}",
        )


# --------------------------------------------------------------------------- index bounds


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Inputs used as Gather indices into a constant table -> the table's size on that axis."""
    producers = {out: node for node in model.graph.node for out in node.output}
    constant_dims = _constant_dims(model)
    feedable = {vi.name for vi in real_inputs(model)}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        found = _gather_bound(node, producers, constant_dims, feedable)
        if found is not None:
            name, bound = found
            bounds[name] = min(bound, bounds.get(name, bound))
    return bounds


def _constant_dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    dims = {init.name: list(init.dims) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    dims[node.output[0]] = list(attr.t.dims)
    return dims


def _gather_bound(
    node: onnx.NodeProto,
    producers: dict[str, onnx.NodeProto],
    constant_dims: dict[str, list[int]],
    feedable: set[str],
) -> tuple[str, int] | None:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    table = constant_dims.get(node.input[0])
    source = _index_source(node.input[1], producers)
    if table is None or source not in feedable:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if not -len(table) <= axis < len(table) or table[axis] < 1:
        return None
    return source, table[axis]


def _index_source(name: str, producers: dict[str, onnx.NodeProto]) -> str:
    """Walk back through value-preserving ops to the tensor an index comes from."""
    for _ in range(_MAX_PASSTHROUGH_STEPS):
        node = producers.get(name)
        if node is None or node.op_type not in _INDEX_PASSTHROUGH or not node.input:
            return name
        name = node.input[0]
    return name


# --------------------------------------------------------------------------- random feeds


def make_inputs(
    model: onnx.ModelProto, shapes: Shapes | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """One random feed per real input, deterministic for a given seed (see module docstring)."""
    rng = np.random.default_rng(seed)
    concrete = resolve_shapes(model, shapes)
    bounds = index_bounds(model)
    feeds = {}
    for vi in real_inputs(model):
        feeds[vi.name] = _random_tensor(vi, concrete[vi.name], bounds.get(vi.name), rng)
    return feeds


def _random_tensor(
    vi: onnx.ValueInfoProto, shape: tuple[int, ...], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    dtype = input_dtype(vi)
    if dtype == np.dtype(object):
        raise InferccError(
            f"input {vi.name!r} is a string tensor; infercc cannot make up text",
            "pass real samples with --data",
        )
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return _random_integers(vi.name, dtype, shape, bound, rng)


def _random_integers(
    name: str, dtype: np.dtype, shape: tuple[int, ...], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    if bound is None:
        return np.ones(shape, dtype=dtype)
    high = min(bound, int(np.iinfo(dtype).max) + 1)
    logger.debug("input %r indexes a table of %d rows: sampling in [0, %d)", name, bound, high)
    return rng.integers(0, high, size=shape, dtype=dtype)


# --------------------------------------------------------------------------- sample files


def load_samples(
    path: str | PathLike[str], model: onnx.ModelProto, preprocess: str | None = None
) -> list[dict[str, np.ndarray]]:
    """Load real input samples and check them against the model's inputs (see `iter_samples`)."""
    samples = list(iter_samples(path, model, preprocess))
    logger.info("loaded %d sample(s) from %s", len(samples), path)
    return samples


def iter_samples(
    path: str | PathLike[str], model: onnx.ModelProto, preprocess: str | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Checked samples, one at a time: a file is read only when its first sample is asked for.

    `path` is a `.npz` file, a directory of `.npz` files (keyed by input name), a directory of
    `<input_name>.npy` files (together one sample), or images (a directory of jpg/png/bmp/webp
    files, or one) turned into tensors by the `preprocess` spec (`infercc.data.images`).
    Files are read in name order with `allow_pickle=False`. In a `.npz` file (or the `.npy`
    set) an array of the input's rank is one sample; when every array has rank + 1, the file
    stacks N samples along axis 0 and all must agree on N.
    """
    root = Path(path)
    files = _sample_files(root)
    inputs = real_inputs(model)
    if _is_image(files[0]):
        yield from _image_samples(root, files, model, preprocess, inputs)
        return
    if preprocess is not None:
        raise InferccError(
            f"--preprocess applies to images, and --data {str(root)!r} holds numpy files",
            "drop --preprocess; .npz/.npy samples are fed as they are",
        )
    for source, sample in _array_samples(root, files, inputs):
        check_sample(source, sample, inputs)
        yield sample


def _is_image(file: Path) -> bool:
    from infercc.data.images import is_image

    return is_image(file)


def _image_samples(
    root: Path,
    files: list[Path],
    model: onnx.ModelProto,
    preprocess: str | None,
    inputs: list[onnx.ValueInfoProto],
) -> Iterator[dict[str, np.ndarray]]:
    from infercc.data.images import PRESETS, iter_image_samples

    if preprocess is None:
        raise InferccError(
            f"--data {str(root)!r} holds images; say how to turn them into tensors",
            f"pass --preprocess, e.g. --preprocess imagenet (presets: {', '.join(PRESETS)})",
        )
    for source, sample in iter_image_samples(files, model, preprocess):
        check_sample(source, sample, inputs)
        yield sample


def _array_samples(
    root: Path, files: list[Path], inputs: list[onnx.ValueInfoProto]
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    if root.is_dir() and files[0].suffix == ".npy":
        merged = {k: v for file in files for k, v in _load_file(file).items()}
        yield from _unstack(root, merged, inputs)
        return
    for file in files:
        yield from _unstack(file, _load_file(file), inputs)


def _unstack(
    source: Path, arrays: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """One sample, or the N samples of a stacked file (labelled `file[i]` in errors)."""
    stacked = _stacked_keys(source, arrays, inputs)
    if not stacked:
        yield source, arrays
        return
    count = _stacked_count(source, arrays, stacked)
    for i in range(count):
        sample = {k: a[i] if k in stacked else a for k, a in arrays.items()}
        yield Path(f"{source}[{i}]"), sample


def _stacked_keys(
    source: Path, arrays: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> list[str]:
    """The arrays to split on axis 0: all model inputs when every known rank is rank + 1."""
    dims = {vi.name: declared_dims(vi) for vi in inputs}
    stacked, single = [], []
    for key, array in arrays.items():
        declared = dims.get(key)
        if declared is None:
            continue
        if array.ndim == len(declared) + 1:
            stacked.append(key)
        elif array.ndim == len(declared):
            single.append(key)
        else:
            raise _rank_error(source, key, array, declared, "")
    if stacked and single:
        key = stacked[0]
        raise _rank_error(source, key, arrays[key], dims[key], f"; {single[0]!r} is one sample")
    unknown_rank = [k for k in arrays if k in dims and dims[k] is None and arrays[k].ndim > 0]
    return stacked + unknown_rank if stacked else []


def _rank_error(
    source: Path, key: str, array: np.ndarray, dims: list[int | str | None], more: str
) -> InferccError:
    rank = len(dims)
    return InferccError(
        f"{str(source)!r}: input {key!r} has shape {list(array.shape)}, the model declares "
        f"{_format_dims(dims)}{more}",
        f"give one sample (rank {rank}) of every input, or stack N samples of every input on "
        f"a new axis 0 (rank {rank + 1})",
    )


def _stacked_count(source: Path, arrays: dict[str, np.ndarray], stacked: list[str]) -> int:
    counts = {key: arrays[key].shape[0] for key in stacked}
    first = stacked[0]
    for key, count in counts.items():
        if count != counts[first]:
            raise InferccError(
                f"{str(source)!r} stacks {counts[first]} sample(s) of {first!r} "
                f"but {count} of {key!r}",
                "every array of a stacked file needs the same length on axis 0",
            )
    if counts[first] == 0:
        raise InferccError(f"{str(source)!r} stacks 0 samples", "save at least one sample")
    return counts[first]


def _sample_files(root: Path) -> list[Path]:
    if root.is_file():
        if root.suffix != ".npz" and not _is_image(root):
            raise InferccError(
                f"--data {str(root)!r} is not a .npz file or an image",
                "pass a .npz file, or a directory of .npz files, of <input>.npy files or of "
                "images (jpg, png, bmp, webp)",
            )
        return [root]
    if not root.is_dir():
        raise InferccError(f"--data {str(root)!r} does not exist", "check the path")
    return _directory_files(root)


def _directory_files(root: Path) -> list[Path]:
    files = sorted(p for p in root.iterdir() if p.is_file())
    kinds = {
        ".npz": [p for p in files if p.suffix == ".npz"],
        ".npy": [p for p in files if p.suffix == ".npy"],
        "image": [p for p in files if _is_image(p)],
    }
    found = [kind for kind, paths in kinds.items() if paths]
    if len(found) > 1:
        raise InferccError(
            f"--data directory {str(root)!r} mixes {' and '.join(found)} files",
            "use .npz files (one sample each), <input>.npy files (one sample) or images, "
            "in separate directories",
        )
    if not found:
        raise InferccError(
            f"--data directory {str(root)!r} has no .npz or .npy files, nor images",
            "save each sample with numpy.savez(path, **{input_name: array})",
        )
    return kinds[found[0]]


def _load_file(file: Path) -> dict[str, np.ndarray]:
    """Arrays of one file by input name; a `.npy` file holds the input named by its stem."""
    if file.suffix == ".npy":
        with _reading(file, file.stem):
            return {file.stem: np.load(file, allow_pickle=False)}
    with _reading(file, None), np.load(file, allow_pickle=False) as archive:
        return {key: _archive_array(file, archive, key) for key in archive.files}


def _archive_array(file: Path, archive: Any, key: str) -> np.ndarray:
    with _reading(file, key):
        return archive[key]


@contextmanager
def _reading(file: Path, key: str | None) -> Iterator[None]:
    """Turn numpy's loading errors into InferccErrors naming the file (and input)."""
    where = repr(str(file)) + (f", input {key!r}" if key is not None else "")
    try:
        yield
    except ValueError as exc:
        raise InferccError(
            f"cannot load {where}: {exc}",
            "object arrays (pickles) are refused; save plain numeric or string arrays",
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InferccError(f"cannot read {where}: {exc}", "is it a numpy file?") from exc


def check_sample(
    source: Path, sample: Mapping[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> None:
    """Every real input present, nothing unknown, dtype and declared dims matching."""
    expected = {vi.name: vi for vi in inputs}
    missing = [name for name in expected if name not in sample]
    unknown = sorted(set(sample) - set(expected))
    if missing:
        raise InferccError(
            f"{str(source)!r} lacks input {missing[0]!r}",
            f"a sample needs every model input: {', '.join(expected)}",
        )
    if unknown:
        raise InferccError(
            f"{str(source)!r} has {unknown[0]!r}, which is not a model input",
            f"the model's inputs are: {', '.join(expected) or '(none)'}",
        )
    for name, vi in expected.items():
        _check_array(source, vi, sample[name])


def _check_array(source: Path, vi: onnx.ValueInfoProto, array: np.ndarray) -> None:
    dtype = input_dtype(vi)
    is_text = dtype == np.dtype(object) and array.dtype.kind in "US"
    if array.dtype != dtype and not is_text:
        raise InferccError(
            f"{str(source)!r}: input {vi.name!r} is {array.dtype}, the model expects "
            f"{elem_type_name(_tensor_type(vi).elem_type)} ({dtype})",
            f"save it with array.astype(numpy.{dtype})" if dtype.kind != "O" else None,
        )
    dims = declared_dims(vi)
    if dims is not None:
        _check_dims(source, vi.name, dims, array.shape)


def _check_dims(
    source: Path, name: str, dims: list[int | str | None], shape: tuple[int, ...]
) -> None:
    same_rank = len(dims) == len(shape)
    if not same_rank or any(
        isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=True)
    ):
        raise InferccError(
            f"{str(source)!r}: input {name!r} has shape {list(shape)}, "
            f"the model declares {_format_dims(dims)}",
            "only symbolic (named or ?) dimensions may vary",
        )
