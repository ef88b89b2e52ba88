"""A text-pair model with two varying dimensions declared to portkit: does this summary belong to this body?

    portkit run --model examples/two_lengths.py:build --target neuron --target tpu

Each corpus text is one item, split into a pair: its first sentence within its first line (for the standard
library's docstrings, the summary line PEP 257 asks a docstring to open with) and the rest of the text, its
body (empty where the text is one sentence). A two-tower matcher reads each side with its own attention mask
and gives one probability per pair. The two sides' token counts vary apart, so the declaration names two
varying dimensions, `summary` and `body`, and stage 3 fits a grid of buckets on both. The weights are random
(seeded); the texts are the run's corpus (`-p corpus`, the standard library's docstrings by default).
"""
from __future__ import annotations

import torch
from torch import nn

from portkit import models
from portkit.models import inputs

SUMMARY, BODY = "summary", "body"
MAX_SUMMARY, MAX_BODY = 64, 512        # tokens each side takes; longer sides are cut


def split(text: str) -> tuple[str, str]:
    """(summary, body): the text's first sentence within its first line, and everything after it."""
    first = text.strip().split("\n")[0]
    head, dot, _ = first.partition(". ")
    summary = head + dot.strip()
    return summary, text.strip()[len(summary):].strip()


class PairMatcher(nn.Module):
    """Two towers over one embedding: each side's real tokens averaged (padding never counts) and projected;
    the probability is sigmoid(t * cosine) of the two, SigLIP's pair score (Zhai et al., "Sigmoid Loss for
    Language Image Pre-Training", 2023) with its temperature at its initial value, t = 10, and no bias."""

    def __init__(self, vocab: int = 30522, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.summary, self.body = nn.Linear(dim, dim), nn.Linear(dim, dim)

    @staticmethod
    def pooled(embedded, mask):
        keep = mask.unsqueeze(-1).to(embedded.dtype)
        return (embedded * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, summary_ids, summary_mask, body_ids, body_mask):
        s = torch.tanh(self.summary(self.pooled(self.embed(summary_ids), summary_mask)))
        b = torch.tanh(self.body(self.pooled(self.embed(body_ids), body_mask)))
        return {"match": torch.sigmoid(10 * nn.functional.cosine_similarity(s, b, dim=-1))}


def declaration(tokenizer) -> inputs.Declaration:
    def tokens(texts, size):
        return tokenizer(list(texts), padding="max_length", max_length=size, truncation=True, return_tensors="pt")

    def build(texts, sizes):
        summaries, bodies = zip(*(split(t) for t in texts))
        s, b = tokens(summaries, sizes[SUMMARY]), tokens(bodies, sizes[BODY])
        return {"summary_ids": s["input_ids"], "summary_mask": s["attention_mask"],
                "body_ids": b["input_ids"], "body_mask": b["attention_mask"]}

    def measure(texts):
        summaries, bodies = zip(*(split(t) for t in texts))
        count = tokenizer(list(summaries) + list(bodies), verbose=False)["input_ids"]
        return {SUMMARY: [len(ids) for ids in count[:len(texts)]], BODY: [len(ids) for ids in count[len(texts):]]}

    spec = inputs.TensorSpec
    return inputs.Declaration(
        inputs=(spec("summary_ids", torch.long, ("batch", SUMMARY)),
                spec("summary_mask", torch.long, ("batch", SUMMARY)),
                spec("body_ids", torch.long, ("batch", BODY)), spec("body_mask", torch.long, ("batch", BODY))),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim(SUMMARY, varies=True, max=MAX_SUMMARY, min=2),
              inputs.Dim(BODY, varies=True, max=MAX_BODY, min=2)),
        build=build, measure=measure, outputs=(inputs.Output("match", inputs.PROBABILITY),), data=inputs.TEXT,
        masks={SUMMARY: "summary_mask", BODY: "body_mask"}, item_label="texts as (summary, body) pairs")


def build() -> models.LoadedModel:
    tokenizer = models.minilm_tokenizer()
    torch.manual_seed(0)
    return models.LoadedModel("summary-body-matcher", inputs.PROBABILITY, PairMatcher().eval(),
                              "random weights (seed 0), examples/two_lengths.py", tokenizer=tokenizer,
                              declaration=declaration(tokenizer))
