"""Cost per million requests on each target against today's GPU, from a run's stage results: an estimate, never a
measurement, until a device measured the throughput.

    >>> from portkit.planning import cost
    >>> table = cost.comparison(figures, ["neuron", "tpu"])   # cost.Figures: runfolder.results.cost_figures
    >>> table["targets"]["tpu"]["usd_per_million_requests"]["estimate"], table["gpus"]["H100"]

Time per request: the positions a request computes times the chip-seconds a position takes.
- positions: a target computes its bucket plan's padded positions (stage 3: real + padded tokens over the corpus);
  the GPU serves dynamic shapes, so it computes the real ones (an assumption, stated beside the table).
- chip-seconds a position: TPU from the FLOPs of xla.json's cost analysis of the bucket shapes at the chip's published
  peak (data/targets/chips.json); Neuron and any target without it, the FLOPs a position adds (stage 3's padding
  price, counted on the graph) at the chip's peak; a GPU, the same FLOPs at its own peak. Compute only, on every
  side: batched serving amortises the weights' reads over the batch.
Every side is priced at its roofline (100% of peak), so every figure is a lower bound on time and cost; the table
shows each at half and at twice the throughput. Prices per chip-hour come from data/targets/prices.json (third
parties' reports of list prices, each with its page and date) or the user's `--prices` file, which wins.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core.errors import BadParameter
from portkit.core.locations import DATA
from portkit.planning import economics
from portkit.targets import capacity

PRICES = DATA / "targets" / "prices.json"
LABEL = "estimate, not measured"
MILLION = 1_000_000
GPUS = ("A100", "H100", "H200", "L4")      # the named GPUs of the comparison (data/targets/chips.json, family gpu)
SENSITIVITY = {"at half the throughput": 2.0, "at twice the throughput": 0.5}
ASSUMPTIONS = (
    "every side runs at its roofline (100% of the chip's published peak): a lower bound on time and cost",
    "batched serving is compute-bound: a position costs the FLOPs it adds, at any batch size",
    "a target computes its bucket plan's padded positions; the GPU serves dynamic shapes and computes the real ones",
    "compile warm-up is paid once per replica start and is not in the per-request figure",
)


@functools.cache
def price_table() -> dict:
    """portkit's prices by chip (data/targets/prices.json), without the provenance note; read once a process."""
    return {k: v for k, v in json.loads(PRICES.read_text(encoding="utf-8")).items() if not k.startswith("_")}


def read_prices(path) -> dict:
    """A user's prices file: {target or chip: {"usd_per_chip_hour": n} or {"usd_per_instance_hour": n,
    "chips_per_instance": n}, with "source" and "date"}; BadParameter naming what is wrong."""
    try:
        prices = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadParameter("prices file", str(path), hint=f"cannot be read ({type(exc).__name__})") from None
    if not isinstance(prices, dict):
        raise BadParameter("prices file", str(path), hint="a JSON object {target or chip: {...}}")
    bad = [k for k, v in prices.items() if _per_chip_hour(v) is None]
    if bad:
        raise BadParameter("prices file", str(path), hint='each entry needs {"usd_per_chip_hour": number} or '
                           '{"usd_per_instance_hour": number, "chips_per_instance": number}, with "source" and '
                           f'"date"; wrong: {", ".join(map(str, bad))}')
    return prices


def _per_chip_hour(entry) -> float | None:
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("usd_per_chip_hour"), (int, float)):
        return float(entry["usd_per_chip_hour"])
    hour, chips = entry.get("usd_per_instance_hour"), entry.get("chips_per_instance")
    if isinstance(hour, (int, float)) and isinstance(chips, int) and chips > 0:
        return hour / chips
    return None


def chip_price(chip: str, target: str | None = None, prices: dict | None = None) -> dict | None:
    """The price of one chip-hour of `chip` and where it comes from: the user's entry for the target or the chip,
    else portkit's table; None where neither has one."""
    for key in (target, chip):
        if key and key in (prices or {}):
            entry = prices[key]
            return {"usd_per_chip_hour": _per_chip_hour(entry), "source": entry.get("source", "not given"),
                    "date": entry.get("date", entry.get("as_of", "not given")), "supplied_by": "the user (--prices)",
                    "instance": entry.get("instance", chip)}
    entry = price_table().get(chip)
    if entry is None:
        return None
    return {"usd_per_chip_hour": _per_chip_hour(entry), "source": entry["source"], "date": entry["as_of"],
            "supplied_by": "portkit's table (data/targets/prices.json), a third party's report",
            "instance": entry["instance"], "region": entry["region"]}


@dataclass(frozen=True)
class Plan:
    """One target's bucket plan as the estimate reads it (buckets.json's targets[t].chosen)."""
    shapes: tuple[tuple[int, int | None], ...] = ()     # (batch, seq) of each shape it compiles
    real_tokens: float | None = None                     # over the request distribution
    padded_tokens: float | None = None
    padding_waste: float | None = None
    warmup_seconds: float | None = None


@dataclass(frozen=True)
class PaddingPrice:
    """What stage 3 charged a padded position on a target (economics.roofline_price or measured)."""
    kind: str | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class Compiled:
    """Stage 3b's cost analysis of one target: its topology and the FLOPs of each compiled shape, by label."""
    topology: str | None = None
    flops: tuple[tuple[str | None, float | None], ...] = ()


@dataclass(frozen=True)
class Figures:
    """A run's figures the estimate reads, produced by the run folder's readers (portkit.runfolder.results
    .cost_figures from buckets.json and xla.json): the request count, each target's plan and padding price, and
    stage 3b's cost analysis. A target stage 3 holds without a plan has an empty Plan."""
    requests: int | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    padding_price: dict[str, PaddingPrice] = field(default_factory=dict)
    compiled: dict[str, Compiled] = field(default_factory=dict)


def flops_per_position(run: Figures, target: str) -> float | None:
    """The FLOPs a position adds to a forward pass, from stage 3's padding price where it is the FLOPs estimate
    (economics.roofline_price: seconds = FLOPs / the price chip's peak); None for a measured price."""
    price = run.padding_price.get(target, PaddingPrice())
    if price.kind != economics.ESTIMATE or price.seconds is None:
        return None
    chip = economics.PRICE_CHIPS.get(target)
    return price.seconds * capacity.chip(chip, target)["peak_bf16_flops"] if chip else None


def _xla_seconds(run: Figures, target: str, shapes) -> tuple[float, str, str] | None:
    """Chip-seconds a padded position takes from xla.json's cost analysis of the plan's shapes, its chip, source."""
    found = run.compiled.get(target, Compiled())
    topology = found.topology
    wanted = {f"batch={b} seq={s}": b * s for b, s in shapes}
    per = []
    for label, flops in found.flops:
        if topology and label in wanted and flops:
            # the compute term only, as for every other side: batched serving amortises the weights' reads
            chips = math.prod(int(d) for d in topology.split(":")[1].split("x"))
            per.append(flops / capacity.chip(topology)["peak_bf16_flops"] * chips / wanted[label])
    if not per:
        return None
    chip = topology.split(":")[0]
    return (sum(per) / len(per), chip, f"the FLOPs of xla.json's cost analysis of {len(per)} bucket shape(s) at "
            f"{chip}'s published peak bf16 ({capacity.chip(chip)['source']})")


def _priced(out: dict, chip: str, target: str | None, prices: dict | None) -> dict:
    price = chip_price(chip, target, prices)
    if price is None or price["usd_per_chip_hour"] is None:
        out["problem"] = f"no price for a {chip} chip-hour: give one with --prices"
        return out
    usd = out["chip_seconds_per_million_requests"] / 3600 * price["usd_per_chip_hour"]
    out["usd_per_million_requests"] = {"estimate": usd, **{k: usd * f for k, f in SENSITIVITY.items()}}
    out["price"] = price
    return out


def estimate(run: Figures, target: str, prices: dict | None = None) -> dict:
    """Chip-seconds and dollars per million requests of `target`'s bucket plan (see the module docstring)."""
    chosen, requests = run.plans.get(target, Plan()), run.requests
    if not chosen.shapes or not requests:
        return {"target": target, "label": LABEL, "problem": "no bucket plan over a request distribution (stage 3)"}
    shapes = [(batch, seq) for batch, seq in chosen.shapes if seq]
    found = _xla_seconds(run, target, shapes)
    if found is None:
        flops, chip = flops_per_position(run, target), economics.PRICE_CHIPS.get(target)
        if flops is None or chip is None:
            return {"target": target, "label": LABEL, "problem": "no cost analysis (xla.json) and no FLOPs estimate"}
        peak = capacity.chip(chip, target)["peak_bf16_flops"]
        found = (flops / peak, chip, f"{flops / 1e6:.1f} MFLOPs a position (stage 3, counted on the graph) at {chip}'s "
                 f"published peak bf16 {peak / 1e12:.0f} TFLOP/s")
    per_position, chip, source = found
    positions = ((chosen.real_tokens or 0) + (chosen.padded_tokens or 0)) / requests
    out = {"target": target, "chip": chip, "label": LABEL, "positions_per_request": positions,
           "padding_waste": chosen.padding_waste, "seconds_per_position": per_position, "method": source,
           "chip_seconds_per_million_requests": positions * per_position * MILLION,
           "warmup_chip_seconds": chosen.warmup_seconds}
    return _priced(out, chip, target, prices)


def gpu_estimate(run: Figures, gpu: str, flops: float | None, prices: dict | None = None) -> dict:
    """The same requests on one `gpu` (a name of GPUS): real positions only, `flops` a position at its peak."""
    spec = capacity.chip(gpu, "gpu")
    requests = run.requests
    real = next((p.real_tokens for p in run.plans.values() if p.real_tokens), None)
    if flops is None or not requests or not real:
        return {"gpu": gpu, "label": LABEL, "problem": "no FLOPs estimate or no request distribution (stage 3)"}
    per_position = flops / spec["peak_bf16_flops"]
    out = {"gpu": gpu, "chip": gpu, "label": LABEL, "positions_per_request": real / requests,
           "seconds_per_position": per_position,
           "method": f"{flops / 1e6:.1f} MFLOPs a position at {gpu}'s published peak bf16 "
                     f"{spec['peak_bf16_flops'] / 1e12:.0f} TFLOP/s ({spec['source']}), real positions only",
           "chip_seconds_per_million_requests": real / requests * per_position * MILLION}
    return _priced(out, gpu, None, prices)


def comparison(run: Figures, targets, prices: dict | None = None) -> dict:
    """Each target's estimate and each named GPU's, side by side, with the method's assumptions."""
    found = {t: estimate(run, t, prices) for t in targets}
    flops = next((f for f in (flops_per_position(run, t) for t in targets) if f is not None), None)
    return {"label": LABEL, "targets": found, "gpus": {g: gpu_estimate(run, g, flops, prices) for g in GPUS},
            "assumptions": list(ASSUMPTIONS), "sensitivity": list(SENSITIVITY)}


def line(found: dict) -> str:
    """One estimate as one line for the command line and the report."""
    name = found.get("target") or found.get("gpu")
    if "problem" in found and "chip_seconds_per_million_requests" not in found:
        return f"cost {name}: not estimated: {found['problem']}"
    text = (f"cost {name} ({found['chip']}, {found['label']}): {found['chip_seconds_per_million_requests']:.3g} "
            f"chip-s per million requests ({found['positions_per_request']:.1f} positions a request)")
    usd = found.get("usd_per_million_requests")
    if usd:
        price = found["price"]
        text += (f"; ${usd['estimate']:.3g} per million at ${price['usd_per_chip_hour']:.3g}/chip-h "
                 f"(${usd['at twice the throughput']:.3g} to ${usd['at half the throughput']:.3g} at 2x / 0.5x "
                 f"throughput; price: {price['source']}, {price['date']}, from {price['supplied_by']})")
    elif "problem" in found:
        text += f"; {found['problem']}"
    return text
