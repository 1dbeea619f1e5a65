"""Real input samples from files: `.npz` (one sample, or N stacked on axis 0), `<input>.npy`
files, images with a `--preprocess` spec, or a data-loader script, read lazily and checked
against the model.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.data.loader import is_loader_spec, iter_loader_samples
from infercc.data.signature import (
    _format_dims,
    _tensor_type,
    declared_dims,
    elem_type_name,
    input_dtype,
    real_inputs,
)
from infercc.errors import InferccError

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- sample files


# What the Python API takes wherever the CLI takes --data: a path (or `script.py:fn`), or
# samples in memory (`in_memory`).
SampleData = str | PathLike[str] | np.ndarray | Mapping[str, Any] | Iterable[Any]
IN_MEMORY_SAMPLES = "<in-memory samples>"  # how reports and manifests name those


def in_memory(data: object) -> bool:
    """True for samples given as Python objects rather than a path or a loader spec."""
    return data is not None and not isinstance(data, str | bytes | PathLike)


def data_label(data: object) -> str:
    """How messages name `data`: its path, or `<in-memory samples>`."""
    return IN_MEMORY_SAMPLES if in_memory(data) else str(data)


def load_samples(
    path: SampleData, model: onnx.ModelProto, preprocess: str | None = None
) -> list[dict[str, np.ndarray]]:
    """Load real input samples and check them against the model's inputs (see `iter_samples`)."""
    samples = list(iter_samples(path, model, preprocess))
    logger.info("loaded %d sample(s) from %s", len(samples), data_label(path))
    return samples


def iter_samples(
    path: SampleData, model: onnx.ModelProto, preprocess: str | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Checked samples, one at a time: a file is read only when its first sample is asked for.

    `path` is a `.npz` file, a directory of `.npz` files (keyed by input name), a directory of
    `<input_name>.npy` files (together one sample), or images (a directory of jpg/png/bmp/webp
    files, or one) turned into tensors by the `preprocess` spec (`infercc.data.images`).
    Files are read in name order with `allow_pickle=False`. In a `.npz` file (or the `.npy`
    set) an array of the input's rank is one sample; when every array has rank + 1, the file
    stacks N samples along axis 0 and all must agree on N. A `script.py[:fn]` path is a data
    loader (`infercc.data.loader`): the samples its function returns.

    In memory (`in_memory`), as the Python API takes them: a `{input name: array}` dict (one
    sample, or N stacked on axis 0, as in a `.npz` file), an array (the same, for a model of
    one input), or an iterable (list, tuple, generator) of those, each one sample.
    """
    if in_memory(path):
        if preprocess is not None:
            raise InferccError(
                "preprocess applies to image files, and the samples given are arrays",
                "drop preprocess, or pass the images' directory",
            )
        yield from _memory_samples(path, real_inputs(model))
        return
    assert isinstance(path, str | PathLike)
    if is_loader_spec(path):
        if preprocess is not None:
            raise InferccError(
                "--preprocess applies to images, and the data loader returns arrays",
                "drop --preprocess; do the preprocessing in the loader",
            )
        inputs = real_inputs(model)
        for where, sample in iter_loader_samples(path):
            check_sample(where, sample, inputs)  # type: ignore[arg-type]
            yield sample
        return
    root = Path(path)
    files = _sample_files(root)
    inputs = real_inputs(model)
    if _is_image(files[0]):
        yield from _image_samples(root, files, model, preprocess, inputs)
        return
    if preprocess is not None:
        raise InferccError(
            f"--preprocess applies to images, and --data {str(root)!r} holds numpy files",
            "drop --preprocess; .npz/.npy samples are fed as they are",
        )
    for source, sample in _array_samples(root, files, inputs):
        check_sample(source, sample, inputs)
        yield sample


def _memory_samples(
    data: Any, inputs: list[onnx.ValueInfoProto]
) -> Iterator[dict[str, np.ndarray]]:
    """In-memory samples (`iter_samples`), each checked as a file's are."""
    if isinstance(data, np.ndarray | Mapping):
        where = Path(IN_MEMORY_SAMPLES)
        for source, sample in _unstack(where, _as_sample(where, data, inputs), inputs):
            check_sample(source, sample, inputs)
            yield sample
        return
    try:
        items = iter(data)
    except TypeError:
        raise _not_samples(f"got {type(data).__name__}") from None
    count = 0
    for i, item in enumerate(items):
        where = Path(f"sample {i}")
        if not isinstance(item, np.ndarray | Mapping):
            raise _not_samples(f"sample {i} is a {type(item).__name__}")
        sample = _as_sample(where, item, inputs)
        check_sample(where, sample, inputs)
        count += 1
        yield sample
    if count == 0:
        raise InferccError("the samples given are empty", "give at least one sample")


def _as_sample(
    where: Path, item: np.ndarray | Mapping[str, Any], inputs: list[onnx.ValueInfoProto]
) -> dict[str, np.ndarray]:
    if isinstance(item, Mapping):
        return {str(k): np.asarray(v) for k, v in item.items()}
    if len(inputs) != 1:
        names = ", ".join(vi.name for vi in inputs)
        raise InferccError(
            f"{str(where)!r} is an array, and the model has {len(inputs)} inputs ({names})",
            "give {input name: array} dicts",
        )
    return {inputs[0].name: item}


def _not_samples(what: str) -> InferccError:
    return InferccError(
        f"data must be a path or samples in memory; {what}",
        "give a path, a {input name: array} dict, an array (a model of one input), or a list "
        "or generator of those",
    )


def _is_image(file: Path) -> bool:
    from infercc.data.images import is_image

    return is_image(file)


def _image_samples(
    root: Path,
    files: list[Path],
    model: onnx.ModelProto,
    preprocess: str | None,
    inputs: list[onnx.ValueInfoProto],
) -> Iterator[dict[str, np.ndarray]]:
    from infercc.data.images import PRESETS, iter_image_samples

    if preprocess is None:
        raise InferccError(
            f"--data {str(root)!r} holds images; say how to turn them into tensors",
            f"pass --preprocess, e.g. --preprocess imagenet (presets: {', '.join(PRESETS)})",
        )
    for source, sample in iter_image_samples(files, model, preprocess):
        check_sample(source, sample, inputs)
        yield sample


def _array_samples(
    root: Path, files: list[Path], inputs: list[onnx.ValueInfoProto]
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    if root.is_dir() and files[0].suffix == ".npy":
        names = [vi.name for vi in inputs]
        if len(names) == 1 and all(f.stem != names[0] for f in files):
            # a one-input model: each file is that input (one sample, or N stacked)
            for file in files:
                with _reading(file, names[0]):
                    array = np.load(file, allow_pickle=False)
                yield from _unstack(file, {names[0]: array}, inputs)
            return
        merged = {k: v for file in files for k, v in _load_file(file).items()}
        yield from _unstack(root, merged, inputs)
        return
    for file in files:
        yield from _unstack(file, _load_file(file), inputs)


def _unstack(
    source: Path, arrays: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """One sample, or the N samples of a stacked file (labelled `file[i]` in errors)."""
    stacked = _stacked_keys(source, arrays, inputs)
    if not stacked:
        yield source, arrays
        return
    count = _stacked_count(source, arrays, stacked)
    for i in range(count):
        sample = {k: a[i] if k in stacked else a for k, a in arrays.items()}
        yield Path(f"{source}[{i}]"), sample


def _stacked_keys(
    source: Path, arrays: dict[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> list[str]:
    """The arrays to split on axis 0: all model inputs when every known rank is rank + 1."""
    dims = {vi.name: declared_dims(vi) for vi in inputs}
    stacked, single = [], []
    for key, array in arrays.items():
        declared = dims.get(key)
        if declared is None:
            continue
        if array.ndim == len(declared) + 1:
            stacked.append(key)
        elif array.ndim == len(declared):
            single.append(key)
        else:
            raise _rank_error(source, key, array, declared, "")
    if stacked and single:
        key = stacked[0]
        raise _rank_error(source, key, arrays[key], dims[key], f"; {single[0]!r} is one sample")
    unknown_rank = [k for k in arrays if k in dims and dims[k] is None and arrays[k].ndim > 0]
    return stacked + unknown_rank if stacked else []


def _rank_error(
    source: Path, key: str, array: np.ndarray, dims: list[int | str | None], more: str
) -> InferccError:
    rank = len(dims)
    return InferccError(
        f"{str(source)!r}: input {key!r} has shape {list(array.shape)}, the model declares "
        f"{_format_dims(dims)}{more}",
        f"give one sample (rank {rank}) of every input, or stack N samples of every input on "
        f"a new axis 0 (rank {rank + 1})",
    )


def _stacked_count(source: Path, arrays: dict[str, np.ndarray], stacked: list[str]) -> int:
    counts = {key: arrays[key].shape[0] for key in stacked}
    first = stacked[0]
    for key, count in counts.items():
        if count != counts[first]:
            raise InferccError(
                f"{str(source)!r} stacks {counts[first]} sample(s) of {first!r} "
                f"but {count} of {key!r}",
                "every array of a stacked file needs the same length on axis 0",
            )
    if counts[first] == 0:
        raise InferccError(f"{str(source)!r} stacks 0 samples", "save at least one sample")
    return counts[first]


def _sample_files(root: Path) -> list[Path]:
    if root.is_file():
        if root.suffix != ".npz" and not _is_image(root):
            raise InferccError(
                f"--data {str(root)!r} is not a .npz file or an image",
                "pass a .npz file, or a directory of .npz files, of <input>.npy files or of "
                "images (jpg, png, bmp, webp)",
            )
        return [root]
    if not root.is_dir():
        raise InferccError(f"--data {str(root)!r} does not exist", "check the path")
    return _directory_files(root)


def _directory_files(root: Path) -> list[Path]:
    files = sorted(p for p in root.iterdir() if p.is_file())
    kinds = {
        ".npz": [p for p in files if p.suffix == ".npz"],
        ".npy": [p for p in files if p.suffix == ".npy"],
        "image": [p for p in files if _is_image(p)],
    }
    found = [kind for kind, paths in kinds.items() if paths]
    if len(found) > 1:
        raise InferccError(
            f"--data directory {str(root)!r} mixes {' and '.join(found)} files",
            "use .npz files (one sample each), <input>.npy files (one sample) or images, "
            "in separate directories",
        )
    if not found:
        raise InferccError(
            f"--data directory {str(root)!r} has no .npz or .npy files, nor images",
            "save each sample with numpy.savez(path, **{input_name: array})",
        )
    return kinds[found[0]]


def _load_file(file: Path) -> dict[str, np.ndarray]:
    """Arrays of one file by input name; a `.npy` file holds the input named by its stem."""
    if file.suffix == ".npy":
        with _reading(file, file.stem):
            return {file.stem: np.load(file, allow_pickle=False)}
    with _reading(file, None), np.load(file, allow_pickle=False) as archive:
        return {key: _archive_array(file, archive, key) for key in archive.files}


def _archive_array(file: Path, archive: Any, key: str) -> np.ndarray:
    with _reading(file, key):
        return archive[key]


@contextmanager
def _reading(file: Path, key: str | None) -> Iterator[None]:
    """Turn numpy's loading errors into InferccErrors naming the file (and input)."""
    where = repr(str(file)) + (f", input {key!r}" if key is not None else "")
    try:
        yield
    except ValueError as exc:
        raise InferccError(
            f"cannot load {where}: {exc}",
            "object arrays (pickles) are refused; save plain numeric or string arrays",
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InferccError(f"cannot read {where}: {exc}", "is it a numpy file?") from exc


def check_sample(
    source: Path, sample: Mapping[str, np.ndarray], inputs: list[onnx.ValueInfoProto]
) -> None:
    """Every real input present, nothing unknown, dtype and declared dims matching."""
    expected = {vi.name: vi for vi in inputs}
    missing = [name for name in expected if name not in sample]
    unknown = sorted(set(sample) - set(expected))
    if missing:
        named = ", ".join(repr(u) for u in unknown)
        if len(unknown) > 3:
            named = f"{len(unknown)} arrays, {unknown[0]!r}..{unknown[-1]!r}"
        strays = f" (it holds {named}: no model input has that name)" if unknown else ""
        raise InferccError(
            f"{str(source)!r} lacks input {missing[0]!r}{strays}",
            f"a sample needs every model input ({', '.join(expected)}): give a folder of "
            f"<input>.npy files ({', '.join(n + '.npy' for n in expected)}; N samples stacked "
            "on axis 0), or .npz files keyed by input name (np.savez(path, "
            + ", ".join(f"{n}=..." for n in expected)
            + "))",
        )
    if unknown:
        raise InferccError(
            f"{str(source)!r} has {unknown[0]!r}, which is not a model input",
            f"the model's inputs are: {', '.join(expected) or '(none)'}",
        )
    for name, vi in expected.items():
        _check_array(source, vi, sample[name])


def _check_array(source: Path, vi: onnx.ValueInfoProto, array: np.ndarray) -> None:
    dtype = input_dtype(vi)
    is_text = dtype == np.dtype(object) and array.dtype.kind in "US"
    if array.dtype != dtype and not is_text:
        raise InferccError(
            f"{str(source)!r}: input {vi.name!r} is {array.dtype}, the model expects "
            f"{elem_type_name(_tensor_type(vi).elem_type)} ({dtype})",
            f"save it with array.astype(numpy.{dtype})" if dtype.kind != "O" else None,
        )
    dims = declared_dims(vi)
    if dims is not None:
        _check_dims(source, vi.name, dims, array.shape)
    _check_contents(source, vi.name, array)


def _check_contents(source: Path, name: str, array: np.ndarray) -> None:
    """Refuse a sample that measures nothing: no rows on the batch axis, or NaN/infinity.

    An empty batch makes every metric trivially perfect (cosine 1.0 of nothing), and a
    non-finite value poisons ranges, GPTQ's Hessian and AWQ's scales; either way the numbers a
    build is judged by would describe no real input. (A zero-length axis after the first, such
    as an empty past of a decoder's cache, is a real input and stays allowed.)
    """
    if array.ndim > 0 and array.shape[0] == 0:
        raise InferccError(
            f"{str(source)!r}: input {name!r} has 0 rows along the batch axis (shape "
            f"{list(array.shape)}), so it measures nothing",
            "give samples with at least one row on axis 0",
        )
    if array.dtype.kind in "fc":
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            kinds = _non_finite_kinds(array)
            raise InferccError(
                f"{str(source)!r}: input {name!r} holds {kinds} ({bad} of {array.size} elements)",
                "samples must be finite: replace or drop those values",
            )


def _non_finite_kinds(array: np.ndarray) -> str:
    kinds = [
        word
        for word, present in (("NaN", np.isnan(array).any()), ("infinity", np.isinf(array).any()))
        if present
    ]
    return " and ".join(kinds)


def _check_dims(
    source: Path, name: str, dims: list[int | str | None], shape: tuple[int, ...]
) -> None:

    same_rank = len(dims) == len(shape)
    if not same_rank or any(
        isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=True)
    ):
        raise InferccError(
            f"{str(source)!r}: input {name!r} has shape {list(shape)}, "
            f"the model declares {_format_dims(dims)}",
            "only symbolic (named or ?) dimensions may vary",
        )
