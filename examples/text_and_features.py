"""A model with three inputs declared to portkit: token ids, their attention mask, and numeric features.

    portkit run --model examples/text_and_features.py:build --target neuron --target tpu

A ticket-triage style classifier: the text's tokens (MiniLM's tokenizer) pooled over the real tokens,
beside four numbers measured on the same text (its length in characters and lines, its share of digits and
of upper-case letters), both into one linear head. The declaration (`portkit.models.inputs`) names the three inputs
and their dimensions: `tokens` varies with the text, `features` is fixed at four. The weights are random
(seeded); the texts are the run's corpus (`-p corpus`), so the features are real measurements of real text.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from portkit import models
from portkit.models import inputs

FEATURES = 4


def measure(text: str) -> list[float]:
    """The four numbers the model reads beside the tokens: log characters, log lines, digit and upper shares."""
    letters = sum(c.isalpha() for c in text) or 1
    return [math.log1p(len(text)), math.log1p(text.count("\n") + 1),
            sum(c.isdigit() for c in text) / max(len(text), 1), sum(c.isupper() for c in text) / letters]


class TextAndFeatures(nn.Module):
    def __init__(self, vocab: int = 30522, dim: int = 64, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.numbers = nn.Sequential(nn.Linear(FEATURES, dim), nn.GELU())
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, input_ids, attention_mask, features):
        keep = attention_mask.unsqueeze(-1).to(torch.float32)
        text = (self.embed(input_ids) * keep).sum(1) / keep.sum(1).clamp(min=1)
        return {"logits": self.head(torch.cat([text, self.numbers(features)], dim=-1))}


def declaration(tokenizer) -> inputs.Declaration:
    def build(texts, sizes):
        enc = tokenizer(list(texts), padding="max_length", max_length=sizes["tokens"], truncation=True,
                        return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "features": torch.tensor([measure(t) for t in texts], dtype=torch.float32)}

    def lengths(texts):
        return {"tokens": [len(ids) for ids in tokenizer(list(texts), truncation=False, verbose=False)["input_ids"]]}

    return inputs.Declaration(
        inputs=(inputs.TensorSpec("input_ids", torch.long, ("batch", "tokens")),
                inputs.TensorSpec("attention_mask", torch.long, ("batch", "tokens")),
                inputs.TensorSpec("features", torch.float32, ("batch", "features"))),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim("tokens", varies=True, max=512, label="sequence length"),
              inputs.Dim("features", size=FEATURES)),
        build=build, measure=lengths, outputs=(inputs.Output("logits", inputs.CLASSIFIER),),
        data=inputs.TEXT, masks={"tokens": "attention_mask"})


def build() -> models.LoadedModel:
    tokenizer = models.minilm_tokenizer()
    torch.manual_seed(0)
    return models.LoadedModel("text-and-features", inputs.CLASSIFIER, TextAndFeatures().eval(),
                              "random weights (seed 0), examples/text_and_features.py", tokenizer=tokenizer,
                              declaration=declaration(tokenizer))
