"""Grid bucket plans over two varying dimensions (portkit/planning/grid.py): exact padding, costs priced together."""
import itertools

import numpy as np
import pytest
import torch

from portkit.stages.buckets import stage
from portkit.planning import economics
from portkit.planning import grid
from portkit.stages.buckets import grid_costs
from portkit.models import registry
from portkit.stages.report.stage import TargetReport
from portkit.models import seq2seq
from portkit.core.errors import BadParameter
from tests.fixtures.sections import read_section


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


# -------------------------------------------------------- the grid in stage 3 (portkit/stages/buckets/grid_costs.py)
@pytest.fixture(scope="module")
def t5_pairs():
    return registry.load("t5-pairs")


def test_t5_pairs_declares_two_lengths_that_vary_apart_on_real_texts(t5_pairs, corpus):
    assert seq2seq.pair("Return the sum. Both are ints.\n\nMore text.") == (
        "Return the sum. Both are ints.\n\nMore text.", "Return the sum.")
    arr = grid_costs.lengths(t5_pairs, corpus)
    assert arr.shape[1] == 2 and arr.shape[0] >= 1000
    assert (arr[:, 1] <= arr[:, 0]).all()                     # a summary sentence is part of its text
    assert np.percentile(arr[:, 0], 90) > 3 * np.percentile(arr[:, 1], 90)   # the source's tail is far longer
    batch = t5_pairs.declaration.batch(corpus.sample(3, seed=1), {"source": 40, "target": 12})
    assert batch["input_ids"].shape == (3, 40) and batch["decoder_input_ids"].shape == (3, 12)
    with torch.no_grad():
        assert t5_pairs(batch)["logits"].shape[:2] == (3, 12)


def test_stage_3_prices_a_grid_per_target_and_the_report_shows_it(t5_pairs, corpus):
    asked = []

    def fake_xla(model, shape, topology):
        """Stands in for xla_compile.compile_seconds: 1 s + 0.01 s per source and 0.02 s per target token."""
        asked.append({k: v[0] for k, v in shape.items()})
        src, tgt = shape["input_ids"][0][1], shape["decoder_input_ids"][0][1]
        return 1.0 + 0.01 * src + 0.02 * tgt, "XLA compile for v5e:1x1, measured now (test stand-in)"

    costs = {"neuron": economics.neuron_estimate(t5_pairs.parameters)}
    found = grid_costs.compare(t5_pairs, corpus, ["neuron", "tpu"], costs, serve_requests=10**9,
                               measure=fake_xla)
    assert found.dims == ("source", "target") and len(asked) == 4      # the four corner cells
    assert {tuple(sorted(a)) for a in asked} == {("attention_mask", "decoder_attention_mask", "decoder_input_ids",
                                                  "input_ids")}
    for name in ("neuron", "tpu"):        # each dimension's padded position, priced on the target's chip
        assert [p["kind"] for p in found.token_seconds[name]] == ["estimate", "estimate"]
        assert all(p["seconds"] > 0 for p in found.token_seconds[name])
    tpu, neuron = found.targets["tpu"], found.targets["neuron"]
    assert tpu["compile"].startswith("measured XLA at 4 cells") and "0.0100 x source + 0.0200 x target" in tpu["compile"]
    assert neuron["compile"].startswith("estimate, not measured")
    for t in (tpu, neuron):
        g, one = t["grid"], t["one_dimensional"]
        assert g["family"] == grid.GRID and g["compiles"] == len(g["boundaries"][0]) * len(g["boundaries"][1])
        assert t["ratio"] == pytest.approx(g["total_seconds"] / one["total_seconds"])
    # cheaper compiles buy more cells: the TPU's grid has more of them than Neuron's (20 s a graph)
    assert tpu["grid"]["compiles"] > neuron["grid"]["compiles"]
    out = TargetReport("tpu", "TPU", "emulated")
    read_section("buckets", out, data={"grid": found.to_dict()})
    assert "ratio" in out.metrics["buckets"]["grid plan (source x target)"]
    assert stage.grid(registry.load("minilm"), corpus, ["tpu"], {}) is None     # one varying dimension
