"""Stage 3: planners (property tests against brute force), the padding wrapper on real models,
and replays that prove zero compiles after warm-up."""
import dataclasses
import itertools
import json
import re
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import fixture_model
from fixtures import models as fixtures
from portkit.stages.buckets import bucketed
from portkit.stages.buckets import trace_replay
from portkit.stages.buckets import stage
from portkit.corpora.corpus import LengthDistribution, make_trace
from portkit.planning import economics
from portkit.models import registry
from portkit.planning import planner
from portkit.runfolder import results
from portkit.core.errors import BadParameter
from tests.fixtures.sections import read_section

lengths_strategy = st.lists(st.integers(1, 60), min_size=1, max_size=40)


def brute_force(hist, k):
    """Least padding over every choice of at most k boundaries among the distinct lengths."""
    inner = hist.values[:-1]
    return min(stage.padded_tokens([*c, hist.top], hist)
               for r in range(min(k - 1, inner.size) + 1) for c in itertools.combinations(inner, r))


# ---------------------------------------------------------------- planning
@settings(max_examples=150, deadline=None)
@given(lengths_strategy, st.integers(1, 5))
def test_optimal_equals_brute_force(lengths, k):
    hist = stage.histogram(lengths)
    assert stage.plan_optimal(hist, k).padded_tokens == brute_force(hist, k)


@settings(max_examples=150, deadline=None)
@given(lengths_strategy, st.integers(1, 8), st.randoms(use_true_random=False))
def test_optimal_never_pads_more_than_another_plan_with_as_many_buckets(lengths, k, rnd):
    hist = stage.histogram(lengths)
    others = [stage.plan_buckets(hist, name, k=k) for name in ("pow2", "linear", "padding_bounded")]
    picked = rnd.sample(range(1, hist.top), min(k - 1, hist.top - 1))   # any boundaries at all
    others.append(planner._plan("random", [*picked, hist.top], hist, "random"))
    for other in others:
        assert other.k <= max(k, 1)
        assert stage.plan_optimal(hist, other.k).padded_tokens <= other.padded_tokens, other


@settings(max_examples=100, deadline=None)
@given(lengths_strategy, st.sampled_from(stage.PLANNER_NAMES[:-1]), st.integers(1, 6))
def test_every_length_lands_in_the_smallest_bucket_that_holds_it(lengths, planner, k):
    plan = stage.plan_buckets(lengths, planner, k=k)
    b = np.asarray(plan.boundaries)
    assert list(b) == sorted(set(b)) and b[-1] == max(lengths)
    for length, bucket in zip(lengths, plan.assign(lengths)):
        assert bucket >= length
        assert not (b[b < bucket] >= length).any()


@settings(max_examples=100, deadline=None)
@given(st.integers(20, 4000), st.floats(1, 60))
def test_padding_bounded_keeps_every_request_under_its_bound(top, pad_percent):
    hist = stage.histogram(np.arange(1, top + 1))
    plan = stage.plan_padding_bounded(hist, pad_percent=pad_percent, minimum=16, max_step=10**9)
    for length, bucket in zip(hist.values, plan.assign(hist.values)):
        if length > 16:
            assert (bucket - length) / bucket <= pad_percent / 100 + 1e-9


def test_planners_follow_their_recipes():
    hist = stage.histogram([3, 40, 90, 300, 700], max_seq=512)
    assert stage.plan_pow2(hist).boundaries == (128, 256, 512)          # NxD Inference: from 128
    assert stage.plan_pow2(hist, minimum=16).boundaries == (16, 32, 64, 128, 256, 512)
    assert stage.plan_pow2(hist, k=3).boundaries == (128, 256, 512)
    assert stage.plan_linear(hist, gap=200).boundaries == (200, 400, 512)
    assert stage.plan_linear(hist, k=4).boundaries == (128, 256, 384, 512)
    odd = stage.histogram([5, 300])                            # a top that is not a power of two
    assert stage.plan_pow2(odd).boundaries == (128, 256, 300)


def test_overflow_is_truncated_or_rejected_never_silent():
    truncated = stage.histogram([10, 20, 900, 1000], max_seq=512)
    assert truncated.top == 512 and truncated.over == 2 and truncated.requests == 4
    plan = stage.plan_buckets(truncated, "optimal", k=2)
    assert plan.bucket_for(5000) == 512
    rejected = stage.histogram([10, 20, 900, 1000], max_seq=512, overflow="reject")
    assert rejected.requests == 2 and rejected.over == 2 and rejected.top == 20
    strict = stage.plan_buckets(rejected, "optimal", k=2)
    with pytest.raises(BadParameter, match="longer than the largest bucket .20 tokens.*'reject'"):
        strict.bucket_for(21)


def test_truncation_counts_the_items_cut_and_the_share_of_their_tokens_lost():
    dist = LengthDistribution(np.array([10, 20, 600, 1024]), "tok", "texts", max_length=512,
                                   max_length_from="its config's max_position_embeddings")
    cut = stage.truncation(dist, stage.histogram(dist))
    assert (cut["limit"], cut["items"], cut["over"], cut["over_tokens"], cut["lost_tokens"]) == (512, 4, 2, 1624, 600)
    assert cut["lost_share_of_over"] == pytest.approx(600 / 1624) and cut["lost_share"] == pytest.approx(600 / 1654)
    found = stage.truncation_finding(cut)
    assert found["kind"] == "truncation" and found["severity"] == "work"
    assert found["message"].startswith("2 of 4 texts (50.0%) are longer than 512 tokens (the model's maximum)")
    assert found["message"].endswith("; the limit is its config's max_position_embeddings")
    assert "they lose 36.9% of their tokens (600 of 1,624; 36.3% of the corpus's 1,654)" in found["message"]
    assert all(x in found["advice"] for x in ("sliding windows of 512 tokens", "larger maximum", "-p overflow reject"))
    rejected = stage.truncation(dist, stage.histogram(dist, overflow="reject"))
    assert rejected["over"] == 2 and rejected["lost_tokens"] == 1624    # a rejected text loses every token
    assert stage.truncation_finding(rejected)["severity"] == "info"
    assert "rejected (overflow reject)" in stage.truncation_finding(rejected)["message"]
    short = LengthDistribution(np.array([10, 20]), "tok", "texts", max_length=512)
    none = stage.truncation(short, stage.histogram(short))
    assert none["over"] == 0 and none["lost_share"] == 0.0
    assert stage.truncation_finding(none)["severity"] == "info"
    assert "nothing is cut" in stage.truncation_finding(none)["message"]


def test_a_parameter_count_reads_as_people_write_it():
    assert economics.parameter_count(9610) == "9,610 parameters"
    assert economics.parameter_count(22_713_216) == "22.7 M parameters"
    assert "20 s per graph for 9,610 parameters (" in economics.neuron_estimate(9610).label()


def test_auto_prices_compiles_against_padding(tmp_path):
    hist = stage.histogram(np.random.default_rng(0).integers(1, 400, size=5000))
    few = stage.plan_buckets(hist, "auto", prices=planner.Prices(10.0, 1e-4), requests=50)
    many = stage.plan_buckets(hist, "auto", prices=planner.Prices(10.0, 1e-4), requests=10**6)
    assert few.k < many.k
    costs = many.settings["cost_by_k"]
    assert costs[many.k] == min(costs.values())
    assert f"k={many.k} minimises" in many.why and "parameter" in many.why
    assert many.boundaries == stage.plan_optimal(hist, many.k).boundaries
    # batch buckets multiply the compiles auto pays for
    batched = stage.plan_buckets(hist, "auto", prices=planner.Prices(10.0, 1e-4), requests=10**6,
                                   max_batch=8)
    assert batched.batch_sizes == (1, 2, 4, 8) and batched.k <= many.k and batched.compiles == 4 * batched.k


def test_auto_takes_more_buckets_when_compiles_are_cheap_and_the_budget_binds_when_small():
    hist = stage.histogram(np.random.default_rng(0).integers(1, 400, size=5000))
    cheap = stage.plan_buckets(hist, "auto", prices=planner.Prices(1.0, 1e-4), requests=10**5)
    dear = stage.plan_buckets(hist, "auto", prices=planner.Prices(100.0, 1e-4), requests=10**5)
    assert cheap.k > dear.k and cheap.waste < dear.waste
    assert not cheap.settings["budget_binds"] and cheap.k > 3            # no cap of 3 decides it
    # a compile cost that grows with the length (a cost model) is summed over the boundaries
    model = lambda seq: 1.0 + seq / 100                                   # noqa: E731
    priced = stage.plan_buckets(hist, "auto", prices=planner.Prices(model, 1e-4), requests=10**5)
    assert priced.settings["warmup_seconds"] == pytest.approx(sum(model(b) for b in priced.boundaries))
    # a budget smaller than the unbounded optimum's warm-up binds, and the why says so and shows the optimum
    budget = cheap.settings["warmup_seconds"] / 2
    bound = stage.plan_buckets(hist, "auto", prices=planner.Prices(1.0, 1e-4), requests=10**5,
                                 budget_seconds=budget)
    assert bound.k < cheap.k and bound.settings["warmup_seconds"] <= budget and bound.settings["budget_binds"]
    assert bound.settings["unbounded"]["k"] == cheap.k
    assert f"warm-up budget of {budget:g} s binds" in bound.why and f"k={cheap.k}:" in bound.why
    # a budget even one bucket misses is the compiler's measurement, not bad input: one bucket, and it says so
    missed = stage.plan_buckets(hist, "auto", prices=planner.Prices(10.0, 1e-4), budget_seconds=1.0)
    assert missed.k == 1 and missed.settings["budget_exceeded"] and missed.settings["budget_binds"]
    assert "warm-up budget of 1 s cannot be met: one bucket alone takes 10.0 s" in missed.why


def test_the_neuron_estimate_is_planned_at_half_and_twice_itself(tiny):
    hist = stage.histogram(np.random.default_rng(0).integers(1, 400, size=5000))
    costs = {"neuron": economics.neuron_estimate(tiny.parameters, override=20.0)}
    plans = stage.what_if(hist, costs, 1e-4, stage.Options.of({"serve_requests": 10**5,
                                                                   "warmup_budget_seconds": None}))["neuron"]
    assert set(plans) == {0.5, 2.0} and plans[0.5].k >= plans[2.0].k
    assert "x0.5" in plans[0.5].settings["compile_source"]
    measured = {"tpu": economics.CostModel("tpu", "measured XLA", "measured XLA (test)", 3.0)}
    assert stage.what_if(hist, measured, 1e-4) == {}                   # only an estimate is varied


def test_a_padded_position_is_priced_on_the_target_not_on_this_cpu(minilm):
    prices = economics.padding_prices(minilm, ["neuron", "tpu"], 128)
    # a transformer's forward costs about 2 FLOPs per weight per token: MiniLM's 21 M non-embedding weights
    # (its embeddings are lookups, not a matmul)
    lookup = sum(m.weight.numel() for m in minilm.module.modules() if isinstance(m, torch.nn.Embedding))
    per_token = 2 * (minilm.parameters - lookup)
    # Neuron on Trn2 (TorchNeuron's chip) at its default 'none' (FP32 peak), the TPU at one-pass bf16: the roofline
    for name, peak, bandwidth in (("neuron", 181e12, 2.9e12), ("tpu", 197e12, 819e9)):
        price = prices[name]
        assert price.kind == "estimate" and price.source.startswith("estimate, not measured")
        assert price.flops == pytest.approx(per_token, rel=0.25), name          # the FLOPs travel with the price
        assert price.activation_bytes > 0 and "kB of activations" in price.source
        assert price.seconds == pytest.approx(max(price.flops / peak, price.activation_bytes / bandwidth)), name
    # a graph the FLOP counter cannot run: 2 FLOPs per non-embedding parameter (Kaplan et al. 2020) stand in,
    # an estimate that says why and where it came from, near the counted figure for this transformer
    from portkit.targets import capacity

    def refuse(module, inputs):
        raise RuntimeError("data-dependent shape")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "count_flops", refuse)
        stand_in = economics.padding_price(minilm, "tpu", 64)
    assert stand_in.kind == economics.ESTIMATE and "data-dependent shape" in stand_in.source
    assert "Kaplan et al. 2020" in stand_in.source and stand_in.seconds * 197e12 == pytest.approx(per_token)
    # a reference target is this machine, measured; auto's why names where its price came from
    cpu = economics.padding_price(minilm, "cpu", 64)
    assert cpu.kind == economics.THIS_MACHINE and cpu.seconds > 0
    hist = stage.histogram(np.random.default_rng(0).integers(1, 128, size=500))
    costs = {"tpu": economics.CostModel("tpu", "measured XLA", "measured XLA (test)", 3.0)}
    chosen = stage.choose(hist, costs, prices, quiet=True)["tpu"]
    assert "v5e's roofline" in chosen.why and chosen.settings["token_seconds"] == prices["tpu"].seconds


def test_planning_a_million_lengths_is_fast(monkeypatch):
    lengths = np.random.default_rng(0).lognormal(3.3, 1.1, size=1_000_000).astype(int) + 1
    searched, table = [], planner.optimal_table
    monkeypatch.setattr(planner, "optimal_table", lambda hist, k_max: searched.append(
        (hist.values.size, hist.requests, k_max)) or table(hist, k_max))
    plan = stage.plan_buckets(lengths, "optimal", k=8, max_seq=512)
    # fast: one search over the distinct lengths (at most max_seq of them, K m^2 candidate buckets), however
    # many requests; the benchmark measures the time
    (distinct, requests, k_max), = searched
    assert distinct <= 512 and (requests, k_max) == (1_000_000, 8)
    assert plan.requests == 1_000_000 and plan.k == 8


def test_bad_parameters_name_the_value_and_the_choices():
    with pytest.raises(BadParameter, match="unknown planner 'pow3'; choose one of: pow2, linear"):
        stage.plan_buckets([1, 2], "pow3")
    with pytest.raises(BadParameter, match="overflow policy 'wrap'"):
        stage.histogram([1, 2], overflow="wrap")
    with pytest.raises(BadParameter, match="invalid requests 0: must be a positive whole number"):
        stage.Options.of({"requests": 0})
    with pytest.raises(BadParameter, match="overflow 'drop'.*truncate, reject"):
        stage.Options.of({"overflow": "drop"})
    with pytest.raises(BadParameter, match="vit takes one input shape"):
        stage.distribution(None, registry.load("vit"))


# ---------------------------------------------------------------- running with buckets
def fake_xla(model, shape, topology, dtype):
    """A stand-in for xla_compile.compile_seconds: 1 s + 0.01 s per token (these tests are not about XLA)."""
    return 1.0 + shape["seq"] / 100, "XLA compile for v5e:1x1, measured now (test stand-in)"


def costs_for(m, lengths=(4, 16, 48)):
    return {"tpu": economics.xla_model(m, list(lengths), measure=fake_xla),
            "neuron": economics.neuron_estimate(m.parameters)}


@pytest.fixture(scope="module")
def tiny():
    return registry.load(fixture_model("tiny_encoder"))


@pytest.fixture(scope="module")
def trace(corpus, minilm):
    return make_trace(corpus, minilm, 12, seed=3)


def test_minilm_bucketed_outputs_equal_unpadded_ones(minilm, corpus, trace):
    plan = stage.plan_buckets([3, 9, 24, 40], "optimal", k=2, max_batch=2)   # (1|2) x (9|40)
    bm = bucketed.BucketedModel(minilm, plan, backend="eager")     # Dynamo's graphs, run as captured
    bm.warm_up()
    assert bm.compiles == 4
    with torch.compiler.set_stance("fail_on_recompile"):
        checks = bucketed.check_padding(bm, trace)
        texts = ["Return the sum of a and b.", "Open the file and read every line of it into a list."]
        got = bm(bm.encode(texts))
    assert [(c["batch"], c["seq"]) for c in checks] == [(1, 9), (1, 40), (2, 9), (2, 40)]
    assert all(c["ok"] for c in checks), checks
    for i, text in enumerate(texts):
        want = minilm(minilm.encode([text]))
        n = want["last_hidden_state"].shape[1]
        assert got["last_hidden_state"].shape[1] == max(minilm.token_lengths(texts))
        torch.testing.assert_close(got["last_hidden_state"][i:i + 1, :n], want["last_hidden_state"],
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got["embedding"][i:i + 1], want["embedding"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2"])
def test_decoder_bucketed_logits_equal_unpadded_ones(name, trace):
    m = registry.load(name)
    plan = stage.plan_buckets([5, 17, 33], "linear", k=2)
    bm = bucketed.BucketedModel(m, plan, backend="aot_eager")
    bm.warm_up()
    with torch.compiler.set_stance("fail_on_recompile"):
        checks = bucketed.check_padding(bm, trace)
    assert len(checks) == 2 and all(c["ok"] for c in checks), checks
    assert bm.dims["logits"] == ((0,), (1,))


def test_padding_check_catches_a_mask_bug(trace):
    broken = registry.load(fixture_model("mask_ignoring_model"))
    bm = bucketed.BucketedModel(broken, stage.plan_buckets([4, 30], "optimal", k=1), backend="eager")
    bm.warm_up()
    checks = bucketed.check_padding(bm, trace)
    assert not checks[0]["ok"] and checks[0]["max_abs_error"] > 1e-2
    assert any(f.startswith("hidden") for f in checks[0]["failures"])
    good = bucketed.BucketedModel(registry.load(fixture_model("tiny_encoder")), bm.plan, backend="eager")
    good.warm_up()
    assert bucketed.check_padding(good, trace)[0]["ok"]


def test_an_unwarmed_shape_is_counted_not_a_silent_compile(tiny):
    torch._dynamo.reset()      # earlier tests compiled this module's forward: their graphs would be listed too
    bm = bucketed.BucketedModel(tiny, stage.plan_buckets([4, 8, 16], "optimal", k=2), backend="eager")
    bm.warm_up()
    with torch.compiler.set_stance("fail_on_recompile"):
        bm(bm.encode(["Add two numbers."]))
        assert bm.compiles == 2 and bm.late == []
        with pytest.raises(RuntimeError, match="fail_on_recompile"):     # PyTorch refuses the compile
            bm.compiled(**bm.example(1, 11))
        bm.run_padded(bm.example(1, 11), request=7)                     # the wrapper records it, then pays it
    assert bm.compiles == 3 and [e.request for e in bm.counter.events] == [None, None, 7]
    (late,) = bm.late
    assert late["request"] == 7 and late["shape"] == [1, 11] and set(late["shapes"]) == set(tiny.input_names)
    assert re.fullmatch(r"tensor '\w+' size mismatch at index 1\. expected (8|16), actual 11", late["reason"]), late
    assert len(late["guard_failures"]) == 2            # one per warmed bucket, in Dynamo's words


class PlanMissingABucket(stage.BucketPlan):
    """A plan whose warm-up deliberately leaves its middle length out: requests that land there
    compile after warm-up."""

    def shapes(self):
        return [s for s in super().shapes() if s["seq"] != self.boundaries[1]]


def test_a_plan_that_leaves_a_length_out_compiles_after_warm_up_and_says_where(tiny, corpus):
    trace = make_trace(corpus, tiny, 10, seed=1)
    plan = stage.plan_buckets(np.concatenate(trace.lengths), "optimal", k=3, max_seq=64)
    leaky = PlanMissingABucket(*(getattr(plan, f.name) for f in dataclasses.fields(plan)))
    left_out = plan.boundaries[1]
    first = next(i for i, n in enumerate(trace.lengths) if plan.bucket_for(min(n[0], 64)) == left_out)
    (run,) = trace_replay.replay(tiny, trace, [leaky], backend="eager",
                             settings=trace_replay.ReplaySettings(baseline=False, progress=False))
    assert run.compiles_after_warmup == 1 and run.compiles == plan.compiles == 3     # once, then cached
    (late,) = run.late_compiles
    assert late["request"] == first and late["shape"] == [1, left_out]
    assert f"actual {left_out}" in late["reason"] and "size mismatch at index 1" in late["reason"]
    assert run.padding_ok and run.compile_seconds > 0 and sorted(run.compiled_seqs) == sorted(
        plan.boundaries)                              # the warm-up's two, and the one it left out
    target = stage.TargetBuckets({"name": "tpu", "mode": "emulated"}, "eager", leaky,
                                   economics.CostModel("tpu", "measured XLA", "measured XLA (test)", 2.0), [run])
    assert target.priced(run) == 2.0 * 3          # every graph it compiled, at the target's cost
    saved = json.loads(json.dumps(target.to_dict()))
    assert saved["compiles_after_warmup"] == 1 and saved["replay"][0]["late_compiles"][0]["shape"] == [1, left_out]
    (finding,) = [f for f in saved["findings"] if f["kind"] == "recompile_after_warmup"]
    assert f"request {first + 1}, shape 1x{left_out}" in finding["message"] and late["reason"] in finding["message"]


def test_buckets_shorter_than_the_special_tokens_still_warm_up_and_check(tiny, trace):
    bm = bucketed.BucketedModel(tiny, stage.plan_buckets([1, 2, 16], "optimal", k=3), backend="eager")
    bm.warm_up()
    assert bm.compiles == 3
    with torch.compiler.set_stance("fail_on_recompile"):
        checks = bucketed.check_padding(bm, trace)
    assert [c["lengths"] for c in checks] == [[1], [2], [3]] and all(c["ok"] for c in checks)


def test_overflow_policy_in_the_wrapper(tiny):
    long_text = " ".join(["word"] * 40)
    cut = bucketed.BucketedModel(tiny, stage.plan_buckets([4, 8, 16], "optimal", k=2), backend="eager")
    cut.warm_up()
    with torch.compiler.set_stance("fail_on_recompile"):
        assert cut(cut.encode([long_text]))["hidden"].shape[1] == 16          # tokenizer cut, [SEP] kept
        assert cut(tiny.encode([long_text]))["hidden"].shape[1] == 16         # a longer tensor, sliced
    strict = bucketed.BucketedModel(tiny, stage.plan_buckets([4, 8, 16], "optimal", k=2, overflow="reject"),
                                    backend="eager")
    with pytest.raises(BadParameter, match="input length 42"):
        strict.encode([long_text])
    with pytest.raises(BadParameter, match="longer than the largest bucket"):
        strict(cut.model.encode([long_text]))


def test_replay_pays_one_compile_per_shape_without_buckets_and_none_after_warm_up(tiny, corpus):
    trace = make_trace(corpus, tiny, 14, seed=1, max_batch=3)
    distinct = {(len(t), min(max(n), 64)) for t, n in zip(trace.requests, trace.lengths)}
    assert len(distinct) > 8                          # more than Dynamo's default recompile limit
    plan = stage.plan_buckets(np.concatenate(trace.lengths), "optimal", k=3, max_seq=64, max_batch=3)
    runs = trace_replay.replay(tiny, trace, [plan], backend="eager",
                               settings=trace_replay.ReplaySettings(progress=False))
    base, bucketed_run = runs
    assert base.name == "no buckets" and base.compiles == len(distinct) and base.waste > 0
    assert bucketed_run.compiles == plan.compiles == len(plan.shapes()) == 9
    assert bucketed_run.compiles_after_warmup == 0
    assert bucketed_run.padding_ok and len(bucketed_run.padding_checks) == 9
    assert bucketed_run.computed_tokens >= base.computed_tokens
    assert bucketed_run.to_dict()["plan"]["batch_sizes"] == [1, 2, 3]
    # the stage's default counts the baseline instead of compiling it: the same compiles, the same shapes
    counted, again = trace_replay.replay(tiny, trace, [plan], backend="eager", settings=trace_replay.ReplaySettings(
        progress=False, check=False, count_baseline=True))
    assert (counted.name, counted.compiles, counted.compiles_after_warmup) == ("no buckets", base.compiles, 0)
    assert sorted(counted.compiled_seqs) == sorted(base.compiled_seqs)
    assert (counted.real_tokens, counted.computed_tokens) == (base.real_tokens, base.computed_tokens)
    assert counted.compile_wall_seconds == 0 and counted.run_seconds > 0
    per = again.compile_wall_seconds / again.compiles
    assert counted.compile_seconds == pytest.approx(per * counted.compiles)
    assert counted.note.startswith(f"counted, not compiled: {len(distinct)} distinct shapes")
    assert f"the mean of this replay's {again.compiles} measured compiles" in counted.note
    # a compared plan counted, not compiled: one compile per bucket shape, its padding measured the same
    pow2 = stage.plan_buckets(np.concatenate(trace.lengths), "pow2", k=3, max_seq=64, max_batch=3)
    compiled_pow2 = trace_replay.replay(tiny, trace, [pow2], backend="eager", settings=trace_replay.ReplaySettings(
        progress=False, check=False, baseline=False))[0]
    _, counted_pow2, chosen = trace_replay.replay(tiny, trace, [pow2, plan], backend="eager",
                                              settings=trace_replay.ReplaySettings(progress=False, check=False,
                                                                               count_baseline=True, count=(pow2,)))
    assert counted_pow2.compiles == compiled_pow2.compiles == len(pow2.shapes()) and not counted_pow2.padding_checks
    assert (counted_pow2.real_tokens, counted_pow2.computed_tokens) == (compiled_pow2.real_tokens,
                                                                        compiled_pow2.computed_tokens)
    assert sorted(counted_pow2.compiled_seqs) == sorted(compiled_pow2.compiled_seqs)
    assert counted_pow2.note.startswith(f"counted, not compiled: {len(pow2.shapes())} bucket shapes")
    assert chosen.note == "" and chosen.compiles == plan.compiles        # the chosen plan: compiled, proven


def test_backend_is_the_targets_own_unless_named():
    from portkit.targets import backends
    from portkit.targets import selection
    from portkit.targets import specs
    tpu = specs.detect("tpu")
    assert selection.check_backend(tpu, "auto") == "portkit_tpu"       # the emulated backend, one rule for both stages
    with pytest.raises(BadParameter, match="compile backend for target neuron"):
        stage.Options.of({"backend": "inductor"}).check_targets(["neuron", "tpu"])
    # the replay's emulated backend checks and emulates, and generates no code unless asked
    made = bucketed.compile_backend("portkit_tpu")
    assert isinstance(made, backends.EmulatedBackend) and not made.inductor and made.target.name == "tpu"
    assert bucketed.compile_backend("portkit_tpu", inductor=True).inductor
    assert bucketed.compile_backend("eager") == "eager"
    with pytest.raises(BadParameter, match="unknown compile backend 'portkit_nope'"):
        bucketed.compile_backend("portkit_nope")


def test_padding_check_on_the_emulated_tpu_backend(tiny, trace):
    bm = bucketed.BucketedModel(tiny, stage.plan_buckets([4, 30], "optimal", k=1), backend="portkit_tpu")
    bm.warm_up()
    from portkit.targets import tolerance
    wide, narrow = tolerance.PADDING_TOLERANCE_BF16, tolerance.PADDING_TOLERANCE
    assert bm.compiles == 1 and (bucketed.padding_tolerance("portkit_tpu").rtol,
                                 bucketed.padding_tolerance("portkit_tpu").atol) == wide
    tol = bucketed.padding_tolerance("portkit_neuron")
    assert (tol.rtol, tol.atol) == narrow                  # Neuron's default is fp32
    with torch.compiler.set_stance("fail_on_recompile"):
        checks = bucketed.check_padding(bm, trace)          # eager reference under the TPU's numerics
    assert checks[0]["ok"] and checks[0]["rtol"] == wide[0], checks


def test_stage_result_keeps_the_contract(tiny, corpus, tmp_path):
    report = stage.fit_buckets(tiny, corpus, ["neuron", "tpu"],
                                 stage.Options.of({"bucket_count": 2, "requests": 4}), run_dir=tmp_path, max_seq=48,
                                 costs=costs_for(tiny), replay=stage.Replay(progress=False))
    report.save(tmp_path / "buckets.json")
    saved = json.loads((tmp_path / "buckets.json").read_text())
    assert saved["stage"] == "buckets" and "emulated" in saved["summary"]
    for name in ("neuron", "tpu"):
        t = saved["targets"][name]
        assert t["target"]["mode"] == "emulated"
        chosen = t["chosen"]
        assert chosen["planner"] == "auto" and chosen["boundaries"][-1] == 48 and chosen["batch_sizes"] == [1]
        assert chosen["why"] and chosen["shapes"] == [{"batch": 1, "seq": s} for s in chosen["boundaries"]]
        assert t["compiles_after_warmup"] == 0 and t["padding_ok"] is True
        assert t["compile_cost"]["kind"] == {"neuron": "estimate", "tpu": "measured XLA"}[name]
        assert t["compile_seconds_per_bucket"]["source"] == t["compile_cost"]["label"]
    assert set(saved["targets"]["neuron"]["what_if"]) == {"0.5", "2.0"} and not saved["targets"]["tpu"]["what_if"]
    # the comparison runs on the first target's backend; every target replays its own chosen plan
    assert [r["name"] for r in saved["targets"]["neuron"]["replay"]] == [
        "no buckets", "pow2", "linear", "padding_bounded", "optimal", "auto"]
    assert [r["name"] for r in saved["targets"]["tpu"]["replay"]] == ["auto"]
    assert set(saved["padding_by_buckets"]) == {"optimal", "pow2", "linear", "padding_bounded"}
    assert {n: p["kind"] for n, p in saved["padding_price"].items()} == {"neuron": "estimate", "tpu": "estimate"}
    from portkit.stages.report.stage import TargetReport
    out = TargetReport("tpu", "TPU", "emulated")
    read_section("buckets", out, data=saved, target=saved["targets"]["tpu"])
    assert "estimate, not measured" in out.metrics["buckets"]["padded position priced at"]
    # the truncation finding leads each target's findings; the replay rows carry their compile time on the target
    assert all(saved["targets"][n]["findings"][0]["kind"] == "truncation" for n in ("neuron", "tpu"))
    assert saved["truncation"]["limit"] == 48 and saved["truncation"]["items"] == len(corpus.texts)
    row = saved["targets"]["tpu"]["replay"][0]
    assert row["target_compile_seconds"] == pytest.approx(report.targets["tpu"].priced(report.targets["tpu"].runs[0]))
    assert "no buckets" in str(report) and "<table>" in report._repr_html_()
    # one replay panel per target (the padding curve is plot_padding's, drawn once in the notebook)
    assert [ax.get_title().split(" ")[0] for ax in report.plot().axes] == ["neuron", "tpu"]
    assert stage.padding_slider(report.histogram, report.curves, report.k) is None   # not in a notebook kernel


@pytest.mark.native
@pytest.mark.parametrize("target,module,device", [("neuron", "torch_neuronx", "neuron"), ("tpu", "torch_tpu", "tpu")])
def test_native_replay_runs_on_the_device(target, module, device, tiny, corpus, tmp_path):
    from portkit.core import availability
    from portkit.targets import specs
    if not availability.device_available(module, device):
        pytest.skip(f"needs {module} and a {device} device")
    report = stage.fit_buckets(tiny, corpus, [target],
                                 stage.Options.of({"bucket_count": 1, "requests": 3}), run_dir=tmp_path, max_seq=32,
                                 replay=stage.Replay(progress=False))
    t = report.targets[target]
    assert t.target["mode"] == "native" and t.backend == specs.get(target).backend
    assert all(r.compiles_after_warmup == 0 for r in t.runs) and all(r.padding_ok for r in t.runs if r.plan)


def notebook_code_cells(stage_name: str) -> list[tuple[bool, str]]:
    """(is the parameters cell, source) of every code cell of a stage's notebook, as the runner finds it."""
    from portkit.core.locations import NOTEBOOKS
    from portkit.run import runner
    path = NOTEBOOKS / next(s for s in runner.STAGES if s.name == stage_name).notebook
    if path.suffix == ".ipynb":
        import nbformat
        cells = nbformat.read(path, as_version=4).cells
    else:   # a text notebook (jupytext)
        import jupytext
        cells = jupytext.read(path).cells
    return [("parameters" in c.metadata.get("tags", []), c.source) for c in cells if c.cell_type == "code"]


def test_fit_buckets_and_the_notebook_choose_the_same_plan(corpus, tmp_path, monkeypatch, capsys):
    real = economics.xla_model
    monkeypatch.setattr(economics, "xla_model", lambda m, lengths, batch=1, topology="v5e:1x1", dtype=None,
                        measure=None: real(m, lengths, batch, topology, dtype, measure=fake_xla))
    spec = fixture_model("tiny_encoder")
    given = {"model": spec, "targets": ["neuron", "tpu"], "out_dir": str(tmp_path), "corpus": "stdlib"}
    scope: dict = {}
    for is_parameters, source in notebook_code_cells("buckets"):   # the notebook's cells, in this process
        exec(source, scope)
        if is_parameters:
            scope.update(given)     # what papermill injects after the parameters cell
        if "chosen" in scope:       # the notebook has chosen its plans; the replay comes next
            break
    defaults = {k: scope[k] for k in ("requests", "max_batch", "overflow", "serve_requests", "seed",
                                      "warmup_budget_seconds", "neuron_compile_seconds")}
    assert defaults["serve_requests"] > scope["trace"].texts    # priced for traffic, not for the short replay
    assert {k: getattr(scope["opts"], k) for k in defaults} == defaults     # the notebook's options are its values
    report = stage.fit_buckets(scope["m"], scope["texts"], given["targets"],
                                 dataclasses.replace(scope["opts"], requests=4), run_dir=tmp_path,
                                 replay=stage.Replay(check=False, progress=False))
    for name in given["targets"]:
        assert report.targets[name].chosen == scope["chosen"][name]
    assert report.plans == scope["plans"] and report.histogram.to_dict() == scope["hist"].to_dict()


def test_the_notebook_parameters_are_the_stage_defaults():
    from portkit.run import runner
    from portkit.run import notebook_parameters
    entry = next(s for s in runner.STAGES if s.name == "buckets")
    declared = notebook_parameters.declared_parameters(entry)
    defaults = stage.Options.defaults()
    for f in dataclasses.fields(defaults):
        assert eval(declared[f.name]["default"]) == getattr(defaults, f.name), f.name   # noqa: S307 (its own literal)
        assert f.metadata["default"] == declared[f.name]["default"] and f.metadata["help"], f.name
    assert {"requests", "bucket_count", "serve_requests", "warmup_budget_seconds"} <= set(declared)


def test_the_planner_is_pure_numpy():
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(planner))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "torch" not in imported and imported <= {"__future__", "inspect", "math", "dataclasses", "numpy",
                                                     "portkit.core.errors"}, imported
    assert results.compile_cost("/nonexistent", "tpu") is None


class MaskDropping(torch.nn.Module):
    """Takes an attention mask and drops it, as portkit's Mamba adapter does for a model that must not get one, then
    normalises over the sequence axis (an InstanceNorm over time): padded positions change every real one."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(30522, 8), torch.nn.InstanceNorm1d(8)

    def forward(self, input_ids, attention_mask):
        return {"hidden": self.norm(self.embed(input_ids).transpose(1, 2)).transpose(1, 2)}


@pytest.mark.parametrize("module, read", [(MaskDropping, False), (lambda: fixtures.TinyEncoder(use_mask=False), True)])
def test_padding_that_a_mask_cannot_fix_is_work_with_the_mask_tried(corpus, module, read):
    """Rule (grading policy "padding", advice that was tried): where padding changes real positions, portkit tries
    the mask (the outputs with the padding marked real against marked padded). A model that does not read its mask
    (its adapter drops it) is told it needs exact-length batches or per-length buckets, with no advice about the
    mask; one that reads it gets that advice as a lead (not tried). Either is work, one finding per target."""
    torch.manual_seed(0)
    m = registry.LoadedModel("norm", registry.TOKEN_CLASSIFIER, module().eval(), "test model",
                           tokenizer=registry.minilm_tokenizer())
    trace = make_trace(corpus, m, 6, seed=1)
    plans = {"tpu": stage.plan_buckets([8, 32], "optimal", k=2)}
    t = stage.replay_targets(m, trace, [], plans, {"tpu": economics.neuron_estimate(10**6)},
                               replay=stage.Replay(progress=False))["tpu"]
    assert t.mask_read is read
    [padding] = [f for f in t.findings() if f["kind"] == "padding"]
    assert padding["severity"] == "work" and "exact-length batches or per-length buckets" in padding["advice"]
    assert ("mask" in padding["advice"]) is read and "fix the attention mask" not in padding["advice"]
    assert ("does not read its mask" in padding["message"]) is not read


def test_each_targets_chosen_plan_has_its_own_marker():
    """Padding against the number of buckets: two targets' chosen plans are drawn with different markers and
    colours, each labelled with its target, so the two points never read as one."""
    from portkit.planning.planner import BucketPlan
    from portkit.stages.buckets import plots
    curves = {"pow2": [(1, 0.5), (2, 0.3)], "optimal": [(1, 0.5), (2, 0.2)]}
    chosen = {n: BucketPlan("auto", (16, 48), 20, 100, 10, "truncate", "test") for n in ("neuron", "tpu")}
    ax = plots.plot_padding(curves, chosen)
    marks = [line for line in ax.get_lines() if line.get_label().startswith("chosen for")]
    assert [m.get_label().split(":")[0] for m in marks] == ["chosen for neuron", "chosen for tpu"]
    assert len({(m.get_marker(), m.get_color()) for m in marks}) == 2


def test_length_histogram_labels_do_not_overprint():
    """The length histogram's p50, p90 and p99 labels sit on different lines, so close percentiles stay legible."""
    import numpy as np
    dist = LengthDistribution(np.array([10] * 50 + [11] * 45 + [12] * 5), "tok", "corpus", 512)
    ax = dist.plot()
    heights = [text.get_position()[1] for text in ax.texts]
    assert [t.get_text().split("=")[0].strip() for t in ax.texts] == ["p50", "p90", "p99"]
    assert len(set(heights)) == 3


class RaisesOnAnyInput(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        raise RuntimeError("The size of tensor a (64) must match the size of tensor b (33)")


def test_a_mask_try_that_could_not_run_never_says_the_model_takes_no_mask(corpus, monkeypatch):
    """Rule: a finding states only what portkit established. CPM-Ant takes an attention mask but raised on the
    padded item of the mask try; the padding finding said "the model takes no mask input". The try that could not
    run returns why, and the finding says the mask was not tried, with no claim about it."""
    m = registry.LoadedModel("raises", registry.TOKEN_CLASSIFIER, RaisesOnAnyInput(), "test model",
                             tokenizer=registry.minilm_tokenizer())
    why = bucketed.mask_is_read(m, make_trace(corpus, m, 2, seed=1))
    assert isinstance(why, str) and why.startswith("the model raised on a padded item, eagerly: RuntimeError")
    monkeypatch.setattr(bucketed, "mask_is_read", lambda model, trace: why)
    torch.manual_seed(0)
    dropping = registry.LoadedModel("norm", registry.TOKEN_CLASSIFIER, MaskDropping().eval(), "test model",
                                    tokenizer=registry.minilm_tokenizer())
    trace = make_trace(corpus, dropping, 6, seed=1)
    t = stage.replay_targets(dropping, trace, [], {"tpu": stage.plan_buckets([8, 32], "optimal", k=2)},
                             {"tpu": economics.neuron_estimate(10**6)}, replay=stage.Replay(progress=False))["tpu"]
    [padding] = [f for f in t.findings() if f["kind"] == "padding"]
    assert "whether the model reads its mask was not tried (the model raised" in padding["message"]
    assert "takes no mask input" not in padding["message"] and "may help: pass the mask" not in padding["advice"]


def test_a_length_the_model_itself_raises_at_is_its_limit_in_practice_not_the_targets_failure(corpus, tmp_path):
    """Rule: a blocker is the target's; what the model does on every device is said as the model's. ProphetNet's
    decoder reads position ids one past its sequence (its predicting streams), so at its config's 128 positions it
    raises eagerly ("index out of range"), on any device: stage 3 called that a compile failure, a blocker on both
    targets, and stage 4 crashed on the 128-token bucket. Now the eager run decides: one work finding at the model's
    line with the length, the plan's questions open; stage 4 skips the bucket saying why."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    from portkit.stages.accuracy import target_check
    row = next(r for r in zoo_build.enumerate_rows(["seq2seq-lm"]) if r.model_type == "prophetnet")
    m = registry.load(str(zoo_build.build(row, tmp_path, {})))
    top = m.max_length
    raised = m.raises_eagerly(m.encode(corpus.sample(1, seed=0), pad_to=top))
    assert raised and raised["where"]["file"].endswith("modeling_prophetnet.py")
    trace = make_trace(corpus, m, 4, seed=1)
    t = stage.replay_targets(m, trace, [], {"tpu": stage.plan_buckets([16, top], "optimal", k=2)},
                             {"tpu": economics.neuron_estimate(10**6)}, replay=stage.Replay(progress=False))["tpu"]
    found = [f for f in t.findings() if f["kind"] in ("model_raises", "compile_failed")]
    assert found and {f["kind"] for f in found} == {"model_raises"} and all(f["severity"] == "work" for f in found)
    assert f"the model itself raises at length {top}" in found[0]["message"]
    assert found[0]["owner"]["owner"] != "user" and t.open_questions()
    checked = target_check._checked_bucket(types.SimpleNamespace(model=m), (16, top, corpus.sample(2, seed=0), 0),
                                           None, None, None)
    assert checked["skipped"].startswith(f"not checked: the model itself raises at length {top}")
