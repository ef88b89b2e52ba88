"""The bucket planner: sequence buckets fitted to a length histogram, and what they cost. Pure numpy.

    >>> from portkit.planning import planner
    >>> hist = planner.histogram([12, 40, 41, 300, 512], max_seq=512)
    >>> plan = planner.plan_buckets(hist, "optimal", k=2)          # least padded tokens with 2 buckets
    >>> prices = planner.Prices(compile_seconds=lambda seq: 2 + seq / 100, token_seconds=2e-4)
    >>> auto = planner.plan_buckets(hist, "auto", prices=prices, requests=100_000, budget_seconds=60)
    >>> print(auto.why)            # the k chosen, what it costs, whether the warm-up budget binds

Targets that compile one graph per input shape (TorchNeuron: awsdocs-neuron
torch/compile/reference-torch-compile.html; TorchTPU: torch_tpu _backend.py) pay one compile for every
distinct length (pytorch/xla#2422: 27 compiles in step 0); bucketing pads every input up to one of a few lengths.
Planners, one interface (`plan_buckets`, returning a `BucketPlan`): pow2 (NxD Inference's generate_buckets,
vLLM-TPU), linear (steps of `gap`), padding_bounded (padding under `pad_percent`, steps of at most
`max_step`: vllm-gaudi), optimal (least padded tokens for k buckets, exactly, by dynamic programming) and
auto (the k whose warm-up compiles plus padded compute cost least within a warm-up budget; the economics
are the caller's: portkit/planning/economics.py). Inputs longer than the largest bucket follow `overflow`:
"truncate" (counted in the plan) or "reject" (BadParameter). Imports numpy and portkit's foundations only;
the runtime side is portkit/stages/buckets/bucketed.py.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, replace

import numpy as np

from portkit.core.errors import BadParameter

OVERFLOW = ("truncate", "reject")
PLANNER_NAMES = ("pow2", "linear", "padding_bounded", "optimal", "auto")
K_MAX = 64                   # sanity bound on buckets auto and the padding curves consider (not the decision)
CURVE_K = 16                 # buckets the padding curves (sweep) are drawn up to
_DP_BLOCK = 1 << 22          # cells of the DP's cost matrix held at once (32 MiB of int64)


@dataclass(frozen=True)
class Histogram:
    """Distinct request lengths and their counts, after the overflow policy: what planners fit."""
    values: np.ndarray       # distinct lengths, ascending
    counts: np.ndarray       # how many requests have each length
    top: int                 # the largest bucket: the cap (model max_length) or the longest request
    overflow: str            # what happens to requests longer than top
    over: int                # requests longer than top (truncated to top, or rejected)
    source: str = ""

    @property
    def requests(self) -> int:
        return int(self.counts.sum())

    @property
    def real_tokens(self) -> int:
        return int((self.values * self.counts).sum())

    def to_dict(self) -> dict:
        return {"values": self.values.tolist(), "counts": self.counts.tolist(), "top": self.top,
                "overflow": self.overflow, "over_top": self.over, "requests": self.requests,
                "source": self.source}

    def __str__(self) -> str:
        verb = "truncated to" if self.overflow == "truncate" else "rejected (longer than"
        tail = f"{self.over} {verb} {self.top}" + ("" if self.overflow == "truncate" else ")")
        return (f"{self.requests} requests, {self.values.size} distinct lengths up to {self.top} tokens; "
                f"{tail}")


def histogram(lengths, max_seq: int | None = None, overflow: str = "truncate") -> Histogram:
    """The histogram planners work on. `lengths`: a data.LengthDistribution or an array of lengths.

    The largest bucket is min(max_seq, the model's max_length, the longest length): the model's
    max_length caps buckets, and no bucket is wider than the data needs."""
    if overflow not in OVERFLOW:
        raise BadParameter("overflow policy", overflow, OVERFLOW)
    source, cap = "lengths", None
    if hasattr(lengths, "lengths"):           # a data.LengthDistribution
        source, cap = f"{lengths.corpus} ({lengths.tokenizer} tokens)", lengths.max_length
        lengths = lengths.lengths
    arr = np.asarray(lengths, dtype=np.int64).ravel()
    if arr.size == 0 or arr.min() < 1:
        raise BadParameter("request lengths", f"{arr.size} values, min {arr.min() if arr.size else None}",
                           hint="give at least one length, every length >= 1 token")
    for limit in (cap, max_seq):
        if limit is not None:
            cap = limit if cap is None else min(cap, limit)
    top = int(arr.max()) if cap is None else min(int(cap), int(arr.max()))
    over = int((arr > top).sum())
    kept = np.minimum(arr, top) if overflow == "truncate" else arr[arr <= top]
    if kept.size == 0:
        raise BadParameter("request lengths", f"all {arr.size} longer than {top}",
                           hint="every request would be rejected; raise max_seq or use overflow='truncate'")
    top = int(kept.max())      # "reject" keeps no bucket wider than the longest request it serves
    counts = np.bincount(kept, minlength=top + 1)       # one pass, no sort: 1e6 lengths in ms
    values = np.flatnonzero(counts)
    return Histogram(values.astype(np.int64), counts[values].astype(np.int64), top, overflow, over, source)


# ---------------------------------------------------------------- plans
@dataclass(frozen=True)
class BucketPlan:
    """Sequence buckets (and batch buckets) with what they cost over a histogram."""
    planner: str
    boundaries: tuple[int, ...]              # ascending; the last is the histogram's top
    padded_tokens: int                       # padding added over the histogram (batch 1 per request)
    real_tokens: int
    requests: int
    overflow: str
    why: str
    batch_sizes: tuple[int, ...] = (1,)
    settings: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return len(self.boundaries)

    @property
    def top(self) -> int:
        return self.boundaries[-1]

    @property
    def compiles(self) -> int:
        """Graphs a static-shape target compiles to serve every shape of this plan."""
        return len(self.boundaries) * len(self.batch_sizes)

    @property
    def waste(self) -> float:
        """Share of the computed tokens that are padding."""
        total = self.padded_tokens + self.real_tokens
        return self.padded_tokens / total if total else 0.0

    def assign(self, lengths) -> np.ndarray:
        """The bucket every length lands in: the smallest boundary that holds it."""
        arr = np.asarray(lengths, dtype=np.int64)
        self._check_overflow(arr)
        return np.asarray(self.boundaries)[np.searchsorted(self.boundaries, np.minimum(arr, self.top))]

    def bucket_for(self, length: int) -> int:
        return int(self.assign([length])[0])

    def batch_for(self, rows: int) -> int:
        """The smallest batch bucket that holds `rows` requests."""
        index = int(np.searchsorted(self.batch_sizes, rows))
        if index == len(self.batch_sizes):
            raise BadParameter("batch size", rows, hint=f"the plan's largest batch bucket is "
                               f"{self.batch_sizes[-1]}; split the batch or plan with a larger max_batch")
        return self.batch_sizes[index]

    def _check_overflow(self, arr: np.ndarray) -> None:
        if self.overflow == "reject" and arr.size and arr.max() > self.top:
            raise BadParameter("input length", int(arr.max()),
                               hint=f"longer than the largest bucket ({self.top} tokens) and the overflow "
                                    "policy is 'reject'; plan with overflow='truncate' or a larger max_seq")

    def shapes(self) -> list[dict]:
        """Every input shape this plan compiles: what a per-shape check (stage 2's XLA compile) walks."""
        return [{"batch": b, "seq": s} for b in self.batch_sizes for s in self.boundaries]

    def with_batches(self, batch_sizes) -> "BucketPlan":
        return replace(self, batch_sizes=tuple(int(b) for b in batch_sizes))

    def to_dict(self) -> dict:
        return {"planner": self.planner, "boundaries": list(self.boundaries),
                "batch_sizes": list(self.batch_sizes), "why": self.why, "shapes": self.shapes(),
                "compiles": self.compiles, "padded_tokens": self.padded_tokens,
                "real_tokens": self.real_tokens, "padding_waste": self.waste, "overflow": self.overflow,
                "settings": self.settings}

    def __str__(self) -> str:
        batches = f" x batch {list(self.batch_sizes)}" if self.batch_sizes != (1,) else ""
        return (f"{self.planner}: {plural(self.k, 'bucket')} {list(self.boundaries)}{batches}, "
                f"{self.waste:.1%} padding, {plural(self.compiles, 'compile')}")


def plural(count: int, noun: str) -> str:
    """A count with its noun: "3 buckets", "1 compile"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def padded_tokens(boundaries, hist: Histogram) -> int:
    """Padding tokens when every request of the histogram goes to its smallest holding bucket."""
    b = np.asarray(sorted(boundaries), dtype=np.int64)
    if b[-1] < hist.top:
        raise BadParameter("bucket boundaries", list(b), hint=f"the largest must hold {hist.top} tokens")
    return int(((b[np.searchsorted(b, hist.values)] - hist.values) * hist.counts).sum())


def _plan(name: str, boundaries, hist: Histogram, why: str, **settings) -> BucketPlan:
    b = tuple(sorted({int(x) for x in boundaries}))
    return BucketPlan(name, b, padded_tokens(b, hist), hist.real_tokens, hist.requests, hist.overflow,
                      why, settings=settings)


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise BadParameter("number of buckets k", k, hint="must be a whole number >= 1")
    return k


def plan_pow2(hist: Histogram, k: int | None = None, minimum: int = 128) -> BucketPlan:
    """Powers of two from `minimum` up to the top, plus the top; with k: the k-1 largest powers
    of two below the top, plus the top. The default minimum is NxD Inference's: its context-encoding
    buckets are generate_buckets(128, max_context_length) when bucketing is on."""
    powers = [1 << e for e in range(0, hist.top.bit_length()) if (1 << e) < hist.top]
    if k is None:
        chosen = [p for p in powers if p >= minimum]
        why = f"powers of two from {minimum} to {hist.top}, plus {hist.top}"
    else:
        chosen = powers[len(powers) - min(_check_k(k) - 1, len(powers)):]
        why = f"the {len(chosen)} largest powers of two below {hist.top}, plus {hist.top}"
    return _plan("pow2", [*chosen, hist.top], hist, why, minimum=minimum, k=k)


def plan_linear(hist: Histogram, k: int | None = None, gap: int = 64) -> BucketPlan:
    """Every `gap` tokens up to the top; with k: gap = ceil(top / k)."""
    if k is not None:
        gap = math.ceil(hist.top / _check_k(k))
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 1:
        raise BadParameter("linear bucket gap", gap, hint="must be a whole number of tokens >= 1")
    return _plan("linear", [*range(gap, hist.top, gap), hist.top], hist,
                 f"steps of {gap} tokens up to {hist.top}", gap=gap, k=k)


def _ramp(top: int, pad: float, minimum: int, max_step: int) -> list[int]:
    # A request one token longer than bucket b lands in b'; its padding share (b' - b - 1) / b'
    # stays <= pad while b' <= (b + 1) / (1 - pad): geometric growth, capped at max_step tokens.
    out = [min(minimum, top)]
    while out[-1] < top:
        b = out[-1]
        out.append(min(top, max(b + 1, min(math.floor((b + 1) / (1 - pad)), b + max_step))))
    return out


def plan_padding_bounded(hist: Histogram, k: int | None = None, pad_percent: float = 25.0,
                         minimum: int = 16, max_step: int = 128) -> BucketPlan:
    """Geometric growth keeping each request's padding under pad_percent % of its bucket, then
    linear steps of max_step tokens; requests shorter than `minimum` go to the first bucket.
    With k: the smallest pad_percent (in 0.5% steps) that needs at most k buckets."""
    if not 0 < pad_percent < 100:
        raise BadParameter("pad_percent", pad_percent, hint="must be between 0 and 100")
    if k is not None:
        _check_k(k)
        if k == 1:
            return _plan("padding_bounded", [hist.top], hist, f"one bucket of {hist.top}", k=1)
        # k - 1 steps after the first bucket must be able to reach the top
        max_step = max(max_step, math.ceil((hist.top - min(minimum, hist.top)) / (k - 1)))
        grid = np.arange(0.5, 99.5, 0.5)
        fits = [p for p in grid if len(_ramp(hist.top, p / 100, minimum, max_step)) <= k]
        pad_percent = float(fits[0]) if fits else 99.0
    bounds = _ramp(hist.top, pad_percent / 100, minimum, max_step)
    return _plan("padding_bounded", bounds, hist,
                 f"padding under {pad_percent:g}% per request above {minimum} tokens, steps of at most "
                 f"{max_step}", pad_percent=pad_percent, minimum=minimum, max_step=max_step, k=k)


def optimal_table(hist: Histogram, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact least padded tokens for every k <= k_max, by dynamic programming over the m distinct
    lengths: best[t, j] = least padding covering the j shortest lengths with t buckets, the last at
    values[j-1]. A boundary never needs to sit between two observed lengths (moving it down to the
    longest length it holds only removes padding), so the search over distinct lengths is exact.
    Returns (padding[t] for t = 0..K, argmin table for the boundaries). O(K m^2), in int64."""
    v, c = hist.values, hist.counts
    m = v.size
    K = min(_check_k(k_max), m)
    C = np.concatenate(([0], np.cumsum(c)))          # requests among the j shortest lengths
    S = np.concatenate(([0], np.cumsum(c * v)))      # their real tokens
    big = np.iinfo(np.int64).max // 4
    best = np.full((K + 1, m + 1), big, dtype=np.int64)
    arg = np.zeros((K + 1, m + 1), dtype=np.int64)
    best[0, 0] = 0
    i = np.arange(m + 1)[:, None]
    block = max(1, _DP_BLOCK // (m + 1))
    for t in range(1, K + 1):
        # cost of a bucket covering lengths i..j-1 at boundary v[j-1]: v[j-1] (C[j] - C[i]) - (S[j] - S[i])
        prev = best[t - 1][:, None]
        for start in range(1, m + 1, block):
            j = np.arange(start, min(m, start + block - 1) + 1)[None, :]
            cand = prev + v[j - 1] * (C[j] - C[i]) - (S[j] - S[i])
            cand = np.where(i < j, cand, big)
            arg[t, j[0]] = cand.argmin(axis=0)
            best[t, j[0]] = np.minimum(cand.min(axis=0), big)
    return best[:, m], arg


def optimal_boundaries(hist: Histogram, arg: np.ndarray, k: int) -> list[int]:
    out, j = [], hist.values.size
    for t in range(k, 0, -1):
        out.append(int(hist.values[j - 1]))
        j = int(arg[t, j])
    return out[::-1]


def plan_optimal(hist: Histogram, k: int = 4) -> BucketPlan:
    """The k boundaries with the least padded tokens over the histogram (exact)."""
    k = min(_check_k(k), hist.values.size)
    padding, arg = optimal_table(hist, k)
    return _plan("optimal", optimal_boundaries(hist, arg, k), hist,
                 f"least padded tokens over {hist.requests} requests with {k} buckets (exact DP over "
                 f"{hist.values.size} distinct lengths)", k=k)


@dataclass(frozen=True)
class Prices:
    """What plan_auto weighs, each figure with where it came from (said in the plan's `why`).

    compile_seconds: one shape's compile time, a number or a function of its sequence length (a cost model,
    portkit/planning/economics.py); token_seconds: what a padded position costs on the target
    (economics.padding_price)."""
    compile_seconds: object              # a number, or a function of the sequence length
    token_seconds: float
    compile_source: str = "parameter"
    price_source: str = "parameter"


def plan_auto(hist: Histogram, prices: Prices, requests: int | None = None, k_max: int = K_MAX,
              batch_buckets: int = 1, budget_seconds: float | None = None) -> BucketPlan:
    """Choose k by minimising  warm-up compile time  +  padded tokens x prices.token_seconds  over
    `requests` served (default: the histogram's own count), with each k's exact least-padding boundaries.

    Warm-up compiles every boundary at each of `batch_buckets` batch sizes, at prices.compile_seconds
    each. budget_seconds bounds the warm-up: where the unbounded optimum does not fit, the best k that
    does is chosen and `why` says that the budget binds. k_max is a sanity bound on the search (it is
    named in `why` if it binds), not the decision."""
    compile_seconds, token_seconds = prices.compile_seconds, prices.token_seconds
    compile_source, price_source = prices.compile_source, prices.price_source
    per_shape = compile_seconds if callable(compile_seconds) else (lambda seq: float(compile_seconds))
    requests = hist.requests if requests is None else requests
    padding, arg = optimal_table(hist, k_max)
    ks = np.arange(1, padding.size)
    bounds = {int(k): optimal_boundaries(hist, arg, int(k)) for k in ks}
    warmup = np.array([batch_buckets * sum(per_shape(b) for b in bounds[int(k)]) for k in ks])
    pad_cost = padding[1:] * (requests / hist.requests) * token_seconds
    total = warmup + pad_cost
    best = int(ks[total.argmin()])
    fits = warmup <= budget_seconds if budget_seconds is not None else np.ones(ks.size, bool)
    # A budget even one bucket exceeds is what the target's compiler measured, not bad input: the plan takes
    # the fewest compiles (one bucket) and says by how much the budget is missed, and the stage goes on.
    exceeded = not fits.any()
    k = 1 if exceeded else int(ks[np.where(fits, total, np.inf).argmin()])

    def cost(kk: int) -> str:
        return f"k={kk}: {warmup[kk - 1]:.1f} s warm-up + {pad_cost[kk - 1]:.1f} s padding = {total[kk - 1]:.1f} s"
    near = [cost(kk) for kk in (k - 1, k + 1) if 1 <= kk <= ks[-1]]
    why = (f"k={k} minimises warm-up compile + padded compute for {requests:,} requests: {k} x {batch_buckets} "
           f"shape(s) compiled in {warmup[k - 1]:.1f} s ({compile_source}), plus "
           f"{padding[k] * requests / hist.requests:,.0f} padded tokens x {token_seconds * 1e6:.3g} us "
           f"({price_source}) = "
           f"{pad_cost[k - 1]:.1f} s; total {total[k - 1]:.1f} s" + (f" (vs {'; '.join(near)})" if near else ""))
    if exceeded:
        why += (f". The warm-up budget of {budget_seconds:g} s cannot be met: one bucket alone takes "
                f"{warmup[0]:.1f} s ({compile_source}), so the plan takes the fewest compiles; without the budget, "
                f"{cost(best)} would be cheapest")
    elif k != best:
        why += (f". The warm-up budget of {budget_seconds:g} s binds: without it, {cost(best)} would be "
                "cheapest")
    elif budget_seconds is not None:
        why += f". The warm-up budget of {budget_seconds:g} s does not bind"
    if best == int(ks[-1]) and ks[-1] < hist.values.size:
        why += f". The search's sanity bound k_max={k_max} binds: more buckets may pay for themselves"
    plan = _plan("auto", bounds[k], hist, why, k=k, requests=requests, k_max=k_max, compile_source=compile_source,
                 token_seconds=token_seconds, price_source=price_source, budget_seconds=budget_seconds)
    return replace(plan, settings={**plan.settings, "compile_seconds": float(warmup[k - 1] / (k * batch_buckets)),
                                   "warmup_seconds": float(warmup[k - 1]),
                                   "budget_binds": k != best or exceeded,
                                   "budget_exceeded": exceeded, "unbounded": {"k": best, "boundaries": bounds[best],
                                                                           "warmup_seconds": float(warmup[best - 1]),
                                                                           "total_seconds": float(total[best - 1])},
                                   "cost_by_k": {int(kk): float(total[kk - 1]) for kk in ks},
                                   "warmup_by_k": {int(kk): float(warmup[kk - 1]) for kk in ks}})


PLANNERS = {"pow2": plan_pow2, "linear": plan_linear, "padding_bounded": plan_padding_bounded,
            "optimal": plan_optimal, "auto": plan_auto}


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes as a second bucketed dimension: powers of two up to max_batch, plus max_batch."""
    return tuple(sorted({*(1 << e for e in range(max_batch.bit_length()) if (1 << e) < max_batch), max_batch}))


def plan_buckets(lengths, planner: str = "optimal", *, max_seq: int | None = None, overflow: str = "truncate",
                 max_batch: int = 1, **settings) -> BucketPlan:
    """One interface for every planner. `lengths`: a Histogram, a data.LengthDistribution or an array.
    settings go to the planner (k, minimum, gap, pad_percent, prices, ...)."""
    if planner not in PLANNERS:
        raise BadParameter("planner", planner, PLANNER_NAMES)
    hist = lengths if isinstance(lengths, Histogram) else histogram(lengths, max_seq, overflow)
    try:
        inspect.signature(PLANNERS[planner]).bind(hist, **settings)
    except TypeError as exc:   # an option this planner does not take, or one it needs
        raise BadParameter(f"options for planner {planner}", sorted(settings),
                           hint=f"{exc}; see help(portkit.planning.planner.plan_{planner})") from None
    batches = batch_buckets(max_batch)
    if planner == "auto":
        settings.setdefault("batch_buckets", len(batches))
    return PLANNERS[planner](hist, **settings).with_batches(batches)


def compare(hist: Histogram, k: int, max_batch: int = 1) -> list[BucketPlan]:
    """Every fixed-k planner at the same number of buckets."""
    return [plan_buckets(hist, name, k=k, max_batch=max_batch) for name in PLANNER_NAMES if name != "auto"]


def sweep(hist: Histogram, k_max: int = CURVE_K) -> dict[str, list[tuple[int, float]]]:
    """Padding waste against the number of buckets, for every fixed-k planner: {planner: [(k, waste)]}."""
    padding, _ = optimal_table(hist, k_max)
    total = lambda p: p / (p + hist.real_tokens)   # noqa: E731
    out = {"optimal": [(k, total(int(padding[k]))) for k in range(1, padding.size)]}
    for name in ("pow2", "linear", "padding_bounded"):
        seen = {}
        for k in range(1, k_max + 1):
            plan = PLANNERS[name](hist, k=k)
            seen.setdefault(plan.k, plan.waste)     # a planner may not reach every k exactly
        out[name] = sorted(seen.items())
    return out
