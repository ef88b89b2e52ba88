"""Stage 2's fixed shape: one input shape warmed up, then the requests padded to it under
set_stance("fail_on_recompile"), so any compile after warm-up is caught by PyTorch, with the guard behind it.

    >>> from portkit.stages.compile import fixed_shape
    >>> fixed = fixed_shape.check_fixed_shape(m, stream, "tpu", opts)     # opts: stage.Options

The model is compiled with dynamic=False (both targets compile one graph per input shape) behind a
CompileCounter, the ground truth for compiles; the emulated targets share one Dynamo trace (targets/shared_trace.py).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import torch   # torch._dynamo is imported on first use (seconds): the runner's checks import this module

from portkit.core import placement
from portkit.core import torch_private
from portkit.targets import selection
from portkit.targets import specs
from portkit.targets.backends import (CompileCounter, CompileEvent, EmulatedBackend, call_counting_recompiles,
                                      compile_failure, failure_text, refused_recompile)
from portkit.core.errors import CompileRefused
from portkit.stages.compile.storm import compiled_for, precision_for
from portkit.corpora.requests import Requests
from portkit.targets.shared_trace import Turns



# ---------------------------------------------------------------- step 3: one fixed shape
@dataclass
class FixedShape:
    """One fixed shape warmed up, then the requests under set_stance("fail_on_recompile")."""
    target: dict
    backend: str
    shape: dict                      # {"batch": b, "seq": s}
    warmup_compiles: int
    compiles_after: int              # graphs the backend compiled for the requests after warm-up
    requests: int
    run_seconds: float               # median per request that did not compile
    armed: str | None                # what the stance raised for a shape outside the warm-up
    compiles: list[CompileEvent] = field(default_factory=list)
    failure: dict | None = None
    late: list[dict] = field(default_factory=list)   # each compile the stance refused: request, shape, guard
    probed: bool = True              # False: the model takes one input shape, so no other shape was tried

    @property
    def label(self) -> str:
        """The fixed shape as it is called, e.g. 1x64, or 1x3x224x224 for an image model."""
        return "x".join(map(str, self.shape.get("dims") or [self.shape["batch"], self.shape["seq"]]))

    def late_text(self) -> str:
        """The first compile after warm-up: which request, its shape, and the guard that failed."""
        if not self.late:
            return ""
        first = self.late[0]
        return (f"request {first['request'] + 1} (shape {'x'.join(map(str, first['shape']))}) compiled after "
                f"warm-up: {first['reason']}" + (f" (and {len(self.late) - 1} more)" if len(self.late) > 1 else ""))

    def summary(self) -> str:
        head = f"{self.target['name']} fixed {self.label}"
        if self.failure:
            return f"{head}: cannot compile: {failure_text(self.failure)}"
        return (f"{head}: {self.warmup_compiles} compile in warm-up, {self.compiles_after} compiles for "
                f"{self.requests} requests under fail_on_recompile; "   # the measured time: run_seconds
                + (self.late_text() + "; " if self.late else "")
                + ("no other shape tried: the model takes one input shape" if not self.probed else
                   "a new shape " + ("raises, so the check is armed" if self.armed else "did NOT raise")))

    __str__ = __repr__ = summary

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "summary": self.summary()}


@dataclass
class _Side:
    """One target's part of the fixed-shape check: how it calls the compiled model, and what it found."""
    call: object                     # call(inputs) -> outputs
    counter: CompileCounter
    detected: specs.DetectedTarget
    times: list = field(default_factory=list)
    late: list = field(default_factory=list)
    failure: dict | None = None
    warm: int = 0
    armed: str | None = None


def _fixed_runs(sides: dict[str, _Side], inputs: list[dict], probe: dict | None) -> None:
    """Warm up on the first input, then every input under fail_on_recompile, then the probe, each side in turn
    (sides sharing one Dynamo pass share its compiles: one a side's call pays is every side's)."""
    _warm_up(sides, inputs[0])
    live = [side for side in sides.values() if side.failure is None]
    with torch.compiler.set_stance("fail_on_recompile"):
        for i, x in enumerate(inputs):
            _fixed_request(live, i, x)
        for side in live:
            side.counter.request = None
            if probe is not None:
                _probe(side, probe)


def _warm_up(sides: dict[str, _Side], first: dict) -> None:
    """Each side's warm-up call on the first input: a target's refusal is its own, Dynamo's is every side's."""
    for side in sides.values():
        try:
            side.call(first)
        except CompileRefused as exc:          # this target's own refusal (a shared pass): the others go on
            side.failure = compile_failure(exc, 0)
        except torch_private.dynamo_errors() as exc:   # Dynamo's: the same for every side
            for each in sides.values():
                each.failure = each.failure or compile_failure(exc, 0)
            break
        side.warm = len(side.counter.events)


def _fixed_request(live: list[_Side], i: int, x: dict) -> None:
    """Request `i` through every live side under fail_on_recompile: a refused compile is recorded as late
    (for every side: one side's call compiles for all), a call that compiled nothing is timed."""
    paid = None   # the compile this request's first side paid
    for side in live:             # a side's call compiles for every side
        side.counter.request = i
    for side in live:
        refused = len(side.late)
        start = time.perf_counter()
        call_counting_recompiles(side.call, x, side.late, i)
        if len(side.late) > refused:
            paid = side.late[-1]
        elif paid is not None:
            side.late.append(paid)    # compiled for this side too, in the same call
        else:                         # a compile is not a run time
            side.times.append(time.perf_counter() - start)


def _probe(side: _Side, probe: dict) -> None:
    """A shape outside the warm-up, under fail_on_recompile: the stance must refuse it (side.armed)."""
    try:
        side.call(probe)
    except RuntimeError as exc:
        if refused_recompile(exc) is None:
            raise
        side.armed = str(exc).strip().splitlines()[0]


def check_fixed_shape(model, requests: Requests, target: str, options) -> FixedShape:
    """Pad every request to options.seq_len, compile once (options.backend, precision, fullgraph: the stage's
    Options), and run them all under fail_on_recompile; a request the stance refuses is recorded in
    FixedShape.late, then compiled and counted."""
    return check_fixed_shapes(model, requests, [target], options)[target]


def check_fixed_shapes(model, requests: Requests, targets, options) -> dict[str, FixedShape]:
    """check_fixed_shape for every target; the emulated targets share one Dynamo pass (a shape traced once,
    checked and run by each target), as the storm does (storm.recompile_storms)."""
    seq_len, precision, backend, fullgraph = options.seq_len, options.precision, options.backend, options.fullgraph
    names = specs.parse_targets(targets)
    size = requests.fixed_size(seq_len)       # tokens: seq_len; another varying dimension: the stream's longest
    inputs = requests.padded(size)
    probe = requests.padded(size + 1 if size < 2 else size - 1)[0] if size is not None else None
    chosen = {n: selection.backend_for(specs.detect(n), backend, precision_for(precision, n))[0]
              for n in names}
    shared = [n for n in names if isinstance(chosen[n], EmulatedBackend)]
    shared = shared if len(shared) > 1 else []
    sides = {}
    for name in names:
        if name in shared:
            continue
        with compiled_for(model, name, backend, precision, fullgraph) as (call, counter, detected, _):
            sides[name] = _Side(call, counter, detected)
            _fixed_runs({name: sides[name]}, inputs, probe)
    if shared:
        counters = {n: CompileCounter(chosen[n]) for n in shared}
        dispatch = Turns(counters)
        module = model.module if hasattr(model, "module") else model
        torch.compiler.reset()
        fn = torch_private.dynamo_optimize(dispatch, fullgraph=fullgraph)(module)

        def turn(name):
            def call(x):
                dispatch.turn = name
                return fn(**x)
            return call
        try:
            with placement.on_device(module, "cpu"), torch.no_grad():
                for n in shared:
                    sides[n] = _Side(turn(n), counters[n], specs.detect(n))
                _fixed_runs({n: sides[n] for n in shared}, inputs, probe)
        finally:
            torch.compiler.reset()
    shape = list(next(iter(inputs[0].values())).shape)
    seq = requests.model.declaration.size_of(inputs[0], requests.model.seq_dim) if size is not None else None
    return {n: FixedShape(s.detected.to_dict(), s.counter.__name__, {"batch": shape[0], "seq": seq, "dims": shape},
                          s.warm, len(s.counter.events) - s.warm, len(inputs) if s.failure is None else 0,
                          statistics.median(s.times) if s.times else 0.0, s.armed, s.counter.events, s.failure,
                          s.late, probed=probe is not None)
            for n, s in ((n, sides[n]) for n in names)}
