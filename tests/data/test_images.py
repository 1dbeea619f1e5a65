"""Images as samples: the --preprocess spec, exact tensors (checked against the same PIL ops and
numpy), layouts, channel orders, batching, laziness, errors, no Pillow, calibrate end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx import numpy_helper

from infercc.calib import calibrate as calibrate_module
from infercc.calib.calibrate import read_samples
from infercc.data.images import (
    AUTO,
    PRESETS,
    Preprocess,
    parse_preprocess,
    plan_images,
    resized_size,
)
from infercc.data.samples import load_samples
from infercc.errors import InferccError
from tests.helpers import make_model, run_cli

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def model(input_type: str = "float[1, 3, 8, 8]", extra: str = "") -> onnx.ModelProto:
    proto = onnx.parser.parse_model(
        HEADER + f"g ({input_type} x{extra}) => ({input_type} y) {{ y = Identity(x) }}"
    )
    onnx.checker.check_model(proto)
    return proto


def write_images(directory: Path, sizes: list[tuple[int, int]], ext: str = "png") -> list[Path]:
    """Random RGB images of the given (width, height), named in order."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(sizes))
    paths = []
    for i, (w, h) in enumerate(sizes):
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        path = directory / f"img_{i:03d}.{ext}"
        Image.fromarray(pixels, "RGB").save(path)
        paths.append(path)
    return paths


def reference(path: Path, resize: int | None, crop: int | None) -> np.ndarray:
    """torchvision's Resize(resize) + CenterCrop(crop) on PIL, as HxWx3 uint8."""
    with Image.open(path) as im:
        image = im.convert("RGB")
    if resize is not None:
        w, h = image.size
        if w <= h:
            size = (resize, int(resize * h / w))
        else:
            size = (int(resize * w / h), resize)
        image = image.resize(size, Image.Resampling.BILINEAR)
    if crop is not None:
        w, h = image.size
        top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
        image = image.crop((left, top, left + crop, top + crop))
    return np.asarray(image, dtype=np.uint8)


def imagenet_reference(path: Path, resize: int, crop: int) -> np.ndarray:
    x = reference(path, resize, crop).astype(np.float32) / np.float32(255)
    return (x - IMAGENET_MEAN) / IMAGENET_STD  # HWC, RGB


# --------------------------------------------------------------------------- the spec


def test_imagenet_preset_is_torchvision() -> None:
    spec = parse_preprocess("imagenet")
    assert spec.scale == (1.0, 255.0)
    assert spec.mean == (0.485, 0.456, 0.406) and spec.std == (0.229, 0.224, 0.225)
    assert spec.order == "rgb" and spec.resize == AUTO and spec.crop == AUTO
    plan = plan_images(spec, model("float[1, 3, 224, 224]"))
    assert plan.resize == (256, 0) and plan.crop == (224, 224) and plan.layout == "nchw"


def test_raw_preset_is_the_default() -> None:
    assert parse_preprocess("raw") == parse_preprocess("") == Preprocess()
    assert set(PRESETS) == {"imagenet", "raw"}


def test_keys_override_the_preset_wherever_they_stand() -> None:
    spec = parse_preprocess(" crop = 192 , imagenet, order=BGR, resize=200x300, layout=nhwc")
    assert spec.crop == (192, 0) and spec.resize == (200, 300)
    assert spec.order == "bgr" and spec.layout == "nhwc" and spec.std == (0.229, 0.224, 0.225)


def test_full_spec() -> None:
    spec = parse_preprocess(
        "resize=256,crop=224,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,scale=1/255,"
        "layout=nchw,order=rgb,dtype=float16,interp=bicubic,input=image"
    )
    assert spec == Preprocess(
        input="image",
        resize=(256, 0),
        crop=(224, 0),
        scale=(1.0, 255.0),
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        order="rgb",
        layout="nchw",
        dtype="float16",
        interp="bicubic",
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("size=3", "unknown key 'size'"),
        ("imagnet", "unknown preset or item 'imagnet'"),
        ("imagenet,raw", "two presets"),
        ("crop=224,crop=256", "gives 'crop' twice"),
        ("resize=abc", "bad resize='abc'"),
        ("crop=0", "bad crop='0'"),
        ("crop=2x3x4", "bad crop='2x3x4'"),
        ("scale=0", "bad scale='0'"),
        ("scale=1/0", "bad scale='1/0'"),
        ("scale=1/2/3", "bad scale='1/2/3'"),
        ("mean=a/b/c", "bad mean='a/b/c'"),
        ("mean=", "bad mean=''"),
        ("std=0.5/0/0.5", "bad std='0.5/0/0.5'"),
        ("order=rbg", "bad order='rbg'"),
        ("layout=chw", "bad layout='chw'"),
        ("dtype=bool", "bad dtype='bool'"),
        ("dtype=floaty", "bad dtype='floaty'"),
        ("interp=cubic", "bad interp='cubic'"),
        ("input=", "bad input=''"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(InferccError, match=message) as info:
        parse_preprocess(spec)
    assert info.value.hint and "\n" not in str(info.value)


def test_resized_size_follows_torchvision() -> None:
    assert resized_size(12, 10, (9, 0)) == (10, 9)  # landscape: height is the shorter side
    assert resized_size(10, 15, (8, 0)) == (8, 12)
    assert resized_size(500, 375, (256, 0)) == (341, 256)
    assert resized_size(7, 7, (4, 6)) == (6, 4)  # HxW is exact, returned as (W, H)


# --------------------------------------------------------------------------- exact tensors


def test_imagenet_nchw_exact(tmp_path: Path) -> None:
    paths = write_images(tmp_path, [(12, 10), (9, 14), (8, 8)])
    samples = load_samples(tmp_path, model(), preprocess="imagenet")
    assert len(samples) == 3
    for path, sample in zip(paths, samples, strict=True):
        x = sample["x"]
        assert x.shape == (1, 3, 8, 8) and x.dtype == np.float32 and x.flags.c_contiguous
        expected = imagenet_reference(path, resize=9, crop=8).transpose(2, 0, 1)[None]
        np.testing.assert_array_equal(x, expected)


def test_nhwc_from_the_model_shape(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(11, 9)])
    (sample,) = load_samples(tmp_path, model("float[1, 8, 8, 3]"), preprocess="imagenet")
    np.testing.assert_array_equal(sample["x"], imagenet_reference(path, 9, 8)[None])


def test_nchw_and_nhwc_hold_the_same_values(tmp_path: Path) -> None:
    write_images(tmp_path, [(10, 10)])
    spec = "imagenet,resize=none,crop=4"
    (nchw,) = load_samples(tmp_path, model("float[1, 3, ?, ?]"), preprocess=spec + ",layout=nchw")
    (nhwc,) = load_samples(tmp_path, model("float[1, ?, ?, 3]"), preprocess=spec + ",layout=nhwc")
    assert nchw["x"].shape == (1, 3, 4, 4) and nhwc["x"].shape == (1, 4, 4, 3)
    np.testing.assert_array_equal(nchw["x"], nhwc["x"].transpose(0, 3, 1, 2))


def test_bgr_swaps_channels_after_normalizing_in_rgb(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(8, 8)])
    (rgb,) = load_samples(tmp_path, model(), preprocess="imagenet")
    (bgr,) = load_samples(tmp_path, model(), preprocess="imagenet,order=bgr")
    np.testing.assert_array_equal(bgr["x"], rgb["x"][:, ::-1])
    assert not np.array_equal(bgr["x"], rgb["x"])
    expected = imagenet_reference(path, 9, 8)[:, :, ::-1].transpose(2, 0, 1)
    np.testing.assert_array_equal(bgr["x"][0], expected)


def test_caffe_style_mean_without_scale(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(8, 8)])
    spec = "mean=123.68/116.78/103.94,order=bgr"
    (sample,) = load_samples(tmp_path, model(), preprocess=spec)
    pixels = reference(path, 9, 8).astype(np.float32)  # 8x8 model: resize 9, crop 8
    expected = (pixels - np.array([123.68, 116.78, 103.94], np.float32))[:, :, ::-1]
    np.testing.assert_array_equal(sample["x"][0], expected.transpose(2, 0, 1))


def test_single_mean_and_std_apply_to_every_channel(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(8, 8)])
    (sample,) = load_samples(tmp_path, model(), preprocess="scale=2/255,mean=1,std=0.5")
    x = reference(path, 9, 8).astype(np.float32) * np.float32(2) / np.float32(255)
    expected = (x - np.float32(1)) / np.float32(0.5)
    np.testing.assert_array_equal(sample["x"][0], expected.transpose(2, 0, 1))


def test_raw_uint8_nhwc_is_the_pixels(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(8, 8)])
    (sample,) = load_samples(tmp_path, model("uint8[1, 8, 8, 3]"), preprocess="raw,resize=none")
    assert sample["x"].dtype == np.uint8
    np.testing.assert_array_equal(sample["x"][0], reference(path, None, None))


def test_jpeg_gray_float16_exact(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(16, 12)], ext="jpg")
    spec = "order=gray,scale=1/255,mean=0.5,std=0.25,dtype=float16"
    (sample,) = load_samples(tmp_path, model("float16[1, 1, 6, 6]"), preprocess=spec)
    with Image.open(path) as im:
        gray = im.convert("L").resize((8, 6), Image.Resampling.BILINEAR)  # short side int(6/.875)
    gray = gray.crop((1, 0, 7, 6))  # left = round((8 - 6) / 2)
    x = np.asarray(gray, np.float32) / np.float32(255)
    expected = ((x - np.float32(0.5)) / np.float32(0.25)).astype(np.float16)
    assert sample["x"].shape == (1, 1, 6, 6) and sample["x"].dtype == np.float16
    np.testing.assert_array_equal(sample["x"][0, 0], expected)


def test_exact_resize_without_crop(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(13, 7)])
    (sample,) = load_samples(tmp_path, model(), preprocess="resize=8x8,crop=none,interp=nearest")
    with Image.open(path) as im:
        expected = np.asarray(im.convert("RGB").resize((8, 8), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(sample["x"][0], expected.transpose(2, 0, 1).astype(np.float32))


def test_rank3_input_has_no_batch_axis(tmp_path: Path) -> None:
    write_images(tmp_path, [(8, 8)])
    (sample,) = load_samples(tmp_path, model("float[3, 8, 8]"), preprocess="raw,input=x")
    assert sample["x"].shape == (3, 8, 8)


def test_fixed_batch_groups_images(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = write_images(tmp_path, [(8, 8)] * 5)
    samples = load_samples(tmp_path, model("float[2, 3, 8, 8]"), preprocess="raw")
    assert len(samples) == 2 and samples[0]["x"].shape == (2, 3, 8, 8)
    third = reference(paths[2], 9, 8).transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_array_equal(samples[1]["x"][0], third)
    assert "dropped the last 1 image(s)" in caplog.text


def test_single_image_file(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(9, 9)], ext="bmp")
    (sample,) = load_samples(path, model(), preprocess="imagenet")
    np.testing.assert_array_equal(sample["x"][0], imagenet_reference(path, 9, 8).transpose(2, 0, 1))


def test_rgba_and_palette_images_convert_to_rgb(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rgba = Image.fromarray(rng.integers(0, 256, (8, 8, 4), dtype=np.uint8), "RGBA")
    rgba.save(tmp_path / "a.png")
    rgba.convert("RGB").convert("P").save(tmp_path / "b.png")
    samples = load_samples(tmp_path, model(), preprocess="raw")
    for name, sample in zip(("a.png", "b.png"), samples, strict=True):
        expected = reference(tmp_path / name, 9, 8).transpose(2, 0, 1)
        np.testing.assert_array_equal(sample["x"][0], expected.astype(np.float32))


# --------------------------------------------------------------------------- laziness


def test_images_are_read_lazily(tmp_path: Path) -> None:
    """num_samples=2 never opens the broken third file; reading everything does."""
    write_images(tmp_path, [(8, 8), (8, 8)])
    (tmp_path / "img_999.png").write_bytes(b"\x89PNG not really")
    assert len(read_samples(tmp_path, model(), 2, preprocess="imagenet")) == 2
    with pytest.raises(InferccError, match="cannot read image .*img_999.png") as info:
        read_samples(tmp_path, model(), None, preprocess="imagenet")
    assert "jpg, png" in info.value.hint


def test_only_the_first_n_images_are_opened(tmp_path: Path, monkeypatch) -> None:
    write_images(tmp_path, [(8, 8)] * 6)
    opened = []
    real_open = Image.open

    def counting_open(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    samples = read_samples(tmp_path, model(), 3, preprocess="raw")
    assert len(samples) == 3 and opened == ["img_000.png", "img_001.png", "img_002.png"]


# --------------------------------------------------------------------------- errors


def test_images_need_a_preprocess_spec(tmp_path: Path) -> None:
    write_images(tmp_path, [(8, 8)])
    with pytest.raises(InferccError, match="holds images") as info:
        load_samples(tmp_path, model())
    assert "--preprocess imagenet" in info.value.hint


def test_images_and_npz_do_not_mix(tmp_path: Path) -> None:
    write_images(tmp_path, [(8, 8)])
    np.savez(tmp_path / "s.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(InferccError, match="mixes .npz and image files"):
        load_samples(tmp_path, model(), preprocess="raw")


def test_missing_pillow_is_one_line(tmp_path: Path, monkeypatch) -> None:
    write_images(tmp_path, [(8, 8)])
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(InferccError, match="needs Pillow") as info:
        load_samples(tmp_path, model(), preprocess="imagenet")
    assert info.value.hint == 'pip install "infercc[images]"'
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("input_type", "spec", "message"),
    [
        ("float[1, 3, 8, 8]", "crop=6", r"makes 6x6 images, input 'x' needs 8x8"),
        ("float[1, 3, 8, 8]", "resize=9,crop=none", "keeps each image's aspect ratio"),
        ("float[1, 3, 8, 8]", "layout=nhwc", r"has 8 channel\(s\); order=rgb gives 3"),
        ("float[1, 3, 8, 8]", "order=gray", r"has 3 channel\(s\); order=gray gives 1"),
        ("float[1, 3, 8, 8]", "mean=1/2", "mean has 2 values for 3 channel"),
        ("float[1, 1, 8, 8]", "imagenet,order=gray", "mean has 3 values for 1 channel"),
        ("float[1, 3, 8, 8]", "input=y", "input='y' is not a model input"),
        ("float[1, 8, 3]", "raw", "one image-like .rank-4. input; the model has 0"),
        ("float[3, 8]", "input=x", "rank-3 or rank-4 inputs; 'x' has rank 2"),
        ("float[1, 3, 8, 8]", "dtype=float64", "input 'x' is float64, the model expects float"),
    ],
)
def test_spec_against_model_errors(tmp_path: Path, input_type: str, spec: str, message: str):
    write_images(tmp_path, [(8, 8)])
    with pytest.raises(InferccError, match=message):
        load_samples(tmp_path, model(input_type), preprocess=spec)


def test_two_image_inputs_need_a_name_and_other_inputs_refuse_images(tmp_path: Path) -> None:
    write_images(tmp_path, [(8, 8)])
    two = model(extra=", float[1, 3, 8, 8] z")
    with pytest.raises(InferccError, match="the model has 2") as info:
        load_samples(tmp_path, two, preprocess="raw")
    assert "input=NAME" in info.value.hint
    with pytest.raises(InferccError, match="feed input 'x' only; the model also needs z"):
        load_samples(tmp_path, two, preprocess="raw,input=x")


def test_image_smaller_than_the_crop(tmp_path: Path) -> None:
    write_images(tmp_path, [(6, 10)])
    with pytest.raises(InferccError, match=r"is 6x10 \(W x H\), smaller than the 8x8 crop"):
        load_samples(tmp_path, model(), preprocess="resize=none")


def test_dynamic_size_needs_no_crop(tmp_path: Path) -> None:
    write_images(tmp_path, [(12, 10), (10, 10)])
    samples = load_samples(tmp_path, model("float[1, 3, H, W]"), preprocess="raw")
    assert [s["x"].shape for s in samples] == [(1, 3, 10, 12), (1, 3, 10, 10)]


# --------------------------------------------------------------------------- calibrate


def conv_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("GlobalAveragePool", ["r"], ["p"]),
        oh.make_node("Flatten", ["p"], ["f"]),
        oh.make_node("Gemm", ["f", "fc", "fb"], ["y"], name="fc"),
    ]
    weights = {
        "w": rng.standard_normal((8, 3, 3, 3)) * 0.3,
        "b": rng.standard_normal(8) * 0.1,
        "fc": rng.standard_normal((8, 5)),
        "fb": np.zeros(5),
    }
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in weights.items()]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 5])],
        inits,
    )
    proto = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, path)
    return path


def test_calibrate_on_a_directory_of_pngs(tmp_path: Path) -> None:
    src = conv_model(tmp_path / "cnn.onnx")
    write_images(tmp_path / "images", [(12, 10)] * 6 + [(9, 9)] * 4)
    report = calibrate_module.calibrate(
        src, tmp_path / "images", tmp_path / "out", num_samples=8, preprocess="imagenet"
    )
    assert report.passed, report.message
    assert report.samples["calibration"] + report.samples["holdout"] == 8
    assert {"conv", "fc"} <= set(report.quantized)
    ops = {n.op_type for n in onnx.load(tmp_path / "out" / "model_int8.onnx").graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_cli_calibrate_with_preprocess(tmp_path: Path) -> None:
    src = conv_model(tmp_path / "cnn.onnx")
    write_images(tmp_path / "images", [(10, 10)] * 5)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_cli("calibrate", str(src), "--data", *args)

    r = cli(str(tmp_path / "images"), "-o", str(tmp_path / "out"), "--preprocess", "imagenet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "calibration_report.json").read_text())["passed"]
    r = cli(str(tmp_path / "images"), "-o", str(tmp_path / "x"), "--preprocess", "imagenet,sz=3")
    assert r.returncode == 2 and "unknown key 'sz'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()
