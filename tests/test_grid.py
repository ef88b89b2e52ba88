"""Grid bucket plans over two varying dimensions (portkit/grid.py): exact padding, costs priced together."""
import itertools

import numpy as np
import pytest

from portkit import grid
from portkit.errors import BadParameter


def _brute(arr, first, second):
    pad = 0
    for a, b in arr:
        pad += min(x for x in first if x >= a) - a + min(y for y in second if y >= b) - b
    return pad


def test_each_grid_plan_has_the_least_padding_its_bucket_counts_allow():
    rng = np.random.default_rng(0)
    arr = np.column_stack([rng.integers(1, 16, 40), rng.integers(1, 9, 40)])
    found = grid.plans(arr, ("source", "target"), lambda a, b: 1.0, 1e-3, k_max=3)
    for p in found:
        if p.family == grid.SHARED:
            longer = arr.max(1)
            assert p.padded == sum(2 * min(b for b in p.boundaries[0] if b >= m) for m in longer) - arr.sum()
            continue
        assert p.padded == _brute(arr, *p.boundaries)
        k1, k2 = (len(b) for b in p.boundaries)
        best = min(_brute(arr, [*c1, arr[:, 0].max()], [*c2, arr[:, 1].max()])
                   for c1 in itertools.combinations(sorted(set(arr[:, 0])), k1 - 1)
                   for c2 in itertools.combinations(sorted(set(arr[:, 1])), k2 - 1))
        assert p.padded == best, p                               # exact, against every choice of boundaries
        assert p.compiles == k1 * k2 and p.warmup_seconds == k1 * k2


def test_compiles_and_padding_are_priced_together():
    # two clusters on each dimension, independent: a 2x2 grid removes most padding for 4 compiles
    rng = np.random.default_rng(1)
    arr = np.column_stack([rng.choice([20, 400], 500), rng.choice([5, 120], 500)])
    cheap = grid.compare(arr, ("source", "target"), lambda a, b: 1.0, 1e-3, requests=100_000)
    assert cheap["grid"].boundaries == ((20, 400), (5, 120)) and cheap["grid"].padded == 0
    assert cheap["ratio"] < 1 and cheap["one_dimensional"].family != grid.GRID
    costly = grid.compare(arr, ("source", "target"), lambda a, b: 1e6, 1e-3, requests=100_000)
    assert costly["best"].compiles == 1 and costly["ratio"] > 1           # compiles dear: one shape wins
    assert "2 compiles" not in str(costly["best"]) and costly["best"].to_dict()["compiles"] == 1
    with pytest.raises(BadParameter, match="grid lengths"):
        grid.plans([[3, 0]], ("a", "b"), lambda a, b: 1.0, 1e-3)
