"""The run log (run.json) and the report's own result (report.json) as types, read where they are read back.

    >>> from portkit.runfolder import run_log
    >>> log = run_log.read("runs/minilm")                # None where no run wrote run.json
    >>> log.stages["compile"].status                      # "ok", "skipped" or "failed"
    >>> run_log.read_report("runs/minilm").targets["tpu"].verdict

run.json is written by record here (one entry per stage of the latest `portkit run`), report.json by
the report stage (portkit.stages.report.stage); a damaged file raises UnreadableResult naming the file, the key and
the damage.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from portkit.core import atomic_io
from portkit.runfolder import layout, reading

RERUN = "rerun the run with `portkit run` (it resumes)"
REBUILD = "rebuild it with `portkit report`"


# run.json's key for a stage's peak resident memory in bytes (its kernel's VmHWM from the stage's start, core.memory)
PEAK_KEY = "peak_memory_bytes"


@dataclass(frozen=True)
class StageRun:
    """How one stage ended in the latest run: its status, the reason, its wall time and its kernel's peak resident
    memory (None where the run did not record them)."""
    status: str                    # "ok", "skipped", "failed" or "interrupted"
    error: str                     # the reason or error, one line ("" when ok)
    seconds: float | None = None   # how long it ran, to a tenth of a second
    notebook: str = ""             # its executed notebook in the run folder
    peak_memory_bytes: int | None = None    # PEAK_KEY: the kernel's peak from the stage's start (core.memory)

    @classmethod
    def from_dict(cls, node: reading.Node) -> StageRun:
        status = node.text("status")
        if status is None:
            node.at("status").fail("a stage's status")
        peak = node.integer(PEAK_KEY)
        if peak is not None and peak < 0:
            node.at(PEAK_KEY).fail("a number of bytes >= 0")
        return cls(status, node.text("error", ""), node.number("seconds"), node.text("notebook", ""), peak)

    def to_dict(self) -> dict:
        return {"status": self.status, "seconds": self.seconds, "error": self.error, "notebook": self.notebook,
                PEAK_KEY: self.peak_memory_bytes}


@dataclass(frozen=True)
class RunLog:
    path: Path
    stages: dict[str, StageRun]

    @classmethod
    def from_dict(cls, data: dict, path) -> RunLog:
        root = reading.Node(data, Path(path), "run", remedy=RERUN)
        stages = root.at("stages")
        if not isinstance(stages.value, dict):
            stages.fail("an object of stages")
        found = {}
        for name in stages.value:
            node = stages.at(name)
            if not isinstance(node.value, dict):
                node.fail("an object")
            found[name] = StageRun.from_dict(node)
        return cls(Path(path), found)

    def recorded_ok(self, stage: str) -> bool:
        entry = self.stages.get(stage)
        return entry is not None and entry.status == "ok"


def record(folder, name: str, status: str, seconds: float, error: str = "", peak: int | None = None) -> None:
    """Record how stage `name` ended in the run log ("ok", "skipped", "failed" or layout.INTERRUPTED, with the reason or
    error in one line) and its kernel's peak resident memory in bytes (None: not measured), atomically; the other
    stages' entries are kept as the log holds them (layout.read_log)."""
    log = layout.read_log(folder)
    log["stages"][name] = StageRun(status, error, round(seconds, 1), layout.stage(name).notebook, peak).to_dict()
    atomic_io.write_json(Path(folder) / layout.RUN_LOG, log)


def read(folder) -> RunLog | None:
    """The run log of `folder`; None where no run wrote one (notebooks run by hand); UnreadableResult if damaged."""
    path = Path(folder) / layout.RUN_LOG
    if not path.exists():
        return None
    return RunLog.from_dict(reading.read_object(path, "run", RERUN), path)


@dataclass(frozen=True)
class ReportTarget:
    """One target of report.json as the CI gate compares it."""
    verdict: str
    findings: tuple[dict, ...]

    @classmethod
    def from_dict(cls, node: reading.Node) -> ReportTarget:
        return cls(node.text("verdict", "not assessed"), tuple(dict(f.value) for f in node.objects("findings")))


@dataclass(frozen=True)
class Report:
    path: Path
    targets: dict[str, ReportTarget]
    model: tuple[str, str] | None = None     # (name, kind) of the run's model; None where report.json names none

    @classmethod
    def from_dict(cls, data: dict, path) -> Report:
        root = reading.Node(data, Path(path), "report", remedy=REBUILD)
        model = data.get("model")
        named = isinstance(model, dict) and isinstance(model.get("name"), str) and model["name"]
        return cls(Path(path), {name: ReportTarget.from_dict(root.obj("targets").obj(name))
                                for name in root.obj("targets").value},
                   (model["name"], str(model.get("kind") or "")) if named else None)


def read_report(folder) -> Report:
    """report.json of `folder` (FileNotFoundError where there is none); UnreadableResult if damaged."""
    path = Path(folder) / layout.REPORT_JSON
    if not path.exists():
        raise FileNotFoundError(path)
    return Report.from_dict(reading.read_object(path, "report", REBUILD), path)
