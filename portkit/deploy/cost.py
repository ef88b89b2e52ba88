"""Chip-seconds and cost per million requests of a run's bucket plan: an estimate, never a measurement.

    >>> from portkit.deploy import cost
    >>> cost.estimate("runs/minilm", "tpu", prices={"tpu": {"usd_per_chip_hour": 1.0, "source": "...", "date": "..."}})

Seconds per padded position come from xla.json's cost analysis (a compiled shape's FLOPs and bytes at the chip's
published peak, data/targets/chips.json: the roofline bound), else from stage 3's padding price; positions per
request from the plan's real and padded tokens. portkit holds no prices: the user supplies them (`--prices FILE`),
and the result shows the cost at half and at twice the estimated throughput.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from portkit.runfolder import results
from portkit.targets import capacity
from portkit.core.errors import BadParameter

LABEL = "estimate, not measured"
MILLION = 1_000_000


def read_prices(path) -> dict:
    """{target: {"usd_per_chip_hour": number, "source": text, "date": text}}, as the user supplies it."""
    try:
        prices = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadParameter("prices file", str(path), hint=f"cannot be read ({type(exc).__name__})") from None
    bad = [k for k, v in prices.items() if not (isinstance(v, dict) and isinstance(v.get("usd_per_chip_hour"),
                                                                                  (int, float)))] \
        if isinstance(prices, dict) else ["(not an object)"]
    if bad:
        raise BadParameter("prices file", str(path), hint='each target needs {"usd_per_chip_hour": number, '
                           f'"source": page, "date": day}}; wrong: {", ".join(bad)}')
    return prices


def _seconds_per_position(run_dir, target: str, shapes: list[tuple[int, int]]) -> tuple[float, str] | None:
    """Chip-seconds per padded position, and where it comes from."""
    xla = ((results.read_stage(run_dir, "xla") or {}).get("targets") or {}).get(target) or {}
    wanted = {f"batch={b} seq={s}": b * s for b, s in shapes}
    per = []
    for shape in xla.get("shapes") or []:
        if shape.get("label") in wanted and shape.get("flops") and xla.get("topology"):
            spec = capacity.chip(xla["topology"])
            step = max(shape["flops"] / spec["peak_bf16_flops"],
                       (shape.get("bytes_accessed") or 0) / spec["hbm_bytes_per_s"])
            chips = math.prod(int(d) for d in xla["topology"].split(":")[1].split("x"))
            per.append(step * chips / wanted[shape["label"]])
    if per:
        return sum(per) / len(per), (f"xla.json cost analysis of {len(per)} bucket shape(s) at {xla['topology']}'s "
                                     f"published peak ({spec['source']}), roofline bound")
    chosen = (((results.read_stage(run_dir, "buckets") or {}).get("targets") or {}).get(target) or {}).get("chosen")
    settings = (chosen or {}).get("settings") or {}
    if isinstance(settings.get("token_seconds"), (int, float)):
        return settings["token_seconds"], f"stage 3's padding price ({settings.get('price_source', '?')})"
    return None


def estimate(run_dir, target: str, prices: dict | None = None) -> dict:
    """Chip-seconds per million requests of `target`'s plan, and with a price, dollars at x1, x2 and x0.5."""
    stage = results.read_stage(run_dir, "buckets") or {}
    chosen = ((stage.get("targets") or {}).get(target) or {}).get("chosen") or {}
    requests = (stage.get("distribution") or {}).get("count")
    if not chosen.get("shapes") or not requests:
        return {"target": target, "label": LABEL, "problem": "no bucket plan over a request distribution"}
    shapes = [(s.get("batch", 1), s["seq"]) for s in chosen["shapes"] if s.get("seq")]
    found = _seconds_per_position(run_dir, target, shapes)
    if found is None:
        return {"target": target, "label": LABEL, "problem": "no cost analysis (xla.json) and no padding price"}
    per_position, source = found
    positions = (chosen.get("real_tokens", 0) + chosen.get("padded_tokens", 0)) / requests
    chip_seconds = positions * per_position * MILLION
    out = {"target": target, "label": LABEL, "positions_per_request": positions,
           "padding_waste": chosen.get("padding_waste"), "seconds_per_position": per_position, "source": source,
           "chip_seconds_per_million_requests": chip_seconds}
    price = (prices or {}).get(target)
    if price:
        usd = chip_seconds / 3600 * price["usd_per_chip_hour"]
        out["usd_per_million_requests"] = {"estimate": usd, "at half the throughput": 2 * usd,
                                           "at twice the throughput": usd / 2}
        out["price"] = {"usd_per_chip_hour": price["usd_per_chip_hour"], "source": price.get("source", "not given"),
                        "date": price.get("date", "not given"), "supplied_by": "the user (--prices)"}
    return out


def line(found: dict) -> str:
    """One line of an estimate for the command line."""
    if "problem" in found:
        return f"cost {found['target']}: not estimated: {found['problem']}"
    text = (f"cost {found['target']} ({found['label']}): {found['chip_seconds_per_million_requests']:.3g} chip-s per "
            f"million requests ({found['positions_per_request']:.1f} positions a request)")
    usd = found.get("usd_per_million_requests")
    if usd:
        text += (f"; ${usd['estimate']:.3g} per million at ${found['price']['usd_per_chip_hour']}/chip-h "
                 f"(${usd['at twice the throughput']:.3g} to ${usd['at half the throughput']:.3g} at 2x / 0.5x "
                 f"throughput; price from {found['price']['source']}, {found['price']['date']})")
    return text
