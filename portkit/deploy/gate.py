"""`portkit check RUN --baseline OLD`: a regression gate for CI, from report.json and the stage results of two runs.

    >>> from portkit.deploy import gate
    >>> result = gate.compare("runs/new", "runs/old")
    >>> result.failed, print(result.summary()); gate.write_junit(result, "portkit-check.xml")

It fails (exit 1) on a new blocker, a verdict that got worse, a task metric that crossed its budget or moved below
the baseline's own 95% interval (the message names which), more compiles after warm-up, or a larger HBM need; a value
the baseline had and the new run lacks fails too (coverage lost). Run parameters that differ (batch_size, ...) are
listed. The numbers are read by portkit.runfolder.numbers, as report.json's are.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from portkit.runfolder import layout, numbers, results, run_log
from portkit.core import atomic_io
from portkit.core import checks
from portkit.core import figures
from portkit.core.errors import BadParameter

# report.json's targets.<name>.verdict, best first (docs/reference/report-json.md); "not assessed" ranks last:
# a target the baseline assessed and the new run did not is coverage lost
VERDICTS = ("ready", "ready with work", "blocked", "not assessed")
PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class Check:
    target: str
    name: str
    status: str       # PASS, FAIL or SKIP (nothing to compare in either run)
    message: str


@dataclass
class Comparison:
    run_dir: Path
    baseline: Path
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what a reader of the result must know (a self-comparison)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def summary(self, lines: int = 20) -> str:
        """One screen: a head line, the failures, then the passes, at most `lines` check lines."""
        head = (f"portkit check {self.run_dir} against {self.baseline}: {len(self.checks)} checks, "
                f"{len(self.failed)} failed -> {'FAIL' if self.failed else 'PASS'}")
        ordered = sorted(self.checks, key=lambda c: (c.status != FAIL, c.status == SKIP))
        shown = [f"  {c.status.upper():4} {c.target:7} {c.name}: {c.message}" for c in ordered[:lines]]
        more = [f"  ... {len(ordered) - lines} more in the JUnit file"] if len(ordered) > lines else []
        return "\n".join([head, *(f"  note: {n}" for n in self.notes), *shown, *more])


class _Run:
    """The parts of one run folder the gate reads, as types (runfolder.run_log, runfolder.results.load); a missing or
    skipped stage reads as None."""

    def __init__(self, folder) -> None:
        self.folder = Path(folder)
        if not (self.folder / layout.REPORT_JSON).is_file():
            raise BadParameter("run folder", str(folder), hint="no report.json; give a folder written by `portkit run`")
        self.report = run_log.read_report(self.folder)
        self.stages = {s: results.load(self.folder, s) for s in ("buckets", "xla", "accuracy", "compile")}

    def targets(self) -> list[str]:
        return list(self.report.targets)

    def target(self, name: str) -> run_log.ReportTarget:
        return self.report.targets.get(name) or run_log.ReportTarget(VERDICTS[-1], ())

    def model(self) -> tuple[str, str] | None:
        """(name, kind) of the run's model from report.json (its typed reader); None where it records none."""
        return self.report.model


def _model_words(model: tuple[str, str]) -> str:
    return f"{model[0]} ({model[1]})" if model[1] else model[0]


def compare(run_dir, baseline) -> Comparison:
    """The checks of run_dir against baseline. A baseline of another model (its report.json's model name or kind
    differs) is BadParameter: no check of one model against another means anything. A baseline that is the run
    itself passes, with a note saying so."""
    new, old = _Run(run_dir), _Run(baseline)
    if new.model() != old.model() and None not in (new.model(), old.model()):
        raise BadParameter("baseline", str(baseline), hint=f"it is a run of {_model_words(old.model())}, the new run "
                                                          f"one of {_model_words(new.model())}; give a baseline run "
                                                          "of the same model")
    result = Comparison(new.folder, old.folder)
    if new.folder.resolve() == old.folder.resolve():
        result.notes.append("the baseline is the run itself: every check compares the run with itself, so it "
                            "cannot fail; give an earlier run as --baseline")
    result.checks.extend(_parameters(new, old))
    changed = result.checks[-1]
    if changed.message.startswith("differ"):
        result.notes.append(f"the run parameters {changed.message}: the checks below compare two setups")
    for name in dict.fromkeys([*old.targets(), *new.targets()]):
        for check in CHECKS:
            result.checks.extend(check(name, new, old))
    return result


def _verdict(name: str, new: _Run, old: _Run) -> list[Check]:
    def rank(run):
        verdict = run.target(name).verdict
        return verdict, VERDICTS.index(verdict) if verdict in VERDICTS else len(VERDICTS)
    (was, before), (now, after) = rank(old), rank(new)
    status = FAIL if after > before else PASS
    return [Check(name, "verdict", status, f"{was} -> {now}" + (" (worse)" if status == FAIL else ""))]


def _blocker_key(finding: dict) -> tuple:
    # a finding's numbers (seconds, counts, line numbers) change between runs; its stage, kind and words do not
    return finding.get("stage"), finding.get("kind"), re.sub(r"\d+(\.\d+)?", "#", str(finding.get("message", "")))


def _blockers(name: str, new: _Run, old: _Run) -> list[Check]:
    def blockers(run):
        found = run.target(name).findings
        return {_blocker_key(f): f for f in found if f.get("severity") == "blocker"}
    before, after = blockers(old), blockers(new)
    fresh = [f for key, f in after.items() if key not in before]
    if not fresh:
        return [Check(name, "new blockers", PASS, f"none ({len(after)} blocker(s), all in the baseline)")]
    return [Check(name, "new blockers", FAIL, f"[{f.get('stage')}] {f.get('message')}") for f in fresh]


def _below_interval(now: dict, was: dict | None) -> bool:
    """The new value fell below the baseline's own 95% interval, in the direction its budget guards (every task
    budget is a floor, "budget >= x", or a ceiling, "budget <= x"): a move its sampling noise does not explain."""
    ci, value, budget = (was or {}).get("ci95"), now.get("value"), str(now.get("budget", ""))
    if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and isinstance(value, (int, float))):
        return False
    return value > ci[1] if "<=" in budget else value < ci[0]


def _task_metrics(name: str, new: _Run, old: _Run) -> list[Check]:
    before, after = numbers.task_checks(old.stages, name), numbers.task_checks(new.stages, name)
    out = []
    for label in dict.fromkeys([*before, *after]):
        was, now = before.get(label), after.get(label)
        if now is None:
            out.append(Check(name, f"task metric {label}", FAIL, "measured in the baseline, not in the new run"))
            continue
        out_of_budget = now.get("passed") is False
        crossed = out_of_budget and (was is None or was.get("passed") is not False)
        moved = not crossed and _below_interval(now, was)
        status = FAIL if crossed or moved else PASS
        old_text = f"{figures.sig(was.get('value'))} -> " if was else ""
        out.append(Check(name, f"task metric {label}", status,
                         f"{old_text}{figures.sig(now.get('value'))}: {_task_reason(now, was, crossed, moved)}"))
    return out


def _budget_words(now: dict) -> str:
    """'below its budget (0.999)' (a floor) or 'above its budget (0.05)' (a ceiling)."""
    budget, bound = str(now.get("budget", "")), now.get("bound")
    side = "above" if "<=" in budget else "below"
    return f"{side} its budget ({bound:g})" if isinstance(bound, (int, float)) else f"outside its {budget or 'budget'}"


def _task_reason(now: dict, was: dict | None, crossed: bool, moved: bool) -> str:
    """Why a task metric passes or fails the gate, naming the reason that holds: its budget, the baseline's 95%
    interval, or both."""
    interval = (f"outside the baseline's 95% interval [{figures.sig(was['ci95'][0])}, {figures.sig(was['ci95'][1])}]"
                if moved else "")
    if crossed:
        return f"{_budget_words(now)}, where the baseline was within it"
    if now.get("passed") is False:
        return (f"{_budget_words(now)}, as in the baseline, and {interval}" if moved
                else f"{_budget_words(now)}, as in the baseline: no regression")
    return interval or f"within its {now.get('budget') or 'budget'}"


def _parameters(new: _Run, old: _Run) -> list[Check]:
    """The run parameters that differ (layout.run_parameters: what each stage notebook was run with): listed, not
    failed, since a changed setup is the user's choice; but every other check then compares two setups."""
    before, after = layout.run_parameters(old.folder), layout.run_parameters(new.folder)
    def shown(run: dict, key: str) -> str:
        return repr(run[key]) if key in run else "the notebook's default"
    changed = [f"{k}: {shown(before, k)} -> {shown(after, k)}"
               for k in dict.fromkeys([*before, *after]) if before.get(k, DEFAULT) != after.get(k, DEFAULT)]
    if not changed:
        return [Check("run", "run parameters", PASS, "the same in both runs")]
    return [Check("run", "run parameters", PASS, "differ: " + "; ".join(changed))]


DEFAULT = object()   # a parameter one run set and the other left at the notebook's default


def _compiles_after_warmup(run: _Run, name: str) -> int | None:
    return numbers.compiles_after_warmup(run.stages, name)


def _hbm_bytes(run: _Run, name: str) -> int | None:
    return numbers.hbm_bytes(run.stages, name)


def _more(check: str, read, unit: str):
    def compare_values(name: str, new: _Run, old: _Run) -> list[Check]:
        was, now = read(old, name), read(new, name)
        if was is None and now is None:
            return [Check(name, check, SKIP, "not recorded in either run")]
        if now is None:
            return [Check(name, check, FAIL, f"{was} {unit} in the baseline, not recorded in the new run")]
        if was is None:
            return [Check(name, check, PASS, f"{now} {unit} (the baseline recorded none)")]
        status = FAIL if now > was else PASS
        return [Check(name, check, status, f"{was} -> {now} {unit}" + (" (more)" if status == FAIL else ""))]
    return compare_values


CHECKS = (_verdict, _blockers, _task_metrics,
          _more("compiles after warm-up", _compiles_after_warmup, "compile(s)"),
          _more("HBM need", _hbm_bytes, "bytes (largest compiled shape, xla.json)"))


def check_junit_path(path) -> Path:
    """The --junit FILE can be written, checked before the comparison (nothing is written): not a folder, in a
    folder that exists or can be made, where a file can be created (a probe file is made and removed: os.access
    answers yes to root everywhere, and /proc refuses all the same). BadParameter in one line otherwise."""
    what, file = "--junit file", Path(path)
    if file.is_dir():
        raise BadParameter(what, str(path), hint="it is a folder; give a file name in it, e.g. "
                                                 f"{file / 'portkit-check.xml'}")
    if file.is_symlink() and not file.exists():
        raise BadParameter(what, str(path), hint=checks.missing_path(file))
    base = next((p for p in file.absolute().parents if p.exists()), Path("/"))
    if not base.is_dir():
        raise BadParameter(what, str(path), hint=f"{base} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".portkit-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BadParameter(what, str(path), hint=f"cannot create a file in {base} ({exc.strerror})") from None
    return file


def write_junit(result: Comparison, path) -> Path:
    """The checks as JUnit XML (one testcase each, a failure element for each failed check), written atomically."""
    suite = ElementTree.Element("testsuite", name="portkit check", tests=str(len(result.checks)),
                                failures=str(len(result.failed)),
                                skipped=str(sum(c.status == SKIP for c in result.checks)))
    for c in result.checks:
        case = ElementTree.SubElement(suite, "testcase", classname=f"portkit.check.{c.target}", name=c.name)
        if c.status == FAIL:
            ElementTree.SubElement(case, "failure", message=c.message).text = c.message
        elif c.status == SKIP:
            ElementTree.SubElement(case, "skipped", message=c.message)
        else:
            ElementTree.SubElement(case, "system-out").text = c.message
    root = ElementTree.Element("testsuites")
    root.append(suite)
    text = ElementTree.tostring(root, encoding="unicode")
    return atomic_io.write_text(path, '<?xml version="1.0" encoding="UTF-8"?>\n' + text + "\n")
