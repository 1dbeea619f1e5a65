"""Validation inputs from a Python data-loader script: `--data-loader script.py[:fn]`.

The script is imported from its path (not from `sys.path`) and `fn` (default `load_data`, as
Polygraphy's `--data-loader-script` calls it) is called with no arguments. It returns (or
yields) samples: each a mapping of input name to an array-like, checked against the model's
inputs as `--data` samples are. Whatever the script raises is reported in one line naming the
script, the function and the sample.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from infercc.errors import InferccError

logger = logging.getLogger(__name__)

DEFAULT_FUNCTION = "load_data"
_SPEC = re.compile(r"^(?P<path>.+\.py)(?::(?P<fn>[A-Za-z_][A-Za-z0-9_]*))?$")


def is_loader_spec(source: str | PathLike[str]) -> bool:
    """True for `script.py` or `script.py:fn` (a `--data` path naming a Python script)."""
    return _SPEC.match(str(source)) is not None


def split_loader_spec(spec: str | PathLike[str]) -> tuple[Path, str]:
    match = _SPEC.match(str(spec))
    if match is None:
        raise InferccError(
            f"bad --data-loader {str(spec)!r}: expected SCRIPT.py or SCRIPT.py:FUNCTION",
            f"e.g. --data-loader samples.py:{DEFAULT_FUNCTION}",
        )
    return Path(match["path"]), match["fn"] or DEFAULT_FUNCTION


def join_loader_spec(path: str | PathLike[str], fn: str) -> str:
    return f"{path}:{fn}"


def iter_loader_samples(spec: str | PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, sample) pairs from the script's function, where names the sample in errors."""
    path, fn_name = split_loader_spec(spec)
    fn = _load_function(path, fn_name)
    where = f"{path}:{fn_name}"
    try:
        produced = fn()
        items = iter(produced)
    except Exception as exc:
        raise _raised(where, "when called", exc) from None
    i = 0
    while True:
        try:
            sample = next(items)
        except StopIteration:
            break
        except Exception as exc:
            raise _raised(where, f"at sample {i}", exc) from None
        if not isinstance(sample, Mapping):
            raise InferccError(
                f"data loader {where} gave a {type(sample).__name__} as sample {i}, not a "
                "mapping of input name to array",
                "return (or yield) dicts such as {'image': array}",
            )
        yield f"{where} sample {i}", {str(k): np.asarray(v) for k, v in sample.items()}
        i += 1
    if i == 0:
        raise InferccError(f"data loader {where} gave no sample", "return at least one dict")


def _raised(where: str, when: str, exc: Exception) -> InferccError:
    first = (str(exc).splitlines() or [""])[0]
    return InferccError(
        f"data loader {where} raised {type(exc).__name__} {when}: {first}",
        "fix the script (run it with python to see the traceback)",
    )


def _load_function(path: Path, fn_name: str) -> Any:
    if not path.is_file():
        raise InferccError(f"data loader script {path} not found", "check the path")
    name = f"_infercc_data_loader_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InferccError(f"cannot import {path} as a Python script", "name a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _raised(str(path), "on import", exc) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise InferccError(
            f"data loader script {path} has no function {fn_name!r}",
            f"name one with {path}:FUNCTION (it defines: {', '.join(found) or 'none'})",
        )
    logger.info("reading validation samples from %s:%s", path, fn_name)
    return fn
