"""Greedy generation of encoder-decoder models (T5, BART, Whisper): the encoder once per source, then one decoder
step per token with transformers' EncoderDecoderCache, compiled for a target.

    >>> from portkit.workloads import encoder_decoder
    >>> lm = models.load("/path/to/a/t5/or/whisper/folder")
    >>> plan = encoder_decoder.plan_of(lm, items, new_tokens=16)
    >>> found = encoder_decoder.generate_static_for(lm, items, 16, plan, {"tpu": backend})

The same two caches as a causal LM's generation (portkit/workloads/generation.py), as transformers' generate builds
them for an encoder-decoder (generation/utils.py, _get_cache): a self-attention cache for the decoder's tokens and a
cross-attention cache holding the encoder's keys and values, written at the first decoder step.
- dynamic: two DynamicCaches, every step compiled at static shapes, so every token is a new self-attention length
  and a compile, until Dynamo's recompile limit runs the step eagerly.
- static: two StaticCaches: the cross-attention one the length of the source bucket, the self-attention one one
  decoder context of new_tokens rounded up to a power of two (at least MIN_PROMPT_BUCKET), the decoder's whole
  output length, as a serving stack sizes it. A text source is right-padded to a power-of-two source bucket (its
  mask read by the encoder and the cross-attention), a speech source is its feature extractor's fixed window. Per
  source bucket the encoder, the first decoder step (it writes the cross-attention cache) and the next one are
  compiled in a warm-up; the generation then runs under set_stance("fail_on_recompile"), any compile recorded
  in `late` with its guard, paid, and the generation goes on. (decoding.Plan: prompt_buckets are the source buckets.)
"""
from __future__ import annotations

import time
import weakref

import torch

from portkit.core import progress
from portkit.workloads import decoding
from portkit.workloads.decoding import MAX_PROMPT, MIN_PROMPT_BUCKET, Generation, Plan


def decoder_model(lm) -> torch.nn.Module | None:
    """The Hugging Face encoder-decoder inside the workbook's adapter (Seq2SeqAdapter, SpeechSeq2SeqAdapter), where
    it decodes token by token (models.seq2seq's rule: not a DETR-style detector); None otherwise."""
    from portkit.models import seq2seq
    model = getattr(lm.module, "model", None)
    if model is None or not hasattr(model, "get_encoder") or not hasattr(model, "generation_config"):
        return None
    return model if seq2seq.decodes_token_by_token(getattr(model, "config", None)) else None


def is_encoder_decoder(lm) -> bool:
    return decoder_model(lm) is not None


def _text_source(lm) -> bool:
    return lm.tokenizer is not None and lm.seq_dim == "tokens"


# The graphs a static-cache decoding compiles per source bucket (per batch size): the encoder, the first decoder step
# (it writes the cross-attention cache) and the steps after it (they read it): the three _warm_up compiles.
GRAPHS_PER_SOURCE = 3


def fixed_source(lm) -> bool:
    """Whether the encoder takes one source shape (a speech model's fixed window of frames): its serving plan is then
    the one source bucket and decoder context stage 2 compiled, with nothing to choose."""
    return is_encoder_decoder(lm) and lm.seq_dim is None      # no varying dimension: not a text source either


def decoder_context(new_tokens: int) -> int:
    """The self-attention cache's one length: new_tokens rounded up to a power of two, at least MIN_PROMPT_BUCKET.
    The decoder's length is the tokens generated, whatever the source: one context serves every request."""
    context = MIN_PROMPT_BUCKET
    while context < new_tokens:
        context *= 2
    return context


def plan_of(lm, items: list, new_tokens: int) -> Plan:
    """Source buckets (text: powers of two from MIN_PROMPT_BUCKET up to the longest source, at most MAX_PROMPT
    tokens; speech: its fixed window of frames) and one decoder context for new_tokens, at the items' batch."""
    if _text_source(lm):
        longest, sources = min(max(lm.token_lengths(items)), MAX_PROMPT), [MIN_PROMPT_BUCKET]
        while sources[-1] < longest:
            sources.append(sources[-1] * 2)
    else:
        sources = [int(next(iter(lm.encode(list(items[:1])).values())).shape[-1])]
    return Plan(tuple(sources), (decoder_context(new_tokens),), len(items))


def _sources(lm, items: list, plan: Plan | None) -> tuple[dict, torch.Tensor | None, int]:
    """The encoder's inputs for `items`, its source mask (None for a speech window) and the sources truncated. A
    text source is right-padded to its source bucket (plan None: to the longest, at most MAX_PROMPT)."""
    if not _text_source(lm):
        return dict(lm.encode(list(items))), None, 0
    lengths, largest = lm.token_lengths(items), max(plan.prompt_buckets) if plan else MAX_PROMPT
    longest = min(max(lengths), largest)
    enc = lm.tokenizer(list(items), padding="max_length", truncation=True, return_tensors="pt",
                       max_length=plan.prompt_bucket(longest) if plan else longest, padding_side="right")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, enc["attention_mask"], \
        sum(n > largest for n in lengths)


def encode(model, inputs: dict) -> torch.Tensor:
    """The encoder's output states for a batch of sources (its inputs as the model's processor makes them)."""
    return model.get_encoder()(**inputs).last_hidden_state


_OUTPUTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def output_class(model, inputs: dict) -> type:
    """The class of the encoder's own output, read from one eager pass over the first source of `inputs` (once per
    model): the decoder steps get the encoder's states wrapped in it, as transformers' generate passes the encoder's
    output whole (an MoE encoder's, Switch Transformers' or NLLB-MoE's, carries router_logits the model reads)."""
    if model not in _OUTPUTS:
        with torch.no_grad():
            _OUTPUTS[model] = type(model.get_encoder()(**{k: v[:1] for k, v in inputs.items()}))
    return _OUTPUTS[model]


def decode(model, hidden, source_mask, ids, cache_position, cache, outputs: type | None = None):
    """One decoder step: the logits of the next token after `ids`, the caches written in place. outputs: the
    encoder's output class (output_class), transformers' BaseModelOutput where None."""
    from transformers.modeling_outputs import BaseModelOutput
    out = model(encoder_outputs=(outputs or BaseModelOutput)(last_hidden_state=hidden), attention_mask=source_mask,
                decoder_input_ids=ids, cache=cache, cache_position=cache_position, use_cache=True)
    return out.logits[:, -1].float()


def caches(model, kind: str, context: int, source: int):
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache
    config = model.config.get_text_config(decoder=True)
    if kind == "dynamic":
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    return EncoderDecoderCache(StaticCache(config=config, max_cache_len=context),
                               StaticCache(config=config, max_cache_len=source))


def start(model, batch: int) -> torch.Tensor:
    cfg = model.generation_config
    token = cfg.decoder_start_token_id
    token = model.config.decoder_start_token_id if token is None else token
    token = token[0] if isinstance(token, (list, tuple)) else token
    return torch.full((batch, 1), int(token if token is not None else 0), dtype=torch.long)


def _run(model, calls, inputs: dict, mask, new_tokens: int, cache: tuple[str, int], keep_logits: bool,
         counters=()):
    """One greedy generation through `calls` (encode, decode): (tokens, logits kept, seconds). Each call's compiles
    are tagged with its step (CompileCounter.request: 0 the encoder and first step, s the step giving token s)."""
    (encode, decode), (kind, context) = calls, cache
    began = time.perf_counter()
    for counter in counters:
        counter.request = 0
    outputs = output_class(model, inputs)
    hidden = encode(model, inputs)
    cache = caches(model, kind, context, hidden.shape[1])
    ids, tokens, kept = start(model, hidden.shape[0]), [], []
    for step in progress.bar(range(new_tokens), desc=f"{kind}-cache decode", leave=False):
        for counter in counters:
            counter.request = step
        logits = decode(model, hidden, mask, ids, torch.tensor([step]), cache, outputs)
        kept.append(logits) if keep_logits else None
        ids = logits.argmax(-1)[:, None]
        tokens.append(ids[:, 0])
    return torch.stack(tokens, 1), kept, time.perf_counter() - began


def _warm_up(model, calls, lm, items: list, plan: Plan) -> None:
    """Per source bucket: the encoder, the first decoder step (writing the cross-attention cache) and the next."""
    context = plan.context_buckets[0]
    for source in progress.bar(sorted(plan.prompt_buckets), desc="warm-up encoder and decoder"):
        inputs, mask, _ = _sources(lm, items, Plan((source,), plan.context_buckets, plan.batch))
        if mask is not None:
            inputs = {"input_ids": torch.ones(plan.batch, source, dtype=torch.long),
                      "attention_mask": torch.ones(plan.batch, source, dtype=torch.long)}
            mask = inputs["attention_mask"]
        _run(model, calls, inputs, mask, min(2, context), ("static", context), False)


def _eager_calls():
    return encode, decode


def generate_static(lm, items: list, new_tokens: int, plan: Plan, backend=None, keep_logits: bool = False):
    """Greedy generation with the two StaticCaches; backend None runs eagerly (the reference)."""
    if backend is not None:
        return decoding.only(generate_static_for(lm, items, new_tokens, plan, {"": backend}, keep_logits))
    model = decoder_model(lm)
    inputs, mask, truncated = _sources(lm, items, plan)
    with torch.no_grad():
        tokens, kept, seconds = _run(model, _eager_calls(), inputs, mask, new_tokens,
                                     ("static", plan.context_buckets[0]), keep_logits)
    return Generation("static", tokens, 0, 0.0, seconds, truncated=truncated, logits=kept)


def generate_dynamic(lm, items: list, new_tokens: int, backend=None, keep_logits: bool = False, limit: bool = True):
    """Greedy generation with the two DynamicCaches; backend None runs eagerly. limit: Dynamo's recompile limit
    applies (generation.generate_dynamic's)."""
    if backend is not None:
        return decoding.only(generate_dynamic_for(lm, items, new_tokens, {"": backend}, limit=limit,
                                                  keep_logits=keep_logits))
    model = decoder_model(lm)
    inputs, mask, _ = _sources(lm, items, None)
    with torch.no_grad():
        tokens, kept, seconds = _run(model, _eager_calls(), inputs, mask, new_tokens, ("dynamic", 0), keep_logits)
    return Generation("dynamic", tokens, 0, 0.0, seconds, logits=kept)


def _compiled(turns):
    return (torch.compile(encode, backend=turns, dynamic=False), torch.compile(decode, backend=turns, dynamic=False))


def generate_static_for(lm, items: list, new_tokens: int, plan: Plan, backends: dict, keep_logits: bool = False):
    """generate_static compiled for several targets' backends, the emulated ones in one Dynamo trace
    (decoding.static_for): {name: Generation, or the exception its run raised}."""
    model = decoder_model(lm)
    inputs, mask, truncated = _sources(lm, items, plan)
    context = plan.context_buckets[0]
    return decoding.static_for(backends, new_tokens, _compiled, lambda calls: _warm_up(model, calls, lm, items, plan),
                               lambda calls, late: _run(model, (calls[0], _counting(calls[1], late)), inputs, mask,
                                                        new_tokens, ("static", context), keep_logits)[:2],
                               truncated)


def _counting(decode, late: list[dict]):
    """The compiled decoder step under fail_on_recompile, a refused compile recorded in `late` and then paid
    (backends.call_counting_recompiles), so every compile after warm-up is counted."""
    from portkit.targets.backends import call_counting_recompiles
    steps = iter(range(1 << 30))

    def step(model, hidden, source_mask, ids, cache_position, cache, outputs=None):
        shapes = {"hidden": hidden, "ids": ids, "cache_position": cache_position}
        return call_counting_recompiles(
            lambda x: decode(model, x["hidden"], source_mask, x["ids"], x["cache_position"], cache, outputs), shapes,
            late, next(steps))
    return step


def generate_dynamic_for(lm, items: list, new_tokens: int, backends: dict, max_length: int | None = None,
                         limit: bool = True, keep_logits: bool = False) -> dict:
    """generate_dynamic compiled for several targets' backends, one Dynamo trace for the emulated ones
    (decoding.dynamic_for): {name: Generation, or the exception its run raised}."""
    model = decoder_model(lm)
    inputs, mask, _ = _sources(lm, items, None)
    return decoding.dynamic_for(backends, new_tokens, limit, _compiled,
                                lambda calls, counters: _run(model, calls, inputs, mask, new_tokens, ("dynamic", 0),
                                                             keep_logits, counters))
