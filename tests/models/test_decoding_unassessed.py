"""An encoder-decoder's autoregressive decoding: the stages run its decoder on a fixed input (Whisper: the encoder
and one decoder step; T5: a teacher-forced target), so decoding token by token (the decoder's length growing, its KV
cache) is named as not assessed in every target's `unassessed` and in the verdict's reason, and no verdict is ready
without it. A tiny Whisper saved as a user's directory, run through stage 1 with the other stages skipped."""
import numpy as np
import pytest
import torch

from portkit.models import registry
from portkit.models import seq2seq
from portkit.runfolder import results
from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
from portkit.stages.report.stage import build_report


def _whisper(folder):
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
                        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=3)
    WhisperForConditionalGeneration(cfg).save_pretrained(folder)
    WhisperFeatureExtractor().save_pretrained(folder)
    return str(folder)


def _run_stage_1_only(m, inputs, out):
    """Stage 1 on tpu, every other stage saved as skipped: the verdict rests on stage 1 and the model's questions."""
    settings = RecordSettings(description="test batch")
    find_fallbacks(m, inputs, ["tpu"], settings).save(out / "fallbacks.json")
    for stage in ("compile", "buckets", "xla", "accuracy"):
        with pytest.raises(results.StageSkipped):
            results.skip_stage(out, stage, m.describe(), ["tpu"], "not this test's")
    return build_report(run_dir=out).to_dict()["targets"]["tpu"]


def test_a_speech_encoder_decoder_is_never_ready_without_its_decoding_assessed(tmp_path):
    """Rule: an encoder-decoder's decoding is assessed as generation or named in `unassessed` and the verdict's
    reason. The same stage-1-only run of an encoder (BERT) has nothing unassessed; Whisper's is not assessed,
    by name."""
    m = registry.load(registry.validate(_whisper(tmp_path / "whisper")))
    assert m.not_assessed == (seq2seq.DECODING,) and m.describe()["not_assessed"] == [seq2seq.DECODING]
    waves = [np.sin(np.linspace(0, 400, 16000)).astype(np.float32)] * 2
    (tmp_path / "w").mkdir()
    tpu = _run_stage_1_only(m, m.encode(waves), tmp_path / "w")
    question = seq2seq.DECODING["question"]
    assert tpu["based_on"] == ["fallbacks"] and tpu["unassessed"] == [f"model: {question}"]
    assert tpu["open_questions"] == [{"stage": "model", **seq2seq.DECODING}]
    assert tpu["verdict"] == "not assessed"
    assert tpu["verdict_reason"].startswith(f"model: {question} not assessed ({seq2seq.DECODING['why']})")
    encoder = registry.load("bert")
    assert encoder.not_assessed == ()
    (tmp_path / "e").mkdir()
    inputs = encoder.encode(["open a file", "return the sum of two numbers"], pad_to=16)
    assert _run_stage_1_only(encoder, inputs, tmp_path / "e")["unassessed"] == []


def test_every_encoder_decoder_names_its_decoding_as_not_assessed():
    """Rule: the question is the model's, read from its modules (one owner: seq2seq.not_assessed): T5 fed a
    teacher-forced target names it too; a causal LM (decoded by the generate workload) and an encoder do not."""
    assert registry.load("t5-pairs").not_assessed == (seq2seq.DECODING,)
    assert registry.load("t5").not_assessed == (seq2seq.DECODING,)
    assert registry.load("gpt2").not_assessed == ()


def test_a_detr_style_detector_decodes_its_queries_in_one_pass_and_has_nothing_to_decode_token_by_token(tmp_path):
    """Rule: a DETR-style detector's config says is_encoder_decoder, but its decoder takes a fixed set of object
    queries (num_queries) in one pass, which the stages run whole: its decoding is no open question. Conditional
    DETR (a public architecture at tiny size, no timm backbone) against a config without num_queries (T5's kind)."""
    from types import SimpleNamespace
    from transformers import ConditionalDetrConfig, ConditionalDetrForObjectDetection, ResNetConfig
    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage2"])
    detr = ConditionalDetrForObjectDetection(ConditionalDetrConfig(
        use_timm_backbone=False, backbone_config=backbone, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=5,
        num_labels=3))
    assert detr.config.is_encoder_decoder and seq2seq.not_assessed(detr) == ()
    seq2seq_like = torch.nn.Module()
    seq2seq_like.config = SimpleNamespace(is_encoder_decoder=True)
    assert seq2seq.not_assessed(seq2seq_like) == (seq2seq.DECODING,)


def test_a_classifier_on_an_encoder_decoders_config_has_no_decoding_to_assess():
    """Rule: WhisperForAudioClassification holds Whisper's config (is_encoder_decoder) but only its encoder and a
    classification head: it cannot generate, so its decoding is no open question (the zoo's Whisper audio classifier
    was "not assessed" for it); Whisper's generating model still names it."""
    from transformers import WhisperConfig, WhisperForAudioClassification, WhisperForConditionalGeneration
    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
                        max_target_positions=32, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=3)
    assert WhisperForAudioClassification(cfg).config.is_encoder_decoder
    assert seq2seq.not_assessed(WhisperForAudioClassification(cfg)) == ()
    assert seq2seq.not_assessed(WhisperForConditionalGeneration(cfg)) == (seq2seq.DECODING,)
