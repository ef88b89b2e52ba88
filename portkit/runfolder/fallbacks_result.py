"""Stage 1's result (fallbacks.json) as types: per target, its op counts, time shares, the ops and its findings.

    >>> from portkit.runfolder import fallbacks_result
    >>> found = fallbacks_result.read("runs/minilm")              # None where stage 1 has no result
    >>> found.target("tpu").counts["cpu_fallback"], found.target("tpu").ops[0].status

Written by portkit.stages.fallbacks (its report's to_dict); read here only, validated as it is read
(portkit.runfolder.reading): a damaged value raises UnreadableResult naming the file, the key and the damage.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.runfolder import reading

STAGE = "fallbacks"


@dataclass(frozen=True)
class Op:
    """One distinct ATen op recorded for a target: its status there and what it cost."""
    op: str
    status: str | None
    via: str | None              # the op the device runs, where the CPU recording shows its CPU-only twin
    time_share: float            # its share of the recorded op time (a measured time, not a count)
    calls: int
    modules: tuple[str, ...]

    @classmethod
    def from_dict(cls, node: reading.Node) -> Op:
        op = node.text("op")
        if op is None:
            node.at("op").fail("an op name")
        return cls(op, node.text("status"), node.text("via"), float(node.number("time_share", 0.0)),
                   node.integer("calls", 0), tuple(str(m.value) for m in node.items("modules")))


@dataclass(frozen=True)
class Target(reading.TargetPart):
    counts: dict[str, float]     # distinct ops by status: native, composite, cpu_fallback, unsupported
    time_share: dict[str, float]
    ops: tuple[Op, ...]

    @classmethod
    def from_dict(cls, t: reading.Node) -> Target:
        return cls(**cls.common(t), counts=t.numbers("counts"), time_share=t.numbers("time_share"),
                   ops=tuple(Op.from_dict(o) for o in t.objects("ops")))


@dataclass(frozen=True)
class Result(reading.StageFile):
    @classmethod
    def from_dict(cls, data: dict, path) -> Result:
        return cls(**cls.common(reading.Node(data, path, STAGE), Target.from_dict))
