"""Every pipeline named in one module: what runs where, the listing, and `--disable-pass` of a
pass the command does not run."""

from __future__ import annotations

import pytest

from infercc.check.bisection import PipelineConfig
from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.passes import DEFAULT_PIPELINE, REGISTRY, catalog
from infercc.passes.pipelines import (
    CALIBRATE_FP32,
    CALIBRATE_INT4,
    DECODER_FUSIONS,
    FP16,
    FP32_LEAVES_OUT,
    INT8,
    OPTIMIZE,
    PIPELINES,
    check_disabled,
    optimize_stages,
    pipelines_of,
)


def test_every_pipeline_names_registered_passes() -> None:
    assert set(PIPELINES) == {
        "optimize",
        "fp16",
        "calibrate-fp32",
        "calibrate-int4",
        "int8",
        "int4",
    }
    for pipeline in PIPELINES.values():
        assert pipeline.passes and all(name in REGISTRY for name in pipeline.passes)


def test_every_registered_pass_is_in_a_pipeline() -> None:
    assert {name for name in REGISTRY if not pipelines_of(name)} == set()


def test_the_pipelines() -> None:
    assert DEFAULT_PIPELINE == OPTIMIZE.passes
    assert OPTIMIZE.passes[0] == "fold-constants" and OPTIMIZE.passes[-1] == "schedule-memory"
    assert FP16.stages == (("convert-fp16", "fuse-conv-activation", "eliminate-dead-code"),)
    assert CALIBRATE_FP32.passes == OPTIMIZE.passes
    assert INT8.stages == (
        ("split-outlier-channels",),
        ("quantize-qdq", "fuse-int8-matmul", "eliminate-dead-code"),
    )
    assert INT8.passes == (
        "split-outlier-channels",
        "quantize-qdq",
        "fuse-int8-matmul",
        "eliminate-dead-code",
    )
    assert REGISTRY["split-outlier-channels"].once and REGISTRY["quantize-qdq"].once
    assert REGISTRY["schedule-memory"].final


def test_every_decoder_fusion_optimize_runs_also_runs_before_int4() -> None:
    """One list of decoder fusions: what optimize fuses on a decoder, calibrate --int4 fuses
    before it quantizes (and int8's fp32 reference runs, portable), in the same order."""
    in_optimize = [n for n in OPTIMIZE.passes if n in DECODER_FUSIONS]
    assert in_optimize == [n for n in DECODER_FUSIONS if n not in FP32_LEAVES_OUT]
    assert "remove-nan-guard" in in_optimize and "fuse-group-query-attention" in in_optimize
    (int4,) = CALIBRATE_INT4.stages
    assert [n for n in int4 if n in DECODER_FUSIONS] == list(DECODER_FUSIONS)
    assert set(OPTIMIZE.passes) - set(int4) == {"emit-attention"}
    assert CALIBRATE_FP32.passes == OPTIMIZE.passes
    # RoPE fuses before the GroupQueryAttention that takes the rotation along; the guard
    # goes before either attention fusion reads the Softmax
    order = list(DECODER_FUSIONS)
    assert order.index("fuse-rotary-embedding") < order.index("fuse-group-query-attention")
    assert order[0] == "remove-nan-guard"


def test_bisection_rebuilds_the_stages_optimize_runs() -> None:
    assert optimize_stages("fp32") == [OPTIMIZE.passes]
    # fp16: the activation fusion (float32-only FusedConv) waits for the precision decision
    before = tuple(n for n in OPTIMIZE.passes if n != "fuse-conv-activation")
    assert optimize_stages("fp16") == [before, FP16.passes]
    assert PipelineConfig(BuildConfig(precision="fp16")).pipeline() == optimize_stages("fp16")
    assert PipelineConfig().pass_names() == list(OPTIMIZE.passes)
    build = BuildConfig(precision="fp16", disable_passes=("fuse-qkv",))
    fp16 = PipelineConfig(build).pass_names()
    assert fp16 == [n for n in (*before, "convert-fp16", "fuse-conv-activation") if n != "fuse-qkv"]


def test_catalog_lists_every_pipeline_and_every_pass_once() -> None:
    listed = catalog()
    assert [p["name"] for p in listed["pipelines"]] == list(PIPELINES)
    names = [p["name"] for p in listed["passes"]]
    assert sorted(names) == sorted(REGISTRY) and len(names) == len(set(names))
    by_name = {p["name"]: p for p in listed["passes"]}
    for name in ("convert-fp16", "split-outlier-channels", "quantize-qdq"):
        assert by_name[name]["doc"] and by_name[name]["pipelines"]
    assert by_name["quantize-qdq"]["pipelines"] == ["int8"]
    assert by_name["eliminate-dead-code"]["pipelines"] == list(PIPELINES)
    int8 = next(p for p in listed["pipelines"] if p["name"] == "int8")
    assert int8["stages"] == [
        ["split-outlier-channels"],
        ["quantize-qdq", "fuse-int8-matmul", "eliminate-dead-code"],
    ]
    for entry in listed["passes"]:  # whole sentences: a docstring's first line may stop short
        assert entry["doc"].endswith(".") and "\n" not in entry["doc"], entry["name"]
    rotary = by_name["fuse-rotary-embedding"]["doc"]
    assert rotary.endswith("one RotaryEmbedding with rotary_embedding_dim.")


def test_check_disabled_refuses_a_pass_the_command_does_not_run() -> None:
    check_disabled(["fuse-qkv", "quantize-qdq"], [OPTIMIZE, INT8], "calibrate")
    with pytest.raises(InferccError) as info:
        check_disabled(["convert-fp16"], [OPTIMIZE], "optimize")
    message = "--disable-pass convert-fp16 has no effect: optimize does not run it"
    assert info.value.message == message
    assert "fold-constants" in info.value.hint


def test_every_pass_module_is_registered_by_importing_the_package() -> None:
    """A new pass is its own module and a pipeline line: the package imports every module, so
    no list of modules has to name it."""
    import re
    from pathlib import Path

    import infercc.passes

    declared = set()
    for path in Path(infercc.passes.__file__).parent.glob("*.py"):
        declared |= set(re.findall(r'@register_pass\(\s*"([^"]+)"', path.read_text()))
    assert declared and declared <= set(REGISTRY)  # (tests register passes of their own)
    in_pipelines = {n for p in PIPELINES.values() for n in p.passes}
    assert in_pipelines == declared  # every pass runs somewhere, and only real ones
