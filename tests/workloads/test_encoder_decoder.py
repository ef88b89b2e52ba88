"""An encoder-decoder's generation (portkit/workloads/encoder_decoder.py): the encoder once, then one decoder step per
token with transformers' EncoderDecoderCache, eagerly as transformers' own greedy generate decodes, and compiled for
the targets (stage 2): the dynamic caches compile every token, the static ones compile once per source bucket in
the warm-up and never after. Real architectures built from their configs (T5 by the zoo's builder, a tiny Whisper)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from conftest import ROOT
from portkit.models import registry
from portkit.models import seq2seq
from portkit.workloads import encoder_decoder, generation

TEXTS = ["Open the file, read every line, and return the sum of the numbers in it.",
         "A model that runs on one device should give the same answer on another."]


def _zoo(model_type: str, folder):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows(["seq2seq-lm"]) if r.model_type == model_type)
    return registry.load(str(zoo_build.build(row, folder, {})))


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return _zoo("t5", tmp_path_factory.mktemp("zoo"))


def test_eager_generation_with_either_cache_is_transformers_own_greedy_decoding(t5):
    """Rule: portkit's decoding loop is the model's greedy generate: the same tokens with the static and the dynamic
    caches, and as transformers' generate gives them from the same sources."""
    plan = generation.plan_of(t5, TEXTS, 6)
    assert plan.prompt_buckets == (16, 32) and plan.context_buckets == (16,)     # the longer source over 16 tokens
    static = generation.generate_eager(t5, TEXTS, 6, plan, keep_logits=True)
    dynamic = generation.generate_eager(t5, TEXTS, 6, plan, keep_logits=True, cache="dynamic")
    assert static.mode == "static" and dynamic.mode == "dynamic"
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), rtol=1e-4, atol=1e-4)
    model = encoder_decoder.decoder_model(t5)
    enc = t5.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1)
    assert torch.equal(static.tokens, ref[:, 1:]) and torch.equal(dynamic.tokens, ref[:, 1:])


def test_stage_2_compiles_the_decoding_token_by_token_and_the_static_caches_once(t5):
    """Rule: the decoding is assessed as generation: the dynamic caches compile the encoder and every token (a
    storm on a static-shape target); the static caches compile each source bucket's encoder and first two decoder
    steps in the warm-up and nothing under fail_on_recompile."""
    from portkit.stages.compile.generation import check
    found = check(t5, TEXTS, ["neuron", "tpu"], 4, "auto")
    for name, g in found.items():
        assert g.dynamic.compiles == 1 + 4, name
        assert g.static.warmup_compiles == 3 * len(g.plan["prompt_buckets"]) and g.static.compiles == 0
        assert g.agreement == 1.0 and g.findings() == [] and g.open_questions() == []
        assert "2 sources x 4 new tokens" in g.summary() and "source buckets [16, 32]" in g.summary()
        assert g.to_dict()["plan"]["encoder_decoder"] is True


def test_a_speech_encoder_decoder_decodes_from_its_fixed_window(tmp_path):
    from tests.models.test_decoding_unassessed import _whisper
    whisper = registry.load(registry.validate(_whisper(tmp_path / "whisper")))
    clips = [np.sin(np.linspace(0, 400 * (i + 1), 16000)).astype(np.float32) for i in range(2)]
    plan = generation.plan_of(whisper, clips, 4)
    assert plan.prompt_buckets == (3000,) and plan.batch == 2      # the feature extractor's 30 s of frames
    static = generation.generate_eager(whisper, clips, 4, plan)
    dynamic = generation.generate_eager(whisper, clips, 4, plan, cache="dynamic")
    assert static.tokens.shape == (2, 4) and torch.equal(static.tokens, dynamic.tokens)
    # one source shape: stage 3 has nothing to bucket, and stage 2's window and decoder context are the serving plan
    assert encoder_decoder.fixed_source(whisper) and whisper.seq_dim is None


def test_stage_3_plans_an_encoder_decoders_source_buckets_and_one_decoder_context(t5, corpus):
    """Rule: an encoder-decoder is served with source buckets (the encoder and the cross-attention cache) and one
    decoder context (its length is the tokens generated, whatever the source); each source bucket is the three
    graphs stage 2's warm-up compiles, per batch size, every one priced."""
    from portkit.planning import economics
    from portkit.stages.buckets.stage import Options, distribution, serving_plans
    from tests.fixtures.sections import read_section
    from portkit.stages.report.stage import TargetReport
    assert not encoder_decoder.fixed_source(t5)
    costs = {"neuron": economics.neuron_estimate(t5.parameters),
             "tpu": economics.CostModel("tpu", economics.MEASURED_XLA, "measured XLA (test stand-in)", 1.0, 0.002)}
    found = serving_plans(t5, corpus, costs, token_seconds=2e-5,
                          options=Options.of({"workload": "generate", "new_tokens": 20, "serve_requests": 100_000,
                                              "max_batch": 2}))
    longest = int(min(distribution(corpus, t5).lengths.max(), t5.max_length))
    assert found.kind == "encoder-decoder" and found.batch_sizes == (1, 2)
    for name, t in found.targets.items():
        for plan in ("auto", "pow2"):
            p = t[plan]
            assert p["context"]["boundaries"] == [32]       # 20 new tokens, rounded up as stage 2 compiles them
            assert p["prompt"]["boundaries"][-1] == longest, (name, plan)
            assert p["compiles"] == 2 * encoder_decoder.GRAPHS_PER_SOURCE * len(p["prompt"]["boundaries"])
        assert t["pow2"]["prompt"]["boundaries"][0] == generation.MIN_PROMPT_BUCKET
        auto, pow2 = t["auto"], t["pow2"]
        assert auto["warmup_seconds"] + auto["padding_seconds"] <= pow2["warmup_seconds"] + pow2["padding_seconds"]
    assert "source" in found.summary() and "decoder context" in str(found.table())
    out = TargetReport("neuron", "AWS Trainium", "emulated")
    read_section("buckets", out, data={"generation": found.to_dict()})
    assert out.metrics["buckets"]["generation buckets (auto)"].startswith("source [")


def test_the_report_asks_about_serving_once_the_decoding_was_assessed():
    """Rule: one question per cause: DECODING where the run did not generate, SERVING (the source buckets and decoder
    context) where stage 2 did and stage 3 did not plan them, none where both did; other questions are kept."""
    asked = [{"stage": "model", **seq2seq.DECODING}, {"stage": "xla", "question": "HBM fit", "why": "x"}]
    assert seq2seq.after_generation(asked, False) == asked
    assert seq2seq.after_generation(asked, False, True) == asked        # planned buckets, decoding never run
    after = seq2seq.after_generation(asked, True)
    assert after == [{"stage": "model", **seq2seq.SERVING}, asked[1]]
    assert seq2seq.after_generation(asked, True, True) == [asked[1]]


def test_stage_3b_compiles_the_decode_step_with_both_caches_for_a_tpu(t5, tmp_path):
    """Rule: an encoder-decoder's serving graphs are assessed, not left open: its decode step is compiled by XLA with
    the self-attention cache (donated) and the cross-attention cache (the encoder's length) in HBM, each counted
    from its shape, and the largest batch that fits is searched; a speech model's is at its fixed window, the
    encoder's output length (Whisper: 1500 positions for 3000 frames)."""
    from tests.models.test_decoding_unassessed import _whisper
    from portkit.stages.xla import seq2seq_serving
    found = seq2seq_serving.serve(t5, ([16, 32], [16]), "stage 3's serving plan", 2, "v5e:1x1")
    assert found["status"] == "compiled" and found["largest_batch"] >= 2, found["summary"]
    config = encoder_decoder.decoder_model(t5).config
    per_position = 2 * config.num_decoder_layers * 2 * config.num_heads * config.d_kv * 4   # keys and values, fp32
    breakdown = found["decode"]["breakdown"]
    assert breakdown["KV cache"] == 16 * per_position and breakdown["cross-attention cache"] == 32 * per_position
    assert "at a 32-token source bucket" in found["summary"]
    whisper = registry.load(registry.validate(_whisper(tmp_path / "whisper")))
    speech = seq2seq_serving.serve(whisper, ([3000], [16]), "stage 2's", 1, "v5e:1x1")
    assert speech["status"] == "compiled" and speech["encoded"] == 1500, speech["summary"]
    assert "its fixed source window (1500 encoded positions)" in speech["summary"]


def test_an_moe_encoders_output_reaches_the_decoder_steps_whole(tmp_path):
    """Rule: the decoder steps get the encoder's states in the encoder's own output class, as transformers' generate
    passes them: Switch Transformers reads router_logits from it (a BaseModelOutput made stage 2 call the model's
    generation "refused" for portkit's own wrapper)."""
    switch = _zoo("switch_transformers", tmp_path)
    plan = generation.plan_of(switch, TEXTS, 4)
    static = generation.generate_eager(switch, TEXTS, 4, plan)
    model = encoder_decoder.decoder_model(switch)
    enc = switch.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**enc, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1)
    assert torch.equal(static.tokens, ref[:, 1:])


def test_a_decode_step_the_conversion_cannot_trace_names_the_models_line(tmp_path):
    """Rule: a serving graph portkit's PyTorch-to-JAX conversion stops is "trace_failed" (an open question, never a
    crash), with the model's line that stopped it (M2M100's positions compare a traced cache position); a decoder
    without cross-attention (an EncoderDecoderModel's BERT decoder built without it) carries no cross cache."""
    from portkit.stages.xla import seq2seq_serving
    m2m = _zoo("m2m_100", tmp_path / "m2m")
    found = seq2seq_serving.serve(m2m, ([16], [16]), "test", 1, "v5e:1x1")
    assert found["status"] == "trace_failed" and "modeling_m2m_100.py" in found["summary"], found["summary"]
    bert = _zoo("encoder-decoder", tmp_path / "bert")
    assert "cross_keys" not in seq2seq_serving.step_inputs(bert, 1, 16, 16)
    assert seq2seq_serving.serve(bert, ([16], [16]), "test", 1, "v5e:1x1")["status"] in ("compiled", "trace_failed")


def test_a_decoder_step_the_model_raises_in_leaves_the_serving_graphs_open(t5, monkeypatch):
    """Rule: stage 3b's probe of the decoder step is the model's call: where the model raises in it (its own code,
    not portkit's), the serving graphs' HBM fit is an open question with what it raised, never a crash of the stage."""
    from portkit.stages.xla import seq2seq_serving
    from portkit.stages.xla.generation import NOT_KV

    def raising(*args, **kwargs):
        raise ValueError("this decoder refuses the cache it is given")
    monkeypatch.setattr(seq2seq_serving, "_PROBES", type(seq2seq_serving._PROBES)())
    monkeypatch.setattr(encoder_decoder, "decode", raising)
    found = seq2seq_serving.serve(t5, ([16], [16]), "test", 1, "v5e:1x1")
    assert found["status"] == NOT_KV and "refuses the cache it is given" in found["summary"]
