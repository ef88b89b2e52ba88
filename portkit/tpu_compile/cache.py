"""portkit's on-disk cache of XLA TPU compile verdicts: a rerun, or a later stage, never compiles a shape twice.

JAX's persistent compilation cache cannot serve compile-only executables (reading an entry back needs a
PjRt client with devices), so portkit keeps the verdict itself: compiled or refused, the compile seconds as
measured, HBM per device, FLOPs and bytes accessed. That is all a report needs.

    >>> from portkit.tpu_compile import cache
    >>> key = cache.verdict_key(lowered.as_text(), {"topology": "v5e:1x1", "versions": {...}})
    >>> cache.load(key)               # a Verdict, or None (absent, or damaged: compile again)
    >>> cache.store(key, verdict)      # one JSON file per key, written atomically

The key is the SHA-256 of the lowered StableHLO text with everything else that decides the compiler's
answer (jax/jaxlib/libtpu versions, topology, dtype, XLA_FLAGS, LIBTPU_INIT_ARGS, compile options: built by
portkit.tpu_compile.compiler). The folder is `xla-verdicts` under portkit.corpora.corpus.cache_root ($PORTKIT_CACHE_DIR,
else $XDG_CACHE_HOME/portkit, else ~/.cache/portkit); deleting it only costs recompiles. `program_key` lets a
rerun skip even the lowering: it keys a shape by what decides its lowered module (the model's classes and
their source files' SHA-256, parameter names, shapes and dtypes, config, input shapes, the check, the
versions and portkit's lowering code), and its entry (`xla-programs`) names the verdict key. A model whose
classes have no readable source file (a notebook cell) has no program key and is lowered every time.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from portkit.corpora import corpus
from portkit.core.atomic_io import read_json, write_json

FOLDER = "xla-verdicts"
PROGRAMS = "xla-programs"   # program key -> the verdict key its lowering gave (and the lowering's figures)
# Distributions whose code decides the lowered module beside the model's own source files.
LOWERING_PACKAGES = ("torch", "transformers", "torchax", "jax", "jaxlib", "libtpu")
FORMAT = 1              # bump when the entry layout or the meaning of a field changes: old entries then miss
# Compiler refusals that are a property of the program, so a rerun gets the same answer: out of HBM
# (RESOURCE_EXHAUSTED ... CompileTimeHbmOom), an invalid or unimplemented program. Anything else
# (INTERNAL, UNKNOWN, a crash) may not repeat, so it is reported but never cached.
REPEATABLE_REFUSALS = ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "UNIMPLEMENTED")
STATUSES = ("compiled", "out_of_hbm", "compile_failed")


def cache_dir() -> Path:
    """The folder of the verdict cache (under portkit's cache root; $PORTKIT_CACHE_DIR moves it)."""
    return corpus.cache_root() / FOLDER


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


# ---------------------------------------------------------------- program keys: a hit needs no lowering
@functools.cache
def _file_sha256(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def source_digest(cls) -> str | None:
    """SHA-256 of the file that defines `cls`, or None when it has none readable (a notebook cell)."""
    try:
        path = inspect.getsourcefile(cls)
        stat = os.stat(path)
        return _file_sha256(path, stat.st_mtime_ns, stat.st_size)
    except (TypeError, OSError):
        return None


def module_fingerprint(module) -> dict | None:
    """What decides a module's lowered program besides the input shapes, read without tracing it: its
    classes (torch's own are covered by the torch version) and their source files' SHA-256, parameter and
    buffer names, shapes and dtypes, train/eval mode and every config its submodules hold. None when a
    class has no source file."""
    classes, sources = set(), {}
    for sub in module.modules():
        cls = type(sub)
        classes.add(f"{cls.__module__}.{cls.__qualname__}")
        if cls.__module__.split(".")[0] == "torch":
            continue
        digest = source_digest(cls)
        if digest is None:
            return None
        sources[cls.__module__] = digest
    tensors = [[n, list(t.shape), str(t.dtype)] for n, t in (*module.named_parameters(), *module.named_buffers())]
    configs = {}       # every distinct config a submodule holds (a wrapper holds none, its model does)
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and id(config) not in configs:
            try:
                text = config.to_json_string() if hasattr(config, "to_json_string") else repr(config)
            except (TypeError, ValueError):
                text = repr(config)
            # the attention implementation is private, so left out of the config's JSON
            configs[id(config)] = [text, str(getattr(config, "_attn_implementation", None))]
    return {"classes": sorted(classes), "sources": sources, "tensors": tensors, "training": module.training,
            "configs": list(configs.values())}


def program_key(module, inputs: dict, check: str, context: dict) -> str | None:
    """A key for one shape's check that needs no lowering, or None (module_fingerprint could not read
    a class's source). inputs: {name: [shape, dtype]} as checked; check: "compile" or "lowering";
    context: the rest (topology, dtype, flags, the digest of the code that lowers) as a JSON-able dict."""
    fingerprint = module_fingerprint(module)
    if fingerprint is None:
        return None
    from portkit.core import availability
    material = {"format": FORMAT, "check": check, "inputs": inputs, "context": context, "model": fingerprint,
                "versions": {p: availability.package_version(p) for p in LOWERING_PACKAGES}}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def programs_dir() -> Path:
    """The folder of program entries (beside the verdicts, under portkit's cache root)."""
    return corpus.cache_root() / PROGRAMS


def _program_path(key: str) -> Path:
    return programs_dir() / f"{key}.json"


def load_program(key: str | None) -> dict | None:
    """The program entry for `key` (a dict of what store_program was given), or None: absent, damaged."""
    if key is None:
        return None
    try:
        entry = read_json(_program_path(key))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if isinstance(entry, dict) and entry.get("key") == key and entry.get("format") == FORMAT \
            and isinstance(entry.get("program"), dict):
        return entry["program"]
    return None


def store_program(key: str | None, program: dict) -> Path | None:
    """Write a program entry (atomically); None when there is no key or the folder is not writable."""
    if key is None:
        return None
    try:
        return write_json(_program_path(key), {"format": FORMAT, "key": key, "program": program})
    except OSError:
        return None
