"""The cost model a budget can be made from: a roofline with a compute and a memory term at the precision that
runs, calibrated against published measured throughput, and the verdict it supports. Plain inputs only.

    >>> from portkit.planning import budget
    >>> side = budget.Workload(flops=1.8e9, bytes_per_batch=9.1e7, bytes_per_request=0, batch=1)
    >>> found = budget.roofline(side, "trn2", "fp32", "neuron")   # max(FLOPs / peak, bytes / HBM bandwidth)
    >>> found.bound, found.seconds                           # 'HBM bandwidth', a lower bound on the time
    >>> budget.efficiency("neuron", batch=1)                 # the spread of measured / roofline (calibration.json)
    >>> budget.verdict("neuron", usd, 2.4, {"H100": gpu_usd})  # favours moving or staying, break-even, how sure

Rules (each owned here):
- precision (precision_of): the matmul precision stage 4 chose, else the target's default; the chip's published
  dense peak for it (chips.json "peaks"); a TPU's float32 matmuls are bf16 passes (precision_costs.json).
- bytes (graph_workload, BYTES_RULE), one rule on every side: the weights as stored once a batch plus the activation
  bytes a position counted on the graph; XLA's bytes accessed is the TPU's cross-check, never its term.
- roofline: a request's seconds = max(FLOPs / peak, bytes / HBM bandwidth) of its batch over its requests, with no
  fixed overhead (none published); a padded position (position_price) costs the roofline of what it adds.
- calibration: efficiency = measured / roofline of each published measurement (calibration.json); a side's cost
  is the range bound / max efficiency .. bound / min efficiency, never below the bound (efficiency <= 1).
"""
from __future__ import annotations

import functools
import json
import statistics
from dataclasses import asdict, dataclass

from portkit.core.locations import DATA
from portkit.targets import capacity

CALIBRATION = DATA / "targets" / "calibration.json"
MATMUL_CLASS = {None: "fp32", "tfloat32": "tf32", "bfloat16": "bf16", "float16": "bf16"}


def precision_class(precision: dict | None) -> str:
    """The matmul precision a side computes at, from a precision's to_dict() (stage 4's choice):
    its matmul_inputs (None: float32 throughout)."""
    return MATMUL_CLASS.get((precision or {}).get("matmul_inputs"), "fp32")


@dataclass(frozen=True)
class Precision:
    """The precision a target is priced at: its matmul class, the bf16 passes a float32 matmul takes, what says so."""
    cls: str
    passes: float
    said: str


def precision_of(target: str, chosen: dict | None = None, default_said: str = "") -> Precision:
    """The precision `target` computes at: `chosen` (a precision's to_dict(), stage 4's choice), else the target's
    default precision, which `default_said` names (why the default). A TPU's float32 matmuls take the bf16 passes
    data/targets/precision_costs.json states for the setting."""
    from portkit.targets import numerics
    from portkit.targets import specs
    said = "stage 4 chose" if chosen else f"{default_said or 'the target default precision'}:"
    chosen = chosen or specs.get(target).default_precision.to_dict()
    cost = numerics.precision_cost(target, chosen.get("name", ""))
    passes = cost["relative_matmul_cost"] if cost and chosen.get("matmul_inputs") is None and target == "tpu" else 1
    return Precision(precision_class(chosen), float(passes),
                     f"{said} '{chosen.get('name', '')}' ({chosen.get('description', '')})")


def peak(chip: str, family: str, cls: str, passes: float = 1.0) -> tuple[float, str]:
    """The chip's published dense peak FLOP/s at precision class `cls`, and where it comes from. A chip without
    a peak for `cls` (a TPU) runs float32 matmuls as `passes` bf16 passes (precision_costs.json)."""
    spec = capacity.chip(chip, family)
    peaks = spec.get("peaks") or {}
    if cls in peaks:
        return peaks[cls], f"{chip}'s published dense {cls} peak ({spec['sources']['peaks']})"
    bf16 = spec["peak_bf16_flops"]
    if cls == "fp32" and passes > 1:
        return bf16 / passes, (f"{chip}'s bf16 peak / {passes:g} (float32 matmuls in {passes:g} bf16 passes; "
                               f"{spec['sources']['peak_bf16_flops']})")
    return bf16, f"{chip}'s published bf16 peak ({spec['sources']['peak_bf16_flops']})"


@dataclass(frozen=True)
class Workload:
    """What one request costs a chip: FLOPs, the bytes read once a batch (the weights) and once a request
    (activations), at `batch` requests a batch."""
    flops: float
    bytes_per_batch: float
    bytes_per_request: float
    batch: int = 1


@dataclass(frozen=True)
class Roofline:
    """A request's time at the chip's peak: the larger of the compute and the memory term, and which one binds."""
    seconds: float
    compute_seconds: float
    memory_seconds: float
    bound: str
    precision: str
    peak_flops: float
    hbm_bytes_per_s: float
    peak_source: str

    def to_dict(self) -> dict:
        return asdict(self)


def roofline(work: Workload, chip: str, cls: str, family: str = "tpu", passes: float = 1.0) -> Roofline:
    """Seconds a request at the roofline: max(batch FLOPs / peak, batch bytes / HBM bandwidth) / batch."""
    flops_s, source = peak(chip, family, cls, passes)
    bandwidth = capacity.chip(chip, family)["hbm_bytes_per_s"]
    batch = max(1, int(work.batch or 1))
    compute = work.flops / flops_s
    memory = (work.bytes_per_batch / batch + work.bytes_per_request) / bandwidth
    return Roofline(max(compute, memory), compute, memory, "compute" if compute >= memory else "HBM bandwidth", cls,
                    flops_s, bandwidth, source)


# ---------------------------------------------------------------- bytes: one rule for every side
WEIGHT_BYTES_PER_PARAMETER = 4.0      # the weights as stored: float32
BYTES_RULE = ("bytes, the same rule on every side: the weights as stored (4 bytes a parameter), read once a batch, "
              "plus the activation bytes a position counted on the model's graph (every ATen op's outputs, views "
              "excluded, once each: stage 3's count); XLA's bytes accessed by the compiled TPU shapes is shown beside "
              "the TPU's as a cross-check, not used")


def graph_workload(flops_per_position: float, parameters: float, activation_bytes_per_position: float | None,
                   positions: float, batch: int) -> Workload:
    """A request on any side by BYTES_RULE: `positions` positions of the graph's FLOPs and activation bytes (None:
    not counted, a lower bound) and the weights once a batch of `batch` requests."""
    return Workload(flops_per_position * positions, WEIGHT_BYTES_PER_PARAMETER * parameters,
                    (activation_bytes_per_position or 0.0) * positions, batch)


def position_price(flops: float, activation_bytes: float | None, chip: str, family: str,
                   precision: Precision) -> Roofline:
    """What one padded position costs: the roofline of the FLOPs and the activation bytes it adds (the weights
    are read once a batch however long its sequences are), at `precision`."""
    return roofline(Workload(flops, 0.0, activation_bytes or 0.0, 1), chip, precision.cls, family, precision.passes)


# ---------------------------------------------------------------- calibration against published measurements
@functools.cache
def calibration_rows() -> tuple[dict, ...]:
    """The published measurements (data/targets/calibration.json "rows"), read once a process."""
    return tuple(json.loads(CALIBRATION.read_text(encoding="utf-8"))["rows"])


def calibration_searches() -> tuple[dict, ...]:
    """The searches made for published measurements of a family without one (calibration.json "searches": family,
    where, query, what was found), listed on docs/benchmarks/calibration.md."""
    return tuple(json.loads(CALIBRATION.read_text(encoding="utf-8")).get("searches", ()))


def encoder_workload(row: dict) -> Workload:
    """A calibration row's sample: FLOPs = 2 x matmul weights x tokens + 4 x layers x tokens^2 x hidden
    (attention scores and their product with values); bytes = the matmul weights once a batch."""
    layers, hidden, ffn, tokens = row["layers"], row["hidden"], row["ffn"], row["tokens"]
    weights = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    flops = 2 * weights * tokens + 4 * layers * tokens * tokens * hidden
    batch = row.get("batch")
    return Workload(flops, weights * row["weight_bytes_per_parameter"] if batch else 0.0, 0.0, batch or 1)


def row_efficiency(row: dict) -> float:
    """Measured samples a second per chip / the roofline's, for one calibration row."""
    found = roofline(encoder_workload(row), row["chip"], row["precision"], row["family"])
    return row["measured_per_second"] / row["chips"] * found.seconds


@dataclass(frozen=True)
class Efficiency:
    """The spread of measured / roofline over a family's published measurements."""
    family: str
    low: float
    median: float
    high: float
    measurements: int
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


MIN_MEASUREMENTS = 3


def efficiency(family: str, batch: int | None = None) -> Efficiency:
    """The efficiency spread of `family` (a chips.json family: "tpu", "neuron", "gpu") at the batch a plan serves:
    a batch-1 plan reads the family's batch-1 measurements where it has MIN_MEASUREMENTS of them, else all of the
    family's. A family with no measurement takes the spread of every published one, and says so; one with fewer
    than MIN_MEASUREMENTS says so."""
    rows = [r for r in calibration_rows() if r["family"] == family]
    single = [r for r in rows if r.get("batch") == 1]
    regime = ""
    if batch == 1 and len(single) >= MIN_MEASUREMENTS:
        rows, regime = single, " at batch 1"
    note = (f"{len(rows)} published measurement(s){regime} of encoder models on {family} chips "
            f"({', '.join(sorted({r['chip'] for r in rows}))})")
    if not rows:
        rows = list(calibration_rows())
        note = (f"no published encoder measurement on {family} chips was found: the spread of all "
                f"{len(rows)} measurements on other chips stands in (uncalibrated for this family)")
    elif len(rows) < MIN_MEASUREMENTS:
        note += f"; fewer than {MIN_MEASUREMENTS}: a thin calibration"
    elif batch == 1 and not regime:
        note += (f"; {len(single)} at batch 1, fewer than {MIN_MEASUREMENTS}, so the batched ones count too, and "
                 "batch 1 pays fixed per-request costs they do not show")
    values = sorted(min(1.0, row_efficiency(r)) for r in rows)
    return Efficiency(family, values[0], statistics.median(values), values[-1], len(values), note)


@dataclass(frozen=True)
class CostRange:
    """Dollars per million requests: at the roofline (a lower bound) and over the calibrated efficiency spread."""
    bound: float
    low: float
    estimate: float
    high: float

    def to_dict(self) -> dict:
        return asdict(self)


def cost_range(bound_usd: float, eff: Efficiency) -> CostRange:
    """The cost at the bound divided by the efficiency spread: never below the bound."""
    return CostRange(bound_usd, bound_usd / eff.high, bound_usd / eff.median, bound_usd / eff.low)


# ---------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Verdict:
    """Whether the estimate favours moving a target or staying on the cheapest GPU, the break-even, how sure."""
    target: str
    gpu: str
    favours: str              # "moving" or "staying"
    sure: str                 # "clear: the ranges do not overlap" or "uncertain: the ranges overlap"
    break_even_usd_per_chip_hour: float
    break_even_utilisation: float
    line: str

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(target: str, usd: CostRange, price_per_chip_hour: float, gpus: dict[str, CostRange]) -> Verdict | None:
    """The target's cost range against the cheapest GPU's (by estimate): which side the estimate favours, the
    chip-hour price at which the target's estimate matches that GPU's, the share of its roofline throughput the
    target must reach to match it at today's price, and whether the two ranges overlap. None without a GPU."""
    if not gpus:
        return None
    gpu, other = min(gpus.items(), key=lambda kv: kv[1].estimate)
    favours = "moving" if usd.estimate < other.estimate else "staying"
    clear = usd.high < other.low or usd.low > other.high
    sure = "clear: the ranges do not overlap" if clear else "uncertain: the ranges overlap"
    price = price_per_chip_hour * other.estimate / usd.estimate
    utilisation = usd.bound / other.estimate
    reach = (f"it would have to exceed its roofline ({utilisation:.0%} of peak throughput), which it cannot"
             if utilisation > 1 else f"{utilisation:.0%} of its roofline throughput")
    line = (f"{target}: the estimate favours {favours} (${usd.low:.3g} to ${usd.high:.3g} per million against "
            f"GPU {gpu}'s ${other.low:.3g} to ${other.high:.3g}; {sure}); break-even: ${price:.3g} per chip-hour "
            f"(today ${price_per_chip_hour:.3g}), or at today's price {reach}")
    return Verdict(target, gpu, favours, sure, price, utilisation, line)
