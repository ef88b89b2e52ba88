"""The rules every run's verdict must keep, checked by the zoo on each row's run folder: functions over the JSON
the stages wrote (report.json, run.json, fallbacks.json, compile.json, buckets.json, xla.json, accuracy.json)
and the model's config.json. A violation is a row's failure, like a stage crash.

    >>> from benchmarks import zoo_rules
    >>> run = zoo_rules.Run.read("runs/zoo/gpt2.causal-lm/neuron", config={"max_position_embeddings": 128})
    >>> [v.line() for v in zoo_rules.check(run)]        # [] when every rule holds
    []

The rules (RULES): no stage ends "ok" having assessed nothing; every op outside PyTorch's own namespaces in a
compiled graph has a finding (portkit.targets.foreign_ops decides which those are); no cause is counted twice;
no portkit cap is called the model's maximum; every verdict follows the written grading policy
(portkit.stages.report: a blocker found is "blocked", a target some stage did not assess is "not assessed", work
is "ready with work", else "ready"); no finding is attributed to the user from portkit's own files. Each reads
only what the stages write today; a file a rule needs that is absent (a stage not run) is no violation of that
rule, a stage's failure being the crash the zoo counts apart.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core import grading
from portkit.runfolder import layout
from portkit.stages.xla.stage import CONVERTED    # 3b's statuses of a shape its conversion stopped before the compiler
from portkit.stages.report.stage import BLOCKER, READY, READY_WITH_WORK, WORK

OK, SKIPPED = "ok", "skipped"
# where a finding's source frame lies inside portkit's own package (the report shortens paths: "portkit/...")
PORTKIT_FILE = re.compile(r"(?:^|[/\s])portkit/[\w/]+\.py")
# a truncation finding's cap, as stage 3 words it: "longer than 512 tokens (the model's maximum)"
MODEL_MAXIMUM = re.compile(r"(\d[\d,]*) (?:tokens|frames|samples)? ?\(the model's maximum\)")
# the config keys a model's own position limit is written under (transformers' configs)
LIMIT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length",
              "n_ctx", "max_source_positions")


@dataclass(frozen=True)
class Violation:
    rule: str
    target: str         # "" for the run as a whole
    detail: str

    def line(self) -> str:
        return f"{self.rule}{f' ({self.target})' if self.target else ''}: {self.detail}"


@dataclass
class Run:
    """A run folder's JSON, read once: {stage or "report" or "run": the parsed file, or None where absent}."""
    path: Path
    files: dict = field(default_factory=dict)
    config: dict | None = None      # the model's config.json, where the zoo knows it

    @classmethod
    def read(cls, path, config: dict | None = None) -> "Run":
        path = Path(path)
        files = {}
        for name in (*layout.STAGE_NAMES, "run"):
            file = path / (layout.RUN_LOG if name == "run" else layout.result_file(name))
            try:
                files[name] = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                files[name] = None
        return cls(path, files, config)

    def get(self, name: str) -> dict:
        return self.files.get(name) or {}

    def status(self, stage: str) -> str:
        report = self.get("report").get("stages", {}).get(stage) or self.get("run").get("stages", {}).get(stage)
        return (report or {}).get("status", "missing")

    def error(self, stage: str) -> str:
        """The error a failed stage was recorded with in the run log ("failed" where it names none)."""
        return ((self.get("run").get("stages") or {}).get(stage) or {}).get("error") or "failed"

    def targets(self) -> list[str]:
        return list(self.get("report").get("targets", {}))


# ---------------------------------------------------------------- 1. "ok" means something was assessed
def _assessed(stage: str, data: dict) -> list[tuple[str, str]]:
    """(target, what is missing) for each target of an "ok" stage result that assessed nothing for it."""
    empty = []
    for target, half in (data.get("targets") or {}).items():
        half = half or {}
        if stage == "fallbacks" and not sum((half.get("counts") or {}).values()):
            empty.append((target, "no op recorded (every count is 0)"))
        elif stage == "compile" and "checks" in half and not (half.get("checks") or {}).get("graphs"):
            empty.append((target, "no graph compiled (checks.graphs is 0)"))
        elif stage == "xla" and "shapes" in half and not half.get("shapes"):
            empty.append((target, "no shape checked (shapes is empty)"))
        elif stage == "xla" and half.get("shapes") and not half.get("not_assessed") and all(
                s.get("status") in CONVERTED for s in half["shapes"]):
            # every shape stopped in portkit's conversion, before the compiler: the fit was never established
            empty.append((target, "no shape reached the compiler and the fit is not marked not assessed"))
        elif stage == "accuracy" and half.get("verdict") == "pass" and not half.get("basis"):
            empty.append((target, "a pass with no basis (no task metric or tolerance behind it)"))
    if stage == "buckets" and "plans" in data and not data.get("plans"):
        empty.append(("", "no bucket plan"))
    if not data.get("targets") and stage != "report":
        empty.append(("", "no target's half in the result"))
    return empty


def assessed_something(run: Run) -> list[Violation]:
    """No stage ends "ok" having assessed nothing."""
    found = []
    for stage in layout.STAGE_NAMES:
        data = run.files.get(stage)
        if stage == layout.REPORT or run.status(stage) != OK or data is None:
            continue
        found += [Violation("ok having assessed nothing", target, f"stage {stage} is ok with {what}")
                  for target, what in _assessed(stage, data)]
    return found


# ---------------------------------------------------------------- 2. ops outside PyTorch's namespaces are findings
def _mentions(findings, op: str) -> bool:
    short = op.split("::", 1)[-1].split(".", 1)[0]
    return any(op in json.dumps(f) or f"::{short}" in json.dumps(f) for f in findings or [])


def non_aten_ops_have_findings(run: Run) -> list[Violation]:
    """Every op outside PyTorch's own namespaces in a compiled graph (compile.json's per-target checks.ops) has a
    finding in that target's compile findings or its report. PyTorch's namespaces are portkit's one list
    (portkit.targets.foreign_ops.CORE_NAMESPACES: aten, prims, the collectives, higher_order)."""
    from portkit.targets import foreign_ops
    compile_ = run.get("compile")
    found = []
    for target, half in (compile_.get("targets") or {}).items():
        ops = ((half or {}).get("checks") or {}).get("ops") or {}
        findings = list((half or {}).get("findings") or []) + list(
            run.get("report").get("targets", {}).get(target, {}).get("findings") or [])
        for op in ops:
            if foreign_ops.is_foreign_name(op) and not _mentions(findings, op):
                found.append(Violation("op outside PyTorch's namespaces without a finding", target,
                                       f"{op} is in the compiled graph and no finding names it"))
    return found


# ---------------------------------------------------------------- 3. one cause, counted once
def _cause(finding: dict) -> str:
    if finding.get("cause"):
        return str(finding["cause"])
    where = finding.get("where")
    where = where.get("file", "") + f":{where.get('line', '')}" if isinstance(where, dict) else where or ""
    return f"{finding.get('kind')} at {where}" if where else f"{finding.get('kind')}: {finding.get('message')}"


def causes_counted_once(run: Run) -> list[Violation]:
    """No cause is counted twice among a target's findings that count (blockers and work) in report.json."""
    found = []
    for target, half in run.get("report").get("targets", {}).items():
        seen: dict[str, str] = {}
        for finding in half.get("findings") or []:
            if finding.get("severity") not in (BLOCKER, WORK):
                continue
            key = _cause(finding)
            if key in seen:
                found.append(Violation("cause counted twice", target,
                                       f"{key[:160]} (stages {seen[key]} and {finding.get('stage')})"))
            seen.setdefault(key, str(finding.get("stage")))
    return found


# ---------------------------------------------------------------- 4. portkit's caps are portkit's
def model_limit(config: dict | None) -> int | None:
    """The model's own length limit from its config (LIMIT_KEYS), else the smallest of its text sub-configs' (a
    multimodal text_config, an encoder-decoder's encoder and decoder), or None. A relative-position model's keys are
    the ones portkit reads as a position table (huggingface.position_key: T5's n_positions is none)."""
    from portkit.models import huggingface
    config, found = config or {}, []
    for part in (config, *(config.get(k) for k in ("text_config", "encoder", "decoder"))):
        if not isinstance(part, dict):
            continue
        keys = LIMIT_KEYS if huggingface.RELATIVE_ONLY not in part else (huggingface.position_key(part),)
        limits = [part[k] for k in filter(None, keys) if isinstance(part.get(k), int) and part[k] > 0]
        if limits and part is config:
            return limits[0]
        found += limits[:1]
    return min(found, default=None)


def caps_named_as_portkits(run: Run) -> list[Violation]:
    """No portkit cap is called the model's maximum: a finding that says "(the model's maximum)" names a number
    the model's config holds (less the positions its embeddings reserve, portkit.models.huggingface.
    position_offset); a model with no limit in its config has no maximum to name. Needs the config (the zoo
    knows it; a run folder alone does not record it)."""
    from portkit.models import huggingface
    if run.config is None:
        return []
    limit = model_limit(run.config)
    allowed = {limit, limit - huggingface.position_offset(run.config)} if limit else set()
    found, said = [], set()
    for stage in layout.STAGE_NAMES:
        for target, half in (run.get(stage).get("targets") or {}).items():
            for finding in (half or {}).get("findings") or []:
                match = MODEL_MAXIMUM.search(str(finding.get("message", "")))
                if not match or (target, int(match.group(1).replace(",", ""))) in said:
                    continue
                cap = int(match.group(1).replace(",", ""))
                said.add((target, cap))
                if cap not in allowed:
                    whose = f"its config's limit is {limit}" if limit else "its config names no length limit"
                    found.append(Violation("portkit cap called the model's maximum", target,
                                           f"stage {stage} calls {cap} the model's maximum; {whose}"))
    return found


# ---------------------------------------------------------------- 5. the grading policy
def graded(half: dict) -> str:
    """The verdict the written policy (portkit.core.grading.verdict) gives a report.json target, with its open
    questions read as the report reads them: a target no stage result holds is one."""
    opened = list(half.get("unassessed") or [])
    if not half.get("based_on"):
        opened.append("no stage result holds this target")
    return grading.verdict((f.get("severity") for f in half.get("findings") or []), opened)


def verdicts_follow_policy(run: Run) -> list[Violation]:
    """Every verdict follows the grading policy: its findings, based_on and unassessed give it; the summary's
    verdicts agree with the targets'; a stage that failed or is missing is in unassessed unless blocked."""
    report = run.get("report")
    found = []
    broken = [s for s in layout.STAGE_NAMES if s != layout.REPORT and run.status(s) not in (OK, SKIPPED)]
    for target, half in report.get("targets", {}).items():
        verdict, policy = half.get("verdict"), graded(half)
        if verdict != policy:
            found.append(Violation("verdict off the grading policy", target,
                                   f"verdict {verdict!r}; its findings, based_on and unassessed give {policy!r}"))
        if report.get("verdicts", {}).get(target, verdict) != verdict:
            found.append(Violation("verdict off the grading policy", target,
                                   f"verdicts[{target}] is {report['verdicts'][target]!r}, the target's {verdict!r}"))
        missed = [s for s in broken if s not in (half.get("unassessed") or [])]
        if missed and verdict in (READY, READY_WITH_WORK):
            found.append(Violation("verdict off the grading policy", target,
                                   f"{verdict!r} while stage(s) {', '.join(missed)} did not end ok and are not in "
                                   "unassessed"))
    return found


# ---------------------------------------------------------------- 6. portkit's files are not the user's
def _owner(finding: dict) -> str:
    owner = finding.get("owner")
    return owner.get("owner", "") if isinstance(owner, dict) else str(owner or "")


def _where(finding: dict) -> str:
    where = finding.get("where")
    return where.get("file", "") if isinstance(where, dict) else str(where or "")


def user_findings_not_in_portkit(run: Run) -> list[Violation]:
    """No finding is attributed to the user (owner "user") from portkit's own files."""
    from portkit.core import owners
    found, said = [], set()
    for stage in (*layout.STAGE_NAMES,):
        for target, half in (run.get(stage).get("targets") or {}).items():
            for finding in (half or {}).get("findings") or []:
                where = _where(finding)
                file = where.split(":", 1)[0]           # the same frame, as a stage and as the report write it
                if _owner(finding) == owners.USER and PORTKIT_FILE.search(where) and (target, file) not in said:
                    said.add((target, file))
                    found.append(Violation("user's finding in portkit's file", target,
                                           f"{finding.get('kind')} owned by the user at {where[:160]}"))
    return found


RULES = (assessed_something, non_aten_ops_have_findings, causes_counted_once, caps_named_as_portkits,
         verdicts_follow_policy, user_findings_not_in_portkit)


def check(run: Run) -> list[Violation]:
    """Every rule's violations on one run folder."""
    return [v for rule in RULES for v in rule(run)]
