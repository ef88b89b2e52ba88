"""Bucket plans over two varying dimensions (an encoder's and a decoder's length, say), compiles and padding
priced together, pure numpy.

    >>> from portkit.planning import grid
    >>> lengths = np.column_stack([encoder_lengths, decoder_lengths])      # one row per real request
    >>> found = grid.compare(lengths, ("source", "target"), compile_seconds=lambda a, b: 20.0,
    ...                      token_seconds=2e-6, requests=100_000)
    >>> print(found["grid"]); print(found["one_dimensional"]); found["ratio"]     # total cost, grid / best 1-D

A grid plan puts boundaries on each dimension; a request is padded to the smallest boundary of each that
holds it, so every (boundary, boundary) cell is one input shape, and the warm-up compiles every cell. Cost
for `requests` served: warm-up = the sum over cells of compile_seconds(b1, b2); padding = each dimension's
padded positions x its token_seconds, over the sample, scaled to `requests`. For each (k1, k2) each
dimension gets its own exact least-padding boundaries (planner.optimal_table: the two paddings add up), and
the plan is the (k1, k2) of least total cost. It is compared with one-dimensional plans: buckets on one
dimension only (k2 = 1 or k1 = 1), and one shared length for both, as a single-sequence-length pipeline
does. A padded position costs its dimension's token_seconds whatever the other's size (linear: attention's
cost grows faster than that).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from portkit.core.errors import BadParameter
from portkit.planning.planner import optimal_boundaries, histogram, optimal_table

K_MAX = 16                      # boundaries tried on each dimension: a search bound, named when it binds
GRID, FIRST_ONLY, SECOND_ONLY, SHARED = "grid", "first only", "second only", "shared length"


@dataclass(frozen=True)
class GridPlan:
    """Boundaries on two dimensions, with what the plan costs for `requests` served."""
    family: str
    dims: tuple[str, str]
    boundaries: tuple[tuple[int, ...], tuple[int, ...]]
    shapes: tuple[tuple[int, int], ...]          # the cells compiled in the warm-up
    warmup_seconds: float
    padding_seconds: float
    padded_per_dim: tuple[int, int]              # padded positions over the sample, per dimension
    real: int                                    # real positions over the sample, both dimensions
    requests: int

    @property
    def padded(self) -> int:
        return sum(self.padded_per_dim)

    @property
    def total_seconds(self) -> float:
        return self.warmup_seconds + self.padding_seconds

    @property
    def compiles(self) -> int:
        return len(self.shapes)

    @property
    def waste(self) -> float:
        return self.padded / (self.padded + self.real) if self.padded + self.real else 0.0

    def to_dict(self) -> dict:
        return {"family": self.family, "dims": list(self.dims), "boundaries": [list(b) for b in self.boundaries],
                "shapes": [list(s) for s in self.shapes], "compiles": self.compiles,
                "warmup_seconds": self.warmup_seconds, "padding_seconds": self.padding_seconds,
                "total_seconds": self.total_seconds, "padded": self.padded,
                "padded_per_dim": list(self.padded_per_dim), "real": self.real,
                "padding_waste": self.waste, "requests": self.requests}

    def __str__(self) -> str:
        edges = " x ".join(f"{d} {list(b)}" for d, b in zip(self.dims, self.boundaries))
        return (f"{self.family}: {edges}; {self.compiles} compiles, {self.waste:.1%} padding; warm-up "
                f"{self.warmup_seconds:,.1f} s + padding {self.padding_seconds:,.1f} s = {self.total_seconds:,.1f} s "
                f"for {self.requests:,} requests")


def _lengths(lengths) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0 or arr.min() < 1:
        raise BadParameter("grid lengths", f"shape {arr.shape}", hint="give one row per request: two lengths >= 1")
    return arr


def _table(values: np.ndarray, k_max: int):
    hist = histogram(values)
    padding, arg = optimal_table(hist, k_max)
    return hist, padding, {k: optimal_boundaries(hist, arg, k) for k in range(1, padding.size)}


@dataclass(frozen=True)
class _Pricing:
    """What every plan of one `plans` call is priced with: one cell's compile time, what a padded position of
    each dimension costs, and the sample (its rows and real positions) scaled to the requests served."""
    compile_seconds: Callable[[int, int], float]
    token_seconds: tuple[float, float]
    rows: int
    real: int
    requests: int


def _plan(family, dims, edges, shapes, padded, pricing: _Pricing) -> GridPlan:
    warmup = float(sum(pricing.compile_seconds(a, b) for a, b in shapes))
    token_seconds = pricing.token_seconds
    seconds = float(padded[0] * token_seconds[0] + padded[1] * token_seconds[1]) * pricing.requests / pricing.rows
    return GridPlan(family, dims, (tuple(edges[0]), tuple(edges[1])), tuple(shapes), warmup, seconds,
                    (int(padded[0]), int(padded[1])), int(pricing.real), pricing.requests)


def plans(lengths, dims: tuple[str, str], compile_seconds: Callable[[int, int], float],
          token_seconds: float | tuple[float, float], requests: int | None = None,
          k_max: int = K_MAX) -> list[GridPlan]:
    """Every (k1, k2) grid plan with each dimension's least-padding boundaries, and the shared-length plans
    for k = 1..k_max, each priced. compile_seconds(b1, b2): one cell's compile time (a cost model);
    token_seconds: what one padded position costs, one figure or one per dimension."""
    arr = _lengths(lengths)
    n, requests = arr.shape[0], arr.shape[0] if requests is None else requests
    if not isinstance(token_seconds, (tuple, list)):
        token_seconds = (token_seconds, token_seconds)
    pricing = _Pricing(compile_seconds, tuple(token_seconds), n, int(arr.sum()), requests)
    tables = [_table(arr[:, i], k_max) for i in (0, 1)]
    out = []
    for k1, first in tables[0][2].items():
        for k2, second in tables[1][2].items():
            family = GRID if k1 > 1 and k2 > 1 else SECOND_ONLY if k1 == 1 and k2 > 1 else \
                FIRST_ONLY if k2 == 1 and k1 > 1 else "one shape"
            padded = (tables[0][1][k1], tables[1][1][k2])
            out.append(_plan(family, dims, (first, second), [(a, b) for a in first for b in second], padded,
                             pricing))
    longer = arr.max(1)                                   # one length for both: the bucket of the longer
    hist, padding, bounds = _table(longer, k_max)
    for k, edges in bounds.items():
        # each request pads both dimensions to b, the bucket of the longer: sum(b) - sum(l) on each
        total = int(padding[k]) + int(longer.sum())
        padded = (total - int(arr[:, 0].sum()), total - int(arr[:, 1].sum()))
        out.append(_plan(SHARED, dims, (edges, edges), [(b, b) for b in edges], padded, pricing))
    return out


def compare(lengths, dims: tuple[str, str], compile_seconds: Callable[[int, int], float],
            token_seconds: float | tuple[float, float], requests: int | None = None, k_max: int = K_MAX) -> dict:
    """The least-cost grid plan against the least-cost one-dimensional plan (one dimension bucketed, or one
    shared length): {"grid", "one_dimensional", "ratio" (grid total / 1-D total), "plans"}."""
    found = plans(lengths, dims, compile_seconds, token_seconds, requests, k_max)
    best = min(found, key=lambda p: p.total_seconds)
    one = min((p for p in found if p.family != GRID), key=lambda p: p.total_seconds)
    grids = [p for p in found if p.family == GRID]
    grid = min(grids, key=lambda p: p.total_seconds) if grids else one
    binds = [d for d, b in zip(dims, grid.boundaries) if len(b) == k_max]
    return {"grid": grid, "one_dimensional": one, "best": best,
            "ratio": grid.total_seconds / one.total_seconds if one.total_seconds else 1.0, "plans": found,
            "k_max_binds": f"the search bound k_max={k_max} binds on {', '.join(binds)}" if binds else None}
