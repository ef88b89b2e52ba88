"""How each output follows the input along the varying dimension, probed at two lengths: the same length, a
strided one (a downsampling encoder), or none (a pooled output), so that the padding check slices each output back
to its real positions.

    >>> from portkit.stages.buckets import output_probe
    >>> output_probe.output_dims(model)["last_hidden_state"]
    OutputDims(dim=1, stride=1, ...)

A model may declare the rule itself (portkit.models.inputs.Output); a probe that explains neither length says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from portkit.models import inputs


# The probe's second length: up to this many times the first (within the dimension's largest), far enough apart that
# an output with one position per chunk of input positions still grows between them (a chunk of 512 probed at 512 and
# 514 samples did not). It is taken coprime to the first, so no stride above 1 divides both: with window = stride, a
# whole-windows (floor) and a padded-last-window (ceil) output then differ at one of them, and at most one of the two
# explains both probes (_probed_stride).
PROBE_SPAN = 16
FOLLOWS_ADVICE = ("declare how the output follows the input: portkit.models.inputs.Output(name, metric, stride=input "
                  "positions per output position, window=positions the first one reads, ceil=True where a partial "
                  "last window counts), so that the padding check compares the output's real positions only")


@dataclass(frozen=True)
class OutputDims:
    """How one output follows the model's input: its dims that follow the batch and the varying dimension, and how
    many of its positions along the latter are real for n real input positions (positions: inputs.Output.count at
    stride and window). `how` says where that came from: "declared" (the Output's stride), "one per position",
    "probed stride", "pooled" (no dim varies with the input); `unchecked` says why the padding check cannot tell its
    real positions (None where it can)."""
    batch: tuple[int, ...] = ()
    seq: tuple[int, ...] = ()
    stride: int = 1
    window: int = 1
    ceil: bool = False
    how: str = "one per position"
    unchecked: str | None = None

    def positions(self, n: int) -> int:
        return inputs.Output.count(n, self.stride, self.window, self.ceil)


# portkit's first probe length, and how many times it is doubled where the model refuses a probe: the smallest
# length is portkit's choice, not the model's input (Funnel's pooling blocks take no fewer than 5 positions)
PROBE_LEAST = 3
PROBE_TRIES = 5


def probe_lengths(dim, least: int = PROBE_LEAST) -> tuple[int, int]:
    """The two lengths output_dims probes a varying dimension at: its smallest size (at least `least`), then the
    largest length up to PROBE_SPAN times that plus one, within its largest, that shares no factor with the first (at
    least 2 more than the first)."""
    short = max(least, dim.min)
    cap = max(short + 2, min(dim.max or short + 2, PROBE_SPAN * short + 1))
    return short, next((n for n in range(cap, short + 1, -1) if math.gcd(n, short) == 1), short + 2)


def _probe(model, rows: int, sizes: dict, device: str) -> dict:
    with torch.no_grad():
        outputs = model.module(**model.declaration.dummy(rows, sizes, device=device))
    return {k: tuple(v.shape) for k, v in outputs.items()}


def _probed_stride(n: tuple[int, int], size: tuple[int, int]) -> tuple[int, bool] | None:
    """The stride (window = stride, floor or ceil) that gives `size` output positions at both probe lengths `n`:
    the slope's, where exactly one rounding reproduces both probes; None where none (or both) does."""
    if size[1] <= size[0]:
        return None
    stride = round((n[1] - n[0]) / (size[1] - size[0]))
    if stride < 2:
        return None
    fits = [c for c in (False, True) if all(inputs.Output.count(k, stride, stride, c) == m for k, m in zip(n, size))]
    return (stride, fits[0]) if len(fits) == 1 else None


def _follows(name: str, a: tuple, b: tuple, n: tuple[int, int], declared) -> OutputDims:
    """One output's OutputDims from its shapes `a` (2 rows, n[0] positions) and `b` (3 rows, n[1])."""
    batch = tuple(d for d in range(len(a)) if (a[d], b[d]) == (2, 3))
    rest = [d for d in range(len(a)) if d not in batch]
    if len(a) != len(b):
        return OutputDims(batch, how="unknown", unchecked=f"output {name!r} has {len(a)} dims at {n[0]} input "
                          f"positions and {len(b)} at {n[1]}: {FOLLOWS_ADVICE}")
    if declared is not None and declared.strided:
        window = declared.stride if declared.window is None else declared.window
        want = tuple(declared.positions(k) for k in n)
        seq = tuple(d for d in rest if (a[d], b[d]) == want)
        if not seq:
            return OutputDims(batch, how="declared", unchecked=(
                f"output {name!r} declares stride {declared.stride}, window {window}, ceil {declared.ceil} "
                f"({want[0]} then {want[1]} positions), but reads {a} then {b} at {n[0]} then {n[1]} input "
                f"positions: {FOLLOWS_ADVICE}"))
        return OutputDims(batch, seq, declared.stride, window, declared.ceil, "declared")
    seq = tuple(d for d in rest if (a[d], b[d]) == n)
    if seq:
        return OutputDims(batch, seq)
    grows = [d for d in rest if a[d] != b[d]]
    if not grows:
        return OutputDims(batch, how="pooled")
    probed = {d: _probed_stride(n, (a[d], b[d])) for d in grows}
    rules = {r for r in probed.values() if r is not None}
    if len(rules) != 1:
        return OutputDims(batch, how="unknown", unchecked=(
            f"output {name!r} reads {a} then {b} at {n[0]} then {n[1]} input positions, and no one stride explains "
            f"which dim follows the input: {FOLLOWS_ADVICE}"))
    (stride, ceil), = rules
    return OutputDims(batch, tuple(d for d, r in probed.items() if r == (stride, ceil)), stride, stride, ceil,
                      "probed stride")


def output_dims(model, device: str = "cpu") -> dict[str, OutputDims]:
    """Which dims of each output follow the batch and the varying dimension, from two tiny eager runs of the
    declaration's probe inputs (Declaration.dummy): 2 rows at the dimension's smallest size (at least 3; twice as
    long where the model refuses that, PROBE_TRIES times at most), then 3 rows at PROBE_SPAN times that plus one
    (probe_lengths). A dim that reads 2 then 3 is a batch dim. An output
    that declares a stride (inputs.Output) has the dims that read its positions at both lengths; any other, the
    dims that read the two lengths, else the dims a stride explains exactly (_probed_stride). Pooled outputs
    (minilm's "embedding") have no such dim and are never sliced; an output whose dims no rule explains is marked
    unchecked, with what to declare."""
    decl, dim = model.declaration, model.seq_dim
    least, largest = PROBE_LEAST, decl.dim(dim).max
    for attempt in range(PROBE_TRIES):     # a refused probe length is portkit's choice: twice as long, again
        n = probe_lengths(decl.dim(dim), least)
        try:
            shapes = [_probe(model, rows, {dim: length}, device) for rows, length in zip((2, 3), n)]
            break
        except Exception:  # noqa: BLE001 - the model refuses this length; the last try's error is the finding
            least = 2 * n[0]
            if attempt == PROBE_TRIES - 1 or (largest and least > largest):
                raise
    declared = {o.name: o for o in decl.outputs}
    return {name: _follows(name, a, shapes[1].get(name, ()), n, declared.get(name))
            for name, a in shapes[0].items()}
