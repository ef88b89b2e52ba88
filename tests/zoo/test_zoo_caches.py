"""Generation on the caches the zoo found portkit breaking on, each model built from its transformers config at the
zoo's tiny size (benchmarks/zoo_build.py): Gemma2's sliding-window cache layers, whose Python position count makes a
decode step compile again after warm-up (a finding with its guard and line, not a crash), and Mamba2's and Jamba's
state-space layers, whose cache holds fixed-size states instead of keys and values (moved between context buckets,
and stage 3b's key/value serving graph "not assessed" for them, not a crash)."""
import sys

import pytest
import torch

from conftest import ROOT
from portkit.core import grading

from portkit.models import registry
from portkit.targets import backends
from portkit.workloads import generation

sys.path.insert(0, str(ROOT))
from benchmarks import zoo_build, zoo_rules  # noqa: E402

TEXTS = ["def add(a, b):\n    return a + b", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The zoo's causal-LM rows, built on demand into one folder (a row's directory is built once)."""
    rows = {r.key: r for r in zoo_build.enumerate_rows(["causal-lm"])}
    folder, tokenizers, loaded = tmp_path_factory.mktemp("zoo"), {}, {}

    def load(key: str):
        if key not in loaded:
            loaded[key] = registry.load(str(zoo_build.build(rows[key], folder, tokenizers)))
        return loaded[key]
    return load


def test_a_sliding_window_cache_that_recompiles_after_warm_up_is_a_finding_with_its_guard(zoo):
    """Rule: whatever the model does inside a stage is a finding with cause, line and owner, and the stage goes on.
    Gemma2's StaticSlidingWindowLayer counts positions in a Python int that the attention mask reads, so every
    decode step fails a guard and compiles: counted, named, and the tokens still equal the eager run's."""
    from portkit.stages.compile.generation import TargetGeneration
    from portkit.targets import specs
    lm = zoo("gemma2.causal-lm")
    plan = generation.Plan(prompt_buckets=(16,), context_buckets=(32,), batch=2)
    reference = generation.generate_static(lm, TEXTS, 4, plan)
    run = generation.generate_static(lm, TEXTS, 4, plan, backend=backends.emulated_backend("tpu", "highest"))
    assert torch.equal(run.tokens, reference.tokens)
    assert run.late and run.compiles == len(run.late) > 0
    assert "cumulative_length_int" in run.late[0]["reason"]
    found = TargetGeneration(specs.detect("tpu").to_dict(), "portkit_tpu", 2, 4,
                                                {"prompt_buckets": [16]}, run, run)
    [(kind, case, message, _, where)] = found.findings()
    assert kind == "recompile_after_warmup" and grading.severity(kind, case) == "work"
    assert f"{len(run.late)} compile(s) after warm-up" in message and "cumulative_length_int" in message
    assert where["file"].endswith("transformers/masking_utils.py")    # transformers' line, not the user's


def test_a_sliding_window_cache_keeps_its_position_count_when_it_moves_bucket(zoo):
    """Rule: the bucketed static cache gives the tokens of an unbucketed one. Moving Gemma2's cache into a larger
    context bucket keeps its sliding-window layers' position count (eagerly: no compile)."""
    lm = zoo("gemma2.causal-lm")
    moved = generation.generate_static(lm, TEXTS, 24, generation.Plan((16,), (32, 64), 2))
    whole = generation.generate_static(lm, TEXTS, 24, generation.Plan((16,), (64,), 2))
    assert torch.equal(moved.tokens, whole.tokens)


@pytest.mark.parametrize("key", ["mamba2.causal-lm", "jamba.causal-lm"])
def test_a_state_space_cache_moves_bucket_with_its_states(zoo, key):
    """Rule: a model whose cache is not a key/value cache never crashes the generation workload. Mamba2's and
    Jamba's Mamba layers keep conv and recurrent states, moved whole into the next context bucket."""
    lm = zoo(key)
    moved = generation.generate_static(lm, TEXTS, 24, generation.Plan((16,), (32, 64), 2))
    whole = generation.generate_static(lm, TEXTS, 24, generation.Plan((16,), (64,), 2))
    assert torch.equal(moved.tokens, whole.tokens)


def test_a_state_space_model_compiles_its_generation_once_per_bucket(zoo):
    """Rule: static-cache generation compiles in warm-up and never after, Mamba2's state-space cache included
    (stage 2 crashed on it: its cache layers have no keys)."""
    lm = zoo("mamba2.causal-lm")
    plan = generation.Plan(prompt_buckets=(16,), context_buckets=(32, 64), batch=2)
    reference = generation.generate_static(lm, TEXTS, 18, plan)
    run = generation.generate_static(lm, TEXTS, 18, plan, backend=backends.emulated_backend("tpu", "highest"))
    # prefill, then one decode: its states do not grow with the context and it takes no mask in decode (as its own
    # generate), so the decode graph at 32 positions serves 64 as well
    assert run.warmup_compiles == 2 and run.compiles == 0 and not run.late
    assert torch.equal(run.tokens, reference.tokens)


@pytest.mark.parametrize("key", ["mamba2.causal-lm", "jamba.causal-lm"])
def test_stage_3b_compiles_a_state_space_models_serving_graphs_with_its_states_in_hbm(zoo, key):
    """Rule: a stage that could assess a question does not leave it open for a reason of portkit's. Mamba2's cache
    (no attention heads at all) and Jamba's (Mamba layers beside attention) hold conv and recurrent states: the
    serving graph carries them beside any keys and values, donated, and their bytes are a part of HBM of their own.
    They were "not assessed" (the graph carried keys and values only); the conversion also needed torchax's copy_
    from a view (the conv state keeps its last positions), portkit.tpu_compile.lowerings."""
    from portkit.stages.xla.generation import compile_serving, not_kv_cache, state_shapes
    lm = zoo(key)
    assert not_kv_cache(lm) is None and state_shapes(generation.causal_model(lm))
    for name, graph in compile_serving(lm, batch=2, prompt=16, context=32, topology="v5e:1x1").items():
        assert graph.status == "compiled" and graph.fits, (name, graph.message)
        assert graph.breakdown["recurrent states"] > 0
        assert (graph.breakdown["KV cache"] == 0) == (key == "mamba2.causal-lm")
    assert not_kv_cache(zoo("gemma2.causal-lm")) is None


def test_a_multimodal_models_serving_cache_is_sized_from_its_text_config(zoo):
    """Rule: a stage that could assess a question does not leave it open for a reason of portkit's. Gemma3's top
    config (image and text) names no attention heads; its text config does, and its StaticCache is built from it.
    Stage 3b left the serving graphs' HBM fit "not assessed" for it ("names no num_attention_heads")."""
    from portkit.stages.xla.generation import cache_shapes, not_kv_cache
    lm = zoo("gemma3.causal-lm")
    model = generation.causal_model(lm)
    text = model.config.get_text_config(decoder=True)
    assert not getattr(model.config, "num_attention_heads", None) and not_kv_cache(lm) is None
    keys, values = cache_shapes(model, 2, 32)
    assert keys[0] == text.num_hidden_layers and keys[2] == text.num_key_value_heads and keys[3] == 32


def test_t5s_n_positions_is_not_called_the_models_maximum(tmp_path):
    """Rule: a limit portkit set is named as portkit's, never as the model's. T5's published configs carry
    n_positions=512, but T5's attention uses relative position buckets and has no position table, so 512 is
    portkit's cap there, and says so."""
    import json
    from portkit.corpora import corpus
    rows = {r.key: r for r in zoo_build.enumerate_rows(["seq2seq-lm"])}
    folder = zoo_build.build(rows["t5.seq2seq-lm"], tmp_path, {})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_positions": 512}))    # as t5-small's config
    lm = registry.load(str(folder))
    assert (lm.max_length, lm.max_length_from) == (512, None)
    said = corpus.limit_text(lm.max_length, "tokens", lm.max_length_from)
    assert said == "512 tokens (portkit's cap, not the model's)"


def test_mixtrals_grouped_matmul_is_a_foreign_op_of_its_compiled_graph(zoo):
    """Rule: every op outside PyTorch's own namespaces in a compiled graph is recorded as foreign (so stage 2 makes
    it a foreign_op finding). Mixtral's experts run transformers::grouped_mm_fallback, which sat in the zoo's
    compiled graph with no finding."""
    lm = zoo("mixtral.causal-lm")
    model = generation.causal_model(lm).eval()
    backend = backends.emulated_backend("tpu")
    ids = torch.ones(1, 8, dtype=torch.long)
    torch.compiler.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch.compiler.reset()
    foreign = {op["op"] for check in backend.checks for op in check.foreign_ops}
    assert "transformers::grouped_mm_fallback" in foreign
    assert all(op.split("::")[0] not in ("aten", "prims") for op in foreign)


def test_a_finding_in_portkits_audio_wrapper_is_portkits_and_the_zoo_rule_agrees(tmp_path):
    """Rule: portkit's own code is owner portkit, never the user's. wav2vec2's CTC adapter (portkit/models/audio.py,
    the frame mask's int64 arange) was a finding owned by "user"; frames names it portkit's, and the zoo's rule,
    which flags a user's finding in a portkit file, passes that finding and fires on the old owner."""
    import inspect
    import json
    from portkit.core import owners
    from portkit.models import audio
    lines, first = inspect.getsourcelines(audio.CTCAdapter.forward)
    line = first + next(i for i, text in enumerate(lines) if "torch.arange" in text)
    where = owners.place(inspect.getsourcefile(audio.CTCAdapter), line, "forward", lines[line - first])
    owner = owners.owner(where)
    assert owner["owner"] == owners.PORTKIT
    finding = {"kind": "int64", "severity": "work", "owner": owner, "where": where}
    for found, fires in ((finding, False), ({**finding, "owner": {**owner, "owner": owners.USER}}, True)):
        (tmp_path / "fallbacks.json").write_text(json.dumps({"targets": {"neuron": {"findings": [found]}}}))
        assert bool(zoo_rules.user_findings_not_in_portkit(zoo_rules.Run.read(tmp_path))) == fires


def test_a_static_cache_the_model_raises_with_is_a_finding_and_the_stages_go_on(zoo):
    """Rule: whatever the model does inside a stage is a finding with its cause, line and owner, and the stage goes
    on. transformers' StaticCache has no layer for DeepSeek V4's compressed-attention layer types (it raises
    KeyError while it is built): stages 1, 2 and 3b crashed on it. Now stage 2 makes it one work finding at
    transformers' line, with the dynamic cache's compiles per token measured; stage 1 records the dynamic-cache
    generation and says so; stage 3b's key/value serving graph is "not assessed" with the reason."""
    from portkit.stages.compile.generation import check
    from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
    from portkit.stages.xla.generation import not_kv_cache
    lm = zoo("deepseek_v4.causal-lm")
    [found] = check(lm, TEXTS, ["tpu"], 2, "auto").values()
    assert found.static is None and found.dynamic.compiles >= 1 and not found.open_questions()
    [(kind, case, message, advice, where)] = found.findings()
    assert kind == "static_cache" and grading.severity(kind, case) == "work"
    assert "KeyError: 'heavily_compressed_attention'" in message and "compiles for 2 tokens" in message
    assert where["file"].endswith("transformers/cache_utils.py") and advice.startswith("a lead, not tried")
    assert found.to_dict()["refused"]["static"]["cache"] == "static"
    assert "StaticCache cannot be built" in not_kv_cache(lm)
    # a model with a cache of its own refuses the StaticCache in its forward: the serving graph's question, not a crash
    refusal = not_kv_cache(zoo("minimax.causal-lm"))
    assert "refused by MiniMaxForCausalLM" in refusal and "modeling_minimax.py" in refusal, refusal
    inputs = lm.encode(TEXTS, 16)
    recorded = find_fallbacks(lm, inputs, ["tpu"], RecordSettings(workload="generate", prompts=TEXTS))
    assert "dynamic KV cache (the static one raises: KeyError" in recorded.inputs["description"]
    assert recorded.recorded["calls"] > 0


def test_a_model_that_raises_in_generation_with_every_cache_leaves_generation_open(zoo):
    """Rule: a stage that assessed nothing says "not assessed" for that question, and the stage goes on. CPM-Ant
    builds its own attention mask from a prompt prefix and raises in portkit's greedy step with either cache, eagerly
    as compiled: stage 2 leaves generation an open question (no finding, no crash), stage 1 records the forward
    pass and says why, stage 4's generation comparison is "not assessed"."""
    from portkit.stages.accuracy.generation import compare
    from portkit.stages.accuracy.stage import Options
    from portkit.stages.compile.generation import check
    from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
    lm = zoo("cpmant.causal-lm")
    [found] = check(lm, TEXTS, ["neuron"], 2, "auto").values()
    assert found.static is None and found.dynamic is None and found.findings() == []
    [(question, why)] = found.open_questions()
    assert question.startswith("generation on neuron") and "modeling_cpmant.py" in why
    assert found.to_dict()["token_agreement"] is None
    recorded = find_fallbacks(lm, lm.encode(TEXTS, 16), ["neuron"], RecordSettings(workload="generate", prompts=TEXTS))
    assert recorded.inputs["description"].startswith("prompts; the forward pass (generation not recorded")
    compared = compare(lm, TEXTS, ["tpu"], Options.of({"new_tokens": 2}))
    assert compared.summary().startswith("generation not assessed") and not compared.targets


def test_an_exception_in_portkits_own_decoding_loop_is_raised_not_called_the_models():
    """Rule: a stage fails only for a defect in portkit, and never blames the model for one. An exception whose
    innermost frame outside torch is portkit's decoding loop is re-raised by generation.refused."""
    with pytest.raises(KeyError):
        try:
            generation._pad_batch({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 2)
        except KeyError as exc:
            generation.refused(exc, "static")


def test_a_state_space_models_step_gets_the_mask_its_own_generate_passes(zoo):
    """Rule: portkit's decoding loop calls a model the way the model's own generate() does. FalconMamba multiplies
    its hidden states by the attention mask, so it takes the prompt's mask in prefill and none in decode
    (its prepare_inputs_for_generation); handed the cache-wide mask it raised in stages 1 and 2. Now the bucketed
    static cache gives the dynamic cache's tokens, and compiles in warm-up only."""
    lm = zoo("falcon_mamba.causal-lm")
    plan = generation.Plan((16,), (32, 64), 2)
    static = generation.generate_static(lm, TEXTS, 20, plan)
    dynamic = generation.generate_dynamic(lm, TEXTS, 20, None, max_length=16)
    assert torch.equal(static.tokens, dynamic.tokens)
    run = generation.generate_static(lm, TEXTS, 20, plan, backend=backends.emulated_backend("tpu", "highest"))
    assert run.compiles == 0 and torch.equal(run.tokens, static.tokens)
