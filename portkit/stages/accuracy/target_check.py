"""Stage 4, one target against the reference: each precision on the main batch, the chosen one on every bucket.

    >>> from portkit.stages.accuracy import target_check
    >>> result = target_check.check_target(ref, "tpu", plan, shared, bar)     # a TargetAccuracy
    >>> result.verdict, result.suggestions, result.tried

The chosen precision is judged compiled where the reference says so (its outputs against the eager ones kept
as compiled_vs_eager); the others run eagerly with the per-layer hooks. Where float64 ran as float32, each
precision's error is split by cause; a failing path is re-run at the other precisions (tried), and a failing
bucket unpadded (padding as the cause).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from portkit.models.inputs import BATCH
from portkit.stages.accuracy import stats
from portkit.models import padding_side
from portkit.stages.accuracy import target_runs
from portkit.stages.accuracy.advice import suggest
from portkit.stages.accuracy.comparison import compare, task_metrics
from portkit.stages.accuracy.localize import layer_summary
from portkit.stages.accuracy.reference import (Reference, bucket_batches, judged_output, real_mask, unit_of,
                                               versus_baseline)
from portkit.stages.accuracy.result import (CAST_CAUSE, MAIN_BATCH, TASK_SAMPLE, PrecisionResult, TargetAccuracy,
                                            main_path)
from portkit.stages.accuracy.settings import MAX_CHECKED_BUCKETS, BucketBoundaries
from portkit.stages.accuracy.tables import against_baseline
from portkit.stages.accuracy.target_runs import TargetSide
from portkit.targets import specs
from portkit.targets.tolerance import tolerance_for


@dataclass(frozen=True)
class PassMode:
    """How one pass runs on a target side: compiled by the target's backend or eager, the batch the compiled
    model is cut to (TargetSide.run's `batch`), and judged (its task metrics over the task sample: the chosen
    precision only; the others are measured on the main batch)."""
    compiled: bool
    batch: int | None
    judged: bool = False


def _align(target_out: torch.Tensor, ref_out: torch.Tensor, padding_side: str) -> torch.Tensor:
    """A bucket-padded output cut to the reference's length (the padding positions dropped)."""
    if target_out.dim() >= 2 and ref_out.dim() >= 2 and target_out.shape[1] != ref_out.shape[1]:
        n = ref_out.shape[1]
        return target_out[:, :n] if padding_side == "right" else target_out[:, -n:]
    return target_out



# ---------------------------------------------------------------- (b) one target against the reference
def check_target(ref: Reference, name: str, plan: BucketBoundaries, shared, bar) -> TargetAccuracy:
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
        mode = PassMode(compiled=ref.compiled and p == chosen, batch=plan.batch, judged=p == chosen)
        result, out = _precision_result(ref, side, p, mode, bar)
        found.append(result)
        outs.append(out)
        bar.update()
    if found[0].float64_ops:
        _split_by_cause(ref, side, found, outs)
    rows = _buckets(ref, plan, chosen, side, bar)
    result = TargetAccuracy(detected.to_dict(), found[0], found[1:],
                            {"boundaries": plan.boundaries, "source": plan.source}, rows,
                            compile_refused=side.refused.to_dict() if side.refused else None)
    result.tried = _try_others(ref, side, result, (chosen, others), plan) + _try_compiled(ref, side, result, others,
                                                                                          plan, bar)
    result.suggestions = suggest(target, result, ref.kind)       # after the tries: it says what they gave
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
               bucket_batches(ref.model, ref.corpus, plan.boundaries, ref.options.batch_size, ref.options.seed)} \
        if any(p.startswith("bucket ") for p in paths) and ref.corpus is not None else {}
    bucket_mode = PassMode(compiled=bucket_compiled, batch=plan.batch)
    tried = [_try_unpadded(ref, side, batches[int(p.removeprefix("bucket "))], chosen, p, bucket_mode)
             for p in paths if p.startswith("bucket ") and int(p.removeprefix("bucket ")) in batches]
    # a bucket whose texts fail at their own length too has two causes at most: each other precision is run on it
    # unpadded as well, where it answers the precision's question without the padding's (TargetAccuracy.judged_on)
    mixed = [t["path"] for t in tried if not t["passed"]]
    tried += _try_other_side(ref, side, [t["path"] for t in tried if t["passed"]], batches, chosen, bucket_mode)
    for precision in others:
        tried += [_try_unpadded(ref, side, batches[int(p.removeprefix("bucket "))], precision, p, bucket_mode)
                  for p in mixed]
        for path in paths:
            if path == TASK_SAMPLE:
                found = ref._sampled(side, precision, compiled, plan.batch)
                passed, reason = found["decision"] == stats.PASS, found.get("reason")
            else:
                bucket = batches.get(int(path.removeprefix("bucket ")))
                if bucket is None:
                    continue
                row = _bucket_row(ref, bucket, precision, side, bucket_mode)
                passed, reason = row["passed"], "; ".join(row["reasons"]) or None
            tried.append({"precision": precision.name, "setting": precision.setting, "path": path,
                          "passed": passed, "reason": reason})
    return tried


def _precision_result(ref: Reference, side: TargetSide, precision, mode: PassMode, bar):
    """One precision on the main batch: eager with the per-layer hooks, then, where mode.compiled, judged on
    the compiled model (its outputs against the eager ones kept as compiled_vs_eager); its task metrics over the
    task sample where mode.judged (the chosen precision; the others are measured on the main batch, beside
    their vendor-stated cost). Returns the PrecisionResult and the outputs judged."""
    compiled, judged, batch = mode.compiled, mode.judged, mode.batch
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
        baseline=versus_baseline(ref.baseline, out[ref.main], truth, ref.main, mask, side.float32_on_cpu(precision)),
        vs_float64={k: compare(out[k], ref.outputs64[k], None, mask) for k in expected} if ref.outputs64 else None,
        layers=layer_summary(rows, reason, tol, precision, side.label(False)) if rows is not None else None,
        numerics=changed, float64_ops=f64)
    return result, out


def _other_outputs(ref: Reference, out: dict) -> dict[str, dict]:
    """The task metrics of each declared output beside the judged one, each with its own metric kind, on the main
    batch (an output the model did not return is left out)."""
    declared = {o.name: o.metric for o in ref.model.declaration.outputs if o.name != ref.main}
    return {name: task_metrics(kind, out[name], ref.outputs[name], ref.mask, ref.options.bounds, ref.inputs,
                               unit_of(ref.model, kind), name)
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
    rows, mode = [], PassMode(compiled, plan.batch)
    batches = bucket_batches(model, ref.corpus, plan.boundaries, ref.options.batch_size, ref.options.seed)
    for i, (low, high, texts, truncated) in enumerate(batches):
        bar.update()
        if i not in checked:
            rows.append({"boundary": high, "skipped": f"not checked: {MAX_CHECKED_BUCKETS} of the plan's {n} "
                                                      "buckets are, spread over it, the largest included"})
        elif not texts:
            items = "text" if model.takes_text else "item"
            rows.append({"boundary": high, "skipped": f"no {items} of {low + 1}-{high} {model.seq_dim} in the sample"})
        else:
            rows.append(_checked_bucket(ref, (low, high, texts, truncated), precision, side, mode))
    return rows


def _checked_bucket(ref: Reference, bucket: tuple, precision, side: TargetSide, mode: PassMode) -> dict:
    """_bucket_row, or where the bucket's padded batch raises and the model raises on it eagerly in float32 on the
    CPU too (LoadedModel.raises_eagerly: on every device, not the target's), the bucket skipped with why; an
    exception the model does not raise eagerly is the target's or portkit's, and raised."""
    try:
        return _bucket_row(ref, bucket, precision, side, mode)
    except Exception:
        _, high, texts, _ = bucket
        raised = ref.model.raises_eagerly(ref.model.encode(texts, pad_to=high))
        if raised is None:
            raise
        where = f" at {raised['where']['text']}" if raised["where"] else ""
        return {"boundary": high, "skipped": f"not checked: the model itself raises at length {high:,}, eagerly in "
                                             f"float32 on the CPU (on every device): {raised['message']}{where}"}


def _try_compiled(ref: Reference, side: TargetSide, result: TargetAccuracy, others: list, plan, bar) -> list[dict]:
    """Where the chosen precision was judged compiled and fails on the main batch, each other precision compiled on
    the main batch too (they were measured eager: another path), so a precision that passes is one tried there."""
    if MAIN_BATCH not in result.failing_paths() or not ref.compiled or side.refused is not None:
        return []
    tried = []
    for precision in others:
        found = _precision_result(ref, side, precision, PassMode(compiled=True, batch=plan.batch), bar)[0]
        main_fails = main_path(result.chosen) == MAIN_BATCH and found.main_decision == stats.FAIL
        passed = not main_fails and not any(t["decision"] == stats.FAIL for t in found.output_tasks.values())
        tried.append({"precision": precision.name, "setting": precision.setting, "path": MAIN_BATCH,
                      "passed": passed, "reason": "; ".join(found.metric_reasons) or None})
    return tried


def _try_unpadded(ref: Reference, side: TargetSide, bucket: tuple, precision, path: str, mode: PassMode) -> dict:
    """A failing bucket's texts at their own length (no bucket padding) on the same target side and precision:
    "passed" says whether the task metrics hold there, so the bucket fails only padded (the padding cause)."""
    model, (_, high, texts, _) = ref.model, bucket
    pad = padding_side.pads_on(model)
    plain, expected, _, _ = ref.bucket(high, texts, model.encode(texts, pad_to=high), pad)
    out = side.run(plain, precision, compiled=mode.compiled, batch=mode.batch)[0]
    main = judged_output(model, expected)
    task = task_metrics(model.declaration.primary.metric, out[main], expected[main], real_mask(model, plain),
                        ref.options.bounds, plain, ref.unit, main)
    return {"precision": precision.name, "setting": precision.setting, "path": path, "unpadded": True,
            "passed": task["decision"] != stats.FAIL, "reason": task.get("reason")}


def _try_other_side(ref: Reference, side: TargetSide, paths: list[str], batches: dict, precision,
                    mode: PassMode) -> list[dict]:
    """Each bucket that fails only padded (its texts pass at their own length), padded on the side the tokenizer
    does not pad on and run again on the same target side and precision (padding_side): "passed" says whether that
    side fixes it, which the padding finding's advice then says it tried."""
    buckets = {path: batches[int(path.removeprefix("bucket "))] for path in paths}
    other = padding_side.flippable(ref.model, next(iter(buckets.values()))[2]) if buckets else None
    if other is None:      # no tokenizer side, or the declaration does not pad on it: no other side to try
        return []
    tried = []
    for path, bucket in buckets.items():
        with padding_side.padding_on(ref.model, other):
            row = _bucket_row(ref, bucket, precision, side, mode)
        tried.append({"precision": precision.name, "setting": precision.setting, "path": path,
                      "padding_side": other, "passed": row["passed"], "reason": "; ".join(row["reasons"]) or None})
    return tried


def _bucket_row(ref: Reference, bucket: tuple, precision, side: TargetSide, mode: PassMode) -> dict:
    """One bucket: its texts padded to the boundary on the target, against the reference at their own length."""
    model, dim, (low, high, texts, truncated) = ref.model, ref.model.seq_dim, bucket
    pad = padding_side.pads_on(model)
    padded = model.encode(texts, pad_to=high)
    plain, expected, baseline, truth = ref.bucket(high, texts, padded, pad)
    out = side.run(padded, precision, compiled=mode.compiled, batch=mode.batch)[0]
    out = {k: _align(out[k], r, pad) for k, r in expected.items()}
    mask, main = real_mask(model, plain), judged_output(model, expected)
    outputs = {k: compare(out[k], r, tolerance_for(precision, ref.options.tolerances, r.dtype), mask)
               for k, r in expected.items()}
    task = task_metrics(model.declaration.primary.metric, out[main], expected[main], mask, ref.options.bounds, plain,
                        ref.unit, main)
    versus = versus_baseline(baseline, out[main], truth, main, mask, side.float32_on_cpu(precision))
    # a bucket's batch is a handful of items: it fails the verdict where its interval lies outside a budget; one
    # that straddles it decides nothing (the task sample decides); an output of another shape fails it (a finding)
    shape_reasons = [task["reason"]] if task.get("shape_mismatch") else []
    reasons = list(shape_reasons) or ([f"task: {task['reason']}; {against_baseline(versus)} (no-regression factor "
                                       f"{versus['factor']:g}x)"]
                                      if task["decision"] == stats.FAIL and not versus["within"] else [])
    # every other declared output by its own metric, as on the main batch: one wholly outside its budget fails the
    # bucket (docs/guides/declaring-a-model.md); one of another shape is its output_shape finding (outputs)
    others = {o.name: task_metrics(o.metric, out[o.name], expected[o.name], mask, ref.options.bounds, plain,
                                   unit_of(ref.model, o.metric), o.name)
              for o in model.declaration.outputs if o.name != main and o.name in out and o.name in expected}
    reasons += [f"output {name!r}: {t['reason']}" for name, t in others.items()
                if t["decision"] == stats.FAIL and not t.get("shape_mismatch")]
    real = sum(model.declaration.real_lengths(padded)[dim])
    target = f"{side.label(mode.compiled or side.refused is not None)}, padded to {high} {dim}"
    if side.compiled and not mode.compiled and side.refused is None:
        target += "; compiled and padding-checked in stage 3"
    return {"boundary": high, "lengths": [low + 1, high], "texts": len(texts), "truncated": truncated,
            "padding": 1 - real / (len(texts) * model.declaration.size_of(padded, dim)), "primary": main,
            "precision": precision.to_dict(),
            "reference": f"eager float32 at the batch's own length ({model.declaration.size_of(plain, dim)} {dim})",
            "target": target, "outputs": outputs, "task": task, "output_tasks": others,
            "passed": not reasons, "reasons": reasons,
            "shape_reasons": shape_reasons,
            "details": [f"{k}: {o['reason']}" for k, o in outputs.items() if not o["passed"]], "baseline": versus}
