"""The conformance zoo: public architectures, built from their transformers configs at small sizes with seeded
weights, each saved as a user's Hugging Face directory and run through every stage that applies, on both targets.

    .venv/bin/python benchmarks/zoo.py [--workers 2] [--serial] [--quick] [--only bert,gpt2]
                                       [--stages fallbacks,compile,report] [--out runs/zoo] [--doc docs/zoo.md]

Each architecture is saved once (save_pretrained) into a cache folder under portkit's cache root
(portkit.corpora.corpus.cache_root: $PORTKIT_CACHE_DIR), its tokenizer, feature extractor or image processor
saved beside it, so that `portkit run --model DIR` loads it as it loads a user's directory. Nothing is downloaded:
text tokenizers are trained in-process on portkit's own corpus (the stdlib docstrings) with the `tokenizers`
library, a byte-level BPE or a WordPiece, and wrapped in PreTrainedTokenizerFast; feature extractors and image
processors are built from their defaults at the zoo's sizes.

The runs go through `portkit sweep` (portkit.run.sweep: one Ray task per architecture x target, `--workers` of
them at once), or with --serial through the runner, one run per architecture with both targets. A model whose
plan is refused, or that cannot be built, is a crash of the "plan" or "build" step and the others still run.

Writes docs/zoo.md (or --doc): one row per architecture with each stage's status, each target's verdict and
the first finding, and for each crash the stage and the first line of its error; with the date, the commit and
the command. Prints a last line of the form

    zoo: N architectures, K stage crashes, M not assessed (wall ...; host ...)

K counts architecture x stage pairs that failed (a stage failing on both targets is one crash); M counts
architecture x target verdicts "not assessed". Exit code 1 where K > 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from portkit.core.errors import PortkitError, StageFailed  # noqa: E402
from portkit.corpora import corpus as data  # noqa: E402
from portkit.run import runner  # noqa: E402
from portkit.runfolder import layout as runfolder  # noqa: E402

TARGETS = ("neuron", "tpu")
STAGE_ORDER = tuple(s.name for s in runfolder.STAGES)
# Small parameters of every stage; each run gets those its stages declare.
PARAMETERS = {"batch_size": 2, "seq_len": 16, "requests": 10, "bucket_count": 2, "max_shapes": 2,
              "train_steps": 2}
QUICK_PARAMETERS = {**PARAMETERS, "requests": 4, "max_shapes": 1}
QUICK = ("bert", "gpt2", "t5", "wav2vec2", "vit", "clip")     # one of each family, the cheapest
ZOO_MARKER = ".portkit-zoo"     # in the runs folder: a folder the zoo may clear before it runs again
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 2, 64, 128
IMAGE = 32                      # side of the zoo's images
TOKENIZER_TEXTS = 3000          # corpus texts the tokenizers are trained on
TOKENIZER_VOCAB = 1000


# ---------------------------------------------------------------- tokenizers, trained without downloads
def _texts() -> list[str]:
    return list(data.load_corpus().texts[:TOKENIZER_TEXTS])


def byte_bpe():
    """A GPT-2-style byte-level BPE: ids 0-4 are <pad>, <s>, </s>, <unk>, <mask>."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_texts(), vocab_size=TOKENIZER_VOCAB, min_frequency=2, show_progress=False,
                            special_tokens=["<pad>", "<s>", "</s>", "<unk>", "<mask>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", mask_token="<mask>")


def wordpiece():
    """A BERT-style lower-cased WordPiece: ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK]."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast
    from tokenizers.processors import TemplateProcessing
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(_texts(), vocab_size=TOKENIZER_VOCAB, show_progress=False,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    # each text as BERT reads it, [CLS] text [SEP] (CLIP pools its text at the end token)
    wp.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def check_tokenizer(tokenizer, name: str) -> None:
    """Real text encodes to known tokens: a tokenizer whose vocabulary was dropped maps every word to unk."""
    ids = tokenizer("Return the sum of two numbers, or raise ValueError.")["input_ids"]
    if not ids or sum(i == tokenizer.unk_token_id for i in ids) > len(ids) // 4:
        raise RuntimeError(f"{name}: the zoo's tokenizer maps real text to {tokenizer.unk_token}: {ids}")


# ---------------------------------------------------------------- the architectures
@dataclasses.dataclass(frozen=True)
class Arch:
    name: str           # the directory's name, and the row's
    family: str
    title: str          # the architecture's class
    tokenizer: str | None   # "bpe", "wordpiece" or None
    build: object       # build(tokenizer) -> (model, [processors saved beside it])


def _special(tok) -> dict:
    return {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id}


def _tower(tok) -> dict:
    """A text tower's ids: a WordPiece's [CLS] and [SEP] are its start and end tokens."""
    return {**_special(tok), "bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}


def _lm_ids(tok) -> dict:
    return {**_special(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def _bert(tok):
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                intermediate_size=FFN, max_position_embeddings=POSITIONS, **_special(tok))), []


def _roberta(tok):
    from transformers import RobertaConfig, RobertaForSequenceClassification
    # RoBERTa's positions start after the padding id: two more rows than the longest text
    return RobertaForSequenceClassification(RobertaConfig(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=POSITIONS + 2, num_labels=3, **_lm_ids(tok))), []


def _deberta(tok):
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification
    return DebertaV2ForSequenceClassification(DebertaV2Config(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=POSITIONS, num_labels=3, **_special(tok))), []


def _distilbert(tok):
    from transformers import DistilBertConfig, DistilBertForTokenClassification
    return DistilBertForTokenClassification(DistilBertConfig(
        dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, max_position_embeddings=POSITIONS,
        num_labels=5, **_special(tok))), []


def _electra(tok):
    from transformers import ElectraConfig, ElectraForMaskedLM
    return ElectraForMaskedLM(ElectraConfig(
        embedding_size=HIDDEN, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=POSITIONS, **_special(tok))), []


def _albert(tok):
    from transformers import AlbertConfig, AlbertModel
    return AlbertModel(AlbertConfig(embedding_size=16, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, intermediate_size=FFN,
                                    max_position_embeddings=POSITIONS, **_special(tok))), []


def _mpnet(tok):
    from transformers import MPNetConfig, MPNetModel
    return MPNetModel(MPNetConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                  intermediate_size=FFN, max_position_embeddings=POSITIONS + 2,
                                  **_lm_ids(tok))), []


def _decoder(config_name: str, model_name: str, **extra):
    def build(tok):
        import transformers
        config = getattr(transformers, config_name)(**{**_lm_ids(tok), **extra})
        return getattr(transformers, model_name)(config), []
    return build


_LLAMA_LIKE = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
               "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": POSITIONS}


def _seq2seq(config_name: str, model_name: str, start: str, **extra):
    def build(tok):
        import transformers
        ids = {**_lm_ids(tok), "decoder_start_token_id": getattr(tok, f"{start}_token_id")}
        config = getattr(transformers, config_name)(**{**ids, **extra})
        return getattr(transformers, model_name)(config), []
    return build


_BART_LIKE = {"d_model": HIDDEN, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
              "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "encoder_ffn_dim": FFN,
              "decoder_ffn_dim": FFN, "max_position_embeddings": POSITIONS}


def _whisper(_):
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    config = WhisperConfig(vocab_size=64, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                           encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                           decoder_ffn_dim=FFN, num_mel_bins=80, max_target_positions=32, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)
    return WhisperForConditionalGeneration(config), [WhisperFeatureExtractor()]


# wav2vec2-style feature encoders: seven convolutions (the published strides), narrow
_CONV = {"conv_dim": (16,) * 7, "feat_extract_norm": "layer", "do_stable_layer_norm": True,
         "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2, "hidden_size": HIDDEN,
         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": FFN}


def _waveform(config_name: str, model_name: str, **extra):
    def build(_):
        import transformers
        config = getattr(transformers, config_name)(**{**_CONV, **extra})
        return getattr(transformers, model_name)(config), [transformers.Wav2Vec2FeatureExtractor()]
    return build


def _ast(_):
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification
    config = ASTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       intermediate_size=FFN, num_mel_bins=128, max_length=256, num_labels=4)
    return ASTForAudioClassification(config), [ASTFeatureExtractor(num_mel_bins=128, max_length=256)]


_VIT_LIKE = {"image_size": IMAGE, "patch_size": 8, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "intermediate_size": FFN, "num_labels": 5}
_SQUARE = {"height": IMAGE, "width": IMAGE}


def _vit(_):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor
    return ViTForImageClassification(ViTConfig(**_VIT_LIKE)), [ViTImageProcessor(size=_SQUARE)]


def _deit(_):
    from transformers import DeiTConfig, DeiTForImageClassification, DeiTImageProcessor
    return DeiTForImageClassification(DeiTConfig(**_VIT_LIKE)), [DeiTImageProcessor(size=_SQUARE,
                                                                                     crop_size=_SQUARE)]


def _beit(_):
    from transformers import BeitConfig, BeitForImageClassification, BeitImageProcessor
    return BeitForImageClassification(BeitConfig(**_VIT_LIKE)), [BeitImageProcessor(size=_SQUARE,
                                                                                     crop_size=_SQUARE)]


def _convnext(_):
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessor
    config = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=IMAGE, num_labels=5)
    return ConvNextForImageClassification(config), [ConvNextImageProcessor(size={"shortest_edge": IMAGE})]


def _resnet(_):
    from transformers import ConvNextImageProcessor, ResNetConfig, ResNetForImageClassification
    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=5)
    return ResNetForImageClassification(config), [ConvNextImageProcessor(size={"shortest_edge": IMAGE})]


def _regnet(_):
    from transformers import ConvNextImageProcessor, RegNetConfig, RegNetForImageClassification
    config = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=5)
    return RegNetForImageClassification(config), [ConvNextImageProcessor(size={"shortest_edge": IMAGE})]


def _swin(_):
    from transformers import SwinConfig, SwinForImageClassification, ViTImageProcessor
    config = SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                        window_size=4, num_labels=5)
    return SwinForImageClassification(config), [ViTImageProcessor(size=_SQUARE)]


_TEXT_TOWER = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
               "num_attention_heads": HEADS, "max_position_embeddings": 64}
_VISION_TOWER = {"image_size": IMAGE, "patch_size": 8, "hidden_size": HIDDEN, "intermediate_size": FFN,
                 "num_hidden_layers": LAYERS, "num_attention_heads": HEADS}


def _clip(tok):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    config = CLIPConfig(text_config={**_TEXT_TOWER, **_tower(tok)}, vision_config=_VISION_TOWER,
                        projection_dim=16)
    processor = CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size=_SQUARE)
    return CLIPModel(config), [processor]


def _siglip(tok):
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel
    config = SiglipConfig(text_config={**_TEXT_TOWER, **_tower(tok)}, vision_config=_VISION_TOWER)
    return SiglipModel(config), [SiglipImageProcessor(size=_SQUARE)]


ZOO = (
    Arch("bert", "text encoder", "BertModel", "wordpiece", _bert),
    Arch("roberta", "text encoder", "RobertaForSequenceClassification", "bpe", _roberta),
    Arch("deberta-v2", "text encoder", "DebertaV2ForSequenceClassification", "wordpiece", _deberta),
    Arch("distilbert", "text encoder", "DistilBertForTokenClassification", "wordpiece", _distilbert),
    Arch("electra", "text encoder", "ElectraForMaskedLM", "wordpiece", _electra),
    Arch("albert", "text encoder", "AlbertModel", "wordpiece", _albert),
    Arch("mpnet", "text encoder", "MPNetModel", "bpe", _mpnet),
    Arch("gpt2", "decoder", "GPT2LMHeadModel", "bpe", _decoder(
        "GPT2Config", "GPT2LMHeadModel", n_positions=POSITIONS, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS)),
    Arch("llama", "decoder", "LlamaForCausalLM", "bpe", _decoder("LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE)),
    Arch("mistral", "decoder", "MistralForCausalLM", "bpe",
         _decoder("MistralConfig", "MistralForCausalLM", **_LLAMA_LIKE)),
    Arch("qwen2", "decoder", "Qwen2ForCausalLM", "bpe", _decoder("Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE)),
    Arch("gemma", "decoder", "GemmaForCausalLM", "bpe",
         _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=HIDDEN // HEADS, **_LLAMA_LIKE)),
    Arch("phi", "decoder", "PhiForCausalLM", "bpe", _decoder("PhiConfig", "PhiForCausalLM", **_LLAMA_LIKE)),
    Arch("mixtral", "decoder (mixture of experts)", "MixtralForCausalLM", "bpe", _decoder(
        "MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2, **_LLAMA_LIKE)),
    Arch("mamba", "decoder (state space)", "MambaForCausalLM", "bpe", _decoder(
        "MambaConfig", "MambaForCausalLM", hidden_size=HIDDEN, state_size=8, num_hidden_layers=LAYERS)),
    Arch("opt", "decoder", "OPTForCausalLM", "bpe", _decoder(
        "OPTConfig", "OPTForCausalLM", hidden_size=HIDDEN, ffn_dim=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, max_position_embeddings=POSITIONS, word_embed_proj_dim=HIDDEN)),
    Arch("gpt-neox", "decoder", "GPTNeoXForCausalLM", "bpe", _decoder(
        "GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, max_position_embeddings=POSITIONS)),
    Arch("falcon", "decoder", "FalconForCausalLM", "bpe", _decoder(
        "FalconConfig", "FalconForCausalLM", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, max_position_embeddings=POSITIONS)),
    Arch("bloom", "decoder", "BloomForCausalLM", "bpe", _decoder(
        "BloomConfig", "BloomForCausalLM", hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS)),
    Arch("t5", "seq2seq", "T5ForConditionalGeneration", "bpe", _seq2seq(
        "T5Config", "T5ForConditionalGeneration", "pad", d_model=HIDDEN, d_kv=16, d_ff=FFN, num_layers=LAYERS,
        num_decoder_layers=LAYERS, num_heads=HEADS)),
    Arch("bart", "seq2seq", "BartForConditionalGeneration", "bpe",
         _seq2seq("BartConfig", "BartForConditionalGeneration", "eos", **_BART_LIKE)),
    Arch("marian", "seq2seq", "MarianMTModel", "bpe", _seq2seq("MarianConfig", "MarianMTModel", "pad", **_BART_LIKE)),
    Arch("pegasus", "seq2seq", "PegasusForConditionalGeneration", "bpe",
         _seq2seq("PegasusConfig", "PegasusForConditionalGeneration", "pad", **_BART_LIKE)),
    Arch("whisper", "speech", "WhisperForConditionalGeneration", None, _whisper),
    Arch("wav2vec2", "speech", "Wav2Vec2ForCTC", None, _waveform("Wav2Vec2Config", "Wav2Vec2ForCTC", vocab_size=12)),
    Arch("hubert", "speech", "HubertForCTC", None, _waveform("HubertConfig", "HubertForCTC", vocab_size=12)),
    Arch("wavlm", "speech", "WavLMForSequenceClassification", None,
         _waveform("WavLMConfig", "WavLMForSequenceClassification", num_labels=4)),
    Arch("ast", "speech", "ASTForAudioClassification", None, _ast),
    Arch("vit", "vision", "ViTForImageClassification", None, _vit),
    Arch("deit", "vision", "DeiTForImageClassification", None, _deit),
    Arch("beit", "vision", "BeitForImageClassification", None, _beit),
    Arch("convnext", "vision", "ConvNextForImageClassification", None, _convnext),
    Arch("resnet", "vision", "ResNetForImageClassification", None, _resnet),
    Arch("regnet", "vision", "RegNetForImageClassification", None, _regnet),
    Arch("swin", "vision", "SwinForImageClassification", None, _swin),
    Arch("clip", "vision-language", "CLIPModel", "wordpiece", _clip),
    Arch("siglip", "vision-language", "SiglipModel", "wordpiece", _siglip),
)
BY_NAME = {a.name: a for a in ZOO}


# ---------------------------------------------------------------- building the directories
def cache_folder() -> Path:
    """The zoo's directories, keyed by this file and the transformers and tokenizers versions: a change to a
    builder builds every directory again."""
    import tokenizers
    import transformers
    key = hashlib.sha1(Path(__file__).read_bytes() + f"{transformers.__version__}|{tokenizers.__version__}"
                       .encode()).hexdigest()[:12]
    return data.cache_root() / "zoo" / key


def build(arch: Arch, folder: Path, tokenizers: dict) -> Path:
    """The architecture's directory (built and saved once: a folder holding DONE is complete)."""
    import torch
    target = folder / arch.name
    if (target / "DONE").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    tok = None
    if arch.tokenizer:
        if arch.tokenizer not in tokenizers:
            tokenizers[arch.tokenizer] = {"bpe": byte_bpe, "wordpiece": wordpiece}[arch.tokenizer]()
            check_tokenizer(tokenizers[arch.tokenizer], arch.tokenizer)
        tok = tokenizers[arch.tokenizer]
    torch.manual_seed(0)
    model, processors = arch.build(tok)
    partial = folder / f".{arch.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.eval().save_pretrained(partial)
    for processor in [*processors, *([tok] if tok is not None else [])]:
        processor.save_pretrained(partial)
    (partial / "DONE").write_text(f"{arch.title}\n")
    os.replace(partial, target)
    return target


# ---------------------------------------------------------------- running
def parameters_for(stages: list[str], chosen: dict) -> dict:
    """The zoo's parameters the chosen stages declare (a parameter no stage declares is refused)."""
    declared = runner.all_parameters(runner.select_stages(stages))
    return {k: v for k, v in chosen.items() if k in declared}


def first_line(text) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def run_sweep(models: dict, out: Path, stages, params: dict, workers: int) -> tuple[dict, dict]:
    """Every model x target as a Ray task (portkit sweep), `workers` at once. Returns ({name: {target: run
    folder}}, {name: (step, error)} for the models whose plan was refused)."""
    from portkit.run import sweep
    cells, refused = [], {}
    for name, folder in models.items():
        try:
            with redirect_stdout(io.StringIO()):
                cells += sweep.plan_sweep([str(folder)], list(TARGETS), out, params, stages=stages, log=lambda _: None)
        except PortkitError as exc:
            refused[name] = ("plan", first_line(exc))
    cores = os.cpu_count() or 1
    resources = sweep.Resources(cpus_per_task=max(cores / max(workers, 1), 0.01), memory_per_task_gib=2.0)
    if cells:
        outcome = sweep.run_sweep(cells, out, resources, progress=False, log=lambda line: print(f"  {line}"))
        for cell, record in zip(outcome.cells, outcome.records):
            if record["status"] == "failed" and not record.get("notebook"):   # no stage ran: the run itself failed
                refused.setdefault(Path(cell.model).name, ("run", first_line(record.get("error"))))
    dirs = {name: {t: out / runfolder.model_tag(str(folder)) / t for t in TARGETS} for name, folder in models.items()}
    return dirs, refused


def run_serial(models: dict, out: Path, stages, params: dict) -> tuple[dict, dict]:
    """One run per model with both targets, one after another (portkit.run.runner)."""
    dirs, refused = {}, {}
    for name, folder in models.items():
        run_dir = out / name
        start = time.perf_counter()
        try:
            with redirect_stdout(io.StringIO()):   # the plan step's line on each target's mode
                runner.run(str(folder), list(TARGETS), str(run_dir), params, stages, progress=False,
                           log=lambda _: None)
            how = "ok"
        except StageFailed:
            how = "a stage failed"
        except PortkitError as exc:
            refused[name] = ("plan", first_line(exc))
            how = f"refused: {first_line(exc)}"
        print(f"  {name}: {how} ({time.perf_counter() - start:.0f} s)", flush=True)
        dirs[name] = {t: run_dir for t in TARGETS}
    return dirs, refused


# ---------------------------------------------------------------- reading the runs
@dataclasses.dataclass
class Row:
    arch: Arch
    stages: dict = dataclasses.field(default_factory=dict)      # stage: status
    verdicts: dict = dataclasses.field(default_factory=dict)    # target: verdict
    finding: str = ""
    crashes: list = dataclasses.field(default_factory=list)     # (stage, first line of its error)


def read_row(arch: Arch, run_dirs: dict, stages: list[str], refused: tuple | None) -> Row:
    row = Row(arch)
    if refused:
        row.crashes.append(refused)
    seen: dict[str, dict[str, str]] = {s: {} for s in stages}
    for target in TARGETS:
        run_dir = run_dirs.get(target)
        report = None
        if run_dir is not None:
            try:
                report = runfolder.read_report(run_dir)
            except (OSError, ValueError):
                report = None
        logged = runfolder.read_log(run_dir)["stages"] if run_dir is not None else {}
        for stage in stages:
            # report.json's status of each stage it reads; the run log's for the report stage itself
            status = ((report or {}).get("stages", {}).get(stage) or logged.get(stage) or {}).get("status", "missing")
            seen[stage][target] = status
            if status == "failed" and not any(c[0] == stage for c in row.crashes):
                row.crashes.append((stage, first_line(runfolder.failure(run_dir, stage))))
        entry = (report or {}).get("targets", {}).get(target) or {}
        row.verdicts[target] = entry.get("verdict") or "not assessed"
        first = entry.get("first") or entry.get("findings") or []
        if first and not row.finding:
            row.finding = f"{target}: {first_line(first[0].get('message'))}"
    for stage, by_target in seen.items():
        values = set(by_target.values())
        row.stages[stage] = values.pop() if len(values) == 1 else " / ".join(f"{t} {v}" for t, v in by_target.items())
    return row


# ---------------------------------------------------------------- the table
def _cell(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render(rows: list[Row], stages: list[str], command: str, commit: str, summary: str, host: str) -> str:
    lines = ["# Conformance zoo", "",
             "Public architectures built from their transformers configs at small sizes with seeded weights, "
             "each saved as a Hugging Face directory with its own processor, run through the workbook on both "
             "targets (`benchmarks/zoo.py`). A stage that does not apply to a model is skipped; a crash is a "
             "stage that failed (or a model whose plan was refused, or that did not build).", "",
             f"- date: {datetime.date.today().isoformat()}",
             f"- commit: `{commit}`",
             f"- command: `{command}`",
             f"- host: {host}",
             f"- result: {summary}", ""]
    if len(stages) < len(STAGE_ORDER):
        lines += [f"Stages run: {', '.join(stages)}. A verdict needs every stage's result, so with a subset "
                  "every target's verdict reads \"not assessed\".", ""]
    lines += ["| architecture | family | " + " | ".join(stages) + " | "
              + " | ".join(f"{t} verdict" for t in TARGETS) + " | first finding |",
              "|" + "---|" * (3 + len(stages) + len(TARGETS))]
    for row in rows:
        lines.append(f"| {row.arch.name} (`{row.arch.title}`) | {row.arch.family} | "
                     + " | ".join(_cell(row.stages.get(s, "")) for s in stages) + " | "
                     + " | ".join(row.verdicts.get(t, "") for t in TARGETS) + f" | {_cell(row.finding)} |")
    crashes = [(row.arch.name, stage, error) for row in rows for stage, error in row.crashes]
    lines += ["", "## Crashes", ""]
    if crashes:
        lines += ["| architecture | stage | first line of the error |", "|---|---|---|"]
        lines += [f"| {name} | {stage} | {_cell(error, 300)} |" for name, stage, error in crashes]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def host_speed() -> str:
    """The host's speed at the time, for reading the wall time on a shared machine: float32 matmuls on one
    thread, and the load average."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(256, 256)
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < 0.3:
            a @ a
            n += 1
        gflops = n * 2 * 256 ** 3 / (time.perf_counter() - start) / 1e9
    finally:
        torch.set_num_threads(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores, {gflops:.1f} GFLOP/s one thread, load {load:.1f}"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _summary(rows: list[Row]) -> str:
    crashes = sum(len(r.crashes) for r in rows)
    not_assessed = sum(v == "not assessed" for r in rows for v in r.verdicts.values())
    return f"zoo: {len(rows)} architectures, {crashes} stage crashes, {not_assessed} not assessed"


def _prepare_out(out: Path) -> None:
    """An empty runs folder: the zoo's own from an earlier run is cleared, any other non-empty folder refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / ZOO_MARKER).is_file():
            sys.exit(f"zoo: {out} is not empty and not a zoo runs folder; give another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ZOO_MARKER).write_text("runs of benchmarks/zoo.py: cleared when the zoo runs again\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated architectures (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the quick subset ({', '.join(QUICK)}) with few requests")
    parser.add_argument("--stages", default=None, help="comma-separated stages (default: every stage)")
    parser.add_argument("--workers", type=int, default=2, help="runs at once on Ray (default 2)")
    parser.add_argument("--chunk", type=int, default=4,
                        help="architectures per Ray sweep; the table is rewritten after each (default 4)")
    parser.add_argument("--serial", action="store_true",
                        help="no Ray: one run per architecture with both targets, one after another")
    parser.add_argument("--out", default=str(ROOT / "runs" / "zoo"), help="runs folder (cleared first)")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "zoo.md"), help="the table (markdown)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else \
        list(QUICK) if args.quick else [a.name for a in ZOO]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        parser.error(f"unknown architecture {', '.join(unknown) or '(none)'}; choose from {', '.join(BY_NAME)}")
    stages = [s.name for s in runner.select_stages(args.stages)]
    params = parameters_for(stages, QUICK_PARAMETERS if args.quick else PARAMETERS)
    out = Path(args.out).expanduser().resolve()
    _prepare_out(out)
    command = "python benchmarks/zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"zoo: {len(names)} architectures x {len(TARGETS)} targets, stages {','.join(stages)}, "
          f"{'serial' if args.serial else f'{args.workers} workers on Ray'} -> {out}", flush=True)

    folder, tokenizers, models, refused = cache_folder(), {}, {}, {}
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            models[name] = build(BY_NAME[name], folder, tokenizers)
        except Exception as exc:   # noqa: BLE001 (a builder that fails is a row of the table, not the end)
            refused[name] = ("build", f"{type(exc).__name__}: {first_line(exc)}")
            traceback.print_exc()
    print(f"  built {len(models)} directories in {folder} ({time.perf_counter() - start:.0f} s)", flush=True)
    doc, commit, dirs, rows = Path(args.doc).expanduser(), _commit(), {}, []
    doc.parent.mkdir(parents=True, exist_ok=True)
    # Ray sweeps of a few architectures each: the table is rewritten after each, so a zoo stopped early
    # leaves the rows it finished
    step = len(models) if args.serial else max(args.chunk, 1)
    built = list(models)
    for first in range(0, len(built), step):
        chunk = {n: models[n] for n in built[first:first + step]}
        if args.serial:
            found, failed = run_serial(chunk, out, stages, params)
        else:
            found, failed = run_sweep(chunk, out, stages, params, args.workers)
        dirs.update(found)
        refused.update(failed)
        done = [n for n in names if n in dirs or (n in refused and n not in models)]
        rows = [read_row(BY_NAME[n], dirs.get(n, {}), stages, refused.get(n)) for n in done]
        if len(done) < len(names):
            partial = f"{_summary(rows)} so far ({len(done)} of {len(names)} run)"
            doc.write_text(render(rows, stages, command.strip(), commit, partial, f"{os.cpu_count()} cores"))
            print(f"  {partial} ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = [read_row(BY_NAME[n], dirs.get(n, {}), stages, refused.get(n)) for n in names]
    crashes = sum(len(r.crashes) for r in rows)
    summary = _summary(rows)
    host = host_speed()
    wall = time.perf_counter() - start
    doc.write_text(render(rows, stages, command.strip(), commit, f"{summary} in {wall:.0f} s", host))
    (out / "zoo.json").write_text(json.dumps(
        {"summary": summary, "wall_seconds": round(wall, 1), "host": host,
         "rows": [{"architecture": r.arch.name, "stages": r.stages, "verdicts": r.verdicts, "finding": r.finding,
                   "crashes": r.crashes} for r in rows]}, indent=1))
    for row in rows:
        for stage, error in row.crashes:
            print(f"  crash: {row.arch.name} {stage}: {error}")
    print(f"  table: {doc}")
    print(f"{summary} (wall {wall:.0f} s; host {host})")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
