"""Atomic writes: a reader never sees a half-written result file.

    >>> from portkit.core.atomic_io import write_json
    >>> write_json("/tmp/portkit-example.json", {"ok": True})

A file is built under a hidden partial name in its own folder, then renamed (atomic within one file
system), so a killed process leaves at most a partial name behind, never a half-written result;
`is_partial` recognises those names and `remove_partials` clears them before a rerun.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """Turn results into plain JSON: numpy scalars, sets and paths appear in them, and
    JSON has no NaN or Infinity, so those become null and every JSON reader can load the file."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [_plain(v) for v in items]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def partial_path(path: str | os.PathLike) -> Path:
    """The name a file is built under before the rename to `path`, for writers that need a fixed name
    (papermill saves the notebook it executes after every cell). The suffix stays: papermill checks it."""
    path = Path(path)
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def is_partial(name: str) -> bool:
    """A name write_bytes or partial_path builds a file under: hidden, and not a result."""
    return name.startswith(".") and (name.endswith(".tmp") or ".partial." in name)


def remove_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete what an interrupted writer left in `folder`; returns the paths removed."""
    removed = []
    for entry in Path(folder).iterdir():
        if is_partial(entry.name) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(_plain(obj), indent=1, allow_nan=False)
    return write_text(path, text + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
