"""Stage 2, compile for the target: graph breaks, compiles, and the recompile storm on real data.

    >>> from portkit.stages.compile import stage
    >>> opts = stage.Options.of({"seq_len": 64})         # the notebook's defaults, these values over them
    >>> stream = stage.make_requests(m, texts, opts.requests, max_tokens=opts.seq_len, seed=opts.seed)
    >>> report = stage.compile_model(m, stream, ["neuron", "tpu"], opts)
    >>> print(report)            # per target: compiles against requests, what they cost on the target, the fix
    >>> report.save("runs/minilm/compile.json")

Both targets compile one graph per input shape (awsdocs-neuron torch/compile/reference-torch-compile.html;
torch_tpu _backend.py). The stage finds the graph breaks (torch._dynamo.explain), streams real requests
through the model compiled with dynamic=False counting every compile and the guard failure behind it
(storm.py), then proves one fixed shape under set_stance("fail_on_recompile") (fixed_shape.py). Every compile is
priced with the target's compile cost (portkit/planning/economics.py), which says where its figure came
from. In emulated mode the backends check the target's rules and numerics and run each graph eagerly.
The options are the parameters cell of notebooks/02_compile.py (Options); the other workloads compiled are
generation.py and training.py.
"""
from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field

from portkit.stages import options
from portkit.stages.compile import generation
from portkit.stages.compile import loops
from portkit.stages.compile import training
from portkit.planning import economics
from portkit.core import assessed
from portkit.core import checks
from portkit.core import grading
from portkit.core import owners
from portkit.stages import reconcile
from portkit.targets import selection
from portkit.targets import specs
from portkit.targets.backends import compile_cause, failure_text, refusal_advice, where_text
from portkit.corpora.requests import Requests, make_requests
from portkit.stages.compile.fixed_shape import FixedShape, check_fixed_shape, check_fixed_shapes
from portkit.stages.compile.graph_breaks import GraphBreaks, find_graph_breaks
from portkit.stages.compile.storm import AUTO, COMPILE_SHAPES, Storm, recompile_storm, recompile_storms
from portkit.stages.compile.storm import eager_from
from portkit.core.errors import BadParameter
from portkit.core.findings import cause_key
from portkit.runfolder.results import Finding, save_result
from portkit.core.tables import HtmlTable

__all__ = ["AUTO", "COMPILE_SHAPES", "CompileReport", "FixedShape", "GraphBreaks", "Options", "Requests", "Storm",
           "StormSettings", "check_fixed_shape", "check_fixed_shapes", "check_generation", "check_training",
           "compile_costs", "compile_model", "eager_findings", "find_graph_breaks", "make_requests", "recompile_storm",
           "recompile_storms"]

STAGE = "compile"


def _options(options: Options | None) -> Options:
    """The stage's options as given, or the notebook's defaults for None."""
    return Options.defaults() if options is None else options


# What each of the stage's findings costs on the target: the consequence behind its severity.
CONSEQUENCES = {
    "compile_refused": "blocker: the target's compiler refuses the graph, so the model does not compile there",
    "not_lowered": {"blocker": "blocker: the op has no kernel and no fallback on the target, so it cannot run",
                    "work": "work: the op runs on the host CPU, a round trip out of the compiled graph per call"},
    "compile_failed": "blocker: the model does not compile for the target",
    "foreign_op": "work: the target's compiler meets one opaque op it has no lowering for in portkit's tables; what "
                  "runs inside it is named in the finding (host reads, sizes that follow the data, ops the target "
                  "would not lower), and its lowering on the target is not assessed: measure it on the device",
    "graph_break": "work: each break is one more graph compiled per input shape, with Python run between graphs",
    "fullgraph": "work: fullgraph=True, which the vendors recommend, fails; the model compiles in pieces",
    "recompile_storm": "work: one compile per new input shape, each paid at the target's compile time above",
    "recompile_after_warmup": "work: compiles after warm-up at one fixed shape, each paid at request time",
    "fixed_shape": "work: a fixed shape is not proven to compile once",
    "static_cache": "work: the model generates with the growing cache only, a compile per generated token",
    "train_refused": "blocker: the target's compiler refuses the training step, so training does not compile there",
    "train_not_lowered": {"blocker": "blocker: the op has no kernel and no fallback on the target, so the step "
                                     "cannot run",
                          "work": "work: the op runs on the host CPU, a round trip out of the compiled step per call"},
    "train_graph_break": "work: each graph of the step has its own backward, compiled and run apart",
    "train_recompile": "work: the step compiles again during training, each compile paid mid-run",
}


def _finding(kind: str, message: str, advice: str, where: dict | None = None, *, case: str = grading.ANY,
             cause: str | None = None, occurrences: dict | None = None) -> dict:
    """A finding with the severity the grading policy gives `kind` in `case` (core.grading) and its consequence;
    with `where`, it names whose code that is and phrases the advice for them. cause: its core.findings.cause_key
    (by default its kind at its line)."""
    severity = grading.severity(kind, case)
    consequence = CONSEQUENCES.get(kind)
    consequence = consequence.get(severity) if isinstance(consequence, dict) else consequence
    owner = owners.owner(where) if where is not None else None
    found = Finding(kind, severity, message, advice, where=where, owner=owner, consequence=consequence,
                    cause=cause or cause_key(kind, kind, where), occurrences=occurrences).to_dict()
    if owner is not None:
        found["advice"] = reconcile.advice_for(found, owner)
    return found


def _lowering_case(op: dict) -> str:
    """The grading case of an op that would not lower: no kernel and no fallback, or run on the host CPU."""
    return grading.NO_KERNEL if op["status"] == "unsupported" else grading.RUNS_ON_HOST


def _compile_failures(check: dict, *failures) -> list[dict]:
    """The target's compile refusal and failures, one finding per cause: the graph capture, the storm and the fixed
    shape stopped by one refusal are one finding, the steps it stopped its occurrences (the verdict counts causes)."""
    causes: dict[str, dict] = {}
    found = [("graph capture", check["refused"], None)] if check.get("refused") else []
    found += [(step, f["message"] if f["kind"] == "refused" else failure_text(f), f)
              for step, f in zip(("recompile storm", "fixed shape"), failures) if f]
    for step, text, failure in found:
        entry = causes.setdefault(text, {"steps": [], "failure": None})
        entry["steps"].append(step)
        entry["failure"] = entry["failure"] or failure
    out = []
    for text, entry in causes.items():
        failure, refused = entry["failure"] or {}, entry["steps"][0] == "graph capture"
        where = failure.get("where")
        if refused or "data-dependent size at" in text:   # portkit compiled with dynamic=False at a fixed shape
            advice = refusal_advice(text, where, "one fixed input shape")
        else:
            advice = failure.get("hint") or "fix the model so the target's backend compiles it"
        kind = "compile_refused" if refused or failure.get("kind") == "refused" else "compile_failed"
        out.append(_finding(kind, text if refused else failure_text(failure), advice, where,
                            cause=compile_cause("refused" if kind == "compile_refused" else failure["kind"], where,
                                                text),
                            occurrences={"steps": entry["steps"], "count": len(entry["steps"])}))
    return out


def _foreign_op(op: dict, target: str) -> dict:
    """A compiled graph's op that is not an ATen op (a torch.library custom op), as one finding: its name, whose
    code it is (where its Python function is defined, else where the model calls it), what portkit checked inside
    it and what it could not. Its cause is stage 1's for the same op at the same call (core.findings.cause_key)."""
    called = (op.get("where") or [None])[0]
    where = op.get("defined") or called
    owner = owners.owner(where)
    inside = []
    if op.get("host_reads"):
        inside.append("reads tensor values on the host (a device-to-host copy per call) at "
                      + "; ".join(w["text"] for w in op["host_reads"]))
    if op.get("data_dependent"):
        inside.append("runs ops whose sizes follow those values (" + "; ".join(
            f"{d['op']} at {where_text(d['where'])}" for d in op["data_dependent"]) + ")")
    if op.get("not_lowered"):
        inside.append("calls ops the target would not lower: " + ", ".join(
            f"{n['op']} ({n['status']})" for n in op["not_lowered"]))
    language = specs.get(target).kernel_language
    message = (f"{op['op']} is not an ATen op ({owner['owner']} code"
               + (f", defined at {op['defined']['text']}" if op.get("defined") else "")
               + f"), {op.get('calls', 0)} call(s) in the compiled graphs"
               + (f" at {where_text(called)}" if called else "")
               + (f"; inside it: {'; '.join(inside)}" if inside else "")
               + f". Checked: {'; '.join(op['checked'])}. Not checked: {'; '.join(op['not_checked'])}")
    advice = (f"write it with ATen ops of static sizes (no .item() or .tolist(); pad data-dependent groups to "
              f"fixed sizes) so the target's compiler sees inside it, or give the target a kernel for it in {language}")
    # one grade whatever is inside (the grading policy's "foreign_op"): the op is opaque to the target's compiler,
    # so what it costs there is measured on the device; the cause is stage 1's custom_op cause for the same call
    return _finding("foreign_op", message, advice, where,
                    cause=cause_key("custom_op", op["op"], called),
                    occurrences={"calls": op.get("calls", 0), "count": len(op.get("where") or []),
                                 "calls_inside": op.get("ops", {}), "traced": op.get("traced", False)})


def _foreign_ops(check: dict, train_check, target: str) -> list[dict]:
    """One finding per op outside PyTorch's namespaces, whichever compiled graphs hold it: the inference graphs'
    (check) or the training step's (train_check: training.TrainCompile, or None)."""
    found = {op["op"]: op for op in (train_check.foreign_ops if train_check is not None else [])}
    found.update({op["op"]: op for op in check.get("foreign_ops", [])})
    return [_foreign_op(op, target) for op in found.values()]


def _graph_breaks(breaks: GraphBreaks) -> list[dict]:
    """One finding per graph break cause (its source line), its reasons listed; the graphs Dynamo made are counted
    as graphs, apart from the causes. Without a break, what stops fullgraph=True."""
    by_line: dict[str | None, list[dict]] = {}
    for b in breaks.breaks:
        by_line.setdefault(owners.line_key(b.get("frame") or b["where"]), []).append(b)
    out = []
    for found in by_line.values():
        first = found[0]
        where = first.get("frame") or first["where"]
        reasons = sorted({b["reason"] for b in found})
        out.append(_finding("graph_break", f"graph break at {where_text(where)} "
                            f"({owners.owner(where)['owner']} code): {'; '.join(reasons[:3])}; "
                            f"{len(by_line)} break cause(s) split the model into "
                            f"{breaks.graphs} graphs per input shape",
                            "every break is a separate graph to compile per shape: remove it, then "
                            "compile with fullgraph=True as the vendors recommend", where,
                            occurrences={"reasons": reasons, "count": len(found), "graphs": breaks.graphs}))
    if not out and not breaks.fullgraph.get("ok", True):
        out.append(_finding("fullgraph", f"fullgraph=True fails: {failure_text(breaks.fullgraph)}",
                            "the vendors recommend fullgraph=True: remove what stops it",
                            breaks.fullgraph.get("where")))
    return out


def _seq(shape) -> int | None:
    return shape[1] if len(shape) > 1 else None


def _measured_length(model, shapes: dict) -> int | None:
    """A compiled graph's length along the model's varying dimension, from its inputs' shapes; a graph
    after a break takes other inputs: then its first input's second dimension, as before declarations."""
    try:
        return model.declaration.size_of(shapes, model.seq_dim)
    except BadParameter:
        return _seq(next(iter(shapes.values()), [0]))


def compile_costs(model, requests: Requests, targets, options: Options | None = None, *,
                  storms: dict[str, Storm] | None = None) -> dict[str, economics.CostModel]:
    """Per target, what one compile costs there (economics.cost_model): measured XLA over the stream's
    lengths for TPU, the Neuron estimate (options.neuron_compile_seconds overrides it), or, natively and
    for reference targets, the times the storm measured (pass `storms`)."""
    neuron_compile_seconds = _options(options).neuron_compile_seconds
    # a fixed-shape model's shapes have no varying dimension (an image's second is the channels)
    dim = model.seq_dim
    lengths = [s for s in (_seq(shape) for shape in requests.shapes()) if s is not None] if dim else []
    out = {}
    for name in specs.parse_targets(targets):
        detected = specs.detect(name)
        measured = ()
        if storms is not None and economics.priced_by_measured_compiles(name, detected.native):
            measured = [(_measured_length(model, e.shapes) if dim else None, e.seconds)
                        for e in storms[name].compiles]
        out[name] = economics.cost_model(model, name, lengths,
                                         measured=economics.MeasuredCompiles(tuple(measured), detected.native),
                                         neuron_compile_seconds=neuron_compile_seconds,
                                         batch=requests.shapes()[0][0] if requests.inputs else 1)
    return out


def eager_findings(breaks: GraphBreaks, out_dir, targets) -> dict[str, HtmlTable]:
    """Per target, stage 1's eager findings (its fallbacks.json in `out_dir`) against the graphs that
    find_graph_breaks just captured: what persists under torch.compile, what vanishes (reconcile.py)."""
    from portkit.runfolder import results
    results.wait_while_running(out_dir, "fallbacks")   # started beside it by `portkit run` (layout: reads_late)
    saved = results.load(out_dir, "fallbacks")     # typed; a damaged part is named (UnreadableResult)
    compiled = {"graph_breaks": breaks.to_dict()}
    out = {}
    for name in specs.parse_targets(targets):
        eager = saved.target(name) if saved is not None else None
        findings = reconcile.reconcile(list(eager.findings) if eager is not None else [], compiled, name)
        gone = reconcile.vanished_line(findings)
        out[name] = reconcile.table(findings, f"{name}: {len(findings)} eager finding(s) from stage 1"
                                    + (f"; {gone}" if gone else "") if saved is not None and saved.names else
                                    f"{name}: no stage 1 result in {out_dir} to reconcile")
    return out


def check_training(model, texts, targets, options: Options | None = None, *, steps: int = training.STEPS,
                   batch_size: int = training.BATCH):
    """Workload "train": one AdamW step of the model's own loss compiled for each target, `steps` steps on
    real batches of batch_size x options.seq_len (portkit/stages/compile/training.py)."""
    opts = _options(options)
    return training.check(model, texts, targets, steps, batch_size, seq_len=opts.seq_len,
                                  precision=opts.precision, seed=opts.seed)


def check_generation(model, texts, targets, options: Options | None = None):
    """Workload "generate": options.prompts real prompts from the corpus, greedy generation of
    options.new_tokens, with the dynamic cache and the bucketed static cache, per target
    (portkit/stages/compile/generation.py)."""
    opts = _options(options)
    return generation.check(model, texts.sample(opts.prompts, opts.seed), targets, opts.new_tokens,
                                    opts.backend, opts.precision)


# ---------------------------------------------------------------- the stage's result
@dataclass
class CompileReport:
    """Stage 2's result: graph breaks, and per target the storm and the fixed-shape proof."""
    model: dict
    requests: dict
    breaks: GraphBreaks
    storms: dict[str, Storm]
    fixed: dict[str, FixedShape]
    costs: dict[str, economics.CostModel]    # per target: what one compile costs there, and why
    generation: dict = field(default_factory=dict)   # workload "generate": generation.check's result
    training: dict = field(default_factory=dict)     # workload "train": training.check's result

    @classmethod
    def from_steps(cls, model, requests: Requests, breaks: GraphBreaks, storms: dict[str, Storm],
                   fixed: dict[str, FixedShape], costs: dict[str, economics.CostModel],
                   generation: dict | None = None, training: dict | None = None) -> CompileReport:
        return cls(model.describe(), requests.to_dict(), breaks, storms, fixed, costs, generation or {},
                   training or {})

    def compile_seconds(self, name: str) -> dict:
        """What one compile costs on the target (the cost model, over the storm's compiled shapes),
        with its kind and source; `measured_here` is what the compiling calls took on this CPU."""
        cost = self.costs[name]
        priced = [cost.seconds(_seq(r["shape"])) for r in self.storms[name].requests if r["new_compiles"]]
        here = [e.seconds for e in self.storms[name].compiles + self.fixed[name].compiles]
        return {"median": statistics.median(priced) if priced else cost.seconds(None),
                "first": priced[0] if priced else None, "count": len(priced), "kind": cost.kind,
                "source": cost.label(), "measured_here_median": statistics.median(here) if here else None,
                "measured_here_what": "Dynamo trace + the target's check, no codegen" if cost.kind in
                (economics.MEASURED_XLA, economics.ESTIMATE) else cost.kind}

    def priced(self, name: str) -> dict:
        """The measured storm priced on the target: every compile it paid, at the target's cost."""
        cost, storm = self.costs[name], self.storms[name]
        seconds = sum(cost.seconds(_seq(r["shape"])) * r["new_compiles"] for r in storm.requests)
        return {"requests": len(storm.requests), "compiles": storm.compile_count(), "seconds": seconds,
                "kind": cost.kind, "source": cost.label()}

    def projection(self, name: str) -> dict:
        """The storm the whole stream would bring: its shapes are tokenized, not run, and each new
        shape is priced with the target's compile cost. A projection, and labelled as one."""
        stream, cost = self.requests["stream_shapes"], self.costs[name]
        distinct = sorted(set(map(tuple, stream)))
        return {"requests": len(stream), "distinct_shapes": len(distinct),
                "eager_from_request": eager_from(stream, self.storms[name].default_limit),
                "median_compile_seconds": self.compile_seconds(name)["median"],
                "compile_seconds": cost.total(_seq(s) for s in distinct), "source": cost.label(),
                "kind": "projection: shapes tokenized, not run"}

    def findings(self, name: str) -> list[dict]:
        """What this stage found for one target, in the report's terms (severity, message, advice)."""
        out, check = [], (self.breaks.checks.get(name) or {})
        storm, fixed = self.storms[name], self.fixed[name]
        out += _compile_failures(check, storm.failure, fixed.failure)
        for op in check.get("not_lowered", []):
            where = "; ".join(w["text"] for w in op["where"][:2]) or "(no source line)"
            out.append(_finding("not_lowered",
                                f"{op['op']} would not lower ({op['status']}: {op['detail']}) at {where}",
                                "replace the op, or write a kernel for it on the target", case=_lowering_case(op),
                                cause=cause_key("not_lowered", op["op"], (op["where"] or [None])[0]),
                                occurrences={"calls": op.get("calls", 0), "count": len(op["where"])}))
        out += _foreign_ops(check, self.training.get(name), name)
        out += _graph_breaks(self.breaks)
        if storm.requests and storm.compile_count() > 1 and not storm.failure:   # a stopped storm is open
            out.append(self._storm_finding(name))
        if not fixed.failure and fixed.compiles_after:
            out.append(_finding("recompile_after_warmup",
                                f"{fixed.compiles_after} compile(s) after warm-up at one fixed shape "
                                f"{fixed.label}: {fixed.late_text()}",
                                "a fixed shape should compile once and never again: pad every input to it, "
                                "and check the model for Python code that depends on its inputs"))
        if not fixed.failure and fixed.probed and not fixed.armed:
            out.append(_finding("fixed_shape", fixed.summary(),
                                "a fixed shape should compile once and never again: check the model for "
                                "shape-dependent Python code"))
        if name in self.training:
            out += [_finding(kind, message, advice, where, case=case)
                    for kind, case, message, advice, where in self.training[name].findings()]
        if name in self.generation:
            out += [_finding(kind, message, advice, where, case=case)
                    for kind, case, message, advice, where in self.generation[name].findings()]
        return out

    def _storm_finding(self, name: str) -> dict:
        """The storm as one finding: its cause named where stage 2 found it (a Python loop over the input
        length, loops.py: the storm's compiles are that loop's graphs, so one finding, not two), else one compile
        per input shape. Either is stage 3's to resolve with its bucket plan (report/sections.resolve_storm)."""
        storm, priced = self.storms[name], self.priced(name)
        # the priced seconds rest on measured compile times: a numeric field, never the text
        occurrences = {"count": storm.compile_count(), "requests": len(storm.requests),
                       "compile_seconds": priced["seconds"]}
        if storm.loop:
            loop = storm.loop
            return _finding("recompile_storm", f"{loops.CAUSE}: {loops.describe(loop)}, each priced on "
                            f"{name} ({priced['source']})", loop["where"].get("setting") or loops.ADVICE,
                            loop["where"], case=grading.UNRESOLVED,
                            cause=cause_key("recompile_storm", loops.CAUSE, loop["where"]),
                            occurrences={**occurrences, "graphs": loop["graphs"], "guard": loop["guard"],
                                         "loops": [w["text"] for w in loop["loops"]],
                                         "lengths": loop["lengths"], "nodes": loop["nodes"]})
        return _finding("recompile_storm", f"{storm.compile_count()} compiles for {len(storm.requests)} "
                        f"requests of varying length, each priced on {name} ({priced['source']})",
                        "pad to a few fixed shapes: use stage 3's bucket plan", case=grading.UNRESOLVED,
                        cause=cause_key("recompile_storm", "one compile per input shape"), occurrences=occurrences)

    def target_summary(self, name: str) -> str:
        priced = self.priced(name)
        text = f"{self.storms[name].summary()}; {self.fixed[name].summary()}"
        if self.storms[name].failure:     # a storm the target stopped has no price: the question stays open
            text += f"; the storm's compiles and their time on {name} {grading.NOT_ASSESSED}"
        elif priced["compiles"]:   # their price rests on measured compile times: priced_storm holds the seconds
            text += f"; on {name} these {priced['compiles']} compiles are priced by {priced['source']}"
        return text

    def open_questions(self, name: str) -> list[dict]:
        """What this stage left open for one target (core.assessed): the recompile storm over the requests, where
        the target's compiler stopped it (its count and price are of the requests before the refusal only);
        generation, where the model raised with every cache."""
        failure, out = self.storms[name].failure, []
        if failure:
            out.append(assessed.open_question(
                f"recompile storm over the {self.requests['count']} requests (its compiles and their time on {name})",
                f"the target stopped the storm at request {(failure.get('request') or 0) + 1}: "
                f"{failure_text(failure)}"))
        if name in self.generation:
            out += [assessed.open_question(q, why) for q, why in self.generation[name].open_questions()]
        return out

    def summary(self) -> str:
        return " | ".join(self.target_summary(n) + (f"; generation: {self.generation[n].summary()}"
                                                    if n in self.generation else "")
                          + (f"; {self.training[n].summary()}" if n in self.training else "") for n in self.storms)

    def to_dict(self) -> dict:
        per_target = {name: {"target": storm.target, "backend": storm.backend, "precision": storm.precision,
                             "summary": self.target_summary(name), "compile_seconds": self.compile_seconds(name),
                             "compile_cost": self.costs[name].to_dict(), "priced_storm": self.priced(name),
                             "fixed_shape": self.fixed[name].shape, "checks": self.breaks.checks.get(name),
                             "findings": self.findings(name), assessed.KEY: self.open_questions(name),
                             "projection": self.projection(name), "storm": storm.to_dict(),
                             "fixed": self.fixed[name].to_dict(),
                             **({"generation": self.generation[name].to_dict()} if name in self.generation else {}),
                             **({"training": self.training[name].to_dict()} if name in self.training else {})}
                      for name, storm in self.storms.items()}
        return {"stage": STAGE, "model": self.model, "requests": self.requests, "summary": self.summary(),
                "graph_breaks": self.breaks.to_dict(),
                "targets": per_target}

    def save(self, path) -> None:
        save_result(path, self.to_dict())

    def __str__(self) -> str:
        lines = [f"Compile for the targets: {self.model['name']}, {self.requests['count']} requests from "
                 f"{self.requests['source']}", "  " + str(self.breaks).replace("\n", "\n  ")]
        lines += [f"  {self.target_summary(name)}" for name in self.storms]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = []
        for name, storm in self.storms.items():
            c, s, p, eager = self.compile_seconds(name), storm.seconds(), self.projection(name), storm.eager_from()
            rows.append([name, storm.target["mode"], storm.backend, len(storm.requests), storm.distinct_shapes(),
                         storm.compile_count(), f"{c['median']:.1f} ({c['kind']})",
                         f"{self.priced(name)['seconds']:.0f}",
                         f"{s['compiling']:.1f}", f"{s['running']:.2f}", "" if eager is None else eager + 1,
                         self.fixed[name].compiles_after, "yes" if self.fixed[name].armed else "no",
                         f"{p['distinct_shapes']} / {p['requests']}",
                         "" if p["eager_from_request"] is None else p["eager_from_request"] + 1])
        table = HtmlTable(["target", "mode", "backend", "requests", "shapes", "compiles",
                           "compile s per shape on the target", "storm's compiles on the target s",
                           "compiling here s", "running here s", "eager from request", "compiles after warm-up",
                           "fail_on_recompile armed", "stream: shapes / requests (projected)",
                           "stream: eager from request"], rows)
        return (f"<p><b>Compile for the targets</b>: <code>{html.escape(self.model['name'])}</code>, "
                f"{self.requests['count']} requests. {html.escape(self.breaks.summary())}.</p>"
                + table._repr_html_() + "".join(f"<p>{html.escape(self.target_summary(n))}</p>" for n in self.storms)
                + "<p>Compile cost per target: " + "; ".join(f"<b>{n}</b>: {html.escape(c.label())}"
                                                             for n, c in self.costs.items()) + "</p>")

    def plot(self):
        """Compiles against requests, measured (left) and projected over the whole stream (middle);
        time compiling vs running per target (right)."""
        import matplotlib.pyplot as plt
        fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 3.6), gridspec_kw={"width_ratios": [3, 3, 2]})
        names = list(self.storms)
        for i, name in enumerate(names):
            rows = self.storms[name].requests
            left.plot([r["index"] + 1 for r in rows], [r["compiles"] for r in rows], drawstyle="steps-post",
                      lw=4 - 1.5 * i, ls=("-", "--", ":")[i % 3],
                      label=f"{name} ({self.storms[name].target['mode']}): graphs compiled")
        seen, distinct = set(), []
        for shape in map(tuple, self.requests["stream_shapes"]):
            seen.add(shape)
            distinct.append(len(seen))
        measured = self.requests["count"]
        left.plot(range(1, measured + 1), distinct[:measured], "ko", ms=4, label="distinct shapes so far")
        middle.plot(range(1, len(distinct) + 1), distinct, "k-", drawstyle="steps-post",
                    label="distinct shapes = compiles (projected)")
        middle.axvspan(0.5, measured + 0.5, color="#4C72B0", alpha=0.3, label=f"measured here ({measured})")
        limit = self.storms[names[0]].default_limit
        eager = eager_from(self.requests["stream_shapes"], limit)
        if eager is not None:
            middle.axvline(eager + 1, color="#C44E52", lw=1)
            middle.annotate(f"request {eager + 1}: shape {limit + 1}, Dynamo falls back to eager",
                            (eager + 1, limit + 1), xytext=(6, 8), textcoords="offset points", fontsize=7,
                            color="#C44E52")
        for ax in (left, middle):
            ax.axhline(limit, color="#C44E52", ls="--", lw=1, label=f"default recompile_limit={limit}")
            ax.set_xlabel("request")
            ax.set_ylabel("cumulative compiles")
            ax.legend(fontsize=7, loc="upper left")
        left.set_title("Measured: compiles against requests (dynamic=False)")
        middle.set_title(f"Projected over {len(distinct)} requests of the same stream (shapes only)")
        priced = [self.priced(n) for n in names]
        right.bar([f"{n}\n({p['kind']})" for n, p in zip(names, priced)], [p["seconds"] for p in priced],
                  color="#DD8452", label="the storm's compiles, priced on the target")
        right.set_ylabel("seconds")
        right.set_title(f"Compile time of {measured} requests on the target", fontsize=9)
        right.legend(fontsize=7)
        fig.tight_layout()
        return fig


# ---------------------------------------------------------------- parameters and the stage's verb
def _backend(name: str, value) -> str:
    """A backend name; which names each target accepts is Options.check_targets' rule (selection.py)."""
    if not isinstance(value, str):
        raise BadParameter(name, value, hint="give a backend name, or 'auto'")
    return value


def _precision(name: str, value):
    """One precision name for every target, or {target: precision name}; each checked by check_targets."""
    if value is not None and not isinstance(value, (str, dict)):
        raise BadParameter(name, value, hint="give a dict {target: precision name}")
    return value


def _seconds(name: str, value):
    """None (the estimate from public reports), or the seconds one Neuron graph takes to compile."""
    if value is not None:
        checks.positive_float(name, value)
    return value


class Options(options.StageOptions):
    """Stage 2's options: the parameters cell of notebooks/02_compile.py, each field checked. With workload
    "generate" a built-in model is loaded to check it is a causal LM (other models: when the stage loads them).
    The backend and the precision are checked against the chosen targets by check_targets."""
    NOTEBOOK = "02_compile.ipynb"
    CHECKS = {"corpus": options.check_corpus, "text_column": checks.text, "requests": checks.up_to(2000),
              "batch_size": checks.up_to(64), "seq_len": checks.up_to(4096), "fullgraph": checks.boolean,
              "backend": _backend, "precision": _precision,
              "seed": checks.seed, "neuron_compile_seconds": _seconds,
              "workload": checks.one_of(checks.WORKLOADS), "new_tokens": checks.up_to(512), "prompts": checks.up_to(64)}

    def check(self, model: str | None) -> None:
        from portkit.workloads.generation import check_workload
        check_workload(self.workload, model)

    def check_targets(self, targets) -> list[str]:
        """The rules on the chosen targets (the runner checks them before a run): the backend is one every
        target accepts, and the precision names only chosen targets, each with one of its precisions.
        Returns the targets' names."""
        names = specs.parse_targets(targets)
        selection.check_parameter(self.backend, names)
        precision = self.precision
        for name, value in (precision.items() if isinstance(precision, dict) else ((n, precision) for n in names)):
            if name not in names:
                raise BadParameter("target in precision", name, names)
            if value is not None:
                specs.get(name).precision(value)
        return names


@dataclass(frozen=True)
class StormSettings:
    """How compile_model runs the storm, beyond the notebook's options (the API's and the tests' settings; the
    notebook runs the defaults): its first `compile_shapes` shapes compiled, the later ones counted from Dynamo's
    guard failures (0: compile every shape; storm.py), and progress bars."""
    progress: bool = True
    compile_shapes: int = COMPILE_SHAPES

    def __post_init__(self) -> None:
        checks.boolean("progress", self.progress)
        checks.non_negative_int("compile_shapes", self.compile_shapes)


def compile_model(model, requests: Requests, targets=("neuron", "tpu"), options: Options | None = None, *,
                  costs: dict[str, economics.CostModel] | None = None,
                  storm: StormSettings | None = None) -> CompileReport:
    """The whole stage: graph breaks, the storm and the fixed-shape proof for every target, each
    compile priced with the target's cost (compile_costs, unless `costs` gives them). `options`: the
    notebook's parameters (None: its defaults). `storm`: StormSettings (None: its defaults, the first
    COMPILE_SHAPES shapes compiled, the later ones counted)."""
    opts, storm = _options(options), storm or StormSettings()
    names = opts.check_targets(targets)
    breaks = find_graph_breaks(model, requests.inputs[0], names, opts.precision)
    storms = recompile_storms(model, requests, names, opts, progress=storm.progress,
                              compile_shapes=storm.compile_shapes or None)
    fixed = check_fixed_shapes(model, requests, names, opts)
    costs = costs or compile_costs(model, requests, names, opts, storms=storms)
    return CompileReport.from_steps(model, requests, breaks, storms, fixed, costs)
