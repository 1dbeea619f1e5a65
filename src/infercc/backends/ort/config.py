"""Session configurations, the knobs the tuner sweeps, and sessions built from them."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infercc.errors import InferccError
from infercc.runtime import timing
from infercc.runtime.artifact import Feeds
from infercc.util import first_line

try:
    import onnxruntime as ort
except ImportError:  # the core dependency, but a broken install must give a reason
    ort = None


log = logging.getLogger(__name__)


SCHEMA = "infercc.ort_config/1"
CONFIG_FILE = "ort_config.json"
OPTIMIZED_FILE = "ort_optimized.onnx"

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
GPU_INSTALL_HINT = 'pip install "infercc[gpu]"'

LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
REFERENCE_LEVEL = "ORT_DISABLE_ALL"
CUDNN_SEARCH = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
EXTERNAL_DATA_LIMIT = 2 * 1024**3
POINT_NAMES = ("min", "opt", "max")

DEFAULT_SESSION_OPTIONS = {
    "graph_optimization_level": "ORT_ENABLE_ALL",
    "intra_op_num_threads": 0,
    "inter_op_num_threads": 0,
    "execution_mode": "ORT_SEQUENTIAL",
}
_TUNABLE_OFF = {"tunable_op_enable": "0", "tunable_op_tuning_enable": "0"}
_TUNABLE_ON = {"tunable_op_enable": "1", "tunable_op_tuning_enable": "1"}
# Provider options each provider starts from: onnxruntime's defaults, spelled out so that a
# knob value equal to the default is recognised as already measured.
_PROVIDER_DEFAULTS: dict[str, dict[str, str]] = {
    CPU: {},
    CUDA: {"cudnn_conv_algo_search": "EXHAUSTIVE", **_TUNABLE_OFF},
    TENSORRT: {},
}
_FALLBACKS = {TENSORRT: [CUDA, CPU], CUDA: [CPU], CPU: []}
# onnxruntime graph fusions the tuner may turn off (`InferenceSession(disabled_optimizers=)`),
# in sweep order: each value is tried on the best configuration so far. onnxruntime 1.32's CPU
# SkipLayerNormalization kernel is slower than the Add + Add + LayerNormalization it fuses, and
# its session optimizer makes it by itself.
DISABLED_OPTIMIZERS: tuple[tuple[str, ...], ...] = ((), ("SkipLayerNormFusion",))


# --------------------------------------------------------------------------- configurations


def default_config(provider: str = CPU) -> dict[str, Any]:
    """onnxruntime's default configuration on `provider`."""
    return {
        "provider": provider,
        "provider_options": dict(_PROVIDER_DEFAULTS.get(provider, {})),
        "session_options": dict(DEFAULT_SESSION_OPTIONS),
        "disabled_optimizers": [],
    }


def reference_config() -> dict[str, Any]:
    """What candidates are validated against: CPU provider, graph optimizations off."""
    config = default_config(CPU)
    config["session_options"]["graph_optimization_level"] = REFERENCE_LEVEL
    return config


def session_options(config: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """onnxruntime SessionOptions and the providers list for a configuration dict."""
    _require_ort()
    from infercc.runtime.ort_support import register_custom_ops  # imports onnxruntime

    opts = register_custom_ops(ort.SessionOptions())
    settings = {**DEFAULT_SESSION_OPTIONS, **config.get("session_options", {})}
    level = settings["graph_optimization_level"]
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.intra_op_num_threads = int(settings["intra_op_num_threads"])
    opts.inter_op_num_threads = int(settings["inter_op_num_threads"])
    opts.execution_mode = getattr(ort.ExecutionMode, settings["execution_mode"])
    opts.log_severity_level = 3
    for key, value in config.get("session_config", {}).items():
        opts.add_session_config_entry(key, str(value))
    if config.get("profile_prefix"):  # bench --ort-profile: onnxruntime's per-node profile
        opts.enable_profiling = True
        opts.profile_file_prefix = str(config["profile_prefix"])
    return opts, _providers(config)


def _providers(config: Mapping[str, Any]) -> list[Any]:
    provider = config.get("provider", CPU)
    options = {k: str(v) for k, v in config.get("provider_options", {}).items()}
    first = (provider, options) if options else provider
    return [first, *_FALLBACKS.get(provider, [CPU])]


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration's identity (its canonical JSON)."""
    return json.dumps(config, sort_keys=True)


def _config_only(record: Mapping[str, Any]) -> dict[str, Any]:
    config = {
        k: copy.deepcopy(record[k]) for k in ("provider", "provider_options", "session_options")
    }
    config["disabled_optimizers"] = disabled_optimizers(record)
    return config


def disabled_optimizers(config: Mapping[str, Any]) -> list[str]:
    """The onnxruntime optimizers a configuration turns off (none when it does not say)."""
    return [str(name) for name in config.get("disabled_optimizers") or []]


# --------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class Knob:
    """One setting coordinate descent sweeps: each value is a patch of dotted paths."""

    name: str
    values: tuple[dict[str, Any], ...]
    provider: str | None = None  # the knob applies only to configurations on this provider

    def applies(self, config: Mapping[str, Any]) -> bool:
        return self.provider is None or config.get("provider") == self.provider


def apply_patch(config: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` with each dotted path of `patch` set to its value."""
    out = copy.deepcopy(dict(config))
    for path, value in patch.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return out


def thread_counts(cores: int) -> list[int]:
    """Intra-op thread counts to try: 1, half the cores, all cores, 0 (default), deduplicated."""
    return list(dict.fromkeys([1, max(1, cores // 2), max(1, cores), 0]))


def knobs(providers: Sequence[str], cores: int) -> list[Knob]:
    """The knobs in sweep order for these candidate providers and core count."""
    found: list[Knob] = []
    if len(providers) > 1:
        found.append(Knob("provider", tuple(_provider_patch(p) for p in providers)))
    if CUDA in providers:
        found += _cuda_knobs()
    found.append(_patch_knob("graph_optimization_level", "session_options.", LEVELS))
    found.append(_disabled_optimizers_knob())
    found.append(_patch_knob("intra_op_num_threads", "session_options.", thread_counts(cores)))
    if cores > 1:
        found.append(_execution_mode_knob(cores))
    return found


def _disabled_optimizers_knob() -> Knob:
    values = tuple({"disabled_optimizers": list(v)} for v in DISABLED_OPTIMIZERS)
    return Knob("disabled_optimizers", values, CPU)


def _provider_patch(provider: str) -> dict[str, Any]:
    return {"provider": provider, "provider_options": dict(_PROVIDER_DEFAULTS.get(provider, {}))}


def _patch_knob(name: str, prefix: str, values: Sequence[Any], provider: str | None = None) -> Knob:
    return Knob(name, tuple({prefix + name: v} for v in values), provider)


def _cuda_knobs() -> list[Knob]:
    search = _patch_knob("cudnn_conv_algo_search", "provider_options.", CUDNN_SEARCH, CUDA)
    tunable = Knob(
        "tunable_op",
        tuple(
            {f"provider_options.{k}": v for k, v in s.items()} for s in (_TUNABLE_OFF, _TUNABLE_ON)
        ),
        CUDA,
    )
    return [search, tunable]


def _execution_mode_knob(cores: int) -> Knob:
    sequential = {
        "session_options.execution_mode": "ORT_SEQUENTIAL",
        "session_options.inter_op_num_threads": 0,
    }
    parallel = {
        "session_options.execution_mode": "ORT_PARALLEL",
        "session_options.inter_op_num_threads": cores,
    }
    return Knob("execution_mode", (sequential, parallel))


def candidate_providers(target_kind: str, available: Sequence[str]) -> list[str]:
    """Providers to consider: CPU for a CPU target; the GPU ones present for a GPU target."""
    if target_kind != "gpu":
        return [CPU] if CPU in available else []
    return [p for p in available if p in GPU_PROVIDERS]


def candidate_configs(providers: Sequence[str], cores: int) -> list[dict[str, Any]]:
    """Every configuration one descent pass could time if no knob changed the best: the
    default, then each knob's values applied to it (deduplicated, in sweep order)."""
    start = default_config(providers[0])
    configs = {config_key(start): start}
    for knob in knobs(providers, cores):
        base = start if knob.applies(start) else default_config(knob.provider or CPU)
        for patch in knob.values:
            config = apply_patch(base, patch)
            configs.setdefault(config_key(config), config)
    return list(configs.values())


def candidate_count(providers: Sequence[str], cores: int) -> int:
    """Configurations one pass times when the provider stays the first one."""
    start = default_config(providers[0])
    return 1 + sum(len(k.values) - 1 for k in knobs(providers, cores) if k.applies(start))


# --------------------------------------------------------------------------- sessions and timing


def _require_ort() -> None:
    if ort is None:
        raise InferccError("onnxruntime is not installed", "pip install onnxruntime")


def _create_session(model: Path, config: Mapping[str, Any], save_to: Path | None = None) -> Any:
    """An InferenceSession for `config`; with `save_to`, onnxruntime writes its optimized graph."""
    opts, providers = session_options(config)
    if save_to is not None:
        opts.optimized_model_filepath = str(save_to)
    # disabled_optimizers only when some are: an onnxruntime stand-in need not know the word
    extra = (
        {"disabled_optimizers": disabled_optimizers(config)}
        if config.get("disabled_optimizers")
        else {}
    )
    return ort.InferenceSession(str(model), opts, providers=providers, **extra)


def _time_runs(session: Any, feeds: Feeds, warmup: int, iters: int) -> tuple[float, list[Any]]:
    """(median latency in ms over `iters` timed runs after `warmup` runs, last outputs)."""
    timed = timing.time_runs(lambda: session.run(None, dict(feeds)), warmup, iters)
    return float(np.median(timed.ms)), timed.last[0]


def _tuning_results(session: Any, config: Mapping[str, Any]) -> list[Any]:
    if config.get("provider_options", {}).get("tunable_op_enable") != "1":
        return []
    try:
        return list(session.get_tuning_results())
    except Exception as exc:  # onnxruntime raises its own exception types
        log.warning("could not read TunableOp results: %s", first_line(exc))
        return []


def _version() -> str:
    return str(ort.__version__) if ort is not None else ""
