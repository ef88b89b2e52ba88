"""Stage 4, accuracy: the target's numerics against a reference, per output, per bucket and per layer.

    >>> from portkit import accuracy, data, models
    >>> model, corpus = models.load("minilm"), data.load_corpus()
    >>> inputs, _ = data.example_batch(model, corpus, batch_size=4, seq_len=64)
    >>> plan = accuracy.bucket_plan("runs/minilm", ["tpu"])      # stage 3's buckets.json, else [32, 64, 128]
    >>> report = accuracy.check_accuracy(model, inputs, ["tpu"], corpus=corpus, buckets=plan)
    >>> print(report)          # verdict, reasons, the first module out of tolerance, suggestions
    >>> report.plot()          # error against depth (module execution order), one line per precision
    >>> report.save("runs/minilm/accuracy.json")

Reference: the model as written, eager on the CPU (float32, and float64 where the model computes in
float64), and the model in float64 where it runs in float64 (a second reference that shows how far
float32 itself is from exact; a float64 model is its own float64 reference). Target: in native mode the device; in
emulated mode the CPU under `numerics.emulate(target, precision)`, the target's documented dtype rules
and matmul precision, on the same real inputs. Every result names its precision (with the flag that
selects it on hardware) and its target side ("eager emulation", or the device).

The verdict is the task's: each output kind's task metrics (comparison.TASK_METRICS: embeddings, cosine
to the reference and top-5 nearest-neighbour agreement over a corpus sample; classifiers, top-1
agreement; language models, greedy-token agreement, KL and the perplexity change on the batch's own
text), each against its budget (tolerance.DEFAULT_TASK_BOUNDS, a parameter). The baseline is today's GPU
deployment (`gpu_numerics`, numerics.GPU_NUMERICS, emulated on the CPU): each result's error against
float64 is given as a ratio to that setup's own, and within `baseline_factor` times it is no regression,
a PASS against that baseline whatever the budgets say. `torch.testing.assert_close` at the tolerance of
the dtype the target computes in stays as detail. Only real positions count: the attention mask selects
them. Each precision setting is measured and shown next to the matmul cost its vendor documents
(numerics.precision_cost).

Per layer, hooks on every module keep the reference activations and compare the target's as soon as
they are produced; the first module (in execution order) whose output is out of tolerance is named,
and the suggestions are drawn from what was measured (a higher precision's measured error, norm
layers that amplify the error, float64 ops that ran as float32, the atol a task-level pass needs).
Where the target ran float64 ops as float32, the error is split by cause: the target's dtype rules
alone (float64 run as float32, no rounding) against the reference, and the precision's rounding
against that; each figure names its cause, and the float64 advice quotes the first.

A target whose compiler refuses the model (target_runs.Refusal) is judged in eager emulation, labelled
so, and its result carries the refusal as a blocker finding; the stage goes on.

The parts: the tolerance policy is portkit/targets/tolerance.py, the comparisons portkit/stages/accuracy/comparison.py, the
per-layer hooks portkit/stages/accuracy/localize.py, how each target side runs portkit/stages/accuracy/target_runs.py, and the
result object with its tables, plots and suggestions portkit/stages/accuracy/result.py. This module is the
stage's verb and its parameters, and the bucket batches it checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from portkit.models import registry as models
from portkit.targets import numerics
from portkit.core import progress as progress_bars
from portkit.runfolder import results
from portkit.stages.accuracy import target_runs
from portkit.targets import specs as targets_mod
from portkit.stages.accuracy.result import CAST_CAUSE, AccuracyReport, against_baseline, PrecisionResult, TargetAccuracy, suggest
from portkit.stages.accuracy.comparison import check, compare, finish, neighbour_agreement, primary_output, task_metrics
from portkit.core.errors import BadParameter
from portkit.stages.accuracy.localize import LayerProbe, layer_summary
from portkit.stages.accuracy.target_runs import EAGER, TargetSide, compiled_available
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS, DEFAULT_TOLERANCES, UPPER_BOUNDS, rounds, tolerance_for

DEFAULT_BUCKETS = (32, 64, 128)
_BUCKET_POOL = 512       # texts sampled and tokenized to fill the buckets


# ---------------------------------------------------------------- per layer, alone
def localize(model, inputs: dict[str, torch.Tensor], target: str, precision=None, tolerances=None,
             emulation=numerics.emulate) -> dict:
    """Per-layer localization alone: one reference pass that keeps every module's output, one target
    pass compared module by module. Returns layer_summary(); check_accuracy shares its reference pass."""
    detected = targets_mod.detect(target)
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
    (None: DEFAULT_BUCKETS). A damaged buckets.json raises results.UnreadableResult, naming the file and what is wrong."""
    saved = results.read_buckets(out_dir) if out_dir is not None else None
    plans = {}
    for name in targets_mod.parse_targets(targets):
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
    for name in targets_mod.parse_targets(targets):
        d = targets_mod.detect(name)
        main = target_runs.compiled_label(d) if compiled else ("eager on the device" if d.native else EAGER)
        print(f"target {name}: outputs and buckets {main}; per-layer hooks and other precisions: "
              f"{'eager on the device' if d.native else EAGER}")
    return compiled



# ---------------------------------------------------------------- the stage's verb
def check_parameters(targets=None, batch_size: int = 4, seq_len: int = 64, precision=None, tolerances=None,
                     task_bounds=None, default_buckets=None, seed: int = 0, corpus: str = "stdlib",
                     all_precisions: bool = True, layers: bool = True, float64_reference: bool = True,
                     gpu_numerics: str = "fp32", workload: str = "inference", train_steps: int = 20,
                     new_tokens: int = 16) -> None:
    """The notebook's validation cell, also run by the runner before anything is written."""
    from portkit.corpora import corpus as data
    from portkit.core import checks
    checks.choice("gpu_numerics", gpu_numerics, numerics.GPU_NUMERICS)
    checks.workload(workload)
    checks.positive_int("train_steps", train_steps)
    checks.positive_int("new_tokens", new_tokens, maximum=512)
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("seq_len", seq_len)
    checks.non_negative_int("seed", seed)
    data.check_corpus(corpus)
    for name, value in (("all_precisions", all_precisions), ("layers", layers), ("float64_reference", float64_reference)):
        checks.boolean(name, value)
    if targets is not None:
        targets_mod.parse_targets(targets)
    for name, value, hint in (("precision", precision, "target name -> precision name, e.g. {'tpu': 'highest'}"),
                              ("tolerances", tolerances, "dtype -> [rtol, atol]"),
                              ("task_bounds", task_bounds, f"with keys {', '.join(DEFAULT_TASK_BOUNDS)}")):
        if not isinstance(value or {}, dict):
            raise BadParameter(name, value, hint=f"give a dict of {hint}")
    for name, value in (precision or {}).items():
        targets_mod.get(name).precision(value)
    for dtype, pair in (tolerances or {}).items():
        checks.choice("tolerance dtype", dtype, DEFAULT_TOLERANCES)
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in pair)):
            raise BadParameter(f"tolerance for {dtype}", pair, hint="give [rtol, atol], two numbers >= 0")
    for key, value in (task_bounds or {}).items():
        checks.choice("task bound", key, DEFAULT_TASK_BOUNDS)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
                (key not in UPPER_BOUNDS and value > 1) or (key == "baseline_factor" and value < 1):
            raise BadParameter(f"task bound {key}", value, hint="cosine and agreement lie in [0, 1]; kl and "
                               "perplexity are >= 0; baseline_factor is >= 1")
    if default_buckets is not None:    # None, the notebook's default: DEFAULT_BUCKETS
        _check_boundaries(default_buckets)


def _check_boundaries(default_buckets) -> None:
    from portkit.core import checks
    if not isinstance(default_buckets, (list, tuple)) or not default_buckets:
        raise BadParameter("default_buckets", default_buckets, hint="give a list of sequence lengths, e.g. [16, 32]")
    for boundary in default_buckets:
        checks.positive_int("bucket boundary", boundary)
    if list(default_buckets) != sorted(set(default_buckets)):
        raise BadParameter("default_buckets", default_buckets, hint="boundaries must be ascending and distinct")


def check_accuracy(model, inputs: dict[str, torch.Tensor], targets=("neuron", "tpu"), *, precision=None,
                   all_precisions: bool = True, tolerances=None, task_bounds=None, corpus=None, buckets=None,
                   batch_size: int = 4, layers: bool = True, float64_reference: bool = True, seed: int = 0,
                   emulation=numerics.emulate, compiled: bool | None = None, description: str | None = None,
                   progress: bool = True, gpu_numerics: str = "fp32",
                   neighbour_texts: int = 24, compiled_buckets: bool = False) -> AccuracyReport:
    """Compare every target's numerics with the float32 (and float64) reference on `inputs`.

    model: a portkit.models.registry.LoadedModel; inputs: the dict its encode() returns.
    precision: {target: precision name}; a target not named uses its default.
    buckets: bucket_plan()'s result, or one list of boundaries for every target; needs `corpus`.
    emulation: a callable like numerics.emulate (tests pass numerics.wrong_op_TESTING_ONLY(...)).
    compiled: judge the chosen precision's outputs and buckets with the model compiled by the target's
    backend (stage 2's emulated one); None: when those backends are present. The other precisions and
    the per-layer hooks run eagerly (hooks cannot see inside a compiled graph); every result says which.
    gpu_numerics: how the model runs on the GPU today (numerics.GPU_NUMERICS), the baseline: each result's
    error against float64 is reported as a ratio to that setup's own, emulated on the CPU.
    neighbour_texts: corpus texts embedded for top-5 nearest-neighbour agreement (embeddings only).
    compiled_buckets: also compile every bucket for the per-bucket comparison when emulated (natively, the
    vendor's compiler always compiles them). By default emulated buckets run in eager emulation, padded to the bucket: the compiled graph applies the same numerics rules op by op
    (the chosen precision's compiled_vs_eager measures it on the main batch), and stage 3 compiled every
    bucket and checked its padded outputs against unpadded eager ones under the target's numerics.
    Compiling each bucket again cost ~3.6 s a bucket on 2 cores (39 buckets, ~150 s of the default run).
    """
    names = targets_mod.parse_targets(targets)
    check_parameters(names, batch_size=batch_size, precision=precision, tolerances=tolerances,
                     task_bounds=task_bounds, seed=seed, all_precisions=all_precisions, layers=layers,
                     float64_reference=float64_reference, gpu_numerics=gpu_numerics,
                     default_buckets=DEFAULT_BUCKETS if isinstance(buckets, dict) else list(buckets or DEFAULT_BUCKETS))
    if compiled is None:
        compiled = compiled_available() and emulation is numerics.emulate
    elif compiled and emulation is not numerics.emulate:
        raise BadParameter("compiled", compiled, hint=f"{emulation.__name__} runs eagerly only; pass compiled=False")
    bounds = {**DEFAULT_TASK_BOUNDS, **(task_bounds or {})}
    module, kind = model.module.eval(), model.declaration.primary.metric
    mask = _mask(model, inputs)
    probe = LayerProbe(module, mask, progress) if layers else None
    ref = probe.capture(lambda: module(**inputs)) if probe else target_runs.forward(module, inputs)
    wide = target_runs.float64_model(module)
    reference64 = target_runs.Float64Reference(module)
    ref64, ref64_note = reference64(inputs) if float64_reference and not wide else \
        (None, "the reference is the float64 model itself" if wide else "not requested")
    main = _main(model, ref)
    truth = ref if wide else ref64      # float64: the model's own, or the float64 copy
    baseline = _baseline(module, inputs, ref, gpu_numerics, truth if truth is not None else ref, main, mask,
                         bounds["baseline_factor"], truth is None)
    sample = _neighbour_sample(model, corpus, inputs, seed, neighbour_texts) if kind == models.EMBEDDING else None

    def baseline_for(batch, batch_ref, batch_mask):
        """A bucket's GPU baseline, against the same kind of float64 truth as the main batch's."""
        wide_ref = batch_ref if wide else reference64(batch)[0] if truth is not None \
            else None
        found = wide_ref if wide_ref is not None else batch_ref
        return _baseline(module, batch, batch_ref, gpu_numerics, found, main, batch_mask, bounds["baseline_factor"],
                         wide_ref is None), found
    if not isinstance(buckets, dict):
        buckets = {n: BucketBoundaries(list(buckets or DEFAULT_BUCKETS), "parameter") for n in names}
    steps = sum(1 + (len(targets_mod.get(n).precisions) - 1) * all_precisions for n in names) + \
        (sum(len(buckets[n].boundaries) for n in names) if corpus is not None and model.seq_dim else 0)
    bar = progress_bars.bar(total=steps, desc="accuracy", unit="pass", disable=not progress)
    bucket_refs: dict = {}
    per_target, shared = {}, target_runs.SharedCompile.for_targets(module, names, precision, compiled)
    for name in names:
        detected = targets_mod.detect(name)
        target, side = detected.target, TargetSide(detected, module, emulation, compiled, shared)
        chosen = target.precision((precision or {}).get(name, target.default_precision.name))
        # natively, a precision is a flag set before the process starts: only the one in effect is measured
        settings = [chosen] + ([p for p in target.precisions if p != chosen] if all_precisions and not detected.native else [])
        results, outs = [], []
        for p in settings:
            bar.set_postfix_str(f"{name} {p.name}")
            tol = tolerance_for(p, tolerances)
            out, rows, reason, changed, f64 = side.run(inputs, p, probe, tol)
            judged_by, vs_eager = side.label(False), None
            if compiled and p == chosen:
                eager, (out, _, _, changed, _) = out, side.run(inputs, p, compiled=True, batch=buckets[name].batch)
                judged_by = side.label(True)
                vs_eager = None if side.refused else {k: compare(out[k], eager[k], None, mask) for k in ref}
                if side.refused:
                    bar.write(f"target {name}: {side.refused.backend} refuses the compiled model "
                              f"({side.refused.message}); judged in {side.label(False)} instead")
            results.append(PrecisionResult(
                precision=p.to_dict(), target_side=judged_by, compiled_vs_eager=vs_eager,
                outputs={k: compare(out[k], ref[k], tolerance_for(p, tolerances, ref[k].dtype), mask) for k in ref},
                task=_task(kind, out[main], ref[main], mask, bounds, inputs, side, p, sample),
                baseline=_versus(baseline, out[main], truth if truth is not None else ref, main, mask),
                vs_float64={k: compare(out[k], ref64[k], None, mask) for k in ref} if ref64 else None,
                layers=layer_summary(rows, reason, tol, p, side.label(False)) if rows is not None else None,
                numerics=changed, float64_ops=f64))
            outs.append(out)
            bar.update()
        if results[0].float64_ops:
            _split_by_cause(side, inputs, ref, mask, results, outs)
        plan = buckets[name]
        bucket_rows = _buckets(model, corpus, plan, chosen, side, compiled and (compiled_buckets or detected.native), tolerances, bounds, batch_size, seed,
                               bucket_refs, bar, baseline_for) if corpus is not None and model.seq_dim else \
            [{"boundary": None, "skipped": "no buckets: the model takes one input shape" if not model.seq_dim
              else "no corpus given"}]
        result = TargetAccuracy(detected.to_dict(), results[0], results[1:],
                                {"boundaries": plan.boundaries, "source": plan.source}, bucket_rows,
                                compile_refused=side.refused.to_dict() if side.refused else None)
        result.suggestions = suggest(target, result, kind)
        per_target[name] = result
    bar.close()
    mixed = wide or any(t.chosen.float64_ops for t in per_target.values()) or target_runs.has_float64(module)
    reference = {"description": "float64 eager on the CPU (the model is float64)" if wide else
                 "eager on the CPU as written: float32, and float64 where the model computes in float64" if mixed
                 else "eager float32 on the CPU", "float64": ref64_note,
                 "float32_vs_float64": {k: compare(ref[k], ref64[k], None, mask) for k in ref} if ref64 else None}
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    first = next(iter(shapes.values()), [])
    reference["gpu_baseline"] = {k: v for k, v in baseline.items() if k != "outputs"}
    return AccuracyReport(model.describe(), {"description": description or "batch " + " x ".join(map(str, first)),
                                             "shapes": shapes}, reference, per_target)


# ---------------------------------------------------------------- the baseline and the task
NEIGHBOURS = 5      # k of top-k nearest-neighbour agreement


def _baseline(module, inputs, plain, gpu_numerics, truth, main, mask, factor, no_float64) -> dict:
    """Today's GPU setup, emulated on the CPU (the cuda target has no dtype rules: float64 stays), and
    its own error on the main output against float64: what a target's error is held against. `plain`:
    the model's own outputs for `inputs`, which a setting that rounds nothing (fp32) computes exactly."""
    chosen = numerics.GPU_NUMERICS[gpu_numerics]
    gpu = targets_mod.get("cuda")
    if rounds(chosen) or gpu.dtype_rules:
        with torch.no_grad(), numerics.emulate(gpu, chosen):
            out = module(**inputs)
    else:
        out = plain
    found = compare(out[main], truth[main], None, mask)
    return {"gpu_numerics": gpu_numerics, "setting": chosen.setting, "description": chosen.description,
            "label": f"the GPU baseline '{gpu_numerics}'", "factor": factor, "output": main,
            "truth": "the float32 reference (no float64 run)" if no_float64 else "the float64 reference",
            "gpu_error": found["rel_l2"], "gpu_max_abs": found["max_abs"], "outputs": out}


def _versus(baseline: dict, out: torch.Tensor, truth: dict, main: str, mask) -> dict:
    """A target's error against float64 (relative L2 on the main output) as a ratio to the GPU setup's."""
    error = compare(out, truth[main], None, mask)["rel_l2"]
    gpu = baseline["gpu_error"]
    ratio = error / gpu if gpu > 0 else (1.0 if error == 0 else None)    # None: the GPU setup has no error
    return {**{k: v for k, v in baseline.items() if k != "outputs"}, "target_error": error, "ratio": ratio,
            "within": ratio is not None and ratio <= baseline["factor"]}


def _neighbour_sample(model, corpus, inputs, seed, size):
    """A corpus sample for nearest-neighbour agreement, at the main batch's length, with its reference."""
    from portkit.core import checks
    checks.positive_int("neighbour_texts", size)
    if corpus is None or not model.takes_text or "attention_mask" not in inputs:
        return None
    texts = corpus.sample(min(len(corpus), size), seed + 1)
    if len(texts) <= NEIGHBOURS:
        return None
    batch = model.encode(texts, pad_to=inputs["attention_mask"].shape[1])
    return batch, target_runs.forward(model.module, batch)


def _task(kind, out, ref, mask, bounds, inputs, side, precision, sample) -> dict:
    """The output kind's task metrics; embeddings add top-k neighbour agreement over a corpus sample."""
    found = task_metrics(kind, out, ref, mask, bounds, inputs)
    if sample is not None:
        batch, expected = sample
        main = primary_output(kind, expected)
        got = side.run(batch, precision)[0][main]
        agreement = neighbour_agreement(got, expected[main], NEIGHBOURS)
        found["neighbour_agreement"] = agreement
        found["checks"].append(check("neighbours", f"top-{NEIGHBOURS} nearest-neighbour agreement over "
                                     f"{len(batch['input_ids'])} corpus texts", agreement, bounds))
        found = finish(found, found["checks"])
    return found


def _split_by_cause(side, inputs, ref, mask, results, outs) -> None:
    """Each precision's error split by cause: float64 run as float32 (the target's dtype rules alone,
    no rounding) against the reference, and the precision's rounding against that run."""
    cast = side.run(inputs, target_runs.DTYPE_RULES_ONLY)[0]
    cast_effect = {k: compare(cast[k], ref[k], None, mask) for k in ref}
    for r, out in zip(results, outs):
        r.error_by_cause = [
            {"cause": CAST_CAUSE, "measured": "the target's dtype rules alone, no rounding, against the reference",
             "outputs": cast_effect},
            {"cause": f"precision '{r.name}' rounding",
             "measured": f"{r.target_side} ({r.precision['description']}) against the dtype rules alone", "outputs":
                 {k: compare(out[k], cast[k], None, mask) for k in ref}}]


# Buckets checked per target and precision: a plan of more (an auto plan for a cheap compiler) is sampled,
# spread over its boundaries with the largest included; the rest are listed as not checked.
MAX_CHECKED_BUCKETS = 8


def _buckets(model, corpus, plan, precision, side, compiled, tolerances, bounds, batch_size, seed, cache,
             bar, baseline_for) -> list[dict]:
    rows, n = [], len(plan.boundaries)
    checked = {round(i * (n - 1) / (MAX_CHECKED_BUCKETS - 1)) for i in range(MAX_CHECKED_BUCKETS)} if n > MAX_CHECKED_BUCKETS else range(n)
    side_padding = getattr(model.tokenizer, "padding_side", "right")
    for i, (low, high, texts, truncated) in enumerate(_bucket_batches(model, corpus, plan.boundaries, batch_size, seed)):
        bar.update()
        if i not in checked:
            rows.append({"boundary": high, "skipped": f"not checked: {MAX_CHECKED_BUCKETS} of the plan's {n} buckets are, "
                                                      "spread over it, the largest included"})
            continue
        if not texts:
            rows.append({"boundary": high, "skipped": f"no {'text' if model.takes_text else 'item'} of {low + 1}-{high} {model.seq_dim} in the sample"})
            continue
        padded = model.encode(texts, pad_to=high)
        if (high, _key(texts)) not in cache:
            plain = _unpadded(model, padded, side_padding)
            ref = target_runs.forward(model.module, plain)
            cache[(high, _key(texts))] = (plain, ref, *baseline_for(plain, ref, _mask(model, plain)))
        plain, ref, baseline, truth = cache[(high, _key(texts))]
        out = side.run(padded, precision, compiled=compiled, batch=plan.batch)[0]
        mask, dim = _mask(model, plain), model.seq_dim
        outputs = {k: compare(_align(out[k], ref[k], side_padding), ref[k],
                              tolerance_for(precision, tolerances, ref[k].dtype), mask) for k in ref}
        main = _main(model, ref)
        task = task_metrics(model.declaration.primary.metric, _align(out[main], ref[main], side_padding), ref[main], mask, bounds, plain)
        details = [f"{k}: {o['reason']}" for k, o in outputs.items() if not o["passed"]]
        versus = _versus(baseline, _align(out[main], ref[main], side_padding), truth, main, mask)
        reasons = [f"task: {task['reason']}; {against_baseline(versus)} (no-regression factor "
                   f"{versus['factor']:g}x)"] if not (task["passed"] or versus["within"]) else []
        real = sum(model.declaration.real_lengths(padded)[dim])
        rows.append({"boundary": high, "lengths": [low + 1, high], "texts": len(texts), "truncated": truncated,
                     "padding": 1 - real / (len(texts) * model.declaration.size_of(padded, dim)), "primary": main,
                     "precision": precision.to_dict(),
                     "reference": f"eager float32 at the batch's own length "
                                  f"({model.declaration.size_of(plain, dim)} {dim})",
                     "target": f"{side.label(compiled or side.refused is not None)}, padded to {high} {dim}" + (
                         "; compiled and padding-checked in stage 3" if side.compiled and not compiled
                         and side.refused is None else ""),
                     "outputs": outputs, "task": task,
                     "passed": not reasons, "reasons": reasons, "details": details, "baseline": versus})
    return rows


# ---------------------------------------------------------------- generation (issue #14)
def check_generation(model, corpus, targets=("neuron", "tpu"), *, new_tokens: int = 16, prompts: int = 4,
                     seed: int = 0, precision=None, task_bounds=None):
    """Workload "generate": greedy generation of `prompts` real prompts under each target's numerics against
    the float32 reference: token agreement, first divergence, logit error per step, near-ties
    (portkit/stages/accuracy/generation.py)."""
    from portkit.workloads import generation
    from portkit.stages.accuracy import generation as generation_accuracy
    generation.check_causal(model)
    return generation_accuracy.compare(model, corpus.sample(prompts, seed), targets, new_tokens, precision,
                                       task_bounds)


# ---------------------------------------------------------------- training (issue #17)
def training_precisions(targets) -> list[tuple[str, str]]:
    """(target, precision) pairs a training comparison runs: each migration target's precisions that
    round below float32 (the others compute what the fp32 reference computes)."""
    return [(name, p.name) for name in targets_mod.parse_targets(targets) if not targets_mod.get(name).reference
            for p in targets_mod.get(name).precisions if rounds(p)]


def check_training(model, corpus, targets=("neuron", "tpu"), *, steps: int = 20, batch_size: int = 4,
                   seq_len: int = 64, lr: float = 1e-4, layout: str = "padded", seed: int = 0, precision=None,
                   ops: bool = True):
    """N AdamW steps of `model`'s own loss on real batches, fp32 against each target precision that
    rounds (training_precisions): the loss curves, per-layer gradient norms, where they part, advice.
    precision: {target: name}, the precision each target's training verdict is judged at (default:
    the target's own); ops=True also compiles one step per target and classifies its ops."""
    from portkit.workloads import training
    from portkit.stages.accuracy.training import TrainingComparison, diverge, measured_master_weights
    names = [n for n in targets_mod.parse_targets(targets) if not targets_mod.get(n).reference]
    batches = training.batches(model, corpus, steps, batch_size, seq_len, layout, seed)
    reference = training.train(model, batches, lr)
    chosen = {n: (precision or {}).get(n) or targets_mod.get(n).default_precision.name for n in names}
    for n, name in chosen.items():
        targets_mod.get(n).precision(name)   # an unknown name: one line naming the target's precisions
    found = TrainingComparison(model.name, reference.loss, reference.batch, steps, reference, chosen=chosen)
    for target, name in training_precisions(names):
        print(f"training {model.name} under {target} {name} (emulated)")
        found.runs.append(diverge(reference, training.train(model, batches, lr, target, name)))
    measured_master_weights(found.runs)
    for target in names if ops else ():
        found.ops[target] = training.step_ops(model, batches[0], target, precision=found.chosen[target])
    return found
