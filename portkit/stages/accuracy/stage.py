"""Stage 4, accuracy: the target's numerics against a reference, per output, per bucket and per layer.

    >>> opts = accuracy.Options.of({"batch_size": 4})             # notebooks/04_accuracy.py's parameters, checked
    >>> inputs, described = data.example_batch(model, corpus, opts.batch_size, opts.seq_len)
    >>> plan = accuracy.bucket_plan("runs/minilm", ["tpu"])      # stage 3's buckets.json, else [32, 64, 128]
    >>> report = accuracy.check_accuracy(model, inputs, ["tpu"], opts, corpus=corpus, buckets=plan)
    >>> print(report); report.plot(); report.save("runs/minilm/accuracy.json")

Reference: the model eager on the CPU as written, and a float64 copy (how far float32 is from exact). Target:
the device natively; emulated, the CPU under `numerics.emulate(target, precision)`. The verdict is the task's:
each output kind's task metrics (comparison.TASK_METRICS) within their budgets (`task_bounds`), or an error
against float64 within `baseline_factor` times that of today's GPU setup (`gpu_numerics`: measured on the GPU
where one is present, else emulated).
`torch.testing.assert_close` at the dtype's tolerance is detail; only real positions count (the mask). Per
layer, hooks name the first module out of tolerance; float64 run as float32 is split from the rounding. A
target whose compiler refuses the model is judged in eager emulation, the refusal a blocker finding.

The parts: tolerances portkit/targets/tolerance.py; comparisons comparison.py; per-layer hooks localize.py;
how each target side runs target_runs.py; the result, tables, plots and suggestions result.py. This module:
the stage's options, its verb, the reference set-up and the bucket batches it checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from portkit.corpora import images
from portkit.models import registry
from portkit.models.inputs import BATCH
from portkit.targets import gpu_baseline, numerics
from portkit.core import checks
from portkit.core import progress as progress_bars
from portkit.runfolder import results
from portkit.stages import options
from portkit.stages.accuracy import padding_side, target_runs
from portkit.targets import specs
from portkit.stages.accuracy.result import (CAST_CAUSE, MAIN_BATCH, TASK_SAMPLE, AccuracyReport, PrecisionResult,
                                            TargetAccuracy, main_path,
                                            against_baseline, suggest)
from portkit.stages.accuracy import sample as stats
from portkit.stages.accuracy.comparison import (check, compare, finish, item_values, join_values, neighbour_shares,
                                                primary_output, shape_mismatch, summarize, task_metrics, unmeasured)
from portkit.core.errors import BadParameter
from portkit.stages.accuracy.localize import LayerProbe, layer_summary
from portkit.stages.accuracy.target_runs import EAGER, TargetSide, compiled_available
from portkit.targets.tolerance import (DECIBEL_BOUNDS, DEFAULT_TASK_BOUNDS, DEFAULT_TOLERANCES, UPPER_BOUNDS, rounds,
                                       tolerance_for)

DEFAULT_BUCKETS = (32, 64, 128)
_BUCKET_POOL = 512       # texts sampled and tokenized to fill the buckets
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
REFERENCE_BYTES = 256 * 2**20   # reference outputs kept for every pass up to this, recomputed beyond (LM logits)


# ---------------------------------------------------------------- per layer, alone
def localize(model, inputs: dict[str, torch.Tensor], target: str, precision=None, tolerances=None,
             emulation=numerics.emulate) -> dict:
    """Per-layer localization alone: one reference pass that keeps every module's output, one target
    pass compared module by module. Returns layer_summary(); check_accuracy shares its reference pass."""
    detected = specs.detect(target)
    chosen = detected.target.precision(precision) if isinstance(precision, str) else \
        precision or detected.target.default_precision
    tol = tolerance_for(chosen, tolerances)
    probe = LayerProbe(model.module.eval(), _mask(model, inputs))
    probe.capture(lambda: model.module(**inputs))
    side = TargetSide(detected, model.module, emulation, False)
    _, rows, reason, _, _ = side.run(inputs, chosen, probe, tol)
    return layer_summary(rows, reason, tol, chosen, side.label(False))


# ---------------------------------------------------------------- buckets
@dataclass
class BucketBoundaries:
    boundaries: list[int]
    source: str
    batch: int | None = None   # rows per compiled call (the plan's largest batch bucket); None: the whole batch

    def __str__(self) -> str:
        rows = f", compiled batch {self.batch}" if self.batch else ""
        return f"buckets {self.boundaries} ({self.source}{rows})"


def bucket_plan(out_dir, targets, default=None) -> dict[str, BucketBoundaries]:
    """Per target: stage 3's chosen boundaries from out_dir/buckets.json when present, else `default`
    (None: DEFAULT_BUCKETS). A damaged buckets.json raises results.UnreadableResult, naming the file and what is
    wrong."""
    saved = results.read_buckets(out_dir) if out_dir is not None else None
    plans = {}
    for name in specs.parse_targets(targets):
        chosen = saved.chosen.get(name) if saved is not None else None
        if chosen is not None:   # a plan without batch buckets calls its graphs one row at a time
            plans[name] = BucketBoundaries(list(chosen.boundaries),
                                           f"stage 3, {saved.path.name} planner {chosen.planner}",
                                           max(chosen.batch_sizes or (1,)))
        else:
            plans[name] = BucketBoundaries(list(default or DEFAULT_BUCKETS), "parameter (no buckets.json from stage 3"
                                           + (f" for {name})" if saved else ")"))
        print(f"target {name}: {plans[name]}")
    return plans


def _bucket_batches(model, corpus, boundaries, batch_size, seed):
    """Real texts for each bucket: those whose token length falls in (previous boundary, boundary];
    the last bucket also takes longer texts, truncated to it as the target would."""
    pool = corpus.sample(min(len(corpus), _BUCKET_POOL), seed)
    sized = list(zip(pool, model.token_lengths(pool)))
    low = 0
    for i, high in enumerate(boundaries):
        last = i == len(boundaries) - 1
        chosen = [(t, n) for t, n in sized if n > low and (n <= high or last)][:batch_size]
        yield low, high, [t for t, _ in chosen], sum(n > high for _, n in chosen)
        low = high


def _rows_like(inputs: dict, other: dict) -> bool:
    """Whether `other`'s rows have the shapes of `inputs`' rows (the same inputs, one row for another)."""
    return set(inputs) == set(other) and all(tuple(inputs[k].shape[1:]) == tuple(other[k].shape[1:]) for k in inputs)


def _mask(model, inputs: dict):
    """The real positions along the model's varying dimension (its declaration's mask), or None."""
    return model.declaration.real_mask(inputs, model.seq_dim) if model.seq_dim else None


def _main(model, outputs) -> str:
    """The output judged by its task metric: the declaration's primary one (else the kind's)."""
    declared = model.declaration.primary.name
    return declared if declared in outputs else primary_output(model.declaration.primary.metric, outputs)


def _key(items) -> tuple:
    """A batch of items as a cache key: texts by value, other items (arrays) by identity within the run."""
    return tuple(t if isinstance(t, str) else id(t) for t in items)


def _unpadded(model, inputs: dict, padding_side: str) -> dict:
    """The same batch at its own longest length, as an eager GPU run sees it (no bucket padding)."""
    longest = max(model.declaration.real_lengths(inputs)[model.seq_dim])
    if padding_side == "right":
        return model.declaration.fit(inputs, {model.seq_dim: longest}, pad=False)
    return {k: v[:, -longest:] for k, v in inputs.items()}      # a tokenizer that pads on the left


def _align(target_out: torch.Tensor, ref_out: torch.Tensor, padding_side: str) -> torch.Tensor:
    """A bucket-padded output cut to the reference's length (the padding positions dropped)."""
    if target_out.dim() >= 2 and ref_out.dim() >= 2 and target_out.shape[1] != ref_out.shape[1]:
        n = ref_out.shape[1]
        return target_out[:, :n] if padding_side == "right" else target_out[:, -n:]
    return target_out


# ---------------------------------------------------------------- how each target runs
def target_side(targets, compiled: bool | None = None) -> bool:
    """Decide (None: compiled when stage 2's backends are present) and print how each target runs."""
    compiled = compiled_available() if compiled is None else compiled
    for name in specs.parse_targets(targets):
        d = specs.detect(name)
        main = target_runs.compiled_label(d) if compiled else ("eager on the device" if d.native else EAGER)
        print(f"target {name}: outputs and buckets {main}; per-layer hooks and other precisions: "
              f"{'eager on the device' if d.native else EAGER}")
    return compiled



# ---------------------------------------------------------------- the stage's options
def _corpus(name: str, value) -> str:
    from portkit.corpora import corpus as data
    return data.check_corpus(value)


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


def _boundaries(name: str, value):
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
    CHECKS = {"corpus": _corpus, "text_column": checks.text, "batch_size": checks.up_to(checks.MAX_BATCH),
              "seq_len": checks.up_to(checks.MAX_SEQ), "seed": checks.seed, "precision": _precision,
              "tolerances": _tolerances, "task_bounds": _task_bounds,
              "gpu_numerics": checks.one_of(numerics.GPU_NUMERICS), "default_buckets": _boundaries,
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

    def __post_init__(self) -> None:
        for name in ("all_precisions", "layers", "float64_reference", "compiled_buckets", "progress"):
            checks.boolean(name, getattr(self, name))
        checks.positive_int("task_items", self.task_items)
        checks.positive_int("task_items_max", self.task_items_max)
        if self.task_items_max < self.task_items:
            raise BadParameter("task_items_max", self.task_items_max,
                               hint=f"at least task_items ({self.task_items}): the sample only grows")
        if self.compiled and self.emulation is not numerics.emulate:
            raise BadParameter("compiled", self.compiled,
                               hint=f"{self.emulation.__name__} runs eagerly only; pass compiled=False")

    def judged_compiled(self) -> bool:
        """`compiled`; None: whether stage 2's backends are present (and the emulation is the targets' own)."""
        if self.compiled is None:
            return compiled_available() and self.emulation is numerics.emulate
        return self.compiled


# ---------------------------------------------------------------- the stage's verb
def check_accuracy(model, inputs: dict[str, torch.Tensor], targets=("neuron", "tpu"), options: Options | None = None,
                   *, corpus=None, buckets=None, description: str | None = None,
                   scope: Scope | None = None) -> AccuracyReport:
    """Compare every target's numerics with the float32 (and float64) reference on `inputs`.

    model: a portkit.models.registry.LoadedModel; inputs: the dict its encode() returns.
    options: the notebook's parameters (Options.of(...); None: Options.defaults()): each target's precision
    (one not named uses its default), tolerances, task_bounds, gpu_numerics (how the model runs on the GPU
    today, the baseline: each result's error against float64 is a ratio to that setup's own, emulated on
    the CPU), and the batch_size and seed of each bucket's batch.
    corpus: what the bucket batches and the neighbour sample are drawn from. buckets: bucket_plan()'s result,
    or one list of boundaries for every target (None: options.default_buckets, else DEFAULT_BUCKETS); they
    need `corpus`. description: the batch, in words. scope: what is measured and how (None: Scope()).

    The chosen precision is judged with the model compiled by the target's backend (stage 2's emulated one)
    where scope.compiled says so (None: when those backends are present). The other precisions and the
    per-layer hooks run eagerly (hooks cannot see inside a compiled graph); every result says which. Emulated
    buckets run in eager emulation padded to the bucket unless scope.compiled_buckets: the compiled graph
    applies the same numerics rules op by op (the chosen precision's compiled_vs_eager measures it on the
    main batch), and stage 3 compiled every bucket and checked its padded outputs against unpadded eager ones
    under the target's numerics. Natively, the vendor's compiler compiles every bucket.
    """
    options = options if options is not None else Options.defaults()
    scope = scope if scope is not None else Scope()
    names = specs.parse_targets(targets)
    plans = _plans(buckets, options, names)
    ref = Reference.build(model, inputs, options, scope, corpus)
    steps = sum(1 + (len(specs.get(n).precisions) - 1) * scope.all_precisions for n in names) + \
        (sum(len(plans[n].boundaries) for n in names) if corpus is not None and model.seq_dim else 0)
    bar = progress_bars.bar(total=steps, desc="accuracy", unit="pass", disable=not scope.progress)
    shared = target_runs.SharedCompile.for_targets(ref.module, names, options.precision, ref.compiled)
    per_target = {name: _check_target(ref, name, plans[name], shared, bar) for name in names}
    bar.close()
    return _report(ref, per_target, description)


def _plans(buckets, options: Options, names: list[str]) -> dict[str, BucketBoundaries]:
    """Per target: bucket_plan()'s result as given, else the one list of boundaries for every target."""
    if isinstance(buckets, dict):
        return buckets
    boundaries = _boundaries("buckets", list(buckets or options.default_buckets or DEFAULT_BUCKETS))
    return {n: BucketBoundaries(list(boundaries), "parameter") for n in names}


# ---------------------------------------------------------------- (a) the reference, shared by every target
@dataclass
class Reference:
    """What every target is held against: the model's own outputs on the batch (float32 as written, and in
    float64), today's GPU setup on it, the corpus sample for neighbour agreement, and each bucket's batch
    at its own length with its reference and baseline (computed once, for every target)."""
    model: object
    inputs: dict
    options: Options
    scope: Scope
    corpus: object
    compiled: bool                   # the chosen precision judged compiled (Scope.judged_compiled)
    mask: torch.Tensor | None        # the real positions
    probe: LayerProbe | None         # the per-layer reference activations
    outputs: dict                    # eager on the CPU, as written
    wide: bool                       # the model computes in float64: it is its own float64 reference
    float64: target_runs.Float64Reference
    outputs64: dict | None           # the float64 copy's outputs (None: not run)
    note64: str
    main: str                        # the output judged by the task metric
    baseline: dict = field(default_factory=dict)
    sample: TaskSample | None = None   # the items the task metrics are decided on (None: the main batch)
    buckets: dict = field(default_factory=dict)

    @classmethod
    def build(cls, model, inputs: dict, options: Options, scope: Scope, corpus=None) -> Reference:
        compiled = scope.judged_compiled()
        module = model.module.eval()
        mask = _mask(model, inputs)
        probe = LayerProbe(module, mask, scope.progress) if scope.layers else None
        out = probe.capture(lambda: module(**inputs)) if probe else target_runs.forward(module, inputs)
        wide = target_runs.float64_model(module)
        float64 = target_runs.Float64Reference(module)
        out64, note64 = float64(inputs) if scope.float64_reference and not wide else \
            (None, "the reference is the float64 model itself" if wide else "not requested")
        ref = cls(model=model, inputs=inputs, options=options, scope=scope, corpus=corpus, compiled=compiled,
                  mask=mask, probe=probe, outputs=out, wide=wide, float64=float64, outputs64=out64, note64=note64,
                  main=_main(model, out))
        ref.baseline = _baseline(module, inputs, out, ref.truth, ref.main, mask, options)
        ref.sample = TaskSample.build(model, corpus, inputs, options.seed, scope.task_items, scope.task_items_max)
        return ref

    @property
    def module(self) -> torch.nn.Module:
        return self.model.module

    @property
    def kind(self) -> str:
        return self.model.declaration.primary.metric

    @property
    def truth(self) -> dict | None:
        """The float64 reference: the model's own, or the float64 copy's; None: not run."""
        return self.outputs if self.wide else self.outputs64

    def bucket(self, high: int, texts: list, padded: dict, padding_side: str) -> tuple:
        """A bucket's batch at its own longest length (as an eager GPU run sees it), its reference, its GPU
        baseline and the truth that baseline is measured against (float64 as for the main batch)."""
        key = (high, _key(texts), padding_side)
        if key not in self.buckets:
            plain = _unpadded(self.model, padded, padding_side)
            out = target_runs.forward(self.module, plain)
            wide = out if self.wide else self.float64(plain)[0] if self.truth is not None else None
            baseline = _baseline(self.module, plain, out, wide, self.main, _mask(self.model, plain), self.options)
            self.buckets[key] = (plain, out, baseline, wide if wide is not None else out)
        return self.buckets[key]

    def task(self, out: torch.Tensor, side: TargetSide, precision, compiled: bool = False,
             batch: int | None = None, sampled: bool = True) -> dict:
        """The output kind's task metrics, each check with its n and 95% interval: over the task sample where there
        is one and `sampled` (the precision judged; run on `side` at `precision`, compiled where `compiled` and the
        sample's rows have the main batch's shape, in calls of `batch` rows), else over the main batch's outputs
        `out`. Embeddings add top-k neighbour agreement over the sample."""
        bounds, unit = self.options.bounds, self.unit
        if self.sample is None or not sampled:
            found = task_metrics(self.kind, out, self.outputs[self.main], self.mask, bounds, self.inputs, unit,
                                 self.main)
            rows = len(next(iter(self.inputs.values())))
            why = "no corpus given" if self.sample is None else "the task sample decides the precision judged only"
            found["sample"] = {"items": rows, "of": rows, "source": "the main batch", "run": side.label(compiled),
                               "text": f"the main batch ({rows} {self.model.declaration.items}; {why})"}
            return found
        found = self._sampled(side, precision, compiled, batch)
        grown = self.sample.grown() if found.get("decision") == stats.INCONCLUSIVE else None
        # undecided on the sample and the data holds more: decide on all of it (to the cap); the grown sample stays,
        # so the targets judged after this one are decided on it too
        if grown is not None:
            straddled = f"{len(self.sample.items):,}: {found['reason']}"
            self.sample = grown
            found = self._sampled(side, precision, compiled, batch)
            found["sample"]["grown_from"] = straddled
            found["sample"]["text"] += f"; grown from {straddled}"
        return found

    def _sampled(self, side: TargetSide, precision, compiled: bool, batch: int | None) -> dict:
        """The task metrics over the task sample (see task), its words under "sample"."""
        bounds, unit = self.options.bounds, self.unit
        values, described = self.sample.run(self, side, precision, compiled, batch)
        if values is None:      # a batch of the sample came out in another shape than the reference's
            return {**unmeasured(self.kind, described["shape_mismatch"], self.main), "sample": described}
        found = summarize(self.kind, values, bounds, unit)
        if self.kind == registry.EMBEDDING and len(values["cosine"]) > NEIGHBOURS:
            shares = neighbour_shares(values["actual"], values["expected"], NEIGHBOURS)
            found["neighbour_agreement"] = shares.mean().item()
            # the k decisions of one item are not independent: a bootstrap over the items, not a Wilson interval
            found["checks"].append(check("neighbours", f"top-{NEIGHBOURS} nearest-neighbour agreement within the "
                                         "sample", found["neighbour_agreement"], bounds,
                                         len(shares), stats.bootstrap(shares, stats.MEAN), unit))
            found = finish(found, found["checks"])
        found["sample"] = described
        return found

    @property
    def unit(self) -> str:
        return _unit(self.model, self.kind)


def _unit(model, kind: str) -> str:
    """What an output kind's task metrics count: the declaration's items, or tokens for a per-token classifier."""
    return "tokens" if kind == registry.TOKEN_CLASSIFIER else model.declaration.items


@dataclass
class TaskSample:
    """The task sample: Scope.task_items items of the user's data (all it holds where fewer), in batches of
    TASK_BATCH (encoded when a pass reaches them), each with its reference output (kept up to REFERENCE_BYTES, else
    recomputed a pass); grown (grown()) to all the data holds, up to Scope.task_items_max, where undecided."""
    items: list
    encode: Callable                     # a list of items -> the model's inputs
    source: str
    fixed_rows: bool                     # every row has the main batch's shape: compiled calls reuse its graphs
    expected: list = field(default_factory=list)   # per batch: the reference's main output, or None
    draw: Callable | None = None         # n -> n items of the data (a larger sample), None: made up, it does not grow
    pool: int | None = None              # the items the data holds (None: no data, made-up items)
    cap: int = TASK_ITEMS_MAX            # what the sample grows to at most (Scope.task_items_max)

    @classmethod
    def build(cls, model, corpus, inputs: dict, seed: int, first: int, cap: int = TASK_ITEMS_MAX) -> TaskSample | None:
        """The sample from `corpus` when its items are the model's kind (text models: padded to the main batch's
        length), else real image crops for an image model; None where there is no data beyond the main batch."""
        if corpus is not None and len(corpus) and isinstance(corpus.texts[0], str) == model.takes_text:
            pool, source = len(corpus), corpus.name

            def draw(n):
                return corpus.sample(n, seed)
        elif model.declaration.data == "image" and model.image_size and _rows_like(inputs, model.encode(
                images.sample_images(1, model.image_size, seed))):      # the main batch is crops too

            def crops(ids):     # made when a pass reaches them: a thousand crops at once would not fit lightly
                return model.encode(images.sample_images(len(ids), model.image_size, seed + 1 + ids[0]))
            # crops are no user data: the sample does not grow on them (the advice is to give a folder)
            return cls(list(range(first)), crops, "real image crops (no folder of images given)", True, cap=cap)
        else:
            return None
        tokens = model.seq_dim == "tokens" and "attention_mask" in inputs
        length = model.declaration.size_of(inputs, model.seq_dim) if tokens else None
        return cls(draw(min(pool, first)), lambda chunk: model.encode(chunk, pad_to=length) if tokens else
                   model.encode(chunk), source, model.seq_dim in (None, "tokens"), draw=draw, pool=pool, cap=cap)

    def grown(self) -> TaskSample | None:
        """The sample grown to every item the data holds up to `cap`; None where it holds no more than this."""
        if self.draw is None or min(self.cap, self.pool) <= len(self.items):
            return None
        n = min(self.cap, self.pool)
        return TaskSample(self.draw(n), self.encode, self.source, self.fixed_rows, draw=self.draw, pool=self.pool,
                          cap=self.cap)

    def why(self) -> str:
        """Why the sample holds the items it does, in words."""
        n = len(self.items)
        if self.draw is None:
            return "portkit's sample size (Scope.task_items) of crops made for the check; it grows only on your data"
        if n >= self.pool:
            return f"all {self.pool:,} the data holds"
        held = f"of the {self.pool:,} the data holds"
        if n >= self.cap:
            return f"{held}: portkit's cap on a grown sample (Scope.task_items_max, {self.cap:,})"
        return (f"{held}: portkit's first sample (Scope.task_items), where perfect agreement clears a 0.99 budget; "
                f"it grows to {self.cap:,} at most where an interval straddles its budget")

    @property
    def batches(self) -> int:
        return -(-len(self.items) // TASK_BATCH)

    def batch(self, i: int) -> dict:
        return self.encode(self.items[i * TASK_BATCH:(i + 1) * TASK_BATCH])

    def reference(self, ref: Reference, i: int) -> torch.Tensor:
        """Batch i's reference main output (the model as written, eager on the CPU)."""
        if i < len(self.expected) and self.expected[i] is not None:
            return self.expected[i]
        out = target_runs.forward(ref.module, self.batch(i))[ref.main]
        kept = sum(e.numel() * e.element_size() for e in self.expected if e is not None)
        if i == len(self.expected):
            self.expected.append(out if kept + out.numel() * out.element_size() <= REFERENCE_BYTES else None)
        return out

    def run(self, ref: Reference, side: TargetSide, precision, compiled: bool, batch: int | None) -> tuple:
        """One precision's pass: per-item values of every batch of the sample; (the joined values, what was run in
        words). Compiled where judged so, in calls of TASK_BATCH rows (the last padded to them: one graph shape
        more than the main batch's, compiled once). A batch whose output has another shape than its reference's
        ends the pass: (None, the words with "shape_mismatch")."""
        compiled = compiled and self.fixed_rows and side.refused is None
        values = []
        described = {"of": len(self.items), "source": self.source, "batch": TASK_BATCH, "run": side.label(compiled)}
        for i in range(self.batches):
            inputs = self.batch(i)
            out = side.run(inputs, precision, compiled=compiled, batch=TASK_BATCH if compiled else None)[0][ref.main]
            expected = self.reference(ref, i)
            differs = shape_mismatch(out, expected)
            if differs is not None:
                return None, {**described, "items": i * TASK_BATCH, "shape_mismatch": differs,
                              "text": f"task sample batch {i + 1} of {self.batches} from {self.source}"}
            values.append(item_values(ref.kind, out, expected, _mask(ref.model, inputs), inputs))
        done = len(self.items)
        return join_values(values), {**described, "items": done, "pool": self.pool, "why": self.why(),
                                     "text": f"{done:,} {ref.model.declaration.items} from {self.source} "
                                             f"({self.why()})"}


def _baseline(module, batch: dict, plain: dict, truth: dict | None, main: str, mask, options: Options) -> dict:
    """Today's GPU setup (options.gpu_numerics), and its own error on the `main` output against `truth` (None:
    against `plain`): what a target's error is held against. Native where a GPU is present (gpu_baseline: a
    float32 copy run on it under the real flags or autocast, unless PORTKIT_MODE=emulated); else emulated on the
    CPU (the cuda target has no dtype rules: float64 stays). `plain`: the model's own outputs for `batch`, which an
    emulated setting that rounds nothing (fp32) computes exactly."""
    name = options.gpu_numerics
    chosen, gpu = numerics.GPU_NUMERICS[name], specs.get("cuda")
    mode, measured = "emulated", gpu_baseline.emulated_label()
    if gpu_baseline.present():
        (out, measured), mode = gpu_baseline.measure(module, batch, name), "native"
    elif rounds(chosen) or gpu.dtype_rules:
        with torch.no_grad(), numerics.emulate(gpu, chosen):
            out = module(**batch)
    else:
        out = plain
    found = compare(out[main], (truth if truth is not None else plain)[main], None, mask)
    return {"gpu_numerics": name, "setting": chosen.setting, "description": chosen.description,
            "label": f"the GPU baseline '{name}'", "mode": mode, "measured": measured,
            "factor": options.bounds["baseline_factor"], "output": main,
            "truth": "the float32 reference (no float64 run)" if truth is None else "the float64 reference",
            "gpu_error": found["rel_l2"], "gpu_max_abs": found["max_abs"], "outputs": out}


def _versus(baseline: dict, out: torch.Tensor, truth: dict, main: str, mask) -> dict:
    """A target's error against float64 (relative L2 on the main output) as a ratio to the GPU setup's."""
    error = compare(out, truth[main], None, mask)["rel_l2"]     # nan where the shapes differ
    gpu = baseline["gpu_error"]
    ratio = error / gpu if gpu > 0 else (1.0 if error == 0 else None)    # None: the GPU setup has no error
    ratio = None if error != error else ratio                            # nothing compared: no ratio
    return {**{k: v for k, v in baseline.items() if k != "outputs"}, "target_error": error, "ratio": ratio,
            "within": ratio is not None and ratio <= baseline["factor"]}


# ---------------------------------------------------------------- (b) one target against the reference
def _check_target(ref: Reference, name: str, plan: BucketBoundaries, shared, bar) -> TargetAccuracy:
    """One target: its chosen precision (compiled where judged so) and, emulated, its other precisions, each
    on the main batch with the per-layer hooks; then the chosen one on every bucket; the suggestions."""
    detected = specs.detect(name)
    target, side = detected.target, TargetSide(detected, ref.module, ref.scope.emulation, ref.compiled, shared)
    side.batch_first = all(s.dims.index(BATCH) == 0 for s in ref.model.declaration.inputs if BATCH in s.dims)
    chosen = target.precision((ref.options.precision or {}).get(name, target.default_precision.name))
    # natively, a precision is a flag set before the process starts: only the one in effect is measured
    others = [p for p in target.precisions if p != chosen] if ref.scope.all_precisions and not detected.native else []
    found, outs = [], []
    for p in [chosen, *others]:
        bar.set_postfix_str(f"{name} {p.name}")
        result, out = _precision_result(ref, side, p, (ref.compiled and p == chosen, p == chosen), plan.batch, bar)
        found.append(result)
        outs.append(out)
        bar.update()
    if found[0].float64_ops:
        _split_by_cause(ref, side, found, outs)
    rows = _buckets(ref, plan, chosen, side, bar)
    result = TargetAccuracy(detected.to_dict(), found[0], found[1:],
                            {"boundaries": plan.boundaries, "source": plan.source}, rows,
                            compile_refused=side.refused.to_dict() if side.refused else None)
    result.suggestions = suggest(target, result, ref.kind)
    result.tried = _try_others(ref, side, result, (chosen, others), plan) + _try_compiled(ref, side, result, others,
                                                                                          plan, bar)
    return result


def _try_others(ref: Reference, side: TargetSide, result: TargetAccuracy, precisions: tuple, plan) -> list[dict]:
    """Each other precision re-run on the chosen one's failing paths it was not measured on (the task sample, each
    failing bucket), on the same target side and the same compiled path: what the finding's advice says was tried
    (TargetAccuracy.tried_on). The main batch needs no re-run: every precision was measured on it. Each failing
    bucket is also run unpadded at the chosen precision: where that passes, padding is the cause, not numerics."""
    (chosen, others), paths = precisions, [p for p in result.failing_paths() if p != MAIN_BATCH]
    if not paths:
        return []
    compiled = ref.compiled and side.refused is None
    bucket_compiled = ref.compiled and (ref.scope.compiled_buckets or side.detected.native)
    batches = {high: (low, high, texts, cut) for low, high, texts, cut in
               _bucket_batches(ref.model, ref.corpus, plan.boundaries, ref.options.batch_size, ref.options.seed)} \
        if any(p.startswith("bucket ") for p in paths) and ref.corpus is not None else {}
    tried = [_try_unpadded(ref, side, batches[int(p.removeprefix("bucket "))], chosen, p, bucket_compiled, plan.batch)
             for p in paths if p.startswith("bucket ") and int(p.removeprefix("bucket ")) in batches]
    tried += _try_other_side(ref, side, [t["path"] for t in tried if t["passed"]], batches, chosen,
                             (bucket_compiled, plan.batch))
    for precision in others:
        for path in paths:
            if path == TASK_SAMPLE:
                found = ref._sampled(side, precision, compiled, plan.batch)
                passed, reason = found["decision"] == stats.PASS, found.get("reason")
            else:
                bucket = batches.get(int(path.removeprefix("bucket ")))
                if bucket is None:
                    continue
                row = _bucket_row(ref, bucket, precision, side, bucket_compiled, plan.batch)
                passed, reason = row["passed"], "; ".join(row["reasons"]) or None
            tried.append({"precision": precision.name, "setting": precision.setting, "path": path,
                          "passed": passed, "reason": reason})
    return tried


def _precision_result(ref: Reference, side: TargetSide, precision, how: tuple[bool, bool], batch: int | None, bar):
    """One precision on the main batch: eager with the per-layer hooks, then, where compiled (how[0]), judged on
    the compiled model (its outputs against the eager ones kept as compiled_vs_eager); its task metrics over the
    task sample where judged (how[1]: the chosen precision; the others are measured on the main batch, beside
    their vendor-stated cost). Returns the PrecisionResult and the outputs judged."""
    compiled, judged = how
    tolerances, mask, expected = ref.options.tolerances, ref.mask, ref.outputs
    tol = tolerance_for(precision, tolerances)
    per_dtype = {k: tolerance_for(precision, tolerances, r.dtype) for k, r in expected.items()}
    out, rows, reason, changed, f64 = side.run(ref.inputs, precision, ref.probe, tol)
    judged_by, vs_eager = side.label(False), None
    if compiled:
        eager, (out, _, _, changed, _) = out, side.run(ref.inputs, precision, compiled=True, batch=batch)
        judged_by = side.label(True)
        vs_eager = None if side.refused else {k: compare(out[k], eager[k], None, mask) for k in expected}
        if side.refused:
            bar.write(f"target {side.detected.name}: {side.refused.backend} refuses the compiled model "
                      f"({side.refused.message}); judged in {side.label(False)} instead")
    truth = ref.truth if ref.truth is not None else expected
    result = PrecisionResult(
        precision=precision.to_dict(), target_side=judged_by, compiled_vs_eager=vs_eager,
        outputs={k: compare(out[k], expected[k], per_dtype[k], mask) for k in expected},
        task=ref.task(out[ref.main], side, precision, compiled and side.refused is None, batch, sampled=judged),
        output_tasks=_other_outputs(ref, out),
        baseline=_versus(ref.baseline, out[ref.main], truth, ref.main, mask),
        vs_float64={k: compare(out[k], ref.outputs64[k], None, mask) for k in expected} if ref.outputs64 else None,
        layers=layer_summary(rows, reason, tol, precision, side.label(False)) if rows is not None else None,
        numerics=changed, float64_ops=f64)
    return result, out


def _other_outputs(ref: Reference, out: dict) -> dict[str, dict]:
    """The task metrics of each declared output beside the judged one, each with its own metric kind, on the main
    batch (an output the model did not return is left out)."""
    declared = {o.name: o.metric for o in ref.model.declaration.outputs if o.name != ref.main}
    return {name: task_metrics(kind, out[name], ref.outputs[name], ref.mask, ref.options.bounds, ref.inputs,
                               _unit(ref.model, kind), name)
            for name, kind in declared.items() if name in out and name in ref.outputs}


def _split_by_cause(ref: Reference, side: TargetSide, results: list[PrecisionResult], outs: list[dict]) -> None:
    """Each precision's error split by cause: float64 run as float32 (the target's dtype rules alone,
    no rounding) against the reference, and the precision's rounding against that run."""
    expected, mask = ref.outputs, ref.mask
    cast = side.run(ref.inputs, target_runs.DTYPE_RULES_ONLY)[0]
    cast_effect = {k: compare(cast[k], expected[k], None, mask) for k in expected}
    for r, out in zip(results, outs):
        r.error_by_cause = [
            {"cause": CAST_CAUSE, "measured": "the target's dtype rules alone, no rounding, against the reference",
             "outputs": cast_effect},
            {"cause": f"precision '{r.name}' rounding",
             "measured": f"{r.target_side} ({r.precision['description']}) against the dtype rules alone", "outputs":
                 {k: compare(out[k], cast[k], None, mask) for k in expected}}]


def _buckets(ref: Reference, plan: BucketBoundaries, precision, side: TargetSide, bar) -> list[dict]:
    """The chosen precision on each bucket of the plan (at most MAX_CHECKED_BUCKETS, spread over it): real
    texts of the bucket's lengths padded to it on the target, against the same texts unpadded."""
    model, n = ref.model, len(plan.boundaries)
    if ref.corpus is None or not model.seq_dim:
        return [{"boundary": None, "skipped": "no buckets: the model takes one input shape" if not model.seq_dim
                 else "no corpus given"}]
    # natively the vendor's compiler compiles every bucket; emulated, only on request (see check_accuracy)
    compiled = ref.compiled and (ref.scope.compiled_buckets or side.detected.native)
    checked = {round(i * (n - 1) / (MAX_CHECKED_BUCKETS - 1)) for i in range(MAX_CHECKED_BUCKETS)} \
        if n > MAX_CHECKED_BUCKETS else range(n)
    rows = []
    batches = _bucket_batches(model, ref.corpus, plan.boundaries, ref.options.batch_size, ref.options.seed)
    for i, (low, high, texts, truncated) in enumerate(batches):
        bar.update()
        if i not in checked:
            rows.append({"boundary": high, "skipped": f"not checked: {MAX_CHECKED_BUCKETS} of the plan's {n} "
                                                      "buckets are, spread over it, the largest included"})
        elif not texts:
            items = "text" if model.takes_text else "item"
            rows.append({"boundary": high, "skipped": f"no {items} of {low + 1}-{high} {model.seq_dim} in the sample"})
        else:
            rows.append(_bucket_row(ref, (low, high, texts, truncated), precision, side, compiled, plan.batch))
    return rows


def _try_compiled(ref: Reference, side: TargetSide, result: TargetAccuracy, others: list, plan, bar) -> list[dict]:
    """Where the chosen precision was judged compiled and fails on the main batch, each other precision compiled on
    the main batch too (they were measured eager: another path), so a precision that passes is one tried there."""
    if MAIN_BATCH not in result.failing_paths() or not ref.compiled or side.refused is not None:
        return []
    tried = []
    for precision in others:
        found = _precision_result(ref, side, precision, (True, False), plan.batch, bar)[0]
        main_fails = main_path(result.chosen) == MAIN_BATCH and found.main_decision == stats.FAIL
        passed = not main_fails and not any(t["decision"] == stats.FAIL for t in found.output_tasks.values())
        tried.append({"precision": precision.name, "setting": precision.setting, "path": MAIN_BATCH,
                      "passed": passed, "reason": "; ".join(found.metric_reasons) or None})
    return tried


def _try_unpadded(ref: Reference, side: TargetSide, bucket: tuple, precision, path: str, compiled: bool,
                  batch: int | None) -> dict:
    """A failing bucket's texts at their own length (no bucket padding) on the same target side and precision:
    "passed" says whether the task metrics hold there, so the bucket fails only padded (the padding cause)."""
    model, (_, high, texts, _) = ref.model, bucket
    pad = padding_side.side_of(model) or "right"
    plain, expected, _, _ = ref.bucket(high, texts, model.encode(texts, pad_to=high), pad)
    out = side.run(plain, precision, compiled=compiled, batch=batch)[0]
    main = _main(model, expected)
    task = task_metrics(model.declaration.primary.metric, out[main], expected[main], _mask(model, plain),
                        ref.options.bounds, plain, ref.unit, main)
    return {"precision": precision.name, "setting": precision.setting, "path": path, "unpadded": True,
            "passed": task["decision"] != stats.FAIL, "reason": task.get("reason")}


def _try_other_side(ref: Reference, side: TargetSide, paths: list[str], batches: dict, precision,
                    how: tuple[bool, int | None]) -> list[dict]:
    """Each bucket that fails only padded (its texts pass at their own length), padded on the side the tokenizer
    does not pad on and run again on the same target side and precision (padding_side): "passed" says whether that
    side fixes it, which the padding finding's advice then says it tried."""
    other = padding_side.other(ref.model)
    if other is None or not paths:
        return []
    tried = []
    for path in paths:
        bucket = batches[int(path.removeprefix("bucket "))]
        with padding_side.padding_on(ref.model, other):
            if not padding_side.lands_on(ref.model, ref.model.encode(bucket[2], pad_to=bucket[1]), other):
                return []      # the declaration does not pad on the tokenizer's side: there is no other side to try
            row = _bucket_row(ref, bucket, precision, side, *how)
        tried.append({"precision": precision.name, "setting": precision.setting, "path": path,
                      "padding_side": other, "passed": row["passed"], "reason": "; ".join(row["reasons"]) or None})
    return tried


def _bucket_row(ref: Reference, bucket: tuple, precision, side: TargetSide, compiled: bool, batch: int | None) -> dict:
    """One bucket: its texts padded to the boundary on the target, against the reference at their own length."""
    model, dim, (low, high, texts, truncated) = ref.model, ref.model.seq_dim, bucket
    pad = padding_side.side_of(model) or "right"
    padded = model.encode(texts, pad_to=high)
    plain, expected, baseline, truth = ref.bucket(high, texts, padded, pad)
    out = side.run(padded, precision, compiled=compiled, batch=batch)[0]
    out = {k: _align(out[k], r, pad) for k, r in expected.items()}
    mask, main = _mask(model, plain), _main(model, expected)
    outputs = {k: compare(out[k], r, tolerance_for(precision, ref.options.tolerances, r.dtype), mask)
               for k, r in expected.items()}
    task = task_metrics(model.declaration.primary.metric, out[main], expected[main], mask, ref.options.bounds, plain,
                        ref.unit, main)
    versus = _versus(baseline, out[main], truth, main, mask)
    # a bucket's batch is a handful of items: it fails the verdict where its interval lies outside a budget; one
    # that straddles it decides nothing (the task sample decides); an output of another shape fails it (a finding)
    shape_reasons = [task["reason"]] if task.get("shape_mismatch") else []
    reasons = list(shape_reasons) or ([f"task: {task['reason']}; {against_baseline(versus)} (no-regression factor "
                                       f"{versus['factor']:g}x)"]
                                      if task["decision"] == stats.FAIL and not versus["within"] else [])
    # every other declared output by its own metric, as on the main batch: one wholly outside its budget fails the
    # bucket (docs/guides/declaring-a-model.md); one of another shape is its output_shape finding (outputs)
    others = {o.name: task_metrics(o.metric, out[o.name], expected[o.name], mask, ref.options.bounds, plain,
                                   _unit(ref.model, o.metric), o.name)
              for o in model.declaration.outputs if o.name != main and o.name in out and o.name in expected}
    reasons += [f"output {name!r}: {t['reason']}" for name, t in others.items()
                if t["decision"] == stats.FAIL and not t.get("shape_mismatch")]
    real = sum(model.declaration.real_lengths(padded)[dim])
    target = f"{side.label(compiled or side.refused is not None)}, padded to {high} {dim}"
    if side.compiled and not compiled and side.refused is None:
        target += "; compiled and padding-checked in stage 3"
    return {"boundary": high, "lengths": [low + 1, high], "texts": len(texts), "truncated": truncated,
            "padding": 1 - real / (len(texts) * model.declaration.size_of(padded, dim)), "primary": main,
            "precision": precision.to_dict(),
            "reference": f"eager float32 at the batch's own length ({model.declaration.size_of(plain, dim)} {dim})",
            "target": target, "outputs": outputs, "task": task, "output_tasks": others,
            "passed": not reasons, "reasons": reasons,
            "shape_reasons": shape_reasons,
            "details": [f"{k}: {o['reason']}" for k, o in outputs.items() if not o["passed"]], "baseline": versus}


# ---------------------------------------------------------------- (c) the result
def _report(ref: Reference, per_target: dict[str, TargetAccuracy], description: str | None) -> AccuracyReport:
    """The report: the reference described (float32 or float64, the float64 copy, the GPU baseline) beside
    every target's result."""
    expected, out64, mask = ref.outputs, ref.outputs64, ref.mask
    mixed = ref.wide or any(t.chosen.float64_ops for t in per_target.values()) or target_runs.has_float64(ref.module)
    reference = {"description": "float64 eager on the CPU (the model is float64)" if ref.wide else
                 "eager on the CPU as written: float32, and float64 where the model computes in float64" if mixed
                 else "eager float32 on the CPU", "float64": ref.note64,
                 "float32_vs_float64": {k: compare(expected[k], out64[k], None, mask) for k in expected}
                 if out64 else None}
    shapes = {k: list(v.shape) for k, v in ref.inputs.items()}
    first = next(iter(shapes.values()), [])
    reference["gpu_baseline"] = {k: v for k, v in ref.baseline.items() if k != "outputs"}
    return AccuracyReport(ref.model.describe(), {"description": description or "batch " + " x ".join(map(str, first)),
                                                 "shapes": shapes}, reference, per_target)


# ---------------------------------------------------------------- generation
def check_generation(model, corpus, targets=("neuron", "tpu"), options: Options | None = None):
    """Workload "generate": greedy generation of options.new_tokens from options.batch_size real prompts
    (sampled with options.seed) under each target's numerics (options.precision) against the float32
    reference: token agreement, first divergence, logit error per step, near-ties, judged against
    options.task_bounds (portkit/stages/accuracy/generation.py). None: Options.defaults()."""
    from portkit.workloads import generation
    from portkit.stages.accuracy import generation as generation_accuracy
    options = options if options is not None else Options.defaults()
    generation.check_causal(model)
    return generation_accuracy.compare(model, corpus.sample(options.batch_size, options.seed), targets, options)


# ---------------------------------------------------------------- training
def training_precisions(targets) -> list[tuple[str, str]]:
    """(target, precision) pairs a training comparison runs: each migration target's precisions that
    round below float32 (the others compute what the fp32 reference computes)."""
    return [(name, p.name) for name in specs.parse_targets(targets) if not specs.get(name).reference
            for p in specs.get(name).precisions if rounds(p)]


def check_training(model, corpus, targets=("neuron", "tpu"), options: Options | None = None, *, lr: float = 1e-4,
                   layout: str = "padded", ops: bool = True):
    """options.train_steps AdamW steps of `model`'s own loss on real batches (options.batch_size texts of
    options.seq_len tokens, sampled with options.seed), fp32 against each target precision that rounds
    (training_precisions): the loss curves, per-layer gradient norms, where they part, advice.
    options.precision: {target: name}, the precision each target's training verdict is judged at (default:
    the target's own); ops=True also compiles one step per target and classifies its ops. None:
    Options.defaults()."""
    from portkit.workloads import training
    from portkit.stages.accuracy.training import TrainingComparison, diverge, measured_master_weights
    options = options if options is not None else Options.defaults()
    steps, precision = options.train_steps, options.precision
    names = [n for n in specs.parse_targets(targets) if not specs.get(n).reference]
    batches = training.batches(model, corpus, steps, options.batch_size, options.seq_len, layout, options.seed)
    reference = training.train(model, batches, lr)
    chosen = {n: (precision or {}).get(n) or specs.get(n).default_precision.name for n in names}
    for n, name in chosen.items():
        specs.get(n).precision(name)   # an unknown name: one line naming the target's precisions
    found = TrainingComparison(model.name, reference.loss, reference.batch, steps, reference, chosen=chosen)
    for target, name in training_precisions(names):
        print(f"training {model.name} under {target} {name} (emulated)")
        found.runs.append(diverge(reference, training.train(model, batches, lr, target, name)))
    measured_master_weights(found.runs)
    for target in names if ops else ():
        found.ops[target] = training.step_ops(model, batches[0], target, precision=found.chosen[target])
    return found
