"""Stage 4's settings: the notebook's options (checked), what check_accuracy measures beyond them, and its sizes.

    >>> from portkit.stages.accuracy import settings
    >>> opts = settings.Options.of({"batch_size": 4})     # notebooks/04_accuracy.py's parameters, checked
    >>> settings.Scope(layers=False).judged_compiled()     # the API's and the tests' settings
    >>> settings.BucketBoundaries([32, 64], "parameter")

Every size portkit sets for the stage (the task sample, the buckets checked) is owned here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from portkit.core import checks
from portkit.core.errors import BadParameter
from portkit.stages import options
from portkit.stages.accuracy import footprint
from portkit.stages.accuracy.target_runs import compiled_available
from portkit.targets import numerics
from portkit.targets import specs
from portkit.targets.tolerance import DECIBEL_BOUNDS, DEFAULT_TASK_BOUNDS, DEFAULT_TOLERANCES, UPPER_BOUNDS

DEFAULT_BUCKETS = (32, 64, 128)
# Buckets checked per target: a plan of more (an auto plan for a cheap compiler) is sampled, spread over its
# boundaries with the largest included; the rest are listed as not checked.
MAX_CHECKED_BUCKETS = 8
NEIGHBOURS = 5           # k of top-k nearest-neighbour agreement
# The task sample: the items the task metrics are decided on, drawn from the user's corpus (else real image crops),
# at most TASK_ITEMS, run in batches of TASK_BATCH; the main batch keeps the element-wise and per-layer detail.
# Perfect agreement on n items puts the Wilson 95% lower bound, n / (n + 1.96^2), above the default agreement
# budget of 0.99 only from n = 381: the sample is 400 items (Scope.task_items changes it), the same on every host
# and every run, so a verdict does not depend on the machine's speed.
TASK_ITEMS = 400
# Where the chosen precision's interval straddles its budget on that sample and the data holds more, the sample grows
# once, to every item the data holds up to TASK_ITEMS_MAX (Scope.task_items_max changes it): portkit's cap, so a
# pass stays minutes on a CPU. At 2,000 items a rate of 0.995 (half a 0.99 budget's allowance from it) has a Wilson
# 95% interval of [0.991, 0.997], wholly inside the budget; a rate closer to the budget needs more than any cap.
TASK_ITEMS_MAX = 2000
TASK_BATCH = 32
REFERENCE_BYTES = 256 * 2**20   # reference outputs kept (task-sample passes; buckets) up to this, recomputed beyond


@dataclass
class BucketBoundaries:
    boundaries: list[int]
    source: str
    batch: int | None = None   # rows per compiled call (the plan's largest batch bucket); None: the whole batch

    def __str__(self) -> str:
        rows = f", compiled batch {self.batch}" if self.batch else ""
        return f"buckets {self.boundaries} ({self.source}{rows})"


# ---------------------------------------------------------------- the stage's options


def _new_tokens(name: str, value) -> int:
    return checks.positive_int(name, value, maximum=512)


def _dict_of(name: str, value, hint: str) -> None:
    if not isinstance(value or {}, dict):
        raise BadParameter(name, value, hint=f"give a dict of {hint}")


def _precision(name: str, value):
    """{target: precision name}: each one of that target's precisions."""
    _dict_of(name, value, "target name -> precision name, e.g. {'tpu': 'highest'}")
    for target, chosen in (value or {}).items():
        specs.get(target).precision(chosen)
    return value


def _tolerances(name: str, value):
    """{compute dtype: [rtol, atol]}, two numbers >= 0 for a dtype of tolerance.DEFAULT_TOLERANCES."""
    _dict_of(name, value, "dtype -> [rtol, atol]")
    for dtype, pair in (value or {}).items():
        checks.choice("tolerance dtype", dtype, DEFAULT_TOLERANCES)
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in pair)):
            raise BadParameter(f"tolerance for {dtype}", pair, hint="give [rtol, atol], two numbers >= 0")
    return value


def _task_bounds(name: str, value):
    """{bound: value} for bounds of tolerance.DEFAULT_TASK_BOUNDS: shares (cosine, agreement, codes) in [0, 1],
    floors in dB (snr_db, si_sdr_db) and ceilings (kl, perplexity, probability_mae) >= 0, baseline_factor >= 1."""
    _dict_of(name, value, f"with keys {', '.join(DEFAULT_TASK_BOUNDS)}")
    for key, bound in (value or {}).items():
        checks.choice("task bound", key, DEFAULT_TASK_BOUNDS)
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound < 0 or \
                (key not in UPPER_BOUNDS + DECIBEL_BOUNDS and bound > 1) or (key == "baseline_factor" and bound < 1):
            raise BadParameter(f"task bound {key}", bound, hint="cosine and agreement lie in [0, 1], as do "
                               "neighbours, voicing and codes; kl, perplexity, cents, drift_growth and "
                               "probability_mae are >= 0; snr_db and si_sdr_db are floors in dB, >= 0; "
                               "baseline_factor is >= 1")
    return value


def bucket_boundaries(name: str, value):
    """Bucket boundaries: ascending, distinct sequence lengths; None (the notebook's default): DEFAULT_BUCKETS."""
    if value is None:
        return value
    if not isinstance(value, (list, tuple)) or not value:
        raise BadParameter(name, value, hint="give a list of sequence lengths, e.g. [16, 32]")
    for boundary in value:
        checks.positive_int("bucket boundary", boundary, maximum=checks.MAX_SEQ)
    if list(value) != sorted(set(value)):
        raise BadParameter(name, value, hint="boundaries must be ascending and distinct")
    return value


class Options(options.StageOptions):
    """Stage 4's options: the parameters cell of notebooks/04_accuracy.py, each field checked."""
    NOTEBOOK = "04_accuracy.ipynb"
    CHECKS = {"corpus": options.check_corpus, "text_column": checks.text, "batch_size": checks.up_to(checks.MAX_BATCH),
              "seq_len": checks.up_to(checks.MAX_SEQ), "seed": checks.seed, "precision": _precision,
              "tolerances": _tolerances, "task_bounds": _task_bounds,
              "gpu_numerics": checks.one_of(numerics.GPU_NUMERICS), "default_buckets": bucket_boundaries,
              "workload": checks.one_of(checks.WORKLOADS), "new_tokens": _new_tokens,
              "train_steps": checks.up_to(checks.MAX_STEPS)}

    @property
    def bounds(self) -> dict:
        """The verdict's budgets: task_bounds over tolerance.DEFAULT_TASK_BOUNDS."""
        return {**DEFAULT_TASK_BOUNDS, **(self.task_bounds or {})}


@dataclass(frozen=True)
class Scope:
    """What check_accuracy measures beyond the notebook's options, and how it runs (the API's and the tests'
    settings; the notebook runs the defaults)."""
    all_precisions: bool = True      # each target's other precisions too (natively: only the one in effect)
    layers: bool = True              # per-layer hooks: the first module out of tolerance
    float64_reference: bool = True   # the model in float64 as a second reference
    compiled: bool | None = None     # the chosen precision judged compiled by its backend; None: when present
    compiled_buckets: bool = False   # emulated buckets compiled too (see check_accuracy)
    emulation: Callable = numerics.emulate   # the eager numerics; tests pass numerics.wrong_op_TESTING_ONLY(...)
    progress: bool = True            # progress bars
    task_items: int = TASK_ITEMS     # the task sample: items of the corpus the task metrics are decided on
    task_items_max: int = TASK_ITEMS_MAX   # what the sample grows to where its interval straddles the budget
    pass_bytes: int | None = None    # activation bytes one task-sample pass may take; None: footprint.pass_budget()

    def __post_init__(self) -> None:
        for name in ("all_precisions", "layers", "float64_reference", "compiled_buckets", "progress"):
            checks.boolean(name, getattr(self, name))
        checks.positive_int("task_items", self.task_items)
        checks.positive_int("task_items_max", self.task_items_max)
        if self.pass_bytes is not None:
            checks.positive_int("pass_bytes", self.pass_bytes)
        if self.task_items_max < self.task_items:
            raise BadParameter("task_items_max", self.task_items_max,
                               hint=f"at least task_items ({self.task_items}): the sample only grows")
        if self.compiled and self.emulation is not numerics.emulate:
            raise BadParameter("compiled", self.compiled,
                               hint=f"{self.emulation.__name__} runs eagerly only; pass compiled=False")

    def pass_budget(self) -> int:
        """Bytes of activations one task-sample pass may take: pass_bytes, else portkit's (footprint.pass_budget)."""
        return self.pass_bytes if self.pass_bytes is not None else footprint.pass_budget()

    def judged_compiled(self) -> bool:
        """`compiled`; None: whether stage 2's backends are present (and the emulation is the targets' own)."""
        if self.compiled is None:
            return compiled_available() and self.emulation is numerics.emulate
        return self.compiled
