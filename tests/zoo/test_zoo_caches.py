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
    assert run.warmup_compiles == 3 and run.compiles == 0 and not run.late      # prefill, decode at 32 and at 64
    assert torch.equal(run.tokens, reference.tokens)


@pytest.mark.parametrize("key", ["mamba2.causal-lm", "jamba.causal-lm"])
def test_stage_3b_leaves_a_state_space_models_serving_graphs_not_assessed(zoo, key):
    """Rule: a stage that assessed nothing says "not assessed" for that question. Stage 3b's serving graph carries
    a key/value cache; Mamba2's (no attention heads at all) and Jamba's caches are not one, so their HBM fit is an
    open question, not a crash sizing a cache by num_attention_heads."""
    from portkit.stages.xla.generation import NOT_KV, not_kv_cache
    from portkit.stages.xla import stage
    lm = zoo(key)
    assert "LinearAttentionLayer" in not_kv_cache(lm)
    served = stage._serving(lm, None, stage.Options.defaults())
    assert served["status"] == NOT_KV and "not assessed" in served["summary"]
    [question] = stage.XlaStage({}, {}, {}, serving={"tpu": served}).workload_questions("tpu")
    assert question["question"] == "HBM fit of the serving graphs" and "LinearAttentionLayer" in question["why"]
    assert not_kv_cache(zoo("gemma2.causal-lm")) is None


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
