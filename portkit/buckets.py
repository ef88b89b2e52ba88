"""Stage 3, shape bucketing: fit sequence buckets to the real length distribution, and prove that
nothing recompiles once every bucket is warm.

    >>> from portkit import buckets, data, models
    >>> m, corpus = models.load("minilm"), data.load_corpus()
    >>> dist = buckets.distribution(corpus, m)                      # the model's own tokenizer
    >>> hist = buckets.histogram(dist)                              # distinct lengths, capped at max_length
    >>> plan = buckets.plan_buckets(hist, "optimal", k=4)           # least padded tokens with 4 buckets
    >>> plan.boundaries, f"{plan.waste:.1%}"
    ((32, 91, 215, 512), '39.2%')
    >>> auto = buckets.plan_buckets(hist, "auto", compile_seconds=9.0, token_seconds=2e-4, requests=10_000)
    >>> print(auto.why)
    >>> report = buckets.fit_buckets(m, corpus, ["neuron", "tpu"], out_dir="runs/minilm", requests=24)
    >>> report.save("runs/minilm/buckets.json")    # targets[t]["chosen"]: planner, boundaries, shapes, why

Targets that compile one graph per input shape (TorchNeuron: awsdocs-neuron
torch/compile/reference-torch-compile.html; TorchTPU: torch_tpu _backend.py) pay one compile
for every distinct length they see (pytorch/xla#2422: 27 compiles in step 0). Bucketing pads every
input up to one of a few lengths. Planners, one interface (`plan_buckets`), each returning a
`BucketPlan`:

- pow2: powers of two from a minimum up to the maximum, plus the maximum (NxD Inference's
  generate_buckets(128, max_length), transformers-neuronx, vLLM-TPU);
- linear: fixed steps of `gap` tokens;
- padding_bounded: geometric growth that keeps every request's padding under `pad_percent`, then
  linear steps of at most `max_step` (vllm-gaudi's pad_percent / pad_max ramps);
- optimal: for k buckets, the boundaries with the least padded tokens over the histogram, exactly
  (dynamic programming over the distinct lengths);
- auto: the k that minimises compile time (k buckets x batch sizes x the measured compile seconds,
  from stage 2's compile.json) plus the compute spent on padding over the expected requests.

Inputs longer than the largest bucket follow the plan's `overflow` policy: "truncate" (cut to the
largest bucket, counted in the plan) or "reject" (a BadParameter naming the length). The runtime
side (padding, compiling, replaying, checking outputs) is in portkit/bucketed.py.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from portkit.errors import BadParameter

STAGE = "buckets"
OVERFLOW = ("truncate", "reject")
PLANNER_NAMES = ("pow2", "linear", "padding_bounded", "optimal", "auto")
K_MAX = 16                   # most buckets auto and the padding curves consider
SERVE_REQUESTS = 100_000     # requests a chosen plan is priced for: a deployment's traffic, not the replay
_DP_BLOCK = 1 << 22          # cells of the DP's cost matrix held at once (32 MiB of int64)


# ---------------------------------------------------------------- the distribution
def distribution(corpus, model):
    """Token lengths of every text in the corpus under the model's own tokenizer
    (data.length_distribution), with a clear error for models that take no text."""
    from portkit import data
    if not model.takes_text:
        raise BadParameter("model for shape bucketing", model.name,
                           hint="it takes fixed-size images: one input shape and one compile, nothing to "
                                "bucket; leave this stage out (portkit run --stages ...)")
    return data.length_distribution(corpus, model)


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
        return (f"{self.planner}: {_n(self.k, 'bucket')} {list(self.boundaries)}{batches}, "
                f"{self.waste:.1%} padding, {_n(self.compiles, 'compile')}")


def _n(count: int, noun: str) -> str:
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


def _boundaries(hist: Histogram, arg: np.ndarray, k: int) -> list[int]:
    out, j = [], hist.values.size
    for t in range(k, 0, -1):
        out.append(int(hist.values[j - 1]))
        j = int(arg[t, j])
    return out[::-1]


def plan_optimal(hist: Histogram, k: int = 4) -> BucketPlan:
    """The k boundaries with the least padded tokens over the histogram (exact)."""
    k = min(_check_k(k), hist.values.size)
    padding, arg = optimal_table(hist, k)
    return _plan("optimal", _boundaries(hist, arg, k), hist,
                 f"least padded tokens over {hist.requests} requests with {k} buckets (exact DP over "
                 f"{hist.values.size} distinct lengths)", k=k)


def plan_auto(hist: Histogram, compile_seconds: float, token_seconds: float, requests: int | None = None,
              k_max: int = K_MAX, batch_buckets: int = 1, compile_source: str = "parameter") -> BucketPlan:
    """Choose k by minimising  k x batch_buckets x compile_seconds  +  padded tokens x token_seconds,
    the padding scaled to `requests` served (default: the histogram's own count); then the optimal
    boundaries for that k."""
    requests = hist.requests if requests is None else requests
    padding, arg = optimal_table(hist, k_max)
    ks = np.arange(1, padding.size)
    compile_cost = ks * batch_buckets * compile_seconds
    pad_cost = padding[1:] * (requests / hist.requests) * token_seconds
    total = compile_cost + pad_cost
    k = int(ks[total.argmin()])
    near = [f"k={kk}: {total[kk - 1]:.1f} s" for kk in (k - 1, k + 1) if 1 <= kk <= ks[-1]]
    why = (f"k={k} minimises compile + padded compute for {requests} requests: {k} x {batch_buckets} "
           f"shape(s) x {compile_seconds:.2f} s compile ({compile_source}) = {compile_cost[k - 1]:.1f} s, "
           f"plus {padding[k] * requests / hist.requests:,.0f} padded tokens x {token_seconds * 1e6:.1f} us "
           f"= {pad_cost[k - 1]:.1f} s; total {total[k - 1]:.1f} s"
           + (f" (vs {', '.join(near)})" if near else ""))
    plan = _plan("auto", _boundaries(hist, arg, k), hist, why, k=k, compile_seconds=compile_seconds,
                 token_seconds=token_seconds, requests=requests, k_max=k_max, compile_source=compile_source)
    return replace(plan, settings={**plan.settings, "cost_by_k": {int(kk): float(total[kk - 1]) for kk in ks}})


PLANNERS = {"pow2": plan_pow2, "linear": plan_linear, "padding_bounded": plan_padding_bounded,
            "optimal": plan_optimal, "auto": plan_auto}


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes as a second bucketed dimension: powers of two up to max_batch, plus max_batch."""
    return tuple(sorted({*(1 << e for e in range(max_batch.bit_length()) if (1 << e) < max_batch), max_batch}))


def plan_buckets(lengths, planner: str = "optimal", *, max_seq: int | None = None, overflow: str = "truncate",
                 max_batch: int = 1, **settings) -> BucketPlan:
    """One interface for every planner. `lengths`: a Histogram, a data.LengthDistribution or an array.
    settings go to the planner (k, minimum, gap, pad_percent, compile_seconds, ...)."""
    if planner not in PLANNERS:
        raise BadParameter("planner", planner, PLANNER_NAMES)
    hist = lengths if isinstance(lengths, Histogram) else histogram(lengths, max_seq, overflow)
    try:
        inspect.signature(PLANNERS[planner]).bind(hist, **settings)
    except TypeError as exc:   # an option this planner does not take, or one it needs
        raise BadParameter(f"options for planner {planner}", sorted(settings),
                           hint=f"{exc}; see help(portkit.buckets.plan_{planner})") from None
    batches = batch_buckets(max_batch)
    if planner == "auto":
        settings.setdefault("batch_buckets", len(batches))
    return PLANNERS[planner](hist, **settings).with_batches(batches)


def compare(hist: Histogram, k: int, max_batch: int = 1) -> list[BucketPlan]:
    """Every fixed-k planner at the same number of buckets."""
    return [plan_buckets(hist, name, k=k, max_batch=max_batch) for name in PLANNER_NAMES if name != "auto"]


def sweep(hist: Histogram, k_max: int = K_MAX) -> dict[str, list[tuple[int, float]]]:
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


# ---------------------------------------------------------------- costs a plan is priced with
def compile_cost(target: str, out_dir, default: float) -> tuple[float, str]:
    """Seconds one bucket's compile costs on a target: stage 2's measured median
    (compile.json in out_dir: targets[t]["compile_seconds"]["median"]), else `default`."""
    from portkit._io import read_json
    try:
        entry = read_json(Path(out_dir) / "compile.json")["targets"][target]
        seconds, mode = float(entry["compile_seconds"]["median"]), entry.get("target", {}).get("mode", "?")
        count, hits = entry["compile_seconds"].get("count", "?"), entry["compile_seconds"].get("cache_hits", 0)
    except (OSError, ValueError, KeyError, TypeError):
        return float(default), "parameter compile_seconds; no compile.json for this target in out_dir"
    source = f"stage 2's compile.json: median backend time of {count} {mode} compiles"
    if hits and hits == count:   # stage 2 ran on a warm Inductor cache: not what a fresh compile costs
        source += ", all Inductor cache hits (a warm-cache time; run stage 2 on a cold cache for a cold one)"
    return seconds, source


def choose(hist: Histogram, targets, out_dir, compile_seconds: float, token_seconds: float,
           serve_requests: int = SERVE_REQUESTS, k_max: int = K_MAX, max_batch: int = 1) -> dict[str, BucketPlan]:
    """The auto plan for every target, each priced with that target's own compile time, for
    serve_requests requests. The one place a plan is chosen: fit_buckets and the notebook call it alike."""
    chosen = {}
    for name in targets:
        seconds, source = compile_cost(name, out_dir, compile_seconds)
        chosen[name] = plan_buckets(hist, "auto", compile_seconds=seconds, token_seconds=token_seconds,
                                    requests=serve_requests, k_max=k_max, max_batch=max_batch,
                                    compile_source=source)
        print(f"target {name}: using buckets {list(chosen[name].boundaries)}"
              f"{'' if max_batch == 1 else f' x batch {list(chosen[name].batch_sizes)}'}: {chosen[name].why}")
    return chosen


# ---------------------------------------------------------------- plots and the slider
PLANNER_COLORS = {"pow2": "#4C72B0", "linear": "#8C8C8C", "padding_bounded": "#DD8452", "optimal": "#55A868",
                  "auto": "#C44E52"}


def plot_padding(curves: dict, chosen: dict[str, BucketPlan] | None = None, k: int | None = None, ax=None):
    """Padding waste (%) against the number of buckets for every planner; chosen plans starred."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], "o-", ms=3, label=name,
                color=PLANNER_COLORS.get(name))
    for target, plan in (chosen or {}).items():
        ax.plot([plan.k], [100 * plan.waste], "*", ms=16, color=PLANNER_COLORS["auto"], mec="black",
                label=f"chosen for {target}: {plan.k} buckets")
    if k is not None:
        ax.axvline(k, color="black", lw=0.8, ls=":")
    ax.set_xlabel("number of sequence buckets (compiles per batch size)")
    ax.set_ylabel("padding (% of computed tokens)")
    ax.set_title("Padding waste against the number of buckets")
    ax.legend(fontsize=7)
    return ax


def plot_histogram(hist: Histogram, plans: list[BucketPlan], ax=None):
    """The length histogram with each plan's boundaries drawn over it."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    ax.bar(hist.values, hist.counts, width=1.0, color="#B0B0B0")
    ax.set_yscale("log")
    for i, plan in enumerate(plans):
        for j, b in enumerate(plan.boundaries):
            ax.axvline(b, color=PLANNER_COLORS.get(plan.planner), lw=1.2, ls=("-", "--", ":")[i % 3],
                       label=f"{plan.planner}: {plan.waste:.1%} padding" if j == 0 else None)
    ax.set_xlabel("tokens per request")
    ax.set_ylabel("requests (log)")
    ax.set_title(f"{hist.requests} requests and their buckets")
    ax.legend(fontsize=7)
    return ax


def draw_buckets(hist: Histogram, k: int, curves: dict):
    """Histogram with the k-bucket plans of pow2 and optimal, beside the padding curves at k."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.6))
    plot_histogram(hist, [plan_buckets(hist, "pow2", k=k), plan_buckets(hist, "optimal", k=k)], axes[0])
    plot_padding(curves, k=k, ax=axes[1])
    fig.tight_layout()
    return fig


def padding_slider(hist: Histogram, curves: dict, k: int = 4):
    """An ipywidgets slider for the number of buckets that redraws draw_buckets. Headless runs
    (papermill, nbval: PORTKIT_HEADLESS=1, set by the runner and the tests) and plain Python get None."""
    import os
    try:
        import ipywidgets
        from IPython import get_ipython
    except ImportError:
        print("ipywidgets is not installed: the slider is skipped")
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel") or os.environ.get("PORTKIT_HEADLESS"):
        print("headless run: the slider is skipped (open the notebook in JupyterLab to use it)")
        return None
    import matplotlib.pyplot as plt

    def redraw(buckets: int):
        draw_buckets(hist, buckets, curves)
        plt.show()
    k_max = max(p[0] for points in curves.values() for p in points)
    return ipywidgets.interactive(redraw, buckets=ipywidgets.IntSlider(value=min(k, k_max), min=1, max=k_max,
                                                                       description="buckets"))


# ---------------------------------------------------------------- the stage's result
@dataclass
class TargetBuckets:
    """One target's chosen plan and its replays."""
    target: dict                  # DetectedTarget.to_dict()
    backend: str                  # the torch.compile backend the replays used
    backend_note: str
    chosen: BucketPlan
    compile_seconds: float        # per bucket, what auto priced a compile at
    compile_source: str
    runs: list = field(default_factory=list)      # bucketed.ReplayRun, the first without buckets

    @property
    def name(self) -> str:
        return self.target["name"]

    def run_for(self, plan: BucketPlan):
        return _run_for(self.runs, plan)

    def summary(self) -> str:
        mode = self.target["mode"]
        text = (f"{self.name} ({mode}, {self.backend}): {_n(self.chosen.k, 'bucket')} {list(self.chosen.boundaries)}, "
                f"{self.chosen.waste:.1%} padding over the corpus")
        mine, base = self.run_for(self.chosen), next((r for r in self.runs if r.plan is None), None)
        if mine is not None:
            text += (f"; replay of {mine.requests} requests: {_n(mine.compiles, 'compile')}, "
                     f"{mine.compiles_after_warmup} after warm-up")
            if base is not None:
                text += (f", {base.total_seconds / mine.total_seconds:.1f}x faster than no buckets "
                         f"({base.compiles} compiles)")
            checks = [r.padding_ok for r in self.runs if r.padding_ok is not None]
            text += f"; padding check {'passed' if all(checks) else 'FAILED'}" if checks else ""
        return text

    def __str__(self) -> str:
        return self.summary()

    __repr__ = __str__

    def findings(self) -> list[dict]:
        """This stage's findings in the report's terms (severity, message, advice)."""
        out = []
        failed = [r for r in self.runs if r.padding_ok is False]
        if failed:
            out.append({"kind": "padding", "severity": "blocker",
                        "message": f"padding to a bucket changes the outputs at real positions ({failed[0].name})",
                        "advice": "the model does not mask padded positions: fix the attention mask handling "
                                  "before bucketing (cf. vllm-project/tpu-inference#3466)"})
        late = sum(r.compiles_after_warmup for r in self.runs)
        if late:
            run = next(r for r in self.runs if r.compiles_after_warmup)
            first = (run.late_compiles or [{}])[0]
            where = (f"request {first['request'] + 1}" if first.get("request") is not None else "the padding check")
            shape = "x".join(map(str, first.get("shape") or ())) or "?"
            out.append({"kind": "recompile_after_warmup", "severity": "work",
                        "message": f"{late} compiles after warm-up under the bucket plan; first in {run.name}: "
                                   f"{where}, shape {shape}, guard failure: {first.get('reason', '?')}",
                        "advice": "a shape the warm-up did not compile reached the model: warm up every "
                                  "(batch, seq) bucket and pad every input the model takes to one of them"})
        mine = self.run_for(self.chosen)
        out.append({"kind": "bucket_plan", "severity": "info",
                    "message": f"use {self.chosen.planner} buckets {list(self.chosen.boundaries)}"
                               + (f" x batch {list(self.chosen.batch_sizes)}" if self.chosen.batch_sizes != (1,) else "")
                               + f": {self.chosen.waste:.1%} padding, {_n(self.chosen.compiles, 'compile')}"
                               + (f", {mine.compiles_after_warmup} after warm-up in the replay" if mine else ""),
                    "advice": self.chosen.why})
        return out

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "backend": self.backend,
                "findings": self.findings(),
                "backend_note": self.backend_note, "chosen": self.chosen.to_dict(),
                "compile_seconds_per_bucket": {"value": self.compile_seconds, "source": self.compile_source},
                "compiles_after_warmup": sum(r.compiles_after_warmup for r in self.runs),
                "padding_ok": all(r.padding_ok for r in self.runs if r.padding_ok is not None),
                "replay": [r.to_dict() for r in self.runs]}


@dataclass
class BucketReport:
    """Stage 3's result: the distribution, the planners side by side, and per target the chosen
    plan with its replays."""
    model: dict
    distribution: dict
    histogram: Histogram
    k: int
    plans: list[BucketPlan]
    curves: dict
    token_seconds: float
    trace: dict
    targets: dict[str, TargetBuckets]

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def to_dict(self) -> dict:
        return {"stage": STAGE, "model": self.model, "summary": self.summary(),
                "distribution": {**self.distribution, "histogram": self.histogram.to_dict()},
                "k": self.k, "plans": [p.to_dict() for p in self.plans],
                "padding_by_buckets": {n: [{"k": k, "padding_waste": w} for k, w in pts]
                                       for n, pts in self.curves.items()},
                "token_seconds": self.token_seconds, "trace": self.trace,
                "targets": {n: t.to_dict() for n, t in self.targets.items()}}

    def save(self, path) -> None:
        from portkit.results import save_result
        save_result(path, self.to_dict())

    def table(self, target: str | None = None):
        """Per replay run: compiles, padding, compile/run/total time, requests per second."""
        from portkit.fallbacks import HtmlTable
        t = self.targets[target or next(iter(self.targets))]
        rows = [[r.name + (" (chosen)" if r.plan == t.chosen.to_dict() else ""),
                 "-" if r.plan is None else str(r.plan["boundaries"]), r.compiles, r.compiles_after_warmup,
                 f"{r.waste:.1%}", f"{r.compile_seconds:.1f}", f"{r.run_seconds:.2f}", f"{r.total_seconds:.1f}",
                 f"{r.requests_per_second:.2f}",
                 {None: "-", True: "ok", False: "FAILED"}[r.padding_ok]] for r in t.runs]
        return HtmlTable(["run", "buckets", "compiles", "after warm-up", "padding", "compile s", "run s",
                          "total s", "requests/s", "padding check"], rows,
                         f"{t.name} ({t.target['mode']}), backend {t.backend}: replay of {self.trace['requests']} "
                         "requests")

    def padding_table(self):
        """Per target, plan and bucket shape: the padding check against unpadded eager outputs."""
        from portkit.fallbacks import HtmlTable
        rows = []
        for t in self.targets.values():
            for r in t.runs:
                for c in r.padding_checks:
                    rows.append([t.name, f"{r.name} [{r.backend}]", f"{c['batch']} x {c['seq']}",
                                 ", ".join(map(str, c["lengths"])), f"{c['max_abs_error']:.1e}",
                                 f"{c['rtol']:g} / {c['atol']:g}", "ok" if c["ok"] else "FAILED: " + c["failures"][0]])
        return HtmlTable(["target", "plan [backend]", "bucket (batch x seq)", "real lengths", "max abs error",
                          "rtol / atol", "result"], rows,
                         "outputs at real positions, padded and compiled, vs unpadded eager under the same numerics")

    def plot(self):
        """Padding against buckets (chosen plans starred), and each run's compile + run time."""
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(13, 3.8))
        plot_padding(self.curves, {n: t.chosen for n, t in self.targets.items()}, self.k, axes[0])
        t = next(iter(self.targets.values()))
        names = [r.name for r in t.runs]
        axes[1].barh(names, [r.compile_seconds for r in t.runs], color="#C44E52", label="compile")
        axes[1].barh(names, [r.run_seconds for r in t.runs], left=[r.compile_seconds for r in t.runs],
                     color="#4C72B0", label="run")
        axes[1].set_xlabel("seconds")
        axes[1].set_title(f"{t.name} ({t.target['mode']}, {t.backend}): replay of {self.trace['requests']} requests")
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        return fig

    def __str__(self) -> str:
        lines = [f"Shape buckets for {self.model['name']}: {self.distribution.get('count')} texts, p50 "
                 f"{self.distribution.get('p50')}, p99 {self.distribution.get('p99')}, max "
                 f"{self.distribution.get('max')}; {self.histogram}"]
        lines += ["  " + str(p) for p in self.plans]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            lines += ["    " + str(r) for r in t.runs]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        parts = [f"<p><b>Shape buckets</b> for <code>{html.escape(self.model['name'])}</code>: "
                 f"{html.escape(str(self.histogram))}</p>"]
        for t in self.targets.values():
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{t.target['mode']}</i></h4>"
                         f"<p>{html.escape(t.summary())}</p><p><i>why:</i> {html.escape(t.chosen.why)}</p>"
                         + self.table(t.name)._repr_html_())
        return "\n".join(parts)


# ---------------------------------------------------------------- the stage's verbs
def check_parameters(requests: int = 6, bucket_count: int = 2, max_batch: int = 1, max_seq: int = 512,
                     overflow: str = "truncate", compile_seconds: float = 10.0, k_max: int = K_MAX, seed: int = 0,
                     serve_requests: int = SERVE_REQUESTS,
                     corpus: str = "stdlib", backend: str = "auto", check: bool = True,
                     compare_every_target: bool = False, targets=("neuron", "tpu")) -> None:
    """The notebook's validation cell, also run by the runner before anything is written."""
    from portkit import data, params
    params.positive_int("requests", requests)
    params.positive_int("bucket_count", bucket_count, maximum=64)
    params.positive_int("max_batch", max_batch, maximum=1024)
    params.positive_int("max_seq", max_seq)
    params.choice("overflow", overflow, OVERFLOW)
    params.positive_float("compile_seconds", compile_seconds)
    params.positive_int("k_max", k_max, maximum=64)
    params.positive_int("serve_requests", serve_requests)
    params.non_negative_int("seed", seed)
    params.boolean("check", check)
    params.boolean("compare_every_target", compare_every_target)
    data.check_corpus(corpus)
    from portkit import compiling, targets as targets_mod
    if not isinstance(backend, str):
        raise BadParameter("backend", backend, hint="give a backend name, or 'auto'")
    for name in targets_mod.parse_targets(targets):
        compiling.check_backend(targets_mod.detect(name), backend)   # stage 2's rule: one line, valid names


def replay_targets(model, trace, plans: list[BucketPlan], chosen: dict[str, BucketPlan], backend: str = "auto",
                   check: bool = True, compare_every_target: bool = False,
                   progress: bool = True) -> dict[str, TargetBuckets]:
    """Replay the trace per target with its compile backend. The first target's backend replays
    without buckets and with every plan; each target replays its own chosen plan (warm-up, then
    recompiles forbidden, then the padding check). compare_every_target repeats the whole
    comparison on every target's backend (it costs a compile per shape per backend)."""
    from portkit import bucketed, targets as targets_mod
    out, done = {}, {}     # done: backend -> its runs so far, reused by any plan with the same shapes
    for i, name in enumerate(chosen):
        detected = targets_mod.detect(name)
        be, note = bucketed.resolve_backend(backend, detected)
        compare = i == 0 or compare_every_target
        runs = done.setdefault(be, [])
        wanted = [*plans, chosen[name]] if compare else [chosen[name]]
        missing = [p for p in wanted if _same_shapes(runs, p) is None]
        baseline = compare and not any(r.plan is None for r in runs)
        if missing or baseline:
            runs += bucketed.replay(model, trace, missing, backend=be, baseline=baseline, check=check,
                                    progress=progress, device=detected.target.device if detected.native else "cpu")
        mine = [r for r in runs if r.plan is None] if compare else []
        for plan in wanted:
            run = _same_shapes(runs, plan)
            if run.plan != plan.to_dict():
                run = replace(run, name=plan.planner, plan=plan.to_dict(),
                                          note=f"same shapes as {run.name}: replayed once")
            mine.append(run)
        out[name] = TargetBuckets(detected.to_dict(), be, note, chosen[name], chosen[name].settings["compile_seconds"],
                                  chosen[name].settings["compile_source"], mine)
    return out


def _same_shapes(runs, plan: BucketPlan):
    """The first run that compiled exactly this plan's shapes."""
    return next((r for r in runs if r.plan is not None and r.plan["boundaries"] == list(plan.boundaries)
                 and r.plan["batch_sizes"] == list(plan.batch_sizes)), None)


def _run_for(runs, plan: BucketPlan):
    return next((r for r in runs if r.plan == plan.to_dict()), None)


def fit_buckets(model, corpus, targets=("neuron", "tpu"), out_dir=".", k: int = 3, requests: int = 24,
                max_batch: int = 1, max_seq: int | None = None, overflow: str = "truncate",
                compile_seconds: float = 10.0, k_max: int = K_MAX, seed: int = 0, backend: str = "auto",
                check: bool = True, compare_every_target: bool = False, progress: bool = True,
                serve_requests: int = SERVE_REQUESTS) -> BucketReport:
    """The whole stage in one call (the notebook walks the same steps one by one, with the same calls).
    The chosen plan is priced for serve_requests requests; `requests` only sets the replay's length."""
    from portkit import bucketed, targets as targets_mod
    names = targets_mod.parse_targets(targets)
    dist = distribution(corpus, model)
    hist = histogram(dist, max_seq, overflow)
    plans, curves = compare(hist, k, max_batch), sweep(hist, k_max)
    token_seconds = bucketed.measure_token_seconds(model, hist.top)
    trace = bucketed.make_trace(corpus, model, requests, seed, max_batch, dist)
    chosen = choose(hist, names, out_dir, compile_seconds, token_seconds, serve_requests, k_max, max_batch)
    per_target = replay_targets(model, trace, plans, chosen, backend, check, compare_every_target, progress)
    return BucketReport(model.describe(), dist.to_dict(), hist, k, plans, curves, token_seconds, trace.describe(),
                        per_target)
