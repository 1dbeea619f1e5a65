"""Model inputs: which ones to feed, their concrete shapes, random feeds and sample files.

Random feeds are meant to exercise a model the way real data would:

- floating inputs are standard normal; bool inputs are fair coin flips;
- an integer input that indexes an embedding table (it reaches the `indices` of a Gather whose
  `data` is a constant, directly or through Cast/Reshape/Unsqueeze/Squeeze/Flatten/Identity)
  is uniform in `[0, table.shape[axis])`, so `input_ids` stay inside the vocabulary;
- every other integer input is all ones, which is safe for attention masks, token type ids
  and lengths.

Symbolic dimensions take one value per symbol name across all inputs; unless pinned with
`--shape` (or preset with `symbols`), that value is 1 on axis 0 (batch) and 8 elsewhere.
`values` fills named inputs with one value instead (an `sr` the model compares with 16000).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import onnx

from infercc.data.signature import (
    _INDEX_PASSTHROUGH,
    _MAX_PASSTHROUGH_STEPS,
    Shapes,
    SymbolKey,
    input_dtype,
    real_inputs,
    resolve_shapes,
)
from infercc.errors import InferccError
from infercc.ir.ops import STANDARD_DOMAINS

logger = logging.getLogger(__name__)

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
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
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
    if node.op_type != "Gather" or node.domain not in STANDARD_DOMAINS or len(node.input) < 2:
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


_RANGES: ContextVar[Mapping[str, tuple[float, float]] | None] = ContextVar(
    "input_ranges", default=None
)


@contextmanager
def input_ranges(ranges: Mapping[str, tuple[float, float]] | None) -> Iterator[None]:
    """Within the block, `make_inputs` draws each named input uniformly from its (low, high)
    (`--input-range NAME=LOW:HIGH`; integers in [low, high], both ends included), whoever
    asks for the inputs (validation's profiles and ladder, a benchmark)."""
    token = _RANGES.set(dict(ranges or {}))
    try:
        yield
    finally:
        _RANGES.reset(token)


def make_inputs(
    model: onnx.ModelProto,
    shapes: Shapes | None = None,
    seed: int = 0,
    symbols: Mapping[SymbolKey, int] | None = None,
    values: Mapping[str, float] | None = None,
) -> dict[str, np.ndarray]:
    """One random feed per real input, deterministic for a given seed (see module docstring);
    inputs given a range by `input_ranges` are drawn from it."""
    rng = np.random.default_rng(seed)
    concrete = resolve_shapes(model, shapes, symbols)
    bounds = index_bounds(model)
    ranges = _RANGES.get() or {}
    inputs = real_inputs(model)
    _check_range_names(ranges, inputs)
    check_feed_memory({vi.name: (concrete[vi.name], input_dtype(vi)) for vi in inputs})
    feeds = {}
    for vi in inputs:
        shape = concrete[vi.name]
        if vi.name in ranges:
            feeds[vi.name] = _in_range(vi, shape, ranges[vi.name], rng)
        elif values and vi.name in values:
            feeds[vi.name] = np.full(shape, values[vi.name], dtype=input_dtype(vi))
        else:
            feeds[vi.name] = _random_tensor(vi, shape, bounds.get(vi.name), rng)
    return feeds


def _check_range_names(
    ranges: Mapping[str, tuple[float, float]], inputs: list[onnx.ValueInfoProto]
) -> None:
    names = [vi.name for vi in inputs]
    for name in ranges:
        if name not in names:
            raise InferccError(
                f"--input-range names {name!r}, which is not a model input",
                f"the model's inputs are: {', '.join(names) or '(none)'}",
            )


def _in_range(
    vi: onnx.ValueInfoProto,
    shape: tuple[int, ...],
    bounds: tuple[float, float],
    rng: np.random.Generator,
) -> np.ndarray:
    low, high = bounds
    dtype = input_dtype(vi)
    if dtype.kind == "f":
        return rng.uniform(low, high, size=shape).astype(dtype)
    if dtype.kind in "iu":
        lo, hi = math.ceil(low), math.floor(high)
        info = np.iinfo(dtype)
        if lo > hi or lo < info.min or hi > info.max:
            raise InferccError(
                f"--input-range {vi.name}={low:g}:{high:g} holds no {dtype} value",
                f"give integer bounds within [{info.min}, {info.max}]",
            )
        return rng.integers(lo, hi, size=shape, endpoint=True, dtype=dtype)
    if dtype.kind == "b" and 0 <= low <= high <= 1:
        return rng.integers(math.ceil(low), math.floor(high), size=shape, endpoint=True) > 0
    raise InferccError(
        f"--input-range cannot apply to input {vi.name!r} ({dtype})",
        "give ranges for numeric inputs only",
    )


def feed_bytes(feeds: Mapping[str, np.ndarray]) -> int:
    return sum(int(np.asarray(a).nbytes) for a in feeds.values())


def describe_feeds(feeds: Mapping[str, np.ndarray], limit: int = 4) -> str:
    """`x float32[1, 8], sr int64[] = 16000`: each input's dtype and shape, and for integers
    and bools their values when there are at most `limit` (or all are equal)."""
    return ", ".join(f"{name} {_describe_array(np.asarray(a), limit)}" for name, a in feeds.items())


def _describe_array(a: np.ndarray, limit: int) -> str:
    text = f"{a.dtype}[{', '.join(str(d) for d in a.shape)}]"
    if a.size == 0 or a.dtype.kind not in "iub":
        return text
    if a.size <= limit:
        shown = a.ravel().tolist()
        return f"{text} = {shown[0] if a.ndim == 0 else shown}"
    if bool((a == a.flat[0]).all()):
        return f"{text} all {a.flat[0].item()}"
    if a.dtype.kind in "iu":
        return f"{text} in [{a.min()}, {a.max()}]"
    return text


def physical_memory() -> int | None:
    """This machine's memory in bytes, where the OS says (None elsewhere)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_feed_memory(
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]], memory: int | None = None
) -> None:
    """Refuse feeds that cannot fit in this machine's memory (a declared dim of 1e12) with
    one line naming the largest input, before anything is allocated."""
    memory = memory if memory is not None else physical_memory()
    if memory is None or not inputs:
        return
    need = {name: _feed_bytes(shape, dtype) for name, (shape, dtype) in inputs.items()}
    if sum(need.values()) <= memory:
        return
    name = max(need, key=need.__getitem__)
    shape = list(inputs[name][0])
    raise InferccError(
        f"validation inputs need {_bytes(sum(need.values()))}, more than this machine's "
        f"{_bytes(memory)} of memory (input {name!r} has shape {shape})",
        f"give smaller shapes with --shape {name}=..., real samples with --data, or skip "
        "validation with --no-validate",
    )


def _feed_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    count = math.prod(shape)
    # floating feeds are drawn in float64, then cast
    return count * (dtype.itemsize + (8 if dtype.kind == "f" else 0))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


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
