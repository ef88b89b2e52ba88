"""What a stage found, in the report's terms: the severities and the Finding record.

    >>> from portkit.core.findings import BLOCKER, Finding
    >>> Finding("float64", BLOCKER, "float64 in head", "use float32", module="head").to_dict()
    {'kind': 'float64', 'severity': 'blocker', 'module': 'head', 'message': 'float64 in head', 'advice': 'use float32'}

A foundation: targets (whose feature rules carry a severity), the stages and the report all read the
severities from here, and nothing here imports another portkit module.
"""
from __future__ import annotations

from dataclasses import dataclass

ROOT = "<model>"          # how results name the model's own module where they name a module path

# Severity by consequence on the target: blocker: cannot run or cannot compile on the target; work: runs, with a
# named cost (a CPU round trip per call, a recompile per shape, a precision loss the task sees); info:
# noted, no cost found.
BLOCKER, WORK, INFO = "blocker", "work", "info"
SEVERITIES = (BLOCKER, WORK, INFO)     # most to least severe: reports sort by this order

# An eager (stage 1) finding under torch.compile (stage 2): still there (the op is in a compiled graph,
# or the code is a graph break), traced away, or not checked (stage 2 did not run, failed, or ran natively).
PERSISTS, VANISHES, NOT_CHECKED = "persists", "vanishes", "not checked"
COMPILED_STATUSES = (PERSISTS, VANISHES, NOT_CHECKED)


@dataclass
class Finding:
    """One thing a stage found (portkit/stages/report/stage.py reads kind, severity, message, advice).

    severity: one of SEVERITIES. module, ops, source: where in the model, which ATen ops, and the
    document or issue behind the advice. where: the source frame (portkit.core.frames.place); owner: whose
    code that is (portkit.core.frames.owner); compiled: one of COMPILED_STATUSES with compiled_detail saying
    why; consequence: the cost behind the severity. Left out of the JSON when not given."""
    kind: str
    severity: str
    message: str
    advice: str
    module: str | None = None
    ops: list[str] | None = None
    source: str | None = None
    where: dict | None = None
    owner: dict | None = None
    compiled: str | None = None
    compiled_detail: str | None = None
    consequence: str | None = None
    OPTIONAL = ("module", "ops", "source", "where", "owner", "compiled", "compiled_detail", "consequence")

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if self.compiled is not None and self.compiled not in COMPILED_STATUSES:
            raise ValueError(f"finding compiled status {self.compiled!r} is not one of {', '.join(COMPILED_STATUSES)}")

    def to_dict(self) -> dict:
        found = {"kind": self.kind, "severity": self.severity, "module": self.module, "ops": self.ops,
                 "message": self.message, "advice": self.advice, "source": self.source, "where": self.where,
                 "owner": self.owner, "compiled": self.compiled, "compiled_detail": self.compiled_detail,
                 "consequence": self.consequence}
        return {k: v for k, v in found.items() if v is not None or k not in self.OPTIONAL}
