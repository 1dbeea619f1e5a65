"""Build options declared once (`infercc.options`, on `BuildConfig`'s fields): every field has
its flag, its TOML key and its API keyword, and the three give equal configs; the command
line is the declaration (names, help, defaults, panels); old spellings still work; the
"needs TensorRT / ort / validation" rules and the tolerance help read the declarations and the
tolerance table.

Adding a build option: declare it on its field (`infercc/config.py`) and add its flags to
`EXAMPLES` below; `test_every_flag_has_an_example` fails until you do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from infercc import precisions
from infercc.api import build_config
from infercc.ci.manifest import _tomllib
from infercc.cli import app
from infercc.config import BuildConfig, OrtOptions, TrtOptions
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.options import PANELS, flags_by_name, key_table, keyword_table, leaves, tables
from tests.helpers import run_cli

RANGES = "{ranges}"  # a ranges.json: the `ranges_file` fixture's path in its place

# flag -> (its command-line arguments, the same as a TOML build table, as API keywords).
EXAMPLES: dict[str, tuple[list[str], str, dict[str, Any]]] = {
    "--target": (["--target", "a100"], 'target = "a100"', {"target": "a100"}),
    "--backend": (["--backend", "ort"], 'backend = "ort"', {"backend": "ort"}),
    "--fp16": (["--fp16"], 'precision = "fp16"', {"fp16": True}),
    "--bf16": (["--bf16"], 'precision = "bf16"', {"precision": "bf16"}),
    "--int8": (["--int8"], 'precision = "int8"', {"precision": "int8"}),
    "--fp16-io": (["--fp16-io"], "fp16_io = true", {"fp16_io": True}),
    "--keep-fp32": (
        ["--keep-fp32", "Softmax", "--keep-fp32", "n7"],
        'keep_fp32 = ["Softmax", "n7"]',
        {"keep_fp32": ["Softmax", "n7"]},
    ),
    "--ranges": (["--ranges", RANGES], f'ranges = "{RANGES}"', {"fp16_ranges": RANGES}),
    "--portable": (["--portable"], "portable = true", {"portable": True}),
    "--assume": (
        ["--assume", "nonempty-sequences"],
        'assume = ["nonempty-sequences"]',
        {"assume": ("nonempty-sequences",)},
    ),
    "--fold-limit": (["--fold-limit", "1MiB"], 'fold_limit = "1MiB"', {"fold_limit": 2**20}),
    "--freeze-initializers": (
        ["--freeze-initializers"],
        "freeze_initializers = true",
        {"freeze_initializers": True},
    ),
    "--disable-pass": (
        ["--disable-pass", "fuse-qkv"],
        'disable_passes = ["fuse-qkv"]',
        {"disable_passes": ["fuse-qkv"]},
    ),
    "--shape": (
        ["--shape", "x=1x4:2x4:8x4", "--shape", "m=1x4"],
        'shapes = { x = "1x4:2x4:8x4", m = "1x4" }',
        {"profiles": [ShapeProfile("x", (1, 4), (2, 4), (8, 4))], "shapes": {"m": (1, 4)}},
    ),
    "--static-shapes": (
        ["--static-shapes", "x=1x4"],
        'static_shapes = { x = "1x4" }',
        {"static_shapes": {"x": (1, 4)}},
    ),
    "--verify": (["--verify"], "verify = true", {"verify": True}),
    "--external-data": (["--external-data"], "external_data = true", {"external_data": True}),
    "--align": (["--align", "128"], "alignment = 128", {"alignment": 128}),
    "--no-tune": (["--no-tune"], "tune = false", {"tune": False}),
    "--no-validate": (["--no-validate"], "validate = false", {"run_validation": False}),
    "--data": (["--data", "/srv/samples"], 'data = "/srv/samples"', {"data": Path("/srv/samples")}),
    "--data-loader": (
        ["--data-loader", "/srv/load.py:samples"],
        'data = "/srv/load.py:samples"',
        {"data": "/srv/load.py:samples"},
    ),
    "--input-range": (
        ["--input-range", "x=0:1"],
        "input_ranges = { x = [0, 1] }",
        {"input_ranges": {"x": (0.0, 1.0)}},
    ),
    "--atol": (["--atol", "0.01"], "atol = 0.01", {"atol": 0.01}),
    "--rtol": (["--rtol", "0.5"], "rtol = 0.5", {"rtol": 0.5}),
    "--min-cosine": (["--min-cosine", "0.99"], "min_cosine = 0.99", {"min_cosine": 0.99}),
    "--tol": (
        ["--tol", "y=1e-3:1e-2"],
        "tolerances = { y = [1e-3, 1e-2] }",
        {"tolerances": {"y": (1e-3, 1e-2)}},
    ),
    "--strict-coverage": (
        ["--strict-coverage"],
        "strict_coverage = true",
        {"strict_coverage": True},
    ),
    "--bisect": (["--bisect"], "bisect = true", {"bisect": True}),
    "--ort-optimized-model": (
        ["--ort-optimized-model"],
        "[ort]\noptimized_model = true",
        {"ort": OrtOptions(optimized_model=True)},
    ),
    "--workspace": (
        ["--workspace", "4GiB"],
        '[tensorrt]\nworkspace = "4GiB"',
        {"tensorrt": {"workspace": 4 * 2**30}},
    ),
    "--opt-level": (
        ["--opt-level", "5"],
        "[tensorrt]\nopt_level = 5",
        {"tensorrt": {"opt_level": 5}},
    ),
    "--hw-compat": (
        ["--hw-compat", "ampere+"],
        '[tensorrt]\nhw_compat = "ampere+"',
        {"tensorrt": TrtOptions(hw_compat="ampere+")},
    ),
    "--version-compatible": (
        ["--version-compatible"],
        "[tensorrt]\nversion_compatible = true",
        {"tensorrt": {"version_compatible": True}},
    ),
    "--timing-cache-strict": (
        ["--timing-cache-strict"],
        "[tensorrt]\ntiming_cache_strict = true",
        {"tensorrt": {"timing_cache_strict": True}},
    ),
    "--strict-target": (
        ["--strict-target"],
        "[tensorrt]\nstrict_target = true",
        {"tensorrt": {"strict_target": True}},
    ),
    "--ort-custom-op-lib": (
        ["--ort-custom-op-lib", "/opt/a.so", "--ort-custom-op-lib", "/opt/b.so"],
        'ort_custom_op_libs = ["/opt/a.so", "/opt/b.so"]',
        {"ort_custom_op_libs": ["/opt/a.so", "/opt/b.so"]},
    ),
    "--plugin": (
        ["--plugin", "/opt/a.so", "--plugin", "/opt/b.so"],
        '[tensorrt]\nplugins = ["/opt/a.so", "/opt/b.so"]',
        {"tensorrt": {"plugins": ["/opt/a.so", "/opt/b.so"]}},
    ),
    "--calib-cache": (
        ["--calib-cache", "/srv/calib.cache"],
        '[tensorrt]\ncalib_cache = "/srv/calib.cache"',
        {"tensorrt": {"calib_cache": "/srv/calib.cache"}},
    ),
    "--trt-profile": (
        ["--trt-profile", "x=1x4:2x4:8x4,m=1x4"],
        '[tensorrt]\nprofiles = ["x=1x4:2x4:8x4,m=1x4"]',
        {"tensorrt": {"profiles": [{"x": "1x4:2x4:8x4", "m": "1x4"}]}},
    ),
    "--shape-input": (
        ["--shape-input", "s=1x64:8x64:32x64"],
        '[tensorrt]\nshape_inputs = { s = "1x64:8x64:32x64" }',
        {"tensorrt": {"shape_inputs": ["s=1x64:8x64:32x64"]}},
    ),
}


@pytest.fixture(scope="module")
def ranges_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("options") / "ranges.json"
    path.write_text('{"h": {"min": -2.0, "max": 3.0}, "a": {"min": 0.0, "max": 1.0}}')
    return str(path)


def example(flag: str, ranges: str) -> tuple[list[str], str, dict[str, Any]]:
    """EXAMPLES[flag] with the ranges file in its place."""
    args, toml, keywords = EXAMPLES[flag]
    if flag != "--ranges":
        return args, toml, keywords
    return [args[0], ranges], toml.replace(RANGES, ranges), {"fp16_ranges": Path(ranges)}


def optimize_command() -> Any:
    return typer.main.get_command(app).commands["optimize"]


def from_cli(args: list[str], command: str = "optimize") -> BuildConfig:
    """The config optimize's command line makes of `args` (parsed by click, as a run is)."""
    cmd = typer.main.get_command(app).commands[command]
    ctx = cmd.make_context(command, ["m.onnx", *args])
    return BuildConfig.from_flags(ctx.params)


def test_every_flag_has_an_example() -> None:
    assert sorted(EXAMPLES) == sorted(flags_by_name(BuildConfig))


def test_every_field_has_its_flag_key_and_keyword() -> None:
    top, keywords = key_table(BuildConfig), keyword_table(BuildConfig)
    for leaf in leaves(BuildConfig):
        assert leaf.option.flags and all(f.name.startswith("--") for f in leaf.option.flags)
        assert all(f.help.strip() for f in leaf.option.flags), leaf.key
        assert leaf.option.panel in PANELS, leaf.key
        table, _, name = leaf.key.rpartition(".")
        keys = key_table(tables(BuildConfig)[table]) if table else top
        assert name in keys, leaf.key  # its TOML key
        assert (table or name) in keywords, leaf.key  # its API keyword (tables: a dict)
    assert set(BuildConfig().to_dict()) == set(top) == {f for f in keywords if f in top}


@pytest.mark.parametrize("flag", sorted(EXAMPLES))
def test_flag_key_and_keyword_give_one_config(flag: str, ranges_file: str) -> None:
    args, toml, keywords = example(flag, ranges_file)
    by_flag = from_cli(args)
    by_key = BuildConfig.from_dict(_tomllib().loads(toml))
    by_keyword = build_config(**keywords)
    assert by_flag == by_key == by_keyword
    assert by_flag != BuildConfig()  # the example sets something
    assert BuildConfig.from_dict(by_flag.to_dict()) == by_flag


def test_no_flag_is_the_default_config() -> None:
    assert from_cli([]) == BuildConfig() == build_config() == BuildConfig.from_dict({})


def test_the_cli_options_are_the_declarations() -> None:
    params = {p.name: p for p in optimize_command().params}
    for leaf in leaves(BuildConfig):
        for flag in leaf.option.flags:
            p = params[flag.param]
            assert p.opts == [flag.name] and p.help == flag.help and not p.hidden
            assert p.rich_help_panel == leaf.option.panel
            if flag.metavar:
                assert p.metavar == flag.metavar
            for old in flag.old:
                alias = params[old.lstrip("-").replace("-", "_")]
                assert alias.opts == [old] and alias.hidden


def test_help_lists_options_in_panels() -> None:
    r = run_cli("optimize", "--help")
    assert r.returncode == 0, r.stderr
    sections = re.findall(r"^(\S[^\n]*):\n((?:  [^\n]*\n|\n)*)", r.stdout, re.M)
    names = [name for name, _ in sections]
    assert names == ["Arguments", *PANELS, "Options"]  # every panel, in order; -h last
    body = dict(sections)
    for leaf in leaves(BuildConfig):
        for flag in leaf.option.flags:
            assert re.search(rf"^  {re.escape(flag.name)}\b", body[leaf.option.panel], re.M), flag
    for own, panel in (("-o, --output", "Output"), ("--cache-dir", "Target and backend")):
        assert own in body[panel]
    assert not re.search(r"^\s+--profile\b", r.stdout, re.M)  # the old spelling is hidden
    rows = [re.match(r"  -\S.*?\s{2,}(\S)", line) for line in r.stdout.splitlines()]
    starts = {m.start(1) for m in rows if m is not None}
    assert len(starts) == 1  # one column for the help text in every panel


def test_old_spellings_still_work() -> None:
    assert from_cli(["--profile", "x=1x4"]) == from_cli(["--trt-profile", "x=1x4"])
    with pytest.raises(InferccError, match="--trt-profile and --profile are one flag"):
        from_cli(["--trt-profile", "x=1x4", "--profile", "x=1x8"])
    old = build_config(run_validation=False, fp16=True, fp16_ranges={"h": (0.0, 1.0)})
    new = build_config(validate=False, precision="fp16", ranges={"h": (0.0, 1.0)})
    assert old == new
    bench = typer.main.get_command(app).commands["bench"]
    params = {p.name: p for p in bench.params}
    assert params["profile"].hidden and not params["ort_profile"].hidden
    assert bench.make_context("bench", ["m.onnx", "--profile"]).params["profile"] is True


def test_api_pins_win_over_profiles_and_names_mix_ups() -> None:
    cfg = build_config(
        profiles=[ShapeProfile("x", (1, 4), (2, 4), (8, 4)), ShapeProfile("y", (1,), (2,), (3,))],
        shapes={"x": "1x4:4x4:8x4"},
    )
    assert cfg.shape_pins == {"x": (4, 4), "y": (2,)} and cfg.second_pins == {"y": (3,)}
    with pytest.raises(InferccError, match="unknown build option 'fp61'"):
        build_config(fp61=True)
    with pytest.raises(InferccError, match="precision and fp16 both set precision"):
        build_config(precision="int8", fp16=True)
    assert build_config(precision="fp16", fp16=True).precision == "fp16"  # agreeing is fine


def test_exclusive_flags_name_each_other() -> None:
    with pytest.raises(InferccError, match="--fp16 and --bf16 exclude each other: a build has"):
        from_cli(["--fp16", "--bf16"])
    with pytest.raises(InferccError, match="--data and --data-loader exclude each other"):
        from_cli(["--data", "d", "--data-loader", "s.py"])


def test_relative_paths_on_the_command_line_become_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = from_cli(["--data", "d", "--plugin", "p.so"])
    assert cfg.data == str(tmp_path / "d") and cfg.tensorrt.plugins == (str(tmp_path / "p.so"),)
    assert from_cli(["--data-loader", "s.py"]).data == f"{tmp_path / 's.py'}:load_data"


@pytest.mark.parametrize(
    ("backend", "build"),
    [("tensorrt", {"target": "cpu", "backend": "ort"}), ("ort", {"target": "a100"})],
)
def test_backend_rules_read_each_option_s_backend(
    backend: str, build: dict, ranges_file: str
) -> None:
    """Every option declared for a backend is refused, naming its flag, by a build without it;
    nothing else is (the rule has no list of its own)."""
    owned = [leaf for leaf in leaves(BuildConfig) if leaf.option.backend == backend]
    assert owned
    for leaf in owned:
        flag = leaf.option.flags[0].name
        cfg = from_cli([*example(flag, ranges_file)[0], *_flags(build), *_int8(leaf.key)])
        with pytest.raises(InferccError, match=re.escape(f"{flag} has no effect")):
            cfg.check()


def test_validation_rule_reads_each_option_s_declaration(ranges_file: str) -> None:
    readers = [leaf for leaf in leaves(BuildConfig) if leaf.option.validation]
    assert {leaf.key for leaf in readers} >= {"atol", "data", "tolerances", "bisect"}
    for leaf in readers:
        for flag in leaf.option.flags:
            cfg = from_cli([*example(flag.name, ranges_file)[0], "--no-validate"])
            with pytest.raises(InferccError, match=re.escape(leaf.option.flag) + " has no effect"):
                cfg.check()


def _flags(build: dict) -> list[str]:
    return [a for key, value in build.items() for a in (f"--{key}", value)]


def _int8(key: str) -> list[str]:
    return ["--int8"] if key == "tensorrt.calib_cache" else []  # its other rule: needs int8


def test_tolerance_help_reads_the_table(monkeypatch) -> None:
    """Help states the table's figures: change the table and the text follows."""
    flags = flags_by_name(BuildConfig)
    for name in ("atol", "rtol", "min_cosine"):
        assert precisions.defaults_text(name) in flags[f"--{name.replace('_', '-')}"].help
    assert "1e-4 for fp32; none for fp16/bf16/int8" == precisions.defaults_text("atol")
    assert "cosine >= 0.999 against" in flags["--fp16"].help
    table = dict(precisions.TOLERANCES)
    table["fp32"] = precisions.Tolerance(2e-5, 1e-3, 0.99995)
    monkeypatch.setattr(precisions, "TOLERANCES", table)
    assert precisions.defaults_text("atol").startswith("2e-5 for fp32;")
    assert precisions.defaults_text("min_cosine").startswith("0.99995 for fp32;")


def test_calibrate_takes_the_build_options_it_shares_as_declared() -> None:
    """calibrate's --target, --assume, --portable, --shape, --disable-pass (and the others it
    shares) are the declarations' flags: name, metavar and repeatability; only the help says
    what calibrate means by them."""
    command = typer.main.get_command(app).commands["calibrate"]  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}
    flags = flags_by_name(BuildConfig)
    shared = ["--target", "--assume", "--portable", "--shape", "--disable-pass", "--verify"]
    for name in shared:
        flag, p = flags[name], params[flags[name].param]
        assert p.opts == [flag.name] and p.metavar == flag.metavar
        assert p.multiple == flag.many and p.is_flag == (flag.takes is None)
    assert params["target"].default == "cpu"
