"""Hugging Face models as users save them: a directory of every common task (small configs of real
architectures, random weights, their own processors built without downloads), a Hub id served from a
cache the test lays out, a config without weights, and the inputs refused in the plan step."""
import json
import re
import shutil

import numpy as np
import pytest
import torch

from portkit import cli
from portkit.core.errors import BadParameter, NeedsNetwork
from portkit.corpora import images
from portkit.models import meta_device
from portkit.models.huggingface import (CAPTIONS, minilm_tokenizer, position_offset, positions_after_padding,
                                        read_config, task_of,
    tokenizer_problems, tokenizer_roundtrip)
from portkit.models import inputs
from portkit.models import registry

WORDS = "the a of to and in is it for on return sum numbers open network socket add two hello world".split()


def _tokenizer(folder, words=WORDS, spelled: bool = True):
    """A WordPiece of `words`; where `spelled`, with each letter as a continuation too, so that a word it does not
    hold is spelled, never [UNK] (the plan step refuses a tokenizer that reads prose as [UNK])."""
    from transformers import BertTokenizerFast
    folder.mkdir(parents=True, exist_ok=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters, ".", ",",
              *(f"##{c}" for c in letters if spelled)]
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(dict.fromkeys(tokens))})   # transformers 5 takes vocab=


def _save(folder, model, *processors):
    torch.manual_seed(0)
    model.save_pretrained(folder)
    for processor in processors:
        processor.save_pretrained(folder)
    return folder


def _text_dir(tmp_path, name, build):
    tokenizer = _tokenizer(tmp_path / "tok")
    return _save(tmp_path / name, build(len(tokenizer)), tokenizer)


def _bert_classifier(vocab):
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=64, num_labels=3))


def _gpt2(vocab):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=1, n_head=2))


def _t5(vocab):
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                               num_decoder_layers=1, num_heads=2, decoder_start_token_id=0))


TEXTS = ["return the sum of two numbers", "open a network socket", "hello world"]


@pytest.mark.parametrize("build,kind,rank", [(_bert_classifier, inputs.CLASSIFIER, 2),
                                             (_gpt2, inputs.CAUSAL_LM, 3), (_t5, inputs.SEQ2SEQ_LM, 3)])
def test_text_directories_load_through_their_task_and_tokenizer(tmp_path, build, kind, rank):
    folder = _text_dir(tmp_path, "m", build)
    assert registry.validate(str(folder)) == str(folder)
    m = registry.load(str(folder))
    assert m.kind == kind and m.declaration.primary.metric == kind and m.tokenizer_name == "m"
    batch = m.encode(TEXTS, pad_to=12)
    with torch.no_grad():
        logits = m(batch)["logits"]
    assert logits.shape[0] == 3 and logits.dim() == rank
    assert tokenizer_roundtrip(m, TEXTS) is None       # its own tokenizer gives the text back


def _whisper(tmp_path, **extractor):
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    cfg = WhisperConfig(vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
                        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=3)
    return _save(tmp_path / "whisper", WhisperForConditionalGeneration(cfg), WhisperFeatureExtractor(**extractor))


def test_a_saved_whisper_directory_loads_and_runs_on_its_feature_extractors_input(tmp_path):
    folder = _whisper(tmp_path)
    assert registry.validate(str(folder)) == str(folder)
    m = registry.load(str(folder))
    assert m.declaration.data == inputs.AUDIO and m.declaration.fixed_shape
    waves = [np.sin(np.linspace(0, 400, n)).astype(np.float32) for n in (8000, 16000)]
    batch = m.encode(waves)
    assert batch["input_features"].shape == (2, 80, 3000)
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, 60)


def test_a_whisper_audio_classifier_runs_on_its_feature_extractors_window(tmp_path):
    """WhisperForAudioClassification (Whisper's encoder and a head) reads the same log-mel window as Whisper: fed as
    such, where the plan step refused it ("neither a waveform front end nor a fixed spectrogram window")."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows(["audio-classification"]) if r.model_type == "whisper")
    folder = zoo_build.build(row, tmp_path, {})
    m = registry.load(registry.validate(str(folder)))
    waves = [np.sin(np.linspace(0, 400, n)).astype(np.float32) for n in (8000, 16000)]
    batch = m.encode(waves)
    assert set(batch) == {"input_features"} and batch["input_features"].shape[0] == 2
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, len(json.loads((folder / "config.json").read_text())["id2label"]))


def test_a_whisper_directory_whose_feature_extractor_does_not_fit_is_refused_in_one_line(tmp_path):
    folder = _whisper(tmp_path, chunk_length=10)
    with pytest.raises(BadParameter, match=r"makes 1000 frames and its encoder takes 3000"):
        registry.validate(str(folder))


@pytest.mark.parametrize("family, model_type, missing", [
    ("speech-seq2seq", "speech_to_text", "Speech2TextFeatureExtractor) names no fixed window"),   # log-mel, any length
    ("speech-seq2seq", "moonshine", "Wav2Vec2FeatureExtractor) names no fixed window"),          # the raw waveform
    ("seq2seq-lm", "audioflamingo3", "is not an encoder-decoder")])      # an audio-text model in the seq2seq mapping
def test_a_seq2seq_model_portkit_cannot_feed_is_refused_in_one_line(tmp_path, family, model_type, missing):
    """Rule: bad input is refused in one line before anything runs, never a stage crash. portkit feeds speech
    encoder-decoders the Whisper way (a fixed window of log-mel features) and seq2seq models as encoder-decoders;
    Speech2Text's and Moonshine's extractors (no nb_max_frames) and Audio Flamingo 3 (a decoder-only audio-text model
    transformers maps as seq2seq), built from their configs at the zoo's size, crashed stages 1 and 2."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows([family]) if r.model_type == model_type)
    folder = zoo_build.build(row, tmp_path, {})
    with pytest.raises(BadParameter, match=re.escape(missing)) as refused:
        registry.validate(str(folder))
    assert "\n" not in str(refused.value) and "declaring-a-model.md" in str(refused.value)


def _w2v_config(**extra):
    from transformers import Wav2Vec2Config
    return Wav2Vec2Config(vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, conv_dim=(16,) * 7, feat_extract_norm="layer",
                          do_stable_layer_norm=True, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                          **extra)


@pytest.mark.parametrize("task", ["ctc", "audio-classification"])
def test_wav2vec2_directories_run_on_framed_waveforms(tmp_path, task):
    from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC, Wav2Vec2ForSequenceClassification
    cls = Wav2Vec2ForCTC if task == "ctc" else Wav2Vec2ForSequenceClassification
    folder = _save(tmp_path / "w2v", cls(_w2v_config(num_labels=4)), Wav2Vec2FeatureExtractor())
    assert task_of(read_config(folder)) == task
    m = registry.load(registry.validate(str(folder)))
    batch = m.encode([np.random.default_rng(0).standard_normal(n).astype(np.float32) for n in (3200, 6400)])
    with torch.no_grad():
        logits = m(batch)["logits"]
    assert logits.shape == ((2, 20, 12) if task == "ctc" else (2, 4))


def _vit(tmp_path, side):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor
    model = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64, num_labels=5))
    return _save(tmp_path / f"vit{side}", model, ViTImageProcessor(size={"height": side, "width": side}))


def test_an_image_classifier_directory_uses_its_image_processor(tmp_path):
    m = registry.load(registry.validate(str(_vit(tmp_path, 32))))
    assert m.image_size == 32 and m.kind == inputs.IMAGE_CLASSIFIER
    batch = m.encode(images.sample_images(2, 32, seed=0))
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    assert batch["pixel_values"].min() < 0            # normalised by the processor (mean 0.5, std 0.5)
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, 5)
    with pytest.raises(BadParameter, match=r"makes 224x224 images and its config takes 32x32"):
        registry.validate(str(_vit(tmp_path, 224)))


def test_a_vision_language_encoder_is_a_zero_shot_image_classifier(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    tokenizer = _tokenizer(tmp_path / "tok", WORDS + ["photo", "cat", "dog"])
    cfg = CLIPConfig(text_config={"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
                     vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                                    "num_hidden_layers": 1, "num_attention_heads": 2}, projection_dim=16)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    folder = _save(tmp_path / "clip", CLIPModel(cfg), processor, tokenizer)
    m = registry.load(registry.validate(str(folder)))
    with torch.no_grad():
        assert m(m.encode(images.sample_images(3, m.image_size, seed=0)))["logits"].shape == (3, len(CAPTIONS))


def test_a_vocabulary_larger_than_the_config_is_refused_in_the_plan_step(tmp_path, monkeypatch, capsys):
    tokenizer = _tokenizer(tmp_path / "tok")
    folder = _save(tmp_path / "lm", _gpt2(20), tokenizer)
    with pytest.raises(BadParameter, match=rf"vocab_size \(20\) is smaller than its tokenizer's vocabulary "
                                           rf"\({len(tokenizer)}\).*resize_token_embeddings"):
        registry.validate(str(folder))
    _one_line_exit_2(tmp_path, monkeypatch, capsys, str(folder), "vocab_size (20)")


def _one_line_exit_2(tmp_path, monkeypatch, capsys, model, expected):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()          # what the test printed before (save_pretrained's progress bar) is not the CLI's
    code = cli.main(["run", "--no-progress", "--out", str(tmp_path / "run"), "--model", model])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "run").exists()


def test_tasks_portkit_cannot_feed_are_refused_in_one_line_with_the_way_to_declare_them(tmp_path, monkeypatch,
                                                                                        capsys):
    from transformers import BertConfig, BertForQuestionAnswering
    folder = _save(tmp_path / "qa", BertForQuestionAnswering(BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)))
    with pytest.raises(BadParameter, match=r"'BertForQuestionAnswering'.*speech recognition.*file.py:build"):
        registry.validate(str(folder))
    _one_line_exit_2(tmp_path, monkeypatch, capsys, str(folder), "BertForQuestionAnswering")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "no-such-type", "architectures": ["X"]}')
    with pytest.raises(BadParameter, match="model_type.*'no-such-type'"):
        registry.validate(str(tmp_path / "odd"))


def test_a_module_path_with_a_typo_in_a_submodule_fails_in_the_plan_step(tmp_path, monkeypatch, capsys):
    with pytest.raises(BadParameter, match=r"unknown module in portkit 'modelz'; choose one of: .*models"):
        registry.validate("portkit.modelz:build")
    assert registry.validate("portkit.models.registry:load") == "portkit.models.registry:load"
    _one_line_exit_2(tmp_path, monkeypatch, capsys, "portkit.modelz:build", "'modelz'")


def _hub_cache(tmp_path, folder, repo="org/tiny"):
    """A Hugging Face cache as huggingface_hub lays it out: models--org--name/snapshots/<commit>, refs/main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return tmp_path / "hub", commit


def test_a_hub_id_loads_from_the_cache_pinned_to_its_commit(tmp_path, monkeypatch):
    cache, commit = _hub_cache(tmp_path, _text_dir(tmp_path, "m", _bert_classifier))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert registry.validate("org/tiny") == f"org/tiny@{commit}"
    m = registry.load(f"org/tiny@{commit}")
    assert m.name == "org/tiny" and commit in m.origin and m.kind == inputs.CLASSIFIER
    assert registry.size_hint("org/tiny") > 0
    with torch.no_grad():
        assert m(m.encode(TEXTS))["logits"].shape == (3, 3)
    with pytest.raises(NeedsNetwork, match=r"'org/missing'.*tried revision main in the Hugging Face cache "
                                           r".*hf download org/missing"):
        registry.validate("org/missing")


def test_a_config_without_weights_is_a_real_size_model_on_the_meta_device(tmp_path, monkeypatch):
    from transformers import GPT2Config
    GPT2Config(vocab_size=500, n_positions=128, n_embd=64, n_layer=2, n_head=4).save_pretrained(tmp_path / "cfg")
    (tmp_path / "cfg" / "config.json").write_text((tmp_path / "cfg" / "config.json").read_text().replace(
        '"model_type"', '"architectures": ["GPT2LMHeadModel"], "model_type"'))
    monkeypatch.chdir(tmp_path)
    spec = registry.validate("cfg")
    assert spec == str(tmp_path / "cfg") and meta_device.is_name(spec) and not meta_device.is_name("cfg")
    module = meta_device.build(spec)
    assert meta_device.is_abstract(module)
    described = meta_device.describe(module)
    assert described["abstract"] and described["name"] == "cfg" and described["kind"] == "causal-lm"
    assert meta_device.text_shape(module, 1, 128) == {"input_ids": ((1, 128), "int64")}
    with pytest.raises(BadParameter, match="no weights"):
        registry.load(spec)
    cache, commit = _hub_cache(tmp_path, tmp_path / "cfg", "org/cfg-only")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert meta_device.is_name(registry.validate("org/cfg-only"))


def test_a_config_without_weights_of_another_task_is_refused(tmp_path):
    from transformers import WhisperConfig
    WhisperConfig(d_model=32).save_pretrained(tmp_path / "w")
    text = (tmp_path / "w" / "config.json").read_text()
    (tmp_path / "w" / "config.json").write_text(
        text.replace('"model_type"', '"architectures": ["WhisperForConditionalGeneration"], "model_type"'))
    with pytest.raises(BadParameter, match="holds no weights.*not speech-seq2seq"):
        registry.validate(str(tmp_path / "w"))


def test_a_tokenizer_that_loses_the_text_is_a_finding(tmp_path):
    from transformers import BertModel, BertConfig
    broken = _tokenizer(tmp_path / "tok", words=[], spelled=False)
    broken.backend_tokenizer.pre_tokenizer = None     # no word splitting: whole texts, unknown, become [UNK]
    folder = _save(tmp_path / "m", BertModel(BertConfig(vocab_size=len(broken), hidden_size=32, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=64)), broken)
    m = registry.load(str(folder))
    found = tokenizer_roundtrip(m, TEXTS)
    assert found is not None and found["lost"] > 0.5
    assert found["message"].startswith("tokenizer does not round-trip: ") and "% of characters lost" in found["message"]
    # stage 1 reports it for every target, a cause of its own that torch.compile does not change
    from portkit.stages import reconcile
    from portkit.stages.fallbacks import stage
    report = stage.find_fallbacks(m, m.encode(TEXTS[:2], pad_to=16), ["neuron", "tpu"],
                                  stage.RecordSettings(texts=TEXTS)).to_dict()
    for target in ("neuron", "tpu"):
        [f] = [f for f in report["targets"][target]["findings"] if f["kind"] == "tokenizer_roundtrip"]
        assert f["severity"] == "blocker" and f["occurrences"]["lost"] == found["lost"]
        [kept] = reconcile.reconcile([f], None, target)
        assert kept["severity"] == "blocker"


def test_offset_positions_follow_the_embeddings_padding_index():
    """RoBERTa-style models start their positions after the padding id: 514 positions hold 512 tokens; MPNet fixes
    its padding index at 1 whatever the config says. Checked on the real MPNet: the longest sequence portkit allows
    runs, one more token indexes past the position table."""
    from transformers import MPNetConfig, MPNetModel
    assert position_offset({"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 514}) == 2
    assert position_offset({"model_type": "bert", "pad_token_id": 0}) == 0
    config = MPNetConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=24, pad_token_id=0)
    model = MPNetModel(config).eval()
    longest = config.max_position_embeddings - position_offset(config.to_dict())
    model(input_ids=torch.full((1, longest), 5))
    with pytest.raises(IndexError):
        model(input_ids=torch.full((1, longest + 1), 5))


def test_which_models_number_positions_after_the_padding_id_is_read_from_their_modeling_files():
    """Rule: the offset is decided by the installed transformers' code (create_position_ids_from_input_ids), not by a
    list of names: ESM, missing from such a list, crashed stage 4 at its longest bucket. Checked on the real ESM:
    the longest sequence portkit allows runs, one more token indexes past the position table."""
    from transformers import EsmConfig, EsmForMaskedLM
    assert positions_after_padding("esm") and positions_after_padding("xlm-roberta")
    assert not positions_after_padding("bert") and not positions_after_padding("llama")
    config = EsmConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32, max_position_embeddings=24, pad_token_id=1,
                       position_embedding_type="absolute")
    model = EsmForMaskedLM(config).eval()
    longest = config.max_position_embeddings - position_offset(config.to_dict())
    assert longest == 22
    model(input_ids=torch.full((1, longest), 5))
    with pytest.raises(IndexError):
        model(input_ids=torch.full((1, longest + 1), 5))


def test_a_spectrogram_audio_classifier_runs_on_its_feature_extractors_window(tmp_path):
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification
    folder = tmp_path / "ast"
    ASTForAudioClassification(ASTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_labels=3,
                                        intermediate_size=64, max_length=64, num_mel_bins=32)).save_pretrained(folder)
    ASTFeatureExtractor(num_mel_bins=32, max_length=64).save_pretrained(folder)
    registry.validate(str(folder))
    m = registry.load(str(folder))
    waves = [np.sin(np.linspace(0, 300, n)).astype(np.float32) for n in (8000, 16000)]
    batch = m.declaration.batch(waves)
    assert tuple(batch["input_values"].shape) == (2, 64, 32)              # one fixed window: nothing varies
    assert tuple(m.module(**batch)["logits"].shape) == (2, 3)


REMOTE_CODE = '''import torch
from torch import nn
try:
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None


class TinyCustomModel(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.proj = nn.Linear(8, 8).cuda()

    def forward(self, x):
        with torch.cuda.amp.autocast():
            return self.proj(x)
'''


def test_a_hub_models_remote_code_is_scanned_without_running_it(tmp_path, monkeypatch, capsys):
    """A Hub model whose config maps to its own code: the plan step refuses to run it (pointing at `portkit scan`),
    and `portkit scan org/custom` reads that code statically from the cache: the hard-coded .cuda(), the
    torch.cuda.amp autocast and the optional flash-attn import, each with its line."""
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "tiny-custom", "architectures": ["TinyCustomModel"],
        "auto_map": {"AutoModel": "modeling_custom.TinyCustomModel"}}))
    (folder / "modeling_custom.py").write_text(REMOTE_CODE)
    cache, _ = _hub_cache(tmp_path, folder, "org/custom")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(BadParameter, match="portkit scan"):
        registry.validate("org/custom")
    assert cli.main(["scan", "org/custom", "--target", "tpu"]) == 0
    out = capsys.readouterr().out
    assert "scanned 1 file(s)" in out and "nothing imported or run" in out
    assert "modeling_custom.py:12" in out and "[blocker] .cuda()" in out     # the .cuda() in __init__
    assert "flash" in out.lower() and "amp" in out
    assert cli.main(["scan", str(tmp_path / "nowhere.txt")]) == 2


def _wordpiece_vocabulary_under_bpe(folder):
    """Another model's tokenizer files: MiniLM's WordPiece vocabulary (30522 entries, "##" continuations) read by
    a BPE tokenizer with no merges, as a tokenizer.json of the wrong class writes it: every word is split into
    single characters, and nothing fails."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(tokenizer_models.BPE(vocab=minilm_tokenizer().get_vocab(), merges=[], unk_token="[UNK]"))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.Whitespace(), decoders.BPEDecoder()
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]", pad_token="[PAD]")


def test_a_tokenizer_of_another_model_is_refused_in_the_plan_step(tmp_path, monkeypatch, capsys):
    """Rule: the plan step reads the directory's tokenizer on plain prose and refuses one that is not the model's
    (single characters from a large vocabulary, unknown tokens, few of the embedding table's rows reached, a lossy
    round trip) in one line, exit 2, nothing written. A tiny BERT whose embedding table has 50265 rows (RoBERTa's)
    beside a WordPiece vocabulary under a BPE class; the same BERT with MiniLM's own tokenizer passes."""
    from transformers import BertConfig, BertModel
    bert = BertModel(BertConfig(vocab_size=50265, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))
    folder = _save(tmp_path / "bert", bert, _wordpiece_vocabulary_under_bpe(tmp_path / "tok"))
    with pytest.raises(BadParameter, match=r"its tokenizer \(\w+, model BPE, 30522 entries for "
                                           r"a 50265-row embedding table\) is not this model's: it splits text into "
                                           r"single characters \(4\.0 tokens per word of 4\.0 characters\)"):
        registry.validate(str(folder))
    _one_line_exit_2(tmp_path, monkeypatch, capsys, str(folder), "splits text into single characters")
    own = _save(tmp_path / "own", bert, minilm_tokenizer())
    assert registry.validate(str(own)) == str(own)


def test_each_rule_of_the_tokenizer_check_reads_a_tokenizer_built_to_break_it(tmp_path):
    """Rule: each of the plan step's tokenizer rules, on the tokenizer it is there for: a vocabulary that maps
    prose to its unknown token, one that reaches under half the embedding table; MiniLM's own passes them all."""
    tiny = _tokenizer(tmp_path / "tiny", WORDS)
    assert tokenizer_problems(tiny, {"vocab_size": len(tiny)}) == []        # spelled, not [UNK]
    from transformers import BertTokenizerFast
    words_only = BertTokenizerFast(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])})
    (unknown, lossy) = tokenizer_problems(words_only, {"vocab_size": len(words_only)})
    assert "tokens of plain English are its unknown token '[UNK]' (portkit refuses over 5%)" in unknown
    assert "decoding its ids loses" in lossy
    (table,) = tokenizer_problems(tiny, {"vocab_size": 4 * len(tiny)})
    assert table == f"its {len(tiny)} entries reach 25% of the model's {4 * len(tiny)}-row embedding table"
    assert tokenizer_problems(minilm_tokenizer(), {"vocab_size": 30522}) == []


def test_a_detector_and_a_segmenter_are_image_models_with_their_declared_metrics(tmp_path):
    """Rule pinned: an object detector (YOLOS, a public architecture at tiny size) is loaded with its class logits
    and boxes per query as two declared outputs (detection, boxes), a semantic segmenter (SegFormer) with its
    per-pixel logits (segmentation); each runs on its own processor's batches."""
    from transformers import (SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor, YolosConfig,
                              YolosForObjectDetection, YolosImageProcessor)
    yolos = YolosForObjectDetection(YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64, num_detection_tokens=5,
                                                num_labels=3))
    folder = _save(tmp_path / "yolos", yolos, YolosImageProcessor(size={"height": 32, "width": 32}))
    m = registry.load(registry.validate(str(folder)))
    assert m.kind == inputs.DETECTION
    assert [(o.name, o.metric) for o in m.declaration.outputs] == [("logits", inputs.DETECTION),
                                                                    ("pred_boxes", inputs.BOXES)]
    with torch.no_grad():
        out = m(m.encode(images.sample_images(2, m.image_size, seed=0)))
    assert out["logits"].shape == (2, 5, 4) and out["pred_boxes"].shape == (2, 5, 4)
    segformer = SegformerForSemanticSegmentation(SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                                 hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                                 decoder_hidden_size=32, num_labels=3))
    folder = _save(tmp_path / "segformer", segformer, SegformerImageProcessor(size={"height": 32, "width": 32}))
    m = registry.load(registry.validate(str(folder)))
    assert m.kind == inputs.SEGMENTATION and [o.metric for o in m.declaration.outputs] == [inputs.SEGMENTATION]
    with torch.no_grad():
        assert m(m.encode(images.sample_images(2, m.image_size, seed=0)))["logits"].shape == (2, 3, 8, 8)
