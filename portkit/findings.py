"""What a stage found, in the report's terms: the severities and the Finding record.

    >>> from portkit.findings import BLOCKER, Finding
    >>> Finding("float64", BLOCKER, "float64 in head", "use float32", module="head").to_dict()
    {'kind': 'float64', 'severity': 'blocker', 'module': 'head', 'message': 'float64 in head', 'advice': 'use float32'}

A foundation: targets (whose feature rules carry a severity), the stages and the report all read the
severities from here, and nothing here imports another portkit module.
"""
from __future__ import annotations

from dataclasses import dataclass

ROOT = "<model>"          # how results name the model's own module where they name a module path

# blocker: cannot run as is; work: runs, but needs a change or a check; info: worth knowing.
BLOCKER, WORK, INFO = "blocker", "work", "info"
SEVERITIES = (BLOCKER, WORK, INFO)     # most to least severe: reports sort by this order


@dataclass
class Finding:
    """One thing a stage found (report.py reads kind, severity, message, advice).

    severity: one of SEVERITIES. module, ops, source: where in the model, which ATen ops, and the
    document or issue behind the advice; left out of the JSON when not given."""
    kind: str
    severity: str
    message: str
    advice: str
    module: str | None = None
    ops: list[str] | None = None
    source: str | None = None
    OPTIONAL = ("module", "ops", "source")

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")

    def to_dict(self) -> dict:
        found = {"kind": self.kind, "severity": self.severity, "module": self.module, "ops": self.ops,
                 "message": self.message, "advice": self.advice, "source": self.source}
        return {k: v for k, v in found.items() if v is not None or k not in self.OPTIONAL}
