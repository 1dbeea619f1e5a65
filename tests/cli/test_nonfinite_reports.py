"""Metrics are numbers or null, and no report renderer fails on a value that is NaN, inf or
missing.

Each command runs once in-process on a tiny model; the report it hands to `finish` is caught,
then every float in it is replaced by NaN, by inf and (where the field may be missing) by
None, and rendered again, as tables and as JSON. `calibrate --int8` on NaN samples used to
end in "internal error: ValueError: Unknown format code 'g'" (a metric was the string "inf"),
and `--json` printed "inf" strings.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from rich.console import Console

from infercc.util import json_float, json_safe, json_text
from tests.decoders import tiny_decoder
from tests.helpers import make_model, mlp_model
from tests.inproc import run_main

POISONS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "none": None}


def _mlp(path: Path) -> Path:
    """tests.helpers.mlp_model (seed 0)."""
    return mlp_model(path, seed=0)


@pytest.fixture(scope="module")
def caught(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Callable, Any]]:
    """command -> (report, render, data) as each command gave them to `finish`."""
    tmp = tmp_path_factory.mktemp("reports")
    model = _mlp(tmp / "m.onnx")
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        np.savez(data / f"s{i}.npz", x=rng.standard_normal((2, 64)).astype(np.float32))
    decoder = tmp / "dec.onnx"
    onnx.save(tiny_decoder(layers=1, hidden=16, heads=2, vocab=20), decoder)
    (tmp / "ci.toml").write_text(
        '[ci]\nout_dir = "ci-out"\n[[models]]\nname = "m"\npath = "m.onnx"\n'
        'shapes = { x = "2x64" }\n'
    )
    commands = {
        "optimize": ["optimize", str(model), "-o", str(tmp / "o.onnx")],
        "inspect": ["inspect", str(model)],
        "inspect-decoder": ["inspect", str(decoder)],
        "passes": ["passes"],
        "targets": ["targets"],
        "bench": ["bench", str(model), "--warmup", "1", "--iters", "3"],
        "compare": ["bench", str(model), "--compare", str(tmp / "o.onnx"), "--iters", "3"],
        "generate": ["bench", str(decoder), "--generate", "2", "--prompt-len", "3", "--no-memory"],
        "int8": ["calibrate", str(model), "-o", str(tmp / "q8"), "--data", str(data)],
        "int4": ["calibrate", str(model), "-o", str(tmp / "q4"), "--int4"],
        "validate": ["validate", str(tmp / "o.onnx"), "--reference", str(model)],
        "extract": ["extract", str(model), str(tmp / "sub.onnx"), "--outputs", "r"],
        "ci": ["ci", str(tmp / "ci.toml")],
        "profile": ["bench", str(model), "--iters", "2", "--warmup", "1", "--profile"],
        "generate-compare": [
            "bench", str(decoder), "--generate", "2", "--prompt-len", "3", "--no-memory",
            "--compare", str(decoder),
        ],
        "cache": ["cache", "ls", "--cache-dir", str(_cache(tmp))],
    }  # fmt: skip
    found: dict[str, tuple[Any, Callable, Any]] = {}
    with pytest.MonkeyPatch.context() as mp:
        import infercc.cli.common as common

        real = common.finish

        def spy(report: Any, as_json: bool, render: Callable, data: Any = None) -> None:
            found[current] = (report, render, data)
            real(report, as_json, render, data)

        for name in _finish_users():
            mp.setattr(name, spy)
        import infercc.ci.runner as ci_runner  # the ci report without a build child process

        mp.setattr(
            ci_runner, "_build_isolated", lambda _c, spec: ci_runner.build_and_validate(spec)
        )
        capsys = _NoCapture()
        for current, args in commands.items():
            result = run_main(mp, capsys, *args)  # type: ignore[arg-type]
            assert result.code == 0, (current, result.text)
    return found


def _cache(tmp: Path) -> Path:
    from infercc.runtime.tuning import CacheKey, TuningCache

    with TuningCache(tmp / "tc") as cache:
        cache.put(CacheKey("m", "x=2x64", "ort", "1.0", "cpu", "f"), {"a": 1}, 1.25)
    return tmp / "tc"


def _finish_users() -> list[str]:
    import infercc.cli as cli_pkg

    modules = ["bench", "cache", "calibrate", "ci", "extract", "info", "optimize", "validate"]
    for m in modules:
        __import__(f"{cli_pkg.__name__}.{m}")
    return [f"infercc.cli.{m}.finish" for m in modules]


class _NoCapture:
    """Stands in for capsys in a module fixture: output goes where it goes."""

    def readouterr(self) -> Any:
        return type("Captured", (), {"out": "", "err": ""})()


def _poison(obj: Any, value: float | None, optional: bool = True) -> Any:
    """A copy of `obj` with every float replaced by `value`: in dicts and lists, and in
    dataclass fields (None only where the field's type admits None)."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, float | np.floating):
        return value if (value is not None or optional) else obj
    if isinstance(obj, dict):
        return {k: _poison(v, value) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return (
            type(obj)(_poison(v, value) for v in obj)
            if isinstance(obj, list)
            else tuple(_poison(v, value) for v in obj)
        )
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _poison_dataclass(obj, value)
    return obj


def _poison_dataclass(obj: Any, value: float | None) -> Any:
    clone = copy.copy(obj)
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        admits_none = "None" in str(hints.get(f.name, "None")) or "Optional" in str(
            hints.get(f.name, "")
        )
        try:
            object.__setattr__(clone, f.name, _poison(getattr(obj, f.name), value, admits_none))
        except dataclasses.FrozenInstanceError:  # pragma: no cover - object.__setattr__ works
            pass
    return clone


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _no_bad_strings(data: Any, where: str = "") -> None:
    if isinstance(data, str):
        assert data.lower() not in {"nan", "inf", "-inf", "infinity"}, where
    elif isinstance(data, dict):
        for k, v in data.items():
            _no_bad_strings(v, f"{where}.{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _no_bad_strings(v, f"{where}[{i}]")


def _refuse_constant(token: str) -> None:
    raise AssertionError(f"JSON holds {token}")


COMMANDS = [
    "optimize", "inspect", "inspect-decoder", "passes", "targets", "bench", "compare",
    "generate", "int8", "int4", "validate", "extract", "ci", "profile", "generate-compare",
    "cache",
]  # fmt: skip


def test_every_command_was_caught(caught: dict) -> None:
    assert sorted(caught) == sorted(COMMANDS)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("command", COMMANDS)
def test_renderers_and_json_take_non_finite_and_missing_values(
    caught: dict, command: str, poison: str
) -> None:
    report, render, data = caught[command]
    bad = _poison(report, POISONS[poison])
    console = Console(file=io.StringIO(), width=200)
    render(bad, console)
    assert console.file.getvalue().strip()
    payload = bad.to_dict() if data is None else _poison(data, POISONS[poison])
    text = json_text(payload)
    parsed = json.loads(text, parse_constant=_refuse_constant)
    _no_bad_strings(parsed)


def test_a_poisoned_report_changed_something(caught: dict) -> None:
    """The poisoning reaches the metrics (else the test above could not fail)."""
    report = caught["int8"][0]
    before = json_safe(report.to_dict())
    after = json_safe(_poison(report, math.nan).to_dict())
    assert before != after
    assert after["outputs"]["y"]["cosine"] is None


def test_json_float_is_a_number_or_null() -> None:
    assert json_float(1.5) == 1.5 and json_float(None) is None
    for x in (math.nan, math.inf, -math.inf, np.float32(np.nan)):
        assert json_float(x) is None
    assert json_text({"a": [np.float64(np.inf), 2.0]}) == '{"a": [null, 2.0]}'


def test_cli_json_has_no_inf_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`optimize --json` of a model whose output is inf: the metrics are null, not "inf"."""
    graph = oh.make_graph(
        [oh.make_node("Div", ["x", "zero"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero")],
    )
    src = tmp_path / "m.onnx"
    onnx.save(make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), src)
    result = run_main(
        monkeypatch, capsys, "optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json"
    )
    parsed = json.loads(result.out, parse_constant=_refuse_constant)
    _no_bad_strings(parsed)
    assert "y" in parsed["validation"]["outputs"]


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_the_bisect_renderer_takes_them(poison: str) -> None:
    """render_bisect (reached only by a failing validation) on a verdict of every kind."""
    from infercc.check.bisection import BisectReport, Divergence
    from infercc.cli.render import render_bisect

    value = POISONS[poison]
    divergence = Divergence("n1", "Conv", "t", "r1", "Conv", value, value, "differs", 3)
    for report in (
        BisectReport(True, "fuse-x", ["fuse-x", "fuse-y"], "rewrite", 9, 2, "n1", "Conv",
                     divergence, 12, "", {"target": "cpu"}, "build"),
        BisectReport(False, message="did not reproduce", trials=1),
    ):  # fmt: skip
        console = Console(file=io.StringIO(), width=200)
        render_bisect(report, console)
        assert console.file.getvalue().strip()
        _no_bad_strings(json.loads(json_text(report.to_dict()), parse_constant=_refuse_constant))
