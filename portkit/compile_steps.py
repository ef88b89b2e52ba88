"""Stage 2's steps: real requests, graph breaks, the recompile storm, and one fixed shape.

    >>> from portkit import compile_steps, data, models
    >>> m = models.load("minilm")
    >>> stream = compile_steps.make_requests(m, data.load_corpus(), n=100)   # each text at its own length
    >>> storm = compile_steps.recompile_storm(m, stream, "tpu")     # every compile, and the guard behind it
    >>> fixed = compile_steps.check_fixed_shape(m, stream, "tpu", seq_len=64)   # fail_on_recompile proof

The model is compiled with dynamic=False (both targets compile one graph per input shape) behind a
CompileCounter, the ground truth for compiles. In emulated mode the backend checks each graph against
the target's rules and numerics and runs it eagerly, without Inductor codegen: a new shape costs
Dynamo's trace and the check here, and what it costs on the target is priced by portkit/economics.py.
The stage (portkit/compiling.py) puts the steps together into its result.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import html
import importlib
import re
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch._dynamo

from portkit import _torch, placement, selection, targets as targets_mod
from portkit.backends import (CompileCounter, CompileEvent, EmulatedBackend, _text, call_counting_recompiles,
                              refused_recompile, warm_inductor)
from portkit.errors import CompileRefused
from portkit.frames import innermost, place as _place
from portkit.streams import Requests, make_requests  # noqa: F401 (the stage's steps, in one place)
from portkit.tables import HtmlTable
from portkit.targets import Target

AUTO = selection.AUTO


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


def _precision_for(precision, name: str):
    return precision.get(name) if isinstance(precision, dict) else precision


@contextlib.contextmanager
def _compiled(model, target: str, backend: str, precision, fullgraph: bool, **dynamo):
    """The model compiled for `target` with dynamic=False (what both targets require), behind a
    CompileCounter; yields (call(inputs), counter, detected, device). An emulated backend checks each
    graph and runs it eagerly (no Inductor codegen): a new shape costs Dynamo's trace and the check,
    and its price on the target comes from the cost model (portkit/economics.py). Dynamo is reset
    around it."""
    detected = targets_mod.detect(target)
    chosen, device = selection.backend_for(detected, backend, _precision_for(precision, target), inductor=False)
    counter = CompileCounter(chosen)
    if not isinstance(chosen, EmulatedBackend):   # Inductor (a reference target) or the vendor's compiler
        warm_inductor()
    module = model.module if hasattr(model, "module") else model
    torch.compiler.reset()
    # torch.compile is this call; optimize() also takes the guard-failure hook.
    fn = torch._dynamo.optimize(counter, nopython=fullgraph, dynamic=False, **dynamo)(module)
    try:
        with placement.on_device(module, device), torch.no_grad():
            yield (lambda x: fn(**placement.to_device(x, device))), counter, detected, device
    finally:
        torch.compiler.reset()


def _failure(exc: BaseException, request: int | None = None) -> dict:
    """Why and where a compile failed, from Dynamo's or portkit's exception (not a traceback)."""
    inner = getattr(exc, "inner_exception", None) or exc
    where, stack = getattr(inner, "where", None), getattr(exc, "real_stack", None)
    if where is None and stack:
        where = _place(stack[-1].filename, stack[-1].lineno, stack[-1].name, stack[-1].line or "")
    lines = [ln.strip() for ln in str(inner).strip().splitlines() if ln.strip()]
    field_of = lambda label: next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(label)), "")  # noqa: E731
    kind = ("refused" if isinstance(inner, CompileRefused) else
            "graph break" if isinstance(exc, torch._dynamo.exc.Unsupported) else type(inner).__name__)
    return {"kind": kind, "message": lines[0] if lines else type(inner).__name__,
            "explanation": field_of("Explanation:"), "hint": field_of("Hint:"), "where": where, "request": request}


def _failure_text(f: dict) -> str:
    return f"{f['kind']}: {f['message']}" + (f" ({f['explanation']})" if f.get("explanation") else "") + \
        f" at {_text(f['where'])}"


# ---------------------------------------------------------------- step 1: graph breaks
@dataclass
class GraphBreaks:
    """Graph breaks (torch._dynamo.explain), whether fullgraph=True captures the model, and per
    emulated target what its compiler would refuse or not lower."""
    inputs: dict
    graphs: int
    breaks: list[dict]               # reason, where
    fullgraph: dict                  # {"ok": bool, ...why not}
    checks: dict[str, dict]          # target -> graphs, refused, not_lowered, decomposed, numerics, ops (contents)

    def summary(self) -> str:
        full = "fullgraph=True captures it in one graph" if self.fullgraph["ok"] else "fullgraph=True fails"
        if refused := [n for n, c in self.checks.items() if c["refused"]]:
            full += f", which {' and '.join(refused)} refuse"
        return f"{len(self.breaks)} graph breaks, {self.graphs} graphs; {full}"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "summary": self.summary()}

    def __str__(self) -> str:
        lines = [f"Graph breaks ({self.inputs['description']}): {self.summary()}"]
        lines += [f"  break {i + 1}: {b['reason']} at {_text(b['where'])}" for i, b in enumerate(self.breaks)]
        if not self.fullgraph["ok"]:
            lines.append(f"  fullgraph=True: {_failure_text(self.fullgraph)}")
        for name, c in self.checks.items():
            rounded = ", ".join(f"{k} ({v})" for k, v in c["numerics"].items()) or "no casts or rounding"
            lines.append(f"  {name} (emulated): " + (f"refused: {c['refused']}" if c["refused"] else
                         f"{c['graphs']} graphs accepted, {len(c['not_lowered'])} ops would not lower; "
                         f"numerics: {rounded}"))
            if decomposed := c.get("decomposed"):   # they lower: the target's compiler rewrites them
                lines.append("    decomposed by its compiler: " + ", ".join(f"{op} ({n} calls)"
                                                                       for op, n in decomposed.items()))
            lines += [f"    not lowered: {o['op']} ({o['status']}, {o['calls']} calls) at "
                      + "; ".join(w["text"] for w in o["where"][:3]) for o in c["not_lowered"]]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        table = HtmlTable(["#", "graph break", "user source line"],
                          [[i + 1, b["reason"], _text(b["where"])] for i, b in enumerate(self.breaks)])
        return f"<pre>{html.escape(str(self))}</pre>" + (table._repr_html_() if self.breaks else "")


def find_graph_breaks(model, inputs: dict, targets=("neuron", "tpu"), precision=None,
                      contents: bool = True) -> GraphBreaks:
    """Explain the model's graph breaks, then capture it with fullgraph=True under each emulated
    target's checks (no compile: the graphs run eagerly). contents: record each graph's ops with
    their dtypes and lines (checks[target]["ops"]), which reconcile.py needs (#18)."""
    module = model.module if hasattr(model, "module") else model
    names = targets_mod.parse_targets(targets)
    with torch.no_grad():
        explained = torch._dynamo.explain(module)(**inputs)
    breaks = []
    for r in explained.break_reasons:   # Dynamo restarts a frame after some breaks and reports them again
        frame = r.user_stack[-1] if r.user_stack else None
        found = {"reason": (r.reason.strip().splitlines() or ["?"])[0],
                 "where": _place(frame.filename, frame.lineno, frame.name, frame.line or "") if frame else None,
                 # the innermost frame outside torch: the line stage 1 names for the same code (#18)
                 "frame": innermost([_place(f.filename, f.lineno, f.name, f.line or "") for f in r.user_stack or ()])}
        if found not in breaks:
            breaks.append(found)
    backends = {n: EmulatedBackend(targets_mod.get(n), _precision_for(precision, n), inductor=False)
                for n in names if not targets_mod.detect(n).native and not targets_mod.get(n).reference}
    for backend in backends.values():   # record what the graphs contain, to reconcile stage 1 (#18)
        backend.contents = [] if contents else None

    def check_all(gm, example_inputs):
        for backend in backends.values():
            with contextlib.suppress(CompileRefused):   # recorded in backend.checks
                backend(gm, example_inputs)
        return gm.forward

    fullgraph = {"ok": True}
    for whole in (True, False):   # without one graph, check every piece
        torch.compiler.reset()
        try:
            with torch.no_grad():
                torch.compile(module, backend=check_all, fullgraph=whole, dynamic=False)(**inputs)
            break
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:   # not capturable
            if not whole:
                raise
            fullgraph = {"ok": False, **_failure(exc)}
            for b in backends.values():
                b.checks.clear()
                b.contents = [] if contents else None
    torch.compiler.reset()
    checks = {}
    for name, backend in backends.items():
        merged: dict[str, dict] = {}
        for c in backend.checks:
            for o in c.not_lowered:
                entry = merged.setdefault(o["op"], {**o, "calls": 0, "where": []})
                entry["calls"] += o["calls"]
                entry["where"] += [w for w in o["where"] if w not in entry["where"]]
        decomposed = sum((collections.Counter(c.decomposed) for c in backend.checks), collections.Counter())
        checks[name] = {"graphs": len(backend.checks), "not_lowered": list(merged.values()),
                        "decomposed": dict(sorted(decomposed.items())),
                        "refused": next((c.refused for c in backend.checks if c.refused), None),
                        "numerics": dict(sum((collections.Counter(c.numerics) for c in backend.checks),
                                             collections.Counter())),
                        **({"ops": _merged_contents(backend.contents)} if contents else {})}
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    desc = "inputs " + ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in shapes.items())
    return GraphBreaks({"description": desc, "shapes": shapes}, explained.graph_count, breaks, fullgraph, checks)


def _merged_contents(graphs: list[dict]) -> dict[str, dict]:
    """The ops of all captured graphs (frames.graph_contents), merged: calls, dtypes, source frames."""
    merged: dict[str, dict] = {}
    for graph in graphs:
        for op, found in graph.items():
            entry = merged.setdefault(op, {"calls": 0, "dtypes": [], "where": []})
            entry["calls"] += found["calls"]
            entry["dtypes"] = sorted(set(entry["dtypes"]) | set(found["dtypes"]))
            entry["where"] += [w for w in found["where"] if w not in entry["where"]][:3 - len(entry["where"])]
    return dict(sorted(merged.items()))


# ---------------------------------------------------------------- step 2: the recompile storm
@dataclass
class Storm:
    """One target's compiles over a stream of real requests."""
    target: dict
    backend: str
    precision: str | None
    fullgraph: bool
    recompile_limit: int             # what this run allowed: raised, so every compile is paid
    default_limit: int               # torch._dynamo.config.recompile_limit: where Dynamo gives up
    requests: list[dict]
    compiles: list[CompileEvent]
    failure: dict | None = None
    vendor_metrics: dict | None = None

    def distinct_shapes(self) -> int:
        return len({tuple(r["shape"]) for r in self.requests})

    def eager_from(self) -> int | None:
        """The first request whose new shape Dynamo, at its default limit, would silently run eagerly."""
        return _eager_from([r["shape"] for r in self.requests], self.default_limit)

    def seconds(self) -> dict:
        """Seconds here: "compiling" is what the calls that compiled took on this CPU (Dynamo's trace and
        the backend: the target's check without codegen in emulated mode), not the target's compile."""
        return {"compiling": sum(r["wall"] - r["run"] for r in self.requests if r["new_compiles"]),
                "running": sum(r["run"] for r in self.requests), "backend": sum(e.seconds for e in self.compiles)}

    def summary(self) -> str:
        head = f"{self.target['name']} ({self.target['mode']}, {self.backend})"
        if self.failure and not self.requests:
            return f"{head}: cannot compile: {_failure_text(self.failure)}"
        s, eager = self.seconds(), self.eager_from()
        text = (f"{head}: {len(self.requests)} requests, {self.distinct_shapes()} shapes -> {len(self.compiles)} "
                f"compiles; {s['compiling']:.1f} s compiling here vs {s['running']:.2f} s running")
        if eager is not None:
            text += (f"; at the default recompile_limit={self.default_limit}, request {eager + 1} and every later "
                     "new shape would silently run eagerly")
        return text

    def table(self) -> HtmlTable:
        rows = [[r["index"] + 1, "x".join(map(str, r["shape"])), r["new_compiles"] or "", r["compiles"],
                 f"{r['wall'] - r['run']:.2f}" if r["new_compiles"] else "", f"{r['run'] * 1e3:.1f}",
                 r["reason"] or ("(first call)" if r["index"] == 0 else "")] for r in self.requests]
        return HtmlTable(["request", "shape", "compiled", "compiles so far", "compile s", "run ms",
                          "guard failure that triggered it"], rows, self.summary())

    def to_dict(self) -> dict:
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "compiles"},
                "compiles": [dataclasses.asdict(e) for e in self.compiles], "summary": self.summary(),
                "distinct_shapes": self.distinct_shapes(), "eager_from_request": self.eager_from(),
                "seconds": self.seconds()}

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def _eager_from(shapes, limit: int) -> int | None:
    seen: set = set()
    for i, shape in enumerate(map(tuple, shapes)):
        if shape not in seen:
            seen.add(shape)
            if len(seen) > limit:
                return i
    return None


def recompile_storm(model, requests: Requests, target: str, precision=None, backend: str = AUTO,
                    fullgraph: bool = False, progress: bool = True) -> Storm:
    """Stream the requests through the model compiled for `target` and record every compile, the
    guard failure that triggered it, and the time spent compiling and running."""
    from portkit.progress import bar as progress_bar
    default = _torch.default_recompile_limit()
    reasons: list[str] = []
    rows, failure = [], None
    # pay every compile, as the targets do: the limit is raised above the requests' shapes
    guard_failed = lambda failure: reasons.append(failure.reason)   # noqa: E731
    with _torch.recompile_limit(shapes=len(requests.inputs)) as limit, \
            _compiled(model, target, backend, precision, fullgraph, guard_fail_fn=guard_failed) as (
                call, counter, detected, device):
        for i, inputs in enumerate(progress_bar(requests.inputs, desc=f"{target} requests", disable=not progress)):
            counter.request, before = i, len(counter.events)
            reasons.clear()
            start = time.perf_counter()
            try:
                call(inputs)
            except torch._dynamo.exc.TorchDynamoException as exc:   # becomes the report's finding
                failure = _failure(exc, i)
                break
            wall = run = time.perf_counter() - start
            new = counter.events[before:]
            if new:   # a second call on the same shape: the steady-state run time
                start = time.perf_counter()
                call(inputs)
                run = time.perf_counter() - start
            rows.append({"index": i, "shape": list(next(iter(inputs.values())).shape), "new_compiles": len(new),
                         "compiles": len(counter.events), "wall": wall, "run": run,
                         "backend_seconds": sum(e.seconds for e in new), "cache_hits": sum(e.cache_hit for e in new),
                         "reason": re.sub(r"^\d+/\d+: ", "", reasons[0].splitlines()[0]) if new and reasons else None,
                         "guard_failures": len(reasons) if new else 0})
    precision_name = counter.backend.precision.name if isinstance(counter.backend, EmulatedBackend) else None
    return Storm(detected.to_dict(), counter.__name__, precision_name, fullgraph, limit, default, rows,
                 counter.events, failure, _vendor_metrics(detected.target) if device != "cpu" else None)


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


def recompile_storms(model, requests: Requests, targets, precision=None, backend: str = AUTO,
                     fullgraph: bool = False, progress: bool = True) -> dict[str, Storm]:
    """recompile_storm for every target; the emulated targets share one Dynamo pass (tracing a shape
    once, checking it once per target), which halves the storm's time on this CPU for two targets."""
    from portkit.progress import bar as progress_bar
    names = targets_mod.parse_targets(targets)
    shared = {}
    for name in names:
        chosen, _ = selection.backend_for(targets_mod.detect(name), backend, _precision_for(precision, name))
        if isinstance(chosen, EmulatedBackend):
            shared[name] = chosen
    if len(shared) < 2:
        return {n: recompile_storm(model, requests, n, precision, backend, fullgraph, progress) for n in names}
    out = {n: recompile_storm(model, requests, n, precision, backend, fullgraph, progress)
           for n in names if n not in shared}
    counters = {n: CompileCounter(b) for n, b in shared.items()}
    fan, reasons = _Shared(counters), []
    rows: dict[str, list] = {n: [] for n in shared}
    failures: dict[str, dict | None] = dict.fromkeys(shared)
    module = model.module if hasattr(model, "module") else model
    default = _torch.default_recompile_limit()
    torch.compiler.reset()
    with _torch.recompile_limit(shapes=len(requests.inputs)) as limit:
        fn = torch._dynamo.optimize(fan, nopython=fullgraph, dynamic=False,
                                    guard_fail_fn=lambda failure: reasons.append(failure.reason))(module)
        try:
            with placement.on_device(module, "cpu"), torch.no_grad():
                for i, inputs in enumerate(progress_bar(requests.inputs, desc=f"{'+'.join(shared)} requests",
                                                disable=not progress)):
                    live = [n for n in shared if failures[n] is None]
                    if not live:
                        break
                    before = {n: len(counters[n].events) for n in live}
                    for counter in counters.values():
                        counter.request = i
                    reasons.clear()
                    start = time.perf_counter()
                    try:
                        fn(**inputs)
                    except torch._dynamo.exc.TorchDynamoException as exc:   # becomes the report's finding
                        failures.update({n: _failure(exc, i) for n in live})
                        break
                    wall = run = time.perf_counter() - start
                    if any(len(counters[n].events) > before[n] for n in live):
                        start = time.perf_counter()
                        fn(**inputs)
                        run = time.perf_counter() - start
                    for n in live:
                        if n in fan.refused:
                            failures[n] = _failure(fan.refused[n], i)
                            continue
                        new = counters[n].events[before[n]:]
                        others = sum(e.seconds for m in live if m != n for e in counters[m].events[before[m]:])
                        rows[n].append({"index": i, "shape": list(next(iter(inputs.values())).shape),
                                        "new_compiles": len(new), "compiles": len(counters[n].events),
                                        "wall": wall - others, "run": run,
                                        "backend_seconds": sum(e.seconds for e in new), "cache_hits": 0,
                                        "reason": re.sub(r"^\d+/\d+: ", "", reasons[0].splitlines()[0])
                                        if new and reasons else None, "guard_failures": len(reasons) if new else 0})
        finally:
            torch.compiler.reset()
    for n, b in shared.items():
        out[n] = Storm(targets_mod.detect(n).to_dict(), counters[n].__name__, b.precision.name, fullgraph, limit,
                       default, rows[n], counters[n].events, failures[n], None)
    return {n: out[n] for n in names}


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
            return f"{head}: cannot compile: {_failure_text(self.failure)}"
        return (f"{head}: {self.warmup_compiles} compile in warm-up, {self.compiles_after} compiles for "
                f"{self.requests} requests under fail_on_recompile (median {self.run_seconds * 1e3:.1f} ms each); "
                + (self.late_text() + "; " if self.late else "")
                + ("no other shape tried: the model takes one input shape" if not self.probed else
                   "a new shape " + ("raises, so the check is armed" if self.armed else "did NOT raise")))

    __str__ = __repr__ = summary

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "summary": self.summary()}


def check_fixed_shape(model, requests: Requests, target: str, seq_len: int = 64, precision=None,
                      backend: str = AUTO, fullgraph: bool = False) -> FixedShape:
    """Pad every request to seq_len, compile once, and run them all under fail_on_recompile; a
    request the stance refuses is recorded in FixedShape.late, then compiled and counted."""
    size = requests.fixed_size(seq_len)       # tokens: seq_len; another varying dimension: the stream's longest
    inputs = requests.padded(size)
    shape = list(next(iter(inputs[0].values())).shape)
    probe = requests.padded(size + 1 if size < 2 else size - 1)[0] if size is not None else None
    times, armed, failure, warm, late = [], None, None, 0, []
    with _compiled(model, target, backend, precision, fullgraph) as (call, counter, detected, _):
        try:
            call(inputs[0])
        except torch._dynamo.exc.TorchDynamoException as exc:
            failure = _failure(exc, 0)
        warm = len(counter.events)
        if failure is None:
            with torch.compiler.set_stance("fail_on_recompile"):
                for i, x in enumerate(inputs):
                    counter.request, refused = i, len(late)
                    start = time.perf_counter()
                    call_counting_recompiles(call, x, late, i)
                    if len(late) == refused:   # a compile is not a run time
                        times.append(time.perf_counter() - start)
                counter.request = None
                if probe is not None:
                    try:
                        call(probe)
                    except RuntimeError as exc:
                        if refused_recompile(exc) is None:
                            raise
                        armed = str(exc).strip().splitlines()[0]
    seq = requests.model.declaration.size_of(inputs[0], requests.model.seq_dim) if size is not None else None
    return FixedShape(detected.to_dict(), counter.__name__, {"batch": shape[0], "seq": seq, "dims": shape}, warm,
                      len(counter.events) - warm, len(inputs) if failure is None else 0,
                      statistics.median(times) if times else 0.0, armed, counter.events, failure, late,
                      probed=probe is not None)
