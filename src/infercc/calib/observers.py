"""Range observers for INT8 calibration: stream over activations, keep only summaries.

An observer sees one activation tensor at a time (`update(array)`) and keeps a fixed-size
summary, never the activations, so calibrating over many samples needs the memory of one
sample's activations plus a few kilobytes per tensor (onnxruntime's Entropy calibrator keeps
every sample's outputs until the end, which is how BERT calibrations run out of memory,
onnxruntime#10503).

Non-finite values (NaN, +-inf) are skipped by every observer: they would make a range, and so
a scale, useless. `nonfinite` counts them.

**MinMaxObserver** keeps the running minimum and maximum, exactly as onnxruntime's MinMax
calibrator does (its ReduceMin/ReduceMax, then min/max over samples).

**HistogramObserver** keeps `bins` (default 2048) counts of |x| on `[0, upper]` with equal-width
bins, plus the signed min and max. |x| rather than x because TensorRT's INT8 is symmetric: only
the magnitude decides the scale. The first non-zero tensor sets `upper` to its |x| maximum. A
later maximum beyond `upper` widens the range by the smallest integer factor k that covers it:
old bin i merges into new bin i // k, so re-binning is exact (no count is split between bins,
the total is kept) and the range is at most about twice the largest |x| seen. Values seen
before the first non-zero one are all zeros and go to bin 0.

- `percentile_range(p)`: the |x| value `a` below which p % of the values lie, interpolated
  linearly inside its bin and capped at the largest |x| seen; returns the symmetric (-a, a).
- `entropy_range(num_quantized_bins=128)`: the KL-divergence threshold search of TensorRT's
  entropy calibrator (Migacz, "8-bit Inference with TensorRT", GTC 2017; MXNet's
  `contrib.quantization` implements the same search). For each candidate i from
  num_quantized_bins to bins (threshold t_i = i * bin width):

    1. P = hist[:i], with every count beyond the threshold (hist[i:]) added to P[i-1]: this is
       the distribution the INT8 tensor would see after clipping at t_i;
    2. Q = hist[:i] (without the outliers) merged into num_quantized_bins groups of i // nq
       bins (the last group takes the remainder), each group's count then spread evenly over
       the bins of that group where P is non-zero (zero where P is zero);
    3. KL(P || Q) over the normalized P and Q.

  The candidate with the smallest divergence wins (the largest one on a tie); the range is
  (-t, t) with t capped at the largest |x| seen. Before the search, the count of the first bin
  (|x| near 0) is replaced by its neighbour's, as NVIDIA's pytorch-quantization entropy
  calibrator does: zeros quantize exactly, and a ReLU's or padding's spike at 0 would otherwise
  make fine bins near 0 win and clip the real range (without it, a small MLP's ReLU output got
  t = 1.7 for a maximum of 7.2). Where Q is zero and P is not (the clipped mass fell into an
  empty group), Q is floored at 1e-12, a heavy but finite penalty; MXNet smooths both P and Q
  with eps=1e-4 instead. onnxruntime's Entropy calibrator runs the MXNet search on a histogram
  of signed x (default 128 bins over [-amax, amax], which leaves a single candidate, the max;
  with 2048 bins, and no zero-bin fix, ours were 1.1x to 1.6x its thresholds on a small MLP).

**Calibrator** holds one observer per tensor name and turns them into `TensorRange`s with the
INT8 symmetric scale `max(|min|, |max|) / 127` (dynamic range = scale * 127, as in TensorRT's
calibration cache). An all-zero (or never observed) tensor gets `MIN_SCALE` = 2**-126, float32's
smallest normal number: positive, not a denormal that a GPU would flush to zero, and with a
finite reciprocal.

**collect_ranges** runs a model with onnxruntime (CPU, graph optimizations off, so the tensors
are the model's own) after exposing the chosen intermediate float tensors as extra graph
outputs, one sample at a time. The model is read with `onnx.load(load_external_data=False)`:
weights stored as external data stay on disk (onnxruntime reads them from the model's folder);
inline weights are parsed into memory and the modified copy is handed to onnxruntime as bytes,
so a model with inline weights must stay under protobuf's 2 GB limit (small and medium models;
big ones use external data anyway). Memory is bounded by one sample's exposed activations.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from os import PathLike, fspath
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from infercc.errors import InferccError
from infercc.passes.quantize_qdq import INT8_MAX, MIN_SCALE
from infercc.runtime.ort_support import load_refusal, session_options
from infercc.util import first_line

logger = logging.getLogger(__name__)

Method = Literal["minmax", "entropy", "percentile"]
METHODS: tuple[str, ...] = ("minmax", "entropy", "percentile")
DEFAULT_BINS = 2048
NUM_QUANTIZED_BINS = 128
DEFAULT_PERCENTILE = 99.99
_Q_FLOOR = 1e-12

# Element types whose tensors are observed (onnxruntime returns them as numpy floats).
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE})

ProgressFn = Callable[[int, "int | None"], None]


# --------------------------------------------------------------------------- observers


def _finite_values(array: Any) -> tuple[np.ndarray, int]:
    """The finite values of `array`, flattened (fp16 widened to fp32), and how many were not."""
    values = np.asarray(array)
    if values.dtype.kind != "f":
        raise InferccError(
            f"cannot observe a {values.dtype} tensor",
            "INT8 ranges are collected for floating-point tensors only",
        )
    if values.dtype == np.float16:
        values = values.astype(np.float32)
    values = values.reshape(-1)
    finite = np.isfinite(values)
    if finite.all():
        return values, 0
    return values[finite], int(values.size - finite.sum())


class MinMaxObserver:
    """Running min and max of the finite values seen; `range()` is (0.0, 0.0) before any."""

    def __init__(self) -> None:
        self.min = math.inf
        self.max = -math.inf
        self.count = 0
        self.nonfinite = 0

    def update(self, array: Any) -> None:
        self._observe(array)

    def _observe(self, array: Any) -> np.ndarray:
        """Track min/max of the finite values of `array`; returns those values."""
        values, skipped = _finite_values(array)
        self.nonfinite += skipped
        if values.size:
            self.min = min(self.min, float(values.min()))
            self.max = max(self.max, float(values.max()))
            self.count += int(values.size)
        return values

    def range(self) -> tuple[float, float]:
        if self.count == 0:
            return 0.0, 0.0
        return self.min, self.max


class HistogramObserver(MinMaxObserver):
    """A histogram of |x| with a growing range, plus min/max (see the module docstring)."""

    def __init__(self, bins: int = DEFAULT_BINS) -> None:
        super().__init__()
        if bins < 1:
            raise InferccError(f"a histogram needs at least 1 bin, got {bins}", "use bins=2048")
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.int64)
        self.width = 0.0  # 0 until a non-zero value arrives
        self._zeros_before_range = 0

    @property
    def upper(self) -> float:
        """The histogram's upper edge (0.0 until a non-zero value arrives)."""
        return self.width * self.bins

    @property
    def absmax(self) -> float:
        """The largest |x| seen."""
        return max(abs(self.min), abs(self.max)) if self.count else 0.0

    def update(self, array: Any) -> None:
        values = self._observe(array)
        if values.size == 0:
            return
        magnitudes = np.abs(values)
        amax = float(magnitudes.max())
        if not self._ensure_range(amax, int(magnitudes.size)):
            return
        counts, _ = np.histogram(magnitudes, bins=self.bins, range=(0.0, self.upper))
        self.counts += counts

    def _ensure_range(self, amax: float, size: int) -> bool:
        """Make `[0, upper]` cover `amax`; False when there is no range yet (all zeros)."""
        if self.width == 0.0:
            if amax == 0.0:
                self._zeros_before_range += size
                return False
            self.width = amax / self.bins
            self.counts[0] += self._zeros_before_range
            self._zeros_before_range = 0
        elif amax > self.upper:
            self._grow(amax)
        return True

    def _grow(self, amax: float) -> None:
        """Widen the bins by the smallest integer factor k whose range covers `amax`."""
        k = max(2, math.ceil(amax / self.upper))
        while self.upper * k < amax:
            k += 1
        padded = np.concatenate([self.counts, np.zeros((-self.bins) % k, dtype=np.int64)])
        merged = padded.reshape(-1, k).sum(axis=1)
        self.counts = np.zeros(self.bins, dtype=np.int64)
        self.counts[: merged.size] = merged
        self.width *= k
        logger.debug("histogram range grown x%d to %g", k, self.upper)

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) of |x|, as numpy.histogram returns them."""
        counts = self.counts.copy()
        counts[0] += self._zeros_before_range
        return counts, np.arange(self.bins + 1, dtype=np.float64) * self.width

    def percentile_range(self, p: float = DEFAULT_PERCENTILE) -> tuple[float, float]:
        """(-a, a) where p % of the |x| values are <= a (interpolated, capped at absmax)."""
        _check_percentile(p)
        total = int(self.counts.sum())
        if total == 0 or self.width == 0.0:
            return 0.0, 0.0
        cdf = np.cumsum(self.counts)
        target = p / 100.0 * total
        i = min(int(np.searchsorted(cdf, target)), self.bins - 1)
        before = int(cdf[i - 1]) if i > 0 else 0
        frac = (target - before) / self.counts[i] if self.counts[i] else 1.0
        a = min(float((i + min(frac, 1.0)) * self.width), self.absmax)
        return -a, a

    def entropy_range(self, num_quantized_bins: int = NUM_QUANTIZED_BINS) -> tuple[float, float]:
        """(-t, t) with t from TensorRT's KL-divergence search (see the module docstring)."""
        if num_quantized_bins < 1:
            raise InferccError(
                f"num_quantized_bins must be positive, got {num_quantized_bins}", "use 128"
            )
        if int(self.counts.sum()) == 0 or self.width == 0.0:
            return 0.0, 0.0
        best = entropy_threshold_bins(self.counts, num_quantized_bins)
        t = min(float(best * self.width), self.absmax)
        return -t, t


def _check_percentile(p: float) -> None:
    if not 0.0 < p <= 100.0:
        raise InferccError(f"percentile must be in (0, 100], got {p}", "for example 99.99")


# --------------------------------------------------------------------------- entropy search


def entropy_threshold_bins(hist: np.ndarray, num_quantized_bins: int = NUM_QUANTIZED_BINS) -> int:
    """The number of bins i (threshold = i * bin width) minimizing KL(P_i || Q_i)."""
    hist = np.array(hist, dtype=np.float64)
    if hist.size <= num_quantized_bins:
        return int(hist.size)
    hist[0] = hist[1]  # zeros quantize exactly: a ReLU's spike at 0 must not pick the threshold
    outliers = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # outliers[i] = hist[i:]
    best_i, best_kl = hist.size, math.inf
    for i in range(num_quantized_bins, hist.size + 1):
        kl = _candidate_divergence(hist[:i], outliers[i], num_quantized_bins)
        if kl <= best_kl:  # ties go to the larger threshold (less clipping)
            best_i, best_kl = i, kl
    return best_i


def _candidate_divergence(sliced: np.ndarray, outliers: float, nq: int) -> float:
    """KL(P || Q) for one candidate threshold (steps 1-3 of the module docstring)."""
    p = sliced.copy()
    p[-1] += outliers
    nonzero = p != 0
    merged = sliced.size // nq
    starts = np.arange(nq) * merged
    group_sums = np.add.reduceat(sliced, starts)
    group_nonzero = np.add.reduceat(nonzero.astype(np.int64), starts)
    per_bin = np.divide(group_sums, group_nonzero, out=np.zeros(nq), where=group_nonzero > 0)
    groups = np.minimum(np.arange(sliced.size) // merged, nq - 1)
    q = np.where(nonzero, per_bin[groups], 0.0)
    return _kl_divergence(p, q)


def _kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    p_total, q_total = p.sum(), q.sum()
    if p_total <= 0 or q_total <= 0:
        return math.inf
    mask = p > 0
    pn = p[mask] / p_total
    qn = np.maximum(q[mask] / q_total, _Q_FLOOR)
    return float(np.sum(pn * np.log(pn / qn)))


# --------------------------------------------------------------------------- ranges


def int8_scale(amax: float) -> float:
    """Symmetric INT8 scale: amax / 127, at least MIN_SCALE (for all-zero tensors)."""
    return max(abs(amax) / INT8_MAX, MIN_SCALE)


@dataclass(frozen=True)
class TensorRange:
    """A calibrated range and its symmetric INT8 scale (dynamic range = scale * 127)."""

    name: str
    min: float
    max: float
    scale: float
    method: str

    @property
    def amax(self) -> float:
        return max(abs(self.min), abs(self.max))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "min": self.min,
            "max": self.max,
            "scale": self.scale,
            "method": self.method,
        }


class Calibrator:
    """One observer per tensor name; `ranges()` turns them into TensorRanges."""

    def __init__(self, method: Method = "minmax", percentile: float = DEFAULT_PERCENTILE) -> None:
        _check_method(method)
        _check_percentile(percentile)
        self.method = method
        self.percentile = percentile
        self.observers: dict[str, MinMaxObserver] = {}

    def observe(self, outputs: Mapping[str, np.ndarray]) -> None:
        for name, array in outputs.items():
            observer = self.observers.get(name)
            if observer is None:
                observer = self.observers[name] = self._new_observer()
            observer.update(array)

    def _new_observer(self) -> MinMaxObserver:
        return MinMaxObserver() if self.method == "minmax" else HistogramObserver()

    def ranges(self) -> dict[str, TensorRange]:
        return {name: self._range(name, obs) for name, obs in self.observers.items()}

    def _range(self, name: str, observer: MinMaxObserver) -> TensorRange:
        if observer.nonfinite:
            logger.warning("%s: skipped %d NaN/inf value(s)", name, observer.nonfinite)
        if isinstance(observer, HistogramObserver):
            if self.method == "entropy":
                low, high = observer.entropy_range()
            else:
                low, high = observer.percentile_range(self.percentile)
            # The histogram is of |x|: clip each side to what was seen, so a one-sided
            # tensor (ReLU, GELU, Softmax) keeps its sign for asymmetric (uint8) activations.
            # The symmetric scale is unchanged: the threshold never exceeds max |x|.
            if observer.count:
                low, high = max(low, min(observer.min, 0.0)), min(high, max(observer.max, 0.0))
        else:
            low, high = observer.range()
        return TensorRange(name, low, high, int8_scale(max(abs(low), abs(high))), self.method)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise InferccError(
            f"unknown calibration method {method!r}", f"choose one of {', '.join(METHODS)}"
        )


# --------------------------------------------------------------------------- running a model


def collect_ranges(
    model_path: str | PathLike[str],
    samples: Iterable[Mapping[str, np.ndarray]],
    tensors: Sequence[str] | None = None,
    method: Method = "minmax",
    percentile: float = DEFAULT_PERCENTILE,
    on_progress: ProgressFn | None = None,
) -> dict[str, TensorRange]:
    """Run the model on each sample and return the calibrated range of each tensor.

    `tensors` names the values to observe (node outputs or graph inputs); by default every
    float node output of the main graph whose dtype is known after onnx shape inference.
    `on_progress(done, total)` is called after each sample; total is None for an iterator
    without a length.
    """
    calibrator = Calibrator(method, percentile)
    model, base_dir = _load(model_path)
    names = _exposed_model(model, tensors)
    session = _session(model.SerializeToString(), base_dir)
    del model
    total = len(samples) if isinstance(samples, Sized) else None
    done = 0
    for sample in samples:
        calibrator.observe(_run(session, names, sample))
        done += 1
        if on_progress is not None:
            on_progress(done, total)
    if done == 0:
        raise InferccError("no calibration samples were given", "pass at least one sample")
    logger.info("calibrated %d tensor(s) over %d sample(s) (%s)", len(names), done, method)
    return calibrator.ranges()


def tensor_values(
    model_path: str | PathLike[str],
    samples: Iterable[Mapping[str, np.ndarray]],
    tensors: Sequence[str],
) -> Iterator[dict[str, np.ndarray]]:
    """Run the model on each sample and yield the values of `tensors` (one dict per sample),
    the way `collect_ranges` sees them."""
    model, base_dir = _load(model_path)
    names = _exposed_model(model, tensors)
    session = _session(model.SerializeToString(), base_dir)
    del model
    for sample in samples:
        yield _run(session, names, sample)


def _load(model_path: str | PathLike[str]) -> tuple[onnx.ModelProto, Path]:
    path = Path(fspath(model_path))
    if not path.is_file():
        raise InferccError(f"model file {str(path)!r} does not exist", "check the path")
    try:
        model = onnx.load(fspath(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InferccError(f"cannot read {str(path)!r}: {exc}", "is it an ONNX model?") from exc
    return model, path.resolve().parent


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every main-graph value whose type shape inference knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # an unknown custom op must not stop calibration
        logger.warning("shape inference failed (%s); using declared types only", exc)
        inferred = model
    graph = inferred.graph
    types = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def default_tensors(model: onnx.ModelProto, types: Mapping[str, int]) -> list[str]:
    """Float node outputs of the main graph with a known dtype, in node order."""
    names = []
    for node in model.graph.node:
        names.extend(out for out in node.output if out and types.get(out) in FLOAT_TYPES)
    return list(dict.fromkeys(names))


def _exposed_model(model: onnx.ModelProto, tensors: Sequence[str] | None) -> list[str]:
    """Add the tensors to observe as graph outputs of `model` (in place); return their names."""
    types = _value_types(model)
    names = (
        default_tensors(model, types) if tensors is None else _check_tensors(model, tensors, types)
    )
    if not names:
        raise InferccError("the model has no float tensor to calibrate", "check the model")
    existing = {out.name for out in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(_output_info(name, types.get(name)))
    return names


class UnobservableTensor(InferccError):
    """A tensor asked for that cannot be observed (not in the main graph, not float). Bad input
    when the caller's user named it; a caller that built the list itself re-raises it as
    infercc's own failure (`infercc.calib.job`)."""


def _check_tensors(
    model: onnx.ModelProto, tensors: Sequence[str], types: Mapping[str, int]
) -> list[str]:
    graph = model.graph
    known = {out for node in graph.node for out in node.output if out}
    known.update(vi.name for vi in graph.input)
    for name in tensors:
        if name not in known:
            raise UnobservableTensor(
                f"tensor {name!r} is not a node output or input of the main graph",
                "name values of the main graph (subgraph values cannot be observed)",
            )
        if name in types and types[name] not in FLOAT_TYPES:
            raise UnobservableTensor(
                f"tensor {name!r} is {TensorProto.DataType.Name(types[name]).lower()}, not float",
                "INT8 ranges are collected for float tensors only",
            )
    return list(dict.fromkeys(tensors))


def _output_info(name: str, elem_type: int | None) -> onnx.ValueInfoProto:
    if elem_type is None:
        return onnx.ValueInfoProto(name=name)  # onnxruntime infers the type itself
    return onnx.helper.make_tensor_value_info(name, elem_type, None)


def _session(model_bytes: bytes, base_dir: Path) -> ort.InferenceSession:
    options = session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # infercc words the error; no second line from onnxruntime
    options.enable_cpu_mem_arena = False
    # The model goes in as bytes; external weights are found relative to its own folder.
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", fspath(base_dir)
    )
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise load_refusal("the model for calibration", exc) from exc


def _run(
    session: ort.InferenceSession, names: list[str], sample: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    declared = [i.name for i in session.get_inputs()]
    missing = [name for name in declared if name not in sample]
    if missing:
        raise InferccError(
            f"calibration sample lacks input(s) {', '.join(map(repr, missing))}",
            "every sample needs every model input",
        )
    try:
        values = session.run(names, {name: sample[name] for name in declared})
    except Exception as exc:  # onnxruntime raises its own exception types
        raise InferccError(
            f"onnxruntime failed on a calibration sample: {first_line(exc)}",
            "check the samples' shapes and dtypes",
        ) from exc
    return dict(zip(names, values, strict=True))
