"""What a greedy generation of any model shares (portkit/workloads/generation.py drives causal LMs,
portkit/workloads/encoder_decoder.py encoder-decoders): the static cache's bucket Plan, the Generation a run gives,
the targets' shared Dynamo traces (one for the emulated static-shape backends, shared_trace.Turns), and the two
compiled runs over them (static_for: warm-up, then fail_on_recompile; dynamic_for: a compile per new shape).

    >>> from portkit.workloads import decoding
    >>> plan = decoding.Plan(prompt_buckets=(16, 32), context_buckets=(32, 64), batch=4)
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from portkit.core import torch_private
from portkit.core.errors import BadParameter
from portkit.core.torch_private import default_recompile_limit, unlimited_recompiles

OVERFLOW = ("truncate", "error")


@dataclass(frozen=True)
class Plan:
    prompt_buckets: tuple[int, ...]
    context_buckets: tuple[int, ...]
    batch: int
    overflow: str = "truncate"

    def __post_init__(self):
        if self.overflow not in OVERFLOW:
            raise BadParameter("overflow", self.overflow, list(OVERFLOW))

    def prompt_bucket(self, length: int) -> int:
        return next((b for b in sorted(self.prompt_buckets) if b >= length), max(self.prompt_buckets))

    def context_bucket(self, length: int) -> int:
        for b in sorted(self.context_buckets):
            if b >= length:
                return b
        raise BadParameter("context length", length,
                           hint=f"longer than the largest context bucket {max(self.context_buckets)}")


# The two kinds of serving plan (stage 3's, saved as "prompt" and "context" bucket sets) and what each set is: a
# causal LM's prompts (prefill graphs) and contexts (decode graphs); an encoder-decoder's sources (the encoder and
# the cross-attention cache) and its decoder's context.
CAUSAL, ENCODER_DECODER = "causal-lm", "encoder-decoder"
SERVING_LABELS = {CAUSAL: ("prompt", "context buckets"), ENCODER_DECODER: ("source", "decoder context buckets")}
SERVING_HEADERS = {CAUSAL: ("prompt buckets (prefill)", "prompt padding", "context buckets (decode)",
                           "context padding"),
                   ENCODER_DECODER: ("source buckets (encoder, cross-attention)", "source padding", "decoder context",
                                     "context padding")}

MIN_PROMPT_BUCKET = 16     # the smallest prompt bucket plan_for makes (a prefill graph per bucket above it)
# The workbook's generation checks (stages 2 and 4) cut prompts to their last MAX_PROMPT tokens: each prompt
# bucket is one prefill graph to warm up, so they bound them.
MAX_PROMPT = 64



@dataclass
class Generation:
    mode: str                          # "static" or "dynamic"
    tokens: torch.Tensor               # (prompts, new_tokens)
    compiles: int                      # graphs compiled during the generation (after warm-up for static)
    compiles_per_token: float
    seconds: float                     # the generation, warm-up excluded
    warmup_compiles: int = 0
    warmup_seconds: float = 0.0
    truncated: int = 0                 # prompts cut by the overflow policy
    eager_from_step: int | None = None  # dynamic: the first token whose decode step ran eagerly (limit)
    guard_failures: list[str] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)   # per step, (prompts, vocab)
    late: list[dict] = field(default_factory=list)   # static: compiles after warm-up, each with its guard failure
    refused: dict = field(default_factory=dict)      # generate_eager: {cache: Refused} the model raised with


def traces(backends: dict) -> list[list[str]]:
    """The targets grouped by the Dynamo trace they share: the emulated static-shape backends one trace (they
    compile the same graphs, one per shape), any other backend (a vendor's, natively) a trace of its own."""
    from portkit.targets.backends import EmulatedBackend
    shared = [n for n, b in backends.items() if isinstance(b, EmulatedBackend)]
    return ([shared] if shared else []) + [[n] for n in backends if n not in shared]


def counted_turns(lanes: dict):
    """(one Turns over the lanes' counted backends, {name: CompileCounter}) for one trace."""
    from portkit.targets.backends import CompileCounter
    from portkit.targets.shared_trace import Turns
    counters = {n: CompileCounter(b) for n, b in lanes.items()}
    return Turns(counters), counters


def attempt(fn, *args):
    """fn(*args) where it returns; the exception it raised instead (a target's refusal, for its caller to read)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the caller reads the exception per target
        return exc


def only(found: dict) -> Generation:
    """The one target's Generation of a *_for call, its exception raised."""
    [run] = found.values()
    if isinstance(run, BaseException):
        raise run
    return run


def eager_from(events, new_tokens: int, recompiles: int) -> int | None:
    """The first decode step Dynamo ran eagerly: no compile tagged with it, after the recompile limit's worth."""
    tagged = [e.request for e in events]
    for step in range(1, new_tokens):
        if step not in tagged and sum(r is not None and r < step for r in tagged) >= recompiles:
            return step
    return None


def static_for(backends: dict, new_tokens: int, compile_calls, warm_up, run, truncated: int = 0,
               rows: int | None = None) -> dict:
    """A static-cache generation compiled for several targets' backends, one Dynamo trace per group (traces): per
    trace compile_calls(turns) makes the compiled calls, warm_up(calls) compiles every graph (the first lane compiles
    them for every lane; the others reuse them), then each lane runs run(calls, late) -> (tokens, logits kept) under
    set_stance("fail_on_recompile"), a compile there recorded in `late` (shared: every lane compiles the same graphs).
    {name: Generation, its first `rows` rows (the prompts, not the batch's padding rows), or the exception raised}."""
    out = {}
    for group in traces(backends):
        lanes = {n: backends[n] for n in group}
        turns, counters = counted_turns(lanes)
        torch.compiler.reset()      # compiled graphs from an earlier generation would count against the limit
        calls, late = compile_calls(turns), []
        with torch.no_grad():
            start = time.perf_counter()
            for name in lanes:
                turns.turn = name
                out[name] = attempt(warm_up, calls)
            warm_seconds, warm = time.perf_counter() - start, {n: len(c.events) for n, c in counters.items()}
            runs = {}
            for name in (n for n in lanes if out[n] is None):
                turns.turn, start = name, time.perf_counter()
                with torch.compiler.set_stance("fail_on_recompile"):
                    ran = attempt(run, calls, late)
                runs[name] = (ran, time.perf_counter() - start)
        for name, (ran, seconds) in runs.items():
            if isinstance(ran, BaseException):
                out[name] = ran
                continue
            tokens, kept = ran
            compiles = len(counters[name].events) - warm[name]
            out[name] = Generation("static", tokens[:rows], compiles, compiles / new_tokens, seconds, warm[name],
                                   warm_seconds, truncated, logits=[x[:rows] for x in kept], late=late)
    return out


def dynamic_for(backends: dict, new_tokens: int, limit: bool, compile_calls, run) -> dict:
    """A dynamic-cache generation compiled for several targets' backends, one Dynamo trace per group (traces): per
    trace compile_calls(turns) makes the compiled calls (under the recompile limit, or without it where `limit` is
    False: a compiled function keeps the config it is made under), then each lane runs run(calls, counters) ->
    (tokens, logits kept, seconds), its compiles tagged with their step. {name: Generation, or the exception raised};
    the compiles, the step from which Dynamo ran eagerly (eager_from) and the guard failures are the trace's."""
    recompiles, out = default_recompile_limit(), {}
    for group in traces(backends):
        turns, counters = counted_turns({n: backends[n] for n in group})
        torch.compiler.reset()
        torch_private.guard_failures(clear=True)
        runs = {}
        with torch.no_grad(), (contextlib.nullcontext() if limit else unlimited_recompiles()):
            calls = compile_calls(turns)
            for name in group:      # the first run compiles every shape for every lane; the others reuse them
                turns.turn = name
                runs[name] = attempt(run, calls, list(counters.values()))
        failures = torch_private.guard_failures()
        for name, ran in runs.items():
            if isinstance(ran, BaseException):
                out[name] = ran
                continue
            tokens, kept, seconds = ran
            events = counters[name].events
            eager = eager_from(events, new_tokens, recompiles) if limit else None
            out[name] = Generation("dynamic", tokens, len(events), len(events) / new_tokens, seconds,
                                   eager_from_step=eager, guard_failures=failures, logits=kept)
    return out
