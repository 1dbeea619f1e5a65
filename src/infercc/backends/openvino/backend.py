"""The `openvino` backend: compile with OpenVINO's CPU plugin, keep its blob, load a runner."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercc.analysis.targets import Target, host_cpu_info
from infercc.backends.openvino import engine
from infercc.check import compare
from infercc.data.feeds import make_inputs
from infercc.data.profiles import ShapeProfile
from infercc.data.signature import real_inputs, resolve_shapes
from infercc.errors import InferccError, InternalError, ValidationError
from infercc.ir.wire import read_model
from infercc.precisions import tolerance
from infercc.runtime import timing
from infercc.runtime.artifact import Artifact, Feeds, Runner
from infercc.runtime.backend import CompileOptions

log = logging.getLogger(__name__)

SCHEMA = "infercc.openvino_config/1"
CONFIG_FILE = "openvino_config.json"
BLOB_FILE = "openvino.blob"
PRECISIONS = ("fp32", "bf16", "int8")


def host_has_bf16() -> bool:
    info, _cores = host_cpu_info()
    return any(f in info.features for f in ("avx512_bf16", "amx_bf16"))


def host_class() -> str | None:
    """The CPU row this host's flags put it in (OpenVINO picks its kernels by the ISA, whatever
    row INFERCC_CPU_CLASS states)."""
    info, _cores = host_cpu_info()
    row = info.detected_row
    return None if row is None else row.name


def candidate_hints(precision: str, target: Target) -> list[str]:
    """The precision hints a build races: its own, and for int8 the rest in bf16 too where
    the target and this host have it."""
    if precision == "int8":
        both = "bf16" in target.precisions and host_has_bf16()
        return ["f32", "bf16"] if both else ["f32"]
    if precision not in engine.HINTS:
        raise InferccError(
            f"--backend openvino builds fp32, bf16 or int8, not {precision}",
            "use --bf16 where the CPU has bfloat16 (an fp16 graph is for GPUs)",
        )
    return [engine.HINTS[precision]]


class OpenVinoBackend:
    """OpenVINO's CPU plugin: the optimized model compiled at the build's precision, its blob
    kept for this host and OpenVINO version (see `infercc.backends.openvino`)."""

    name = "openvino"

    def available(self) -> tuple[bool, str]:
        reason = engine.missing_reason()
        return (not reason, reason)

    def version(self) -> str:
        return engine.version()

    def precisions(self, target: Target) -> tuple[str, ...]:
        if target.kind != "cpu" or engine.ov is None:
            return ()
        return tuple(p for p in PRECISIONS if p != "bf16" or "bf16" in target.precisions)

    def check_source(self, model: Path) -> None:
        """Refuse, before any work, a model OpenVINO cannot read (the op named; exit 2)."""
        engine.read(model, f"{model}")

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        engine.require()
        if target.kind != "cpu":
            raise InferccError(
                f"--backend openvino runs on CPU targets, not {target.name}",
                "give --target cpu (or a CPU row), or use --backend tensorrt",
            )
        hints = candidate_hints(options.precision, target)
        race = _Race(Path(model), shapes, options, hints)
        choice = race.choose(cache)
        config = _config(race, choice, options.precision)
        (Path(out_dir) / BLOB_FILE).write_bytes(choice.pop("blob"))
        (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return _section(config)

    def load(self, artifact: Artifact) -> Runner:
        engine.require()
        return OpenVinoRunner.from_artifact(artifact.path, artifact.model_path)


# --------------------------------------------------------------------------- the race


class _Race:
    """The configurations of one build, each compiled, checked against onnxruntime on the
    same model and (when more than one validates) timed interleaved; the fastest is kept."""

    def __init__(
        self, model: Path, shapes: Sequence[ShapeProfile], options: CompileOptions, hints: list
    ):
        self.model, self.options, self.hints = model, options, hints
        self.proto = read_model(model)[0]
        pins = {p.name: p.opt for p in shapes}
        self.shapes = resolve_shapes(self.proto, pins)
        self.threads = engine.host_cores()
        self.outputs = [o.name for o in self.proto.graph.output]

    def choose(self, cache: Any) -> dict[str, Any]:
        key = self._key() if cache is not None and len(self.hints) > 1 else None
        cached = cache.get(key) if key is not None else None
        hints = self.hints
        status = "single" if len(hints) == 1 else "miss"
        if isinstance(cached, dict) and cached.get("hint") in hints:
            hints, status = [cached["hint"]], "hit"
            self._step("openvino: cached choice reused")
        elif len(hints) > 1 and not self.options.tune:
            hints, status = hints[:1], "untuned"
        started = time.perf_counter()
        records = [self._compile(hint) for hint in hints]
        if status == "miss":
            self._time(records)
        good = [r for r in records if r.get("skipped") is None]
        if not good:
            reasons = "; ".join(f"{r['hint']}: {r['skipped']}" for r in records)
            raise ValidationError(
                f"no OpenVINO {self.options.precision} configuration matches onnxruntime on "
                f"the optimized model: {reasons}; nothing written",
                "calibrate again with a higher --min-cosine, or build with --backend ort",
            )
        best = min(good, key=lambda r: r.get("median_ms") or 0.0)
        if key is not None and status == "miss":
            kept = {"hint": best["hint"], "median_ms": best.get("median_ms")}
            cache.put(key, kept, tuning_seconds=time.perf_counter() - started)
        best = dict(best)
        best["cache"] = status
        best["candidates"] = [
            {k: v for k, v in r.items() if k not in ("blob", "session")} for r in records
        ]
        best.pop("session", None)
        return best

    def _key(self) -> Any:
        from infercc.runtime.tuning import (
            CacheKey,
            file_sha256,
            fingerprint_hash,
            host_fingerprint,
        )

        return CacheKey(
            model_hash=file_sha256(self.model),
            shapes=CacheKey.canonical_shapes(self.shapes),
            backend="openvino",
            backend_version=engine.full_version(),
            provider=f"{engine.DEVICE}:{self.options.precision}:{','.join(self.hints)}",
            fingerprint=fingerprint_hash(host_fingerprint()),
        )

    def _step(self, message: str) -> None:
        log.info(message)
        if self.options.on_step is not None:
            self.options.on_step(message)

    def _compile(self, hint: str) -> dict[str, Any]:
        self._step(f"openvino: compiling with inference precision {hint}")
        props = engine.properties(hint, self.threads)
        record: dict[str, Any] = {"hint": hint, "properties": props}
        started = time.perf_counter()
        compiled = engine.compile_model(engine.read(self.model, "the optimized model"), props)
        record["compile_seconds"] = round(time.perf_counter() - started, 3)
        record["hint_used"] = engine.hint_used(compiled)
        record["used"] = engine.used_precisions(compiled)
        record["blob"] = engine.export_blob(compiled)
        session = engine.Session(compiled, self.outputs)
        # a race keeps only what agrees with onnxruntime; one configuration is judged by the
        # artifact's validation against the original (`infercc.api`)
        racing = self.options.validate and len(self.hints) > 1
        record["skipped"] = self._mismatch(session) if racing else None
        record["session"] = session
        return record

    def _mismatch(self, session: engine.Session) -> str | None:
        """What differs between OpenVINO and onnxruntime on the same model and random feeds
        (None: they agree within the build precision's tolerance)."""
        feeds = make_inputs(self.proto, self.shapes, seed=self.options.seed)
        expected = compare.run_model(self.model, [feeds], role="the optimized model")[0]
        try:
            actual = dict(zip(self.outputs, session.run(feeds), strict=True))
        except Exception as exc:  # openvino raises RuntimeError
            return f"failed to run: {str(exc).splitlines()[0][:200]}"
        o = self.options
        tol = tolerance(o.precision, o.atol, o.rtol, o.min_cosine)
        report = compare.compare_outputs([expected], [actual], *tol.as_tuple())
        if report.passed:
            return None
        return f"outputs differ from onnxruntime's: {report.failure_reason()}"

    def _time(self, records: list[dict[str, Any]]) -> None:
        good = [r for r in records if r.get("skipped") is None]
        if len(good) < 2:
            return
        self._step(f"openvino: timing {len(good)} configurations")
        feeds = make_inputs(self.proto, self.shapes, seed=self.options.seed)
        runs = [_bound(r["session"], feeds) for r in good]
        timed = timing.interleave(runs, max(1, self.options.warmup), max(3, self.options.iters))
        for record, row in zip(good, timed.ms, strict=True):
            record["median_ms"] = round(float(np.median(row)), 4)


def _bound(session: engine.Session, feeds: Feeds) -> Any:
    return lambda: session.run(feeds)


def _config(race: _Race, choice: Mapping[str, Any], precision: str) -> dict[str, Any]:
    from infercc.runtime.tuning import fingerprint_hash, host_fingerprint

    used = choice["used"]
    ran = engine.dominant(used)
    _check_ran(precision, ran, used, choice["hint"])
    return {
        "schema": SCHEMA,
        "openvino": engine.full_version(),
        "device": engine.DEVICE,
        "cpu_class": host_class(),
        "capabilities": list(engine.capabilities()),
        "fingerprint": fingerprint_hash(host_fingerprint()),
        "precision": precision,
        "hint": choice["hint"],
        "hint_used": choice["hint_used"],
        "precision_used": ran,
        "layers": used,
        "properties": choice["properties"],
        "shapes": {k: list(v) for k, v in race.shapes.items()},
        "blob": BLOB_FILE,
        "compile_seconds": choice["compile_seconds"],
        "median_ms": choice.get("median_ms"),
        "cache": choice["cache"],
        "candidates": choice["candidates"],
    }


def _check_ran(precision: str, ran: str | None, used: Mapping[str, int], hint: str) -> None:
    """A build that asked for bf16 or int8 and whose compute layers ran in something else is
    no such build: say so rather than label it."""
    if ran is None or precision == "fp32" or ran == precision:
        if precision == "fp32" and ran not in (None, "fp32"):
            raise InternalError(
                f"OpenVINO ran {ran} layers in an fp32 build ({_layers(used)})",
                "report it with the model",
            )
        return
    what = {"bf16": "bfloat16", "int8": "int8"}[precision]
    raise InternalError(
        f"OpenVINO compiled no layer in {what} (compute layers ran {_layers(used)}, "
        f"inference precision {hint})",
        "check `infercc targets` for this CPU's row; build fp32 otherwise",
    )


def _layers(used: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {p}" for p, n in used.items()) or "none"


def _section(config: Mapping[str, Any]) -> dict[str, Any]:
    keys = (
        "device",
        "cpu_class",
        "precision",
        "hint",
        "precision_used",
        "layers",
        "median_ms",
        "cache",
    )
    return {
        "name": "openvino",
        "version": engine.version(),
        "files": [CONFIG_FILE, BLOB_FILE],
        **{k: config[k] for k in keys},
    }


# --------------------------------------------------------------------------- loading


def read_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise InferccError(
            f"{directory} has no {CONFIG_FILE}: it was not built by the openvino backend",
            "rebuild it with `infercc optimize MODEL -o DIR --backend openvino`",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InferccError(f"cannot read {path}: {exc}", "rebuild the artifact") from exc
    if not isinstance(config, dict) or config.get("schema") != SCHEMA:
        raise InferccError(
            f"{path} is not of schema {SCHEMA!r}",
            "rebuild the artifact with this version of infercc",
        )
    return config


class OpenVinoRunner:
    """Runs an openvino artifact: its blob where this host and OpenVINO made it, else the
    model compiled again with the recorded properties; `precision_used` is read back."""

    def __init__(self, model: Path, props: Mapping[str, Any], blob: bytes | None = None):
        proto = read_model(Path(model))[0]
        self.input_names: Sequence[str] = [vi.name for vi in real_inputs(proto)]
        self.output_names: Sequence[str] = [str(o.name) for o in proto.graph.output]
        self.source = "blob" if blob is not None else "model"
        compiled = (
            engine.import_blob(blob, props)
            if blob is not None
            else engine.compile_model(engine.read(model, f"{model}"), props)
        )
        self.layers = engine.used_precisions(compiled)
        self.precision_used = engine.dominant(self.layers)
        self._session = engine.Session(compiled, self.output_names)

    @classmethod
    def from_artifact(cls, directory: Path, model: Path) -> OpenVinoRunner:
        from infercc.runtime.tuning import fingerprint_hash, host_fingerprint

        config = read_config(directory)
        props = dict(config["properties"])
        props["INFERENCE_NUM_THREADS"] = engine.host_cores()
        blob_path = Path(directory) / str(config.get("blob", BLOB_FILE))
        same = config.get("openvino") == engine.full_version() and config.get(
            "fingerprint"
        ) == fingerprint_hash(host_fingerprint())
        blob = blob_path.read_bytes() if same and blob_path.is_file() else None
        if blob is None:
            log.info("%s was made on another host or OpenVINO: compiling model.onnx", BLOB_FILE)
        runner = cls(model, props, blob)
        recorded = config.get("precision_used")
        if recorded and runner.precision_used != recorded:
            log.warning(
                "this artifact ran %s where it was built; here OpenVINO runs %s (%s)",
                recorded,
                runner.precision_used,
                _layers(runner.layers),
            )
        return runner

    def run(self, feeds: Feeds) -> list[np.ndarray]:
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise InferccError(
                f"no value for model input(s) {', '.join(map(repr, missing))}",
                "feed every input the model declares",
            )
        try:
            return self._session.run(feeds)
        except Exception as exc:  # openvino raises RuntimeError
            raise InferccError(
                f"OpenVINO failed to run the model: {str(exc).splitlines()[0][:300]}",
                "check the input shapes (--shape) and the batch size (--batch)",
            ) from exc
