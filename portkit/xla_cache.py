"""portkit's on-disk cache of XLA TPU compile verdicts: a rerun, or a later stage, never compiles a shape twice.

JAX's own persistent compilation cache cannot serve compile-only executables: entries are written, but
reading one back needs a PjRt client with devices, which a compile-only topology has not got, so every
run misses. portkit therefore keeps the verdict itself, not the executable: compiled or refused, the
compile seconds as measured, HBM per device, FLOPs and bytes accessed. That is all a report needs.

    >>> from portkit import xla_cache
    >>> key = xla_cache.verdict_key(lowered.as_text(), {"topology": "v5e:1x1", "versions": {...}})
    >>> xla_cache.load(key)           # a Verdict, or None (absent, or damaged: compile again)
    >>> xla_cache.store(key, verdict)  # one JSON file per key, written atomically

The key is the SHA-256 of the lowered StableHLO module (text, which holds every shape, dtype and
sharding) together with whatever else decides the compiler's answer: jax, jaxlib and libtpu versions,
the topology, the dtype, XLA_FLAGS and LIBTPU_INIT_ARGS, and the compile options (portkit.xla_compile
builds that context). Lowering is cheap; the compile is what the cache saves. The folder is
`xla-verdicts` under portkit's cache root (portkit.data.cache_root: $PORTKIT_CACHE_DIR, else
$XDG_CACHE_HOME/portkit, else ~/.cache/portkit). Deleting it only costs recompiles.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from portkit import data
from portkit._io import read_json, write_json

FOLDER = "xla-verdicts"
FORMAT = 1              # bump when the entry layout or the meaning of a field changes: old entries then miss
# Compiler refusals that are a property of the program, so a rerun gets the same answer: out of HBM
# (RESOURCE_EXHAUSTED ... CompileTimeHbmOom), an invalid or unimplemented program. Anything else
# (INTERNAL, UNKNOWN, a crash) may not repeat, so it is reported but never cached.
REPEATABLE_REFUSALS = ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "UNIMPLEMENTED")
STATUSES = ("compiled", "out_of_hbm", "compile_failed")


def cache_dir() -> Path:
    """The folder of the verdict cache (under portkit's cache root; $PORTKIT_CACHE_DIR moves it)."""
    return data.cache_root() / FOLDER


@dataclass(frozen=True)
class Verdict:
    """What the XLA TPU compiler said about one lowered program, as measured when it compiled it."""
    status: str                     # compiled | out_of_hbm | compile_failed
    compile_seconds: float          # the compiler alone, measured at measured_at
    measured_at: str                # UTC, ISO 8601
    platform: str | None = None     # of the executable's devices ("tpu", checked before it is stored)
    memory: dict | None = None      # argument, output, alias, temporary, generated_code, total bytes per device
    flops: float | None = None      # per device
    bytes_accessed: float | None = None
    message: str | None = None      # the compiler's own words when it refused
    collectives: dict | None = None  # all-gather / reduce-scatter / all-reduce / all-to-all counts, compiled HLO

    @property
    def repeatable(self) -> bool:
        """Whether compiling again would give the same answer: only such a verdict is cached."""
        if self.status != "compile_failed":
            return True
        return (self.message or "").startswith(REPEATABLE_REFUSALS)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def verdict_key(module_text: str, context: dict) -> str:
    """SHA-256 over the lowered module and the compile context (a JSON-able dict of what else decides
    the verdict); changing any of them gives another key."""
    material = {"format": FORMAT, "module_sha256": hashlib.sha256(module_text.encode()).hexdigest(),
                "context": context}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


def load(key: str) -> Verdict | None:
    """The cached verdict for `key`, or None when there is none or the entry is damaged (unreadable,
    not this key's, another format, wrong fields): the caller compiles again and store() replaces it."""
    try:
        entry = read_json(_path(key))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not (isinstance(entry, dict) and entry.get("key") == key and entry.get("format") == FORMAT):
        return None
    try:
        verdict = Verdict(**entry["verdict"])
    except (KeyError, TypeError):
        return None
    return verdict if _valid(verdict) else None


def _valid(v: Verdict) -> bool:
    number = (int, float)
    if v.status not in STATUSES or not isinstance(v.compile_seconds, number) or v.compile_seconds < 0:
        return False
    if not isinstance(v.measured_at, str):
        return False
    if v.status == "compiled":
        return (v.platform == "tpu" and isinstance(v.memory, dict) and isinstance(v.memory.get("total"), int)
                and isinstance(v.flops, number) and isinstance(v.bytes_accessed, number))
    return isinstance(v.message, str)


def store(key: str, verdict: Verdict, context: dict) -> Path | None:
    """Write the verdict under `key` (atomically), with the context it was keyed on for whoever reads
    the file. Returns the path, or None when the verdict is not repeatable or the folder is not
    writable (a read-only home only costs a compile next time)."""
    if not verdict.repeatable:
        return None
    try:
        return write_json(_path(key), {"format": FORMAT, "key": key, "context": context,
                                       "verdict": asdict(verdict)})
    except OSError:
        return None
