"""Cost per million requests on each target against today's GPU, from a run's stage results: an estimate, never a
measurement, until a device measured the throughput.

    >>> from portkit.planning import cost
    >>> table = cost.comparison(figures, ["neuron", "tpu"])    # cost.Figures: runfolder.results.cost_figures
    >>> table["targets"]["tpu"]["usd_per_million_requests"], table["verdicts"]["tpu"]["line"]

Time per request: the roofline of portkit.planning.budget (one owner of the model) at the batch the plan serves:
max(FLOPs / peak at the precision that runs, bytes / HBM bandwidth), which term binds said beside it.
- positions: a target computes its plan's padded positions (stage 3); the GPU, serving dynamic shapes, the real ones.
- FLOPs and bytes: one rule on every side, the TPU's included (budget.graph_workload): the FLOPs and activation bytes
  a position adds, counted on the model's graph by stage 3, and the weights as stored once a batch. XLA's FLOPs and
  bytes accessed of the compiled TPU bucket shapes (xla.json) are shown beside the TPU's as a cross-check, not used.
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
    budget.BYTES_RULE,
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
    activation_bytes: float | None = None   # the activation bytes a position adds, counted on the graph


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
    generated_tokens: int | None = None                 # workload generate: tokens a request generates (stage 2)


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


def _precision(run: Figures, target: str) -> budget.Precision:
    """The precision a target is priced at: stage 4's choice (accuracy.json), else its default (budget.precision_of)."""
    return budget.precision_of(target, run.precision.get(target), "no stage 4 result: the target's default precision")


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


@dataclass(frozen=True)
class Graph:
    """What a position costs on every side, counted once on the model's graph (stage 3's padding price): FLOPs,
    activation bytes (None: stage 3 recorded none), and the model's parameters (its weights)."""
    flops: float
    activation_bytes: float | None
    parameters: float

    def workload(self, positions: float, batch: int) -> budget.Workload:
        return budget.graph_workload(self.flops, self.parameters, self.activation_bytes, positions, batch)

    def method(self) -> str:
        moved = (f"{self.activation_bytes / 1e3:.0f} kB of activations a position" if self.activation_bytes
                 is not None else "activations not counted (stage 3 recorded none): a lower bound")
        return (f"{self.flops / 1e6:.1f} MFLOPs and {moved}, counted on the graph (stage 3), and the weights as "
                f"stored ({budget.WEIGHT_BYTES_PER_PARAMETER * self.parameters / 1e6:.1f} MB) once a batch")


def graph_figures(run: Figures, targets) -> Graph | None:
    """The graph's figures every side is priced with: the first of `targets` whose padding price was counted on the
    graph (one model, so the same figures for all), and the model's parameters; None without them."""
    for name in targets:
        flops = flops_per_position(run, name)
        if flops is not None and run.parameters is not None:
            return Graph(flops, run.padding_price[name].activation_bytes, run.parameters)
    return None


def _cross_check(run: Figures, target: str, positions: float, work: budget.Workload) -> dict | None:
    """XLA's FLOPs and bytes accessed of the target's compiled bucket shapes for the same request, beside the
    shared rule's figures: a cross-check, not used in the estimate."""
    fit = _xla_fit(run, target)
    if fit is None:
        return None
    batch = max(1, work.batch)
    xla_bytes = fit["bytes_intercept"] / batch + fit["bytes_per_position"] * positions
    ours = work.bytes_per_batch / batch + work.bytes_per_request
    xla_flops = fit["flops_per_position"] * positions
    return {"label": "cross-check, not used: XLA's cost analysis of the compiled bucket shapes (xla.json)",
            "shapes": fit["shapes"], "xla_flops_per_request": xla_flops, "xla_bytes_per_request": xla_bytes,
            "graph_flops_per_request": work.flops, "graph_bytes_per_request": ours,
            "text": (f"cross-check, not used: XLA's bytes accessed {xla_bytes / 1e6:.3g} MB and {xla_flops / 1e9:.3g} "
                     f"GFLOPs a request ({fit['shapes']} compiled bucket shape(s), xla.json) against "
                     f"{ours / 1e6:.3g} MB and {work.flops / 1e9:.3g} GFLOPs by the shared rule")}


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


def _side(out: dict, work: budget.Workload, chip: str, family: str, precision: budget.Precision,
          positions: float) -> dict:
    """Fill a side's roofline figures: the time a request at the peak, which term binds, at which precision."""
    found = budget.roofline(work, chip, precision.cls, family, precision.passes)
    out.update({"positions_per_request": positions, "seconds_per_position": found.seconds / positions,
                "chip_seconds_per_million_requests": found.seconds * MILLION, "roofline": found.to_dict(),
                "batch": work.batch, "precision": precision.said})
    out["method"] += (f"; {found.bound}-bound at batch {work.batch}: compute {found.compute_seconds * 1e6:.3g} us, "
                      f"memory {found.memory_seconds * 1e6:.3g} us a request at {precision.cls} ({precision.said}; "
                      f"{found.peak_source}) and {found.hbm_bytes_per_s / 1e9:.0f} GB/s HBM; no fixed per-request "
                      "overhead (none published)")
    return out


def _target_chip(run: Figures, target: str) -> str | None:
    """The chip a target is priced on: the TPU topology's chip stage 3b compiled for, else economics.PRICE_CHIPS."""
    topology = run.compiled.get(target, Compiled()).topology
    return topology.split(":")[0] if topology else economics.PRICE_CHIPS.get(target)


def estimate(run: Figures, target: str, prices: dict | None = None, graph: Graph | None = None) -> dict:
    """Chip-seconds and dollars per million requests of `target`'s bucket plan (see the module docstring); `graph`:
    the figures every side shares (graph_figures; None: this target's own padding price)."""
    chosen, requests = run.plans.get(target, Plan()), run.requests
    if not chosen.shapes or not requests:
        return {"target": target, "label": LABEL, "problem": "no bucket plan over a request distribution (stage 3)"}
    positions = ((chosen.real_tokens or 0) + (chosen.padded_tokens or 0)) / requests
    graph, chip = graph or graph_figures(run, [target]), _target_chip(run, target)
    if graph is None or chip is None:
        return {"target": target, "label": LABEL, "problem": "no FLOPs counted on the graph (stage 3)"}
    work = graph.workload(positions, _served_batch(run, target))
    family = capacity.chip(chip, target)["family"]
    out = {"target": target, "chip": chip, "label": LABEL, "padding_waste": chosen.padding_waste,
           "method": graph.method(), "warmup_chip_seconds": chosen.warmup_seconds}
    _side(out, work, chip, family, _precision(run, target), positions)
    check = _cross_check(run, target, positions, work)
    if check is not None:
        out["cross_check"] = check
        out["method"] += "; " + check["text"]
    return _priced(out, chip, target, prices, family)


def gpu_estimate(run: Figures, gpu: str, graph: Graph | None, prices: dict | None = None) -> dict:
    """The same requests on one `gpu` (a name of GPUS): real positions only, the same graph figures, at the GPU
    precision stage 4 measured, at the batch the plan serves."""
    requests = run.requests
    real = next((p.real_tokens for p in run.plans.values() if p.real_tokens), None)
    if graph is None or not requests or not real:
        return {"gpu": gpu, "label": LABEL, "problem": "no FLOPs estimate or no request distribution (stage 3)"}
    positions = real / requests
    cls, said = _gpu_precision(run)
    out = {"gpu": gpu, "chip": gpu, "label": LABEL,
           "method": graph.method() + "; real positions only (dynamic shapes)"}
    _side(out, graph.workload(positions, _served_batch(run)), gpu, "gpu", budget.Precision(cls, 1.0, said),
          positions)
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
    graph = graph_figures(run, targets)
    found = {t: estimate(run, t, prices, graph) for t in targets}
    out = {"label": LABEL, "targets": found, "gpus": {g: gpu_estimate(run, g, graph, prices) for g in GPUS},
           "assumptions": list(ASSUMPTIONS)}
    out["verdicts"] = verdicts(out)
    if run.generated_tokens:
        # the estimate prices one forward pass over a request's positions; a generation's decode steps (each reading
        # the weights and the cache again) are not in it, so it is a lower bound, and says so where it is read
        n = run.generated_tokens
        out["not_priced"] = (f"the workload generates {n} tokens a request: only the forward pass of its prompt (or "
                             f"source) is priced, not its {n} decode steps, so every figure is a lower bound of the "
                             "generation's cost")
        out["assumptions"].append(out["not_priced"])
        for verdict in out["verdicts"].values():
            verdict["line"] += f" (prompt only: {n} decode steps a request not priced, a lower bound)"
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
    if found.get("cross_check"):
        text += f"; {found['cross_check']['text']}"
    return text
