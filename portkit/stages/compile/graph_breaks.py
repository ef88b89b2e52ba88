"""Stage 2's graph breaks: one request of each text's own length compiled for every target behind explain, each
break with its reason and the model's line, and what every graph contains (its ops, dtypes and lines, which
stages/reconcile.py checks stage 1's findings against).

    >>> from portkit.stages.compile import graph_breaks
    >>> breaks = graph_breaks.find_graph_breaks(m, inputs, ["neuron", "tpu"])

The recompile storm is storm.py's, the fixed shape fixed_shape.py's; the stage (stage.py) puts them together.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import html
from dataclasses import dataclass

import torch   # torch._dynamo is imported on first use (seconds): the runner's checks import this module

from portkit.core import torch_private
from portkit.targets import specs
from portkit.targets.backends import (EmulatedBackend, compile_failure, failure_text, where_text)
from portkit.core.errors import CompileRefused
from portkit.core.owners import innermost, place as _place
from portkit.stages.compile.storm import precision_for
from portkit.core.tables import HtmlTable


# ---------------------------------------------------------------- step 1: graph breaks
@dataclass
class GraphBreaks:
    """Graph breaks (torch._dynamo.explain), whether fullgraph=True captures the model, and per
    emulated target what its compiler would refuse or not lower."""
    inputs: dict
    graphs: int
    breaks: list[dict]               # reason, where
    fullgraph: dict                  # {"ok": bool, ...why not}
    checks: dict[str, dict]          # target -> graphs, refused, not_lowered, foreign_ops, decomposed, numerics, ops

    def summary(self) -> str:
        full = "fullgraph=True captures it in one graph" if self.fullgraph["ok"] else "fullgraph=True fails"
        if refused := [n for n, c in self.checks.items() if c["refused"]]:
            full += f", which {' and '.join(refused)} refuse"
        return f"{len(self.breaks)} graph breaks, {self.graphs} graphs; {full}"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "summary": self.summary()}

    def __str__(self) -> str:
        lines = [f"Graph breaks ({self.inputs['description']}): {self.summary()}"]
        lines += [f"  break {i + 1}: {b['reason']} at {where_text(b['where'])}" for i, b in enumerate(self.breaks)]
        if not self.fullgraph["ok"]:
            lines.append(f"  fullgraph=True: {failure_text(self.fullgraph)}")
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
            lines += [f"    not an ATen op: {o['op']} ({o['calls']} calls) at "
                      + ("; ".join(w["text"] for w in o["where"][:3]) or "(no source line)")
                      for o in c.get("foreign_ops", [])]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        table = HtmlTable(["#", "graph break", "user source line"],
                          [[i + 1, b["reason"], where_text(b["where"])] for i, b in enumerate(self.breaks)])
        return f"<pre>{html.escape(str(self))}</pre>" + (table._repr_html_() if self.breaks else "")


def find_graph_breaks(model, inputs: dict, targets=("neuron", "tpu"), precision=None,
                      contents: bool = True) -> GraphBreaks:
    """Capture the model with fullgraph=True under each emulated target's checks (no compile: the graphs
    run eagerly); where one graph cannot hold it, explain its graph breaks (torch._dynamo.explain) and
    check every piece. A model that captures whole has no break to explain: that trace is the only one.
    precision: the stage's option (None: each target's default). contents: record each graph's ops with
    their dtypes and lines (checks[target]["ops"]), which reconcile.py needs."""
    module = model.module if hasattr(model, "module") else model
    names = specs.parse_targets(targets)
    backends = {n: EmulatedBackend(specs.get(n), precision_for(precision, n), inductor=False)
                for n in names if not specs.detect(n).native and not specs.get(n).reference}
    graphs = []

    def check_all(gm, example_inputs):
        graphs.append(gm)
        for backend in backends.values():
            with contextlib.suppress(CompileRefused):   # recorded in backend.checks
                backend(gm, example_inputs)
        return gm.forward

    fullgraph, breaks, explained = {"ok": True}, [], None
    for whole in (True, False):   # without one graph, explain the breaks and check every piece
        for backend in backends.values():   # record what the graphs contain, to reconcile stage 1
            backend.checks.clear()
            backend.contents = [] if contents else None
        graphs.clear()
        torch.compiler.reset()
        try:
            with torch.no_grad():
                torch.compile(module, backend=check_all, fullgraph=whole, dynamic=False)(**inputs)
            break
        except torch_private.uncapturable_errors() as exc:   # not capturable
            if not whole:
                raise
            fullgraph = {"ok": False, **compile_failure(exc)}
            torch.compiler.reset()
            with torch.no_grad():
                explained = torch_private.explain(module, **inputs)
            breaks = _breaks(explained)
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
        foreign: dict[str, dict] = {}   # one entry per op outside PyTorch's namespaces, over every graph
        for c in backend.checks:
            for o in c.foreign_ops:
                entry = foreign.setdefault(o["op"], {**o, "calls": 0, "where": []})
                entry["calls"] += o["calls"]
                entry["where"] += [w for w in o["where"] if w not in entry["where"]]
        checks[name] = {"graphs": len(backend.checks), "not_lowered": list(merged.values()),
                        "foreign_ops": list(foreign.values()),
                        "decomposed": dict(sorted(decomposed.items())),
                        "refused": next((c.refused for c in backend.checks if c.refused), None),
                        "numerics": dict(sum((collections.Counter(c.numerics) for c in backend.checks),
                                             collections.Counter())),
                        **({"ops": _merged_contents(backend.contents)} if contents else {})}
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    desc = "inputs " + ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in shapes.items())
    count = explained.graph_count if explained is not None else len(graphs)
    return GraphBreaks({"description": desc, "shapes": shapes}, count, breaks, fullgraph, checks)


def _breaks(explained) -> list[dict]:
    """explain's break reasons, each once, with the line it names (Dynamo restarts a frame after some
    breaks and reports them again)."""
    breaks = []
    for r in explained.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        found = {"reason": (r.reason.strip().splitlines() or ["?"])[0],
                 "where": _place(frame.filename, frame.lineno, frame.name, frame.line or "") if frame else None,
                 # the innermost frame outside torch: the line stage 1 names for the same code
                 "frame": innermost([_place(f.filename, f.lineno, f.name, f.line or "") for f in r.user_stack or ()])}
        if found not in breaks:
            breaks.append(found)
    return breaks


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
