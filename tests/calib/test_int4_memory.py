"""int4 of a large float16 model within ~1.5x its weights: the mechanisms that keep the peak
down (`bench/int4_scale.py` measures the figures on a generated 2 GB decoder), each on a tiny
model:

- the reference session of a float16 model converts each weight to float32 just before its
  MatMul (onnxruntime's priority-based order), not every weight up front;
- past `SPEED_COPY_LIMIT_BYTES` of float32 copies the original is not raced, the report says so
  with the bytes, and no session of a float16-weight model is ever alive beside another;
- RTN works through a weight in column slices: bounded temporaries, the same codes;
- a large memory-mapped weight is not kept mapped by the IR after it is read;
- an external-data model quantizes to the same bytes as the same model in memory, and goes to
  onnxruntime by path.
"""

from __future__ import annotations

import json
import tracemalloc
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from rich.console import Console

import infercc.calib.weight_only as weight_only
import infercc.check.compare as compare
import infercc.passes.quantize_int4 as q4
from infercc.calib.weight_only import calibrate_int4
from infercc.cli.render_decoder import render_int4
from infercc.ir import export_model, import_model, load_model
from infercc.ir import tensor as ir_tensor
from infercc.passes.quantize_int4 import Int4Options, quantize_int4, quantize_rtn
from tests.helpers import IR_VERSION, make_model

WIDTHS = (64, 128, 96, 32)  # three float16 MatMuls


def f16_mlp(folder: Path, external: bool = True, seed: int = 0) -> tuple[Path, int]:
    """MatMul chain in float16 (what `model.half()` exports); its weights in `w.data` when
    `external`. Returns the path and the float16 weight bytes."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (k, n) in enumerate(zip(WIDTHS, WIDTHS[1:], strict=False)):
        w = (0.05 * rng.standard_normal((k, n))).astype(np.float16)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(oh.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        x = f"h{i}"
    graph = oh.make_graph(
        nodes,
        "f16",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", WIDTHS[0]])],
        [oh.make_tensor_value_info(x, TensorProto.FLOAT16, ["batch", WIDTHS[-1]])],
        inits,
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    model.ir_version = min(IR_VERSION, 10)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    nbytes = sum(numpy_helper.to_array(t).nbytes for t in inits)
    if external:
        onnx.save(model, path, save_as_external_data=True, location="w.data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path, nbytes


def _profiled_kernels(monkeypatch, tmp_path: Path, path: Path) -> list[str]:
    """The node kernels one validation session (`check.compare.Runner`) runs, in order."""
    made = compare.session_options

    def profiling():
        options = made()
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / "profile")
        return options

    monkeypatch.setattr(compare, "session_options", profiling)
    with compare.Runner(path) as runner:
        runner.run({"x": np.ones((2, WIDTHS[0]), np.float16)})
        assert runner.session is not None
        events = json.loads(Path(runner.session.end_profiling()).read_text())
    suffix = "_kernel_time"
    return [
        e["name"][: -len(suffix)]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith(suffix)
    ]


def test_float16_reference_casts_each_weight_just_before_its_matmul(monkeypatch, tmp_path):
    path, _ = f16_mlp(tmp_path)
    kernels = _profiled_kernels(monkeypatch, tmp_path, path)
    casts = [k for k in kernels if k.startswith("InsertedPrecisionFreeCast_w")]
    # the weights stay float16 initializers, converted at run time (no float32 copy of every
    # weight made when the session is built) ...
    assert sorted(casts) == [f"InsertedPrecisionFreeCast_w{i}" for i in range(3)]
    # ... each right before its MatMul, so one float32 copy is alive at a time
    for i in range(3):
        assert kernels.index(f"mm{i}") == kernels.index(f"InsertedPrecisionFreeCast_w{i}") + 1


class _Sessions:
    """Every onnxruntime session made: its model (path or bytes) and when it was alive."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, int, str]] = []  # (open/close, id, model)
        self.sources: list[object] = []
        base = ort.InferenceSession
        log = self

        class Tracked(base):  # type: ignore[misc, valid-type]
            def __init__(self, source, *args, **kwargs):
                super().__init__(source, *args, **kwargs)
                log.sources.append(source)
                name = Path(source).name if isinstance(source, str) else "<bytes>"
                key = id(self)
                log.events.append(("open", key, name))
                weakref.finalize(self, log.events.append, ("close", key, name))

        monkeypatch.setattr(ort, "InferenceSession", Tracked)

    def alone(self, name: str) -> bool:
        """Whether every session of `name` was the only one alive while it was."""
        alive: dict[int, str] = {}
        for kind, key, model in self.events:
            if kind == "open":
                if model == name and alive or name in alive.values():
                    return False
                alive[key] = model
            else:
                alive.pop(key, None)
        return True

    def opened(self, name: str) -> int:
        return sum(1 for kind, _, model in self.events if kind == "open" and model == name)


def test_large_float16_original_not_raced_and_its_sessions_alone(monkeypatch, tmp_path):
    path, nbytes = f16_mlp(tmp_path / "src")
    monkeypatch.setattr(weight_only, "SPEED_COPY_LIMIT_BYTES", nbytes, raising=False)
    sessions = _Sessions(monkeypatch)
    report = calibrate_int4(path, tmp_path / "out")  # the speed check on, as by default
    assert report.passed and report.speed is None
    skipped = report.to_dict()["speed_skipped"]
    assert skipped["float16_bytes"] == nbytes
    assert skipped["float32_copy_bytes"] == 2 * nbytes
    assert skipped["limit_bytes"] == nbytes and "not raced" in skipped["reason"]
    saved = json.loads((tmp_path / "out" / "calibration_report.json").read_text())
    assert saved["speed_skipped"] == skipped and saved["speed"] is None
    # the float16 reference was run alone, and the original not opened at all
    assert sessions.opened(".fp32.onnx") == 1 and sessions.alone(".fp32.onnx")
    assert sessions.opened("model.onnx") == 0
    # every session was given a path (external data memory-mapped by onnxruntime), never bytes
    assert sessions.sources and all(isinstance(s, str) for s in sessions.sources)
    console = Console(record=True, width=200)
    render_int4(report, console)
    assert "speed: not raced" in console.export_text()


def test_small_float16_original_still_raced(tmp_path):
    path, nbytes = f16_mlp(tmp_path / "src")
    assert 2 * nbytes <= weight_only.SPEED_COPY_LIMIT_BYTES
    report = calibrate_int4(path, tmp_path / "out", accuracy_level=0)
    assert report.speed is not None and report.speed_skipped is None


def test_rtn_temporaries_bounded_and_codes_unchanged(monkeypatch):
    w = (0.05 * np.random.default_rng(2).standard_normal((512, 4096))).astype(np.float32)
    monkeypatch.setattr(q4, "RTN_CHUNK_BYTES", 2**40, raising=False)  # one slice
    whole = quantize_rtn(w, 32, False)
    monkeypatch.setattr(q4, "RTN_CHUNK_BYTES", 2**20, raising=False)
    tracemalloc.start()
    try:
        sliced = quantize_rtn(w, 32, False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for name in ("codes", "scales", "zero_points"):
        assert np.array_equal(getattr(whole, name), getattr(sliced, name))
    # the result is a byte a weight (codes) plus ~1/6 (scales, zero points); whole-weight
    # float64 temporaries would be 2 bytes a byte of this float32 weight each
    assert peak < 1.0 * w.nbytes


def test_large_mapped_weight_not_kept_mapped(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.standard_normal(ir_tensor.MAP_KEEP_BYTES // 4 + 16).astype(np.float32)
    small = rng.standard_normal(300).astype(np.float32)
    nodes = [oh.make_node("Add", ["x", "big"], ["y"]), oh.make_node("Add", ["s", "small"], ["z"])]
    graph = oh.make_graph(
        nodes,
        "g",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, [big.size]),
            oh.make_tensor_value_info("s", TensorProto.FLOAT, [small.size]),
        ],
        [
            oh.make_tensor_value_info("y", TensorProto.FLOAT, [big.size]),
            oh.make_tensor_value_info("z", TensorProto.FLOAT, [small.size]),
        ],
        [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(make_model(graph), path, save_as_external_data=True, location="d", size_threshold=0)
    ir = load_model(path)
    t_big, t_small = ir.value("big").const, ir.value("small").const
    assert t_big.is_external and t_small.is_external
    first = t_big.numpy()
    assert isinstance(first, np.memmap) and np.array_equal(first, big)
    assert t_big._array is None  # its pages are unmapped once the caller lets go
    assert t_big.numpy() is not first and np.array_equal(t_big.numpy(), big)
    assert t_small.numpy() is t_small.numpy()  # small maps are kept
    with pytest.raises(ValueError):
        first[0] = 1.0  # read-only either way


def test_external_data_quantizes_to_the_in_memory_bytes(tmp_path):
    ext, _ = f16_mlp(tmp_path / "ext", external=True)
    inline, _ = f16_mlp(tmp_path / "inline", external=False)
    results = []
    for model in (load_model(ext), import_model(onnx.load(inline))):
        report = quantize_int4(model, Int4Options(block_size=32))
        assert report.quantized == ["mm0", "mm1", "mm2"]
        results.append(export_model(model))
    a, b = ({t.name: t for t in r.graph.initializer} for r in results)
    assert a.keys() == b.keys()
    for name in a:
        assert numpy_helper.to_array(a[name]).tobytes() == numpy_helper.to_array(b[name]).tobytes()
    x = np.random.default_rng(1).standard_normal((3, WIDTHS[0])).astype(np.float16)
    got = [
        ort.InferenceSession(r.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        for r in results
    ]
    assert got[0].tobytes() == got[1].tobytes()
