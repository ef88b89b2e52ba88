"""Stage 4's suggestions: what to change for a target, drawn only from what was measured.

    >>> from portkit.models import inputs
    >>> from portkit.stages.accuracy import advice
    >>> from portkit.targets import specs
    >>> result.suggestions = advice.suggest(specs.get("tpu"), result, inputs.EMBEDDING)

A higher precision's measured error, norm layers that are out of tolerance only when every op is rounded,
float64 ops that ran as float32 (quoting the error the cast alone causes, error_by_cause), the atol a
task-level pass needs, buckets that fail while the main batch passes.
"""
from __future__ import annotations

import torch

from portkit.models import padding_side
from portkit.targets import specs
from portkit.stages.accuracy.comparison import primary_output
from portkit.stages.accuracy.result import CAST_CAUSE, PrecisionResult, TargetAccuracy
from portkit.targets.tolerance import compute_dtype

NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")


def suggest(target: specs.Target, t: TargetAccuracy, kind: str) -> list[str]:
    """What to change, drawn only from what was measured (see the module docstring)."""
    chosen = t.chosen
    main = primary_output(kind, chosen.outputs)
    out = [*_where_error_enters(target, t, main), *_norms_in_float32(target, t), *_float64(target, chosen, main),
           *_element_wise_only(chosen), *_padding(t)]
    if not out and t.verdict == "pass":
        out.append(f"no change needed at precision '{chosen.name}': task metrics hold on the batch and every bucket"
                   + (" (emulated: confirm on hardware)" if t.target["mode"] == "emulated" else ""))
    return out


def _where_error_enters(target: specs.Target, t: TargetAccuracy, main: str) -> list[str]:
    """The module where the error first exceeds the tolerance, once a task metric is out of budget, and the
    float32 precision to run it at (with what the whole model measured there, when it was measured)."""
    chosen = t.chosen
    first = (chosen.layers or {}).get("first_failing")
    if not first or chosen.passed:
        return []
    measured = {r.name: r for r in (chosen, *t.others)}
    fp32 = next((p for p in target.precisions if compute_dtype(p) == torch.float32), None)
    row = chosen.layers["modules"][first["index"]]
    changed = ", ".join(f"{k} x{v}" for k, v in row.get("changes", {}).items()) or "nothing counted"
    if compute_dtype(target.precision(chosen.name)) == torch.float32 or fp32 is None:
        return [f"error first exceeds the tolerance in `{first['module']}` ({first['type']}) although "
                f"precision '{chosen.name}' computes in float32: the target changed {changed} there; "
                "check that module's ops on the target"]
    head = (f"error first exceeds the {chosen.layers['tolerance']['dtype']} tolerance in `{first['module']}` "
            f"({first['type']}; the target changed: {changed})")
    r = measured.get(fp32.name)
    if r is None:
        return [f"{head}: run it at precision '{fp32.name}' ({fp32.setting})"]
    error = f"max abs error {r.outputs[main]['max_abs']:.2g}; {r.target_side}"
    if r.passed:
        return [f"{head}: run it at precision '{fp32.name}' ({fp32.setting}); the whole model at '{fp32.name}' "
                f"passes ({error})"]
    # The whole model at the float32 precision rounds no matmul in that module either: one module at it cannot
    # pass where the whole model at it failed, so it is not advised.
    return [f"{head}; a higher precision is not the fix: the whole model at '{fp32.name}' ({fp32.setting}) still "
            f"fails ({error}), so the error is not this module's matmul rounding alone: check its other ops on the "
            "target"]


def _norms_in_float32(target: specs.Target, t: TargetAccuracy) -> list[str]:
    """Per measured precision: norm layers out of tolerance only because a setting rounds every op, not just
    matmuls (a sibling precision that rounds only matmuls keeps them within it)."""
    out = []
    chosen, results = t.chosen, (t.chosen, *t.others)
    measured = {r.name: r for r in results}
    for r in results:
        p = target.precision(r.name)
        sibling = next((q for q in target.precisions if q.all_ops is None and q.matmul_inputs == p.matmul_inputs
                        and q.name in measured and measured[q.name].layers), None) if p.all_ops else None
        if sibling is None or not r.layers:
            continue
        fine = {m["module"]: m for m in measured[sibling.name].layers["modules"] if m.get("compared") and m["passed"]}
        norms = [m for m in r.layers["modules"] if m.get("compared") and not m["passed"] and m["module"] in fine
                 and any(n in m["type"] for n in NORM_TYPES)]
        if norms:
            m = norms[0]
            out.append(f"{'with' if r is chosen else 'if you use'} precision '{r.name}' ({p.setting}): keep "
                       f"{', '.join(sorted({n['type'] for n in norms}))} in float32: {len(norms)} norm module(s) are "
                       f"out of tolerance only under it, first `{m['module']}` (rel. L2 error {m['rel_l2']:.2g}, "
                       f"{fine[m['module']]['rel_l2']:.2g} under '{sibling.name}', {sibling.setting}, which rounds "
                       "only matmuls)")
    return out


def _float64(target: specs.Target, chosen: PrecisionResult, main: str) -> list[str]:
    """float64 ops the target ran as float32: per module where the layers were compared, else in all, with the
    measured effect of that cast on the main output."""
    rows = [m for m in (chosen.layers or {}).get("modules", []) if m.get("float64_ops")]
    cast, rounding = chosen.cause(CAST_CAUSE, main), chosen.cause("precision", main)
    if cast:
        effect = f"measured effect of {CAST_CAUSE} alone on `{main}`: max abs error {cast['max_abs']:.2g}" + \
            (f" (precision '{chosen.name}' rounding adds {rounding['max_abs']:.2g} on its own)" if rounding else "")
    else:
        effect = f"max abs error on `{main}` with every change together: {chosen.outputs[main]['max_abs']:.2g}"
    out = []
    for m in rows:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(m["float64_ops"].items()))
        out.append(f"avoid float64 in `{m['module']}` ({m['type']}): {sum(m['float64_ops'].values())} float64 ops ran "
                   f"as float32 on {target.name} ({ops}); make it float32 (.float()) on the GPU too, so the "
                   f"reference is what the target runs; {effect}")
    if not rows and chosen.float64_ops:
        out.append(f"avoid float64: {sum(chosen.float64_ops.values())} float64 ops ran as float32 on {target.name} "
                   f"({', '.join(sorted(chosen.float64_ops))}); run with layers=True to find their modules; {effect}")
    return out


def _element_wise_only(chosen: PrecisionResult) -> list[str]:
    """Outputs beyond assert_close's tolerance while every task metric holds: a detail a reader may ask about;
    the verdict rests on the task."""
    failing = {name: o for name, o in chosen.outputs.items() if not o["passed"]}
    if not failing or not chosen.task["passed"]:
        return []
    worst = max(failing, key=lambda name: failing[name]["max_abs"])   # named: each output has its own error
    tol = failing[worst]["tolerance"]
    return [f"element-wise, outputs differ beyond assert_close's {tol['dtype']} tolerance (max abs "
            f"{failing[worst]['max_abs']:.2g}, on output '{worst}') while every task metric holds: rounding the "
            "task does not see; no change needed for the verdict"]


def _padding(t: TargetAccuracy) -> list[str]:
    """Buckets that fail while the main batch passes, with what the stage tried on each (target_check._try_others):
    its texts at their own length, unpadded (passes: padding is the cause, and the other padding side's try says
    whether that side fixes it, padding_side.advice; still fails: the bucket's texts fail unpadded too, so padding
    is not the cause); a bucket nothing was tried on gets leads, worded as such."""
    out = []
    for b in t.buckets:
        if b.get("skipped") or b["passed"] or not t.chosen.passed:
            continue
        path = f"bucket {b['boundary']}"
        head = f"{path} fails while the main batch passes ({b['reasons'][0][:100]})"
        unpadded = next((x for x in t.tried if x.get("unpadded") and x["path"] == path), None)
        if unpadded is None:
            out.append(f"{head}; may help (not tried by portkit): buckets that pad less, or masking the padded "
                       "positions in every layer that mixes positions")
        elif unpadded["passed"]:
            out.append(f"{head}: padding changes the result (tried: its texts pass at their own length); "
                       + padding_side.advice(t.tried, [path], "at the same precision"))
        else:
            out.append(f"{head}: not padding (tried: its texts fail at their own length too), so these texts "
                       "themselves fail at this precision")
    return out
