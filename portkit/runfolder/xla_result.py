"""Stage 3b's result (xla.json) as types: per target, the real XLA compile of each shape (memory, FLOPs, compile
time), the serving and training graphs, and an abstract model's real-size check.

    >>> from portkit.runfolder import results
    >>> found = results.load("runs/minilm", "xla")              # None where stage 3b has no result
    >>> [s.memory_total for s in found.target("tpu").shapes], found.target("tpu").topology

Written by portkit.stages.xla; read here only, validated as it is read (portkit.runfolder.reading): a damaged
value raises UnreadableResult naming the file, the key and the damage.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.runfolder import reading

STAGE = "xla"


@dataclass(frozen=True)
class Shape:
    """One input shape compiled by XLA for the target."""
    label: str | None
    status: str | None
    ok: bool
    memory_total: float | None      # HBM need per device, bytes (the memory analysis); None where not compiled
    flops: float | None
    fits_hbm: bool | None
    compile_seconds: float | None
    message: str | None
    bytes_accessed: float | None = None     # the cost analysis's bytes accessed

    @classmethod
    def from_dict(cls, node: reading.Node) -> Shape:
        memory = node.obj("memory")
        total = memory.number("total")
        if memory.value and total is None:
            memory.at("total").fail("a number of bytes")
        return cls(node.text("label"), node.text("status"), bool(node.raw("ok")), total, node.number("flops"),
                   node.flag("fits_hbm"), node.number("compile_seconds"), node.text("message"),
                   node.number("bytes_accessed"))


@dataclass(frozen=True)
class Target(reading.TargetPart):
    skipped: object                  # why the XLA check was skipped for the target (falsy: it was not)
    reason: str | None
    check: str | None                # "compile" (a real compile for a topology) or a lowering only
    topology: str | None             # e.g. "v5e:1x1"
    hbm_bytes_per_device: float | None
    shapes: tuple[Shape, ...]
    serving: dict | None             # workload "generate": prefill and decode compiled
    training_step: dict | None       # workload "train": the whole step compiled
    measured_throughput: tuple[dict, ...]
    scale: dict | None               # an abstract model's real-size check (portkit.stages.xla.realsize)
    largest_batch: tuple[dict, ...]  # a loaded model's largest batch per shape that fits HBM

    @classmethod
    def from_dict(cls, t: reading.Node) -> Target:
        return cls(**cls.common(t), skipped=t.raw("skipped"), reason=t.text("reason"), check=t.text("check"),
                   topology=t.text("topology"), hbm_bytes_per_device=t.number("hbm_bytes_per_device"),
                   shapes=tuple(Shape.from_dict(s) for s in t.objects("shapes")), serving=t.record("serving"),
                   training_step=t.record("training_step"),
                   measured_throughput=tuple(dict(m.value) for m in t.objects("measured_throughput")),
                   scale=t.record("scale"), largest_batch=tuple(dict(b.value) for b in t.objects("largest_batch")))

    @property
    def hbm_bytes(self) -> int | None:
        """The largest compiled shape's HBM need per device."""
        totals = [s.memory_total for s in self.shapes if s.memory_total is not None]
        return int(max(totals)) if totals else None


@dataclass(frozen=True)
class Result(reading.StageFile):
    @classmethod
    def from_dict(cls, data: dict, path) -> Result:
        return cls(**cls.common(reading.Node(data, path, STAGE), Target.from_dict))
