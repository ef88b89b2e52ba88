"""Whose code a finding comes from: the source frame behind an op, and who can change it.

    >>> from portkit.core import owners
    >>> where = owners.caller()          # innermost frame outside torch, portkit and the stdlib
    >>> owners.owner(where)["owner"]     # "user", "configurable library", "library" or "portkit"
    'user'
    >>> owners.owner({"file": ".../site-packages/transformers/masking_utils.py", "line": 354})["setting"]
    'attn_implementation'

A frame is the user's code when its file is outside the installed packages and the standard library
(the model's own file, a `file.py:factory` or a project on the path), in the module or package of the
model's factory wherever it is installed (claim). A frame in portkit's model wrappers (portkit/models/:
registry.py, adapters.py and audio.py, which call the model as the user's code would) is portkit's, never the
user's. A frame in an installed package is a library's: "configurable" where the library has a setting that
changes the path (SETTINGS names it), otherwise one the user cannot change, whose advice is an upgrade, a
setting or a wrapper, never "rewrite this line". A foundation: it imports no other portkit module.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig

from portkit.core.locations import PACKAGE

USER, CONFIGURABLE, LIBRARY, PORTKIT = "user", "configurable library", "library", "portkit"
OWNERS = (USER, CONFIGURABLE, LIBRARY, PORTKIT)

_PORTKIT = str(PACKAGE)
# portkit's model wrappers (the sources and their adapters): where a finding's line may be, portkit's own code
_WRAPPERS = tuple(os.path.join(_PORTKIT, "models", name) for name in ("registry.py", "adapters.py", "audio.py"))
# portkit's decoding loop (greedy generation with a KV cache) stands in for a serving stack's: its ops
# (argmax, the cache's position bookkeeping) belong to the serving loop, not to the model or the user
_SERVING = tuple(os.path.join(_PORTKIT, "workloads", name) for name in ("generation.py", "encoder_decoder.py"))
SERVING_LOOP = ("serving loop (portkit/workloads/generation.py's and encoder_decoder.py's greedy decoding, standing in "
                "for the serving stack's)")
_TORCH = os.path.join(os.path.dirname(_PORTKIT), "torch")   # replaced below by the installed torch
_INSTALLED = ("site-packages", "dist-packages")
_STDLIB = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])})

# (package, file suffix) -> the setting that changes the code path there, and what to do with it.
# From the libraries' own documentation: transformers "Attention interface" (attn_implementation),
# "Caching" (cache_implementation / the cache class).
SETTINGS = {
    ("transformers", "masking_utils.py"): (
        "attn_implementation", "transformers builds the attention mask for the attention_implementation "
        "chosen at from_pretrained(..., attn_implementation=...): 'sdpa' (default), 'eager', 'flex_attention'"),
    ("transformers", "integrations/sdpa_attention.py"): (
        "attn_implementation", "from_pretrained(..., attn_implementation='eager' | 'sdpa' | 'flex_attention') "
        "picks the attention kernel"),
    ("transformers", "cache_utils.py"): (
        "cache_implementation", "generate(..., cache_implementation='static') or a StaticCache keeps the "
        "cache at one shape"),
    ("transformers", "generation/utils.py"): (
        "generation_config", "GenerationConfig flags (cache_implementation, compile_config) change this path"),
    # transformers' "Experts interface": a mixture-of-experts layer runs its experts by the experts_implementation
    # chosen at load (transformers/integrations/moe.py's ExpertsInterface dispatches on it)
    ("transformers", "integrations/moe.py"): (
        "experts_implementation", "from_pretrained(..., experts_implementation='eager' | 'batched_mm' | "
        "'grouped_mm') picks how a mixture-of-experts layer runs its experts"),
}


_USER_ROOTS: set[str] = set()   # files and package folders claimed as the user's code (claim)


def claim(path: str) -> None:
    """Count the file or the package folder `path` as the user's code wherever it is installed: the
    model factory's own module or package (portkit.models.registry does it when it loads a factory)."""
    _USER_ROOTS.add(os.path.abspath(path))


def _claimed(path: str) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in _USER_ROOTS)


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(os.path.abspath(torch.__file__)) if torch is not None else _TORCH


@functools.lru_cache(maxsize=4096)   # per file: the recorder asks for every new op of every module
def _skipped(file: str, torch_dir: str) -> bool:
    """Machinery, not a place a finding belongs to: torch, portkit (but its model wrappers and its decoding
    loop), the stdlib."""
    if file.startswith("<"):
        return True
    path = os.path.abspath(file)
    if path.startswith(torch_dir + os.sep) or (path.startswith(_PORTKIT + os.sep)
                                               and path not in _WRAPPERS and path not in _SERVING):
        return True
    return _in_stdlib(path)


def _in_stdlib(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(p + os.sep) for p in _STDLIB) and not any(s in real.split(os.sep) for s in _INSTALLED)


def place(file: str, line: int, function: str, code: str = "") -> dict:
    """A frame as results store it, with a short text (installed-package paths shortened)."""
    code = (code or "").strip()
    text = f"{file.split('site-packages/', 1)[-1]}:{line} in {function}" + (f": {code}" if code else "")
    return {"file": file, "line": line, "function": function, "code": code, "text": text}


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def from_trace(stack_trace: str | None) -> list[dict]:
    """The frames of a formatted stack trace (an FX node's meta["stack_trace"]), outermost first."""
    lines = (stack_trace or "").rstrip().splitlines()
    found = []
    for i, text in enumerate(lines):
        if hit := _FRAME.search(text):
            code = lines[i + 1] if i + 1 < len(lines) and not _FRAME.search(lines[i + 1]) else ""
            found.append(place(hit.group(1), int(hit.group(2)), hit.group(3), code))
    return found


def innermost(stack: list[dict]) -> dict | None:
    """The innermost frame that is not torch, portkit or the stdlib (what caller() names), with its
    "line_key" ("file:line") for matching one frame against another."""
    torch_dir = _torch_dir()
    where = next((f for f in reversed(stack) if not _skipped(f["file"], torch_dir)), None)
    return {**where, "line_key": line_key(where)} if where else None


def frames_of(exc: BaseException) -> list[dict]:
    """The frames of an exception's traceback, outermost first, as place() stores them."""
    import traceback
    return [place(f.filename, f.lineno, f.name, f.line or "") for f in traceback.extract_tb(exc.__traceback__)]


def raised_at(exc: BaseException) -> dict | None:
    """Where an exception was raised in the model's or a library's code: innermost() of its traceback, without the
    line_key results do not store; None where every frame is torch's, portkit's or the stdlib's."""
    where = innermost(frames_of(exc))
    return {k: v for k, v in where.items() if k != "line_key"} if where else None


def one_line(exc: BaseException, limit: int = 240) -> str:
    """An exception as a result quotes it: its type and the first line of its message, at most `limit` characters."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:limit]}"


def line_key(where: dict | None) -> str | None:
    return f"{os.path.abspath(where['file'])}:{where['line']}" if where and where.get("file") else None


def caller(depth: int = 1) -> dict | None:
    """The innermost frame of the current Python stack that is not torch, portkit or the stdlib."""
    import linecache
    torch_dir = _torch_dir()
    frame = sys._getframe(depth)
    while frame is not None:
        file = frame.f_code.co_filename
        if not _skipped(file, torch_dir):
            line = frame.f_lineno
            return place(file, line, frame.f_code.co_name, linecache.getline(file, line))
        frame = frame.f_back
    return None


def package(file: str) -> str | None:
    """The installed package a file belongs to (the folder below site-packages), or None."""
    parts = os.path.abspath(file).split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in _INSTALLED:
            name = parts[i + 1]
            return name[:-3] if name.endswith(".py") else name
    return None


def owner(where: dict | None) -> dict:
    """Whose code `where` is: {"owner", "package", "setting", "setting_help"}; "unknown" without a frame."""
    if not where or not where.get("file"):
        return {"owner": "unknown", "package": None, "setting": None, "setting_help": None}
    file = os.path.abspath(where["file"])
    if _claimed(file):
        return {"owner": USER, "package": package(file), "setting": None, "setting_help": None}
    if file in _SERVING:
        return {"owner": LIBRARY, "package": SERVING_LOOP, "setting": None, "setting_help": None}
    if file.startswith(_PORTKIT + os.sep):   # its model wrappers (adapters.py, ...) or any other of its files
        return {"owner": PORTKIT, "package": f"portkit ({os.path.relpath(file, os.path.dirname(_PORTKIT))})",
                "setting": None, "setting_help": None}
    name = package(file) or ("python (stdlib)" if _in_stdlib(file) else None)
    if name is None:
        return {"owner": USER, "package": None, "setting": None, "setting_help": None}
    posix = file.replace(os.sep, "/")
    for (pkg, suffix), (setting, help_text) in SETTINGS.items():
        if pkg == name and posix.endswith("/" + suffix):
            return {"owner": CONFIGURABLE, "package": name, "setting": setting, "setting_help": help_text}
    return {"owner": LIBRARY, "package": name, "setting": None, "setting_help": None}


def graph_contents(calls, op_dtypes: dict | None, limit: int = 3) -> dict[str, dict]:
    """Per ATen op of one graph: calls, input dtypes, up to `limit` source frames (for portkit/stages/reconcile.py).
    calls: (op, node stack trace) -> count; op_dtypes: op -> the input dtypes seen, or None."""
    found: dict[str, dict] = {}
    for (op, trace), count in calls.items():
        dtypes = sorted(str(d).replace("torch.", "") for d in (op_dtypes or {}).get(op, ()))
        entry = found.setdefault(op, {"calls": 0, "dtypes": dtypes, "where": [], "lines": []})
        entry["calls"] += count
        if (where := innermost(from_trace(trace))) and where["line_key"] not in entry["lines"]:
            entry["lines"].append(where["line_key"])   # every line, outside torch, that makes the op
            if len(entry["where"]) < limit:
                entry["where"].append(where)
    return found
