"""What a greedy generation of any model shares (portkit/workloads/generation.py drives causal LMs,
portkit/workloads/encoder_decoder.py encoder-decoders): the static cache's bucket Plan, the Generation a run gives,
and the targets' shared Dynamo traces (one for the emulated static-shape backends, shared_trace.Turns).

    >>> from portkit.workloads import decoding
    >>> plan = decoding.Plan(prompt_buckets=(16, 32), context_buckets=(32, 64), batch=4)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from portkit.core.errors import BadParameter

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


