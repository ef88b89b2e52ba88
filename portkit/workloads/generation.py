"""Greedy generation of causal LMs: prefill then one decode step per token, compiled for a target.

    >>> from portkit import models
    >>> from portkit.workloads import generation
    >>> lm = models.load("llama")
    >>> plan = generation.Plan(prompt_buckets=(16, 32), context_buckets=(32, 64), batch=4)
    >>> static = generation.generate_static(lm, texts, new_tokens=16, plan=plan, backend=backend)
    >>> dynamic = generation.generate_dynamic(lm, texts, new_tokens=16, backend=backend)

Two ways to run the same greedy generation:
- dynamic: the default DynamicCache compiled with dynamic=False, so every token is a new cache length and a
  compile, until Dynamo's recompile limit makes the step run eagerly.
- static: StaticCache; prompts left-padded to a prompt bucket, one prefill graph per prompt bucket, one decode
  graph per context bucket (an outgrown cache moves to the next bucket's, a state-space layer's states whole).
  After warm_up, set_stance("fail_on_recompile"): a refused compile is recorded in `late` with its guard (a
  sliding-window layer's Python position count is one), then paid, and the generation goes on.

Overflow (Plan.overflow): a prompt longer than the largest prompt bucket is cut to its last tokens
("truncate", the default, counted in `truncated`) or refused with a one-line BadParameter ("error"); a
prompt bucket plus new tokens beyond the largest context bucket is refused before anything runs.
"""
from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass

import torch

from portkit.core import progress
from portkit.core.errors import BadParameter
from portkit.workloads.decoding import (  # noqa: F401 - generation's names, defined there
    MAX_PROMPT, MIN_PROMPT_BUCKET, OVERFLOW, Generation, Plan, attempt, counted_turns, dynamic_for, eager_from, only,
    static_for, traces)

def plan_for(prompt_lengths, new_tokens: int, batch: int, max_prompt: int) -> Plan:
    """Powers-of-two buckets, as the serving stacks make them: prompt buckets from MIN_PROMPT_BUCKET up to
    the longest prompt (at most max_prompt; longer prompts are truncated), context buckets from twice the
    smallest prompt bucket up to the longest prompt bucket plus the new tokens."""
    longest, prompts = min(max(prompt_lengths), max_prompt), [MIN_PROMPT_BUCKET]
    while prompts[-1] < longest:
        prompts.append(prompts[-1] * 2)
    contexts = [2 * MIN_PROMPT_BUCKET]
    while contexts[-1] < prompts[-1] + new_tokens - 1:
        contexts.append(contexts[-1] * 2)
    return Plan(tuple(prompts), tuple(contexts), batch)


def check_generates(lm) -> None:
    """The generate workload needs a causal language model or an encoder-decoder that decodes token by token
    (workloads.encoder_decoder); one line naming the model's kind otherwise."""
    from portkit.models.registry import CAUSAL_LM
    if lm.kind != CAUSAL_LM and _encoder_decoder(lm) is None:
        raise BadParameter("workload", "generate",
                           hint=f"greedy generation needs a causal language model or an encoder-decoder; {lm.name} "
                                f"is neither (its kind: {lm.kind}; use workload 'inference')")


def check_causal(lm) -> None:
    """What needs a causal language model itself (a prefill and a decode over one cache: stage 3's serving buckets);
    one line naming the model's kind otherwise."""
    from portkit.models.registry import CAUSAL_LM
    if lm.kind != CAUSAL_LM:
        raise BadParameter("workload", "generate",
                           hint=f"prefill and decode buckets are a causal language model's; {lm.name} is not one "
                                f"(its kind: {lm.kind})")


def _encoder_decoder(lm):
    """portkit.workloads.encoder_decoder where `lm` is an encoder-decoder that decodes token by token, else None:
    the generation verbs below hand such a model to it."""
    from portkit.workloads import encoder_decoder
    return encoder_decoder if encoder_decoder.is_encoder_decoder(lm) else None


def is_encoder_decoder(lm) -> bool:
    return _encoder_decoder(lm) is not None


def plan_of(lm, items: list, new_tokens: int) -> Plan:
    """The static cache's buckets for generating new_tokens from `items` (one batch): plan_for's for a causal LM's
    prompts (at most MAX_PROMPT tokens), encoder_decoder.plan_of's for an encoder-decoder's sources."""
    if (ed := _encoder_decoder(lm)) is not None:
        return ed.plan_of(lm, items, new_tokens)
    return plan_for(lm.token_lengths(items), new_tokens, len(items), MAX_PROMPT)


def check_workload(workload, model: str | None = None) -> str:
    """A stage's `workload` parameter (checks.WORKLOADS): "generate" needs a causal LM, so a built-in model is
    loaded to check it (once a process, whichever stage asks first; other models when the stage loads them).
    Every stage's options check calls this: the runner validates them all before anything is written."""
    from portkit.models import registry
    from portkit.core import checks
    if checks.workload(workload) == "generate" and model in registry.SOURCES:
        check_generates(_builtin(model))
    return workload


@functools.lru_cache(maxsize=8)
def _builtin(name: str):
    from portkit.models import registry
    return registry.load(name)


def causal_model(lm) -> torch.nn.Module:
    """The Hugging Face causal LM inside the workbook's adapter."""
    model = getattr(lm.module, "model", lm.module)
    if not hasattr(model, "generation_config"):
        raise BadParameter("model", lm.name, hint="generation needs a Hugging Face causal LM")
    return model


def _step(model, ids, mask, positions, cache_position, cache):
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache_position=cache_position,
                cache=cache, use_cache=True)
    return out.logits[:, -1].float()


def serving_mask(model, mask: torch.Tensor, prompt: int | None = None) -> torch.Tensor | None:
    """The attention mask a step passes: the cache's, every position so far (what attention layers read). A model
    whose every cache layer holds states, not positions (a state-space model: FalconMamba, Mamba2), multiplies its
    hidden states by the mask, so it takes the prompt's mask in prefill (`prompt` its length) and none in decode,
    as its own prepare_inputs_for_generation passes them (transformers' modeling_falcon_mamba.py)."""
    if not _statesonly(model):
        return mask
    return mask[:, :prompt] if prompt is not None else None


def _statesonly(model) -> bool:
    """Whether every layer of the model's cache holds states (holds_states), read once per model (False where the
    library cannot build a StaticCache for it)."""
    if model not in _STATES_ONLY:
        try:
            layers = cache_layers(model)
        except Exception:  # noqa: BLE001 - a cache the library cannot build is not a state-space one
            layers = []
        _STATES_ONLY[model] = bool(layers) and all(holds_states(x) for x in layers)
    return _STATES_ONLY[model]


def cache_layers(model) -> list:
    """The layers of a one-position StaticCache for the model, one per cache layer of its layer types, as
    transformers builds it; raises as StaticCache does where the library has no layer for a layer type."""
    from transformers import StaticCache
    return StaticCache(config=model.config, max_cache_len=1).layers


def holds_states(layer) -> bool:
    """Whether a cache layer holds fixed-size states, not keys and values per position (transformers'
    LinearAttentionCacheLayerMixin: a state-space or linear-attention layer's conv and recurrent states)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    return isinstance(layer, LinearAttentionCacheLayerMixin)


_STATES_ONLY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _encode(lm, texts: list[str], plan: Plan) -> tuple[dict, int]:
    lengths = lm.token_lengths(texts)
    largest = max(plan.prompt_buckets)
    truncated = sum(n > largest for n in lengths)
    if truncated and plan.overflow == "error":
        longest = max(lengths)
        raise BadParameter("prompt length", longest,
                           hint=f"longer than the largest prompt bucket {largest} and overflow is 'error'")
    bucket = plan.prompt_bucket(min(max(lengths), largest))
    enc = lm.tokenizer(texts, padding="max_length", max_length=bucket, truncation=True,
                       padding_side="left", truncation_side="left", return_tensors="pt")
    return enc, truncated


def _new_cache(model, length: int, like=None):
    """A StaticCache of `length` positions; with `like`, a filled cache moved into it: a key/value layer's
    positions are copied into the longer buffers, a state-space or linear-attention layer's states (fixed size,
    transformers' LinearAttentionCacheLayerMixin: conv and recurrent states, no positions) are copied whole."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=length)
    if like is not None:      # move a filled cache into a larger bucket
        for new, old in zip(cache.layers, like.layers):
            _move_states(new, old)
            if getattr(old, "keys", None) is None:
                continue
            shape = list(old.keys.shape)
            shape[2] = new.max_cache_len
            new.lazy_initialization(old.keys.new_zeros(shape), old.values.new_zeros(shape))
            kept = min(old.keys.shape[2], new.max_cache_len)
            new.keys[:, :, :kept].copy_(old.keys[:, :, -kept:])
            new.values[:, :, :kept].copy_(old.values[:, :, -kept:])
            new.cumulative_length.copy_(old.cumulative_length)
            if hasattr(old, "cumulative_length_int"):       # a sliding-window layer's Python count of positions
                new.cumulative_length_int = old.cumulative_length_int
    return cache


def _move_states(new, old) -> None:
    """A linear-attention (state-space) layer's conv and recurrent states and flags, copied from `old`."""
    for index in getattr(old, "conv_states", None) or {}:
        for name in ("conv_states", "recurrent_states"):
            state = getattr(old, name)[index]
            if state is not None:
                getattr(new, name)[index] = state.clone()
                getattr(new, f"is_{name}_initialized")[index] = True
        new.has_previous_state[index] = old.has_previous_state[index]
        new.conv_kernel_size[index] = old.conv_kernel_size[index]
        new.dtype, new.device = old.dtype, old.device


def _pad_batch(enc: dict, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if ids.shape[0] > batch:
        raise BadParameter("batch", ids.shape[0], hint=f"more prompts than the plan's batch {batch}")
    extra = batch - ids.shape[0]      # padding rows: one real token so no attention row is empty
    ids = torch.cat([ids, ids.new_zeros(extra, ids.shape[1])])
    mask = torch.cat([mask, mask.new_zeros(extra, mask.shape[1])])
    mask[ids.shape[0] - extra:, -1] = 1
    return ids, mask


def _run_static(model, call, ids, mask, new_tokens: int, plan: Plan, keep_logits: bool):
    batch, prompt = ids.shape
    context = plan.context_bucket(prompt + 1)
    full = torch.zeros(batch, context, dtype=mask.dtype)
    full[:, :prompt] = mask
    cache = _new_cache(model, context)
    positions = (full.cumsum(-1) - 1).clamp(min=0)
    logits = call(model, ids, serving_mask(model, full, prompt), positions[:, :prompt], torch.arange(prompt), cache)
    tokens, kept = [], []
    for step in range(new_tokens):
        kept.append(logits) if keep_logits else None
        nxt = logits.argmax(-1)
        tokens.append(nxt)
        if step == new_tokens - 1:
            break
        at = prompt + step
        if at >= context:       # the context outgrows its bucket: move the cache, no compile
            context = plan.context_bucket(at + 1)
            cache = _new_cache(model, context, like=cache)
            full = torch.cat([full, full.new_zeros(batch, context - full.shape[1])], dim=1)
        full[:, at] = 1
        positions = full.cumsum(-1)[:, at:at + 1] - 1
        logits = call(model, nxt[:, None], serving_mask(model, full), positions, torch.tensor([at]), cache)
    return torch.stack(tokens, 1), kept, cache


def warm_up(model, call, plan: Plan) -> None:
    """Compile every graph a generation under `plan` can need, at the plan's batch: per prompt bucket
    one prefill (into a fresh cache of the smallest context bucket that holds it) and its first decode;
    then one decode per larger context bucket, into a filled cache moved there as generation moves it."""
    cache = None
    for prompt in progress.bar(sorted(plan.prompt_buckets), desc="warm-up prefill"):
        ids = torch.ones(plan.batch, prompt, dtype=torch.long)
        _, _, cache = _run_static(model, call, ids, torch.ones_like(ids), 2, plan, False)
    filled = plan.context_bucket(max(plan.prompt_buckets) + 1)     # the last prefill's cache
    for context in progress.bar(sorted(plan.context_buckets), desc="warm-up decode"):
        if context <= filled:
            continue
        moved = _new_cache(model, context, like=cache)
        mask = torch.ones(plan.batch, context, dtype=torch.long)
        call(model, torch.ones(plan.batch, 1, dtype=torch.long), serving_mask(model, mask),
             torch.zeros(plan.batch, 1, dtype=torch.long),
             torch.tensor([filled]), moved)


def generate_static(lm, texts: list[str], new_tokens: int, plan: Plan, backend=None,
                    keep_logits: bool = False) -> Generation:
    """Greedy generation with a bucketed StaticCache; backend None runs eagerly (the reference)."""
    if (ed := _encoder_decoder(lm)) is not None:
        return ed.generate_static(lm, texts, new_tokens, plan, backend, keep_logits)
    if backend is not None:
        return only(generate_static_for(lm, texts, new_tokens, plan, {"": backend}, keep_logits))
    model = causal_model(lm)
    ids, mask, truncated = _prompts(lm, texts, new_tokens, plan)
    with torch.no_grad():
        start = time.perf_counter()
        tokens, kept, _ = _run_static(model, _step, ids, mask, new_tokens, plan, keep_logits)
        seconds = time.perf_counter() - start
    rows = len(texts)
    return Generation("static", tokens[:rows], 0, 0.0, seconds, truncated=truncated,
                      logits=[x[:rows] for x in kept])


def _prompts(lm, texts: list[str], new_tokens: int, plan: Plan):
    """The prompts left-padded to their prompt bucket and to the plan's batch: (ids, mask, prompts truncated)."""
    enc, truncated = _encode(lm, texts, plan)
    plan.context_bucket(enc["input_ids"].shape[1] + new_tokens - 1)    # refuse an overflowing context early
    ids, mask = _pad_batch(enc, plan.batch)
    return ids, mask, truncated


def generate_static_for(lm, texts: list[str], new_tokens: int, plan: Plan, backends: dict,
                        keep_logits: bool = False) -> dict:
    """generate_static compiled for several targets' backends ({name: backend}) in one Dynamo trace where they are
    emulated static-shape backends (shared_trace.Turns: every graph goes to each backend's checks, each target
    runs its own compiled graph); any other backend traces alone. {name: Generation, or the exception its run
    raised}: a target whose backend refuses a graph raises in its own run, the others go on. Every target
    compiles the same graphs, so warm-up compiles and the compiles after it (`late`, shared) are the trace's."""
    if (ed := _encoder_decoder(lm)) is not None:
        return ed.generate_static_for(lm, texts, new_tokens, plan, backends, keep_logits)
    model = causal_model(lm)
    ids, mask, truncated = _prompts(lm, texts, new_tokens, plan)
    return static_for(backends, new_tokens, lambda turns: torch.compile(_step, backend=turns, dynamic=False),
                      lambda call: warm_up(model, call, plan),
                      lambda call, late: _run_static(model, _counting(call, late), ids, mask, new_tokens, plan,
                                                     keep_logits)[:2],
                      truncated, len(texts))


def _counting(call, late: list[dict]):
    """The compiled step under fail_on_recompile, a refused compile recorded in `late` (the step, its shapes, the
    guard that failed: backends.call_counting_recompiles) and then paid, so the generation goes on and every
    compile after warm-up is counted."""
    from portkit.targets import backends
    steps = iter(range(1 << 30))

    def step(model, ids, mask, positions, cache_position, cache):
        inputs = {"ids": ids, "mask": mask, "positions": positions, "cache_position": cache_position}
        return backends.call_counting_recompiles(lambda x: call(model, cache=cache, **x), inputs, late, next(steps))
    return step


def generate_dynamic(lm, texts: list[str], new_tokens: int, backend, max_length: int | None = None,
                     limit: bool = True, keep_logits: bool = False) -> Generation:
    """Greedy generation with the default DynamicCache, every step compiled at static shapes (backend None:
    eagerly, a reference where the model refuses the static cache: generate_eager).

    limit: Dynamo's recompile limit applies (past it a step runs eagerly: eager_from_step); False lifts
    it, so every new shape compiles, as on a static-shape target that has no eager fallback."""
    if (ed := _encoder_decoder(lm)) is not None:
        return ed.generate_dynamic(lm, texts, new_tokens, backend, keep_logits, limit)
    if backend is not None:
        return only(generate_dynamic_for(lm, texts, new_tokens, {"": backend}, max_length, limit, keep_logits))
    model = causal_model(lm)
    ids, mask = _dynamic_prompts(lm, texts, max_length)
    with torch.no_grad():
        tokens, kept, seconds = _run_dynamic(model, _step, ids, mask, new_tokens, keep_logits, [])
    return Generation("dynamic", tokens, 0, 0.0, seconds, logits=kept)


def _dynamic_prompts(lm, texts: list[str], max_length: int | None):
    enc = lm.tokenizer(texts, padding="longest", truncation=True, max_length=max_length or lm.max_length,
                       padding_side="left", truncation_side="left", return_tensors="pt")   # as Plan's "truncate"
    return enc["input_ids"], enc["attention_mask"]


def _run_dynamic(model, call, ids, mask, new_tokens: int, keep_logits: bool, counters):
    """One greedy generation into a fresh DynamicCache through `call`, each call's compiles tagged with its step
    (CompileCounter.request: 0 the prefill, s the decode step giving token s): (tokens, logits kept, seconds)."""
    from transformers import DynamicCache
    tokens, kept = [], []
    start = time.perf_counter()
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    prompt = ids.shape[1]
    for counter in counters:
        counter.request = 0
    logits = call(model, ids, serving_mask(model, mask, prompt), positions, torch.arange(prompt), cache)
    for step in progress.bar(range(new_tokens), desc="dynamic-cache decode"):
        kept.append(logits) if keep_logits else None
        nxt = logits.argmax(-1)
        tokens.append(nxt)
        if step == new_tokens - 1:
            break
        for counter in counters:
            counter.request = step + 1
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        positions = mask.cumsum(-1)[:, -1:] - 1
        logits = call(model, nxt[:, None], serving_mask(model, mask), positions, torch.tensor([prompt + step]), cache)
    return torch.stack(tokens, 1), kept, time.perf_counter() - start


def generate_dynamic_for(lm, texts: list[str], new_tokens: int, backends: dict, max_length: int | None = None,
                         limit: bool = True, keep_logits: bool = False) -> dict:
    """generate_dynamic compiled for several targets' backends ({name: backend}), one Dynamo trace for the
    emulated ones (generate_static_for's rule): {name: Generation, or the exception its run raised}. The compiles,
    the step from which Dynamo ran eagerly and the guard failures are the shared trace's, every target's."""
    if (ed := _encoder_decoder(lm)) is not None:
        return ed.generate_dynamic_for(lm, texts, new_tokens, backends, max_length, limit, keep_logits)
    model = causal_model(lm)
    ids, mask = _dynamic_prompts(lm, texts, max_length)
    # the compiled step keeps the config it is made under (the recompile limit): dynamic_for makes it inside
    return dynamic_for(backends, new_tokens, limit, lambda turns: torch.compile(_step, backend=turns, dynamic=False),
                       lambda call, counters: _run_dynamic(model, call, ids, mask, new_tokens, keep_logits, counters))


# ---------------------------------------------------------------- a model that refuses a cache
CACHES = ("static", "dynamic")


@dataclass(frozen=True)
class Refused:
    """The model raised in greedy generation with one cache, run eagerly on the CPU: not portkit's machinery
    (refused() re-raises that), a result about the model."""
    cache: str                  # "static" (transformers' StaticCache, bucketed) or "dynamic" (DynamicCache)
    message: str                # the exception's type and first line
    where: dict | None          # the innermost frame outside torch and portkit (core.owners.place), or None

    def text(self) -> str:
        where = f" at {self.where['text']}" if self.where else ""
        return f"greedy generation with the {self.cache} KV cache raises, eagerly on the CPU: {self.message}{where}"

    def to_dict(self) -> dict:
        return {"cache": self.cache, "message": self.message, "where": self.where, "text": self.text()}


class GenerationRefused(Exception):
    """The model raises in eager greedy generation with every cache (CACHES): generation cannot be assessed."""

    def __init__(self, refusals: dict[str, Refused]):
        self.refusals = refusals
        super().__init__("; ".join(r.text() for r in refusals.values()))


def refused(exc: BaseException, cache: str) -> Refused:
    """`exc`, raised by an eager generation, as the model's Refused: the innermost frame outside torch, the stdlib
    and portkit's machinery (core.owners.innermost) is the model's or its library's. Re-raised where that frame is
    portkit's own (its decoding loop, its adapters) or there is none: a defect in portkit, not a result."""
    from portkit.core import owners
    where = owners.raised_at(exc)
    if isinstance(exc, BadParameter) or where is None or owners.owner(where)["owner"] == owners.PORTKIT \
            or owners.owner(where)["package"] == owners.SERVING_LOOP:
        raise exc
    return Refused(cache, owners.one_line(exc, 300), where)


def refusal(lm, texts: list[str], cache: str) -> Refused | None:
    """Why the model raises in two tokens of eager greedy generation of texts' first prompt with `cache`, or
    None where it runs: what tells a model's refusal from a compiler's when a compiled generation fails."""
    plan = plan_of(lm, texts[:1], 2)
    try:
        if cache == "static":
            generate_static(lm, texts[:1], 2, plan)
        else:
            generate_dynamic(lm, texts[:1], 2, None, max_length=MAX_PROMPT)
    except Exception as exc:  # noqa: BLE001 - the model's exception is the result; refused() re-raises portkit's
        return refused(exc, cache)
    return None


def generate_eager(lm, texts: list[str], new_tokens: int, plan: Plan, keep_logits: bool = False,
                   cache: str | None = None) -> Generation:
    """Greedy generation eagerly on the CPU, the way the workbook's references run: with the bucketed
    StaticCache (the static-shape targets' cache); where the model raises with it, with the DynamicCache, the
    refusal kept in Generation.refused. cache: only that one. Raises GenerationRefused where every cache tried
    raises."""
    met: dict[str, Refused] = {}
    for kind in ([cache] if cache else CACHES):
        try:
            run = (generate_static(lm, texts, new_tokens, plan, keep_logits=keep_logits) if kind == "static" else
                   generate_dynamic(lm, texts, new_tokens, None, max_length=max(plan.prompt_buckets),
                                    keep_logits=keep_logits))
        except Exception as exc:  # noqa: BLE001 - the model's exception is the result; refused() re-raises portkit's
            met[kind] = refused(exc, kind)
            continue
        run.refused = met
        return run
    raise GenerationRefused(met)
