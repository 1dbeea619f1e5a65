"""`infercc.config.BuildConfig`: values checked where they are made, every "needs" / "has no
effect" rule of `check()` (one case each, and a few through the CLI), backend resolution,
and the `to_dict` / `from_dict` round trip that artifact manifests rely on."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from infercc import api
from infercc.config import RULES, BuildConfig, OrtOptions, TrtOptions
from infercc.data.profiles import parse_profile
from infercc.errors import InferccError
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"
ENCODER = ROOT / "examples" / "tiny_encoder.onnx"

GPU = {"target": "a100", "backend": "tensorrt"}

# rule -> (a config that breaks it and no other rule, the flag its message must name)
BROKEN = {
    "_disabled_passes_exist": (BuildConfig(disable_passes=("nope",)), "'nope'"),
    "_disabled_passes_run": (
        BuildConfig(disable_passes=("quantize-qdq",)),
        "--disable-pass quantize-qdq has no effect",
    ),
    "_fp16_options_need_fp16": (BuildConfig(keep_fp32=("Softmax",)), "--keep-fp32"),
    "_fp16_needs_convert_pass": (
        BuildConfig(precision="fp16", disable_passes=("convert-fp16",)),
        "--fp16",
    ),
    "_bf16_needs_a_bf16_backend": (
        BuildConfig(precision="bf16", target="a100", backend="ort"),
        "--bf16",
    ),
    "_openvino_needs_a_cpu_target": (
        BuildConfig(backend="openvino", target="a100"),
        "--backend openvino",
    ),
    "_fp16_on_openvino": (BuildConfig(backend="openvino", precision="fp16"), "--fp16"),
    "_bf16_needs_a_target_with_bf16": (
        BuildConfig(precision="bf16", target="t4", backend="tensorrt"),
        "--bf16",
    ),
    "_tensorrt_needs_a_gpu_target": (BuildConfig(backend="tensorrt"), "--backend tensorrt"),
    "_tensorrt_options_need_tensorrt": (
        BuildConfig(tensorrt=TrtOptions(workspace="4GiB")),
        "--workspace",
    ),
    "_calib_cache_needs_int8": (
        BuildConfig(**GPU, tensorrt=TrtOptions(calib_cache="calib.cache")),
        "--calib-cache",
    ),
    "_ort_options_need_ort": (
        BuildConfig(**GPU, ort=OrtOptions(optimized_model=True)),
        "--ort-optimized-model",
    ),
    "_no_tune_needs_a_tuning_backend": (BuildConfig(backend="none", tune=False), "--no-tune"),
    "_custom_op_libs_need_a_session": (
        BuildConfig(backend="none", validate=False, ort_custom_op_libs=("/opt/ops.so",)),
        "--ort-custom-op-lib",
    ),
    "_validation_options_need_validation": (BuildConfig(validate=False, atol=1e-2), "--atol"),
    "_input_ranges_need_generated_inputs": (
        BuildConfig(input_ranges=("x=0:1",), data="samples/"),
        "--input-range",
    ),
    "_fold_limit_needs_folding": (
        BuildConfig(fold_limit="1MiB", disable_passes=("fold-constants",)),
        "--fold-limit",
    ),
    "_portable_needs_fused_ops_to_avoid": (BuildConfig(portable=True, **GPU), "--portable"),
    "_shapes_agree_with_static_shapes": (
        BuildConfig(shapes=(parse_profile("x=1x3"),), static_shapes=(parse_profile("x=2x3"),)),
        "--shape x differs from --static-shapes x",
    ),
    "_assumptions_need_their_passes": (
        BuildConfig(
            assume=("nonempty-sequences",),
            disable_passes=("emit-attention", "remove-nan-guard", "fuse-group-query-attention"),
        ),
        "--assume nonempty-sequences",
    ),
}


def test_every_rule_has_a_case() -> None:
    assert sorted(BROKEN) == sorted(rule.__name__ for rule in RULES)


@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_each_rule_refuses_its_case_naming_the_flag(rule) -> None:
    config, flag = BROKEN[rule.__name__]
    broken = [r.__name__ for r in RULES if r(config.resolve(artifact=True)) is not None]
    assert broken == [rule.__name__]  # the case breaks this rule and no other
    with pytest.raises(InferccError) as exc:
        config.check()
    assert flag in exc.value.message and "\n" not in exc.value.message
    assert exc.value.hint


def test_option_rules_follow_the_passes_declarations(monkeypatch) -> None:
    """--fold-limit's and --fp16's "no effect" rules name no pass themselves: they read who
    declares the option (register_pass(reads=...)) and which passes only --fp16 runs."""
    from infercc.config import fp16_passes, option_passes
    from infercc.passes.manager import REGISTRY, PassInfo

    assert option_passes("fold_limit") == ("fold-constants",)
    assert fp16_passes() == ("convert-fp16",)
    config = BuildConfig(fold_limit="1MiB", disable_passes=("fold-constants",))
    with pytest.raises(InferccError, match="--disable-pass fold-constants"):
        config.check()
    info = PassInfo("fold-more", REGISTRY["fold-constants"].fn, "", reads=("fold_limit",))
    monkeypatch.setitem(REGISTRY, "fold-more", info)  # a second reader: the limit still acts
    assert option_passes("fold_limit") == ("fold-constants", "fold-more")
    config.check()


@pytest.mark.parametrize(
    "config",
    [
        BuildConfig(),
        BuildConfig(precision="fp16", fp16_io=True, keep_fp32=("Softmax",), portable=True),
        BuildConfig(fold_limit="1MiB", validate=True, atol=1e-3, tolerances={"y": (1e-3, 1e-2)}),
        BuildConfig(**GPU, precision="int8", tensorrt=TrtOptions(calib_cache="c", opt_level=5)),
        BuildConfig(backend="ort", tune=False, ort=OrtOptions(optimized_model=True)),
        BuildConfig(precision="bf16", target="a100", backend="tensorrt"),
    ],
)
def test_meaningful_configs_pass(config: BuildConfig) -> None:
    assert config.check() is config


def test_values_are_checked_where_they_are_made() -> None:
    with pytest.raises(InferccError, match="--opt-level 7"):
        TrtOptions(opt_level=7)
    with pytest.raises(InferccError, match="--hw-compat 'turing'"):
        TrtOptions(hw_compat="turing")
    with pytest.raises(InferccError, match="--fold-limit 'lots' is not a size"):
        BuildConfig(fold_limit="lots")
    with pytest.raises(InferccError, match="precision 'int4'"):
        BuildConfig(precision="int4")
    with pytest.raises(InferccError, match="--align 0"):
        BuildConfig(alignment=0)
    assert BuildConfig(fold_limit="1MiB").fold_limit == 2**20
    assert TrtOptions(workspace="4GiB").workspace == 4 * 2**30


def test_the_backend_is_decided_in_one_place() -> None:
    assert BuildConfig().resolve(artifact=True).backend == "ort"
    assert BuildConfig(target="A100").resolve(artifact=True) == BuildConfig(**GPU)
    assert BuildConfig(target="a100").resolve(artifact=False).backend == "none"
    with pytest.raises(InferccError, match="builds an artifact directory"):
        BuildConfig(backend="ort").resolve(artifact=False)
    with pytest.raises(InferccError, match="unknown target 'tpu'"):
        BuildConfig(target="tpu").resolve(artifact=True)


RICH = BuildConfig(
    target="a100",
    backend="tensorrt",
    precision="fp16",
    fp16_io=True,
    keep_fp32=("Softmax", "node_7"),
    ranges={"h": (-1.5, 9.0e4), "a": (0.0, 1.0)},
    fold_limit="1MiB",
    disable_passes=("fuse-qkv",),
    assume=("nonempty-sequences",),
    shapes=(parse_profile("ids=1x16:8x64:32x128"), parse_profile("mask=1x16")),
    static_shapes=(parse_profile("pos=1x16"),),
    verify=True,
    external_data=True,
    alignment=128,
    tune=False,
    data="samples/",
    atol=1e-3,
    min_cosine=0.995,
    tolerances={"logits": "1e-3:1e-2"},
    tensorrt=TrtOptions(
        workspace="2GiB",
        opt_level=4,
        hw_compat="ampere+",
        version_compatible=True,
        timing_cache_strict=True,
        strict_target=True,
        plugins=("/opt/libplugin.so",),
        profiles=("ids=1x8:1x8:1x8,mask=1x8:1x8:1x8",),
        shape_inputs=("new_shape=1x64:8x64:32x64",),
    ),
)


@pytest.mark.parametrize("config", [BuildConfig(), RICH], ids=["default", "every-field"])
def test_to_dict_round_trips_through_json(config: BuildConfig) -> None:
    data = json.loads(json.dumps(config.to_dict()))
    assert BuildConfig.from_dict(data) == config
    assert set(data) == {f for f in BuildConfig.__dataclass_fields__}


def test_assumptions_are_known_names_sorted_once() -> None:
    config = BuildConfig(assume=("Nonempty-Sequences", "nonempty-sequences"))
    assert config.assume == ("nonempty-sequences",)
    assert config.to_dict()["assume"] == ["nonempty-sequences"]
    with pytest.raises(InferccError, match="not an assumption"):
        BuildConfig(assume=("short-sequences",))


def test_from_dict_names_the_bad_key() -> None:
    with pytest.raises(InferccError, match="unknown build key 'budget'"):
        BuildConfig.from_dict({"budget": 3})
    with pytest.raises(InferccError, match="tensorrt.opt_level must be a int"):
        BuildConfig.from_dict({"tensorrt": {"opt_level": "high"}})
    with pytest.raises(InferccError, match="shapes.x"):
        BuildConfig.from_dict({"shapes": {"x": "1xq"}})
    assert BuildConfig.from_dict({"atol": 1}).atol == 1.0  # an int is a float where one is due
    based = BuildConfig.from_dict({"data": "d", "ranges": {}}, base=Path("/m"))
    assert based.data == str(Path("/m/d"))


def test_manifest_build_round_trips(tmp_path: Path) -> None:
    config = BuildConfig(
        portable=True, fold_limit="1MiB", shapes=(parse_profile("image=2x3x32x32"),)
    )
    report = api.optimize(SMALL_CNN, tmp_path / "art", config, cache_dir=tmp_path / "cache")
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    recorded = BuildConfig.from_dict(manifest["build"])
    assert recorded == replace(config, backend="ort") == config.resolve(artifact=True)
    assert report.build == manifest["build"]
    assert manifest["shape_profiles"][0]["opt"] == [2, 3, 32, 32]


def test_keyword_options_build_the_same_config(tmp_path: Path) -> None:
    a = api.optimize(ENCODER, tmp_path / "a.onnx", fp16=True, keep_fp32=["Softmax"])
    b = api.optimize(
        ENCODER, tmp_path / "b.onnx", BuildConfig(precision="fp16", keep_fp32=("Softmax",))
    )
    assert a.build == b.build and a.build["backend"] == "none"
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    with pytest.raises(InferccError, match="a config and keyword options"):
        api.optimize(ENCODER, tmp_path / "c.onnx", BuildConfig(), fp16=True)


# --------------------------------------------------------------------------- through the CLI


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


def test_tensorrt_flags_on_an_onnx_output_exit_2_naming_the_flag(tmp_path: Path) -> None:
    """Before: exit 0 and an fp32 model, the three flags silently dropped."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["--target", "a100", "--int8", "--workspace", "4GiB", "--opt-level", "5"]
    line = one_line(run_cli("optimize", str(SMALL_CNN), "-o", str(out / "a.onnx"), *args))
    assert "--workspace has no effect" in line and ".onnx" in line
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--keep-fp32", "Softmax"], "--keep-fp32 has no effect without --fp16"),
        (["--no-tune"], "--no-tune has no effect"),
        (["--no-validate", "--min-cosine", "0.9"], "--min-cosine has no effect with --no-validate"),
        (["--no-validate", "--strict-coverage"], "--strict-coverage has no effect with --no-val"),
        (["--no-validate", "--bisect"], "--bisect has no effect with --no-validate"),
        (["--fp16", "--int8"], "--fp16 and --int8 exclude each other"),
        (["--target", "a100", "--portable"], "--portable has no effect with the a100 target"),
    ],
)
def test_cli_refuses_flags_without_effect(tmp_path: Path, args: list[str], flag: str) -> None:
    line = one_line(run_cli("optimize", str(ENCODER), "-o", str(tmp_path / "o.onnx"), *args))
    assert flag in line
    assert not (tmp_path / "o.onnx").exists()
