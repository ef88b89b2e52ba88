"""Stage 4, accuracy: the target's numerics against a reference, per output, per bucket and per layer.

    >>> from portkit.corpora import corpus
    >>> from portkit.stages.accuracy import stage
    >>> opts = stage.Options.of({"batch_size": 4})                # notebooks/04_accuracy.py's parameters, checked
    >>> inputs, described = corpus.example_batch(model, texts, opts.batch_size, opts.seq_len)
    >>> plan = stage.bucket_plan("runs/minilm", ["tpu"])         # stage 3's buckets.json, else [32, 64, 128]
    >>> report = stage.check_accuracy(model, inputs, ["tpu"], opts, corpus=texts, buckets=plan)
    >>> print(report); report.plot(); report.save("runs/minilm/accuracy.json")

Reference: the model eager on the CPU as written, and a float64 copy (how far float32 is from exact). Target:
the device natively; emulated, the CPU under `numerics.emulate(target, precision)`. The verdict is the task's:
each output kind's task metrics (comparison.TASK_METRICS) within their budgets (`task_bounds`), or an error
against float64 within `baseline_factor` times that of today's GPU setup (`gpu_numerics`: measured on the GPU
where one is present, else emulated). Only real positions count (the mask). Per layer, hooks name the first
module out of tolerance. A target whose compiler refuses the model is judged in eager emulation (a blocker).

The parts: tolerances portkit/targets/tolerance.py; options settings.py; the reference reference.py; one target
target_check.py; comparisons comparison.py; hooks localize.py; target sides target_runs.py; the result result.py,
its tables tables.py, suggestions advice.py. This module: the verb, its bucket plan, the workloads' verbs.
"""
from __future__ import annotations

import torch

from portkit.core.progress import bar as progress_bar
from portkit.runfolder import results
from portkit.stages.accuracy import footprint
from portkit.stages.accuracy import target_check
from portkit.stages.accuracy import target_runs
from portkit.stages.accuracy.comparison import compare
from portkit.stages.accuracy.localize import LayerProbe, layer_summary
from portkit.stages.accuracy.reference import Reference, real_mask
from portkit.stages.accuracy.result import AccuracyReport, TargetAccuracy
from portkit.stages.accuracy.settings import (DEFAULT_BUCKETS, MAX_CHECKED_BUCKETS, TASK_ITEMS,  # noqa: F401 (API)
                                              TASK_ITEMS_MAX, BucketBoundaries, Options, Scope, bucket_boundaries)
from portkit.stages.accuracy.target_runs import EAGER, TargetSide, compiled_available
from portkit.targets import numerics
from portkit.targets import specs
from portkit.targets.tolerance import rounds, tolerance_for


# ---------------------------------------------------------------- per layer, alone
def localize(model, inputs: dict[str, torch.Tensor], target: str, precision=None, tolerances=None,
             emulation=numerics.emulate) -> dict:
    """Per-layer localization alone: one reference pass that keeps every module's output, one target
    pass compared module by module. Returns layer_summary(); check_accuracy shares its reference pass."""
    detected = specs.detect(target)
    chosen = detected.target.precision(precision) if isinstance(precision, str) else \
        precision or detected.target.default_precision
    tol = tolerance_for(chosen, tolerances)
    probe = LayerProbe(model.module.eval(), real_mask(model, inputs))
    probe.capture(lambda: model.module(**inputs))
    side = TargetSide(detected, model.module, emulation, False)
    _, rows, reason, _, _ = side.run(inputs, chosen, probe, tol)
    return layer_summary(rows, reason, tol, chosen, side.label(False))


# ---------------------------------------------------------------- buckets
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
    bar = progress_bar(total=steps, desc="accuracy", unit="pass", disable=not scope.progress)
    shared = target_runs.SharedCompile.for_targets(ref.module, names, options.precision, ref.compiled)
    per_target = {name: target_check.check_target(ref, name, plans[name], shared, bar) for name in names}
    bar.close()
    return _report(ref, per_target, description)


def _plans(buckets, options: Options, names: list[str]) -> dict[str, BucketBoundaries]:
    """Per target: bucket_plan()'s result as given, else the one list of boundaries for every target."""
    if isinstance(buckets, dict):
        return buckets
    boundaries = bucket_boundaries("buckets", list(buckets or options.default_buckets or DEFAULT_BUCKETS))
    return {n: BucketBoundaries(list(boundaries), "parameter") for n in names}


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
    from portkit.workloads.generation import check_generates
    from portkit.stages.accuracy import generation
    options = options if options is not None else Options.defaults()
    check_generates(model)
    return generation.compare(model, corpus.sample(options.batch_size, options.seed), targets, options)


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


# ---------------------------------------------------------------- the plan step
def check_memory(model, values: dict) -> str | None:
    """Whether the stage's main batch fits this machine, before anything runs: an estimate from the model's weights and
    one row's measured activations (footprint.stage_estimate). Beyond the machine's whole memory it cannot run:
    BadParameter naming the batch_size that fits. Beyond the memory available now, a warning line (returned), since
    what other processes hold changes; None where it fits. `values`: the stage's parameters as the run passes them."""
    from portkit.core import memory
    from portkit.core.errors import BadParameter
    from portkit.corpora.corpus import corpus_for, example_batch
    opts = Options.of(values)
    row, _ = example_batch(model, corpus_for(model, opts.corpus, opts.text_column), 1, opts.seq_len,
                                seed=opts.seed)
    total, available = memory.total(), memory.available()
    needed, fits = footprint.stage_estimate(model, row, opts.batch_size, total or None)
    where = (f"stage accuracy's main batch of {opts.batch_size} would need an estimated {memory.gib(needed)} "
             f"(footprint.stage_estimate: the weights three times, {footprint.MAIN_BATCH_OVERHEAD}x a row's measured "
             f"activations a row)")
    if total and needed > total:
        hint = f"{where}, more than the machine's {memory.gib(total)}; " + (
            f"-p batch_size {fits} fits" if fits else "not even a batch of one fits: it needs a larger machine")
        raise BadParameter("batch_size", opts.batch_size, hint=hint)
    if available and needed > available:
        _, now = footprint.stage_estimate(model, row, opts.batch_size, available)
        return f"{where}, more than the {memory.gib(available)} available now; -p batch_size {max(1, now)} fits"
    return None
