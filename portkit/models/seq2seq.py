"""An encoder-decoder model whose two lengths vary apart: T5 fed (text, its first sentence) pairs.

    >>> m = models.load("t5-pairs")                     # T5 2+2 layers, random weights, two varying dimensions
    >>> m.declaration.lengths(texts)                    # {"source": [...], "target": [...]}, tokens each

Summarisation is the task an encoder-decoder is migrated for, and its two lengths vary with the data
apart: the document (encoder, `source`) and the summary (decoder, `target`, teacher-forced). Each corpus
text is one item: the whole text is the source and its first sentence, within its first line, the target
(for the standard library's docstrings, the summary line PEP 257 asks a docstring to open with), so any
text corpus serves, the user's own included. Stage 3 fits a grid of bucket boundaries on both lengths
(portkit/planning/grid.py).
"""
from __future__ import annotations

import torch
from torch import nn

from portkit.core import assessed
from portkit.models import inputs

SOURCE, TARGET = "source", "target"
MAX_TOKENS = 512      # each dimension: T5's relative positions take any length; the tokenizer's limit
# What the stages cannot say of an encoder-decoder under the inference workload: they run its decoder on a fixed
# input (one step from the start token, or a teacher-forced target), while serving it decodes token by token, its
# length growing and its KV cache written each step. The report names this question as not assessed for every target,
# and no verdict is "ready" without it. With `-p workload generate` (portkit/workloads/encoder_decoder.py) stage 2
# compiles the decoding token by token and stage 4 compares its tokens; what stays open then is SERVING, until stage
# 3 plans the source buckets and decoder context (and, for a TPU, stage 3b's own question: the serving graphs' HBM
# fit).
DECODING = assessed.open_question(
    "autoregressive decoding (the decoder's length growing token by token, its KV cache)",
    "the run's workload ran the decoder on a fixed input (one step, or a teacher-forced target); "
    "-p workload generate decodes it token by token")
SERVING = assessed.open_question(
    "serving buckets for the encoder-decoder's decoding (source buckets by decoder contexts, each a decode graph to "
    "warm up: stage 3)",
    "stage 2 compiled the decoding token by token and stage 4 compared its tokens; stage 3, which plans and prices "
    "the source buckets and the decoder context, did not plan them for this target")


def after_generation(questions: list[dict], generated: bool, served: bool = False) -> list[dict]:
    """The model's open questions once the run is read: DECODING is SERVING where stage 2 generated (workload
    generate), since the decoding itself was then assessed; and neither is open where the serving buckets were
    planned too (`served`: stage 3's source buckets and decoder context, or the one source window and decoder
    context stage 2 compiled for an encoder that takes one source shape)."""
    if not generated:
        return questions
    return [({"stage": q.get("stage", "model"), **SERVING} if q.get("question") == DECODING["question"] else q)
            for q in questions if not (served and q.get("question") == DECODING["question"])]


def decodes_token_by_token(config) -> bool:
    """Whether a transformers config is an encoder-decoder that decodes token by token. A DETR-style detector's is
    not: its decoder takes a fixed set of object queries (num_queries) and "decodes the N objects in parallel" in
    one pass (Carion et al. 2020, End-to-End Object Detection with Transformers), which the stages run whole."""
    return bool(getattr(config, "is_encoder_decoder", False)) and getattr(config, "num_queries", None) is None


def not_assessed(module: nn.Module) -> tuple[dict, ...]:
    """The questions the stages cannot answer for `module` (core.assessed's {"question", "why"}): (DECODING,) where
    it holds an encoder-decoder that decodes token by token (a transformers model whose config says
    is_encoder_decoder: Whisper, T5, BART...; not a DETR-style detector, nor a model of such a config that cannot
    generate: WhisperForAudioClassification, Whisper's encoder and a classification head), else none."""
    decoders = _decoders(module)
    return (DECODING,) if next(decoders, None) is not None else ()


def _decoders(module: nn.Module):
    """The modules of `module` whose config decodes token by token, outside any transformers model that cannot
    generate (its can_generate() false: a model class without GenerationMixin, its layers sharing its config)."""
    inside = set()
    for m in module.modules():            # parents before their children
        if id(m) in inside:
            continue
        can = getattr(m, "can_generate", None)
        if callable(can) and not can():
            inside.update(id(x) for x in m.modules())
        elif decodes_token_by_token(getattr(m, "config", None)):
            yield m


def pair(text: str) -> tuple[str, str]:
    """(source, target): the whole text, and its first sentence within its first line."""
    line = text.strip().split("\n")[0]
    head, dot, _ = line.partition(". ")
    return text, head + dot.strip()


class T5Pairs(nn.Module):
    """T5 with its decoder fed the target (teacher forcing): a dict with the logits per target token."""

    def __init__(self, t5: nn.Module):
        super().__init__()
        self.model = t5

    def forward(self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask):
        return {"logits": self.model(input_ids=input_ids, attention_mask=attention_mask,
                                     decoder_input_ids=decoder_input_ids,
                                     decoder_attention_mask=decoder_attention_mask, use_cache=False).logits}


def declaration(tokenizer, max_tokens: int = MAX_TOKENS) -> inputs.Declaration:
    """Texts as (source, target) pairs: `source` and `target` vary, each with its attention mask."""
    def tokens(texts, size):
        return tokenizer(list(texts), padding="max_length", max_length=size, truncation=True, return_tensors="pt")

    def build(items, sizes):
        pairs = [pair(t) for t in items]
        src, tgt = tokens((s for s, _ in pairs), sizes[SOURCE]), tokens((t for _, t in pairs), sizes[TARGET])
        return {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"],
                "decoder_input_ids": tgt["input_ids"], "decoder_attention_mask": tgt["attention_mask"]}

    def measure(items):
        pairs = [pair(t) for t in items]
        counted = tokenizer([s for s, _ in pairs] + [t for _, t in pairs], verbose=False)["input_ids"]
        return {SOURCE: [len(x) for x in counted[:len(pairs)]], TARGET: [len(x) for x in counted[len(pairs):]]}

    spec = inputs.TensorSpec
    return inputs.Declaration(
        inputs=(spec("input_ids", torch.long, (inputs.BATCH, SOURCE)),
                spec("attention_mask", torch.long, (inputs.BATCH, SOURCE)),
                spec("decoder_input_ids", torch.long, (inputs.BATCH, TARGET)),
                spec("decoder_attention_mask", torch.long, (inputs.BATCH, TARGET))),
        dims=(inputs.Dim(inputs.BATCH, batch=True), inputs.Dim(SOURCE, varies=True, max=max_tokens),
              inputs.Dim(TARGET, varies=True, max=max_tokens)),
        build=build, measure=measure, outputs=(inputs.Output("logits", inputs.SEQ2SEQ_LM),), data=inputs.TEXT,
        masks={SOURCE: "attention_mask", TARGET: "decoder_attention_mask"},
        item_label="texts as (text, first sentence) pairs")
