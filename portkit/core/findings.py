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
# The ATen ops that read a tensor's value on the host (a host sync): a "host_sync" finding's ops.
HOST_SYNC_OPS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")
COMPILED_STATUSES = (PERSISTS, VANISHES, NOT_CHECKED)


@dataclass
class Finding:
    """One cause a stage found (portkit/stages/report/stage.py reads kind, severity, message, advice): the
    verdict counts findings, so every occurrence of one cause (each module, each call) is listed inside its
    finding (occurrences), never made a finding of its own; cause is its cause_key.

    severity: one of SEVERITIES. module, ops, source: where in the model, which ATen ops, and the
    document or issue behind the advice. where: the source frame (portkit.core.owners.place); owner: whose
    code that is (portkit.core.owners.owner); compiled: one of COMPILED_STATUSES with compiled_detail saying
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
    cause: str | None = None          # cause_key(...): what the finding is about, one finding per cause
    occurrences: dict | None = None   # where the cause shows: modules, calls, count (and merged ops or steps)
    OPTIONAL = ("module", "ops", "source", "where", "owner", "compiled", "compiled_detail", "consequence", "cause",
                "occurrences")

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if self.compiled is not None and self.compiled not in COMPILED_STATUSES:
            raise ValueError(f"finding compiled status {self.compiled!r} is not one of {', '.join(COMPILED_STATUSES)}")

    def to_dict(self) -> dict:
        found = {"kind": self.kind, "severity": self.severity, "module": self.module, "ops": self.ops,
                 "message": self.message, "advice": self.advice, "source": self.source, "where": self.where,
                 "owner": self.owner, "compiled": self.compiled, "compiled_detail": self.compiled_detail,
                 "consequence": self.consequence, "cause": self.cause, "occurrences": self.occurrences}
        return {k: v for k, v in found.items() if v is not None or k not in self.OPTIONAL}


def cause_key(kind: str, subject: str, where: dict | None = None) -> str:
    """The one key a finding's cause is known by: `subject` (a module class such as "nn.LSTM", an ATen op, or
    the feature's kind with its ops) of `kind`, at the source line `where` names (file:line), when it has one.
    Two findings of one target never share it: what shares it is one finding with its occurrences."""
    line = f"{where['file']}:{where['line']}" if where and where.get("file") else None
    return f"{kind}: {subject}" + (f" at {line}" if line else "")


# Padding that changes the outputs at real positions: one cause per target, whichever stage met it (stage 3's padding
# check, a bucket of stage 4 that fails only padded).
PADDING_CAUSE = "padding: padded positions change the real outputs"


def merge_occurrences(into: dict | None, other: dict | None) -> dict:
    """Two findings' occurrences as one: counts and calls added, modules, ops and steps joined (sorted)."""
    merged = dict(into or {})
    for key, value in (other or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float, list, dict)):
            merged.setdefault(key, value)
        elif isinstance(value, list):
            merged[key] = sorted(set(merged.get(key, [])) | set(value))
        elif isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = merged.get(key, 0) + value
    return merged


def cause_of(finding: dict) -> str:
    """A finding dict's cause: the one its stage gave it, else its kind with its ops (or module) at its line."""
    return finding.get("cause") or cause_key(finding.get("kind", "?"), ", ".join(finding.get("ops") or [])
                                             or finding.get("module") or finding.get("message", ""),
                                             finding.get("where"))
