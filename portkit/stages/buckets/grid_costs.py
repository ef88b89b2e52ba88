"""Stage 3 for a model with two varying dimensions: a grid of buckets on both, priced per target.

    >>> from portkit.stages.buckets import grid_costs
    >>> found = grid_costs.compare(m, corpus, ["neuron", "tpu"], costs, serve_requests=10_000_000)
    >>> found.table()          # per target: the grid plan, the best one-dimensional plan, their cost ratio

A model that declares two varying dimensions (an encoder's and a decoder's length: `t5-pairs`) pads each
request to a bucket on each of them, so every (bucket, bucket) cell is one input shape to compile.
portkit/planning/grid.py finds the least-cost grid for given prices; this module measures the prices for the model:
- the real lengths of the corpus's items along both dimensions (the declaration measures them), each cut
  at the dimension's largest size;
- one padded position per dimension, per target (padding_prices): the FLOPs and bytes it adds to a forward pass,
  counted on the graph with the other dimension at its short corner, at the chip's roofline (an estimate, as in
  economics.padding_price); for a reference target, the slope of eager forward time on this machine;
- one cell's compile: for an emulated TPU, the real XLA compile for the stage's topology of the four
  corner cells (each dimension at its 10th percentile and its longest), fitted as a + s1 x d1 + s2 x d2
  (cached like every XLA verdict); for any other target, the stage's own cost model (the cited Neuron
  estimate per graph, or natively the vendor's measured times) at the first dimension's length.
Every figure says where it came from; the plans are priced for `serve_requests` requests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from portkit.corpora.corpus import percentiles
from portkit.planning import economics
from portkit.planning import grid
from portkit.targets import specs
from portkit.core.errors import PortkitError
from portkit.core.tables import HtmlTable

CORNER_PERCENTILE = 10      # the short corner of each dimension (the long one is its longest length)
SAMPLE = 4096               # items whose lengths are measured (a seeded sample of a larger corpus)


def applies(model) -> bool:
    """Whether the model declares two varying dimensions (a grid to fit)."""
    return len(model.declaration.varying) == 2


def lengths(model, corpus, seed: int = 0) -> np.ndarray:
    """One row per item (a seeded sample of at most SAMPLE): its length along both varying dimensions,
    each cut at the dimension's largest size."""
    decl = model.declaration
    items = corpus.sample(min(SAMPLE, len(corpus)), seed)
    measured = decl.lengths(items)
    return np.column_stack([np.clip(measured[d.name], 1, d.max) for d in decl.varying])


def padding_prices(model, corners, target: str) -> tuple[economics.TokenPrice, economics.TokenPrice]:
    """What a padded position of each dimension costs `target`: a reference target (cpu, cuda) measured on
    this machine (token_seconds), a migration target the FLOPs and bytes that position adds, counted on the graph
    from the low corner, at its chip's roofline (economics.counted_price, an estimate; natively too: one cell's
    timing cannot separate the two dimensions)."""
    if specs.get(target).reference:
        how = f"{economics.THIS_MACHINE}: eager forward slope along the dimension, batch 1"
        measured = token_seconds(model, corners)
        return tuple(economics.TokenPrice(target, s, economics.THIS_MACHINE, how) for s in measured)
    (lo1, hi1), (lo2, hi2) = corners
    names = model.declaration.varying_names
    low = dict(zip(names, (lo1, lo2)))
    return (economics.counted_price(model, target, low, names[0], hi1),
            economics.counted_price(model, target, low, names[1], hi2))


def token_seconds(model, corners: tuple[tuple[int, int], tuple[int, int]], repeats: int = 3) -> tuple[float, float]:
    """Seconds per padded position of each dimension: eager forward slope on this CPU (batch 1)."""
    (lo1, hi1), (lo2, hi2) = corners
    names = model.declaration.varying_names
    cells = [(lo1, lo2), (hi1, lo2), (lo1, hi2)]
    batches = {c: model.declaration.dummy(1, dict(zip(names, c))) for c in cells}
    best = economics.fastest_seconds(model.module, batches, repeats, threads=1)
    floor = best[cells[0]] / max(lo1 + lo2, 1) / 10    # noisy timings must not make padding free
    first = (best[(hi1, lo2)] - best[cells[0]]) / max(hi1 - lo1, 1)
    second = (best[(lo1, hi2)] - best[cells[0]]) / max(hi2 - lo2, 1)
    return max(first, floor), max(second, floor)


def _corners(arr: np.ndarray) -> tuple[tuple[int, int], tuple[int, int]]:
    out = []
    for i in (0, 1):
        lo, hi = int(np.percentile(arr[:, i], CORNER_PERCENTILE)), int(arr[:, i].max())
        out.append((max(1, min(lo, hi - 1)) if hi > 1 else 1, hi))
    return out[0], out[1]


def xla_cells(model, corners, topology: str = economics.DEFAULT_TOPOLOGY, measure=None):
    """TPU: the real XLA compile of the four corner cells, fitted as a + s1 x d1 + s2 x d2 (never below the
    cheapest corner). Returns (price(d1, d2), label)."""
    if measure is None:
        from portkit.tpu_compile.compiler import compile_seconds as measure
    decl = model.declaration
    names = decl.varying_names
    points = []
    for a in sorted(set(corners[0])):
        for b in sorted(set(corners[1])):
            sizes = dict(zip(names, (a, b)))
            shape = {s.name: (decl.shape_of(s.name, 1, sizes), str(s.dtype).removeprefix("torch."))
                     for s in decl.inputs}
            seconds, source = measure(model, shape, topology)
            if seconds is None:
                raise PortkitError(f"no XLA compile for the cell {a} x {b}: {source}")
            points.append((a, b, seconds))
    x = np.array([[1.0, a, b] for a, b, _ in points])
    coef = np.linalg.lstsq(x, np.array([s for *_, s in points]), rcond=None)[0]
    floor = min(s for *_, s in points)
    label = (f"measured XLA at {len(points)} cells ({topology}, batch 1), fitted {coef[0]:.2f} + {coef[1]:.4f} x "
             f"{names[0]} + {coef[2]:.4f} x {names[1]} s")
    return (lambda a, b: max(floor, float(coef[0] + coef[1] * a + coef[2] * b))), label


@dataclass
class GridComparison:
    """Per target, the least-cost grid plan against the least-cost one-dimensional plan."""
    dims: tuple[str, str]
    items: int
    percentiles: dict               # dim -> {p50, p90, p99, max}
    token_seconds: dict             # target -> [each dimension's padding price, TokenPrice.to_dict()]
    requests: int
    targets: dict                   # name -> {"compile", "grid", "one_dimensional", "ratio", "k_max_binds"}

    def summary(self) -> str:
        parts = [f"{n}: grid {t['grid']['compiles']} cells, total {t['grid']['total_seconds']:,.0f} s vs best 1-D "
                 f"({t['one_dimensional']['family']}) {t['one_dimensional']['total_seconds']:,.0f} s, ratio "
                 f"{t['ratio']:.3f}" for n, t in self.targets.items()]
        return f"{' x '.join(self.dims)} grid for {self.requests:,} requests: " + " | ".join(parts)

    def to_dict(self) -> dict:
        return {"dims": list(self.dims), "items": self.items, "percentiles": self.percentiles,
                "padding_price": self.token_seconds, "requests": self.requests, "targets": self.targets,
                "summary": self.summary()}

    def table(self) -> HtmlTable:
        rows = []
        for name, t in self.targets.items():
            for what in ("grid", "one_dimensional"):
                p = t[what]
                rows.append([name, p["family"], " x ".join(str(b) for b in p["boundaries"]), p["compiles"],
                             f"{p['padding_waste']:.1%}", f"{p['warmup_seconds']:,.0f}", f"{p['padding_seconds']:,.0f}",
                             f"{p['total_seconds']:,.0f}", t["compile"] if what == "grid" else ""])
        return HtmlTable(["target", "plan", f"boundaries ({' x '.join(self.dims)})", "compiles", "padding",
                          "warm-up s", "padding s", "total s", "one cell's compile"], rows, self.summary())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def __str__(self) -> str:
        return str(self.table())


def compare(model, corpus, targets, costs: dict, serve_requests: int, seed: int = 0,
            topology: str = economics.DEFAULT_TOPOLOGY, measure=None) -> GridComparison | None:
    """The grid comparison for a model with two varying dimensions (None for any other). `costs` are the
    stage's cost models per target (buckets.stage_costs): every target but an emulated TPU prices a cell
    with its own along the first dimension."""
    if not applies(model):
        return None
    arr = lengths(model, corpus, seed)
    dims = model.declaration.varying_names
    corners = _corners(arr)
    found, prices = {}, {}
    for name in specs.parse_targets(targets):
        per_token = padding_prices(model, corners, name)
        prices[name] = [p.to_dict() for p in per_token]
        per_token = tuple(p.seconds for p in per_token)
        price = None
        if name == "tpu" and not specs.detect(name).native:
            try:
                price, label = xla_cells(model, corners, topology, measure)
            except PortkitError:     # a cell that does not lower: the stage's own cost model, which says so
                price = None
        if price is None:
            cost = costs[name]
            price, label = (lambda a, b, c=cost: c.seconds(a)), f"{cost.label()}, at the {dims[0]} length"
        result = grid.compare(arr, dims, price, per_token, requests=serve_requests)
        found[name] = {"compile": label, "grid": result["grid"].to_dict(),
                       "one_dimensional": result["one_dimensional"].to_dict(), "ratio": float(result["ratio"]),
                       "k_max_binds": result["k_max_binds"]}
    pct = {d: percentiles(arr[:, i]) for i, d in enumerate(dims)}
    return GridComparison(dims, int(arr.shape[0]), pct, prices, int(serve_requests), found)
