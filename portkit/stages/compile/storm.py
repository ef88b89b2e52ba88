"""Stage 2's recompile storm: real requests through the model compiled for each target, every compile and
the guard failure behind it, and the compile plumbing the fixed-shape check shares.

    >>> storm = storm.recompile_storm(m, stream, "tpu", opts)      # 100 requests, the first 8 shapes compiled
    >>> storms = storm.recompile_storms(m, stream, ["neuron", "tpu"], opts, compile_shapes=None)   # all compiled

The model is compiled with dynamic=False (both targets compile one graph per input shape) behind a
CompileCounter, the ground truth for compiles. The first `compile_shapes` distinct shapes (default
COMPILE_SHAPES: Dynamo's own recompile limit) are compiled and timed here. Every later request still
goes through Dynamo, under set_stance("fail_on_recompile"): a shape no compile covers makes Dynamo evaluate
its guards and refuse the recompile, naming the guard failures; that refusal is the compile the target
would pay, counted (with the graphs a compiled shape took) and priced like the compiled ones, and the
request runs eagerly (set_stance("force_eager")). A shape already counted runs eagerly again, as a
compiled shape would hit its cache. So a storm of hundreds of requests costs a few real compiles on this
CPU, and every count in it is Dynamo's own verdict on a real request, not a projection. Where the compiled
graphs grow with the length and the model's source loops over it, the storm names that loop (loops.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import statistics
import time
from dataclasses import dataclass

import torch   # torch._dynamo is imported on first use (seconds): the runner's checks import this module

from portkit.core import torch_private
from portkit.core import placement
from portkit.stages.compile import loops
from portkit.targets import selection
from portkit.targets import specs
from portkit.targets.backends import (CompileCounter, CompileEvent, EmulatedBackend, compile_failure, failure_text,
                                      refused_recompile, warm_inductor)
from portkit.core.errors import CompileRefused
from portkit.corpora.requests import Requests
from portkit.core.tables import HtmlTable
from portkit.targets.specs import Target

AUTO = selection.AUTO
# Shapes compiled for real before the rest are counted from Dynamo's guard failures: Dynamo's own default
# recompile limit (torch._dynamo.config.recompile_limit), the number of shapes a frame compiles before Dynamo
# itself stops compiling it. Written out, not read from Dynamo: importing Dynamo takes seconds, and the
# runner's checks import this module before any stage starts; tests/stages/compile/test_compiling.py checks
# the two agree.
COMPILE_SHAPES = 8


def _vendor_metrics(target: Target) -> dict:
    """The vendor's own compile counters (native mode), named by Target.compile_metrics."""
    found = {}
    for spec in target.compile_metrics:
        module, _, path = spec.partition(":")
        value = importlib.import_module(module)
        for part in path.split("."):
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        found[spec] = value() if callable(value) else dict(value) if isinstance(value, dict) else value
    return found


def precision_for(precision, name: str):
    return precision.get(name) if isinstance(precision, dict) else precision


@contextlib.contextmanager
def compiled_for(model, target: str, backend: str, precision, fullgraph: bool, **dynamo):
    """The model compiled for `target` with dynamic=False (what both targets require), behind a
    CompileCounter; yields (call(inputs), counter, detected, device). An emulated backend checks each
    graph and runs it eagerly (no Inductor codegen): a new shape costs Dynamo's trace and the check,
    and its price on the target comes from the cost model (portkit/planning/economics.py). Dynamo is reset
    around it."""
    detected = specs.detect(target)
    chosen, device = selection.backend_for(detected, backend, precision_for(precision, target), inductor=False)
    counter = CompileCounter(chosen)
    if not isinstance(chosen, EmulatedBackend):   # Inductor (a reference target) or the vendor's compiler
        warm_inductor()
    module = model.module if hasattr(model, "module") else model
    torch.compiler.reset()
    # torch.compile is this call; optimize() also takes the guard-failure hook.
    fn = torch_private.dynamo_optimize(counter, fullgraph=fullgraph, **dynamo)(module)
    try:
        with placement.on_device(module, device), torch.no_grad():
            yield (lambda x: fn(**placement.to_device(x, device))), counter, detected, device
    finally:
        torch.compiler.reset()



# ---------------------------------------------------------------- the recompile storm
@dataclass
class Storm:
    """One target's compiles over a stream of real requests: compiled here, or counted from Dynamo's
    guard failures (rows with "counted": True; see the module docstring)."""
    target: dict
    backend: str
    precision: str | None
    fullgraph: bool
    recompile_limit: int             # what this run allowed: raised, so every compile is paid
    default_limit: int               # torch._dynamo.config.recompile_limit: where Dynamo gives up
    requests: list[dict]
    compiles: list[CompileEvent]     # the compiles made here (counted ones are rows, not events)
    failure: dict | None = None
    vendor_metrics: dict | None = None
    compile_shapes: int | None = None   # shapes compiled before the rest were counted; None: all compiled
    loop: dict | None = None            # the Python loop over the input length behind it (loops.length_loop)

    def distinct_shapes(self) -> int:
        return len({tuple(r["shape"]) for r in self.requests})

    def compile_count(self) -> int:
        """Every compile of the storm: the ones made here and the ones counted."""
        return len(self.compiles) + self.counted()

    def counted(self) -> int:
        return sum(r["new_compiles"] for r in self.requests if r.get("counted"))

    def eager_from(self) -> int | None:
        """The first request whose new shape Dynamo, at its default limit, would silently run eagerly."""
        return eager_from([r["shape"] for r in self.requests], self.default_limit)

    def seconds(self) -> dict:
        """Seconds here: "compiling" is what the calls that compiled took on this CPU (Dynamo's trace and
        the backend: the target's check without codegen in emulated mode), not the target's compile;
        counted compiles cost nothing here."""
        made = [r for r in self.requests if r["new_compiles"] and not r.get("counted")]
        return {"compiling": sum(r["wall"] - r["run"] for r in made),
                "running": sum(r["run"] for r in self.requests), "backend": sum(e.seconds for e in self.compiles)}

    def summary(self) -> str:
        head = f"{self.target['name']} ({self.target['mode']}, {self.backend})"
        if self.failure and not self.requests:
            return f"{head}: cannot compile: {failure_text(self.failure)}"
        eager, counted = self.eager_from(), self.counted()
        made = (f" ({len(self.compiles)} compiled here, {counted} counted from Dynamo's guard failures past the first "
                f"{self.compile_shapes} shapes)" if counted else "")
        text = (f"{head}: {len(self.requests)} requests, {self.distinct_shapes()} shapes -> {self.compile_count()} "
                f"compiles{made}")   # the times here are measured: seconds() holds them, the text does not
        if eager is not None:
            text += (f"; at the default recompile_limit={self.default_limit}, request {eager + 1} and every later "
                     "new shape would silently run eagerly")
        if self.loop:
            text += f"; {loops.CAUSE}, at {self.loop['where']['text']}"
        if self.failure:      # the storm stopped: its count is of the requests before the refusal, not the stream's
            text += (f"; then cannot compile at request {(self.failure.get('request') or 0) + 1}, so the storm "
                     f"over the rest is not assessed: {failure_text(self.failure)}")
        return text

    def table(self) -> HtmlTable:
        def compiled(r):
            return f"{r['new_compiles']} (counted)" if r.get("counted") else r["new_compiles"] or ""
        rows = [[r["index"] + 1, "x".join(map(str, r["shape"])), compiled(r), r["compiles"],
                 f"{r['wall'] - r['run']:.2f}" if r["new_compiles"] and not r.get("counted") else "",
                 f"{r['run'] * 1e3:.1f}", r["reason"] or ("(first call)" if r["index"] == 0 else "")]
                for r in self.requests]
        return HtmlTable(["request", "shape", "compiled", "compiles so far", "compile s", "run ms",
                          "guard failure that triggered it"], rows, self.summary())

    def to_dict(self) -> dict:
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "compiles"},
                "compiles": [dataclasses.asdict(e) for e in self.compiles], "summary": self.summary(),
                "distinct_shapes": self.distinct_shapes(), "eager_from_request": self.eager_from(),
                "compile_count": self.compile_count(), "counted": self.counted(), "seconds": self.seconds()}

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def eager_from(shapes, limit: int) -> int | None:
    seen: set = set()
    for i, shape in enumerate(map(tuple, shapes)):
        if shape not in seen:
            seen.add(shape)
            if len(seen) > limit:
                return i
    return None


def _reason(reasons: list[str]) -> str | None:
    return re.sub(r"^\d+/\d+: ", "", reasons[0].splitlines()[0]) if reasons else None


class _Replay:
    """The requests' calls: the first `compile_shapes` distinct shapes compiled; every later shape
    offered to Dynamo under fail_on_recompile, its refusal counted and the request run eagerly."""

    def __init__(self, fn, compile_shapes: int | None):
        self.fn, self.compile_shapes = fn, compile_shapes
        self.compiled: set = set()
        self.counted: set = set()
        self.graphs: list[int] = []     # graphs each compiled shape took (after the first shape)

    def call(self, inputs: dict, shape: tuple) -> tuple[float, list[str] | None]:
        """Run one request. Returns (seconds, the guard failures of a counted compile or None)."""
        start = time.perf_counter()
        if self.compile_shapes is None or shape in self.compiled or len(self.compiled) < self.compile_shapes:
            self.fn(**inputs)
            self.compiled.add(shape)
            return time.perf_counter() - start, None
        guards = None
        if shape not in self.counted:
            try:
                with torch.compiler.set_stance("fail_on_recompile"):
                    self.fn(**inputs)
                return time.perf_counter() - start, None        # Dynamo's guards passed: no compile
            except RuntimeError as exc:
                guards = refused_recompile(exc)
                if guards is None:
                    raise
            self.counted.add(shape)
        start = time.perf_counter()
        with torch.compiler.set_stance("force_eager"):
            self.fn(**inputs)
        return time.perf_counter() - start, guards

    def graphs_per_shape(self) -> int:
        return round(statistics.median(self.graphs)) if self.graphs else 1


def _row(i: int, shape, new: list, total: int, wall: float, run: float, reasons: list[str]) -> dict:
    return {"index": i, "shape": list(shape), "new_compiles": len(new), "compiles": total, "wall": wall, "run": run,
            "backend_seconds": sum(e.seconds for e in new), "cache_hits": sum(e.cache_hit for e in new),
            "reason": _reason(reasons) if new else None, "guard_failures": len(reasons) if new else 0}


def _counted_row(i: int, shape, graphs: int, total: int, run: float, guards: list[str]) -> dict:
    return {"index": i, "shape": list(shape), "new_compiles": graphs, "compiles": total, "wall": run, "run": run,
            "backend_seconds": 0.0, "cache_hits": 0, "reason": _reason(guards), "guard_failures": len(guards),
            "counted": True}


def recompile_storm(model, requests: Requests, target: str, options, *, progress: bool = True,
                    compile_shapes: int | None = COMPILE_SHAPES) -> Storm:
    """Stream the requests through the model compiled for `target` with the stage's options (stage.Options:
    backend, precision, fullgraph) and record every compile (made here for the first `compile_shapes` shapes,
    then counted from Dynamo's refusals), the guard failure that triggered it, and the time spent compiling
    and running."""
    from portkit.core.progress import bar as progress_bar
    precision, backend, fullgraph = options.precision, options.backend, options.fullgraph
    default = torch_private.default_recompile_limit()
    reasons: list[str] = []
    rows, failure, counted = [], None, 0
    # pay every compile, as the targets do: the limit is raised above the requests' shapes
    guard_failed = lambda failure: reasons.append(failure.reason)   # noqa: E731
    with torch_private.recompile_limit(shapes=len(requests.inputs)) as limit, \
            compiled_for(model, target, backend, precision, fullgraph, guard_fail_fn=guard_failed) as (
                call, counter, detected, device):
        replay = _Replay(lambda **x: call(x), compile_shapes)
        for i, inputs in enumerate(progress_bar(requests.inputs, desc=f"{target} requests", disable=not progress)):
            counter.request, before, shape = i, len(counter.events), next(iter(inputs.values())).shape
            reasons.clear()
            try:
                wall, guards = replay.call(inputs, tuple(shape))
            except torch_private.dynamo_errors() as exc:   # becomes the report's finding
                failure = compile_failure(exc, i)
                break
            if guards is not None:
                counted += replay.graphs_per_shape()
                rows.append(_counted_row(i, shape, replay.graphs_per_shape(), len(counter.events) + counted,
                                         wall, guards))
                continue
            new, run = counter.events[before:], wall
            if new:   # a second call on the same shape: the steady-state run time
                if before:
                    replay.graphs.append(len(new))
                start = time.perf_counter()
                call(inputs)
                run = time.perf_counter() - start
            rows.append(_row(i, shape, new, len(counter.events) + counted, wall, run, reasons))
    precision_name = counter.backend.precision.name if isinstance(counter.backend, EmulatedBackend) else None
    storm = Storm(detected.to_dict(), counter.__name__, precision_name, fullgraph, limit, default, rows,
                  counter.events, failure, _vendor_metrics(detected.target) if device != "cpu" else None,
                  compile_shapes)
    storm.loop = loops.length_loop(model.module if hasattr(model, "module") else model, storm)
    return storm


class _Shared:
    """One Dynamo pass for several emulated targets: each graph Dynamo captures goes to every target's
    counted backend (a static-shape target compiles one graph per shape, so they see the same graphs);
    a target that refuses a graph is recorded and left out from then on; the graph then runs eagerly as
    Dynamo captured it (without a target's numerics: the storm counts compiles and times them; the
    fixed-shape check runs each target's own backend)."""

    def __init__(self, counters: dict[str, CompileCounter]):
        self.counters, self.refused = counters, {}
        self.__name__ = "+".join(c.__name__ for c in counters.values())

    def __call__(self, gm, example_inputs, **kwargs):
        for name, counter in self.counters.items():
            if name not in self.refused:
                try:
                    counter(gm, example_inputs)
                except CompileRefused as exc:
                    self.refused[name] = exc
        return gm.forward


def recompile_storms(model, requests: Requests, targets, options, *, progress: bool = True,
                     compile_shapes: int | None = COMPILE_SHAPES) -> dict[str, Storm]:
    """recompile_storm for every target; the emulated targets share one Dynamo pass (tracing a shape
    once, checking it once per target: _shared_storms)."""
    names = specs.parse_targets(targets)
    shared = {}
    for name in names:
        chosen, _ = selection.backend_for(specs.detect(name), options.backend,
                                          precision_for(options.precision, name))
        if isinstance(chosen, EmulatedBackend):
            shared[name] = chosen
    alone = lambda n: recompile_storm(model, requests, n, options, progress=progress,   # noqa: E731
                                      compile_shapes=compile_shapes)
    if len(shared) < 2:
        return {n: alone(n) for n in names}
    out = {n: alone(n) for n in names if n not in shared}
    out.update(_shared_storms(model, requests, shared, options.fullgraph, progress, compile_shapes))
    return {n: out[n] for n in names}


class _SharedRows:
    """The shared pass's record, per target: its rows, the compiles counted from Dynamo's refusals, and
    its failure (a target that failed is left out of the later requests)."""

    def __init__(self, counters: dict[str, CompileCounter], fan: _Shared, reasons: list[str]):
        self.counters, self.fan, self.reasons = counters, fan, reasons
        self.rows: dict[str, list] = {n: [] for n in counters}
        self.counted = dict.fromkeys(counters, 0)
        self.failures: dict[str, dict | None] = dict.fromkeys(counters)

    def request(self, replay: _Replay, i: int, inputs: dict) -> bool:
        """Request `i` through the shared pass, recorded for every live target; False: stop the storm."""
        live = [n for n in self.counters if self.failures[n] is None]
        if not live:
            return False
        before = {n: len(self.counters[n].events) for n in live}
        for counter in self.counters.values():
            counter.request = i
        self.reasons.clear()
        shape = next(iter(inputs.values())).shape
        try:
            wall, guards = replay.call(inputs, tuple(shape))
        except torch_private.dynamo_errors() as exc:   # becomes the report's finding
            self.failures.update({n: compile_failure(exc, i) for n in live})
            return False
        if guards is not None:
            for n in live:
                self.counted[n] += replay.graphs_per_shape()
                self.rows[n].append(_counted_row(i, shape, replay.graphs_per_shape(),
                                                 len(self.counters[n].events) + self.counted[n], wall, guards))
            return True
        run = wall
        if any(len(self.counters[n].events) > before[n] for n in live):
            if any(before.values()):
                replay.graphs.append(max(len(self.counters[n].events) - before[n] for n in live))
            start = time.perf_counter()
            replay.fn(**inputs)
            run = time.perf_counter() - start
        self._compiled(live, before, i, shape, wall, run)
        return True

    def _compiled(self, live: list[str], before: dict[str, int], i: int, shape, wall: float, run: float) -> None:
        """Each live target's row for a request Dynamo ran (compiled or cached); a refusal is its failure."""
        for n in live:
            if n in self.fan.refused:
                self.failures[n] = compile_failure(self.fan.refused[n], i)
                continue
            new = self.counters[n].events[before[n]:]
            others = sum(e.seconds for m in live if m != n for e in self.counters[m].events[before[m]:])
            row = _row(i, shape, new, len(self.counters[n].events) + self.counted[n], wall - others, run,
                       self.reasons)
            self.rows[n].append({**row, "cache_hits": 0})


def _shared_storms(model, requests: Requests, shared: dict[str, EmulatedBackend], fullgraph: bool, progress: bool,
                   compile_shapes: int | None) -> dict[str, Storm]:
    """The storms of the emulated targets in `shared`, in one Dynamo pass (_Shared)."""
    from portkit.core.progress import bar as progress_bar
    counters = {n: CompileCounter(b) for n, b in shared.items()}
    fan, reasons = _Shared(counters), []
    record = _SharedRows(counters, fan, reasons)
    module = model.module if hasattr(model, "module") else model
    default = torch_private.default_recompile_limit()
    torch.compiler.reset()
    with torch_private.recompile_limit(shapes=len(requests.inputs)) as limit:
        fn = torch_private.dynamo_optimize(fan, fullgraph=fullgraph,
                                    guard_fail_fn=lambda failure: reasons.append(failure.reason))(module)
        replay = _Replay(fn, compile_shapes)
        try:
            with placement.on_device(module, "cpu"), torch.no_grad():
                for i, inputs in enumerate(progress_bar(requests.inputs, desc=f"{'+'.join(shared)} requests",
                                                        disable=not progress)):
                    if not record.request(replay, i, inputs):
                        break
        finally:
            torch.compiler.reset()
    storms = {n: Storm(specs.detect(n).to_dict(), counters[n].__name__, b.precision.name, fullgraph, limit,
                       default, record.rows[n], counters[n].events, record.failures[n], None, compile_shapes)
              for n, b in shared.items()}
    for storm in storms.values():
        storm.loop = loops.length_loop(module, storm)
    return storms
