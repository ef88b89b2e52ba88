"""The tolerance policy: how close a target's result must be to the reference to count as the same.

    >>> from portkit import targets, tolerance
    >>> tol = tolerance.tolerance_for(targets.get("tpu").default_precision)   # bf16 matmul operands
    >>> tol.dtype, tol.rtol, tol.atol
    ('bfloat16', 0.016, 1e-05)
    >>> tol.check(actual, expected)          # None, or assert_close's message on one line
    >>> tolerance.padding_tolerance(targets.get("tpu").default_precision)     # stage 3's padding check

Three decisions live here and nowhere else:
- DEFAULT_TOLERANCES: the (rtol, atol) per dtype a result is held to, torch.testing.assert_close's own
  defaults; a result is held to the lowest dtype its precision setting computes in (tolerance_for).
- DEFAULT_TASK_BOUNDS: how far a model kind's task metric (cosine, agreement, KL) may move.
- padding_tolerance: what stage 3's padding check allows between a compiled bucket and the unpadded
  eager reference run under the same numerics.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# torch.testing.assert_close's defaults (its docstring's table); tests check they still match torch.
DEFAULT_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
                      "float64": (1e-7, 1e-7)}
# Lowest cosine to the reference (embeddings), lowest top-1 / argmax agreement, highest mean KL divergence.
DEFAULT_TASK_BOUNDS = {"cosine": 0.999, "agreement": 0.99, "kl": 0.01}
# Padding checks compare a compiled bucket with the unpadded eager outputs. Compiled kernels may sum in
# another order, so allow more than assert_close's float32 default. Where the precision rounds to bf16
# (the emulated TPU default), a rounding that flips on a 1e-7 difference moves minilm's outputs by up to
# ~1e-2; a mask bug, real tokens attending to padding (vllm-project/tpu-inference#3466), moves them by
# ~0.5 (checked on minilm), far outside both.
PADDING_TOLERANCE = (1e-4, 1e-4)
PADDING_TOLERANCE_BF16 = (2e-2, 2e-2)


@dataclass(frozen=True)
class Tolerance:
    """The (rtol, atol) one dtype is held to; `check` is torch.testing.assert_close with them."""
    dtype: str
    rtol: float
    atol: float

    def check(self, actual: torch.Tensor, expected: torch.Tensor) -> str | None:
        """None when close; otherwise assert_close's message, made one line."""
        try:
            torch.testing.assert_close(actual, expected, rtol=self.rtol, atol=self.atol)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"not within {self.dtype} tolerance (rtol {self.rtol:g}, atol {self.atol:g}): " + \
                "; ".join(lines[1:] or lines)
        return None

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "rtol": self.rtol, "atol": self.atol, "check": "torch.testing.assert_close"}


def compute_dtype(precision) -> torch.dtype:
    """The lowest dtype a precision setting (targets.Precision) computes in: what its results are held to."""
    return precision.all_ops or precision.matmul_inputs or torch.float32


def tolerance_for(precision, tolerances: dict | None = None, output_dtype: torch.dtype = torch.float32) -> Tolerance:
    """The tolerance of the dtype `precision` computes in; `tolerances` ({dtype: (rtol, atol)}) overrides
    DEFAULT_TOLERANCES. An output that is already of a lower dtype is held to its own dtype."""
    dtype = compute_dtype(precision)
    if output_dtype.is_floating_point and torch.finfo(output_dtype).eps > torch.finfo(dtype).eps:
        dtype = output_dtype
    name = str(dtype).replace("torch.", "")
    rtol, atol = {**DEFAULT_TOLERANCES, **(tolerances or {})}[name]
    return Tolerance(name, float(rtol), float(atol))


def rounds(precision) -> bool:
    """Whether a precision setting rounds anything below float32 (matmul operands, results, or every op)."""
    return precision is not None and any(d is not None for d in (precision.matmul_inputs, precision.matmul_output,
                                                                  precision.all_ops))


def padding_tolerance(precision) -> Tolerance:
    """What a padded, compiled bucket may differ from the unpadded eager reference run under the same
    numerics: bf16-wide where `precision` (the emulated target's; None for any other backend) rounds."""
    if rounds(precision):
        return Tolerance("bfloat16", *PADDING_TOLERANCE_BF16)
    return Tolerance("float32", *PADDING_TOLERANCE)


def effective(tolerances: dict | None = None) -> dict[str, tuple[float, float]]:
    """DEFAULT_TOLERANCES with the overrides applied: what a run is held to, per dtype."""
    return {name: tuple(map(float, pair)) for name, pair in {**DEFAULT_TOLERANCES, **(tolerances or {})}.items()}


def describe(tolerances: dict | None = None, task_bounds: dict | None = None) -> str:
    """The policy a run is held to, one line each, overrides marked: what a notebook prints."""
    def mark(table, key):
        return " (changed)" if key in table else ""
    tolerances, task_bounds = tolerances or {}, task_bounds or {}
    bounds = {**DEFAULT_TASK_BOUNDS, **task_bounds}
    pairs = ", ".join(f"{name} ({rtol:g}, {atol:g}){mark(tolerances, name)}"
                      for name, (rtol, atol) in effective(tolerances).items())
    return (f"tolerance (rtol, atol) by compute dtype, checked by torch.testing.assert_close: {pairs}\n"
            f"task bounds: cosine >= {bounds['cosine']:g}{mark(task_bounds, 'cosine')}, top-1/argmax agreement "
            f">= {bounds['agreement']:g}{mark(task_bounds, 'agreement')}, mean KL <= {bounds['kl']:g}"
            f"{mark(task_bounds, 'kl')}")
