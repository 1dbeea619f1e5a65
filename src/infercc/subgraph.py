"""`infercc extract` (`infercc.extract`): the subgraph between named tensors, as a model.

`extract(model, output, inputs=["a", "b"], outputs=["y"])` keeps the nodes that compute the
`outputs` from the `inputs` (and from constants), drops everything else, and writes a model
whose graph inputs are `inputs` and whose graph outputs are `outputs` (onnxslim's
`--inputs/--outputs`, Polygraphy's `surgeon extract`). Omitted, `inputs` are the graph inputs
the outputs need and `outputs` the model's outputs.

- Every name must be a tensor of the main graph; an input may be a graph input or a node
  output (the node that made it is dropped, unless another kept value needs it), not a
  constant; a name cannot be both an input and an output. An output that needs a graph input
  the `inputs` do not list is refused, naming it.
- The result is checked with `onnx.checker` and validated under onnxruntime: the original
  model runs on random inputs (`shapes` pins symbolic dims, as optimize's validation does) or
  on `data` samples, with the cut tensors as extra outputs; the extracted model runs on the
  values the original gave its `inputs`, and its outputs must equal what the original gave
  for the `outputs` (fp32 tolerances). It is written (to a temporary name, then renamed) only
  when both pass; a model infercc made that fails is a failed report (exit 1), not a file.
"""

from __future__ import annotations

import difflib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from infercc.check.compare import ValidationReport, compare_outputs, run_model
from infercc.errors import InferccError
from infercc.ir import Model, Value, dtypes, infer_shapes, load_model, save_model
from infercc.ir.graph import Node
from infercc.outputs import record_written
from infercc.passes.manager import PassContext, run_passes
from infercc.precisions import tolerance
from infercc.util import first_line

log = logging.getLogger(__name__)

__all__ = ["ExtractReport", "extract", "split_names"]


@dataclass
class ExtractReport:
    """What `extract` did (`to_dict()` is the `--json` form)."""

    input: str
    destination: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    nodes_before: int
    nodes_after: int
    ops: dict[str, int]
    checked: bool = False
    check_error: str | None = None
    validation: ValidationReport | None = None
    written: bool = False
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        valid = self.validation is None or self.validation.passed
        return self.checked and valid

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.destination if self.written else None,
            "destination": self.destination,
            "written": self.written,
            "files": self.files,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops": self.ops,
            "checked": self.checked,
            "check_error": self.check_error,
            "passed": self.passed,
            "validation": self.validation.to_dict() if self.validation else None,
            "seconds": round(self.seconds, 4),
        }


def split_names(values: Iterable[str] | None) -> list[str]:
    """Tensor names from repeated and comma-separated options (`--inputs a,b --inputs c`)."""
    names: list[str] = []
    for value in values or ():
        names += [n.strip() for n in value.split(",") if n.strip()]
    return names


# --------------------------------------------------------------------------- entry point


def extract(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: str | os.PathLike[str] | None = None,
    seed: int = 0,
    validate: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> ExtractReport:
    """Write the subgraph of `model` from `inputs` to `outputs` to `output` (module doc)."""
    t0 = time.perf_counter()
    step = on_step or (lambda _text: None)
    src, dest = Path(model), Path(output)
    _check_paths(src, dest)
    if not inputs and not outputs:
        raise InferccError(
            "extract needs --inputs, --outputs or both", "e.g. --inputs a,b --outputs y"
        )
    step("loading")
    ir = load_model(src)
    infer_shapes(ir)  # the types of the tensors cut at
    nodes_before = sum(1 for _ in ir.graph.all_nodes())
    cut = _Cut(ir, list(inputs or ()), list(outputs or ()))
    cut.apply()
    report = ExtractReport(
        input=str(src),
        destination=str(dest),
        inputs=[_describe(v) for v in ir.graph.inputs],
        outputs=[_describe(v) for v in ir.graph.outputs],
        nodes_before=nodes_before,
        nodes_after=sum(1 for _ in ir.graph.all_nodes()),
        ops=_ops(ir),
    )
    step("writing")
    stage = Path(tempfile.mkdtemp(prefix=".infercc-extract-", dir=dest.parent))
    try:
        staged = save_model(ir, stage / dest.name)
        del ir
        report.check_error = _checker(staged[0])
        report.checked = report.check_error is None
        if report.checked and validate:
            step("validating")
            report.validation = _validate(src, staged[0], cut, shapes, data, seed)
        if report.passed:
            report.files = _publish(staged, dest)
            report.written = True
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report


def _check_paths(src: Path, dest: Path) -> None:
    if not src.is_file():
        raise InferccError(f"model file not found: {src}", "check the path")
    if dest.suffix.lower() != ".onnx":
        raise InferccError(f"extract writes an .onnx file, not {dest}", "name the output x.onnx")
    if dest.exists() and dest.resolve() == src.resolve():
        raise InferccError(f"refusing to overwrite the input model {src}", "pick another output")
    if dest.is_dir():
        raise InferccError(f"output path {dest} is a directory", "name an .onnx file")
    if not dest.parent.is_dir():
        raise InferccError(f"output directory {dest.parent} does not exist", "create it first")


# --------------------------------------------------------------------------- the cut


class _Cut:
    """The surgery: the inputs become graph inputs, the outputs graph outputs, and dead code
    elimination drops what no output needs."""

    def __init__(self, model: Model, inputs: list[str], outputs: list[str]):
        self.model, self.graph = model, model.graph
        self.output_names = outputs or [v.name for v in self.graph.outputs]
        self.outputs = [self._value(n, "--outputs") for n in self.output_names]
        given = [self._value(n, "--inputs") for n in inputs]
        self._check_roles(given)
        self.inputs = given or self._needed_graph_inputs()
        self.input_names = [v.name for v in self.inputs]
        self._check_reachable()

    def _value(self, name: str, flag: str) -> Value:
        v = self.model.value(name)
        if v is None or v.graph is not self.graph:
            known = [v.name for v in self._main_values()]
            close = difflib.get_close_matches(name, known, n=3)
            hint = (
                f"did you mean {', '.join(close)}?"
                if close
                else (
                    "name node outputs or graph inputs of the main graph (`infercc inspect` lists "
                    "the inputs and outputs)"
                )
            )
            raise InferccError(f"{flag} names {name!r}, which is no tensor of the model", hint)
        return v

    def _main_values(self) -> Iterable[Value]:
        yield from self.graph.inputs
        for node in self.graph:
            yield from (v for v in node.outputs if v is not None)

    def _check_roles(self, given: list[Value]) -> None:
        names = [v.name for v in given]
        if len(set(names)) != len(names):
            raise InferccError("--inputs names a tensor twice", "name each input once")
        for v in given:
            if v.is_constant:
                raise InferccError(
                    f"--inputs names {v.name!r}, a constant (initializer)",
                    "constants stay inside the subgraph; name a graph input or a node output",
                )
            if v.name in self.output_names:
                raise InferccError(
                    f"{v.name!r} is named by both --inputs and --outputs",
                    "a tensor is either an input or an output of the subgraph",
                )

    def _walk(self, stop: set[str]) -> tuple[list[Node], list[Value]]:
        """The nodes the outputs need (stopping at `stop`), and the graph inputs they reach."""
        needed: dict[Node, None] = {}
        reached: dict[str, Value] = {}
        todo = list(self.outputs)
        seen: set[int] = set()
        while todo:
            v = todo.pop()
            if id(v) in seen or v.name in stop or v.is_constant:
                continue
            seen.add(id(v))
            node = _local_producer(v, self.graph)
            if node is None:
                if v.graph is self.graph:
                    reached[v.name] = v
                continue
            if node not in needed:
                needed[node] = None
                todo += _reads(node)
        return list(needed), list(reached.values())

    def _needed_graph_inputs(self) -> list[Value]:
        _, reached = self._walk(set())
        order = {v.name: i for i, v in enumerate(self.graph.inputs)}
        return sorted(reached, key=lambda v: order.get(v.name, len(order)))

    def _check_reachable(self) -> None:
        _, reached = self._walk(set(self.input_names))
        if reached:
            names = ", ".join(repr(v.name) for v in reached[:3])
            raise InferccError(
                f"the outputs depend on graph input(s) {names}, which --inputs does not name",
                "add them to --inputs (or cut further down the graph)",
            )
        for v in (*self.inputs, *self.outputs):
            if v.dtype is None:
                raise InferccError(
                    f"the element type of {v.name!r} is unknown (shape inference could not tell)",
                    "cut at tensors whose type is known (`infercc inspect` shows the types)",
                )

    def apply(self) -> None:
        replaced = [self._as_graph_input(v) for v in self.inputs]
        self.graph.outputs = list(self.outputs)
        dropped = [v for v in self.graph.inputs if all(v is not r for r in replaced)]
        self.graph.inputs = replaced
        run_passes(self.model, PassContext(), ["eliminate-dead-code"])
        for v in dropped:
            if not v.uses():
                self.model.release_value(v)
                v.graph = None
        for new, name in zip(replaced, self.input_names, strict=True):
            if new.name != name:
                old = self.model.value(name)
                if old is not None and old is not new:  # still made by a kept node
                    self.model.rename_value(old, self.model.fresh_name(name + "__unused"))
                self.model.rename_value(new, name)
        self.graph.lint()

    def _as_graph_input(self, v: Value) -> Value:
        """A graph input that replaces `v`: `v` itself when it is one, else a new value (same
        type) that every reader of `v` now reads."""
        if v.is_graph_input:
            return v
        new = Value(self.model.fresh_name(v.name + "__cut"), v.dtype, v.shape)
        self.graph.add_input(new)
        for node, i in v.uses():
            node.set_input(i, new)
        return new


def _reads(node: Node) -> list[Value]:
    """What a node reads: its inputs and the outer-scope values its subgraphs read."""
    values = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs():
        for inner in sub.all_nodes():
            values += [v for v in inner.inputs if v is not None]
    return values


def _local_producer(v: Value, graph: Any) -> Node | None:
    """The node of `graph` that makes `v` (the owner of the subgraph that makes it)."""
    p = v.producer
    while p is not None and p.graph is not graph:
        owner = p.graph.owner if p.graph is not None else None
        if owner is None:
            return None
        p = owner
    return p


def _describe(v: Value) -> dict[str, Any]:
    return {
        "name": v.name,
        "dtype": dtypes.name(v.dtype) if v.dtype else None,
        "shape": None if v.shape is None else [d if d is not None else "?" for d in v.shape],
    }


def _ops(model: Model) -> dict[str, int]:
    from infercc.analysis.model_info import op_histogram

    return op_histogram(model)


# --------------------------------------------------------------------------- checks


def _checker(path: Path) -> str | None:
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # onnx.checker.ValidationError and friends
        return first_line(exc, 300)
    return None


def _validate(
    src: Path,
    extracted: Path,
    cut: _Cut,
    shapes: Mapping[str, tuple[int, ...]] | None,
    data: str | os.PathLike[str] | None,
    seed: int,
) -> ValidationReport:
    """The extracted model against the same tensors of the original (module doc)."""
    from infercc.data.feeds import make_inputs
    from infercc.data.samples import load_samples
    from infercc.runtime.artifact import read_skeleton

    skeleton = read_skeleton(src)
    if data is not None:
        feeds_list = load_samples(data, skeleton)
    else:
        feeds_list = [make_inputs(skeleton, shapes, seed)]
    wanted = [*cut.input_names, *cut.output_names]
    original = run_model(_with_outputs(src, wanted), feeds_list)
    sub_feeds = [{name: values[name] for name in cut.input_names} for values in original]
    expected = [{name: values[name] for name in cut.output_names} for values in original]
    got = run_model(extracted, sub_feeds)
    tol = tolerance("fp32")
    return compare_outputs(expected, got, atol=tol.atol, rtol=tol.rtol, min_cosine=tol.min_cosine)


def _with_outputs(src: Path, names: Sequence[str]) -> onnx.ModelProto:
    """The original with `names` among its graph outputs (onnxruntime infers their types)."""
    proto = onnx.load(str(src))
    present = {o.name for o in proto.graph.output}
    for name in names:
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return proto


def _publish(staged: list[Path], dest: Path) -> list[str]:
    files = []
    for p in staged:
        target = dest.parent / p.name
        os.replace(p, target)
        record_written(target)
        files.append(str(target))
    return files
