"""Stage 3b with workload "generate" for an encoder-decoder (T5, BART, Whisper): the real XLA compile of its decode
step with static caches, for a TPU topology, both caches in HBM, and the largest batch that fits.

    >>> from portkit.stages.xla import seq2seq_serving
    >>> found = seq2seq_serving.compile_decode(lm, batch=8, source=512, context=32, topology="v5e:1x1")
    >>> found.breakdown     # HBM per device: weights, KV cache, cross-attention cache, inputs, temporaries, ...

Serving an encoder-decoder with static caches (portkit/workloads/encoder_decoder.py) runs the encoder once per
request and then one decoder step per token, over transformers' EncoderDecoderCache: a self-attention cache of the
decoder context and a cross-attention cache holding the encoder's keys and values at the source bucket's length. The
step repeated for every token is the graph that bounds the batch: here it is the model's decoder called on the
encoder's output (batch x encoded length x width) with both caches given as inputs, the cross-attention one marked
written (as after the first step), returning the logits of the new token and the updated self-attention cache. The
self-attention cache is donated (updated in place); the cross-attention cache is read only, held in HBM beside it.
The encoder itself is a graph stage 3b's shapes already compile (the model's forward at each source bucket).
"""
from __future__ import annotations

import contextlib
import inspect
import weakref

import torch
from torch import nn

from portkit.core import torch_private
from portkit.stages.xla.generation import GraphCompile, compile_program, gallop
from portkit.tpu_compile import compiler
from portkit.workloads import encoder_decoder


class _DecodeStep(nn.Module):
    """One decoder step over explicit caches: (logits of the new token, self-attention keys, values), the keys and
    values stacked over the decoder's layers."""

    def __init__(self, model: nn.Module, outputs: type):
        super().__init__()
        self.model, self.outputs = model, outputs     # outputs: the encoder's output class

    def forward(self, hidden, decoder_input_ids, cache_position, keys, values, **given):
        """given: cross_keys and cross_values; source_mask (a text source's) and decoder_mask where step_inputs
        gives them."""
        cross_keys, cross_values = given.get("cross_keys"), given.get("cross_values")   # None: no cross-attention
        source_mask, decoder_mask = given.get("source_mask"), given.get("decoder_mask")
        from transformers import EncoderDecoderCache, StaticCache
        config = self.model.config.get_text_config(decoder=True)
        sources = cross_keys.shape[3] if cross_keys is not None else 1
        cache = EncoderDecoderCache(StaticCache(config=config, max_cache_len=keys.shape[3]),
                                    StaticCache(config=config, max_cache_len=sources))
        own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
        for i, (mine, theirs) in enumerate(zip(own, cross)):
            mine.lazy_initialization(keys[i], values[i])
            mine.keys, mine.values = keys[i].clone(), values[i].clone()
            mine.cumulative_length = cache_position[0].clone()
            if cross_keys is None:
                continue
            theirs.lazy_initialization(cross_keys[i], cross_values[i])
            theirs.keys, theirs.values = cross_keys[i], cross_values[i]
            theirs.cumulative_length = torch.tensor(cross_keys.shape[3])
            cache.is_updated[i] = True        # written by the first step: every later step reads it
        masks = {} if decoder_mask is None else {"decoder_attention_mask": decoder_mask}
        out = self.model(encoder_outputs=self.outputs(last_hidden_state=hidden), attention_mask=source_mask,
                         decoder_input_ids=decoder_input_ids, cache=cache, cache_position=cache_position,
                         use_cache=True, **masks)
        return out.logits[:, -1], torch.stack([m.keys for m in own]), torch.stack([m.values for m in own])


def step_inputs(lm, batch: int, source: int, context: int, dtype=torch.float32) -> dict:
    """{name: (shape, dtype)} of the decode step for a source bucket of `source` (tokens, or a speech model's window
    of frames) and a decoder context of `context` positions (the sizes _probe reads)."""
    width, kv, crossed, masked, decoder_mask, _ = _probe(lm, source)
    (layers, encoded), ((kh, kd), (vh, vd)) = width[1:], kv
    (ck, cv) = crossed or (None, None)          # each (layers, heads, encoded length, size)
    return {"hidden": ((batch, encoded, width[0]), dtype), "decoder_input_ids": ((batch, 1), torch.int64),
            "cache_position": ((1,), torch.int64),
            "keys": ((layers, batch, kh, context, kd), dtype), "values": ((layers, batch, vh, context, vd), dtype),
            **({"cross_keys": ((layers, batch, *ck[1:]), dtype), "cross_values": ((layers, batch, *cv[1:]), dtype)}
               if crossed else {}),
            **({"source_mask": ((batch, encoded), torch.int64)} if masked else {}),
            # the decoder's mask over its cache, as a serving stack passes it (BART's decoder otherwise sizes one from
            # the cache's length, a traced value: no static shape)
            **({"decoder_mask": ((batch, context), torch.int64)} if decoder_mask else {})}


_PROBES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _probe(lm, source: int):
    """((encoder width, decoder layers, encoded length), self-attention (heads, size) of keys and values, the
    cross-attention cache's (layers, heads, encoded length, size) of keys and values or None, whether the source
    has a mask, whether the decoder takes one, the encoder's output class), read from the encoder and one decoder
    step of one item as the model's own layers write them (on fake tensors where the weights are on the meta
    device); once per model and source bucket."""
    model = encoder_decoder.decoder_model(lm)
    known = _PROBES.setdefault(model, {})
    if source not in known:
        abstract = any(p.is_meta for p in model.parameters())
        with torch.no_grad(), (torch_private.fake_tensor_mode() if abstract else contextlib.nullcontext()):
            inputs = lm.declaration.dummy(1, {lm.seq_dim: source} if lm.seq_dim else None)
            hidden, mask = encoder_decoder.encode(model, inputs), inputs.get("attention_mask")
            outputs = encoder_decoder.output_class(model, inputs)
            cache = encoder_decoder.caches(model, "dynamic", 0, 0)
            encoder_decoder.decode(model, hidden, mask, encoder_decoder.start(model, 1), torch.tensor([0]), cache,
                                   outputs)
        own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
        kv = ((own[0].keys.shape[1], own[0].keys.shape[-1]), (own[0].values.shape[1], own[0].values.shape[-1]))
        # a decoder without cross-attention (an EncoderDecoderModel whose decoder was built without it) writes none
        crossed = None if getattr(cross[0], "keys", None) is None else (
            (len(cross), *cross[0].keys.shape[1:]), (len(cross), *cross[0].values.shape[1:]))
        known[source] = ((hidden.shape[2], len(own), hidden.shape[1]), kv, crossed, mask is not None,
                         "decoder_attention_mask" in inspect.signature(model.forward).parameters, outputs)
    return known[source]


def compile_decode(lm, batch: int, source: int, context: int, topology: str, dtype: str | None = None) -> GraphCompile:
    """The decode step at `batch` for a source bucket and a decoder context, compiled for `topology`."""
    compiler.check_topology(topology)
    outputs = _probe(lm, source)[-1]
    program = compiler.Program(_DecodeStep(encoder_decoder.decoder_model(lm), outputs), compiler.DTYPES.get(dtype))
    spec = step_inputs(lm, batch, source, context, program.float_dtype)
    parts = {"KV cache": ["keys", "values"],
             **({"cross-attention cache": ["cross_keys", "cross_values"]} if "cross_keys" in spec else {})}
    return compile_program(GraphCompile("decode", batch, 1, context, topology, "compiled"), program, spec, parts,
                           ["keys", "values"])


def largest_batch(lm, source: int, context: int, topology: str, dtype: str | None = None,
                  first: GraphCompile | None = None) -> tuple[int, dict[int, bool]]:
    """The largest batch whose decode step at a source bucket and decoder context fits one device (a compile per
    try, sharded.BATCH_LIMIT at most)."""
    first = first or compile_decode(lm, 1, source, context, topology, dtype)
    return gallop(lambda n: compile_decode(lm, n, source, context, topology, dtype), first,
                  f"largest batch at source {source}, context {context} (an XLA compile a try)")


def serve(lm, plan, basis: str, batch: int, topology: str, dtype: str | None = None) -> dict:
    """One TPU target's decode step at the plan's largest source bucket and its decoder context (plan: (source
    buckets, decoder contexts), stage 3's serving plan or the one stage 2's static caches compiled, as `basis`
    says), at `batch`, and the largest batch whose decode step fits: the serving graphs' entry of xla.json."""
    from portkit.stages.xla.generation import NOT_KV
    from portkit.tpu_compile import sharded
    from portkit.workloads import generation
    if plan:
        source, context = max(plan[0]), max(plan[1])
    else:
        source = min(lm.max_length or encoder_decoder.MAX_PROMPT, encoder_decoder.MAX_PROMPT)
        context, basis = encoder_decoder.decoder_context(1), "no serving plan from stage 2 or 3: portkit's defaults"
    try:
        encoded = _probe(lm, source)[0][2]      # the encoder's output length
    except Exception as exc:  # noqa: BLE001 - a decoder step the model raises in is the answer (portkit's own: raised)
        refused = generation.refused(exc, "dynamic")
        return {"status": NOT_KV, "summary": f"serving graphs not compiled: the model raises in one eager decoder "
                                             f"step: {refused.text()}; so their HBM fit and largest batch are not "
                                             "assessed"}
    step = compile_decode(lm, batch, source, context, topology, dtype)
    at = (f"its fixed source window ({encoded} encoded positions)" if encoder_decoder.fixed_source(lm)
          else f"a {source}-token source bucket")
    found = {"decode": step.to_dict(), "source_bucket": source, "encoded": encoded, "context": context,
             "source": basis, "status": step.status, "summary": f"encoder-decoder {step.summary()} at {at}"}
    if step.status == "compiled":
        n, tried = largest_batch(lm, source, context, topology, dtype, first=step)
        found["largest_batch"], found["tried"] = n, {str(k): v for k, v in sorted(tried.items())}
        found["summary"] += (f"; largest batch whose decode fits there: "
                             f"{n}{sharded.bound_text(n, tried)} ({basis})")
    return found
