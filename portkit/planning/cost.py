"""Cost per million requests on each target against today's GPU, from a run's stage results: an estimate, never a
measurement, until a device measured the throughput.

    >>> from portkit.planning import cost
    >>> table = cost.comparison(figures, ["neuron", "tpu"])    # cost.Figures: runfolder.results.cost_figures
    >>> table["targets"]["tpu"]["usd_per_million_requests"], table["verdicts"]["tpu"]["line"]

Time per request: the roofline of portkit.planning.budget (one owner of the model) at the batch the plan serves:
max(FLOPs / peak at the precision that runs, bytes / HBM bandwidth), which term binds said beside it.
- positions: a target computes its plan's padded positions (stage 3); the GPU, serving dynamic shapes, the real ones.
- FLOPs and bytes: TPU from xla.json's cost analysis of the bucket shapes (FLOPs, bytes accessed); Neuron and the
  GPUs the FLOPs a position adds (stage 3, counted on the graph), the weights as stored once a batch, and XLA's bytes
  a position for the activations where xla.json has them.
- precision: each target at the precision stage 4 chose (accuracy.json), the GPU at the GPU setting stage 4 measured.
- chips: Neuron on Trn2 (economics.PRICE_CHIPS), TPU on the topology's chip, the GPUs named in GPUS.
The roofline is a lower bound on time and cost; the range divides it by the efficiency published measurements of
encoder models reached on each chip family (budget.efficiency), so it never extends past the bound. Prices per
chip-hour come from data/targets/prices.json (third parties' reports of list prices, each with its page and date) or
the user's `--prices` file, which wins. `verdicts` says per target which side the estimate favours, the break-even
and whether the ranges overlap (budget.verdict).
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from portkit.core.errors import BadParameter
from portkit.core.locations import DATA
from portkit.planning import budget, economics
from portkit.targets import capacity

PRICES = DATA / "targets" / "prices.json"
LABEL = "estimate, not measured"
MILLION = 1_000_000
GPUS = ("A100", "H100", "H200", "L4")      # the named GPUs of the comparison (data/targets/chips.json, family gpu)
ASSUMPTIONS = (
    "the roofline: a request takes max(FLOPs / peak at the precision that runs, bytes / HBM bandwidth) at the batch "
    "the plan serves, a lower bound on time and cost; the range divides it by the efficiency published measurements "
    "reached (data/targets/calibration.json), so it never goes below the bound",
    "a target computes its bucket plan's padded positions; the GPU serves dynamic shapes and computes the real ones",
    "bytes: a TPU's are XLA's bytes accessed by the compiled bucket shapes (every fused op's reads and writes, weights "
    "included); Neuron's and a GPU's the weights as stored, read once a batch, plus XLA's bytes a position where "
    "xla.json has them: the TPU's memory term counts more of the program's traffic than the others'",
    "no fixed per-request overhead is added (no public figure for these runtimes was found)",
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
    batch_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class PaddingPrice:
    """What stage 3 charged a padded position on a target (economics.roofline_price or measured)."""
    kind: str | None = None
    seconds: float | None = None
    flops: float | None = None          # the FLOPs a position adds, where the price is the FLOPs estimate
    source: str = ""


@dataclass(frozen=True)
class Compiled:
    """Stage 3b's cost analysis of one target: its topology and each compiled shape's (label, FLOPs, bytes)."""
    topology: str | None = None
    shapes: tuple[tuple[str | None, float | None, float | None], ...] = ()


@dataclass(frozen=True)
class Figures:
    """A run's figures the estimate reads, produced by the run folder's readers (portkit.runfolder.results
    .cost_figures from buckets.json, xla.json and accuracy.json): the request count, each target's plan and padding
    price, stage 3b's cost analysis, the model's parameters, and the precisions stage 4 chose and measured the GPU
    at. A target stage 3 holds without a plan has an empty Plan."""
    requests: int | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    padding_price: dict[str, PaddingPrice] = field(default_factory=dict)
    compiled: dict[str, Compiled] = field(default_factory=dict)
    parameters: float | None = None                     # the model's parameter count (buckets.json's "model")
    precision: dict[str, dict] = field(default_factory=dict)   # stage 4's chosen precision per target
    gpu_numerics: str | None = None                     # the GPU setting stage 4 measured against


def flops_per_position(run: Figures, target: str) -> float | None:
    """The FLOPs a position adds to a forward pass, from stage 3's padding price where it is the FLOPs estimate
    (economics.roofline_price); None for a measured price. A price written before it carried its FLOPs is
    read back through the chip its source names."""
    price = run.padding_price.get(target, PaddingPrice())
    if price.kind != economics.ESTIMATE or price.seconds is None:
        return None
    if price.flops is not None:
        return float(price.flops)
    named = re.search(r"at (\w+)'s peak", price.source)
    chip = named.group(1) if named else economics.PRICE_CHIPS.get(target)
    return price.seconds * capacity.chip(chip, target)["peak_bf16_flops"] if chip else None


def _xla_fit(run: Figures, target: str) -> dict | None:
    """Per-position FLOPs and the bytes accessed as intercept + slope x positions, fitted over xla.json's cost
    analysis of the compiled bucket shapes (a TPU topology), with the topology's chip and chips."""
    found = run.compiled.get(target, Compiled())
    topology, points = found.topology, []
    for label, flops, bytes_accessed in found.shapes:
        hit = re.fullmatch(r"batch=(\d+) seq=(\d+)", label or "")
        if topology and hit and flops and bytes_accessed:
            points.append((int(hit.group(1)) * int(hit.group(2)), flops, bytes_accessed))
    if not points:
        return None
    chips = math.prod(int(d) for d in topology.split(":")[1].split("x"))
    tokens = [p[0] for p in points]
    slope, intercept = (np.polyfit(tokens, [p[2] for p in points], 1) if len(points) > 1 else (0.0, points[0][2]))
    return {"chip": topology.split(":")[0], "chips": chips, "shapes": len(points),
            "flops_per_position": sum(p[1] for p in points) / sum(tokens) * chips,
            "bytes_intercept": max(float(intercept), 0.0) * chips, "bytes_per_position": max(float(slope), 0.0) * chips}


def _activation_bytes(run: Figures) -> float:
    """XLA's bytes a position (the TPU's cost analysis), 0 where xla.json has none."""
    fit = _xla_fit(run, "tpu")
    return fit["bytes_per_position"] if fit is not None else 0.0


def _precision(run: Figures, target: str) -> tuple[str, float, str]:
    """The matmul precision class a target computes at, the bf16 passes a float32 matmul takes, and what says so:
    stage 4's chosen precision (accuracy.json), else the target's default precision."""
    from portkit.targets import numerics
    from portkit.targets import specs
    chosen = run.precision.get(target)
    said = f"stage 4 chose '{chosen['name']}'" if chosen else "no stage 4 result: the target's default precision"
    chosen = chosen or specs.get(target).default_precision.to_dict()
    cost = numerics.precision_cost(target, chosen.get("name", ""))
    passes = cost["relative_matmul_cost"] if cost and chosen.get("matmul_inputs") is None and target == "tpu" else 1
    return budget.precision_class(chosen), float(passes), f"{said} ({chosen.get('description', '')})"


def _gpu_precision(run: Figures) -> tuple[str, str]:
    """The precision today's GPU runs at: the GPU setting stage 4 measured against (accuracy.json's reference
    gpu_baseline), else float32."""
    from portkit.targets import numerics
    name = run.gpu_numerics
    if name not in numerics.GPU_NUMERICS:
        return "fp32", "no stage 4 result: float32 assumed"
    return budget.precision_class(numerics.GPU_NUMERICS[name].to_dict()), f"stage 4's GPU setting '{name}'"


def _served_batch(run: Figures, target: str | None = None) -> int:
    """The batch the plan serves: the largest of the target's (else any target's) chosen batch sizes."""
    names = [target] if target else list(run.plans)
    sizes = [b for t in names for b in run.plans.get(t, Plan()).batch_sizes]
    return max(sizes, default=1)


def _weight_bytes(run: Figures) -> float | None:
    """The weights' bytes as stored (float32: 4 bytes a parameter), read once a batch."""
    return 4.0 * run.parameters if run.parameters is not None else None


def _priced(out: dict, chip: str, target: str | None, prices: dict | None, family: str) -> dict:
    price = chip_price(chip, target, prices)
    if price is None or price["usd_per_chip_hour"] is None:
        out["problem"] = f"no price for a {chip} chip-hour: give one with --prices"
        return out
    bound = out["chip_seconds_per_million_requests"] / 3600 * price["usd_per_chip_hour"]
    eff = budget.efficiency(family, out["batch"])
    out["usd_per_million_requests"] = budget.cost_range(bound, eff).to_dict()
    out["calibration"] = eff.to_dict()
    out["price"] = price
    return out


def _side(out: dict, work: budget.Workload, chip: str, family: str, precision: tuple, positions: float) -> dict:
    """Fill a side's roofline figures: the time a request at the peak, which term binds, at which precision."""
    cls, passes, said = precision
    found = budget.roofline(work, chip, cls, family, passes)
    out.update({"positions_per_request": positions, "seconds_per_position": found.seconds / positions,
                "chip_seconds_per_million_requests": found.seconds * MILLION, "roofline": found.to_dict(),
                "batch": work.batch, "precision": said})
    out["method"] += (f"; {found.bound}-bound at batch {work.batch}: compute {found.compute_seconds * 1e6:.3g} us, "
                      f"memory {found.memory_seconds * 1e6:.3g} us a request at {cls} ({said}; {found.peak_source}) "
                      f"and {found.hbm_bytes_per_s / 1e9:.0f} GB/s HBM; no fixed per-request overhead (none published)")
    return out


def estimate(run: Figures, target: str, prices: dict | None = None) -> dict:
    """Chip-seconds and dollars per million requests of `target`'s bucket plan (see the module docstring)."""
    chosen, requests = run.plans.get(target, Plan()), run.requests
    if not chosen.shapes or not requests:
        return {"target": target, "label": LABEL, "problem": "no bucket plan over a request distribution (stage 3)"}
    positions = ((chosen.real_tokens or 0) + (chosen.padded_tokens or 0)) / requests
    batch, fit = _served_batch(run, target), _xla_fit(run, target)
    if fit is not None:
        chip = fit["chip"]
        work = budget.Workload(fit["flops_per_position"] * positions, fit["bytes_intercept"],
                               fit["bytes_per_position"] * positions, batch)
        method = (f"FLOPs and bytes accessed of xla.json's cost analysis of {fit['shapes']} bucket shape(s) "
                  f"(bytes fitted as fixed + per position)")
    else:
        flops, chip, weights = flops_per_position(run, target), economics.PRICE_CHIPS.get(target), _weight_bytes(run)
        if flops is None or chip is None or weights is None:
            return {"target": target, "label": LABEL, "problem": "no cost analysis (xla.json) and no FLOPs estimate"}
        act = _activation_bytes(run)
        work = budget.Workload(flops * positions, weights, act * positions, batch)
        method = (f"{flops / 1e6:.1f} MFLOPs a position (stage 3, counted on the graph); bytes: the weights as "
                  f"stored once a batch" + (", activations XLA's bytes a position (xla.json)" if act else
                                            ", activations not counted (no xla.json): a lower bound"))
    family = capacity.chip(chip, target)["family"]
    out = {"target": target, "chip": chip, "label": LABEL, "padding_waste": chosen.padding_waste,
           "method": method, "warmup_chip_seconds": chosen.warmup_seconds}
    _side(out, work, chip, family, _precision(run, target), positions)
    return _priced(out, chip, target, prices, family)


def gpu_estimate(run: Figures, gpu: str, flops: float | None, prices: dict | None = None) -> dict:
    """The same requests on one `gpu` (a name of GPUS): real positions only, `flops` a position, at the GPU
    precision stage 4 measured, at the batch the plan serves."""
    requests = run.requests
    real = next((p.real_tokens for p in run.plans.values() if p.real_tokens), None)
    weights = _weight_bytes(run)
    if flops is None or not requests or not real or weights is None:
        return {"gpu": gpu, "label": LABEL, "problem": "no FLOPs estimate or no request distribution (stage 3)"}
    positions = real / requests
    act = _activation_bytes(run)
    work = budget.Workload(flops * positions, weights, act * positions, _served_batch(run))
    cls, said = _gpu_precision(run)
    out = {"gpu": gpu, "chip": gpu, "label": LABEL,
           "method": f"{flops / 1e6:.1f} MFLOPs a position, real positions only (dynamic shapes); bytes: the "
                     "weights as stored once a batch" + (", activations XLA's bytes a position" if act else "")}
    _side(out, work, gpu, "gpu", (cls, 1.0, said), positions)
    return _priced(out, gpu, None, prices, "gpu")


def verdicts(found: dict) -> dict:
    """Each priced target's budget.verdict against the named GPUs' cost ranges."""
    gpus = {g: budget.CostRange(**e["usd_per_million_requests"]) for g, e in found["gpus"].items()
            if e.get("usd_per_million_requests")}
    out = {}
    for name, est in found["targets"].items():
        if est.get("usd_per_million_requests"):
            hit = budget.verdict(name, budget.CostRange(**est["usd_per_million_requests"]),
                                 est["price"]["usd_per_chip_hour"], gpus)
            if hit is not None:
                out[name] = hit.to_dict()
    return out


def comparison(run: Figures, targets, prices: dict | None = None) -> dict:
    """Each target's estimate and each named GPU's, side by side, with the method's assumptions and verdicts."""
    found = {t: estimate(run, t, prices) for t in targets}
    flops = next((f for f in (flops_per_position(run, t) for t in targets) if f is not None), None)
    out = {"label": LABEL, "targets": found, "gpus": {g: gpu_estimate(run, g, flops, prices) for g in GPUS},
           "assumptions": list(ASSUMPTIONS)}
    out["verdicts"] = verdicts(out)
    return out


def line(found: dict) -> str:
    """One estimate as one line for the command line and the report."""
    name = found.get("target") or found.get("gpu")
    if "problem" in found and "chip_seconds_per_million_requests" not in found:
        return f"cost {name}: not estimated: {found['problem']}"
    roof = found["roofline"]
    text = (f"cost {name} ({found['chip']}, {found['label']}): {found['chip_seconds_per_million_requests']:.3g} "
            f"chip-s per million requests at the roofline ({roof['bound']}-bound at {roof['precision']}, batch "
            f"{found['batch']}; {found['positions_per_request']:.1f} positions a request)")
    usd = found.get("usd_per_million_requests")
    if usd:
        price, eff = found["price"], found["calibration"]
        text += (f"; ${usd['low']:.3g} to ${usd['high']:.3g} per million (estimate ${usd['estimate']:.3g}; never "
                 f"below ${usd['bound']:.3g}, the roofline) at ${price['usd_per_chip_hour']:.3g}/chip-h, efficiency "
                 f"{eff['low']:.0%} to {eff['high']:.0%} of the roofline from {eff['note']} "
                 f"(data/targets/calibration.json); price: {price['source']}, {price['date']}, from "
                 f"{price['supplied_by']}")
    elif "problem" in found:
        text += f"; {found['problem']}"
    return text
