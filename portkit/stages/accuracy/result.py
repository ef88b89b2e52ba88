"""Stage 4's result: per target and precision setting, what was measured, the verdict and the findings.

    >>> from portkit.stages.accuracy import stage
    >>> report = stage.check_accuracy(model, inputs, ["tpu"])         # an AccuracyReport
    >>> print(report)                  # verdict, reasons, suggestions per target
    >>> report.save("runs/minilm/accuracy.json")
    >>> report.targets["tpu"].findings()          # findings.Finding: the report's terms

A compiler that refused the model is a blocker finding (kind "compile_refused"); an output whose shape on the
target differs from the reference's is a work finding per output (kind "output_shape"), its comparison left out
while the other outputs and targets are compared. The notebook's tables and plot: tables.py; the suggestions:
advice.py; a stream's findings: stream_findings.py.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from portkit.targets.backends import compile_cause, refusal_advice
from portkit.stages.accuracy import stats
from portkit.models import padding_side
from portkit.core import grading
from portkit.core.findings import PADDING_CAUSE, Finding, cause_key
from portkit.targets.numerics import precision_cost
from portkit.runfolder.results import save_result
from portkit.core.tables import HtmlTable
from portkit.stages.accuracy.stream_findings import stream_drift, stream_output, stream_recompile, stream_state
from portkit.stages.accuracy.tables import AccuracyTables, against_baseline, baseline_role

STAGE = "accuracy"
CAST_CAUSE = "float64 run as float32"      # error_by_cause's name for the target's dtype rules alone
DETAIL = "detail (element-wise assert_close, does not decide)"


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
        """The judged output's decision: its task metrics' on their sample (stats.py: a check whose 95% interval
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
        return self._metric_reasons()

    def _metric_reasons(self, left_out: tuple[str, ...] = ()) -> list[str]:
        """metric_reasons but those of the buckets in `left_out` (paths, "bucket N")."""
        first = (self.chosen.layers or {}).get("first_failing")
        where = f"; the error enters at `{first['module']}` ({first['type']}), the first module out of " \
            "tolerance" if first else ""
        buckets = [(b, [r for r in b["reasons"] if r not in b.get("shape_reasons", [])]) for b in self._checked()
                   if f"bucket {b['boundary']}" not in left_out]
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
            entry = self._try(other.name, path)
            if entry is not None:
                out[path] = entry["passed"]
            elif path == MAIN_BATCH and other.target_side == self.chosen.target_side:
                main_ok = main_path(self.chosen) != MAIN_BATCH or other.main_decision != stats.FAIL
                out[path] = main_ok and not any(t["decision"] == stats.FAIL for t in other.output_tasks.values())
        return out

    def judged_on(self, other: PrecisionResult, paths: list[str]) -> tuple[dict[str, bool], list[str]]:
        """Whether `other` passed on each of `paths` it was run on (tried_on), and the bucket paths it was judged on
        unpadded: a bucket whose texts fail at their own length at the chosen precision, where `other` was run on
        them unpadded too. There its unpadded run answers the precision's question; its padded run, where it
        fails while the unpadded one passes, is padding's (the padding finding, _padding)."""
        on = {p: ok for p, ok in self.tried_on(other).items() if p in paths}
        unpadded = []
        for path in paths:
            mine = self._try(self.chosen.name, path, unpadded=True)
            theirs = self._try(other.name, path, unpadded=True)
            if mine is not None and not mine["passed"] and theirs is not None:
                on[path] = theirs["passed"]
                unpadded.append(path)
        return on, unpadded

    def _try(self, precision: str, path: str, unpadded: bool = False) -> dict | None:
        """The stage's run of `precision` on `path` (`tried`): padded to the bucket on the tokenizer's side, or
        (`unpadded`) on the bucket's texts at their own length; None where it made none."""
        return next((t for t in self.tried if t["precision"] == precision and t["path"] == path
                     and bool(t.get("unpadded")) == unpadded and not t.get("padding_side")), None)

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
        padding = [(self.chosen.name, padded_only)] if padded_only else []
        paths = [p for p in self.failing_paths() if p not in padded_only]
        if not paths:
            return found + ([self._padding(padding)] if padding else [])
        # the paths padding alone explains are the padding finding's: a precision is tried against the others only
        judged = {r.name: (r, *self.judged_on(r, paths)) for r in self.others}
        fixing = [r for r, on, _ in judged.values() if set(on) == set(paths) and all(on.values())]
        case = grading.FIXED_BY_SETTING if fixing else grading.NOT_FIXED
        if fixing:
            _, _, unpadded = judged[fixing[0].name]
            advice = (f"set {fixing[0].precision['setting']}: tried: precision '{fixing[0].name}' passes on "
                      f"{', '.join(_own_length(p, unpadded) for p in paths)}")
            # a bucket's second cause: at the precision that fixes its texts, it still fails padded
            still = [p for p in unpadded if not (self._try(fixing[0].name, p) or {}).get("passed")]
            padding += [(fixing[0].name, still)] if still else []
        else:
            advice = self._not_fixed_advice(paths, judged)
        return found + ([self._padding(padding)] if padding else []) + [
            Finding("accuracy", grading.severity("accuracy", case),
                    f"precision '{self.chosen.name}' ({self.chosen.target_side}): "
                    f"{'; '.join(self._metric_reasons(tuple(padded_only)))[:400]}", advice,
                    cause=cause_key("accuracy", "task metric outside its budget"),
                    occurrences={"paths": paths, "count": len(paths)})]

    def padded_only(self) -> list[str]:
        """The failing buckets whose texts pass at their own length (tried unpadded, same side and precision): they
        fail only padded, so padding is their cause, not the target's numerics."""
        return [t["path"] for t in self.tried
                if t.get("unpadded") and t["passed"] and t["precision"] == self.chosen.name]

    def _padding(self, groups: list[tuple[str, list[str]]]) -> Finding:
        """Buckets that fail padded and pass at the texts' own length, each group at one precision: the chosen one
        (padding alone is their cause), then the one that fixes the numerics of buckets whose texts fail at the
        chosen one too (padding is their second cause). The grading policy's "padding" (work), the cause stage 3's
        padding check names too (findings.PADDING_CAUSE), so the report counts it once."""
        paths = [p for _, group in groups for p in group]
        said = "; ".join(f"precision '{name}' ({self.chosen.target_side}): {', '.join(group)} fail(s) padded to the "
                         "bucket, and pass at the texts' own length (tried)" for name, group in groups)
        # the other padding side was tried on the chosen precision's group only (target_check._try_other_side)
        mine = [p for name, group in groups if name == self.chosen.name for p in group]
        advice = padding_side.advice(self.tried, mine, "at the same precision") if mine else padding_side.EXACT
        later = [f"{', '.join(group)} (at precision '{name}')" for name, group in groups if name != self.chosen.name]
        if later and advice != padding_side.EXACT:
            advice += f"; the other padding side not tried on {'; '.join(later)}"
        return Finding("padding", grading.severity("padding"),
                       f"{said}: padding changes the outputs at real positions", advice,
                       cause=PADDING_CAUSE, occurrences={"paths": paths, "count": len(paths)})

    def _not_fixed_advice(self, paths: list[str], judged: dict) -> str:
        """What portkit tried that still fails (each precision and where, a bucket judged at its texts' own length
        said so), then what it did not try, as leads."""
        still = [f"precision '{r.name}' on {', '.join(_own_length(p, unpadded) for p, ok in on.items() if not ok)}"
                 for r, on, unpadded in judged.values() if not all(on.values())]
        untried = [f"precision '{r.name}' on {', '.join(p for p in paths if p not in on)}"
                   for r, on, _ in judged.values() if all(on.values()) and set(on) != set(paths)]
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
                       refusal_advice(refused["message"], refused.get("place"), "the main batch's fixed shape")
                       + f" (stage 2 names the same cause); the numerics were judged in {self.chosen.target_side} "
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
class AccuracyReport(AccuracyTables):
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
        runs = [r for r in (self.stream.runs if self.stream is not None else []) if r.target == name]
        return [stream_drift(r) if c["metric"] == "drift_growth" else stream_state(r, c)
                if c["metric"] == "state_error" else stream_output(r, c)
                for r in runs for c in r.checks if not c["passed"]] + \
            [stream_recompile(r) for r in runs if r.late_compiles]

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


def _own_length(path: str, unpadded: list[str]) -> str:
    """A path as tried: a bucket judged on its texts at their own length says so."""
    return f"{path} (at its texts' own length)" if path in unpadded else path
