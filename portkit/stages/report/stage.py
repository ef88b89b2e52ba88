"""Stage 5, the migration report: a verdict per target, side by side, with the work it takes.

    >>> from portkit.stages.report import stage
    >>> r = stage.build_report(run_dir="runs/minilm")   # reads the stage results already in the folder
    >>> r.verdicts()                                  # {'neuron': 'ready with work', 'tpu': 'ready'}
    >>> r.save("runs/minilm")                         # report.html (self-contained) and report.json

`portkit report DIR` does the same from the command line, without rerunning any stage, on any machine:
each target's mode and the environment come from the stage results, which recorded them when they ran
(portkit/runfolder/results.py); only a run folder written before that is described by this machine, and says so.
A stage result that is missing, unreadable or of the wrong shape becomes a named gap, never a traceback; a folder
with no stage result at all is bad input (BadParameter). The HTML is a Jinja2 template (templates/report.html.j2)
with autoescape on, so no value reaches the page unescaped.

report.json's keys are stable (a CI job can gate on them); each is documented in docs/reference/report-json.md:
"schema" ("portkit.report/1"), "created", "run_dir", "model", "environment", "environment_source", "stages"
({stage: {"file", "status", "problem", "summary"}}), "gaps", "verdicts" ({name: verdict}, for a script), "cost"
(per million requests on each target and on named GPUs: an estimate, portkit.planning.cost) and "targets" ({name:
{"mode", "verdict", "numbers" (the stages' numbers, runfolder.numbers), "findings", "checklist", "metrics", ...}}).
"""
from __future__ import annotations

import copy
import datetime
import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import jinja2

from portkit.models import seq2seq
from portkit.planning import cost
from portkit.runfolder import environment, numbers, run_log
from portkit.core import assessed, figures, grading, memory
from portkit.stages import reconcile
from portkit.stages import options
from portkit.stages.report import sections
from portkit.stages.report import wording
from portkit.runfolder import results
from portkit.runfolder import layout
from portkit.targets import specs
from portkit.core.atomic_io import write_json, write_text
from portkit.core.errors import BadParameter
from portkit.core.findings import BLOCKER, INFO, NOT_CHECKED, PERSISTS, SEVERITIES, VANISHES, WORK, cause_of

SCHEMA = "portkit.report/1"
STAGE = "report"
READY, READY_WITH_WORK, BLOCKED, NOT_ASSESSED = grading.READY, grading.READY_WITH_WORK, grading.BLOCKED, \
    grading.NOT_ASSESSED
VERDICT_COLORS = {READY: "#2e7d32", READY_WITH_WORK: "#b26a00", BLOCKED: "#c62828", NOT_ASSESSED: "#616161"}
FIRST_ROWS = 5   # findings the report opens with, per target, most consequential first


class Options(options.StageOptions):
    """Stage 5's options: notebooks/05_report.py declares only the shared model, targets and run folder."""
    NOTEBOOK = "05_report.ipynb"
    CHECKS = {}


def _stages():
    return [s for s in layout.STAGES if s.name != STAGE]


DAMAGED = ("unreadable", "incomplete")   # a stage result there that cannot be read whole: the report exits 1


@dataclass
class StageResult:
    name: str
    file: str
    notebook: str
    status: str                 # ok, skipped (problem: why), missing, failed, unreadable, incomplete
    problem: str = ""
    result: object = None       # the stage's typed result (portkit.runfolder.results.TYPED) where status is ok
    run: run_log.StageRun | None = None    # how the latest run recorded it (time, peak memory); None: not recorded

    def to_dict(self) -> dict:
        return {"file": self.file, "notebook": self.notebook, "status": self.status, "problem": self.problem,
                "summary": self.summary, "seconds": self.run.seconds if self.run else None,
                "peak_memory_bytes": self.run.peak_memory_bytes if self.run else None}

    def time_and_memory(self) -> tuple[str, str]:
        """The stage's wall time and its kernel's peak memory in the latest run, for the report's stage table."""
        if self.run is None:
            return "—", "—"
        return (f"{self.run.seconds:,.0f} s" if self.run.seconds is not None else "—",
                memory.gib(self.run.peak_memory_bytes))

    @property
    def summary(self) -> str | None:
        return None if self.result is None else self.result.summary

    def flag(self, problem: str) -> None:
        """Part of a readable result could not be read: the stage is incomplete, the problem (naming the file) a
        gap."""
        self.status = "incomplete"
        self.problem = "; ".join(filter(None, [self.problem, problem]))


def _why(exc: BaseException) -> str:
    """An exception as a short single line, for a gap."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


def read_stage(run_dir: Path, stage, log=None) -> StageResult:
    """Stage `stage`'s result in `run_dir`, read as its type; `log` is the run log (run_log.RunLog, None where no
    run wrote one): a missing result the log records as failed names the failure, one it records as ok is damage
    (the file went after the run), and one it does not record was never made."""
    path = run_dir / stage.result
    entry = log.stages.get(stage.name) if log is not None else None
    if not path.exists():
        if entry is not None and entry.status in ("failed", layout.INTERRUPTED):   # the latest run's log says why
            return StageResult(stage.name, stage.result, stage.notebook, "failed",
                               f"stage {stage.name} failed in the latest run: {entry.error or entry.status}")
        if entry is not None and entry.status == "ok":
            return StageResult(stage.name, stage.result, stage.notebook, "unreadable",
                               f"{stage.result} is missing, but {layout.RUN_LOG} records stage {stage.name} as ok "
                               f"in the latest run: the file was removed or lost; rerun stage {stage.name}")
        return StageResult(stage.name, stage.result, stage.notebook, "missing", f"{stage.result} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return StageResult(stage.name, stage.result, stage.notebook, "unreadable",
                           f"{stage.result} cannot be read ({_why(exc)})")
    if not isinstance(data, dict):
        return StageResult(stage.name, stage.result, stage.notebook, "incomplete",
                           f"{stage.result} holds a JSON {type(data).__name__}, not an object")
    if isinstance(data.get(results.SKIPPED), str):   # the stage does not apply to the model: not a gap
        return StageResult(stage.name, stage.result, stage.notebook, "skipped", data[results.SKIPPED])
    if not isinstance(data.get("targets"), dict):
        return StageResult(stage.name, stage.result, stage.notebook, "incomplete",
                           f"{stage.result} has no per-target results (no \"targets\" object)")
    try:
        typed = results.typed(stage.name, data, path)
    except results.UnreadableResult as exc:
        return StageResult(stage.name, stage.result, stage.notebook, "incomplete", str(exc))
    return StageResult(stage.name, stage.result, stage.notebook, "ok", result=typed)


def _run_log(run_dir: Path):
    """(the run log, "") or (None, why it cannot be read): a damaged run.json is a gap, never a silent empty log."""
    try:
        return run_log.read(run_dir), ""
    except results.UnreadableResult as exc:
        return None, str(exc)


# ---------------------------------------------------------------- per-stage readers


# ---------------------------------------------------------------- the report
@dataclass
class TargetReport:
    name: str
    title: str
    mode: str
    findings: list[dict] = field(default_factory=list)
    metrics: dict[str, dict] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)
    rewrite: list[str] = field(default_factory=list)
    buckets: dict | None = None
    precision: dict | None = None
    compiler_flags: str = ""
    based_on: list[str] = field(default_factory=list)
    measure_on_hardware: list[str] = field(default_factory=list)
    details: dict[str, list[dict]] = field(default_factory=dict)
    vanished_ops: set = field(default_factory=set)   # ops of eager findings that vanish under compile
    training: dict | None = None      # the training verdict (accuracy.json's "training"), beside the inference one
    # the stages that could find a blocker and did not assess this target (not run, failed, unreadable, or their
    # result holds no readable half for it): with no blocker found, the target is not assessed, never ready
    unassessed: list[str] = field(default_factory=list)
    # the questions a stage read for this target left open ({"stage", "question", "why"}: core.assessed); each is
    # also in `unassessed` as "stage: question"
    open_questions: list[dict] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)       # the stages' numbers for this target (runfolder.numbers.of)

    def training_reason(self) -> str:
        return "; ".join((t := self.training or {}).get("blockers", []) + t.get("work", [])) or t.get("numerics", "")

    @property
    def verdict(self) -> str:
        # the grading policy's rule (core.grading.verdict): a stage that read nothing for the target is an open
        # question as much as one a stage named
        opened = self.unassessed if self.based_on else [*self.unassessed, "no stage result holds this target"]
        return grading.verdict((f["severity"] for f in self.findings), opened)

    def verdict_reason(self) -> str:
        if not self.based_on:
            return "no stage result holds this target"
        blockers, work = ([f for f in self.findings if f["severity"] == s] for s in (BLOCKER, WORK))
        if blockers:
            return f"{len(blockers)} blocker(s), first: {wording.headline(blockers[0])}"
        found = (f"{len(work)} item(s) of work, first: {wording.headline(work[0])}" if work
                 else "no work found")
        if self.unassessed:
            questions = {f"{q['stage']}: {q['question']}" for q in self.open_questions}
            stages = [s for s in self.unassessed if s not in questions]
            missed = (f"stage(s) {', '.join(stages)} did not assess {self.name} (see the gaps), so a blocker may be "
                      "missed" if stages else "")
            asked = "; ".join(f"{q['stage']}: {q['question']} not assessed ({q['why']})" for q in self.open_questions)
            return (f"{'; '.join(filter(None, [missed, asked]))}; based on {', '.join(self.based_on)}: no blockers, "
                    f"{found}")
        return f"no blockers; {found}" if work else "no blockers and no work found in the stages read"

    def first(self) -> list[dict]:
        """The findings that matter first: blockers, then work, most consequential first."""
        return [f for f in self.findings if f["severity"] != INFO][:FIRST_ROWS]

    @property
    def vanished(self) -> str | None:
        return reconcile.vanished_line(self.findings)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "title": self.title, "verdict": self.verdict,
                "verdict_reason": self.verdict_reason(), "based_on": self.based_on, "unassessed": self.unassessed,
                "open_questions": self.open_questions,
                "training": self.training, "numbers": self.numbers,
                "first": self.first(), "vanished": self.vanished, "precision": self.precision,
                "compiler_flags": self.compiler_flags, "findings": self.findings, "metrics": self.metrics,
                "checklist": {"kernels": sorted(self.kernels, key=lambda k: -k["time_share"]),
                              "rewrite": self.rewrite, "buckets": self.buckets, "precision": self.precision,
                              "measure_on_hardware": self.measure_on_hardware},
                "details": self.details}


@dataclass
class MigrationReport:
    run_dir: Path
    model: dict
    stages: dict[str, StageResult]
    targets: dict[str, TargetReport]
    environment: dict                  # the run's, as its stages recorded it (results.run_environment)
    images: list[tuple[str, str]]      # (caption, base64 PNG) taken from the executed notebooks
    environment_source: str = results.NOT_RECORDED
    other_gaps: list[str] = field(default_factory=list)   # environment and notebooks; stage gaps live in stages
    log_problem: str = ""              # why the run log (run.json) cannot be read; "" where it can or is absent
    cost: dict | None = None           # planning.cost.comparison of the run's stage 3 and 3b results
    created: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))

    @property
    def gaps(self) -> list[str]:
        return ([s.problem for s in self.stages.values() if s.status not in ("ok", "skipped")]
                + ([self.log_problem] if self.log_problem else []) + self.other_gaps)

    def damaged(self) -> list[str]:
        """The files of the run folder that are there (or should be) and cannot be read whole: stage results
        (DAMAGED), and the run log."""
        return ([s.file for s in self.stages.values() if s.status in DAMAGED]
                + ([layout.RUN_LOG] if self.log_problem else []))

    def verdicts(self) -> dict[str, str]:
        return {n: t.verdict for n, t in self.targets.items()}

    def summary(self) -> str:
        parts = [f"{n} ({t.mode}): {t.verdict}" for n, t in self.targets.items()]
        if self.gaps:
            parts.append(f"{len(self.gaps)} gap(s) in the stage results")
        return "; ".join(parts) or "no target results found"

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "stage": STAGE, "created": self.created, "run_dir": str(self.run_dir),
                "model": self.model, "summary": self.summary(), "environment": self.environment,
                "environment_source": self.environment_source,
                "stages": {n: s.to_dict() for n, s in self.stages.items()}, "gaps": self.gaps,
                "verdicts": self.verdicts(), "cost": self.cost,
                "targets": {n: t.to_dict() for n, t in self.targets.items()}}

    def save(self, folder=None) -> Path:
        """Write report.html and report.json as a pair: both under partial names first, then renamed, the HTML
        first and the JSON last, so a reader that finds report.json finds its report.html (runfolder.read_report
        treats a JSON without its HTML as an interrupted save); a kill leaves only partial names behind."""
        import os
        from portkit.core.atomic_io import partial_path
        folder = Path(folder or self.run_dir)
        html, data = folder / layout.REPORT_HTML, folder / layout.REPORT_JSON
        html_partial = write_text(partial_path(html), self.html())
        json_partial = write_json(partial_path(data), self.to_dict())
        os.replace(html_partial, html)
        os.replace(json_partial, data)
        return html

    def __str__(self) -> str:
        lines = [f"Migration report for {self.model.get('name', '?')}: {self.summary()}"]
        for gap in self.gaps:
            lines.append(f"  gap: {gap}")
        for name, t in self.targets.items():
            lines.append(f"  {name} ({t.mode}): {t.verdict.upper()} — {t.verdict_reason()}")
            lines += [f"    [{f['severity']}] {f['message']} — {f['consequence']}" for f in t.first()]
            if t.vanished:
                lines.append(f"    {t.vanished}")
            if t.training:
                lines.append(f"  {name} training: {t.training['verdict'].upper()} — {t.training_reason()}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return _render(self, standalone=False)

    def html(self) -> str:
        return _render(self, standalone=True)


def build_report(targets=None, *, run_dir) -> MigrationReport:
    """Read every stage result in the run folder `run_dir` and assemble the report for `targets` (None: every
    target a stage result names); unreadable parts become gaps. The stages' shape without a model or options: the
    model is the one the results describe, and the notebook declares no parameter beyond the shared three."""
    run_dir, target_names = Path(run_dir), targets
    log, log_problem = _run_log(run_dir)
    stages = {s.name: replace(read_stage(run_dir, s, log), run=log.stages.get(s.name) if log else None)
              for s in _stages()}
    if all(s.status == "missing" for s in stages.values()):
        raise BadParameter("run folder", str(run_dir), hint="it holds no stage result ("
                           + ", ".join(s.file for s in stages.values()) + "); give one written by `portkit run`")
    present = [s for s in stages.values() if s.status == "ok"]
    names = list(target_names or dict.fromkeys(n for s in present for n in s.result.names))
    model = next((s.result.model for s in present if s.result.model is not None), {})
    run_env = results.run_environment({s.file: s.result.stamp() for s in present}, names)
    assessing = [s.name for s in stages.values() if s.status != "skipped"]   # a skipped stage does not apply
    asked = _model_questions(model)
    reports = {name: _target_report(name, present, run_env.info["targets"].get(name, {}), assessing,
                                    seq2seq.after_generation(asked, _decoded(present, name), _served(present, name)))
               for name in names}
    typed = {s.name: s.result for s in present}
    for name, report in reports.items():
        report.numbers = numbers.of(typed, name)
    images, notebook_gaps = layout.notebook_images(run_dir, [s.name for s in stages.values()])
    return MigrationReport(run_dir, model, stages, reports, run_env.info, images, run_env.source,
                           run_env.gaps + notebook_gaps, log_problem=log_problem, cost=_cost(typed, names))


def _cost(typed: dict, names: list[str]) -> dict | None:
    """The cost per million requests where stage 3 planned buckets (None otherwise): an estimate."""
    if typed.get("buckets") is None:
        return None
    return cost.comparison(results.cost_figures(typed["buckets"], typed.get("xla"), typed.get("accuracy"),
                                                typed.get("compile")), names)


def _decoded(present: list[StageResult], name: str) -> bool:
    """Whether stage 2 generated token by token on target `name` (workload generate, with either cache)."""
    compiled = next((s.result.targets.get(name) for s in present if s.name == "compile"), None)
    found = getattr(compiled, "generation", None) or {}
    return bool(found.get("dynamic") or found.get("static"))


def _served(present: list[StageResult], name: str) -> bool:
    """Whether an encoder-decoder's serving buckets are planned for target `name`: stage 3's source buckets and
    decoder context, or, for an encoder taking one source shape (stage 3 has nothing to bucket), the one window and
    decoder context stage 2's static cache compiled."""
    planned = next((s.result for s in present if s.name == "buckets"), None)
    if planned is not None and name in planned.generation:
        return True
    compiled = next((s.result.targets.get(name) for s in present if s.name == "compile"), None)
    decoded = compiled.encoder_decoder_plan if compiled is not None else None
    return bool(decoded and decoded[2])


def _model_questions(model: dict) -> list[dict]:
    """What no stage answers for the model, open for every target (its describe()'s not_assessed: an
    encoder-decoder's autoregressive decoding, portkit.models.seq2seq), as open questions of "model"."""
    try:
        return [{"stage": "model", **q} for q in assessed.read(model)]
    except (KeyError, TypeError, ValueError) as exc:
        return [{"stage": "model", "question": f"the model's {assessed.KEY}", "why": f"unreadable ({exc})"}]


def _target_report(name: str, present: list[StageResult], recorded: dict, assessing: list[str],
                   model_questions=()) -> TargetReport:
    """One target's report from the readable stage results; `recorded` is its run-time environment, `assessing`
    the stages that apply to the model (each must have read this target for a verdict of ready), `model_questions`
    what no stage answers for the model (_model_questions)."""
    title = specs.get(name).title if name in specs.TARGETS else name
    tr = TargetReport(name, title, recorded.get("mode", "unknown"), compiler_flags=str(recorded.get("precision", "")))
    # stage 2's graph breaks, where its result could be read: without them stage 1's findings are not checked
    # against the compiled graphs, and are kept (damage in one stage never removes what another found)
    compiled = next((s.result.reconcilable for s in present if s.name == "compile"), None)
    for stage in present:
        if name in stage.result.damaged:      # this target's part cannot be read: the stage did not assess it
            stage.flag(stage.result.damaged[name])
            continue
        t = stage.result.targets.get(name)
        if t is None:
            continue
        # read into a copy: a result of the wrong shape leaves nothing half-read in the report
        scratch = copy.deepcopy(tr)
        try:
            _read_target(stage, t, scratch, compiled)
        except (ArithmeticError, AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            stage.flag(f"{stage.file}: targets.{name} cannot be read ({_why(exc)})")
        else:
            tr = scratch
    tr.open_questions = [*model_questions, *tr.open_questions]
    tr.unassessed = [s for s in assessing if s not in tr.based_on]
    tr.unassessed += [f"{q['stage']}: {q['question']}" for q in tr.open_questions]
    bucketed = next((s.result.targets.get(name) for s in present if s.name == "buckets"), None)
    sections.resolve_storm(tr.findings, bucketed)
    tr.findings = merge_causes(tr.findings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    # by consequence: severity, then what persists under compile before what was not checked or vanishes
    later = {PERSISTS: 0, "": 0, NOT_CHECKED: 1, VANISHES: 2}
    tr.findings.sort(key=lambda f: (order.get(f["severity"], 9), later.get(f["compiled"], 1)))
    return tr


def merge_causes(found: list[dict]) -> list[dict]:
    """One target's findings, one per cause (core.findings.cause_of): what stages 2, 3 and 4 found of one cause
    (one refusal of the compiler) is one finding, graded the most severe of theirs (core.findings.SEVERITIES),
    with every stage's evidence under it ("evidence": stage, severity, message) and its stages listed."""
    order = {s: i for i, s in enumerate(SEVERITIES)}
    merged: dict[str, dict] = {}
    for f in found:
        evidence = {"stage": f["stage"], "severity": f["severity"], "message": f["message"], "where": f["where"]}
        into = merged.get(f["cause"])
        if into is None:
            merged[f["cause"]] = {**f, "evidence": [evidence]}
            continue
        into["evidence"].append(evidence)
        into["stages"] = list(dict.fromkeys([*into["stages"], f["stage"]]))
        if order.get(f["severity"], 9) < order.get(into["severity"], 9):
            into.update({k: f[k] for k in ("severity", "message", "advice", "consequence", "where", "owner")})
    for f in merged.values():
        if len(f["stages"]) > 1:
            f["message"] += f" (found by stages {', '.join(f['stages'])})"
    return list(merged.values())


def _inner(finding: dict, key: str, inner: str) -> str:
    """finding[key][inner] as text ("" where absent); the readers checked that finding[key] is an object."""
    found = finding.get(key)
    return str(found.get(inner, "")) if isinstance(found, dict) else ""


def _read_target(stage: StageResult, t, tr: TargetReport, compiled: dict | None = None) -> None:
    """Add stage `stage`'s typed part for one target (`t`, reading.TargetPart) to its TargetReport."""
    tr.based_on.append(stage.name)
    tr.open_questions += [{"stage": stage.name, **q} for q in t.not_assessed]   # what it could not assess
    if tr.mode == "emulated":
        tr.measure_on_hardware.append(f"{stage.name}: {t.summary or 'emulated on the CPU'}")
    findings = list(t.findings)
    if stage.name == sections.STAGE_FALLBACKS:   # eager findings, each against the compiled graphs
        findings = reconcile.reconcile(findings, compiled, tr.name)
        tr.vanished_ops |= {op for f in findings if f["compiled"] == VANISHES for op in f.get("ops") or ()}
    for f in findings:
        tr.findings.append({"stage": stage.name, "notebook": stage.notebook,
                            **{k: str(f.get(k, "")) for k in ("severity", "kind", "message", "advice")},
                            "eager": str(f.get("eager_severity", "")), "compiled": str(f.get("compiled", "")),
                            "compiled_detail": str(f.get("compiled_detail", "")),
                            "owner": _inner(f, "owner", "owner"), "where": _inner(f, "where", "text"),
                            "resolved_by": "", "consequence": str(f.get("consequence") or _consequence(f)),
                            "cause": cause_of(f), "stages": [stage.name]})
    if stage.name in sections.READERS:
        sections.READERS[stage.name](stage.result, t, tr)


def _consequence(f: dict) -> str:
    """The consequence of a finding that no reconciliation phrased (stages 2 to 4): its severity's meaning."""
    return {BLOCKER: "blocker: cannot run or compile on the target as it is",
            WORK: "work: runs, with the cost named in the finding", INFO: "info: noted, no cost found"}.get(
        f.get("severity"), "")


# ---------------------------------------------------------------- HTML
@functools.cache
def _template() -> jinja2.Template:
    loader = jinja2.PackageLoader("portkit.stages.report", "templates")
    env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2")


COST_COLUMNS = ("side", "chip", "positions a request", "chip-s per million requests (roofline)", "bound",
                "$ per million (estimate)", "calibrated range (never below the roofline's)", "price per chip-hour",
                "price source", "method")


def _cost_sides(found: dict | None) -> list[tuple[str, dict]]:
    """The comparison's sides in order: each target by name, then each named GPU as "GPU <name>"."""
    if found is None:
        return []
    return [*found["targets"].items(), *((f"GPU {g}", e) for g, e in found["gpus"].items())]


def cost_plot(found: dict | None) -> str | None:
    """The cost comparison as a bar chart (base64 PNG): dollars per million requests on each target and each
    named GPU with a price, the bar at the estimate and its whisker over the calibrated range; a log
    scale, since the sides differ by orders of magnitude. None where nothing is priced."""
    import base64
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sides = [(f"{side} ({est['chip']})" if not side.startswith("GPU ") else side, est["usd_per_million_requests"])
             for side, est in _cost_sides(found) if est.get("usd_per_million_requests")]
    if not sides:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(sides) + 1.2))
    names, usd = [s for s, _ in sides], [u["estimate"] for _, u in sides]
    low = [u["estimate"] - u["low"] for _, u in sides]
    high = [u["high"] - u["estimate"] for _, u in sides]
    colors = ["#1565c0" if not n.startswith("GPU ") else "#9e9e9e" for n in names]
    ax.barh(names, usd, xerr=[low, high], color=colors, capsize=3)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("$ per million requests (estimate; whiskers: the calibrated range, never below the roofline)")
    ax.set_title("Cost per million requests: each target beside today's GPUs", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _cost_rows(found: dict | None) -> list[list]:
    """The cost comparison's rows: each target, then each named GPU (planning.cost.comparison)."""
    rows = []
    for side, est in _cost_sides(found):
        if "chip_seconds_per_million_requests" not in est:
            rows.append([side, "—", "—", "—", "—", est.get("problem", "—"), "—", "—", "—", "—"])
            continue
        usd, price = est.get("usd_per_million_requests"), est.get("price")
        rows.append([side, est["chip"], f"{est['positions_per_request']:.1f}",
                     f"{est['chip_seconds_per_million_requests']:.3g}",
                     f"{est['roofline']['bound']} at {est['roofline']['precision']}, batch {est['batch']}",
                     f"${usd['estimate']:.3g}" if usd else est.get("problem", "—"),
                     f"${usd['low']:.3g} to ${usd['high']:.3g} (roofline ${usd['bound']:.3g}; "
                     f"{est['calibration']['note']})" if usd else "—",
                     f"${price['usd_per_chip_hour']:.3g}" if price else "—",
                     f"{price.get('source', '—')} ({price.get('date', '?')}; {price.get('supplied_by', '?')})"
                     if price else "—", est["method"]])
    return rows


def _render(r: MigrationReport, standalone: bool) -> str:
    """The report as HTML: a whole page, or the body alone for the notebook."""
    names = list(r.targets)
    labels = list(dict.fromkeys((stage, label) for t in r.targets.values()
                                for stage, metrics in t.metrics.items() for label in metrics))
    side_by_side = [[stage, label, *[figures.sig(r.targets[n].metrics.get(stage, {}).get(label, "—"))
                                     for n in names]] for stage, label in labels]
    details = []
    for table in dict.fromkeys(k for t in r.targets.values() for k in t.details):
        rows = [{"target": n, **row} for n, t in r.targets.items() for row in t.details.get(table, [])]
        columns = list(dict.fromkeys(c for row in rows for c in row))
        details.append((table, columns, [["—" if row.get(c) is None else figures.sig(row[c]) for c in columns]
                                         for row in rows]))
    return _template().render(
        r=r, standalone=standalone, names=names, side_by_side=side_by_side, details=details,
        headline=wording.headline, detail=wording.detail,
        cost_rows=_cost_rows(r.cost), cost_columns=list(COST_COLUMNS), cost_png=cost_plot(r.cost),
        emulated=[n for n, t in r.targets.items() if t.mode != "native"], colors=VERDICT_COLORS,
        environment_text=environment.render(r.environment),
        kernel_rows={n: [[k["op"], k["status"], f"{k['time_share']:.1%}", k["calls"], ", ".join(k["modules"]),
                          k["language"]] for k in sorted(t.kernels, key=lambda k: -k["time_share"])]
                     for n, t in r.targets.items()},
        stage_rows=[[n, s.file, s.status if s.status == "ok" else f"{s.status}: {s.problem}", *s.time_and_memory(),
                     s.summary if s.result is not None else ""] for n, s in r.stages.items()])
