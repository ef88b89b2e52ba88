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


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows(["seq2seq-lm"]) if r.model_type == "t5")
    return registry.load(str(zoo_build.build(row, tmp_path_factory.mktemp("zoo"), {})))


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


def test_the_report_asks_about_serving_once_the_decoding_was_assessed():
    """Rule: one question per cause: DECODING where the run did not generate, SERVING (the buckets and graphs stages
    3 and 3b make for causal LMs only) where stage 2 did; other questions are kept."""
    asked = [{"stage": "model", **seq2seq.DECODING}, {"stage": "xla", "question": "HBM fit", "why": "x"}]
    assert seq2seq.after_generation(asked, False) == asked
    after = seq2seq.after_generation(asked, True)
    assert after == [{"stage": "model", **seq2seq.SERVING}, asked[1]]
