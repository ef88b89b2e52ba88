"""Adapters that give every model the same face: named input tensors in, a dict of named output tensors out.

    >>> from portkit.models.adapters import LogitsAdapter
    >>> module = LogitsAdapter(GPT2LMHeadModel(config))      # forward(input_ids, attention_mask) -> {"logits": ...}

Used by portkit/models/registry.py's sources; a user's factory may use them too.
"""
from __future__ import annotations

import torch
from torch import nn

_VOCAB = 30522        # MiniLM's WordPiece vocabulary, shared by the random-weight text models


class EmbeddingAdapter(nn.Module):
    """Sentence embedding the way sentence-transformers builds it: masked mean, L2-normalised."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return {"embedding": nn.functional.normalize(pooled, dim=-1), "last_hidden_state": hidden}


class LogitsAdapter(nn.Module):
    """Language models and classifiers: logits only, no KV cache (decoders export only without it)."""

    def __init__(self, model: nn.Module, cache_flag: bool = True):
        super().__init__()
        self.model = model
        self.cache_flag = cache_flag

    def forward(self, input_ids, attention_mask):
        extra = {"use_cache": False} if self.cache_flag else {}
        return {"logits": self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits}


class MambaAdapter(nn.Module):
    """Mamba takes no attention mask; padding sits at the end and real positions are unaffected."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return {"logits": self.model(input_ids=input_ids, use_cache=False).logits}


class Seq2SeqAdapter(nn.Module):
    """Teacher-forced encoder-decoder: the decoder reads the input shifted right by one."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        decoder_input_ids = self.model._shift_right(input_ids)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         decoder_input_ids=decoder_input_ids, use_cache=False)
        return {"logits": out.logits}


class ImageAdapter(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return {"logits": self.model(pixel_values=pixel_values).logits}


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM -> per-token logits: the recurrent model the vendors flag."""

    def __init__(self, vocab: int = _VOCAB, dim: int = 64, hidden: int = 128, labels: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, labels)

    def forward(self, input_ids, attention_mask):
        hidden, _ = self.lstm(self.embed(input_ids))
        return {"logits": self.head(hidden) * attention_mask.unsqueeze(-1).to(hidden.dtype)}


class OutputsAdapter(nn.Module):
    """Wrap a user's module so its outputs become a dict of named tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        if isinstance(out, torch.Tensor):
            return {"output": out}
        if isinstance(out, dict):
            return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        return {f"output_{i}": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
