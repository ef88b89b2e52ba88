"""The tolerance policy: how close a target's result must be to the reference to count as the same.

    >>> from portkit.targets import specs, tolerance
    >>> tol = tolerance.tolerance_for(specs.get("tpu").default_precision)     # bf16 matmul operands
    >>> tol.dtype, tol.rtol, tol.atol
    ('bfloat16', 0.016, 1e-05)
    >>> tol.check(actual, expected)          # None, or assert_close's message on one line
    >>> tolerance.padding_tolerance(specs.get("tpu").default_precision)       # stage 3's padding check

Three decisions live here and nowhere else:
- DEFAULT_TOLERANCES: the (rtol, atol) per dtype a result is held to, torch.testing.assert_close's own
  defaults; a result is held to the lowest dtype its precision setting computes in (tolerance_for).
- DEFAULT_TASK_BOUNDS: the budget of each task metric (cosine, nearest-neighbour agreement, top-1
  agreement, KL, perplexity change; for pitch, the cents error and the voicing agreement; for a streamed
  state, the growth of its drift; for audio, SNR and SI-SDR floors in dB; discrete codes' agreement; probabilities'
  mean absolute error; detection boxes' IoU) and how many times the GPU baseline's own error a target may carry
  (baseline_factor); TASK_BOUND_REASONS says why each default is what it is. The task metrics decide a
  verdict; assert_close at the dtype tolerance is detail.
- padding_tolerance: what stage 3's padding check allows between a compiled bucket and the unpadded
  eager reference run under the same numerics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

# torch.testing.assert_close's defaults (its docstring's table); tests check they still match torch.
DEFAULT_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
                      "float64": (1e-7, 1e-7)}
# The budget of each task metric (lowest cosine, neighbour and top-1 agreement; highest mean KL and relative
# perplexity change) and the no-regression factor against the GPU baseline's own error.
DEFAULT_TASK_BOUNDS = {"cosine": 0.999, "neighbours": 0.9, "agreement": 0.99, "kl": 0.01, "perplexity": 0.01,
                       "cents": 10.0, "voicing": 0.99, "drift_growth": 2.0, "baseline_factor": 2.0,
                       "snr_db": 30.0, "si_sdr_db": 30.0, "codes": 0.95, "probability_mae": 0.01,
                       "box_iou": 0.95}
# a measurement above these fails; below the others
UPPER_BOUNDS = ("kl", "perplexity", "cents", "drift_growth", "baseline_factor", "probability_mae")
# budgets in decibels (floors >= 0); the other floors are shares in [0, 1]
DECIBEL_BOUNDS = ("snr_db", "si_sdr_db")
TASK_BOUND_REASONS = {
    "cosine": "lowest cosine of any embedding to the reference: 0.999 keeps similarity scores within 0.001 of "
              "today's, below the score gaps a ranking or a threshold acts on",
    "neighbours": "lowest mean share of each text's top-k nearest neighbours (over a corpus sample) that stay "
                  "the same: 0.9 allows one swap in ten among near-ties, what retrieval users do not notice",
    "agreement": "lowest share of decisions (top-1 label, greedy next token, a probability's side of its "
                 "threshold) equal to the reference's: 0.99",
    "kl": "highest mean KL(reference || target) of next-token distributions, in nats: 0.01",
    "perplexity": "highest relative change of the corpus perplexity: 0.01 (1%), below the run-to-run spread "
                  "of fine-tuning",
    "cents": "highest 95th-percentile absolute pitch error, in cents, on frames voiced in both runs: 10, a fifth "
             "of the 50-cent window within which raw pitch accuracy (mir_eval; CREPE's own evaluation) counts a "
             "frame as right, and half of one 20-cent CREPE bin",
    "voicing": "lowest share of frames whose voiced/unvoiced decision equals the reference's: 0.99",
    "drift_growth": "highest ratio of a streamed state's median error (carried, over one step's error at the same "
                    "chunk) over a real stream's second half to its median over the first quarter: 2; an error that "
                    "accumulates across steps (the classic recurrent failure) keeps growing with the stream's "
                    "length, a bounded one stays within its own spread",
    "baseline_factor": "a target whose error against float64 is within this many times the GPU setup's own "
                       "error is no regression against today's deployment: 2",
    "snr_db": "lowest SNR of any recording against the reference, in dB, over real samples: 30 (portkit's choice), "
              "20 dB below the ~50 dB that one rounding of the output to bfloat16 leaves (8 significant bits; the "
              "quantization-noise rule 6.02 N + 1.76 dB for N bits, Bennett 1948, which also puts 16-bit PCM at "
              "~98 dB, beyond any bf16 pipeline), so a bf16 decoder of some depth passes and an error near the "
              "signal's own power (a broken op, ~0 dB) fails",
    "si_sdr_db": "lowest scale-invariant SDR (Le Roux et al. 2019, 'SDR - half-baked or well done?') of any "
                 "recording, in dB: 30, the SNR's floor; a gain change alone lowers the SNR but not the SI-SDR, so "
                 "the two together say whether the target changed the loudness or the waveform",
    "codes": "lowest share of discrete codes (VQ codebook indices, CTC labels) equal to the reference's: 0.95 "
             "(portkit's choice); a code whose encoder output lies near a tie between two codebook entries flips "
             "under any rounding, and residual VQ carries one flipped code into the later codebooks of its frame, "
             "so exact agreement is not to be expected; declare the decoded output too to judge what is heard",
    "probability_mae": "highest mean absolute error of probabilities in [0, 1]: 0.01, about the expected "
                       "calibration error temperature scaling leaves (Guo et al. 2017, 'On Calibration of Modern "
                       "Neural Networks'), so the target moves the probabilities less than they were off already",
    "box_iou": "lowest IoU of any detection box with the reference's box for the same query: 0.95 (portkit's "
               "choice), the strictest IoU threshold of COCO's detection metric (AP@[.50:.05:.95], "
               "https://cocodataset.org/#detection-eval): each box stays as close to the reference's as COCO's "
               "strictest match requires of a box and its ground truth",
}
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
            return self._missed("; ".join(lines[1:] or lines))
        return None

    def misses(self, shape) -> Misses:
        """check() over a tensor of `shape` taken a piece at a time (Misses.add each piece, in order)."""
        return Misses(self, tuple(shape))

    def _missed(self, detail: str) -> str:
        return f"not within {self.dtype} tolerance (rtol {self.rtol:g}, atol {self.atol:g}): {detail}"

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "rtol": self.rtol, "atol": self.atol, "check": "torch.testing.assert_close"}


@dataclass
class Misses:
    """Tolerance.check on a tensor too large to compare whole, taken as consecutive pieces of its rows: assert_close's
    rule (torch.isclose at rtol and atol, NaN never close) on each piece, and where elements miss, its message's
    facts over the whole (how many of how many; the greatest absolute and relative difference among the misses, the
    first where they tie, at its index in the whole tensor) in its words. Memory: one piece's, not the tensor's.

        >>> misses = tol.misses(whole.shape)
        >>> for a, e in zip(whole.split(1000), expected.split(1000)):
        ...     misses.add(a, e)
        >>> misses.reason()          # what tol.check(whole, expected) says: None where every element is close
    """
    tol: Tolerance
    shape: tuple
    seen: int = 0
    missed: int = 0
    greatest: dict = field(default_factory=dict)     # "absolute" / "relative" -> (difference, flat index)

    def add(self, actual: torch.Tensor, expected: torch.Tensor) -> None:
        """The next piece: `actual` and `expected` of one dtype and shape."""
        matches = torch.isclose(actual, expected, rtol=self.tol.rtol, atol=self.tol.atol, equal_nan=False)
        missed = matches.numel() - int(matches.sum())
        if missed:   # torch.testing's make_tensor_mismatch_msg: differences in the tensors' dtype, misses only
            a, e, hit = actual.flatten(), expected.flatten(), matches.flatten()
            if not a.dtype.is_floating_point and not a.dtype.is_complex:
                a, e = a.to(torch.int64), e.to(torch.int64)
            diff = torch.abs(a - e)
            diff[hit] = 0
            self._keep("absolute", diff)
            rel = diff / torch.abs(e)
            rel[hit] = 0
            self._keep("relative", rel)
        self.seen += matches.numel()
        self.missed += missed

    def _keep(self, kind: str, diff: torch.Tensor) -> None:
        value, index = torch.max(diff, 0)     # the first greatest; NaN is greatest
        value = value.item()
        best = self.greatest.get(kind)
        if best is None or (value != value and best[0] == best[0]) or value > best[0]:
            self.greatest[kind] = (value, self.seen + int(index))

    def _index(self, flat: int) -> tuple:
        index = []
        for size in self.shape[::-1]:
            flat, rest = divmod(flat, size)
            index.append(rest)
        return tuple(index[::-1])

    def reason(self) -> str | None:
        """None where every element was close; else Tolerance.check's words for the whole tensor."""
        if not self.missed:
            return None
        exact = self.tol.rtol == 0 and self.tol.atol == 0
        lines = [f"Mismatched elements: {self.missed} / {self.seen} ({self.missed / self.seen:.1%})"]
        for kind, allowed in (("absolute", self.tol.atol), ("relative", self.tol.rtol)):
            value, flat = self.greatest[kind]
            lines.append(f"Greatest {kind} difference: {value} at index {self._index(flat)}"
                         + ("" if exact else f" (up to {allowed} allowed)"))
        return self.tol._missed("; ".join(lines))


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


# An emulated target at a precision that rounds nothing computes what the CPU's float32 computes: its error's ratio
# to the GPU baseline's is the order two graphs sum in, never a figure about the target's hardware (stage 4's
# texts of the ratio and the report's).
FLOAT32_ON_CPU = ("float32 on this CPU (emulated, nothing rounded: the ratio is the order the graphs sum in, "
                  "nothing about the target's hardware; measure on the device)")


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
    budgets = ", ".join(f"{k} {'<=' if k in UPPER_BOUNDS else '>='} {v:g}{mark(task_bounds, k)}"
                        for k, v in bounds.items())
    pairs = ", ".join(f"{name} ({rtol:g}, {atol:g}){mark(tolerances, name)}"
                      for name, (rtol, atol) in effective(tolerances).items())
    return (f"task budgets (they decide the verdict): {budgets}\n"
            f"element-wise detail, tolerance (rtol, atol) by compute dtype, torch.testing.assert_close: {pairs}")


def within(key: str, value: float, bounds: dict) -> bool:
    """Whether a task metric's measurement lies inside its budget (DEFAULT_TASK_BOUNDS merged with overrides)."""
    return value <= bounds[key] if key in UPPER_BOUNDS else value >= bounds[key]


def budget_text(key: str, bounds: dict) -> str:
    """A budget in words, e.g. 'budget >= 0.999': what the report prints next to the measurement."""
    return f"budget {'<=' if key in UPPER_BOUNDS else '>='} {bounds[key]:g}{' dB' if key in DECIBEL_BOUNDS else ''}"
