"""Stage 4's result: per target and precision setting, what was measured, the verdict, and what to change.

    >>> report = accuracy.check_accuracy(model, inputs, ["tpu"])      # an AccuracyReport
    >>> print(report)                  # verdict, reasons, suggestions per target
    >>> report.outputs_table(), report.precision_table(), report.bucket_table(), report.layer_table("tpu")
    >>> report.plot()                  # error against depth, one line per precision; max error per bucket
    >>> report.save("runs/minilm/accuracy.json")
    >>> report.targets["tpu"].findings()          # findings.Finding: the report's terms

The suggestions come from what was measured: a higher precision's measured error, norm layers that are
out of tolerance only when every op is rounded, float64 ops that ran as float32 (quoting the error the
cast alone causes, error_by_cause), the atol a task-level pass needs, buckets that fail while the main
batch passes. A compiler that refused the model is a blocker finding (kind "compile_refused"); an output whose
shape on the target differs from the reference's is a work finding per output (kind "output_shape"), its
comparison left out while the other outputs and targets are compared.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import torch

from portkit.targets import specs
from portkit.targets.backends import compile_cause
from portkit.stages.accuracy import padding_side
from portkit.stages.accuracy import sample as stats
from portkit.stages.accuracy.comparison import primary_output
from portkit.core import grading
from portkit.core.findings import PADDING_CAUSE, Finding, cause_key
from portkit.targets.numerics import precision_cost
from portkit.runfolder.results import save_result
from portkit.core.tables import HtmlTable
from portkit.targets.tolerance import compute_dtype
from portkit.workloads import streaming

STAGE = "accuracy"
CAST_CAUSE = "float64 run as float32"      # error_by_cause's name for the target's dtype rules alone
DETAIL = "detail (element-wise assert_close, does not decide)"
ASSERT_CLOSE = "element-wise assert_close (detail, does not decide)"
NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")


def against_baseline(b: dict) -> str:
    """A result's error against float64 next to the GPU baseline's own, in words."""
    if b["target_error"] != b["target_error"]:      # nan: the output's shape differs, nothing was compared
        return f"no error against {b['truth']}: the output's shape differs from it"
    if b["ratio"] is None:
        return f"relative L2 error {b['target_error']:.2g} against {b['truth']} where {b['label']} has none"
    return f"error against {b['truth']} {b['ratio']:.3g}x that of {b['label']}"


def baseline_role(b: dict) -> str:
    """Whether the GPU comparison decides, in words. It decides only within its factor: an error no worse than
    today's deployment's is no regression, a PASS whatever the task metrics say. Beyond it, the task metrics decide:
    the ratio is to the GPU setup's own error, and an fp32 GPU's is float32 rounding alone (relative ~1e-7), so any
    reduced-precision rounding reads as thousands of times it without being a regression by itself."""
    if b["within"]:
        return f"within {b['factor']:g}x: no regression against today's GPU, so this decides (PASS)"
    own = f"its own error is {b['gpu_error']:.1g}" if b.get("gpu_error") else "it has no error of its own"
    return (f"beyond {b['factor']:g}x of today's error, so the task metrics decide; a ratio to {b['label']} is no "
            f"regression by itself: {own}, so any rounding below float32 reads as a large multiple of it")


@dataclass
class PrecisionResult:
    """One precision setting of one target on the main batch."""
    precision: dict            # Precision.to_dict(): name, the flag to set on hardware, what it rounds
    target_side: str
    outputs: dict[str, dict]
    task: dict
    vs_float64: dict | None
    layers: dict | None
    numerics: dict             # what the emulation changed, by kind (NumericsMode.stats)
    float64_ops: dict
    compiled_vs_eager: dict | None = None   # compiled outputs against eager emulation, per output
    # where float64 ran as float32: [{"cause", "measured", "outputs"}], the cast alone, then the precision
    error_by_cause: list[dict] | None = None

    @property
    def name(self) -> str:
        return self.precision["name"]

    baseline: dict | None = None   # this error against float64, as a ratio to the GPU setup's own (see accuracy)
    # the other declared outputs' task metrics on the main batch, each with its own metric kind: {output: task}
    output_tasks: dict[str, dict] = field(default_factory=dict)

    @property
    def within_baseline(self) -> bool:
        """No regression against today's GPU deployment: the error is within baseline_factor times its own."""
        return bool(self.baseline and self.baseline["within"])

    @property
    def main_decision(self) -> str:
        """The judged output's decision: its task metrics' on their sample (sample.py: a check whose 95% interval
        straddles its budget is inconclusive, never a pass), unless the error is no worse than the GPU setup's own
        (baseline_factor): then pass. An output of another shape than the reference's fails (nothing compared)."""
        if self.task.get("shape_mismatch"):
            return stats.FAIL
        if self.within_baseline:
            return stats.PASS
        return self.task.get("decision") or (stats.PASS if self.task["passed"] else stats.FAIL)

    @property
    def decision(self) -> str:
        """pass, fail or inconclusive: the judged output's (main_decision), failed by any other declared output
        that fails its own metrics; those are measured on the main batch only, so one that straddles its budget
        decides nothing (as a bucket's)."""
        if any(t["decision"] == stats.FAIL for t in self.output_tasks.values()):
            return stats.FAIL
        return self.main_decision

    def _why(self) -> list[str]:
        ratio = f"; {against_baseline(self.baseline)} (no-regression factor {self.baseline['factor']:g}x)" \
            if self.baseline else ""
        return [f"task: {self.task['reason']}{ratio}"]

    @property
    def shape_reasons(self) -> list[str]:
        """Outputs not compared because their shape on the target differs from the reference's (a finding each)."""
        return [t["reason"] for t in (self.task, *self.output_tasks.values()) if t.get("shape_mismatch")]

    @property
    def metric_reasons(self) -> list[str]:
        """Task metrics outside their budget: the judged output's (unless its error is no worse than the GPU
        setup's own), then the other declared outputs'."""
        main = self._why() if self.main_decision == stats.FAIL and not self.task.get("shape_mismatch") else []
        return main + [f"output {name!r}: {t['reason']}" for name, t in self.output_tasks.items()
                       if t["decision"] == stats.FAIL and not t.get("shape_mismatch")]

    @property
    def reasons(self) -> list[str]:
        """Why the verdict fails: task metrics outside their budget (metric_reasons) and outputs of another shape
        (shape_reasons); the element-wise comparison is detail (`details`)."""
        return self.metric_reasons + self.shape_reasons

    @property
    def undecided(self) -> list[str]:
        """Why the verdict is inconclusive: task metrics whose interval straddles their budget."""
        return self._why() if self.decision == stats.INCONCLUSIVE else []

    @property
    def details(self) -> list[str]:
        """Element-wise misses of the dtype tolerance (assert_close): detail, not the verdict."""
        return [f"{name}: {o['reason']}" for name, o in self.outputs.items() if not o["passed"]]

    @property
    def passed(self) -> bool:
        return self.decision == stats.PASS

    def checks_text(self) -> str:
        """Each task check with its sample and budget, e.g. 'top-1 agreement 1.000 [0.998, 1.000] on 1,797
        images (budget >= 0.99)'; a check that does not pass says how it was decided; the other declared outputs'
        checks follow, named by their output; an output not compared says why."""
        def text(task: dict, prefix: str = "") -> list[str]:
            if task.get("shape_mismatch"):
                return [task["reason"]]
            return [f"{prefix}{stats.described(c)} ({c['budget']}"
                    + (")" if c.get("decision", "pass") == stats.PASS else f": {c['decision'].upper()})")
                    for c in task.get("checks", [])]
        return "; ".join(text(self.task) + [t for name, task in self.output_tasks.items()
                                            for t in text(task, f"{name}: ")])

    def basis(self) -> str:
        """What the verdict rests on, in words: the task metrics with their samples and budgets, and the GPU
        baseline with whether it decides (baseline_role)."""
        b = self.baseline
        against = f"{against_baseline(b)} ({baseline_role(b)})" if b else "no GPU baseline measured"
        sample = (self.task.get("sample") or {}).get("text")
        on = f" (task sample: {sample})" if sample else ""
        if self.task.get("shape_mismatch"):
            return f"FAIL: {self.checks_text()}"
        if self.passed and not self.task["passed"]:
            return f"PASS against {b['label']}: no regression, {against}, although {self.task['reason']}"
        return f"{self.decision.upper()}: {self.checks_text()}{on}; {against}"

    def to_dict(self) -> dict:
        return {"precision": self.precision, "target_side": self.target_side, "passed": self.passed,
                "decision": self.decision,
                "reasons": self.reasons, "details": self.details, "basis": self.basis(), "baseline": self.baseline,
                "outputs": self.outputs, "task": self.task, "output_tasks": self.output_tasks,
                "vs_float64": self.vs_float64, "layers": self.layers, "numerics": self.numerics,
                "float64_ops": self.float64_ops, "compiled_vs_eager": self.compiled_vs_eager,
                "error_by_cause": self.error_by_cause}

    def cause(self, name: str, output: str) -> dict | None:
        """error_by_cause's comparison of `output` for the cause starting with `name`, or None."""
        found = next((c for c in self.error_by_cause or [] if c["cause"].startswith(name)), None)
        return found["outputs"].get(output) if found else None


MAIN_BATCH, TASK_SAMPLE = "the main batch", "the task sample"


def main_path(result: PrecisionResult) -> str:
    """Where a precision's judged output was decided: the task sample, or the main batch (no sample)."""
    return MAIN_BATCH if (result.task.get("sample") or {}).get("source", "the main batch") == "the main batch" \
        else TASK_SAMPLE


@dataclass
class TargetAccuracy:
    target: dict               # DetectedTarget.to_dict()
    chosen: PrecisionResult
    others: list[PrecisionResult]
    bucket_plan: dict
    buckets: list[dict]
    suggestions: list[str] = field(default_factory=list)
    compile_refused: dict | None = None      # target_runs.Refusal.to_dict(): the compiled path was refused
    # the other precisions re-run on a failing path of the chosen one: {"precision", "path", "passed", "reason"}
    tried: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.target["name"]

    @property
    def metric_reasons(self) -> list[str]:
        """Task metrics outside their budget (main batch, then buckets), each naming the first module out
        of tolerance where the per-layer hooks ran."""
        first = (self.chosen.layers or {}).get("first_failing")
        where = f"; the error enters at `{first['module']}` ({first['type']}), the first module out of " \
            "tolerance" if first else ""
        buckets = [(b, [r for r in b["reasons"] if r not in b.get("shape_reasons", [])]) for b in self._checked()]
        found = self.chosen.metric_reasons + [f"bucket {b['boundary']}: {'; '.join(r)}" for b, r in buckets if r]
        return [r + where for r in found]

    @property
    def reasons(self) -> list[str]:
        """Why the verdict fails: metric_reasons, then the outputs not compared for their shape (main batch,
        buckets)."""
        return self.metric_reasons + self.chosen.shape_reasons + [
            f"bucket {b['boundary']}: {r}" for b in self._checked() for r in b.get("shape_reasons", [])]

    def _checked(self) -> list[dict]:
        return [b for b in self.buckets if not b.get("skipped")]

    def shape_mismatches(self) -> dict[str, dict]:
        """Per output whose shape on the target differs from the reference's: both shapes (the first seen) and
        where it differed (the main batch, the task sample, each bucket), from every comparison made."""
        seen: dict[str, dict] = {}

        def note(name: str, differs: dict, where: str) -> None:
            entry = seen.setdefault(name, {"shape": differs["shape"], "reference_shape": differs["reference_shape"],
                                           "where": []})
            if where not in entry["where"]:
                entry["where"].append(where)
        for r in (self.chosen, *self.others):
            for name, o in r.outputs.items():
                if o.get("shape_mismatch"):
                    note(name, o["shape_mismatch"], f"main batch, precision '{r.name}'")
            for task in (r.task, *r.output_tasks.values()):
                differs = task.get("shape_mismatch")
                if differs and (task.get("sample") or {}).get("shape_mismatch"):
                    note(differs["output"], differs, f"task sample, precision '{r.name}'")
        for b in self._checked():
            for name, o in b["outputs"].items():
                if o.get("shape_mismatch"):
                    note(name, o["shape_mismatch"], f"bucket {b['boundary']}")
        return seen

    def _shape_findings(self) -> list[Finding]:
        """One work finding per output of another shape on the target: its comparison is left out there. The
        usual cause is a length that rounds with the input's (a codec's hop, a strided convolution's frames): the
        target's graph (padded to a bucket, or rounding a length computed in float) rounds it otherwise."""
        return [Finding("output_shape", grading.severity("output_shape"),
                        f"output {name!r} has shape {m['shape']} on {self.name} but {m['reference_shape']} in the "
                        f"reference ({'; '.join(m['where'])}): stage 4 could not compare it there",
                        "the output's length depends on how the input length rounds: pad the input to a multiple "
                        "of the model's hop (declare its varying dimension in frames of the hop, as "
                        "portkit.models.audio.waveform_declaration does with its stride), so every target computes "
                        "the same length",
                        cause=cause_key("output_shape", name), occurrences={"where": m["where"],
                                                                             "count": len(m["where"])})
                for name, m in self.shape_mismatches().items()]

    @property
    def undecided(self) -> list[str]:
        """Task metrics of the chosen precision whose interval straddles their budget (the verdict inconclusive)."""
        return self.chosen.undecided

    @property
    def details(self) -> list[str]:
        return self.chosen.details + [f"bucket {b['boundary']}: {d}" for b in self.buckets if not b.get("skipped")
                                      for d in b.get("details", [])]

    @property
    def verdict(self) -> str:
        """fail (a reason), inconclusive (no reason, a task metric undecided on its sample), or pass."""
        return stats.FAIL if self.reasons else stats.INCONCLUSIVE if self.undecided else stats.PASS

    def summary(self) -> str:
        p, task = self.chosen, self.chosen.task
        metric = {k: v for k, v in task.items() if isinstance(v, float)}
        shown = ", ".join(f"{k} {v:.6g}" for k, v in list(metric.items())[:2])
        first = (p.layers or {}).get("first_failing")
        sample = (task.get("sample") or {}).get("text")
        return (f"{self.name} ({self.target['mode']}, {p.target_side}, precision {p.name}): "
                f"{self.verdict.upper()}; {shown}" + (f" on {sample}" if sample else "") +
                f"; {len(self.reasons)} reasons"
                + (f"; {against_baseline(p.baseline)}" if p.baseline else "")
                + (f"; first module out of tolerance: {first['module']}" if first else "")
                + ("; BLOCKER: the target's compiler refuses the model" if self.compile_refused else ""))

    def advice(self) -> list[dict]:
        """Per precision setting: what its task metrics measured here and what it costs in matmul throughput
        as the vendor documents it (numerics.precision_cost, with the source URL): what a higher precision
        buys and what it costs."""
        rows = []
        for r in (self.chosen, *self.others):
            cost = precision_cost(self.name, r.name)
            rows.append({"precision": r.name, "setting": r.precision["setting"], "chosen": r is self.chosen,
                         "verdict": r.decision, "task": r.checks_text(),
                         "error_vs_baseline": r.baseline["ratio"] if r.baseline else None,
                         "relative_matmul_cost": cost["relative_matmul_cost"] if cost else None,
                         "cost_stated": cost["stated"] if cost else "not stated by the vendor",
                         "cost_source": cost["source"] if cost else None})
        return rows

    def advice_lines(self) -> list[str]:
        return [f"precision '{a['precision']}'{' (chosen)' if a['chosen'] else ''}: {a['verdict'].upper()}, "
                f"{a['task']}; vendor-stated matmul cost "
                + (f"{a['relative_matmul_cost']:g}x the fastest setting ({a['cost_stated']}; {a['cost_source']})"
                   if a["relative_matmul_cost"] is not None else a["cost_stated"]) for a in self.advice()]

    def failing_paths(self) -> list[str]:
        """Where a task metric of the chosen precision is outside its budget: the path its judged output was decided
        on (the task sample, or the main batch), the main batch for the other declared outputs, and each bucket."""
        paths = []
        if self.chosen.main_decision == stats.FAIL and not self.chosen.task.get("shape_mismatch"):
            paths.append(main_path(self.chosen))
        if any(t["decision"] == stats.FAIL and not t.get("shape_mismatch") for t in self.chosen.output_tasks.values()):
            paths.append(MAIN_BATCH)
        paths += [f"bucket {b['boundary']}" for b in self._checked()
                  if [r for r in b["reasons"] if r not in b.get("shape_reasons", [])]]
        return list(dict.fromkeys(paths))

    def tried_on(self, other: PrecisionResult) -> dict[str, bool]:
        """Per failing path, whether `other` passed there as portkit ran it: its own main-batch result counts for
        the main batch only where it ran on the same target side as the chosen one; the task sample and the buckets
        count only where the stage re-ran it there (`tried`). A path it was not run on is left out."""
        out = {}
        for path in self.failing_paths():
            entry = next((t for t in self.tried if t["precision"] == other.name and t["path"] == path
                          and not t.get("unpadded") and not t.get("padding_side")), None)
            if entry is not None:
                out[path] = entry["passed"]
            elif path == MAIN_BATCH and other.target_side == self.chosen.target_side:
                main_ok = main_path(self.chosen) != MAIN_BATCH or other.main_decision != stats.FAIL
                out[path] = main_ok and not any(t["decision"] == stats.FAIL for t in other.output_tasks.values())
        return out

    def findings(self) -> list[Finding]:
        """This stage's findings in the report's terms, graded by the grading policy (core.grading): a task metric
        outside its budget is "accuracy" FIXED_BY_SETTING where a precision portkit ran on every failing path
        (tried_on) passes there, else NOT_FIXED, whatever the model; a compiler that refuses the model is
        "compile_refused". An element-wise miss while the task metrics hold is no finding."""
        found = ([self._refusal()] if self.compile_refused else []) + self._shape_findings()
        if self.verdict == stats.INCONCLUSIVE:
            return found + [self._inconclusive()]
        if self.verdict == stats.PASS or not self.metric_reasons:
            return found
        padded_only = self.padded_only()
        if padded_only:
            found.append(self._padding(padded_only))
        paths = [p for p in self.failing_paths() if p not in padded_only]
        if not paths:
            return found
        tried = {r.name: (r, self.tried_on(r)) for r in self.others}
        fixing = [r for r, on in tried.values() if paths and set(on) == set(paths) and all(on.values())]
        case = grading.FIXED_BY_SETTING if fixing else grading.NOT_FIXED
        if fixing:
            advice = (f"set {fixing[0].precision['setting']}: tried: precision '{fixing[0].name}' passes on "
                      f"{', '.join(paths)}")
        else:
            advice = self._not_fixed_advice(paths, tried)
        return found + [Finding("accuracy", grading.severity("accuracy", case),
                                f"precision '{self.chosen.name}' ({self.chosen.target_side}): "
                                f"{'; '.join(self.metric_reasons)[:400]}", advice,
                                cause=cause_key("accuracy", "task metric outside its budget"),
                                occurrences={"paths": paths, "count": len(paths)})]

    def padded_only(self) -> list[str]:
        """The failing buckets whose texts pass at their own length (tried unpadded, same side and precision): they
        fail only padded, so padding is their cause, not the target's numerics."""
        return [t["path"] for t in self.tried if t.get("unpadded") and t["passed"]]

    def _padding(self, paths: list[str]) -> Finding:
        """Buckets that fail only padded: the grading policy's "padding" (work), the cause stage 3's padding check
        names too (findings.PADDING_CAUSE), so the report counts it once."""
        return Finding("padding", grading.severity("padding"),
                       f"precision '{self.chosen.name}' ({self.chosen.target_side}): {', '.join(paths)} fail(s) "
                       "padded to the bucket, and pass at the texts' own length (tried): padding changes the "
                       "outputs at real positions", padding_side.advice(self.tried, paths),
                       cause=PADDING_CAUSE, occurrences={"paths": paths, "count": len(paths)})

    def _not_fixed_advice(self, paths: list[str], tried: dict) -> str:
        """What portkit tried that still fails (each precision and where), then what it did not try, as leads."""
        still = [f"precision '{name}' on {', '.join(p for p, ok in on.items() if not ok)}"
                 for name, (_, on) in tried.items() if not all(on.values())]
        untried = [f"precision '{name}' on {', '.join(p for p in paths if p not in on)}"
                   for name, (_, on) in tried.items() if all(on.values()) and set(on) != set(paths)]
        parts = [f"tried: still fails: {'; '.join(still)}"] if still else []
        if untried:
            parts.append(f"not tried on every failing path: {'; '.join(untried)}")
        leads = self.suggestions[:2]
        parts.append("may help: " + ("; ".join(leads) if leads else "see the accuracy notebook's suggestions"))
        return "; ".join(parts)

    def _inconclusive(self) -> Finding:
        """An undecided verdict is work, not a pass and not a blocker: the model runs and nothing measured is out of
        budget, but its sample cannot tell the budget apart; what remains is to measure on more items."""
        sample = self.chosen.task.get("sample") or {}
        pool, items = sample.get("pool"), sample.get("items", 0)      # None: the main batch or made-up crops
        more = ("raise portkit's cap on the task sample (Scope.task_items_max) so it covers more of the data"
                if pool is not None and items < pool else "give a larger corpus (parameter corpus)")
        return Finding("accuracy_inconclusive", grading.severity("accuracy_inconclusive"),
                       f"precision '{self.chosen.name}' ({self.chosen.target_side}): undecided on its sample: "
                       f"{'; '.join(self.undecided)[:400]}",
                       f"{more}: with every decision agreeing, a rate's 95% interval clears a 0.99 budget from 381 "
                       "items on")

    def _refusal(self) -> Finding:
        refused = self.compile_refused
        where = f" at {refused['where']}" if refused.get("where") and refused["where"] not in refused["message"] else ""
        return Finding("compile_refused", grading.severity("compile_refused"),
                       f"{refused['backend']} refuses the compiled model{where}: {refused['message'][:400]}",
                       "tried: the main batch's fixed shape, still refused: change the code the compiler names "
                       f"(stage 2 names the same cause); the numerics were judged in {self.chosen.target_side} "
                       "instead",
                       # stage 2's and 3's cause for the same refusal: one finding in the report
                       cause=compile_cause("refused", refused.get("place"), refused["message"]))

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "verdict": self.verdict,
                "findings": [f.to_dict() for f in self.findings()], "compile_refused": self.compile_refused,
                "error_by_cause": self.chosen.error_by_cause,
                "reasons": self.reasons, "details": self.details, "basis": self.chosen.basis(),
                "baseline": self.chosen.baseline, "advice": self.advice(),
                "suggestions": self.suggestions, "target_side": self.chosen.target_side,
                "precision": self.chosen.precision, "tolerance": next(iter(self.chosen.outputs.values()))["tolerance"],
                "outputs": self.chosen.outputs, "task": self.chosen.task, "vs_float64": self.chosen.vs_float64,
                "layers": self.chosen.layers, "numerics": self.chosen.numerics,
                "float64_ops": self.chosen.float64_ops, "bucket_plan": self.bucket_plan, "buckets": self.buckets,
                "precisions": [r.to_dict() for r in (self.chosen, *self.others)], "tried": self.tried}


@dataclass
class AccuracyReport:
    """Stage 4's result: the references, and each target's comparison with them."""
    model: dict
    inputs: dict
    reference: dict
    targets: dict[str, TargetAccuracy]
    training: object = None    # training_accuracy.TrainingComparison where the workload is "train"
    generation: object = None  # generation_accuracy.GenerationComparison where the workload is "generate"
    stream: object = None      # streaming.StreamResult where the model has a streaming step (its state's drift)

    @property
    def verdict(self) -> str:
        """fail where a target fails or its stream drifts; inconclusive where one is undecided; else pass."""
        found = {t.verdict for t in self.targets.values()}
        if stats.FAIL in found or any(self.stream_findings(n) for n in self.targets):
            return stats.FAIL
        return stats.INCONCLUSIVE if stats.INCONCLUSIVE in found else stats.PASS

    def stream_findings(self, name: str) -> list[Finding]:
        """The target's stream checks that fail, as findings: its state's drift (stream_drift), each streamed
        output outside its budget (stream_output)."""
        runs = [r for r in (self.stream.to_dict() if self.stream is not None else {}).get("runs", [])
                if r["target"] == name]
        return [stream_drift(r) if c["metric"] == "drift_growth" else stream_state(r, c)
                if c["metric"] == "state_error" else stream_output(r, c)
                for r in runs for c in r["checks"] if not c["passed"]] + \
            [stream_recompile(r) for r in runs if r.get("late_compiles")]

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def _target(self, name: str, t: TargetAccuracy) -> dict:
        found = t.to_dict()
        drift = self.stream_findings(name)
        if drift:      # the inference verdict stands; the stream's failure is the target's finding beside it
            found["findings"] += [f.to_dict() for f in drift]
            found["reasons"] = found["reasons"] + [f.message for f in drift]
        return found

    def to_dict(self) -> dict:
        targets = {n: self._target(n, t) for n, t in self.targets.items()}
        return {"stage": STAGE, "model": self.model, "inputs": self.inputs, "reference": self.reference,
                "summary": self.summary(), "verdict": self.verdict,
                "reasons": [f"{n}: {r}" for n, t in targets.items() for r in t["reasons"]],
                "undecided": [f"{n}: {r}" for n, t in self.targets.items() for r in t.undecided],
                "targets": targets,
                "training": self.training.to_dict() if self.training is not None else None,
                "generation": self.generation.to_dict() if self.generation is not None else None,
                "stream": self.stream.to_dict() if self.stream is not None else None}

    def save(self, path) -> None:
        save_result(path, self.to_dict())

    def __str__(self) -> str:
        lines = [f"Accuracy of {self.model['name']} ({self.inputs['description']}): {self.verdict.upper()}; "
                 f"reference {self.reference['description']}, second reference {self.reference['float64']}"]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            lines.append(f"    verdict: {t.chosen.basis()}")
            lines += [f"    reason: {r}" for r in t.reasons]
            lines += [f"    inconclusive: {r}" for r in t.undecided]
            lines += [f"    reason (stream): {f.message}" for f in self.stream_findings(t.name)]
            lines += [f"    {DETAIL}: {d}" for d in t.details]
            lines += [f"    advice: {a}" for a in t.advice_lines()]
            lines += [f"    suggestion: {s}" for s in t.suggestions]
        if self.training is not None:
            lines.append(str(self.training))
        if self.generation is not None:
            lines.append(str(self.generation))
        if self.stream is not None:
            lines.append(str(self.stream))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        parts = [f"<p><b>Accuracy</b> of <code>{html.escape(self.model['name'])}</code> "
                 f"({html.escape(self.inputs['description'])}): <b>{self.verdict.upper()}</b>. Reference: "
                 f"{html.escape(self.reference['description'])}; second reference: "
                 f"{html.escape(self.reference['float64'])}.</p>"]
        for t in self.targets.values():
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{t.target['mode']}</i>, "
                         f"{html.escape(t.chosen.target_side)}</h4><p>{html.escape(t.summary())}</p>"
                         f"<p>{html.escape(t.chosen.basis())}</p>")
            rows = [["reason", r] for r in t.reasons] + [["inconclusive", r] for r in t.undecided] + \
                [["reason (stream)", f.message] for f in self.stream_findings(t.name)] + \
                [["suggestion", s] for s in t.suggestions] + [[DETAIL, d] for d in t.details] + \
                [["precision advice", a] for a in t.advice_lines()]
            if rows:
                parts.append(HtmlTable(["", ""], rows)._repr_html_())
        return "\n".join(parts)

    # -- tables and plots for the notebook
    def outputs_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for name, o in t.chosen.outputs.items():
                rows.append([t.name, t.chosen.name, t.chosen.target_side, name, f"{o['max_abs']:.3g}",
                             f"{o['max_rel']:.3g}",
                             f"{o['rel_l2']:.3g}", f"{o['cosine_min']:.7f}",
                             f"{o['tolerance']['dtype']} ({o['tolerance']['rtol']:g}, {o['tolerance']['atol']:g})",
                             "pass" if o["passed"] else "FAIL", "every change the target makes"])
                for cause in t.chosen.error_by_cause or []:   # the same error, split by what caused it
                    c = cause["outputs"][name]
                    rows.append([t.name, t.chosen.name, cause["measured"], name, f"{c['max_abs']:.3g}",
                                 f"{c['max_rel']:.3g}", f"{c['rel_l2']:.3g}", f"{c['cosine_min']:.7f}", "-", "-",
                                 cause["cause"]])
        return HtmlTable(["target", "precision", "run as", "output", "max abs", "max rel", "rel L2", "cosine min",
                          "tolerance (rtol, atol)", ASSERT_CLOSE, "error caused by"], rows,
                         f"outputs at real positions vs the reference ({self.reference['description']}); the "
                         "verdict is the task metrics' against their budgets (see the verdict), not this table")

    def precision_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for r, a in zip((t.chosen, *t.others), t.advice()):
                o = r.outputs[primary_output(self.model["kind"], r.outputs)]
                first = (r.layers or {}).get("first_failing")
                cost = f"{a['relative_matmul_cost']:g}x ({a['cost_source']})" if a["cost_source"] else a["cost_stated"]
                rows.append([t.name, r.name, r.precision["setting"], r.target_side, a["task"],
                             f"{against_baseline(r.baseline)} ({baseline_role(r.baseline)})" if r.baseline else "-",
                             f"{o['max_abs']:.3g}", first["module"] if first else "-", cost, r.decision.upper()])
        return HtmlTable(["target", "precision", "set on hardware with", "run as", "task metrics [95% interval] on "
                          "their sample (budget): they decide", "against today's GPU (decides only within its "
                          "factor)", "max abs (main output)", "first module out of tolerance (eager)",
                          "matmul cost, vendor-stated", "verdict"], rows,
                         "every precision setting of each target (chosen first): what it buys, what it costs")

    def bucket_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for b in t.buckets:
                if b.get("skipped"):
                    rows.append([t.name, b["boundary"], 0, "-", "-", "-", b["skipped"]])
                    continue
                o = b["outputs"][b["primary"]]
                task = "; ".join(stats.described(c) for c in b["task"].get("checks", []))
                decided = b["task"].get("decision", "pass")
                rows.append([t.name, b["boundary"], b["texts"], f"{b['padding']:.0%}", f"{o['max_abs']:.3g}", task,
                             "FAIL: " + "; ".join(b["reasons"])[:120] if not b["passed"] else
                             "pass" if decided == stats.PASS else
                             "not failed: too few items to decide, the task sample decides"])
        return HtmlTable(["target", "bucket", "texts", "padding", "max abs", "task", "verdict"], rows,
                         "per bucket: reference unpadded (as on the GPU), target padded to the bucket")

    def layer_table(self, target: str, limit: int = 12) -> HtmlTable:
        r = self.targets[target].chosen
        mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
        first = next((i for i, m in enumerate(mods) if not m["passed"]), None)
        if first is None:
            shown, caption = sorted(mods, key=lambda m: -m["rel_l2"])[:limit], "none out of tolerance; largest errors"
        else:
            shown, caption = mods[first:first + limit], "execution order from the first module out of tolerance"
        rows = [[m["index"], m["module"], m["type"], f"{m['max_abs']:.3g}", f"{m['rel_l2']:.3g}",
                 f"{m['mismatched']}/{m['numel']}", ", ".join(f"{k} x{v}" for k, v in m.get("changes", {}).items())]
                for m in shown]
        return HtmlTable(["#", "module", "type", "max abs", "rel L2", "out of tolerance", "changed by the target"],
                         rows, f"{target} ({r.name}, {(r.layers or {}).get('target_side', r.target_side)}): {caption}")

    def plot(self):
        """Left: relative L2 error of every module's output against depth, one line per precision.
        Right: the main output's max abs error per bucket."""
        import matplotlib.pyplot as plt
        names = list(self.targets)
        fig, axes = plt.subplots(len(names), 2, figsize=(13, 3.4 * len(names)), squeeze=False,
                                 gridspec_kw={"width_ratios": [3, 1]})
        floor = 1e-10
        for row, name in enumerate(names):
            t, ax = self.targets[name], axes[row][0]
            for r in (t.chosen, *t.others):
                mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
                if mods:
                    ax.plot([m["index"] for m in mods], [max(m["rel_l2"], floor) for m in mods], lw=1,
                            label=f"{r.name}{' (chosen)' if r is t.chosen else ''}")
            first = (t.chosen.layers or {}).get("first_failing")
            if first:
                ax.axvline(first["index"], color="#C44E52", ls="--", lw=1)
                ax.text(first["index"], ax.get_ylim()[1], f" first out of tolerance: {first['module']}",
                        color="#C44E52", fontsize=7, va="top")
            ax.set_yscale("log")
            ax.set_xlabel("module, in execution order")
            ax.set_ylabel(f"rel. L2 error (floor {floor:g})")
            ax.set_title(f"{name} ({t.target['mode']}, layers in {(t.chosen.layers or {}).get('target_side', '-')}): "
                         "error against depth", fontsize=10)
            ax.legend(fontsize=7, loc="lower right")
            done = [b for b in t.buckets if not b.get("skipped")]
            axes[row][1].bar([str(b["boundary"]) for b in done],
                             [b["outputs"][b["primary"]]["max_abs"] for b in done],
                             color=["#55A868" if b["passed"] else "#C44E52" for b in done])
            axes[row][1].set_title(f"{name}: max abs error per bucket", fontsize=9)
            axes[row][1].set_xlabel("bucket (tokens)")
        fig.tight_layout()
        return fig


# ---------------------------------------------------------------- suggestions from what was measured
def suggest(target: specs.Target, t: TargetAccuracy, kind: str) -> list[str]:
    """What to change, drawn only from what was measured (see the module docstring)."""
    chosen = t.chosen
    main = primary_output(kind, chosen.outputs)
    out = [*_where_error_enters(target, t, main), *_norms_in_float32(target, t), *_float64(target, chosen, main),
           *_element_wise_only(chosen), *_padding(t)]
    if not out and t.verdict == "pass":
        out.append(f"no change needed at precision '{chosen.name}': task metrics hold on the batch and every bucket"
                   + (" (emulated: confirm on hardware)" if t.target["mode"] == "emulated" else ""))
    return out


def _where_error_enters(target: specs.Target, t: TargetAccuracy, main: str) -> list[str]:
    """The module where the error first exceeds the tolerance, once a task metric is out of budget, and the
    float32 precision to run it at (with what the whole model measured there, when it was measured)."""
    chosen = t.chosen
    first = (chosen.layers or {}).get("first_failing")
    if not first or chosen.passed:
        return []
    measured = {r.name: r for r in (chosen, *t.others)}
    fp32 = next((p for p in target.precisions if compute_dtype(p) == torch.float32), None)
    row = chosen.layers["modules"][first["index"]]
    changed = ", ".join(f"{k} x{v}" for k, v in row.get("changes", {}).items()) or "nothing counted"
    if compute_dtype(target.precision(chosen.name)) == torch.float32 or fp32 is None:
        return [f"error first exceeds the tolerance in `{first['module']}` ({first['type']}) although "
                f"precision '{chosen.name}' computes in float32: the target changed {changed} there; "
                "check that module's ops on the target"]
    text = (f"error first exceeds the {chosen.layers['tolerance']['dtype']} tolerance in `{first['module']}` "
            f"({first['type']}; the target changed: {changed}): run it at precision '{fp32.name}' "
            f"({fp32.setting})")
    if fp32.name in measured:
        r = measured[fp32.name]
        text += (f"; the whole model at '{fp32.name}' measured max abs error "
                 f"{r.outputs[main]['max_abs']:.2g} "
                 f"({'passes' if r.passed else 'still fails'}; {r.target_side})")
    return [text]


def _norms_in_float32(target: specs.Target, t: TargetAccuracy) -> list[str]:
    """Per measured precision: norm layers out of tolerance only because a setting rounds every op, not just
    matmuls (a sibling precision that rounds only matmuls keeps them within it)."""
    out = []
    chosen, results = t.chosen, (t.chosen, *t.others)
    measured = {r.name: r for r in results}
    for r in results:
        p = target.precision(r.name)
        sibling = next((q for q in target.precisions if q.all_ops is None and q.matmul_inputs == p.matmul_inputs
                        and q.name in measured and measured[q.name].layers), None) if p.all_ops else None
        if sibling is None or not r.layers:
            continue
        fine = {m["module"]: m for m in measured[sibling.name].layers["modules"] if m.get("compared") and m["passed"]}
        norms = [m for m in r.layers["modules"] if m.get("compared") and not m["passed"] and m["module"] in fine
                 and any(n in m["type"] for n in NORM_TYPES)]
        if norms:
            m = norms[0]
            out.append(f"{'with' if r is chosen else 'if you use'} precision '{r.name}' ({p.setting}): keep "
                       f"{', '.join(sorted({n['type'] for n in norms}))} in float32: {len(norms)} norm module(s) are "
                       f"out of tolerance only under it, first `{m['module']}` (rel. L2 error {m['rel_l2']:.2g}, "
                       f"{fine[m['module']]['rel_l2']:.2g} under '{sibling.name}', {sibling.setting}, which rounds "
                       "only matmuls)")
    return out


def _float64(target: specs.Target, chosen: PrecisionResult, main: str) -> list[str]:
    """float64 ops the target ran as float32: per module where the layers were compared, else in all, with the
    measured effect of that cast on the main output."""
    rows = [m for m in (chosen.layers or {}).get("modules", []) if m.get("float64_ops")]
    cast, rounding = chosen.cause(CAST_CAUSE, main), chosen.cause("precision", main)
    if cast:
        effect = f"measured effect of {CAST_CAUSE} alone on `{main}`: max abs error {cast['max_abs']:.2g}" + \
            (f" (precision '{chosen.name}' rounding adds {rounding['max_abs']:.2g} on its own)" if rounding else "")
    else:
        effect = f"max abs error on `{main}` with every change together: {chosen.outputs[main]['max_abs']:.2g}"
    out = []
    for m in rows:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(m["float64_ops"].items()))
        out.append(f"avoid float64 in `{m['module']}` ({m['type']}): {sum(m['float64_ops'].values())} float64 ops ran "
                   f"as float32 on {target.name} ({ops}); make it float32 (.float()) on the GPU too, so the "
                   f"reference is what the target runs; {effect}")
    if not rows and chosen.float64_ops:
        out.append(f"avoid float64: {sum(chosen.float64_ops.values())} float64 ops ran as float32 on {target.name} "
                   f"({', '.join(sorted(chosen.float64_ops))}); run with layers=True to find their modules; {effect}")
    return out


def _element_wise_only(chosen: PrecisionResult) -> list[str]:
    """Outputs beyond assert_close's tolerance while every task metric holds: a detail a reader may ask about;
    the verdict rests on the task."""
    failing = {name: o for name, o in chosen.outputs.items() if not o["passed"]}
    if not failing or not chosen.task["passed"]:
        return []
    worst = max(failing, key=lambda name: failing[name]["max_abs"])   # named: each output has its own error
    tol = failing[worst]["tolerance"]
    return [f"element-wise, outputs differ beyond assert_close's {tol['dtype']} tolerance (max abs "
            f"{failing[worst]['max_abs']:.2g}, on output '{worst}') while every task metric holds: rounding the "
            "task does not see; no change needed for the verdict"]


def _padding(t: TargetAccuracy) -> list[str]:
    """Buckets that fail while the main batch passes: padding changes the result."""
    return [f"bucket {b['boundary']} fails while the main batch passes ({b['reasons'][0][:100]}): padding "
            "changes the result; check that the model masks padded positions, or choose buckets that pad less"
            for b in t.buckets if not b.get("skipped") and not b["passed"] and t.chosen.passed]


def _keep_float32(run: dict) -> str:
    """What keeps a stream run's step in float32 on its target: its float32 precision setting where it has one."""
    target = specs.get(run["target"]) if run["target"] in specs.TARGETS else None
    fp32 = next((q for q in target.precisions if compute_dtype(q) == torch.float32), None) if target else None
    return (f"precision '{fp32.name}' ({fp32.setting}) for the step" if fp32 and fp32.name != run["precision"] else
            "float32 for the recurrent matmuls")


def _stream_case(run: dict, check: dict) -> tuple[str, str]:
    """A failing stream check's grading case and what the advice says was tried: FIXED_BY_SETTING where the same
    stream at the target's float32 precision passed that check (streaming.try_float32), else NOT_FIXED; the
    float32 setting is then a lead, said to be untried where it was not run."""
    tried = run.get("tried") or {}
    passed = (tried.get("checks") or {}).get(streaming.check_key(check))
    if passed:
        return grading.FIXED_BY_SETTING, (f"set {tried['setting']}: tried: precision '{tried['precision']}' passes "
                                          "this check on the same stream")
    if passed is None:
        return grading.NOT_FIXED, f"may help: run the step in float32 ({_keep_float32(run)}; not tried on the stream)"
    return grading.NOT_FIXED, (f"tried: precision '{tried['precision']}' ({tried['setting']}) still fails this check "
                               "on the same stream")


def stream_drift(run: dict) -> Finding:
    """A stream run (streaming.TargetStream.to_dict()) that fails its drift check, as the target's finding: its
    state's error grows with the stream's length beyond noise, so a long enough stream goes wrong in deployment.
    Graded as a task metric is (_stream_case): work where the target's float32 precision, tried on the same stream,
    brings it back, a blocker otherwise."""
    failed = next(c for c in run["checks"] if c["metric"] == "drift_growth")
    p = (failed.get("trend") or run.get("drift_trend") or {}).get("p")
    leaf = f" in state leaf {failed['leaf']}" if len(run.get("leaves") or {}) > 1 else ""
    case, tried = _stream_case(run, failed)
    lead = ("" if case == grading.FIXED_BY_SETTING else "; may help: cast the state to float32 where it is carried "
            "from step to step: a state rounded every step accumulates the rounding")
    return Finding("stream_drift", grading.severity("stream_drift", case),
                   f"streamed state drifts at precision '{run['precision']}' ({run['backend']}): its error against "
                   f"float64{leaf} grows {failed['value']:.2f}x over the stream ({failed['budget']}), a rise beyond "
                   f"noise (Mann-Whitney U p = {p:.2g})" if p is not None else
                   f"streamed state drifts at precision '{run['precision']}': growth {failed['value']:.2f}x "
                   f"({failed['budget']})", tried + lead)


def stream_state(run: dict, check: dict) -> Finding:
    """A stream run whose state is wrong from the first chunk (streaming.level_check fails), as the target's finding:
    apart from the drift, which a state off by the same amount at every chunk does not show. Graded as the drift."""
    case, tried = _stream_case(run, check)
    lead = ("" if case == grading.FIXED_BY_SETTING else
            "; may help: look for an op that cancels (a difference of near-equal terms) or saturates in the step")
    return Finding("stream_state", grading.severity("stream_state", case),
                   f"streamed state wrong from the first chunk at precision '{run['precision']}' ({run['backend']}): "
                   f"one step from the float64 state already gives {check['value']:.2g} ({check['budget']}), "
                   "before anything is carried"
                   + ("" if any(c["metric"] == "drift_growth" and not c["passed"] for c in run["checks"]) else
                      f"; it does not grow (drift {run.get('drift_growth', float('nan')):.2f}x)"),
                   tried + lead, consequence="every chunk's state, and what the stream decides from it, carries the "
                                             "error")


def stream_recompile(run: dict) -> Finding:
    """Compiles during the stream, after warm-up: each is a compile paid mid-stream on the device. Where Dynamo's
    guard names a stride, the step hands a state part back as a view of a larger tensor (a slice of the chunk
    it read): its strides differ from the warm-up's fresh state, and Dynamo guards on strides."""
    first = (run.get("late") or [{}])[0]
    reason = first.get("reason") or "?"
    strided = "stride" in reason
    advice = ("return each state part as a fresh buffer: x[:, -n:].clone(memory_format=torch.contiguous_format) "
              "(a plain clone() keeps a view's strides), so every chunk feeds the layout the warm-up compiled"
              if strided else "warm up every chunk shape and state layout the stream feeds the step, and keep them "
                                  "the same from chunk to chunk")
    return Finding("stream_recompile", grading.severity("stream_recompile"),
                   f"{run['late_compiles']} compile(s) during the stream after warm-up ({run['backend']}), first at "
                   f"chunk {first.get('chunk', '?')}: {reason}", advice,
                   consequence="each is a compile paid in the middle of a stream on the device")


def stream_output(run: dict, check: dict) -> Finding:
    """A streamed output outside its budget (a check of streaming.output_metrics) as the target's finding, graded as
    the drift (_stream_case): the target's float32 precision tried on the same stream."""
    case, tried = _stream_case(run, check)
    return Finding("stream_output", grading.severity("stream_output", case),
                   f"streamed output '{check['output']}' at precision '{run['precision']}' ({run['backend']}): "
                   f"{check['label']} {check['value']:.4g} over the stream ({check['budget']})",
                   tried + ("" if case == grading.FIXED_BY_SETTING else ": the target's rounding, carried in the "
                            "state, changes what the stream decides"))
