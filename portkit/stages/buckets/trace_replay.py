"""Replaying real requests (stage 3): warm every bucket once, then replay the trace under
set_stance("fail_on_recompile"), so every compile after warm-up is caught by PyTorch and counted, with the shape and
the guard failure behind it, rather than assumed to be none.

    >>> from portkit.stages.buckets import trace_replay
    >>> runs = trace_replay.replay(m, corpus.make_trace(texts, m, 24), [plan], backend="inductor")

`replay` also runs without buckets as a static-shape target does: one compile per distinct shape, the recompile
limit raised so none silently runs eagerly (NVIDIA/TensorRT-LLM#6142, pytorch/pytorch#114511).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from portkit.core import torch_private
from portkit.core import owners
from portkit.core import placement
from portkit.targets.backends import (CompileCounter, compile_failure,
                                      failure_text)
from portkit.core.errors import BadParameter
from portkit.corpora.corpus import Trace
from portkit.planning.planner import BucketPlan
from portkit.stages.buckets import bucketed


NO_BUCKETS = "no buckets"


# ---------------------------------------------------------------- replay
@dataclass
class ReplayRun:
    """One replay of a trace: without buckets, or with one plan."""
    name: str
    backend: str
    plan: dict | None
    requests: int
    compiles: int                     # graphs the backend compiled, counted by the backend itself
    compiles_after_warmup: int        # graphs compiled after warm-up (caught by fail_on_recompile, then paid)
    real_tokens: int
    computed_tokens: int
    compile_seconds: float            # each shape charged its first measured compile (see bucketed.charge)
    compile_wall_seconds: float       # what the calls that compiled took in this run
    run_seconds: float
    padding_checks: list[dict] = field(default_factory=list)
    note: str = ""
    late_compiles: list[dict] = field(default_factory=list)   # request, shape, guard failures behind each
    compiled_seqs: list = field(default_factory=list)          # the sequence length of every graph compiled
    failure: dict | None = None       # why the run could not be measured (_failed_run): the model refused or raised

    @property
    def waste(self) -> float:
        return 1 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def total_seconds(self) -> float:
        return self.compile_seconds + self.run_seconds

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.total_seconds if self.total_seconds else float("inf")

    @property
    def padding_ok(self) -> bool | None:
        """False where padding changed an output at real positions; None where nothing was checked, or some
        output could not be (padding_unchecked); else True."""
        oks = [c["ok"] for c in self.padding_checks]
        return False if False in oks else None if not oks or None in oks else True

    @property
    def not_measured(self) -> str:
        """Why the run could not be measured ("" where it was): the failure in one line, and its step."""
        f = self.failure
        return f"not measured: {failure_text(f)} (in the {f['step']})" if f else ""

    @property
    def padding_unchecked(self) -> dict[str, str]:
        """The outputs the padding check could not compare, and why (the first reason for each)."""
        found: dict[str, str] = {}
        for c in self.padding_checks:
            for name, why in (c.get("unchecked") or {}).items():
                found.setdefault(name, why)
        return found

    def to_dict(self) -> dict:
        """The run as a result file holds it; a run that could not be measured has no compile counts (None)."""
        counted = not self.failure
        return {"name": self.name, "backend": self.backend, "plan": self.plan, "requests": self.requests,
                "compiles": self.compiles if counted else None,
                "compiles_after_warmup": self.compiles_after_warmup if counted else None,
                "real_tokens": self.real_tokens, "computed_tokens": self.computed_tokens,
                "padding_waste": self.waste, "compile_seconds": self.compile_seconds,
                "compile_wall_seconds": self.compile_wall_seconds, "run_seconds": self.run_seconds,
                "total_seconds": self.total_seconds, "requests_per_second": self.requests_per_second,
                "padding_ok": self.padding_ok, "padding_checks": self.padding_checks, "note": self.note,
                "late_compiles": self.late_compiles, "compiled_seqs": self.compiled_seqs,
                "padding_unchecked": self.padding_unchecked, "failure": self.failure}

    def __str__(self) -> str:
        if self.failure:
            return f"{self.name:>16} [{self.backend}]: {self.not_measured}"
        return (f"{self.name:>16} [{self.backend}]: {self.compiles:3d} compiles, {self.waste:6.1%} padding, "
                f"compile {self.compile_seconds:7.1f} s + run {self.run_seconds:6.2f} s = "
                f"{self.total_seconds:7.1f} s, {self.requests_per_second:7.2f} requests/s")


def _replay_unbucketed(model, encoded, backend, costs, progress, device) -> ReplayRun:
    from portkit.core.progress import bar as progress_bar
    counter = CompileCounter(backend)
    compiled = torch.compile(model.module, backend=counter, dynamic=False)
    compile_wall = charged = run = 0.0
    with torch_private.recompile_limit(len(encoded)), torch.no_grad():
        for inputs in progress_bar(encoded, desc=f"replay {NO_BUCKETS}", disable=not progress, leave=False):
            before, start = len(counter.events), time.perf_counter()
            compiled(**{k: v.to(device) for k, v in inputs.items()})
            seconds = time.perf_counter() - start
            if len(counter.events) > before:
                compile_wall += seconds
                charged += bucketed.charge(costs, model, bucketed.backend_name(backend), inputs, seconds)
            else:
                run += seconds
    shapes = {tuple(next(iter(i.values())).shape) for i in encoded}
    if len(counter.events) < len(shapes):   # never silently eager: every distinct shape must have compiled
        raise RuntimeError(f"{len(shapes)} distinct shapes but only {len(counter.events)} compiles: Dynamo fell "
                           "back to eager; raise torch._dynamo.config.recompile_limit")
    seqs = [_seq_of(model, e.shapes) for e in counter.events if e.shapes]
    return ReplayRun(NO_BUCKETS, bucketed.backend_name(backend), None, len(encoded), len(counter.events), 0,
                     _real_tokens(model, encoded), sum(_computed(model, i) for i in encoded), charged, compile_wall,
                     run, compiled_seqs=seqs)


def _counted(model, encoded, backend, runs: list[ReplayRun], progress, device, plan=None) -> ReplayRun:
    """A replay counted, not compiled: without a plan one compile per distinct shape, with one a compile per
    bucket shape (the note says why that holds). Each distinct (padded) shape runs once, eagerly under the
    backend's numerics, its time charged to every request of that shape (static shapes: a request's run time
    is its shape's). Compiling here is the mean of the replay's measured compiles."""
    from portkit.core.progress import bar as progress_bar
    bm = bucketed.BucketedModel(model, plan, backend, device) if plan is not None else None
    seqs, seconds, run, computed = [], {}, 0.0, 0
    with torch.no_grad():
        for inputs in progress_bar(encoded, desc=f"replay {plan.planner if plan else NO_BUCKETS} (counted)",
                                   disable=not progress, leave=False):
            inputs = bm.pad(inputs)[0] if bm is not None else {k: v.to(device) for k, v in inputs.items()}
            shape, computed = tuple(tuple(v.shape) for v in inputs.values()), computed + _computed(model, inputs)
            if shape not in seconds:
                seqs.append(_seq_of(model, inputs))
                start = time.perf_counter()
                with bucketed.reference_numerics(backend)():
                    model.module(**inputs)
                seconds[shape] = time.perf_counter() - start
            run += seconds[shape]
    seqs = [s["seq"] for s in plan.shapes()] if plan is not None else seqs
    measured = [r for r in runs if r.plan is not None and r.compiles and not r.note]
    per = sum(r.compile_wall_seconds for r in measured) / sum(r.compiles for r in measured) if measured else 0.0
    what = (f"{len(seqs)} bucket shapes, one compile each in warm-up (the replay under fail_on_recompile and the "
            "padding check ran on the chosen plans)" if plan is not None else
            f"{len(seqs)} distinct shapes, one compile each under static shapes (stage 2's storm compiles or "
            "counts every new shape)")
    note = (f"counted, not compiled: {what}; each distinct shape ran once eagerly under the backend's numerics, "
            "its time charged to every request of that shape; "
            + (f"compiling here estimated per shape as the mean of this replay's {sum(r.compiles for r in measured)} "
               "measured compiles (in its compile seconds)" if measured else "no compile measured here"))
    name = plan.planner if plan else NO_BUCKETS
    return ReplayRun(name, bucketed.backend_name(backend), plan.to_dict() if plan else None,
                     len(encoded), len(seqs), 0, _real_tokens(model, encoded), computed, per * len(seqs), 0.0, run,
                     note=note, compiled_seqs=seqs)


def _real_tokens(model, encoded) -> int:   # real positions along the varying dimension (its mask's ones)
    return sum(sum(model.declaration.real_lengths(i)[model.seq_dim]) for i in encoded)


def _computed(model, inputs) -> int:       # positions computed along the varying dimension: rows x length
    return model.declaration.rows(inputs) * model.declaration.size_of(inputs, model.seq_dim)


def _seq_of(model, shapes) -> int:
    """A batch's (or a graph's input shapes') length along the varying dimension; a graph after a break
    takes other inputs: then its first input's second dimension."""
    try:
        return model.declaration.size_of(shapes, model.seq_dim)
    except BadParameter:
        return int(next(iter(shapes.values()))[1])


@dataclass(frozen=True)
class ReplaySettings:
    """How `replay` runs (see its docstring): which runs, the padding check's reference and tolerance, where."""
    baseline: bool = True             # also replay without buckets, first
    check: bool = True                # the padding check of every bucket shape
    reference: object = None          # a context manager factory for the eager reference (bucketed.reference_numerics)
    rtol: float | None = None         # the padding check's tolerance (bucketed.padding_tolerance)
    atol: float | None = None
    progress: bool = True
    fresh_caches: bool = False        # every run from an empty Inductor cache, as a fresh deployment
    device: str = "cpu"               # the target's device in native mode
    inductor: bool = False            # Inductor's code behind an emulated target's backend
    count_baseline: bool = False      # count the baseline's compiles instead of compiling them
    count: tuple = ()                 # plans counted (one compile per bucket shape) instead of compiled


def _replay_plan(model, plan, encoded, trace, backend, costs, settings: ReplaySettings, at: list[str]):
    """One plan compiled: warm-up, the replay under fail_on_recompile, the padding check. `at` holds the step
    running (for _failed_run, where the model refuses or raises)."""
    from portkit.core.progress import bar as progress_bar
    progress, device = settings.progress, settings.device
    at[0] = "probe of the outputs"
    bm = bucketed.BucketedModel(model, plan, backend, device)
    at[0] = "warm-up"
    warm = bm.warm_up(progress, costs)
    after_warmup = bm.compiles
    charged, compile_wall = sum(w["charged_seconds"] for w in warm), sum(w["seconds"] for w in warm if w["graphs"])
    run, computed = 0.0, 0
    at[0] = "replay"
    # From here PyTorch refuses every compile; each refusal is recorded (bm.late), then paid and counted.
    with torch.compiler.set_stance("fail_on_recompile"):
        bar = progress_bar(encoded, desc=f"replay {plan.planner}", disable=not progress, leave=False)
        for i, inputs in enumerate(bar):
            padded, rows, length = bm.pad(inputs)
            computed += _computed(model, padded)
            before, start = bm.compiles, time.perf_counter()
            bm.unpad(bm.run_padded(padded, i), rows, length)
            seconds = time.perf_counter() - start
            if bm.compiles > before:   # a compile after warm-up is compile time, not run time
                compile_wall += seconds
                charged += bucketed.charge(costs, model, bucketed.backend_name(backend), padded, seconds)
            else:
                run += seconds
        at[0] = "padding check"
        checks = (bucketed.check_padding(bm, trace, settings.reference, settings.rtol, settings.atol)
                  if settings.check else [])
    return ReplayRun(plan.planner, bucketed.backend_name(backend), plan.to_dict(), len(encoded), bm.compiles,
                     bm.compiles - after_warmup, _real_tokens(model, encoded), computed, charged, compile_wall, run,
                     checks, late_compiles=bm.late,
                     compiled_seqs=[_seq_of(model, e.shapes) for e in bm.counter.events if e.shapes])


def _measured(run, model, encoded, plan, backend) -> ReplayRun:
    """run(at) -> ReplayRun, or, where the model refuses to compile or raises, the run not measured (_failed_run).
    What the model does inside the stage is a result, never a crash of the stage: the other runs and targets go
    on. A BadParameter is the user's input, not the model's behaviour: it still stops the stage."""
    at = ["run"]
    try:
        return run(at)
    except BadParameter:
        raise
    except Exception as exc:   # the model's own code: whatever it raises is recorded
        return _failed_run(model, encoded, plan, backend, exc, at[0])


def _failed_run(model, encoded, plan, backend, exc: BaseException, step: str) -> ReplayRun:
    """A run the model stopped in `step`: why (backends.compile_failure, stage 2's reading of the same exception:
    a refusal of the target's compiler, or what the model raised) and where (the refused node's line, or the
    innermost frame of the model's code in the traceback); nothing measured."""
    failure = {**compile_failure(exc), "step": step}
    if failure["kind"] != "refused":        # what the model raises there eagerly, without the target, on any device
        failure["eager"] = _raises_eagerly(model, encoded, plan)
    if failure["where"] is None:
        failure["where"] = owners.raised_at(exc)
    torch.compiler.reset()   # what Dynamo kept of the failed compile is no later run's
    name = plan.planner if plan else NO_BUCKETS
    run = ReplayRun(name, bucketed.backend_name(backend), plan.to_dict() if plan else None,
                    len(encoded), 0, 0, _real_tokens(model, encoded), 0, 0.0, 0.0, 0.0, failure=failure)
    return dataclasses.replace(run, note=run.not_measured)


def _raises_eagerly(model, encoded: list[dict], plan) -> dict | None:
    """Whether the model itself raises, eagerly in float32 on the CPU, at the run's largest shape: its plan's largest
    bucket (a real text cut or padded to it), or without buckets its longest request; with the length
    (LoadedModel.raises_eagerly's answer), or None where it runs there."""
    if plan is not None:
        length, inputs = plan.top, bucketed.example_inputs(model, 1, plan.top)
    else:
        inputs = max(encoded, key=lambda x: model.declaration.size_of(x, model.seq_dim))
        length = model.declaration.size_of(inputs, model.seq_dim)
    raised = model.raises_eagerly(inputs)
    return {**raised, "length": length} if raised else None


def _encoded(model, trace: Trace, plans: list[BucketPlan]) -> list[dict]:
    """The trace's requests tokenized up front, cut at the plans' largest bucket under "truncate"; under
    "reject" the longer ones are left out, and said so."""
    top = max((p.top for p in plans), default=model.max_length)
    policy = plans[0].overflow if plans else "truncate"
    kept = [texts for texts, lengths in zip(trace.requests, trace.lengths)
            if policy == "truncate" or max(lengths) <= top]
    if len(kept) < len(trace.requests):
        print(f"overflow policy 'reject': {len(trace.requests) - len(kept)} requests longer than {top} tokens "
              "are rejected and left out of every run")
    return [model.encode(texts, max_length=top) for texts in kept]


def replay(model, trace: Trace, plans: list[BucketPlan], backend="inductor", settings: ReplaySettings | None = None,
           costs: dict | None = None) -> list[ReplayRun]:
    """Replay the trace through the compiled model: without buckets (if settings.baseline), then with each plan.

    Dynamo is reset before every run, so each run counts its own compiles from zero. Requests are
    tokenized up front (cut at the plans' largest bucket under "truncate"); timing covers the model
    calls only. With settings.check, every bucket shape's outputs are compared with unpadded eager outputs,
    run under settings.reference (default: bucketed.reference_numerics(backend), the emulated target's numerics)
    within rtol/atol (default: bucketed.padding_tolerance(backend)). An emulated target's backend checks and emulates
    every graph and runs it eagerly unless settings.inductor asks for Inductor's code (bucketed.compile_backend).

    Compile time: by default each shape is charged its first measured compile in this session (see
    bucketed.charge; `costs` holds those charges, shared between calls), so runs that share a shape cost the same
    whatever their order. settings.fresh_caches starts every run from an empty Inductor cache instead, as a
    fresh deployment would (slower; for benchmarks). settings.count_baseline: count the baseline's compiles
    (one per distinct shape) instead of compiling them, and settings.count: plans counted (one compile per
    bucket shape) instead of compiled (_counted); the stage counts all but the chosen plans, as stage 2
    already measured the storm and the proof needs the chosen ones only."""
    settings = settings or ReplaySettings()
    encoded = _encoded(model, trace, plans)
    costs = None if settings.fresh_caches else {} if costs is None else costs
    backend = bucketed.compile_backend(backend, settings.inductor)
    bucketed.warm(backend)
    with placement.on_device(model.module, settings.device):   # native mode: the target's device (as stage 2)
        runs = _replay_runs(model, encoded, trace, plans, backend, costs, settings)
    torch.compiler.reset()
    return runs


def _replay_runs(model, encoded, trace, plans, backend, costs, settings: ReplaySettings) -> list[ReplayRun]:
    """replay's runs, in order: the baseline (compiled or counted), then each plan's (compiled or counted)."""
    progress, device, runs = settings.progress, settings.device, []
    if settings.baseline and not settings.count_baseline:
        torch.compiler.reset()
        with bucketed.compile_cache(settings.fresh_caches):
            runs.append(_measured(lambda at: _replay_unbucketed(model, encoded, backend, costs, progress, device),
                                  model, encoded, None, backend))
    done = {}   # (boundaries, batch sizes) -> the run that compiled (or counted) those shapes
    for plan in plans:
        shapes = (plan.boundaries, plan.batch_sizes)
        if shapes in done or plan in settings.count:
            continue
        torch.compiler.reset()
        with bucketed.compile_cache(settings.fresh_caches):
            done[shapes] = _measured(lambda at: _replay_plan(model, plan, encoded, trace, backend, costs, settings, at),
                                     model, encoded, plan, backend)
    compiled = list(done.values())    # counted runs state their compile time from these
    for plan in (p for p in plans if (p.boundaries, p.batch_sizes) not in done):
        done[plan.boundaries, plan.batch_sizes] = _measured(
            lambda at: _counted(model, encoded, backend, compiled, progress, device, plan), model, encoded, plan,
            backend)
    for plan in plans:    # in the plans' order; the same shapes as an earlier plan: the same run
        first = done[plan.boundaries, plan.batch_sizes]
        runs.append(first if first.plan == plan.to_dict() else dataclasses.replace(
            first, name=plan.planner, plan=plan.to_dict(), note=f"same shapes as {first.name}: replayed once"))
    if settings.baseline and settings.count_baseline:
        runs.insert(0, _measured(lambda at: _counted(model, encoded, backend, compiled, progress, device),
                                 model, encoded, None, backend))
    return runs
