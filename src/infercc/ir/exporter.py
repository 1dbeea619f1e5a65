"""IR -> ModelProto, and the streaming, atomic model writer.

`save_model` never builds a second copy of the weights in memory: it serializes the model
without its main-graph initializers, then appends each initializer to the graph field one at a
time, so peak memory is the IR plus the largest single tensor. Models whose weights pass 2 GB
(or with `external_data=True`) get their tensors in a `<file>.data` beside the model. Files are
written under a temporary name and renamed, so a crash never leaves half a model; a model and
its data are published together (`infercc.outputs.publish_files`), so that no reader sees the
new model with the old weights or the old model with the new ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from infercc.ir.graph import Graph, Model, Node, Value
from infercc.ir.tensor import Tensor
from infercc.ir.wire import RawSlice
from infercc.outputs import check_replaceable, publish_files

EXTERNAL_THRESHOLD = 2**31 - 2**27  # ~1.87 GiB of weights: past this, write external data
EXTERNAL_MIN_BYTES = 1024  # smaller tensors stay inline even in external-data mode
_ALIGN = 4096
# Strings have no fixed width; 4- and 2-bit types pack several values to a byte.
_INLINE_ONLY = {
    getattr(TensorProto, n)
    for n in ("STRING", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, n)
}


def type_proto_of(value: Value) -> onnx.TypeProto:
    if value.type_proto is not None and not _type_stale(value):
        return value.type_proto
    tp = onnx.TypeProto()
    if value.dtype is None:
        return tp
    tt = tp.tensor_type
    tt.elem_type = value.dtype
    if value.shape is not None:
        tt.shape.SetInParent()
        for d in value.shape:
            dim = tt.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
    return tp


def _type_stale(value: Value) -> bool:
    tp = value.type_proto
    assert tp is not None
    return (
        tp.HasField("tensor_type")
        and value.dtype is not None
        and tp.tensor_type.elem_type not in (0, value.dtype)
    )


def _value_info(value: Value) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=value.name, doc_string=value.doc_string)
    vi.type.CopyFrom(type_proto_of(value))
    for k, v in value.metadata_props:
        vi.metadata_props.add(key=k, value=v)
    return vi


def export_node(node: Node, with_weights: bool = True) -> onnx.NodeProto:
    np_ = onnx.NodeProto(
        op_type=node.op_type, domain=node.domain, name=node.name, doc_string=node.doc_string
    )
    np_.input.extend(v.name if v is not None else "" for v in node.inputs)
    np_.output.extend(v.name if v is not None else "" for v in node.outputs)
    if node.overload:
        np_.overload = node.overload
    for k, v in node.metadata_props:
        np_.metadata_props.add(key=k, value=v)
    for name, a in node.attributes.items():
        if isinstance(a, Graph):
            attr = np_.attribute.add(name=name, type=onnx.AttributeProto.GRAPH)
            attr.g.CopyFrom(export_graph(a, with_weights))
        elif isinstance(a, list):
            attr = np_.attribute.add(name=name, type=onnx.AttributeProto.GRAPHS)
            attr.graphs.extend(export_graph(g, with_weights) for g in a)
        else:
            np_.attribute.append(a)
    return np_


def export_graph(
    graph: Graph, with_weights: bool = True, sparse: bool | None = None
) -> onnx.GraphProto:
    """A GraphProto; without weights, the main-graph initializers are left out (and the sparse
    ones too, unless `sparse`)."""
    gp = onnx.GraphProto(name=graph.name, doc_string=graph.doc_string)
    gp.node.extend(export_node(n, True) for n in graph)
    if with_weights:
        gp.initializer.extend(v.tensor.to_proto(v.name) for v in _initializers(graph))
    if with_weights if sparse is None else sparse:
        gp.sparse_initializer.extend(sp for sp, _ in _sparse_kept(graph))
    gp.input.extend(_value_info(v) for v in graph.inputs)
    gp.output.extend(_value_info(v) for v in graph.outputs)
    gp.value_info.extend(_value_info(v) for v in _kept_infos(graph))
    gp.value_info.extend(graph.extra_value_info)
    for k, v in graph.metadata_props:
        gp.metadata_props.add(key=k, value=v)
    return gp


def _initializers(graph: Graph) -> list[Value]:
    """The dense constants (those written back as sparse initializers left out), then the
    defaults of overridable inputs (also initializers in ONNX)."""
    sparse = {id(v) for _, v in _sparse_kept(graph)}
    live = {v.name for v in graph.inputs}
    defaults = [v for name, v in graph.input_defaults.items() if name in live]
    dense = [v for v in graph.initializers.values() if id(v) not in sparse]
    return [*dense, *defaults]


def _sparse_kept(graph: Graph) -> list[tuple[onnx.SparseTensorProto, Value]]:
    """Sparse initializers whose constant is still there, under its own name."""
    return [
        (sp, v)
        for sp, v in graph.sparse_initializers
        if graph.initializers.get(sp.values.name) is v
    ]


def _kept_infos(graph: Graph) -> Iterator[Value]:
    """The intermediate values whose type the file states: those the original stated and onnx
    could not infer (`keep_info`), and the outputs of nodes outside the standard domains
    whose shape is known (onnx's inference cannot recover them when the file is read back,
    so a model read again is sized and scheduled as it was when written)."""
    outputs = {id(v) for v in graph.outputs}
    for node in graph:
        contrib = not node.is_standard
        for v in node.outputs:
            if v is None or id(v) in outputs:
                continue
            if v.keep_info or (contrib and v.dtype is not None and v.shape is not None):
                yield v


def _model_shell(model: Model) -> onnx.ModelProto:
    mp = onnx.ModelProto(
        # IR < 4 demands every initializer be listed as a graph input too; infercc treats such
        # initializers as constants, so the model is written as IR 4 (same opsets).
        ir_version=max(model.ir_version, 4),
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
        doc_string=model.doc_string,
    )
    for domain, version in model.opset_imports.items():
        mp.opset_import.add(domain=domain, version=version)
    for k, v in model.metadata_props:
        mp.metadata_props.add(key=k, value=v)
    mp.functions.extend(model.functions)
    mp.training_info.extend(model.training_info)
    return mp


def export_model(model: Model, with_weights: bool = True) -> onnx.ModelProto:
    """The model as a ModelProto (weights copied in: use `save_model` for large models)."""
    mp = _model_shell(model)
    mp.graph.CopyFrom(export_graph(model.graph, with_weights))
    return mp


def weights_nbytes(model: Model) -> int:
    return sum(v.tensor.nbytes for v in _initializers(model.graph))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_GRAPH_TAG = _varint((7 << 3) | 2)  # ModelProto.graph
_INIT_TAG = _varint((5 << 3) | 2)  # GraphProto.initializer
_RAW_TAG = _varint((9 << 3) | 2)  # TensorProto.raw_data
_CHUNK = 8 * 2**20


def save_model(model: Model, path: str | Path, external_data: bool | None = None) -> list[Path]:
    """Write the model atomically; returns the files written (model, and .data if any)."""
    path = Path(path)
    use_external = (
        external_data if external_data is not None else weights_nbytes(model) > EXTERNAL_THRESHOLD
    )
    data_path = path.with_name(path.name + ".data")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp_data = data_path.with_name(f".{data_path.name}.{os.getpid()}.tmp")
    inits = _initializers(model.graph)
    check_replaceable(path)
    if use_external:
        check_replaceable(data_path)
    try:
        with open(tmp, "wb") as f:
            if use_external:
                with open(tmp_data, "wb") as fd:
                    protos = [_to_external(v, fd, data_path.name) for v in inits]
                _write_model(model, f, lambda: iter(protos))
            else:
                _write_model(model, f, lambda: (_inline(v) for v in inits))
        moves = [(tmp, path), (tmp_data, data_path)] if use_external else [(tmp, path)]
        publish_files(moves)
    finally:
        for t in (tmp, tmp_data):
            if t.exists():
                t.unlink()
    return [path, data_path] if use_external else [path]


def _write_model(model: Model, f, tensors: Callable[[], Iterator[TensorProto | Tensor]]) -> None:
    """Serialize the shell and graph, then stream the initializers into the graph field.

    `tensors` is called twice (sizes first, then bytes) so that tensors built from arrays exist
    one at a time. The source model's TensorProtos are never copied, and raw bytes still lying
    in the source file are copied file to file in chunks.
    """
    shell = _model_shell(model).SerializeToString()
    graph = export_graph(model.graph, with_weights=False, sparse=True).SerializeToString()
    sizes = [_tensor_size(t) for t in tensors()]
    total = len(graph) + sum(len(_INIT_TAG) + len(_varint(s)) + s for s in sizes)
    f.write(shell)
    f.write(_GRAPH_TAG + _varint(total) + graph)
    for t, s in zip(tensors(), sizes, strict=True):
        f.write(_INIT_TAG + _varint(s))
        _write_tensor(t, f)


def _tensor_size(t: TensorProto | Tensor) -> int:
    if isinstance(t, TensorProto):
        return t.ByteSize()
    src, proto = t.source, t.proto
    assert src is not None and proto is not None  # `_inline` keeps a Tensor only then
    n = src.length
    return proto.ByteSize() + len(_RAW_TAG) + len(_varint(n)) + n


def _write_tensor(t: TensorProto | Tensor, f) -> None:
    if isinstance(t, TensorProto):
        f.write(t.SerializeToString())
        return
    src = t.source
    assert src is not None and t.proto is not None
    f.write(t.proto.SerializeToString())
    f.write(_RAW_TAG + _varint(src.length))
    _copy_slice(src, src.length, f)


def _inline(value: Value) -> TensorProto | Tensor:
    """What the writer needs for one initializer, without reading raw bytes still on disk."""
    tensor = value.tensor
    if tensor.source is not None and tensor.proto is not None:
        if tensor.proto.name != value.name:
            tensor.proto = tensor.header(value.name)
        return tensor
    return tensor.to_proto(value.name)


def _copy_slice(src: RawSlice, nbytes: int, fd) -> None:
    """Copy an external tensor's bytes file to file in chunks: neither read whole into memory
    nor left mapped (which would count every weight in the process's resident memory)."""
    with open(src.path, "rb") as fin:
        fin.seek(src.offset)
        left = nbytes
        while left:
            chunk = fin.read(min(left, _CHUNK))
            if not chunk:
                raise OSError(f"{src.path} was truncated while being copied")
            fd.write(chunk)
            left -= len(chunk)


def _to_external(value: Value, fd, location: str) -> TensorProto:
    tensor = value.tensor
    if tensor.nbytes < EXTERNAL_MIN_BYTES or tensor.dtype in _INLINE_ONLY:
        return tensor.to_proto(value.name)
    fd.write(b"\0" * ((-fd.tell()) % _ALIGN))
    offset = fd.tell()
    if tensor.source is not None:
        fd.write(tensor.raw_bytes())
    elif tensor.is_external:  # fixed-width types only here (_INLINE_ONLY returned above)
        _copy_slice(tensor.external_slice(), tensor.nbytes, fd)
    elif tensor.proto is not None and not tensor.is_external and tensor.proto.raw_data:
        fd.write(tensor.proto.raw_data)
    else:
        fd.write(np.ascontiguousarray(tensor.numpy()).tobytes())
    out = TensorProto(name=value.name, data_type=tensor.dtype, doc_string=value.doc_string)
    out.dims.extend(tensor.shape)
    out.data_location = TensorProto.EXTERNAL
    length = fd.tell() - offset
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        out.external_data.add(key=k, value=v)
    return out
