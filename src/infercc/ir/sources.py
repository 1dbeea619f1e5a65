"""A model given to the Python API as a path or as an in-memory `onnx.ModelProto`.

The build and the validation read files (memory-mapped weights, onnxruntime sessions, the
size report), so a `ModelProto` is saved once into a private temporary directory and the rest
of infercc sees a path. A proto whose weights still point at external files cannot be saved
on its own: the caller is told to pass the path or to load the weights first.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from infercc.errors import InferccError

log = logging.getLogger(__name__)

ModelInput = str | os.PathLike[str] | onnx.ModelProto
IN_MEMORY = "<onnx.ModelProto>"  # what reports name a model given in memory

# protobuf serializes at most 2 GiB; leave room for the graph around the weights
_INLINE_LIMIT = 2**31 - 2**26


def is_proto(model: object) -> bool:
    return isinstance(model, onnx.ModelProto)


def _check_loaded(model: onnx.ModelProto) -> None:
    tensors = list(model.graph.initializer)
    if any(uses_external_data(t) and not t.HasField("raw_data") for t in tensors):
        raise InferccError(
            "the ModelProto's weights are still in external files (onnx.load(..., "
            "load_external_data=False))",
            "pass the model's path instead, or load it with onnx.load(path)",
        )


@contextmanager
def model_file(model: ModelInput, name: str = "model.onnx") -> Iterator[Path]:
    """A path to `model`: the path itself, or a temporary copy of a `ModelProto` (removed on
    exit). Weights over 2 GiB go to one external data file beside it."""
    if not isinstance(model, onnx.ModelProto):
        yield Path(model)
        return
    _check_loaded(model)
    with tempfile.TemporaryDirectory(prefix="infercc-proto-") as tmp:
        path = Path(tmp) / name
        large = model.ByteSize() > _INLINE_LIMIT
        if large:  # saving with external data rewrites the proto it is given: save a copy
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            onnx.save_model(copy, path, save_as_external_data=True, location=f"{name}.data")
        else:
            onnx.save_model(model, path)
        log.debug("saved the in-memory model to %s (%d bytes)", path, path.stat().st_size)
        yield path
