"""Stage 3b for a real-size model without weights (portkit.models.meta_device: a published config on the meta
device): what the XLA stage checks when `portkit run --model llama3-8b` has no values to run.

TPU: the model compiled with its weights sharded FSDP-style over each topology of `scale_topologies`,
fewest chips first, until one fits (portkit.tpu_compile.sharded); on that topology the largest batch per
sequence bucket that fits HBM, by a search over compiles whose boundary is the compiler's own
out-of-HBM verdict (seeded from the memory the first compile measured); the roofline estimate per chip.
Neuron: the StableHLO lowering check, and capacity per Trainium/Inferentia chip from the FLOPs counted
on the graph (portkit.targets.capacity). Every verdict goes through the verdict cache: a rerun compiles nothing.

    >>> from portkit.models import meta_device
    >>> from portkit.stages.xla import realsize, stage
    >>> m = meta_device.build("llama3-8b")
    >>> checks = realsize.run(m, ["neuron", "tpu"], stage.Options.of({"scale_batch": 8, "scale_seq": 1024}))
    >>> checks["tpu"].smallest, checks["tpu"].largest      # 'v5e:2x2', [{'seq': 1024, 'batch': ...}]
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from portkit.models import meta_device
from portkit.targets import capacity
from portkit.targets import specs
from portkit.tpu_compile import compiler
from portkit.tpu_compile import sharded
from portkit.core import grading
from portkit.core.errors import MissingPackage, PortkitError
from portkit.core.tables import HtmlTable
from portkit.tpu_compile.results import XlaSkipped, format_bytes

# The stages that need the weights' values, and what each would have found: said once, in each target's findings.
NOT_CHECKED = ("CPU fallbacks (stage 1), graph breaks and recompiles (stage 2), bucket replays (stage 3) and "
               "accuracy (stage 4)")


@dataclass
class ScaleCheck:
    """One target's real-size check: the reports compiled (TPU) or lowered (Neuron), and what they show."""
    target: str
    model: dict
    batch: int
    seq: int
    tried: list = field(default_factory=list)      # XlaCompileReport per topology, fewest chips first
    smallest: str | None = None                    # the first topology that fits, or None
    largest: list = field(default_factory=list)    # per sequence bucket: {"seq", "topology", "batch", "tried"}
    capacity: dict | None = None                   # Neuron: capacity.neuron_capacity(...)
    lowering: object = None                        # Neuron: the StableHLO lowering report, or XlaSkipped

    @property
    def main(self):
        """The report the stage's per-target result is built on: the topology that fits (else the largest
        tried, whose refusal is the finding), or the Neuron lowering check."""
        if self.lowering is not None:
            return self.lowering
        fitting = [r for r in self.tried if r.topology == self.smallest]
        return fitting[0] if fitting else self.tried[-1]

    def rows(self) -> list[dict]:
        """One row per topology tried: HBM per device, the collectives compiled in, the roofline estimate."""
        out = []
        for report in self.tried:
            r = report.shapes[0]
            roof = (capacity.roofline(report, r, tokens=self.batch * self.seq)
                    if r.status == "compiled" and r.flops is not None else None)
            out.append({"topology": report.topology, "devices": report.devices, "status": r.status,
                        "hbm_per_device": r.memory["total"] if r.memory else None,
                        "hbm_of_device": report.hbm_bytes_per_device, "fits": bool(r.ok and r.status == "compiled"),
                        # None: compiled, but libtpu could not print the HLO to count them (compiled_collectives)
                        "collectives": {k: v for k, v in (r.collectives or {}).items() if v}
                        if r.collectives is not None or r.status != "compiled" else None,
                        "compile_seconds": r.compile_seconds, "cached": r.cached, "roofline": roof,
                        "message": "" if r.ok else r.describe(report.hbm_bytes_per_device)})
        return out

    def findings(self) -> list[dict]:
        return [{"kind": "abstract_model", "severity": grading.severity("abstract_model"),
                 "message": f"{self.model['name']} is a real-size model without weights: {NOT_CHECKED} were not "
                            "checked (abstract model: no weights)",
                 "advice": "run portkit on the real checkpoint (a local Hugging Face model folder) for those stages"}]

    def summary(self) -> str:
        if self.lowering is not None:
            text = (f"{self.target}: StableHLO lowering "
                    + ("skipped" if isinstance(self.lowering, XlaSkipped) else
                       "ok" if self.lowering.ok else "FAILED") + f" at batch {self.batch} x seq {self.seq}")
            if self.capacity:
                best = {n: c["copies_per_instance"] for n, c in self.capacity["chips"].items()}
                text += "; model copies per instance (" + capacity.LABEL + "): " + ", ".join(
                    f"{self.capacity['chips'][n]['instance']} {v}" for n, v in best.items())
            return text
        tried = ", ".join(r.topology for r in self.tried)
        found = ", ".join(f"seq {b['seq']}: batch {b['batch']}" + ("+" if b["batch"] >= sharded.BATCH_LIMIT else "")
                          + f" on {b['topology']}" for b in self.largest)
        return (f"{self.target}: batch {self.batch} x seq {self.seq}, weights FSDP-sharded, tried {tried}: "
                + (f"smallest topology that fits: {self.smallest}" if self.smallest else "fits none of them")
                + (f"; largest batch that fits HBM: {found}" if found else ""))

    def to_dict(self) -> dict:
        return {"model": self.model, "batch": self.batch, "seq": self.seq, "label": capacity.LABEL,
                "smallest_fitting": self.smallest, "topologies": self.rows(), "largest_batch": self.largest,
                "capacity": self.capacity, "summary": self.summary()}

    def table(self) -> HtmlTable:
        if self.lowering is not None:
            rows = [[n, c["instance"], f"{c['tokens_per_second_per_chip']:,.0f} ({c['bound']}-bound)",
                     c["neuron_cores_per_copy"], c["copies_per_chip"], c["copies_per_instance"]]
                    for n, c in (self.capacity or {"chips": {}})["chips"].items()]
            return HtmlTable(["chip", "instance", "tokens/s per chip (roofline)", "NeuronCores per copy",
                              "copies per chip", "copies per instance"], rows,
                             f"{self.summary()} — {capacity.LABEL}: {(self.capacity or {}).get('method', '')}")
        rows = [[r["topology"], r["devices"], r["status"], format_bytes(r["hbm_per_device"]) if r["hbm_per_device"]
                 else "-", format_bytes(r["hbm_of_device"]), "yes" if r["fits"] else "no",
                 _collectives(r["collectives"]),
                 f"{r['compile_seconds']:.1f}" if r["compile_seconds"] else "-",
                 f"{r['roofline']['tokens_per_second_per_chip']:,.0f} ({r['roofline']['bound']}-bound)"
                 if r["roofline"] else "-"] for r in self.rows()]
        return HtmlTable(["topology", "devices", "verdict", "HBM per device", "HBM of device", "fits", "collectives",
                          "compile s", f"tokens/s per chip ({capacity.LABEL}: roofline)"], rows, self.summary())

    def _repr_html_(self) -> str:
        note = f"<p>{html.escape(self.findings()[0]['message'])}</p>"
        return self.table()._repr_html_() + note

    def __str__(self) -> str:
        return str(self.table())


def _collectives(found: dict | None) -> str:
    return "HLO text unreadable" if found is None else ", ".join(f"{k} {v}" for k, v in found.items()) or "-"


def _found(best: int, tried: dict, guess, topology: str, **where) -> dict:
    return {**where, "topology": topology, "batch": best, "guess": guess, "limit": sharded.BATCH_LIMIT,
            "compiles": len(tried), "tried": {str(n): ok for n, ok in sorted(tried.items())}}


def _tpu(module, topologies, batch: int, seq: int, buckets) -> ScaleCheck:
    check = ScaleCheck("tpu", meta_device.describe(module), batch, seq)
    shape = meta_device.text_shape(module, batch, seq)
    check.smallest, check.tried = sharded.smallest_fitting(module, shape, list(topologies))
    where = check.main
    first = where.shapes[0] if check.smallest else None
    for bucket in buckets or [seq]:
        meta_device.text_shape(module, 1, bucket)      # a bucket longer than the model takes: one line
        guess = sharded.guess_batch(first, where.hbm_bytes_per_device, batch, seq, bucket)
        best, tried = sharded.largest_batch(module, bucket, where.topology, guess=guess)
        check.largest.append(_found(best, tried, guess, where.topology, seq=bucket))
    return check


def largest_per_shape(model, shapes, report, dtype: str | None = None) -> list[dict]:
    """A loaded model's TPU shapes (stage 2's fixed shape, stage 3's buckets), each compiled in `report`: the
    largest batch of the same shape that fits HBM on the report's topology, the compiler's own out-of-HBM
    verdict the boundary, the search seeded from the memory that shape's compile measured. Each batch tried
    is one compile_for_tpu, kept in the verdict cache."""
    found = []
    for shape, compiled in zip(shapes, report.shapes):
        if compiled.status != "compiled":
            continue

        def fits(n: int, shape=shape) -> bool:
            r = compiler.compile_for_tpu(model, [{**shape, "batch": n}], report.topology, dtype).shapes[0]
            if r.status not in ("compiled", "out_of_hbm"):
                raise PortkitError(f"batch {n} of {compiled.label} on {report.topology}: "
                                   f"{r.describe(report.hbm_bytes_per_device)}")
            return r.status == "compiled" and bool(r.fits_hbm)
        seq = shape.get("seq") or 1
        guess = sharded.guess_batch(compiled, report.hbm_bytes_per_device, shape["batch"], seq, seq)
        best, tried = sharded.largest_fitting(fits, sharded.BATCH_LIMIT, guess)
        found.append(_found(best, tried, guess, report.topology, seq=shape.get("seq"), shape=compiled.label))
    return found


def _neuron(module, batch: int, seq: int) -> ScaleCheck:
    check = ScaleCheck("neuron", meta_device.describe(module), batch, seq)
    shape = meta_device.text_shape(module, batch, seq)
    try:
        check.lowering = compiler.check_lowering(module, [shape])
    except MissingPackage as exc:
        check.lowering = XlaSkipped("neuron", str(exc))
    check.capacity = capacity.neuron_capacity(module, shape, tokens=batch * seq)
    return check


def run(module, target_names, opts) -> dict:
    """Each target's real-size check ({target: ScaleCheck}) at the options' (stage.Options) scale_batch x
    scale_seq, over scale_topologies and scale_buckets; reference targets (cpu, cuda) have none."""
    checks = {}
    for name in specs.parse_targets(target_names):
        check = specs.get(name).xla_check
        if check == "compile":
            checks[name] = _tpu(module, opts.scale_topologies, opts.scale_batch, opts.scale_seq, opts.scale_buckets)
        elif check == "lowering":
            checks[name] = _neuron(module, opts.scale_batch, opts.scale_seq)
    return checks
