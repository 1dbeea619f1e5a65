"""Build records (`infercc.record`): TOML written by hand reads back into the same
BuildConfig; every form `--config` takes; paths relative to the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercc.config import BuildConfig, OrtOptions, TrtOptions
from infercc.errors import InferccError
from infercc.record import _tomllib, load_record, save_record, toml_dumps


def rich_config(tmp_path: Path) -> BuildConfig:
    return BuildConfig(
        target="a100",
        backend="tensorrt",
        precision="fp16",
        fp16_io=True,
        keep_fp32=("Softmax", "layer/0.norm"),
        ranges={"a/b:0": (-1.5, 2.25), "x": (0.0, 1e30)},
        fold_limit="1MiB",
        disable_passes=("fuse-qkv",),
        shapes=("input_ids=1x16:8x64:32x128", "mask=1x16"),
        data=str(tmp_path / "samples"),
        atol=1e-3,
        min_cosine=0.999,
        tolerances={"logits": (1e-3, 1e-2)},
        ort=OrtOptions(),
        tensorrt=TrtOptions(
            workspace="4GiB",
            opt_level=5,
            hw_compat="ampere+",
            plugins=(str(tmp_path / "lib" / "plugin.so"),),
            profiles=({"input_ids": "1x8:1x8:1x8"},),
            shape_inputs={"new_shape": "1x64:8x64:32x64"},
        ),
    )


@pytest.mark.parametrize("name", ["build.toml", "build.json"])
def test_saved_record_reads_back_the_same_build(tmp_path: Path, name: str) -> None:
    config = rich_config(tmp_path)
    out = tmp_path / "rec"
    out.mkdir()
    save_record(out / name, tmp_path / "m.onnx", tmp_path / "build" / "trt", config)
    record = load_record(out / name)
    assert record.config == config
    assert record.model == tmp_path / "m.onnx" and record.output == tmp_path / "build" / "trt"
    text = (out / name).read_text()
    assert "../m.onnx" in text and "../lib/plugin.so" in text  # relative to the file
    assert str(tmp_path) not in text


def test_toml_writer_is_valid_toml() -> None:
    data = {
        "a": 1,
        "b": [1.5, float("inf")],
        "quoted key/0": 'tab\tand "quotes"',
        "t": {"x": True, "none": None, "inline": [{"k": "v"}], "empty": {}},
    }
    parsed = _tomllib().loads(toml_dumps(data))
    assert parsed == {
        "a": 1,
        "b": [1.5, float("inf")],
        "quoted key/0": 'tab\tand "quotes"',
        "t": {"x": True, "inline": [{"k": "v"}]},
    }


def test_a_manifest_and_a_bare_table_are_configs_too(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    build = BuildConfig(target="cpu", backend="ort", portable=True).to_dict()
    manifest.write_text(json.dumps({"schema": "infercc.manifest/1", "model": "model.onnx",
                                    "build": build}))  # fmt: skip
    record = load_record(manifest)
    assert record.config.portable and record.model is None and record.output is None
    bare = tmp_path / "b.toml"
    bare.write_text('model = "m.onnx"\ntarget = "cpu"\nshapes = { x = "1x4" }\n')
    record = load_record(bare)
    assert record.model == tmp_path / "m.onnx" and record.config.shape_pins == {"x": (1, 4)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('model = "m.onnx"\n[build]\nfp16 = true\n', "unknown build key 'fp16'"),
        ("model = 1\n[build]\n", "a path must be text"),
        ("extra = 1\n[build]\n", "unknown key 'extra'"),
        ("[build\n", "is not valid TOML"),
        ("build = 3\n", "records no build"),
    ],
)
def test_bad_records_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(InferccError, match=message):
        load_record(path)
