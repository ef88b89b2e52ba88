"""Stage 3b with workload "generate": the real XLA compile of a causal LM's prefill and decode graphs with a
static KV cache, for a TPU topology, the cache in HBM, and the largest batch that fits at a context.

    >>> from portkit.models import registry
    >>> from portkit.stages.xla import generation
    >>> lm = registry.load("gpt2")
    >>> found = generation.compile_serving(lm, batch=8, prompt=64, context=128, topology="v5e:1x1")
    >>> found["decode"].breakdown      # HBM per device: weights, KV cache, inputs, temporaries, logits, code
    >>> generation.largest_batch(lm, context=1024, topology="v5e:1x1")     # (n, {n tried: fits})

Serving with a static cache (portkit/workloads/generation.py) compiles one prefill graph per (batch, prompt bucket)
and one decode step per (batch, context bucket), the cache as long as the context bucket. Here each graph is the
model with transformers' StaticCache built over the cache tensors it is given (keys and values per attention layer,
batch x key-value heads x context x head size; a state-space layer's conv and recurrent states) and returning them
updated, converted by torchax and compiled by JAX + libtpu for the topology, compile-only on this CPU host (nothing
runs on a TPU). The cache is donated, as a serving stack updates it in place, so HBM holds it once. The compiler's
memory per device (compiled.memory_analysis()) is broken down into parts that add up to its total: the weights, the
cache and the inputs counted from their shapes (the compiler's argument size is checked against their sum), the
temporaries (activations and workspace), outputs not written in place (the logits) and the generated code.
Verdicts are cached like every XLA verdict (portkit.tpu_compile.cache).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from portkit.core import placement
from portkit.core import torch_private
from portkit.workloads import generation
from portkit.tpu_compile.cache import source_digest
from portkit.tpu_compile import compiler
from portkit.tpu_compile import sharded
from portkit.core.errors import BadParameter
from portkit.tpu_compile.results import MemoryVerdict, format_bytes


class _Serving(nn.Module):
    """A prefill or decode step over an explicit cache: (logits of the last position, keys, values, then every state
    tensor in state_names order). Keys and values are stacked over the cache's attention layers; a state-space or
    linear-attention layer's conv and recurrent states (transformers' LinearAttentionCacheLayerMixin: Jamba's Mamba
    layers, Falcon-H1's hybrid ones) come as named inputs `conv_L_J` / `recurrent_L_J` (layer L, state J). `decode`:
    the states hold a previous step's (has_previous_state), as in a serving stack's decode."""

    def __init__(self, model: nn.Module, decode: bool = False):
        super().__init__()
        self.model, self.decode = model, decode

    def forward(self, input_ids, attention_mask, position_ids, cache_position, keys=None, values=None, **states):
        from transformers import StaticCache
        context = attention_mask.shape[1]
        cache = StaticCache(config=self.model.config, max_cache_len=context)
        attending = [layer for layer in cache.layers if hasattr(layer, "keys")]
        for i, layer in enumerate(attending):    # the given cache, filled up to the first new position
            layer.lazy_initialization(keys[i], values[i])
            layer.keys, layer.values = keys[i].clone(), values[i].clone()
            layer.cumulative_length = cache_position[0].clone()
        held = [(name, *name.split("_")) for name in sorted(states)]      # (name, kind, layer, state)
        for name, kind, at, j in held:
            layer, given = cache.layers[int(at)], states[name].clone()
            getattr(layer, f"{kind}_states")[int(j)] = given
            getattr(layer, f"is_{kind}_states_initialized")[int(j)] = True
            layer.has_previous_state[int(j)] = self.decode
            if kind == "conv":
                layer.conv_kernel_size[int(j)] = given.shape[-1]
            layer.dtype, layer.device = given.dtype, given.device
        prompt = None if self.decode else input_ids.shape[1]
        mask = generation.serving_mask(self.model, attention_mask, prompt)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         cache_position=cache_position, cache=cache, use_cache=True)
        found = [torch.stack([layer.keys for layer in attending]), torch.stack([layer.values for layer in attending])] \
            if attending else []
        return (out.logits[:, -1], *found,
                *(getattr(cache.layers[int(at)], f"{kind}_states")[int(j)] for _, kind, at, j in held))


STATE_PREFIXES = ("conv_", "recurrent_")    # a state-space layer's cache inputs (_Serving)
NOT_KV = "not a key/value cache"     # the serving graphs' status where the model's cache is something else


def not_kv_cache(lm) -> str | None:
    """Why the model's StaticCache is not one the serving graph carries (keys and values of its attention layers, as
    heads x positions x head size, and the conv and recurrent states of its state-space or linear-attention layers),
    or None where it is: a model whose layer types the StaticCache has no layer for (it raises), or that refuses it in
    its forward, has none to carry.
    (An encoder-decoder's two caches are portkit.stages.xla.seq2seq_serving's.)"""
    model = generation.causal_model(lm)
    try:
        layers = generation.cache_layers(model)
        state_shapes(model)     # one step into a StaticCache: a model with a cache of its own refuses it (MiniMax)
    except Exception as exc:  # noqa: BLE001 - a cache the library cannot build, or the model refuses, is the answer
        refused = generation.refused(exc, "static")
        return f"transformers' StaticCache cannot be built for or is refused by {type(model).__name__}: " \
               f"{refused.message}" + (f" at {refused.where['text']}" if refused.where else "")
    config = _text_config(model)
    if any(hasattr(layer, "keys") for layer in layers) and not getattr(config, "num_attention_heads", None):
        return f"{type(config).__name__} names no num_attention_heads to size a key/value cache by"
    return None


def cache_shapes(model: nn.Module, batch: int, context: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The keys' and the values' shapes, (layers, batch, key-value heads, context, head size) each, as the model's
    own attention writes them: read from one step of one token into transformers' DynamicCache (eager where the
    weights are real, on fake tensors where they are on the meta device), since latent attention (DeepSeek's MLA)
    caches keys and values of other sizes than its config's head_dim. Where that step cannot run, or its layers
    differ, the config's head size for both."""
    # the attention layers _Serving fills (shared-cache layers hold none; a state-space layer holds states instead)
    count = sum(hasattr(layer, "keys") for layer in generation.cache_layers(model))
    if not count:       # a state-space model (Mamba2): no keys or values at all
        return (0, batch, 0, context, 0), (0, batch, 0, context, 0)
    layers = _probed(model)
    if layers is None:
        config = _text_config(model)
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        layers = ((kv_heads, head_dim), (kv_heads, head_dim))
    (kh, kd), (vh, vd) = layers
    return (count, batch, kh, context, kd), (count, batch, vh, context, vd)


_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def state_shapes(model: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{"conv_L_J" / "recurrent_L_J": (shape after the batch, dtype)} of every state a state-space or linear-attention
    cache layer holds (layer L, state J), read from one step of one token into a StaticCache (on fake tensors where
    the weights are on the meta device): a layer creates its states at its first update. Empty for a key/value
    cache."""
    if model not in _STATES:
        from transformers import StaticCache
        found = {}
        if any(generation.holds_states(layer) for layer in generation.cache_layers(model)):
            abstract = any(p.is_meta for p in model.parameters())
            with torch.no_grad(), (torch_private.fake_tensor_mode() if abstract else contextlib.nullcontext()):
                cache = StaticCache(config=model.config, max_cache_len=2)
                ids = torch.ones(1, 1, dtype=torch.long)
                model(input_ids=ids, attention_mask=generation.serving_mask(model, torch.ones(1, 2, dtype=torch.long),
                                                                            1),
                      cache_position=torch.arange(1), cache=cache, use_cache=True)
            for at, layer in enumerate(cache.layers):
                for j in range(getattr(layer, "number_of_states", 0)) if generation.holds_states(layer) else ():
                    for kind in ("conv", "recurrent"):
                        state = getattr(layer, f"{kind}_states")[j]
                        if state is not None:
                            found[f"{kind}_{at}_{j}"] = (tuple(state.shape[1:]), state.dtype)
        _STATES[model] = found
    return _STATES[model]


def _text_config(model: nn.Module):
    """The config of the model's text decoder, the one its cache is built from (a multimodal model's text_config:
    transformers' PretrainedConfig.get_text_config(decoder=True), as StaticCache reads it)."""
    return model.config.get_text_config(decoder=True)


_PROBED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _probed(model: nn.Module):
    """((key heads, key size), (value heads, value size)) of every layer of one fake step, or None."""
    if model not in _PROBED:
        from transformers import DynamicCache
        abstract = any(p.is_meta for p in model.parameters())
        try:
            with torch.no_grad(), (torch_private.fake_tensor_mode() if abstract else contextlib.nullcontext()):
                cache = DynamicCache(config=model.config)
                model(input_ids=torch.ones(1, 1, dtype=torch.long), cache=cache, use_cache=True)
                found = {((layer.keys.shape[1], layer.keys.shape[-1]), (layer.values.shape[1], layer.values.shape[-1]))
                         for layer in cache.layers if getattr(layer, "keys", None) is not None}
        except Exception:  # noqa: BLE001 - a model the fake step cannot run keeps the config's sizes
            found = set()
        _PROBED[model] = found.pop() if len(found) == 1 else None
    return _PROBED[model]


def graph_inputs(model: nn.Module, batch: int, tokens: int, context: int, dtype=torch.float32) -> dict:
    """{name: (shape, dtype)} of a step feeding `tokens` new positions (the prompt for prefill, 1 for decode)
    into a cache of `context` positions."""
    keys, values = cache_shapes(model, batch, context)
    states = {name: ((batch, *shape), dtype if d.is_floating_point else d)
              for name, (shape, d) in state_shapes(model).items()}
    return {"input_ids": ((batch, tokens), torch.int64), "attention_mask": ((batch, context), torch.int64),
            "position_ids": ((batch, tokens), torch.int64), "cache_position": ((tokens,), torch.int64),
            **({"keys": (keys, dtype), "values": (values, dtype)} if keys[0] else {}), **states}


@dataclass
class GraphCompile(MemoryVerdict):
    """One serving graph's XLA verdict for a topology, with its memory broken down."""
    graph: str                       # "prefill" or "decode"
    batch: int
    tokens: int
    context: int
    topology: str
    status: str
    compile_seconds: float | None = None
    cached: bool = False
    hbm_bytes_per_device: int = 0
    memory: dict = field(default_factory=dict)
    breakdown: dict = field(default_factory=dict)
    flops: float | None = None
    message: str = ""

    def summary(self) -> str:
        what = f"{self.graph} (batch {self.batch}, {self.tokens} token(s) into a {self.context}-position cache)"
        if self.status != "compiled":
            return f"{what}: {self.status}: {self.message[:300]}"
        return (f"{what} compiled for {self.topology} in {self.compile_seconds:.1f} s"
                f": {format_bytes(self.memory['total'])} per device {self.memory_line()}")

    def to_dict(self) -> dict:
        return {"graph": self.graph, "batch": self.batch, "tokens": self.tokens, "context": self.context,
                "topology": self.topology, "status": self.status, "compile_seconds": self.compile_seconds,
                "cached": self.cached, "hbm_bytes_per_device": self.hbm_bytes_per_device, "memory": self.memory,
                "breakdown": self.breakdown, "flops": self.flops, "fits": self.fits, "message": self.message,
                "summary": self.summary()}


def compile_graph(lm, graph: str, batch: int, tokens: int, context: int, topology: str,
                  dtype: str | None = None) -> GraphCompile:
    """One prefill (tokens = the prompt bucket) or decode (tokens = 1) graph compiled for `topology`."""
    compiler.check_topology(topology)
    if dtype is not None and dtype not in compiler.DTYPES:
        raise BadParameter("dtype", dtype, compiler.DTYPES)
    if tokens > context:
        raise BadParameter("prompt bucket", tokens, hint=f"longer than the context bucket {context}")
    model = generation.causal_model(lm)
    program = compiler.Program(_Serving(model, decode=graph == "decode"), compiler.DTYPES.get(dtype))
    spec = graph_inputs(model, batch, tokens, context, program.float_dtype)
    kv, held = [k for k in spec if k in ("keys", "values")], [k for k in spec if k.startswith(STATE_PREFIXES)]
    parts = {"KV cache": kv, **({"recurrent states": held} if held else {})}
    return compile_program(GraphCompile(graph, batch, tokens, context, topology, "compiled"), program, spec, parts,
                           kv + held)


def compile_program(found: GraphCompile, program, spec: dict, parts: dict[str, list[str]], donated: list[str]):
    """`program` (a serving graph's module) traced on inputs of `spec` ({name: (shape, dtype)}) and compiled for
    found.topology; its memory broken down into the weights, each of `parts` (input names counted from their
    shapes), the other inputs, the temporaries, the outputs not written in place and the code. The `donated`
    inputs are the buffers updated in place (a cache), so HBM holds them once."""
    jax, topo, devices, _, replicated = sharded.compile_only(found.topology)
    found.hbm_bytes_per_device = compiler.hbm_per_device(found.topology, devices)
    states, inputs = program.abstract(spec, replicated, replicated)
    narrowed = {k: program.narrow(d) for k, (_, d) in spec.items()}
    size = {k: math.prod(shape) * _itemsize(narrowed[k]) for k, (shape, _) in spec.items()}
    grouped = [k for names in parts.values() for k in names]
    counted = {"weights": sum(math.prod(a.shape) * a.dtype.itemsize for a in states.values()),
               **{part: sum(size[k] for k in names) for part, names in parts.items()},
               "inputs": sum(size[k] for k in spec if k not in grouped)}
    fn = program.fn
    try:
        cache = {k: inputs[k] for k in donated}          # donated: the only buffers updated in place
        rest = {k: v for k, v in inputs.items() if k not in cache}
        with placement.tensors_kept(program.module):      # forward leaves no converted tensor on the model
            # keep_unused: every weight stays an argument, as a served checkpoint holds them all in HBM (a multimodal
            # model's vision tower too, which a text step does not read and jit would otherwise drop)
            lowered = jax.jit(lambda s, c, x: fn(s, (), {**x, **c}), donate_argnums=(1,), keep_unused=True).trace(
                states, cache, rest).lower()
    except Exception as exc:  # noqa: BLE001 - a graph that does not trace is the finding
        where = compiler.model_frame(exc)       # the model's line, not the conversion's
        found.status, found.message = "trace_failed", (f"at {where['text']}: " if where else "") + \
            compiler.error_message(exc)
        return found
    context_key = sharded.check_context(found.topology, topo, "serving graph, cache donated",
                                        code=f"{source_digest(compile_program)}|{source_digest(type(program.module))}")
    verdict, found.cached, _ = compiler.compiler_verdict(jax, lowered, found.topology, context_key)
    found.status, found.compile_seconds, found.message = verdict.status, verdict.compile_seconds, verdict.message
    found.memory, found.flops = dict(verdict.memory or {}), verdict.flops
    if verdict.status == "compiled":
        m = found.memory
        measured = {**counted, "arguments beyond those counted": m["argument"] - sum(counted.values()),
                    "activations and workspace": m["temporary"], "outputs not in place": m["output"] - m["alias"],
                    "generated code": m["generated_code"]}
        found.breakdown = {k: int(v) for k, v in measured.items() if v or k != "arguments beyond those counted"}
    return found


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def compile_serving(lm, batch: int, prompt: int, context: int, topology: str,
                    dtype: str | None = None) -> dict[str, GraphCompile]:
    """The prefill graph of a prompt bucket and the decode step of a context bucket, at `batch`."""
    return {"prefill": compile_graph(lm, "prefill", batch, prompt, context, topology, dtype),
            "decode": compile_graph(lm, "decode", batch, 1, context, topology, dtype)}


def largest_batch(lm, context: int, topology: str, dtype: str | None = None,
                  first: GraphCompile | None = None, limit: int | None = None) -> tuple[int, dict[int, bool]]:
    """The largest batch whose decode step at a `context`-position cache fits one device (a compile per try,
    at most `limit`, sharded.BATCH_LIMIT by default)."""
    first = first or compile_graph(lm, "decode", 1, 1, context, topology, dtype)
    return gallop(lambda n: compile_graph(lm, "decode", n, 1, context, topology, dtype), first,
                  f"largest batch at context {context} (an XLA compile a try)", limit)


FIXED_PARTS = ("weights", "arguments beyond those counted", "generated code")   # a breakdown's parts no row adds


def gallop(compile_at, first: GraphCompile, what: str, limit: int | None = None) -> tuple[int, dict[int, bool]]:
    """The largest batch n whose graph compile_at(n) fits one device, galloping from the guess `first`'s memory
    gives: what one row adds (every part of its breakdown but FIXED_PARTS: caches, states, inputs, temporaries,
    logits) into the room the fixed parts leave."""
    guess = None
    if first.status == "compiled":
        per_row = sum(v for k, v in first.breakdown.items() if k not in FIXED_PARTS) / first.batch
        fixed = first.memory["total"] - per_row * first.batch
        guess = max(1, int((first.hbm_bytes_per_device - fixed) // per_row)) if per_row else None
    return sharded.search_compiles(lambda n: compile_at(n).fits, {first.batch: first.fits}, guess, what, limit)
