"""Capacity per chip, an estimate, not a measurement.

TPU: roofline throughput from the XLA compiler's own cost analysis (FLOPs and bytes accessed per device).
Neuron (no Neuron compiler here): FLOPs counted on the model's graph by torch.utils.flop_counter over a
forward pass with fake inputs (no weights needed: a meta model works), and the bytes of the weights as the
least traffic a step makes. Both against each chip's published peak bf16 compute and HBM bandwidth
(data/targets/chips.json: every value with the page it was read from), and how many copies of the model
fit a chip and an instance.

A step takes at least max(FLOPs / peak FLOP/s, bytes / HBM bandwidth): the roofline bound. Real
throughput is lower (collectives, the host, kernel efficiency); every figure here says LABEL. In native
mode a measurement replaces it.

    >>> from portkit.targets import capacity
    >>> capacity.roofline(report, report.shapes[0], tokens=8 * 1024)   # a compile_for_tpu/compile_sharded result
    >>> capacity.neuron_capacity(meta_model, {"input_ids": ((8, 1024), "int64")})   # trn1, trn2, inf2 rows
"""
from __future__ import annotations

import json
import math
from typing import NamedTuple

import torch

from portkit.core import placement
from portkit.core import torch_private
from portkit.core.errors import BadParameter
from portkit.core.locations import DATA

CHIPS = DATA / "targets" / "chips.json"
LABEL = "estimate, not measured"
GIB = 2 ** 30


def chips(family: str | None = None) -> dict:
    """The chips of data/targets/chips.json ("tpu" or "neuron" family, or all)."""
    table = {k: v for k, v in json.loads(CHIPS.read_text()).items() if not k.startswith("_")}
    return {k: v for k, v in table.items() if family is None or v["family"] == family}


def chip(topology: str, family: str = "tpu") -> dict:
    """One chip's published figures, by name or by a TPU topology ("v5e:2x4")."""
    name = topology.split(":")[0]
    table = chips(family)
    if name not in table:
        raise BadParameter(f"{family.upper() if family == 'tpu' else family.title()} chip", name, sorted(table))
    return table[name]


def hbm_gib_per_chip() -> dict[str, int]:
    """HBM per TPU chip in GiB, as the XLA compile check divides it among a topology's devices."""
    return {name: spec["hbm_gib"] for name, spec in chips("tpu").items()}


def roofline(report, result, tokens: int) -> dict:
    """Roofline bound of one compiled shape per device, and the tokens per second per chip it implies
    (`tokens`: tokens the whole step processes, over all devices). Labelled an estimate with its sources."""
    if result.status != "compiled" or result.flops is None:
        raise BadParameter("compiled shape", result.status, hint="roofline needs a compiled shape's cost analysis")
    spec = chip(report.topology)
    compute_s = result.flops / spec["peak_bf16_flops"]
    memory_s = result.bytes_accessed / spec["hbm_bytes_per_s"]
    step_s = max(compute_s, memory_s)
    chips_n = math.prod(int(d) for d in report.topology.split(":")[1].split("x"))
    copies = report.hbm_bytes_per_device // result.memory["total"] if result.memory["total"] else None
    return {"label": LABEL, "bound": "compute" if compute_s >= memory_s else "HBM bandwidth",
            "step_seconds": step_s, "tokens_per_second_per_chip": tokens / step_s / chips_n if step_s else None,
            "copies_per_device": copies, "source": spec["source"]}


# ---------------------------------------------------------------- Neuron: FLOPs counted on the graph
class GraphCount(NamedTuple):
    """What one forward pass costs, counted on the graph: FLOPs (total and by op), the bytes of the inputs and
    outputs, and the activation bytes (ACTIVATION_RULE)."""
    flops: int
    by_op: dict[str, int]
    io_bytes: int
    activation_bytes: int


# The bytes a forward's activations move: every ATen op's output tensors, counted once each as the op writes them
# (the next op reads the same bytes back); views and other outputs that alias an input write nothing new, an
# in-place op writes its output. The weights are not activations (weight_bytes). An unfused count: a compiler
# that fuses ops may keep some intermediates on chip, so it is the graph's traffic, not a floor under it.
ACTIVATION_RULE = ("activations: the bytes every ATen op of the forward writes (its outputs, views excluded), "
                   "counted once each, on the model's graph under fake tensors")


class _WrittenBytes(torch_private.TorchDispatchMode):
    """Sums the bytes of the tensors each ATen op writes (ACTIVATION_RULE)."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = torch_private.op_schema(func).returns
        aliased = any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        if not aliased:
            self.total += sum(t.numel() * t.element_size() for t in torch_private.tree_leaves(out)
                              if isinstance(t, torch.Tensor))
        return out


def count_flops(module: torch.nn.Module, inputs: dict) -> GraphCount:
    """FLOPs of one forward pass of `module` on inputs of the given shapes ({name: (shape, dtype name)}),
    counted by torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions, attention) under fake
    tensors: no values are read, so a model on the meta device works. Returns a GraphCount: the total, {op:
    FLOPs}, the bytes of the inputs and outputs, and the activation bytes (ACTIVATION_RULE) of the same pass."""
    from torch.utils.flop_counter import FlopCounterMode

    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    with placement.tensors_kept(module), torch_private.fake_tensor_mode() as mode, torch.no_grad(), \
            FlopCounterMode(display=False) as counter:
        fake = {name: mode.from_tensor(torch.empty(shape, dtype=getattr(torch, dtype), device=device))
                for name, (shape, dtype) in inputs.items()}
        with _WrittenBytes() as written:
            out = module(**fake)
        io_bytes = sum(t.numel() * t.element_size() for t in [*fake.values(), *torch_private.tree_leaves(out)]
                       if isinstance(t, torch.Tensor))
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return GraphCount(int(counter.get_total_flops()), by_op, io_bytes, int(written.total))


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's unique parameters and buffers in their own dtypes (meta tensors included)."""
    seen = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in seen.values())


def neuron_capacity(module: torch.nn.Module, inputs: dict, tokens: int | None = None, names=None) -> dict:
    """Per AWS chip (trn1, trn2, inf2 by default): the roofline step time of one forward pass on one chip
    from the FLOPs counted on the graph and the weights' bytes (the least a step reads), the tokens per
    second per chip it implies, and how many model copies fit: a copy takes the NeuronCores its weights,
    inputs and outputs need (each core holds HBM / cores), copies per chip and per instance follow. The
    activations inside the step and the runtime's reserve are not counted, so copies are an upper bound.
    `tokens`: tokens a step processes (default: the first input's elements)."""
    flops, by_op, io_bytes, _ = count_flops(module, inputs)
    weights = weight_bytes(module)
    held = weights + io_bytes      # what a copy holds in HBM at least
    if tokens is None:
        first = next(iter(inputs.values()))[0]
        tokens = math.prod(first)
    rows = {}
    for name in names or sorted(chips("neuron")):
        spec = chip(name, "neuron")
        compute_s, memory_s = flops / spec["peak_bf16_flops"], weights / spec["hbm_bytes_per_s"]
        core_bytes = spec["hbm_gib"] * GIB // spec["neuron_cores"]
        cores_per_copy = max(1, math.ceil(held / core_bytes))
        chips_per_copy = math.ceil(cores_per_copy / spec["neuron_cores"])
        per_chip = spec["neuron_cores"] // cores_per_copy if chips_per_copy == 1 else 0
        step_s = max(compute_s, memory_s)
        rows[name] = {"label": LABEL, "instance": spec["instance"], "bound": "compute" if compute_s >= memory_s
                      else "HBM bandwidth", "step_seconds": step_s, "tokens_per_second_per_chip": tokens / step_s,
                      "neuron_cores_per_copy": cores_per_copy, "chips_per_copy": chips_per_copy,
                      "copies_per_chip": per_chip, "copies_per_instance": (
                          per_chip * spec["instance_chips"] if per_chip else spec["instance_chips"] // chips_per_copy),
                      "source": spec["source"]}
    return {"label": LABEL, "flops": flops, "flops_by_op": by_op, "weight_bytes": weights, "io_bytes": io_bytes,
            "tokens": tokens,
            "method": "FLOPs counted by torch.utils.flop_counter.FlopCounterMode on the model's graph (fake inputs, "
                      "no weights read); bytes: the weights, read once a step (a lower bound); copies from the "
                      "weights, "
                      "inputs and outputs (activations inside the step and the runtime's reserve not counted: an "
                      "upper bound)",
            "chips": rows}


# ---------------------------------------------------------------- native mode: measured, not estimated
MEASURED_REPEATS = 10     # timed calls per shape, after two warm-up calls (the first compiles)


def measure_native(model, target: str, shapes: list[dict], repeats: int = MEASURED_REPEATS) -> list[dict]:
    """Native mode only: tokens (items, for a model without a varying dimension) per second per chip,
    measured on the target's device for each shape ({"batch", "seq"}), the model compiled with the vendor's
    backend (torch.compile(backend=...), dynamic=False) and timed with torch.accelerator.synchronize around
    each call (the PrivateUse1 device is the current accelerator). It replaces the roofline estimate."""
    import statistics
    import time

    from portkit.targets import specs
    detected = specs.detect(target)
    if not detected.native:
        raise BadParameter("target for a measured throughput", target,
                           hint=f"needs its device ({detected.reason}); the figures here stay estimates")
    device, decl = detected.target.device, model.declaration
    module = model.module.to(device)
    compiled = torch.compile(module, backend=detected.backend, dynamic=False)
    rows = []
    with torch.no_grad():
        for shape in shapes:
            sizes = {model.seq_dim: shape["seq"]} if model.seq_dim is not None and "seq" in shape else {}
            inputs = {k: v.to(device) for k, v in decl.dummy(shape["batch"], sizes).items()}
            times = []
            for i in range(repeats + 2):
                torch.accelerator.synchronize()
                start = time.perf_counter()
                compiled(**inputs)
                torch.accelerator.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            units = shape["batch"] * (shape.get("seq") or 1)
            rows.append({"shape": shape, "seconds": seconds, "per_second": units / seconds,
                         "unit": "tokens" if sizes else "items",
                         "label": f"measured on {detected.reason}, median of {repeats} calls"})
    return rows
