"""Adapters that give every model the same face: named input tensors in, a dict of named output tensors out.

    >>> from portkit.models.adapters import LogitsAdapter
    >>> module = LogitsAdapter(GPT2LMHeadModel(config))      # forward(input_ids, attention_mask) -> {"logits": ...}

Used by portkit/models/registry.py's sources; a user's factory may use them too.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB = 30522        # MiniLM's WordPiece vocabulary, shared by the random-weight text models


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
        decoder_input_ids = shift_right(self.model, input_ids)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         decoder_input_ids=decoder_input_ids, use_cache=False)
        return {"logits": out.logits}


def shift_right(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's teacher-forced input: the ids one place to the right, the config's decoder_start_token_id
    first and -100 read as padding (T5's own _shift_right where the model has one; BART's shift_tokens_right)."""
    if hasattr(model, "_shift_right"):
        return model._shift_right(input_ids)
    cfg = model.config
    start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else cfg.bos_token_id or 0
    shifted = torch.full_like(input_ids, int(start))
    shifted[:, 1:] = input_ids[:, :-1]
    return shifted.masked_fill(shifted == -100, int(cfg.pad_token_id or 0))


class TextTaskAdapter(nn.Module):
    """A Hugging Face text model of any task (classifier, tagger, masked or causal LM): its `output` tensor
    (logits) from the tokenizer's inputs; token_type_ids passed only where the tokenizer made them."""

    def __init__(self, model: nn.Module, output: str = "logits", cache_flag: bool = False):
        super().__init__()
        self.model = model
        self.output = output
        self.cache_flag = cache_flag

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {"use_cache": False} if self.cache_flag else {}
        if token_type_ids is not None:
            extra["token_type_ids"] = token_type_ids
        return {"logits": getattr(self.model(input_ids=input_ids, attention_mask=attention_mask, **extra),
                                  self.output)}


class SpeechSeq2SeqAdapter(nn.Module):
    """A speech encoder-decoder (Whisper) on its feature extractor's input_features: the decoder reads the
    config's decoder_start_token_id, and the logits of the first token it predicts come out (one label a clip)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_features):
        start = torch.full((input_features.shape[0], 1), int(self.model.config.decoder_start_token_id),
                           dtype=torch.long, device=input_features.device)
        out = self.model(input_features=input_features, decoder_input_ids=start, use_cache=False)
        return {"logits": out.logits[:, -1]}


class FeaturesAdapter(nn.Module):
    """An audio classifier on a Whisper-style feature extractor's log-mel input_features in its fixed window
    (WhisperForAudioClassification: Whisper's encoder and a classification head)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_features):
        return {"logits": self.model(input_features=input_features).logits}


class SpectrogramAdapter(nn.Module):
    """An audio classifier on its feature extractor's spectrogram (AST's input_values: frames x mel bins)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_values):
        return {"logits": self.model(input_values=input_values).logits}


class ZeroShotImageAdapter(nn.Module):
    """A vision-language encoder (CLIP, SigLIP) as a zero-shot image classifier: fixed captions, tokenized
    once and kept as buffers; images in, each image's similarity to every caption out (logits_per_image)."""

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("caption_ids", input_ids, persistent=False)
        self.register_buffer("caption_mask", attention_mask, persistent=False)

    def forward(self, pixel_values):
        out = self.model(input_ids=self.caption_ids, attention_mask=self.caption_mask, pixel_values=pixel_values)
        return {"logits": out.logits_per_image}


class ImageAdapter(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return {"logits": self.model(pixel_values=pixel_values).logits}


class DetectionAdapter(nn.Module):
    """An object detector (DETR, YOLOS, RT-DETR): images in, each query's class logits and box (cx, cy, w, h, in
    [0, 1] of the image) out, the two outputs transformers' post_process_object_detection reads."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return {"logits": out.logits, "pred_boxes": out.pred_boxes}


class SegmentationAdapter(nn.Module):
    """A semantic segmenter (SegFormer, UperNet, DPT): images in, per-class logits over the model's own output map
    (batch, classes, height, width) out, before any upsampling to the image's size."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return {"logits": self.model(pixel_values=pixel_values).logits}


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM -> per-token logits: the recurrent model the vendors flag."""

    def __init__(self, vocab: int = VOCAB, dim: int = 64, hidden: int = 128, labels: int = 16):
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
        if not isinstance(out, (tuple, list)):
            from portkit.core.errors import BadParameter
            raise BadParameter(f"forward of {type(self.model).__name__}", type(out).__name__,
                               hint="forward must return a tensor, a tuple or a dict of tensors")
        return {f"output_{i}": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
