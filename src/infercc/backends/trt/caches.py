"""The two TensorRT caches in infercc's cache directory: timing caches and built engines.

```
<cache>/trt/timing/<fingerprint digest>.cache   serialized ITimingCache
<cache>/trt/timing/<fingerprint digest>.json    the fingerprint it belongs to (for people)
<cache>/trt/engines/<key digest>.plan           serialized engines
<cache>/tuning.sqlite                           the engine index (runtime.tuning.TuningCache)
```

Timing cache. Tactic timings hold for one (TensorRT version, GPU, compute capability, CUDA
version) only, so each such fingerprint has its own file and caches are never mixed: the file
is loaded into the builder config before the build (`create_timing_cache(bytes)` then
`set_timing_cache(cache, ignore_mismatch=False)`, so TensorRT itself also refuses a foreign
cache: it returns False) and the config's cache (`get_timing_cache().serialize()`, an
IHostMemory), now holding the build's new timings, is serialized back after it. A file
TensorRT cannot read or refuses is replaced after a warning. With `strict` (CI builds that must
be reproducible) a missing or unreadable file is an error before anything is built.

Engine cache. A built engine is stored under the digest of (model sha256, resolved profiles,
precision, builder options with plugin and calibration-cache hashes, full fingerprint) in the
tuning cache's SQLite index (`CacheKey`: model_hash, shapes = the profiles' JSON, backend =
"tensorrt", backend_version = TensorRT's version, provider = the options' JSON, fingerprint =
the fingerprint digest); the value names the plan file and its sha256. A second identical build
is a hit and builds nothing. A plan file that is missing or whose hash differs is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infercc.backends.trt.fingerprint import Fingerprint
from infercc.errors import InferccError
from infercc.outputs import umask_mode

log = logging.getLogger(__name__)

TIMING_DIR = Path("trt") / "timing"
ENGINE_DIR = Path("trt") / "engines"


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())  # mkstemp's 0600: the user's umask instead
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def host_bytes(buffer: Any) -> bytes:
    """bytes of an IHostMemory (buffer protocol), or of bytes themselves."""
    return bytes(memoryview(buffer))


# --------------------------------------------------------------------------- timing cache


class TimingCacheFile:
    """The timing cache file of one fingerprint under `cache_dir`."""

    def __init__(self, cache_dir: Path, fingerprint: Fingerprint):
        self.fingerprint = fingerprint
        digest = fingerprint.timing_digest()
        self.path = Path(cache_dir) / TIMING_DIR / f"{digest}.cache"
        self.info_path = self.path.with_suffix(".json")

    def describe(self) -> str:
        fp = self.fingerprint
        return (
            f"TensorRT {fp.tensorrt} on {fp.gpu} (compute capability "
            f"{fp.compute_capability}) with CUDA {fp.cuda}"
        )

    def load_into(self, config: Any, strict: bool = False) -> str:
        """Give `config` this fingerprint's timing cache; returns "hit", "miss" or "unreadable"."""
        data = self._read(strict)
        status = "miss" if data is None else "hit"
        why = ""
        try:
            cache = config.create_timing_cache(data or b"")
        except Exception as exc:  # TensorRT raises its own types for a bad cache
            cache, why = None, str(exc)
        # set_timing_cache returns False when TensorRT refuses the cache (a header of another
        # TensorRT or device, with ignore_mismatch False); create_timing_cache may give None.
        if cache is None or not config.set_timing_cache(cache, False):
            why = why or "TensorRT refused it (another TensorRT version or device?)"
            if strict:
                raise InferccError(
                    f"TensorRT cannot read the timing cache {self.path}: {why}",
                    "delete it and build once without --timing-cache-strict",
                )
            log.warning("timing cache %s unreadable (%s): starting an empty one", self.path, why)
            config.set_timing_cache(config.create_timing_cache(b""), False)
            status = "unreadable"
        log.info("timing cache for %s: %s (%s)", self.describe(), status, self.path)
        return status

    def _read(self, strict: bool) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            if strict:
                raise InferccError(
                    f"--timing-cache-strict: no timing cache for {self.describe()} "
                    f"(looked for {self.path})",
                    "build once without --timing-cache-strict on a machine with this "
                    "fingerprint, or copy its cache file here",
                ) from None
            return None
        except OSError as exc:
            if strict:
                raise InferccError(f"cannot read timing cache {self.path}: {exc}") from exc
            log.warning("cannot read timing cache %s: %s", self.path, exc)
            return None

    def save_from(self, config: Any) -> int:
        """Serialize the config's timing cache to the file; returns its size in bytes."""
        data = host_bytes(config.get_timing_cache().serialize())
        try:
            write_atomic(self.path, data)
            info = json.dumps(self.fingerprint.timing_key(), indent=1) + "\n"
            write_atomic(self.info_path, info.encode())
        except OSError as exc:
            log.warning("could not save timing cache %s: %s", self.path, exc)
        return len(data)


# --------------------------------------------------------------------------- engine cache


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def engine_key(
    model_hash: str,
    profiles: Sequence[Mapping[str, Any]],
    precision: str,
    options: Mapping[str, Any],
    fingerprint: Fingerprint,
) -> Any:
    """The CacheKey of an engine (see the module doc)."""
    from infercc.runtime.tuning import CacheKey

    return CacheKey(
        model_hash=model_hash,
        shapes=canonical(list(profiles)),
        backend="tensorrt",
        backend_version=fingerprint.tensorrt,
        provider=canonical({"precision": precision, **options}),
        fingerprint=fingerprint.digest(),
    )


class EngineCache:
    """Built engines by key: plan files under `<cache>/trt/engines`, indexed in `index` (a
    `TuningCache`)."""

    def __init__(self, index: Any):
        self.index = index
        self.directory = Path(index.directory) / ENGINE_DIR

    def get(self, key: Any) -> tuple[bytes, dict[str, Any]] | None:
        """(plan bytes, stored info) or None on a miss."""
        value = self.index.get(key)
        if not isinstance(value, dict) or not isinstance(value.get("plan"), str):
            return None
        path = self.directory / value["plan"]
        try:
            data = path.read_bytes()
        except OSError:
            log.info("engine cache: %s is gone, rebuilding", path)
            return None
        if hashlib.sha256(data).hexdigest() != value.get("sha256"):
            log.warning("engine cache: %s does not match its recorded hash, rebuilding", path)
            return None
        return data, dict(value.get("info") or {})

    def put(self, key: Any, plan: bytes, info: Mapping[str, Any], seconds: float) -> Path | None:
        name = f"{key.digest()}.plan"
        path = self.directory / name
        try:
            write_atomic(path, plan)
        except OSError as exc:
            log.warning("engine cache: cannot write %s: %s", path, exc)
            return None
        value = {"plan": name, "sha256": hashlib.sha256(plan).hexdigest(), "info": dict(info)}
        self.index.put(key, value, tuning_seconds=seconds)
        return path
