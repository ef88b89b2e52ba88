"""Capacity per TPU chip, an estimate, not a measurement: roofline throughput from the XLA compiler's
own cost analysis (FLOPs and bytes accessed per device) and each chip's published peak bf16 compute
and HBM bandwidth (data/targets/chips.json, each from its Google Cloud TPU page), and how many copies of
the compiled program fit a chip's HBM.

A step takes at least max(FLOPs / peak FLOP/s, bytes / HBM bandwidth): the roofline bound. Real
throughput is lower (collectives, the host, kernel efficiency); every figure here says "estimate".

    >>> from portkit import capacity
    >>> capacity.roofline(report, report.shapes[0], tokens=8 * 1024)   # a compile_for_tpu/compile_sharded result
"""
from __future__ import annotations

import json
from pathlib import Path

from portkit.errors import BadParameter

CHIPS = Path(__file__).resolve().parent.parent / "data" / "targets" / "chips.json"
LABEL = "estimate, not measured"


def chips() -> dict:
    return {k: v for k, v in json.loads(CHIPS.read_text()).items() if not k.startswith("_")}


def chip(topology: str) -> dict:
    name = topology.split(":")[0]
    table = chips()
    if name not in table:
        raise BadParameter("TPU chip", name, sorted(table))
    return table[name]


def roofline(report, result, tokens: int) -> dict:
    """Roofline bound of one compiled shape per device, and the tokens per second per chip it implies
    (`tokens`: tokens the whole step processes, over all devices). Labelled an estimate with its sources."""
    if result.status != "compiled" or result.flops is None:
        raise BadParameter("compiled shape", result.status, hint="roofline needs a compiled shape's cost analysis")
    spec = chip(report.topology)
    compute_s = result.flops / spec["peak_bf16_flops"]
    memory_s = result.bytes_accessed / spec["hbm_bytes_per_s"]
    step_s = max(compute_s, memory_s)
    chips_n = 1
    for d in report.topology.split(":")[1].split("x"):
        chips_n *= int(d)
    copies = report.hbm_bytes_per_device // result.memory["total"] if result.memory["total"] else None
    return {"label": LABEL, "bound": "compute" if compute_s >= memory_s else "HBM bandwidth",
            "step_seconds": step_s, "tokens_per_second_per_chip": tokens / step_s / chips_n if step_s else None,
            "copies_per_device": copies, "source": spec["source"]}
