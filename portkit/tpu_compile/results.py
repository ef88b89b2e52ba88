"""What an XLA check returns: one ShapeResult per input shape, gathered in an XlaCompileReport per target
(or an XlaSkipped saying why the check did not run). portkit.tpu_compile.compiler fills them; the xla stage
(portkit.stages.xla.stage) saves them and turns failures into findings.

    >>> from portkit.tpu_compile import compiler
    >>> report = compiler.compile_for_tpu(model, [{"batch": 8, "seq": 128}], topology="v5e:1x1")
    >>> report.shapes[0].status, report.shapes[0].fits_hbm, report.shapes[0].cached
    >>> print(report)                  # per shape: compiled?, seconds, HBM per device, FLOPs, fits
    >>> report.to_dict()               # what the xla stage writes to xla.json

A shape whose verdict came from portkit's verdict cache (portkit.tpu_compile.cache) says so: `cached` is True
and its compile seconds are those measured when it was compiled (`measured_at`), not a new measurement.
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import asdict, dataclass, field

import torch

from portkit.targets import capacity

GIB = 2 ** 30
# HBM per chip (GiB) from data/targets/chips.json, each value with its Google Cloud page
# (portkit.targets.capacity). TPU7x shows each chip as two JAX devices (its two TensorCores); each device
# gets an even half of its HBM.
HBM_GIB_PER_CHIP = capacity.hbm_gib_per_chip()


def hbm_per_device(topology: str, devices: int) -> int:
    """HBM bytes each of a topology's JAX devices gets: its chips' HBM (HBM_GIB_PER_CHIP) shared evenly."""
    chips = math.prod(int(d) for d in topology.split(":")[1].split("x"))
    return int(HBM_GIB_PER_CHIP[topology.split(":")[0]] * GIB * chips // devices)
HEADLINES = {
    "compile": "real XLA compile for a TPU topology on a CPU host (compile-only, nothing executed on a TPU)",
    "lowering": "lowering check only (StableHLO export), not a Neuron compile",
}


@dataclass
class ShapeResult:
    """One input shape through the XLA pipeline. Bytes and FLOPs are per device."""
    label: str
    inputs: dict                    # name -> [shape, dtype] as compiled
    status: str                     # compiled | lowered | no_lowering | trace_failed | out_of_hbm | compile_failed
    lower_seconds: float            # torchax trace + lowering to StableHLO
    compile_seconds: float | None = None   # the XLA TPU compiler alone
    message: str | None = None      # the compiler's (or tracer's) own words on failure
    op: str | None = None           # ATen op with no JAX lowering
    module_path: str | None = None  # the nn.Module that was running when it failed
    module_type: str | None = None
    input_sharding: str | None = None
    platform: str | None = None     # platform of the compiled executable's devices (checked: tpu)
    memory: dict | None = None      # argument, output, alias, temporary, generated_code, total bytes
    flops: float | None = None
    bytes_accessed: float | None = None
    fits_hbm: bool | None = None
    stablehlo_ops: int | None = None
    custom_calls: list | None = None
    cached: bool = False            # the verdict came from portkit's verdict cache: nothing was compiled now
    measured_at: str | None = None  # when compile_seconds was measured (UTC, ISO 8601)
    collectives: dict | None = None  # collective ops the compiler inserted (counted in the compiled HLO)
    where: dict | None = None       # a failed conversion: the model's line that was running (core.owners.place)

    @property
    def ok(self) -> bool:
        return self.status in ("compiled", "lowered") and self.fits_hbm is not False

    def describe(self, hbm: int | None) -> str:
        if self.status == "lowered":
            calls = f"; custom calls: {', '.join(self.custom_calls)}" if self.custom_calls else ""
            return f"lowered to StableHLO in {self.lower_seconds:.1f} s: {self.stablehlo_ops} ops{calls}"
        if self.status == "compiled":
            m = self.memory
            fit = (f"fits ({m['total'] / hbm:.1%} of {format_bytes(hbm)})" if self.fits_hbm
                   else f"DOES NOT FIT {format_bytes(hbm)}")
            return (f"compiled in {self.compile_seconds:.1f} s (+{self.lower_seconds:.1f} s lowering), "
                    f"{self.input_sharding}; HBM {format_bytes(m['total'])} per device = args "
                    f"{format_bytes(m['argument'])} + out {format_bytes(m['output'])} + temp "
                    f"{format_bytes(m['temporary'])} + code "
                    f"{format_bytes(m['generated_code'])}, {fit}; {self.flops / 1e9:.2f} GFLOP, "
                    f"{format_bytes(self.bytes_accessed)} accessed")
        where = ""
        if self.module_path is not None:
            where = f" in module {self.module_path or '<top level>'} ({self.module_type})"
        if self.where:
            where += f" at {self.where['text']}"
        if self.status == "no_lowering":
            return f"NO LOWERING for {self.op}{where}"
        first = (self.message or "").strip().splitlines()[0] if self.message else ""
        verdict = {"out_of_hbm": "DOES NOT FIT HBM, compiler says", "trace_failed": "conversion failed"}
        return f"{verdict.get(self.status, 'compile failed')}{where}: {first}"

    def origin(self) -> str:
        """Where a compile verdict (or lowering figures) came from, for a cached one: its seconds are the ones
        measured then. Shown beside describe() where a person reads one shape (the notebook), never inside it:
        describe() goes into findings and summaries, which read the same cold and warm (the provenance is in
        the `cached` and `measured_at` keys)."""
        if not self.cached:
            return ""
        if self.status == "lowered":
            return f" (lowering cache; measured {self.measured_at})"
        return f" (verdict cache; compile measured {self.measured_at})"


@dataclass
class XlaCompileReport:
    """Every shape of one model through XLA for one target: a TPU compile or a Neuron lowering check."""
    model: str
    target: str
    check: str                      # "compile" or "lowering"
    dtype: str
    parameters: int
    parameter_bytes: int            # unique parameters in the compiled dtype
    shapes: list = field(default_factory=list)
    topology: str | None = None
    devices: int | None = None
    device_kind: str | None = None
    hbm_bytes_per_device: int | None = None
    versions: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    verdict_cache: str | None = None    # the folder of portkit's XLA verdict cache (TPU compiles only)

    @property
    def headline(self) -> str:
        return HEADLINES[self.check]

    @property
    def ok(self) -> bool:
        return bool(self.shapes) and all(s.ok for s in self.shapes)

    @property
    def cached_shapes(self) -> int:
        """Shapes whose compile verdict was read from the verdict cache instead of compiled now."""
        return sum(s.cached for s in self.shapes)

    def sanity(self, shape: ShapeResult) -> str | None:
        """Argument bytes the compiler placed on a device vs the parameters plus that device's inputs."""
        if not shape.memory:
            return None
        inputs = sum(math.prod(s) * _itemsize(d) for s, d in shape.inputs.values())
        if shape.input_sharding and shape.input_sharding.startswith("batch"):
            inputs //= self.devices
        expected = self.parameter_bytes + inputs
        return (f"argument bytes {format_bytes(shape.memory['argument'])} vs parameters "
                f"{format_bytes(self.parameter_bytes)} ({self.dtype}) + inputs {format_bytes(inputs)}: "
                f"ratio {shape.memory['argument'] / expected:.3f}")

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "shapes"}
        out["headline"] = self.headline
        out["ok"] = self.ok
        out["cached_shapes"] = self.cached_shapes
        out["shapes"] = [{**asdict(s), "ok": s.ok, "sanity": self.sanity(s)} for s in self.shapes]
        return out

    def _title(self) -> str:
        if self.check == "lowering":
            return f"{self.target}: {self.headline}"
        return (f"{self.target} {self.topology} ({self.devices} x {self.device_kind}, "
                f"{format_bytes(self.hbm_bytes_per_device)} HBM per device): {self.headline}")

    def __str__(self) -> str:
        lines = [self._title(),
                 f"model {self.model}: {self.parameters / 1e6:.1f} M parameters, {format_bytes(self.parameter_bytes)} "
                 f"in {self.dtype}"]
        if self.verdict_cache:
            lines.append(self.cache_line())
        for s in self.shapes:
            lines.append(f"  {s.label}: {s.describe(self.hbm_bytes_per_device)}{s.origin()}")
            if self.sanity(s):
                lines.append(f"    sanity: {self.sanity(s)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def cache_line(self) -> str:
        if self.check == "lowering":
            return (f"lowering cache {self.verdict_cache}: {self.cached_shapes} of {len(self.shapes)} shapes read "
                    "from it (not lowered now; their figures are those measured when first lowered)")
        return (f"verdict cache {self.verdict_cache}: {self.cached_shapes} of {len(self.shapes)} shapes served from "
                "it (no compile now; their compile seconds are those measured when first compiled)")

    def _repr_html_(self) -> str:
        cache = f"<br>{html.escape(self.cache_line())}" if self.verdict_cache else ""
        rows = "".join(f"<tr><td>{html.escape(s.label)}</td><td>{'ok' if s.ok else '<b>FAIL</b>'}</td>"
                       f"<td>{html.escape(s.describe(self.hbm_bytes_per_device))}</td></tr>" for s in self.shapes)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>{html.escape(self._title())}</b><br>model {html.escape(self.model)}, "
                f"{self.parameters / 1e6:.1f} M parameters in {self.dtype}{cache}<table><tr><th>shape</th><th></th>"
                f"<th>verdict</th></tr>{rows}</table><ul>{notes}</ul></div>")


@dataclass
class XlaSkipped:
    """The XLA section did not run; `reason` is one line saying why and what to install."""
    target: str
    reason: str

    def to_dict(self) -> dict:
        return {"target": self.target, "skipped": True, "reason": self.reason}

    def __str__(self) -> str:
        return self.reason

    def _repr_html_(self) -> str:
        return f"<div><b>{html.escape(self.target)}</b>: {html.escape(self.reason)}</div>"


class MemoryVerdict:
    """What a compiled graph's memory says, for a dataclass with status, memory (the compiler's memory_analysis),
    breakdown ({part: bytes}) and hbm_bytes_per_device: whether it fits one device's HBM, and the parts' line."""

    @property
    def fits(self) -> bool:
        return self.status == "compiled" and self.memory.get("total", math.inf) <= self.hbm_bytes_per_device

    def memory_line(self) -> str:
        """'fits' or 'does NOT fit' in parentheses, then each part of the memory with its size."""
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.breakdown.items())
        return f"({'fits' if self.fits else 'does NOT fit'}): {parts}"


def format_bytes(n) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def collectives(hlo_text: str) -> dict[str, int]:
    """How many of each collective op a compiled HLO module holds (async pairs count once, by their -start)."""
    return {op: len(re.findall(rf"(?<![%\w.-]){op}(?:-start)?\(", hlo_text)) for op in COLLECTIVES}


def compiled_collectives(compiled) -> dict[str, int] | None:
    """collectives() of a compiled JAX executable's HLO text; None where libtpu cannot print it (checked:
    Llama-3-70B on v5p:2x2x1 compiles, then as_text() fails a RET_CHECK on an async-update instruction)."""
    try:
        return collectives(compiled.as_text())
    except RuntimeError:        # jax's JaxRuntimeError: the verdict stands, only the count is missing
        return None



def plot_hbm(graphs: dict[str, dict], hbm_bytes: int, ax=None):
    """One stacked bar per compiled graph ({label: {part: bytes}}, parts adding up to the compiler's total
    per device), in MiB, beside the device's HBM: where a training step's or a serving graph's memory goes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 + 0.5 * len(graphs)))
    parts = list(dict.fromkeys(p for b in graphs.values() for p in b))
    left = [0.0] * len(graphs)
    for part in parts:
        sizes = [b.get(part, 0) / 2 ** 20 for b in graphs.values()]
        ax.barh(list(graphs), sizes, left=left, label=part)
        left = [a + s for a, s in zip(left, sizes)]
    ax.axvline(hbm_bytes / 2 ** 20, color="black", linestyle="--", label=f"HBM per device ({format_bytes(hbm_bytes)})")
    ax.set_xlim(0, max(max(left), 1) * 1.15)
    ax.set_xlabel("MiB per device (compiled.memory_analysis())")
    ax.legend(fontsize=7, loc="lower right")
    return ax.figure
