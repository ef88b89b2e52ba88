"""What a compile costs on each target, and where that figure came from: the one owner of compile prices.

    >>> from portkit import models
    >>> from portkit.planning import economics
    >>> m = models.load("minilm")
    >>> tpu = economics.cost_model(m, "tpu", lengths=[9, 40, 64])      # real XLA compiles of 3 shapes
    >>> tpu.seconds(48), tpu.label()          # interpolated; 'measured XLA at 3 shapes (v5e:1x1), interpolated'
    >>> neuron = economics.cost_model(m, "neuron")                     # no neuronx-cc here: an estimate
    >>> economics.cost_model(m, "neuron", neuron_compile_seconds=45)   # the estimate, overridden

Stages 2 and 3 price every compile a static-shape target pays (one per input shape) with a CostModel:
seconds = intercept + per_token x sequence length (never below `floor`), and a `kind` every figure carries:
- "measured XLA": the real XLA compiler for a TPU topology, run on this host by stage 3b's machinery
  (portkit.tpu_compile.compiler.compile_seconds, verdict-cached); a few shapes are measured, the rest interpolated
  linearly in tokens.
- "estimate": no Neuron compiler is installable here; the per-graph time is estimated from public reports
  (NEURON_SOURCES) by `neuron_estimate`'s rule, labelled "estimate, not measured", overridable.
- "native vendor": on the target's host, the vendor compiler's own times, measured by stage 2.
- "Inductor on this CPU": a reference target (cpu, cuda), compiled by Inductor here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from portkit.core.errors import BadParameter, PortkitError

MEASURED_XLA, ESTIMATE, NATIVE, INDUCTOR = "measured XLA", "estimate", "native vendor", "Inductor on this CPU"
KINDS = (MEASURED_XLA, ESTIMATE, NATIVE, INDUCTOR)
DEFAULT_TOPOLOGY = "v5e:1x1"
MEASURED_SHAPES = 3          # shapes the XLA model measures: the shortest, the median and the longest length

# Public reports behind the Neuron estimate (read, not copied; no figure here is measured by portkit).
NEURON_SOURCES = (
    "aws-neuron/aws-neuron-sdk#1210: a Llama-3.1-8B forward (decode) graph compiles in about 1 min with "
    "neuronx-cc once one slow op is removed (about 22 min with it)",
    "awsdocs-neuron vLLM Neuron, design/compilation: neuronx-cc produces one NEFF per bucket (sequence "
    "length x batch size); more buckets mean a longer start-up",
)
NEURON_ANCHOR = (8.0e9, 60.0)    # (parameters, seconds per graph): aws-neuron-sdk#1210, Llama-3.1-8B, ~1 min
NEURON_EXPONENT = 0.5            # per-graph time grows with the square root of the parameter count (assumed)
NEURON_FLOOR = 20.0              # seconds: neuronx-cc's fixed pass pipeline for any graph (assumed, not published)


@dataclass(frozen=True)
class CompileCost:
    """One shape's compile time on a target, with what kind of figure it is and its source."""
    seconds: float
    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"compile cost kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def __str__(self) -> str:
        return f"{self.seconds:.1f} s ({self.source})"


@dataclass(frozen=True)
class CostModel:
    """A target's compile seconds for one input shape, as a function of its sequence length."""
    target: str
    kind: str
    source: str                          # what the figures rest on, cited
    intercept: float
    per_token: float = 0.0
    floor: float = 0.0
    points: tuple = ()                   # the (seq, seconds) it was fitted to, when measured
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"compile cost kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def seconds(self, seq: int | None = None) -> float:
        """Compile seconds of one shape of `seq` tokens (None: a model without a sequence dimension)."""
        value = self.intercept + self.per_token * (seq or 0)
        return max(self.floor, float(value))

    __call__ = seconds

    def cost(self, seq: int | None = None) -> CompileCost:
        return CompileCost(self.seconds(seq), self.kind, self.source)

    def total(self, seqs) -> float:
        """Seconds to compile every shape in `seqs` once."""
        return float(sum(self.seconds(s) for s in seqs))

    def scaled(self, factor: float) -> "CostModel":
        """The same model with every figure times `factor` (what-if: half or twice an estimate)."""
        return replace(self, intercept=self.intercept * factor, per_token=self.per_token * factor,
                       floor=self.floor * factor, source=f"{self.source}, x{factor:g}")

    def label(self) -> str:
        return self.source if self.source.startswith(self.kind) else f"{self.kind}: {self.source}"

    def to_dict(self) -> dict:
        return {"target": self.target, "kind": self.kind, "source": self.source, "intercept": self.intercept,
                "per_token": self.per_token, "floor": self.floor, "points": [list(p) for p in self.points],
                "details": self.details, "label": self.label()}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        return cls(d["target"], d["kind"], d["source"], float(d["intercept"]), float(d.get("per_token", 0.0)),
                   float(d.get("floor", 0.0)), tuple(tuple(p) for p in d.get("points", [])), d.get("details", {}))


def fit(target: str, kind: str, source: str, points) -> CostModel:
    """A cost model fitted to measured (seq, seconds) points: linear in tokens where two or more
    lengths were measured (never falling with length, never below the cheapest measurement)."""
    points = tuple((int(s or 0), float(t)) for s, t in points)
    if not points:
        raise ValueError("a cost model needs at least one measured point")
    seqs, secs = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if np.unique(seqs).size > 1:
        slope, intercept = np.polyfit(seqs, secs, 1)
        slope = max(float(slope), 0.0)
        intercept = float(secs.mean() - slope * seqs.mean())
    else:
        slope, intercept = 0.0, float(secs.mean())
    return CostModel(target, kind, source, intercept, slope, float(secs.min()), points)


def spread(lengths, count: int = MEASURED_SHAPES) -> list[int]:
    """`count` distinct lengths spread over `lengths`: the shortest, the longest and evenly between."""
    distinct = sorted({int(x) for x in lengths})
    if len(distinct) <= count:
        return distinct
    return sorted({distinct[round(i * (len(distinct) - 1) / (count - 1))] for i in range(count)})


def xla_model(model, lengths, batch: int = 1, topology: str = DEFAULT_TOPOLOGY, dtype: str | None = None,
              measure=None) -> CostModel:
    """TPU: the real XLA compile time for `topology` of a few shapes spread over `lengths`, measured on
    this host (or read back from the verdict cache), interpolated linearly in tokens. `measure` is
    xla_compile.compile_seconds (a test may pass another)."""
    if measure is None:
        from portkit.tpu_compile.compiler import compile_seconds as measure
    seqs = spread(lengths) if model.seq_dim is not None and len(lengths) else [None]
    points, sources, problems = [], [], []
    for seq in seqs:
        try:
            shape = {"batch": batch} if seq is None else {"batch": batch, "seq": seq}   # None: images
            seconds, source = measure(model, shape, topology, dtype)
        except PortkitError as exc:        # no jax/libtpu, a topology it does not know: said, not hidden
            seconds, source = None, str(exc).splitlines()[0]
        if seconds is None:
            problems.append(f"seq {seq}: {source}")
        else:
            points.append((seq, seconds))
            sources.append(source)
    if not points:
        raise PortkitError(f"no XLA compile time could be measured for {topology}: {'; '.join(problems)}")
    source = (f"measured XLA at {len(points)} shape(s) ({topology}, batch {batch}, seq "
              f"{', '.join(str(p[0]) for p in points)}), interpolated linearly in tokens" if seqs != [None] else
              f"measured XLA at the model's one input shape ({topology}, batch {batch})")
    found = fit("tpu", MEASURED_XLA, source, points)
    return replace(found, details={"topology": topology, "problems": problems, "measured": list(sources)})


ESTIMATE_PREFIX = "estimate, not measured: "


def neuron_estimate(parameters: int, override: float | None = None) -> CostModel:
    """Neuron: seconds per graph, estimated, never measured (no neuronx-cc is installable here).

    Rule: NEURON_ANCHOR's ~60 s for an 8 B-parameter graph (aws-neuron-sdk#1210), scaled by
    (parameters / 8e9) ** 0.5, never below NEURON_FLOOR; no per-length figure is published, so it is
    the same for every sequence length. `override` (seconds, the parameter neuron_compile_seconds)
    replaces it and the label says so."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not override > 0:
            raise BadParameter("neuron_compile_seconds", override, hint="give seconds per compiled graph, > 0")
        return CostModel("neuron", ESTIMATE, f"estimate, not measured: parameter neuron_compile_seconds = "
                         f"{override:g} s per graph", float(override), details={"sources": list(NEURON_SOURCES)})
    anchor_params, anchor_seconds = NEURON_ANCHOR
    scaled = anchor_seconds * math.pow(max(parameters, 1) / anchor_params, NEURON_EXPONENT)
    seconds = max(NEURON_FLOOR, scaled)
    rule = (f"{anchor_seconds:.0f} s for an {anchor_params / 1e9:.0f} B-parameter graph x (parameters / "
            f"{anchor_params:.0e}) ** {NEURON_EXPONENT:g}, at least {NEURON_FLOOR:.0f} s")
    source = (f"estimate, not measured: {seconds:.0f} s per graph for {parameter_count(parameters)} "
              f"({rule}; sources: aws-neuron-sdk#1210, vLLM Neuron compilation docs)")
    return CostModel("neuron", ESTIMATE, source, seconds,
                     details={"rule": rule, "sources": list(NEURON_SOURCES), "parameters": int(parameters)})


def parameter_count(parameters: int) -> str:
    """A parameter count as people read it: '9,610 parameters' below a million, '22.7 M parameters' above."""
    return f"{parameters:,} parameters" if parameters < 1e6 else f"{parameters / 1e6:,.1f} M parameters"


def priced_by_measured_compiles(target: str, native: bool = False) -> bool:
    """Whether `target`'s compiles are priced with the times measured here (stage 2's own compiles): natively
    (the vendor's compiler) and for a reference target (Inductor); an emulated migration target's are
    measured by XLA or estimated (cost_model)."""
    from portkit.targets import specs
    return native or specs.get(target).reference


@dataclass(frozen=True)
class MeasuredCompiles:
    """The compile times a stage measured here, (seq, seconds) each, and whose compiler they are: the
    vendor's on the target's own host (native), else Inductor's on this CPU (a reference target)."""
    points: tuple = ()
    native: bool = False


def cost_model(model, target: str, lengths=(), *, measured: MeasuredCompiles = MeasuredCompiles(),
               neuron_compile_seconds: float | None = None, batch: int = 1, topology: str = DEFAULT_TOPOLOGY,
               measure=None) -> CostModel:
    """The cost model a stage prices `target`'s compiles with (the one place this is decided):
    native mode and reference targets: the compile times measured here (`measured`, the vendor's or
    Inductor's compiles); TPU emulated: measured XLA; Neuron emulated: the estimate (or its override)."""
    from portkit.targets import specs
    if priced_by_measured_compiles(target, measured.native):
        kind = NATIVE if measured.native else INDUCTOR
        if not measured.points:
            raise PortkitError(f"no {kind} compile time measured for {target}")
        what = "the vendor compiler's own times" if measured.native else "Inductor's times on this CPU"
        return fit(target, kind, f"{what}, {len(measured.points)} compile(s) measured here", measured.points)
    if target == "tpu":
        try:
            return xla_model(model, lengths, batch, topology, measure=measure)
        except PortkitError as exc:    # the model does not lower for XLA: an estimate, and it says why
            stand_in = neuron_estimate(int(model.parameters))
            rule = stand_in.source.removeprefix(ESTIMATE_PREFIX)
            return replace(stand_in, target="tpu", details={**stand_in.details, "xla_problem": str(exc)},
                           source=f"{ESTIMATE_PREFIX}no XLA compile time ({exc}); priced with the Neuron rule as a "
                                  f"stand-in, {rule}")
    if target == "neuron":
        return neuron_estimate(int(model.parameters), neuron_compile_seconds)
    raise BadParameter("target for compile costs", target, list(specs.TARGETS))


# ---------------------------------------------------------------- what a padded token costs
def fastest_seconds(module, batches: dict, repeats: int = 3, threads: int | None = None) -> dict:
    """{key: the fastest of `repeats` interleaved rounds of module(**batches[key])}, no_grad, after one
    untimed call per batch (first calls allocate): a burst of load on a shared machine hits every batch
    alike. threads: intra-op threads while timing (1: another process's load cannot stall a thread barrier)."""
    import time

    import torch
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    best = dict.fromkeys(batches, float("inf"))
    try:
        with torch.no_grad():
            for key in batches:
                module(**batches[key])
            for _ in range(repeats):
                for key, batch in batches.items():
                    start = time.perf_counter()
                    module(**batch)
                    best[key] = min(best[key], time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return best


# A padded position costs the target the compute and the memory traffic it adds. Priced per target (padding_price):
# - emulated: the FLOPs and activation bytes one more position adds to a forward pass (counted on the model's graph
#   by capacity.count_flops, no weights read: those are read once a batch however long it is) at the roofline of
#   the target's chip (planning.budget.position_price: max(FLOPs / peak, bytes / HBM bandwidth), data/targets/
#   chips.json) at the target's default precision: stage 3 runs before stage 4 chooses one. An estimate and a lower
#   bound (real kernels reach a fraction of the roofline; the plan at half and twice the compile estimate,
#   buckets.what_if, shows how the choice moves with the ratio). Where the graph cannot be counted (fake tensors
#   refuse it), the FLOPs are estimated from the parameters (FORWARD_FLOPS_PER_PARAMETER), activations not counted.
# - native: measured on the target's device (capacity.measure_native, the vendor's backend).
# - a reference target (cpu, cuda): the eager forward on this machine, which is that target.
# The chip each target is priced on: TorchNeuron runs on Trn2 and Trn3 only (Neuron 2.33 release notes, 10/19/2026:
# "Supported instances: Trn2, Trn3"); no public Trn3 price was found, so Neuron is priced on Trn2.
PRICE_CHIPS = {"tpu": DEFAULT_TOPOLOGY.split(":")[0], "neuron": "trn2"}
THIS_MACHINE = "measured on this machine"
PRICE_KINDS = (ESTIMATE, NATIVE, THIS_MACHINE)


@dataclass(frozen=True)
class TokenPrice:
    """What one padded position costs a target, in seconds, with what kind of figure it is and its source."""
    target: str
    seconds: float
    kind: str
    source: str
    flops: float | None = None     # the FLOPs a position adds, where the price is computed from them
    activation_bytes: float | None = None   # the activation bytes a position adds, where counted on the graph

    def __post_init__(self):
        if self.kind not in PRICE_KINDS:
            raise ValueError(f"padding price kind {self.kind!r} is not one of {', '.join(PRICE_KINDS)}")

    def __float__(self) -> float:
        return float(self.seconds)

    def label(self) -> str:
        """What the price is and where it came from; a measured figure stays in `seconds`, out of the text."""
        if self.kind == ESTIMATE:   # computed from counted FLOPs: the same figure every run
            return f"{self.seconds:.2e} s per padded position ({self.source})"
        return f"seconds per padded position ({self.source})"

    def to_dict(self) -> dict:
        return {"target": self.target, "seconds": self.seconds, "kind": self.kind, "source": self.source,
                "label": self.label(), "flops": self.flops, "activation_bytes": self.activation_bytes}


def position_work(model, sizes: dict, dim: str, longer: int) -> tuple[float, float]:
    """FLOPs and activation bytes one more position along `dim` adds to a batch-1 forward, from `sizes`
    ({dimension: size}) to `longer` positions along dim: the slopes of what capacity.count_flops counts on the graph."""
    from portkit.targets import capacity

    def count(at: dict):
        spec = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch."))
                for k, v in model.declaration.dummy(1, at).items()}
        return capacity.count_flops(model.module, spec)
    low, high, span = count(sizes), count({**sizes, dim: longer}), max(longer - sizes[dim], 1)
    return (high.flops - low.flops) / span, (high.activation_bytes - low.activation_bytes) / span


def counted_price(model, target: str, sizes: dict, dim: str, longer: int) -> TokenPrice:
    """A padded position along `dim` on `target`: position_work's FLOPs and bytes at its chip's roofline."""
    return roofline_price(target, *position_work(model, sizes, dim, longer))


def padding_price(model, target: str, top: int, *, native: bool = False) -> TokenPrice:
    """What a padded position costs `target` (the one place this is decided; see PRICE_CHIPS above):
    measured on the device natively, on this machine for a reference target, else FLOPs at the chip's peak."""
    from portkit.targets import capacity
    from portkit.targets import specs
    t = specs.get(target)
    if t.reference:
        return TokenPrice(target, measure_token_seconds(model, top), THIS_MACHINE,
                          f"{THIS_MACHINE}: eager forward slope, batch 1, lengths {top // 4} to {top}")
    if native:
        shapes = [{"batch": 1, "seq": max(2, top // 2)}, {"batch": 1, "seq": top}]
        lo, hi = capacity.measure_native(model, target, shapes)
        seconds = max((hi["seconds"] - lo["seconds"]) / max(top - shapes[0]["seq"], 1), hi["seconds"] / top / 10)
        return TokenPrice(target, seconds, NATIVE, f"{hi['label']}, slope from {shapes[0]['seq']} to {top} positions")
    try:
        return counted_price(model, target, {model.seq_dim: max(1, top // 2)}, model.seq_dim, top)
    except Exception as exc:  # noqa: BLE001 - a graph the FLOP counter cannot run under fake tensors
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        weights = non_embedding_parameters(model.module)
        return roofline_price(target, FORWARD_FLOPS_PER_PARAMETER * weights, None,
                              f"the FLOPs could not be counted on the graph ({reason}), so "
                              f"{FORWARD_FLOPS_PER_PARAMETER} x {parameter_count(weights)} outside embeddings: "
                              f"{FORWARD_FLOPS_SOURCE}; activations not counted")


# Where the graph cannot be counted: a forward pass costs about 2 FLOPs per non-embedding parameter per token
# (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", arXiv:2001.08361, section 2.1: C_forward ~ 2N).
FORWARD_FLOPS_PER_PARAMETER = 2
FORWARD_FLOPS_SOURCE = ("a forward pass's 2N FLOPs per token for N non-embedding parameters (Kaplan et al. 2020, "
                        "Scaling Laws for Neural Language Models, arXiv:2001.08361)")


def non_embedding_parameters(module) -> int:
    """The module's unique parameters outside its embedding tables (an embedding is a lookup, not a matmul)."""
    import torch
    lookups = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(p.numel() for p in module.parameters() if id(p) not in lookups)


# Stage 3 runs before stage 4 chooses a precision: a padded position is priced at the target's default precision.
PADDING_PRECISION = "stage 3 runs before stage 4 chooses one, so the target's default precision"


def roofline_price(target: str, flops: float, activation_bytes: float | None = None,
                   basis: str = "counted on the graph") -> TokenPrice:
    """A padded position of `flops` FLOPs and `activation_bytes` bytes (None: not counted) at the roofline of the
    target's chip (PRICE_CHIPS; planning.budget.position_price) at PADDING_PRECISION; `basis` says where the
    figures came from."""
    from portkit.planning import budget
    from portkit.targets import capacity
    name = PRICE_CHIPS[target]
    family = capacity.chip(name, target)["family"]
    precision = budget.precision_of(target, None, PADDING_PRECISION)
    found = budget.position_price(flops, activation_bytes, name, family, precision)
    moved = f"{activation_bytes / 1e3:.0f} kB of activations" if activation_bytes is not None else "no bytes"
    return TokenPrice(target, found.seconds, ESTIMATE,
                      f"estimate, not measured: {flops / 1e6:.1f} MFLOPs and {moved} a position ({basis}) at "
                      f"{name}'s roofline, {found.bound}-bound: {found.peak_source}, "
                      f"{found.hbm_bytes_per_s / 1e9:.0f} GB/s HBM; at {found.precision}, {precision.said}",
                      flops=flops, activation_bytes=activation_bytes)


def padding_prices(model, targets, top: int) -> dict[str, TokenPrice]:
    """padding_price for each target, native where its device is present."""
    from portkit.targets import specs
    return {n: padding_price(model, n, top, native=specs.detect(n).native)
            for n in specs.parse_targets(targets)}


def price_of(prices, target: str):
    """A target's padding price from {target: TokenPrice or seconds}, or the one figure given for all."""
    return prices[target] if isinstance(prices, dict) else prices


def price_source(price) -> str:
    """Where a padding price came from: its source, or "parameter" for a bare number."""
    return price.source if isinstance(price, TokenPrice) else "parameter"


def prices_to_dict(prices) -> dict:
    """{target: TokenPrice.to_dict()} for a result file ({"all": {"seconds": ...}} for one bare figure)."""
    if not isinstance(prices, dict):
        return {"all": {"seconds": float(prices), "source": "parameter"}}
    return {n: p.to_dict() if isinstance(p, TokenPrice) else {"seconds": float(p), "source": "parameter"}
            for n, p in prices.items()}


def measure_token_seconds(model, top: int, repeats: int = 3) -> float:
    """Seconds of compute per token on this machine: the slope of eager forward time against
    sequence length (batch 1, lengths top/4, top/2, top; fastest_seconds). Prices padding for auto."""
    lengths = sorted({max(2, top // 4), max(2, top // 2), max(2, top)})
    # a short real text padded to each length; a model of other data: its declaration's probe inputs
    inputs = {n: model.encode(["Return the sum of a and b."], pad_to=n) if model.takes_text else
              model.declaration.dummy(1, {model.seq_dim: n}) for n in lengths}
    best = fastest_seconds(model.module, inputs, repeats)
    times = [best[n] for n in lengths]
    slope = float(np.polyfit(lengths, times, 1)[0]) if len(lengths) > 1 else times[0] / lengths[0]
    return max(slope, times[-1] / lengths[-1] / 10)   # noisy timings must not make padding free
