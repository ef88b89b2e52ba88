"""Generation with a bucketed static KV cache: same tokens as eager, no compile after warm-up,
the overflow policy. Tiny from-config llama (seeded weights), real corpus prompts."""
import pytest
import torch

from portkit.targets import backends
from portkit.workloads import generation
from portkit.models import registry
from portkit.core.errors import BadParameter
from tests.fixtures.sections import read_section


@pytest.fixture(scope="module")
def llama():
    return registry.load("llama")


def test_static_cache_same_tokens_as_eager_and_no_compile_after_warm_up(llama, corpus):
    texts = corpus.sample(3, seed=1)
    plan = generation.Plan(prompt_buckets=(8,), context_buckets=(16, 32), batch=4)
    new = 10                     # 8 prompt + 10 new tokens crosses the 16-token context bucket
    reference = generation.generate_static(llama, texts, new, plan)
    backend = backends.emulated_backend("tpu", "highest")      # fp32 matmuls: the same numerics as eager
    run = generation.generate_static(llama, texts, new, plan, backend=backend)
    assert run.truncated == sum(n > 8 for n in llama.token_lengths(texts)) > 0
    assert torch.equal(run.tokens, reference.tokens)
    assert run.tokens.shape == (3, new)
    assert run.warmup_compiles == 3          # one prefill, one decode per context bucket
    assert run.compiles == 0                 # and none during a generation under fail_on_recompile
    # Neuron's int64 -> int32 rule: the static cache's index_copy_ positions stay int64 (numerics.LONG_INDICES)
    neuron = generation.generate_static(llama, texts, new, plan, backend=backends.emulated_backend("neuron", "none"))
    assert neuron.compiles == 0 and torch.equal(neuron.tokens, reference.tokens)


def test_prompt_longer_than_largest_bucket_follows_overflow_policy(llama):
    long_text = "word " * 40
    truncate = generation.Plan(prompt_buckets=(8, 16), context_buckets=(32,), batch=2)
    run = generation.generate_static(llama, [long_text, "short"], 4, truncate)
    assert run.truncated == 1 and run.tokens.shape == (2, 4)
    error = generation.Plan(prompt_buckets=(8, 16), context_buckets=(32,), batch=2, overflow="error")
    with pytest.raises(BadParameter, match="prompt length"):
        generation.generate_static(llama, [long_text], 4, error)
    with pytest.raises(BadParameter, match="context length"):
        generation.generate_static(llama, ["short"], 40, truncate)
    with pytest.raises(BadParameter, match="overflow"):
        generation.Plan((8,), (16,), 1, overflow="wrap")


def test_dynamic_cache_compiles_every_token_until_the_recompile_limit(llama):
    import torch._dynamo
    with torch._dynamo.config.patch(recompile_limit=2):
        run = generation.generate_dynamic(llama, ["Return a copy", "x"], 4, backends.emulated_backend("tpu"))
    assert run.compiles == 2                          # prefill, then one per decode length, until the limit
    assert run.eager_from_step == 2                   # token 2's decode step is the first to run eagerly
    assert any("size mismatch" in g for g in run.guard_failures)
    assert run.tokens.shape == (2, 4)


def test_stage_2_compiles_generation_with_both_caches_per_target(llama, corpus):
    from portkit.stages.compile.stage import Options, check_generation
    from portkit.stages.report.stage import TargetReport
    found = check_generation(llama, corpus, ["tpu"], Options.of({"new_tokens": 3, "prompts": 2}))
    tpu = found["tpu"]
    assert tpu.backend == "portkit_tpu" and tpu.plan["prompt_buckets"][0] == generation.MIN_PROMPT_BUCKET
    assert tpu.dynamic.compiles > 1 and tpu.dynamic.tokens.shape == tpu.static.tokens.shape == (2, 3)
    assert tpu.static.compiles == 0 and tpu.static.warmup_compiles >= 2      # all in warm-up, none after
    saved = tpu.to_dict()
    assert saved["static"]["compiles"] == 0 and saved["dynamic"]["first_guard_failure"]
    assert "0 during the generation under fail_on_recompile" in saved["summary"]
    out = TargetReport("tpu", "TPU", "emulated")
    read_section("compile", out, target={"generation": saved})
    assert out.metrics["compile"]["generation, static cache"].endswith(
        f"0 after; tokens agree {saved['token_agreement']:.0%}")


def test_the_generate_workload_needs_a_causal_lm_and_says_so_before_the_run():
    from portkit.stages.compile.stage import Options
    with pytest.raises(BadParameter, match="workload .generate.*minilm is neither \\(its kind: embedding;"):
        Options.of({"workload": "generate"}, model="minilm")
    with pytest.raises(BadParameter, match="unknown workload 'decode'; choose one of: inference, generate, train"):
        Options.of({"workload": "decode"})
    Options.of({"workload": "generate"}, model="gpt2")
    plan = generation.plan_for([5, 40, 300], new_tokens=16, batch=3, max_prompt=64)
    assert (plan.prompt_buckets, plan.context_buckets) == ((16, 32, 64), (32, 64, 128))


def test_stage_4_generation_agreement_counts_a_near_tie_apart_from_a_clear_divergence(llama, corpus):
    from portkit.stages.accuracy.stage import Options, check_generation
    from portkit.stages.accuracy.generation import TargetGeneration, _prompt
    found = check_generation(llama, corpus, ["neuron", "tpu"],
                                      Options.of({"new_tokens": 6, "batch_size": 2}))   # 2 prompts
    for name, result in found.targets.items():     # left-padded prompts: no NaN under either target's numerics
        assert all(e == e for p in result.prompts for e in p.step_errors), name
    assert found.targets["neuron"].agreement == 1.0 and found.targets["neuron"].passed   # fp32 matmuls
    assert found.to_dict()["targets"]["tpu"]["precision"] == "default"
    from portkit.stages.report.stage import TargetReport
    out = TargetReport("neuron", "Trainium", "emulated")
    read_section("accuracy", out, data={"generation": found.to_dict()})
    assert out.metrics["accuracy"]["generation (greedy tokens)"] == "PASS: agree 100.0%, 100.0% with near-ties apart"
    ref_logits = [torch.tensor([[0.0, 1.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0]]), torch.tensor([[0.0] * 7 + [2.0]])]
    tie = [torch.tensor([[0.0, 1.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0]]), torch.tensor([[0.0] * 7 + [2.0]])]
    ref_logits[0][0, 5] = 2.99                     # the reference picks token 2 by a 0.01 margin
    tie[0][0, 5] = 3.02                            # the target's 0.03 error flips it to token 5
    prompt = _prompt(torch.tensor([[2, 7]]), ref_logits, torch.tensor([[5, 7]]), tie, 0)
    assert (prompt.first_divergence, prompt.agreement) == (0, 0.5)
    assert prompt.margin == pytest.approx(0.01) and prompt.near_tie
    sure = [torch.tensor([[0.0, 1.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0]]), tie[1]]   # the reference: a 2-logit margin
    flipped = [torch.tensor([[0.0, 1.0, 1.9, 0.0, 0.0, 2.1, 0.0, 0.0]]), tie[1]]  # a 1.1 error flips it anyway
    prompt = _prompt(torch.tensor([[2, 7]]), sure, torch.tensor([[5, 7]]), flipped, 0)
    assert prompt.margin == pytest.approx(2.0) and prompt.error_at_divergence == pytest.approx(1.1)
    assert not prompt.near_tie
    judged = TargetGeneration("tpu", "default", 0.99, [prompt])
    assert not judged.passed and "FAIL" in judged.summary() and judged.judged_agreement == 0.5


def test_stage_3_prices_prefill_and_decode_buckets_against_the_serving_stacks_powers_of_two(corpus):
    from portkit.stages.buckets.stage import Options, serving_plans
    from portkit.planning import economics
    from portkit.stages.buckets.generation import lengths
    from portkit.stages.report.stage import TargetReport
    gpt2 = registry.load("gpt2")
    costs = {"neuron": economics.neuron_estimate(gpt2.parameters),
             "tpu": economics.CostModel("tpu", economics.MEASURED_XLA, "measured XLA (test stand-in)", 1.0, 0.002)}
    found = serving_plans(gpt2, corpus, costs, token_seconds=2e-5,
                          options=Options.of({"workload": "generate", "new_tokens": 16, "serve_requests": 100_000}))
    prompts, contexts = lengths(gpt2, corpus, 16)
    assert (contexts == prompts + 16).all() and contexts.max() <= gpt2.max_length
    for name, t in found.targets.items():
        auto, pow2 = t["auto"], t["pow2"]
        assert pow2["prompt"]["boundaries"][0] == generation.MIN_PROMPT_BUCKET
        assert all(b & (b - 1) == 0 for b in pow2["prompt"]["boundaries"][:-1])       # powers of two, then the top
        assert auto["prompt"]["boundaries"][-1] == prompts.max() and auto["context"]["boundaries"][-1] == contexts.max()
        assert auto["compiles"] == len(auto["prompt"]["boundaries"]) + len(auto["context"]["boundaries"])
        # auto minimises warm-up + padding for each set, so it never costs more than pow2 in total
        assert auto["warmup_seconds"] + auto["padding_seconds"] <= pow2["warmup_seconds"] + pow2["padding_seconds"]
    assert found.targets["neuron"]["auto"]["compiles"] < found.targets["tpu"]["auto"]["compiles"]   # 20 s a graph
    out = TargetReport("tpu", "TPU", "emulated")
    read_section("buckets", out, data={"generation": found.to_dict()})
    assert "warm-up compiles" in out.metrics["buckets"]["generation buckets (auto)"]
    with pytest.raises(BadParameter, match="causal"):
        serving_plans(registry.load("minilm"), corpus, costs, 2e-5,
                              Options.of({"workload": "generate", "new_tokens": 16, "serve_requests": 100_000}))
    assert serving_plans(gpt2, corpus, costs, 2e-5, Options.defaults()) is None   # no serving plans but to generate


def test_both_targets_share_one_trace_of_each_generation_and_get_what_their_own_trace_gives(llama, monkeypatch):
    """Rule: static-shape targets compile the same graphs, so stage 2 traces each generation graph once for both
    emulated targets (shared_trace.Turns), and each target's compiles, eager step and tokens are those of a trace of
    its own."""
    from portkit.targets import shared_trace
    texts, plan = ["Return a copy of the list", "x"], generation.Plan((8,), (16,), 2)
    fp32 = {"neuron": "none", "tpu": "highest"}      # each target's precision without matmul rounding
    # 3 new tokens: a prefill and two decode lengths, so each dynamic-cache run recompiles once its guard fails
    each = {n: (generation.generate_static(llama, texts, 3, plan, backend=backends.emulated_backend(n, p)),
                generation.generate_dynamic(llama, texts, 3, backends.emulated_backend(n, p)))
            for n, p in fp32.items()}
    traced = []
    calls = shared_trace.Turns.__call__
    monkeypatch.setattr(shared_trace.Turns, "__call__", lambda self, gm, ex, **kw: traced.append(1) or calls(
        self, gm, ex, **kw))
    static = generation.generate_static_for(llama, texts, 3, plan,
                                            {n: backends.emulated_backend(n, p) for n, p in fp32.items()})
    assert len(traced) == each["tpu"][0].warmup_compiles == 2       # one prefill, one decode: traced once, not twice
    dynamic = generation.generate_dynamic_for(llama, texts, 3,
                                              {n: backends.emulated_backend(n, p) for n, p in fp32.items()})
    for name, (own_static, own_dynamic) in each.items():
        assert (static[name].warmup_compiles, static[name].compiles) == (own_static.warmup_compiles, 0)
        assert torch.equal(static[name].tokens, own_static.tokens)
        assert (dynamic[name].compiles, dynamic[name].eager_from_step) == (own_dynamic.compiles,
                                                                          own_dynamic.eager_from_step)
        assert torch.equal(dynamic[name].tokens, own_dynamic.tokens)
        assert own_dynamic.compiles > 1, name      # the comparison spans a recompile
