"""`infercc ci --ray`: every model of the manifest as one Ray task, built where its target is.

Ray places the tasks; infercc only says what each one needs:

- a CPU target asks for `[ray] cpus` CPUs (1 by default);
- a GPU target asks for one GPU of Ray's accelerator type for it (`ACCELERATOR_TYPES`:
  `a100` -> `A100`, `l4` -> `L4`, ...) with the same CPUs, so a model for an A100 is compiled,
  validated and tuned on an A100. A target that no live node can run is an error before any
  work (`check_placeable`), naming the target and the accelerator types the cluster has.

Inside the task the build runs in a child process (`infercc.ci.isolate`), so a crash in native
code or the out-of-memory killer fails that model with the signal that ended it; the driver
then retries it once, on another node that fits when there is one (a `label_selector` on
Ray's `ray.io/node-id` label), never more. A task whose worker or node is lost is rerun by Ray
itself (`max_retries`, `[ray] max_retries`, 2 by default). Ctrl-C cancels every task still
queued or running (`ray.cancel(force=True)`) and the run ends with the reports of what
finished, the rest failed as cancelled.

Files. With `[ray] shared_storage = true`, every node sees the manifest's paths: workers read
the inputs and write the artifacts there themselves (the way for artifacts of several GB).
Otherwise each input (the model and its external data, reference, samples, goldens; for a
benchmark the artifact and the baseline) goes to the worker through Ray's object store, and the
artifact comes back the same way, to be written by the driver under the run's out_dir (under a
temporary name, then renamed). A task that lands on the driver's own node reads and writes
the paths directly, and on a cluster of that one node nothing is sent at all (a task that a
node joining later takes asks for its inputs, and is sent again with them). A task works in
a scratch directory named after its worker (`task_scratch`); a worker Ray kills leaves its
directory behind, and the next task on that node removes it.

The tuning cache. The driver's cache (`[ci] cache_dir`, else `$INFERCC_CACHE_DIR` or
`~/.cache/infercc`) goes with every task; the worker merges it into its host's cache
(`$INFERCC_CACHE_DIR` or `~/.cache/infercc` on that node), builds with that cache, and returns
the entries it created, which the driver merges into its own (`infercc cache import` semantics:
the newer entry wins). A second run of the fleet hits the cache wherever a model lands, on
any node whose host fingerprint matches the one that tuned it.

Benchmarks (models with a latency budget or a baseline) run after every build, one at a time
over the whole cluster, each as a task with its model's resources, so no timing is taken on
a machine busy compiling.

The report gets, per model, `placement`: the host and node that built it, its accelerator
type, the seconds it waited in Ray's queue (from submission to the start of the task, clocks
of the driver and of that node) and ran, the attempts it took, and how it reached its files
(`files`: shared storage, the driver's node, or the object store).

This module imports `ray` only when a run asks for it (`pip install "infercc[ray]"`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.ci.isolate import ChildDied, Isolated
from infercc.ci.manifest import CiConfig, ModelSpec, RaySettings
from infercc.ci.results import ModelResult
from infercc.errors import InferccError
from infercc.util import first_line

log = logging.getLogger(__name__)

Event = Callable[[str, str], None]

# infercc's GPU targets -> Ray's accelerator types. Ray names a node's NVIDIA GPU from its
# NVML name ("NVIDIA A100-SXM4-40GB" -> A100, "NVIDIA L4" -> L4, "NVIDIA A10" -> A10) and
# advertises it as the resource `accelerator_type:<type>`. A100-80G is Ray's name for the
# 80 GB part, which nodes must declare themselves (ray start --resources).
ACCELERATOR_TYPES = {
    "t4": "T4",
    "a10": "A10",
    "l4": "L4",
    "a100": "A100",
    "a100-80gb": "A100-80G",
    "h100": "H100",
    "h200": "H200",
}
ACCELERATOR_PREFIX = "accelerator_type:"
NODE_ID_LABEL = "ray.io/node-id"
# The inputs a build reads, by ModelSpec field; a benchmark reads the artifact and baseline.
BUILD_INPUTS = ("path", "reference", "data", "golden")
BENCH_INPUTS = ("output", "baseline")
# Where a task read its inputs and wrote its artifact (`placement["files"]`).
SHARED, DIRECT, SHIPPED = "shared storage", "the driver's node", "object store"
WAIT_S = 0.5  # ray.wait's timeout, so Ctrl-C is seen at once


def require_ray() -> Any:
    """The `ray` module, or an error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InferccError(
            "--ray needs the ray package, which is not installed",
            'pip install "infercc[ray]"',
        ) from None
    return ray


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """The resources one model's task asks Ray for."""

    cpus: int
    gpus: int = 0
    accelerator: str | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `.options()` of a Ray remote function."""
        opts: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.accelerator is not None:
            opts["accelerator_type"] = self.accelerator
        return opts

    def fits(self, resources: Mapping[str, float]) -> bool:
        """True when a node with these total resources can ever run the task."""
        if resources.get("CPU", 0) < self.cpus or resources.get("GPU", 0) < self.gpus:
            return False
        return self.accelerator is None or ACCELERATOR_PREFIX + self.accelerator in resources

    def describe(self) -> str:
        if self.accelerator is None:
            return f"{self.cpus} CPU(s)"
        return f"one GPU of accelerator type {self.accelerator} and {self.cpus} CPU(s)"


def request_for(spec: ModelSpec, settings: RaySettings) -> Request:
    """CPUs for a CPU target (or a target infercc does not know: its build fails the same way
    as with --jobs); one GPU of the matching accelerator type for a GPU target."""
    accelerator = ACCELERATOR_TYPES.get(spec.target.strip().lower())
    if accelerator is None:
        return Request(settings.cpus)
    return Request(settings.cpus, 1, accelerator)


def accelerators_of(resources: Mapping[str, float]) -> list[str]:
    """The accelerator types a node advertises, sorted."""
    return sorted(
        k[len(ACCELERATOR_PREFIX) :] for k in resources if k.startswith(ACCELERATOR_PREFIX)
    )


def check_placeable(
    specs: Sequence[ModelSpec], requests: Mapping[str, Request], nodes: Sequence[Mapping]
) -> None:
    """Raise InferccError (exit 2) for the first target no live node can run."""
    alive = [n for n in nodes if n.get("Alive", True)]
    present = sorted({a for n in alive for a in accelerators_of(n.get("Resources", {}))})
    for spec in specs:
        request = requests[spec.name]
        if any(request.fits(n.get("Resources", {})) for n in alive):
            continue
        names = [s.name for s in specs if requests[s.name] == request]
        raise InferccError(_unplaceable(spec, request, names, alive, present), _hint(request))


def _unplaceable(spec, request, names, alive, present) -> str:
    models = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if request.accelerator is not None:
        types = ", ".join(present) if present else "none"
        return (
            f"target {spec.target!r} (model {models}) needs {request.describe()}, and no node "
            f"of the Ray cluster has one (accelerator types present: {types})"
        )
    most = max((n.get("Resources", {}).get("CPU", 0) for n in alive), default=0)
    return (
        f"target {spec.target!r} (model {models}) needs {request.describe()}, and the largest "
        f"node of the Ray cluster has {most:g}"
    )


def _hint(request: Request) -> str:
    if request.accelerator is not None:
        return (
            f"add a node with an {request.accelerator} to the cluster (a node declares a type "
            f"Ray does not detect with --resources '{{\"{ACCELERATOR_PREFIX}"
            f"{request.accelerator}\": 1}}'), or give those models a target the cluster has"
        )
    return "lower [ray] cpus in the manifest, or add a larger node"


def node_table(nodes: Sequence[Mapping]) -> dict[str, dict[str, Any]]:
    """node id -> host, address, CPUs, GPUs and accelerator types, for the live nodes."""
    table = {}
    for n in nodes:
        if not n.get("Alive", True):
            continue
        resources = n.get("Resources", {})
        table[n["NodeID"]] = {
            "host": n.get("NodeManagerHostname"),
            "address": n.get("NodeManagerAddress"),
            "cpus": resources.get("CPU", 0),
            "gpus": resources.get("GPU", 0),
            "accelerators": accelerators_of(resources),
        }
    return table


# --------------------------------------------------------------------------- connecting


@contextlib.contextmanager
def connected(address: str | bool) -> Iterator[dict[str, Any]]:
    """Join the cluster at `address` (True: start or join a local one; "auto": the one in
    `RAY_ADDRESS`) unless this process is connected already; yields what the report says about
    the connection. Only a connection made here is closed at the end."""
    ray = require_ray()
    started = time.perf_counter()
    made_here = not ray.is_initialized()
    if made_here:
        _init(ray, None if address is True else address)
    info = {"address": _address_name(ray, address), "connect_s": time.perf_counter() - started}
    try:
        yield info
    finally:
        if made_here:
            ray.shutdown()


def _init(ray: Any, address: str | None) -> None:
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=log.isEnabledFor(logging.DEBUG),  # workers' logs under --debug
            logging_level=logging.WARNING,
        )
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        where = "a local Ray cluster" if address is None else f"the Ray cluster at {address!r}"
        raise InferccError(
            f"cannot start or join {where}: {first_line(exc)}",
            "start one with `ray start --head`, give its address (--ray HOST:PORT, or "
            "--ray auto with RAY_ADDRESS set), or run --ray alone for a local one",
        ) from None


def _address_name(ray: Any, address: str | bool) -> str:
    with contextlib.suppress(Exception):
        return ray.get_runtime_context().gcs_address
    return "local" if address is True else str(address)


# --------------------------------------------------------------------------- files


def pack(paths: Sequence[Path]) -> bytes:
    """A tar (uncompressed) of files and directories, each under its own name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for p in paths:
            tar.add(p, arcname=p.name)
    return buffer.getvalue()


def unpack(blob: bytes, into: Path) -> list[Path]:
    """Extract a `pack` archive into `into`; returns the top-level entries."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        top = sorted({m.name.split("/", 1)[0] for m in tar.getmembers()})
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # Python before 3.10.12 / 3.11.4: archives come from this run's own workers
            tar.extractall(into)  # noqa: S202
    return [into / name for name in top]


def input_files(path: Path) -> list[Path]:
    """What a worker needs to read `path`: a directory whole; an ONNX file with the external
    data files it names (relative to its directory); any other file alone."""
    if path.is_dir() or path.suffix.lower() != ".onnx":
        return [path]
    return [path, *(path.parent / loc for loc in _external_locations(path))]


def _external_locations(path: Path) -> list[str]:
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    from infercc.ir.wire import read_model

    try:
        model = read_model(path)[0]
    except Exception:  # not a model: the build reports that, as it does without Ray
        return []
    names = {ExternalDataInfo(t).location for t in _get_all_tensors(model) if uses_external_data(t)}
    return sorted(n for n in names if n and (path.parent / n).is_file())


def pack_input(path: Path) -> bytes:
    """An input for the object store: the file (and its external data) or directory."""
    files = input_files(path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for f in files:
            tar.add(f, arcname=f.relative_to(path.parent).as_posix())
    return buffer.getvalue()


def install(blob: bytes, out_dir: Path) -> None:
    """Write a worker's artifact into `out_dir`: extracted beside it, then renamed into place
    (a directory replaces the one there), so a reader never sees half an artifact."""
    out_dir.mkdir(parents=True, exist_ok=True)
    incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=out_dir))
    try:
        for entry in unpack(blob, incoming):
            _replace(entry, out_dir / entry.name)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _replace(new: Path, dest: Path) -> None:
    if not (new.is_dir() and dest.is_dir()):
        if dest.is_dir():
            shutil.rmtree(dest)
        os.replace(new, dest)
        return
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(dest, old)
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- on the worker


@dataclass
class TaskSpec:
    """What a task gets besides its input archives (Ray resolves those before it starts)."""

    spec: ModelSpec  # paths absolute, as the driver sees them
    inputs: tuple[str, ...]  # the ModelSpec fields naming files to read, in archive order
    shipped: bool  # whether the archives came along (only when the cluster has other nodes)
    shown: dict[str, str]  # path as the worker would write it -> as the driver's report names it
    shared: bool
    driver_node: str | None  # the node the driver runs on (None: a Ray Client driver)
    submitted: float  # time.time() on the driver
    work: Callable[..., Any]
    builds: bool = True  # a build writes a fresh output; a benchmark reads one

    def files(self, node_id: str) -> str:
        """How a task on `node_id` reaches the files: SHARED, DIRECT or SHIPPED."""
        if self.shared:
            return SHARED
        return DIRECT if node_id == self.driver_node else SHIPPED

    def missing(self, node_id: str) -> bool:
        """True when a task on `node_id` needs the archives but was sent without them."""
        return self.files(node_id) == SHIPPED and bool(self.inputs) and not self.shipped


@dataclass
class Outcome:
    """What a task returns (the artifact archive, if any, is its second return value)."""

    value: Any  # the ModelResult of a build, the latency dict of a benchmark
    node_id: str
    host: str
    gpus: list[Any]
    started: float
    ended: float
    crashed: str | None = None  # how the child process died
    entries: list[dict[str, Any]] = field(default_factory=list)  # new tuning cache entries
    files: str = SHIPPED
    missing_inputs: bool = False  # it landed away from the driver without its inputs: resend


_CHILD = Isolated()


def _localize(task: TaskSpec, archives: Sequence[bytes], tmp: Path) -> tuple[ModelSpec, dict]:
    """The spec as this node reads it: inputs unpacked under `tmp/in`, a build's output under
    `tmp/out` (when they came through the object store). Returns it and {local path: name in
    the report}."""
    spec = task.spec
    shown = dict(task.shown)
    changes: dict[str, Any] = {}
    for name, blob in zip(task.inputs, archives, strict=True):
        original = getattr(spec, name)
        local = tmp / "in" / name / original.name
        unpack(blob, local.parent)
        changes[name] = local
        shown[str(local)] = shown.get(str(original), str(original))
    if task.builds:
        changes["output"] = tmp / "out" / spec.output.name
        (tmp / "out").mkdir(parents=True)
        shown[str(changes["output"])] = shown.get(str(spec.output), str(spec.output))
    return with_paths(spec, changes), shown


def _show(value: Any, shown: Mapping[str, str]) -> Any:
    """`value` (strings, lists, dicts) with the worker's paths written as the driver's."""
    if isinstance(value, str):
        for local in sorted(shown, key=len, reverse=True):
            value = value.replace(local, shown[local])
        return value
    if isinstance(value, dict):
        return {k: _show(v, shown) for k, v in value.items()}
    if isinstance(value, list):
        return [_show(v, shown) for v in value]
    return value


def _here(ray: Any, started: float) -> dict[str, Any]:
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "host": socket.gethostname(),
        "gpus": list(ray.get_gpu_ids()),
        "started": started,
    }


def _isolated(work: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """`work(*args)` in the child (a fresh one for GPU tasks, so their memory goes with it)."""
    gpu = bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
    child = Isolated() if gpu else _CHILD
    try:
        return child.call(work, *args), None
    except ChildDied as died:
        return None, died.describe()
    finally:
        if gpu:
            child.close()


def build_on_node(task: TaskSpec, entries: list[dict], *archives: bytes) -> tuple[Outcome, Any]:
    """The body of a build task: inputs in place, the driver's cache entries merged into this
    host's cache, the build in the child, the new entries and the artifact back."""
    ray = require_ray()
    here = _here(ray, time.time())
    files = task.files(here["node_id"])
    if task.missing(here["node_id"]):
        return Outcome(None, **here, ended=time.time(), files=files, missing_inputs=True), None
    with task_scratch() as tmp:
        spec, shown = task.spec, task.shown
        if files == SHIPPED:
            spec, shown = _localize(task, archives, Path(tmp))
        spec = dataclasses.replace(spec, cache_dir=_seed_cache(entries))
        result, crashed = _isolated(task.work, spec)
        if crashed is not None:
            result = _failed_result(task.spec, f"the build process died ({crashed})")
        fresh = _entries_since(spec.cache_dir, here["started"])
        artifact = _pack_dir(Path(tmp) / "out") if files == SHIPPED else None
    result.reason = _show(result.reason, shown)
    result.validation = _show(result.validation, shown)
    outcome = Outcome(result, **here, ended=time.time(), crashed=crashed, entries=fresh)
    outcome.files = files
    return outcome, artifact


def bench_on_node(task: TaskSpec, *archives: bytes) -> Outcome:
    """The body of a benchmark task: the artifact and baseline in place, timed in the child."""
    ray = require_ray()
    here = _here(ray, time.time())
    files = task.files(here["node_id"])
    if task.missing(here["node_id"]):
        return Outcome(None, **here, ended=time.time(), files=files, missing_inputs=True)
    with task_scratch() as tmp:
        spec, shown = task.spec, task.shown
        if files == SHIPPED:
            spec, shown = _localize(task, archives, Path(tmp))
        latency, crashed = _isolated(task.work, spec, str(spec.output))
        if crashed is not None:
            latency = {"reason": f"the benchmark process died ({crashed})", "error": True}
    return Outcome(_show(latency, shown), **here, ended=time.time(), crashed=crashed, files=files)


SCRATCH_PREFIX = "infercc-ray-"


def task_scratch() -> tempfile.TemporaryDirectory[str]:
    """A task's scratch directory (its shipped inputs, its artifact), named after the Ray
    worker that runs it: `infercc-ray-PID-XXXX` in the node's temporary directory.

    A worker that Ray kills (a Ctrl-C's `ray.cancel(force=True)`, a lost worker) never removes
    its scratch directory, which may hold copies of models; so each task first removes the
    ones this user's dead workers left on this node (`sweep_scratch`)."""
    sweep_scratch(Path(tempfile.gettempdir()))
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def sweep_scratch(root: Path) -> list[Path]:
    """Remove the scratch directories under `root` whose worker process is gone: named
    `infercc-ray-PID-...`, owned by this user, PID not running. Returns what was removed.
    Only on POSIX (where signal 0 asks whether a process exists without touching it)."""
    if os.name != "posix":
        return []
    removed = []
    for path in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or path.stat().st_uid != os.getuid() or _running(int(pid)):
                continue
        except OSError:  # removed meanwhile by another worker's sweep
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        log.info("removed %d scratch directories of dead Ray workers", len(removed))
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _failed_result(spec: ModelSpec, reason: str) -> ModelResult:
    result = ModelResult(
        spec.name, str(spec.path), False, reason, precision=spec.precision, error=True
    )
    result.target, result.backend = spec.target, spec.backend
    return result


def _seed_cache(entries: list[dict]) -> Path:
    """This host's tuning cache directory, with the driver's entries merged in."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache() as cache:
        if entries:
            try:
                cache.merge(entries, "the driver's tuning cache")
            except InferccError as exc:  # the cache is never fatal to a build
                log.warning("could not merge the driver's tuning cache: %s", exc.message)
        return cache.directory


def _entries_since(directory: Path, started: float) -> list[dict[str, Any]]:
    from infercc.runtime.tuning import TuningCache

    try:
        with TuningCache(directory) as cache:
            return cache.entries_since(started)
    except InferccError as exc:
        log.warning("could not read this host's tuning cache: %s", exc.message)
        return []


def _pack_dir(out: Path) -> bytes | None:
    entries = sorted(out.iterdir())
    return pack(entries) if entries else None


# --------------------------------------------------------------------------- on the driver


@dataclass
class _Attempt:
    spec: ModelSpec
    number: int
    task: TaskSpec
    ref: Any
    artifact_ref: Any = None
    first_attempt: dict[str, Any] | None = None  # where and how a crashed first try ended


class Fleet:
    """The models of one run on a Ray cluster: placement check, builds, benchmarks."""

    def __init__(
        self,
        config: CiConfig,
        specs: Sequence[ModelSpec],
        event: Event,
        *,
        build: Callable[[ModelSpec], ModelResult],
        bench: Callable[[ModelSpec, str], dict[str, Any]],
    ):
        self.ray = require_ray()
        self.config, self.specs, self.event = config, list(specs), event
        self.settings = config.ray
        self.build_fn, self.bench_fn = build, bench
        self.requests = {s.name: request_for(s, self.settings) for s in self.specs}
        self.nodes = node_table(self.ray.nodes())
        check_placeable(self.specs, self.requests, self.ray.nodes())
        self.driver_node = _driver_node(self.ray)
        self.interrupted = False
        self._inputs: dict[Path, Any] = {}
        self._entries_ref: Any = None
        self._remotes: dict[Callable, Any] = {}

    # -- what the report says about the cluster

    def summary(self) -> dict[str, Any]:
        return {
            "nodes": [{"node_id": k, **v} for k, v in self.nodes.items()],
            "shared_storage": self.settings.shared_storage,
            "cpus_per_model": self.settings.cpus,
            "max_retries": self.settings.max_retries,
        }

    # -- builds

    def build_all(self) -> list[ModelResult]:
        """Submit every model, collect them as they finish; Ctrl-C cancels what is left."""
        self.config.out_dir.mkdir(parents=True, exist_ok=True)
        self._entries_ref = self.ray.put(self._driver_entries())
        results: dict[str, ModelResult] = {}
        pending: dict[Any, _Attempt] = {}
        try:
            for spec in self.specs:
                self.event(spec.name, "compiling")
                try:
                    attempt = self._submit_build(spec, 1)
                except OSError as exc:  # an input that cannot be read to send it
                    results[spec.name] = _failed_result(spec, f"cannot send its inputs: {exc}")
                    self.event(spec.name, "failed")
                    continue
                pending[attempt.ref] = attempt
            while pending:
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    self._collect(pending.pop(ref), pending, results)
        except KeyboardInterrupt:
            self._cancel(pending.values(), results)
        return [results[s.name] for s in self.specs]

    def _submit_build(
        self, spec: ModelSpec, number: int, avoid: str | None = None, ship: bool | None = None
    ) -> _Attempt:
        task, refs = self._task(spec, BUILD_INPUTS, self.build_fn, ship)
        options = {**self.requests[spec.name].options(), "num_returns": 2}
        options["max_retries"] = self.settings.max_retries
        options["name"] = f"infercc-build-{spec.name}"
        if avoid is not None:
            options["label_selector"] = {NODE_ID_LABEL: f"!{avoid}"}
        remote = self._remote(build_on_node)
        ref, artifact_ref = remote.options(**options).remote(task, self._entries_ref, *refs)
        return _Attempt(spec, number, task, ref, artifact_ref)

    def _task(
        self, spec: ModelSpec, fields: Sequence[str], work: Callable, ship: bool | None = None
    ) -> tuple[TaskSpec, list]:
        """The task for `spec` and its input archives: sent along only when the task may land
        on a node other than the driver's (a task sent without them that does asks again)."""
        absolute, shown = _absolute(spec)
        shared = self.settings.shared_storage
        inputs = () if shared else tuple(f for f in fields if _exists(getattr(absolute, f)))
        if ship is None:
            ship = bool(inputs) and self._other_nodes()
        refs = [self._input_ref(getattr(absolute, f)) for f in inputs] if ship else []
        builds = work is self.build_fn
        return TaskSpec(
            absolute, inputs, ship, shown, shared, self.driver_node, time.time(), work, builds
        ), refs

    def _other_nodes(self) -> bool:
        return any(node_id != self.driver_node for node_id in self.nodes)

    def _input_ref(self, path: Path) -> Any:
        if path not in self._inputs:
            self._inputs[path] = self.ray.put(pack_input(path))
        return self._inputs[path]

    def _remote(self, fn: Callable) -> Any:
        if fn not in self._remotes:
            self._remotes[fn] = self.ray.remote(fn)
        return self._remotes[fn]

    def _collect(self, attempt: _Attempt, pending: dict, results: dict) -> None:
        spec = attempt.spec
        try:
            outcome: Outcome = self.ray.get(attempt.ref)
        except self.ray.exceptions.RayError as exc:
            results[spec.name] = self._lost(attempt, exc)
            self.event(spec.name, "failed")
            return
        if outcome.missing_inputs:  # a node joined and took it: send the files this time
            self.nodes = node_table(self.ray.nodes())
            resent = self._submit_build(spec, attempt.number, ship=True)
            resent.first_attempt = attempt.first_attempt
            pending[resent.ref] = resent
            return
        if outcome.crashed is not None and attempt.number == 1:
            retry = self._submit_build(spec, 2, self._elsewhere(spec, outcome.node_id))
            retry.first_attempt = {
                "node_id": outcome.node_id,
                "host": outcome.host,
                "reason": f"the build process {outcome.crashed}",
            }
            pending[retry.ref] = retry
            self.event(spec.name, f"retrying (the build process {outcome.crashed})")
            return
        results[spec.name] = self._finish(attempt, outcome)
        self.event(spec.name, "built" if results[spec.name].passed else "failed")

    def _elsewhere(self, spec: ModelSpec, node_id: str) -> str | None:
        """`node_id` when another live node fits the model (to be avoided), else None."""
        request = self.requests[spec.name]
        nodes = self.ray.nodes()
        others = [n for n in nodes if n.get("Alive") and n["NodeID"] != node_id]
        return node_id if any(request.fits(n.get("Resources", {})) for n in others) else None

    def _finish(self, attempt: _Attempt, outcome: Outcome) -> ModelResult:
        spec, result = attempt.spec, outcome.value
        result.path = str(spec.path)
        if result.output is not None:
            result.output = str(spec.output)
        self._merge_entries(outcome.entries)
        if outcome.files == SHIPPED:
            self._write_artifact(attempt, result)
        result.placement = self._placement(attempt, outcome)
        return result

    def _write_artifact(self, attempt: _Attempt, result: ModelResult) -> None:
        spec = attempt.spec
        try:
            blob = self.ray.get(attempt.artifact_ref)
            if blob is not None:
                install(blob, spec.output.parent)
        except (OSError, self.ray.exceptions.RayError) as exc:
            result.passed, result.stage, result.error = False, "compile", True
            result.reason = f"cannot write the artifact to {spec.output}: {first_line(exc)}"

    def _placement(self, attempt: _Attempt, outcome: Outcome) -> dict[str, Any]:
        node = self._node(outcome.node_id)
        return {
            "host": outcome.host,
            "node_id": outcome.node_id,
            "address": node.get("address"),
            "accelerator": ", ".join(node.get("accelerators", [])) or None,
            "gpus": outcome.gpus,
            "queued_s": round(max(0.0, outcome.started - attempt.task.submitted), 3),
            "running_s": round(outcome.ended - outcome.started, 3),
            "attempts": attempt.number,
            "first_attempt": attempt.first_attempt,
            "files": outcome.files,
        }

    def _node(self, node_id: str) -> dict[str, Any]:
        if node_id not in self.nodes:  # a node that joined during the run
            self.nodes = node_table(self.ray.nodes())
        return self.nodes.get(node_id, {})

    def _lost(self, attempt: _Attempt, exc: BaseException) -> ModelResult:
        result = _failed_result(attempt.spec, _ray_reason(exc, self.settings.max_retries))
        result.placement = {"attempts": attempt.number, "first_attempt": attempt.first_attempt}
        return result

    def _cancel(self, attempts: Any, results: dict) -> None:
        self.interrupted = True
        for attempt in list(attempts):
            with contextlib.suppress(Exception):
                self.ray.cancel(attempt.ref, force=True)
            result = _failed_result(attempt.spec, "cancelled: the run was interrupted (Ctrl-C)")
            results[attempt.spec.name] = result
            self.event(attempt.spec.name, "failed")

    # -- the tuning cache

    def _cache_dir(self) -> Path | None:
        return self.specs[0].cache_dir if self.specs else None

    def _driver_entries(self) -> list[dict[str, Any]]:
        from infercc.runtime.tuning import TuningCache

        try:
            with TuningCache(self._cache_dir()) as cache:
                return cache.show("")
        except InferccError as exc:
            log.warning("tuning cache not sent to the workers: %s", exc.message)
            return []

    def _merge_entries(self, entries: list[dict[str, Any]]) -> None:
        from infercc.runtime.tuning import TuningCache

        if not entries:
            return
        try:
            with TuningCache(self._cache_dir()) as cache:
                cache.merge(entries, "a worker's tuning cache")
        except InferccError as exc:
            log.warning("a worker's tuning cache entries were not kept: %s", exc.message)

    # -- benchmarks

    def bench_all(self, results: Sequence[ModelResult], apply: Callable) -> None:
        """Time the passed models that have a budget or baseline, one at a time."""
        todo = [(s, r) for s, r in zip(self.specs, results, strict=True) if r.passed and s.benched]
        for i, (spec, result) in enumerate(todo):
            if self.interrupted:
                for s, r in todo[i:]:
                    apply(r, {"reason": "cancelled before its benchmark: the run was interrupted"})
                    self.event(s.name, "failed")
                return
            self.event(spec.name, "benching")
            apply(result, self._bench(spec))

    def _bench(self, spec: ModelSpec, ship: bool | None = None) -> dict[str, Any]:
        task, refs = self._task(spec, BENCH_INPUTS, self.bench_fn, ship)
        options = {**self.requests[spec.name].options(), "max_retries": self.settings.max_retries}
        options["name"] = f"infercc-bench-{spec.name}"
        ref = self._remote(bench_on_node).options(**options).remote(task, *refs)
        try:
            while not self.ray.wait([ref], timeout=WAIT_S)[0]:
                pass
            outcome = self.ray.get(ref)
            return self._bench(spec, ship=True) if outcome.missing_inputs else outcome.value
        except KeyboardInterrupt:
            self.interrupted = True
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
            return {"reason": "cancelled: the run was interrupted (Ctrl-C)"}
        except self.ray.exceptions.RayError as exc:
            return {
                "reason": "benchmark failed: " + _ray_reason(exc, self.settings.max_retries),
                "error": True,
            }


def _absolute(spec: ModelSpec) -> tuple[ModelSpec, dict[str, str]]:
    """The spec with absolute paths (a worker's directory is not the driver's), and
    {absolute: as given} so reports name the paths as they would without Ray."""
    changes, shown = {}, {}
    for name in (*BUILD_INPUTS, *BENCH_INPUTS, "output", "cache_dir"):
        value = getattr(spec, name)
        if isinstance(value, Path) and not value.is_absolute():
            changes[name] = value.absolute()
            shown[str(changes[name])] = str(value)
    return with_paths(spec, changes), shown


def with_paths(spec: ModelSpec, changes: Mapping[str, Path]) -> ModelSpec:
    """`spec` with some of its path fields replaced (`data` lives in its BuildConfig)."""
    changes = dict(changes)
    if "data" in changes:
        build = dataclasses.replace(spec.build, data=str(changes.pop("data")))
        spec = dataclasses.replace(spec, build=build)
    return dataclasses.replace(spec, **changes)


def _driver_node(ray: Any) -> str | None:
    """The node this driver runs on; None for a Ray Client driver, which runs on none."""
    with contextlib.suppress(Exception):
        from ray.util.client import ray as client

        if client.is_connected():
            return None
    return ray.get_runtime_context().get_node_id()


def _exists(path: Path | None) -> bool:
    return path is not None and path.exists()


def _ray_reason(exc: BaseException, max_retries: int) -> str:
    """One line for a task Ray gave up on."""
    kind = type(exc).__name__
    ray = require_ray()
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return "cancelled"
    if isinstance(exc, ray.exceptions.RayTaskError):  # an error in infercc's task code itself
        return f"the Ray task failed: {first_line(exc.cause if exc.cause else exc)}"
    lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)
    if isinstance(exc, lost):
        return f"its Ray worker or node was lost {max_retries + 1} time(s) ({kind})"
    return f"Ray: {kind}: {first_line(exc)}"


def run_fleet(
    config: CiConfig,
    specs: Sequence[ModelSpec],
    address: str | bool,
    event: Event,
    *,
    build: Callable[[ModelSpec], ModelResult],
    bench: Callable[[ModelSpec, str], dict[str, Any]],
    apply_latency: Callable[[ModelResult, dict[str, Any]], None],
) -> tuple[list[ModelResult], dict[str, Any], bool]:
    """Build (then bench) `specs` on the cluster at `address`; returns the results, what the
    report says about the cluster, and whether the run was interrupted. `build(spec)` and
    `bench(spec, output)` run on the workers (so they must be importable there: the runner's
    `build_and_validate` and `bench_model`); `apply_latency` puts a benchmark's result into
    its model's result."""
    with connected(address) as info:
        fleet = Fleet(config, specs, event, build=build, bench=bench)
        results = fleet.build_all()
        fleet.bench_all(results, apply_latency)
        return results, {**info, **fleet.summary()}, fleet.interrupted
