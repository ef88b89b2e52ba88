"""Stage 4's stream findings: a streamed run (streaming.TargetStream) whose checks fail, as findings.

    >>> from portkit.stages.accuracy import stream_findings
    >>> stream_findings.stream_drift(run)        # its state's error grows with the stream
    >>> stream_findings.stream_state(run, check) # its state is wrong from the first chunk
    >>> stream_findings.stream_recompile(run)    # a compile mid-stream, after warm-up
    >>> stream_findings.stream_output(run, check)

Each names what keeps the step in float32 on its target (its float32 precision setting where it has one).
"""
from __future__ import annotations

import torch

from portkit.targets import specs
from portkit.core import grading
from portkit.core.findings import Finding
from portkit.targets.tolerance import compute_dtype
from portkit.workloads import streaming


def _keep_float32(run: streaming.TargetStream) -> str:
    """What keeps a stream run's step in float32 on its target: its float32 precision setting where it has one."""
    target = specs.get(run.target) if run.target in specs.TARGETS else None
    fp32 = next((q for q in target.precisions if compute_dtype(q) == torch.float32), None) if target else None
    return (f"precision '{fp32.name}' ({fp32.setting}) for the step" if fp32 and fp32.name != run.precision else
            "float32 for the recurrent matmuls")


def _stream_case(run: streaming.TargetStream, check: dict) -> tuple[str, str]:
    """A failing stream check's grading case and what the advice says was tried: FIXED_BY_SETTING where the same
    stream at the target's float32 precision passed that check (streaming.try_float32), else NOT_FIXED; the
    float32 setting is then a lead, said to be untried where it was not run."""
    tried = run.tried        # try_float32's {"precision", "setting", "checks"}, or None where it was not run
    passed = tried["checks"].get(streaming.check_key(check)) if tried else None
    if passed:
        return grading.FIXED_BY_SETTING, (f"set {tried['setting']}: tried: precision '{tried['precision']}' passes "
                                          "this check on the same stream")
    if passed is None:
        return grading.NOT_FIXED, f"may help: run the step in float32 ({_keep_float32(run)}; not tried on the stream)"
    return grading.NOT_FIXED, (f"tried: precision '{tried['precision']}' ({tried['setting']}) still fails this check "
                               "on the same stream")


def stream_drift(run: streaming.TargetStream) -> Finding:
    """A stream run (streaming.TargetStream) that fails its drift check, as the target's finding: its
    state's error grows with the stream's length beyond noise, so a long enough stream goes wrong in deployment.
    Graded as a task metric is (_stream_case): work where the target's float32 precision, tried on the same stream,
    brings it back, a blocker otherwise."""
    failed = next(c for c in run.checks if c["metric"] == "drift_growth")
    p = (failed.get("trend") or run.trend).get("p")
    leaf = f" in state leaf {failed['leaf']}" if len(run.leaves) > 1 else ""
    case, tried = _stream_case(run, failed)
    lead = ("" if case == grading.FIXED_BY_SETTING else "; may help: cast the state to float32 where it is carried "
            "from step to step: a state rounded every step accumulates the rounding")
    return Finding("stream_drift", grading.severity("stream_drift", case),
                   f"streamed state drifts at precision '{run.precision}' ({run.backend}): its error against "
                   f"float64{leaf} grows {failed['value']:.2f}x over the stream ({failed['budget']}), a rise beyond "
                   f"noise (Mann-Whitney U p = {p:.2g})" if p is not None else
                   f"streamed state drifts at precision '{run.precision}': growth {failed['value']:.2f}x "
                   f"({failed['budget']})", tried + lead)


def stream_state(run: streaming.TargetStream, check: dict) -> Finding:
    """A stream run whose state is wrong from the first chunk (streaming.level_check fails), as the target's finding:
    apart from the drift, which a state off by the same amount at every chunk does not show. Graded as the drift."""
    case, tried = _stream_case(run, check)
    lead = ("" if case == grading.FIXED_BY_SETTING else
            "; may help: look for an op that cancels (a difference of near-equal terms) or saturates in the step")
    return Finding("stream_state", grading.severity("stream_state", case),
                   f"streamed state wrong from the first chunk at precision '{run.precision}' ({run.backend}): "
                   f"one step from the float64 state already gives {check['value']:.2g} ({check['budget']}), "
                   "before anything is carried"
                   + ("" if any(c["metric"] == "drift_growth" and not c["passed"] for c in run.checks) else
                      f"; it does not grow (drift {run.growth:.2f}x)"),
                   tried + lead, consequence="every chunk's state, and what the stream decides from it, carries the "
                                             "error")


def stream_recompile(run: streaming.TargetStream) -> Finding:
    """Compiles during the stream, after warm-up: each is a compile paid mid-stream on the device. Where Dynamo's
    guard names a stride, the step hands a state part back as a view of a larger tensor (a slice of the chunk
    it read): its strides differ from the warm-up's fresh state, and Dynamo guards on strides."""
    first = (run.late or [{}])[0]
    reason = first.get("reason") or "?"
    strided = "stride" in reason
    advice = ("return each state part as a fresh buffer: x[:, -n:].clone(memory_format=torch.contiguous_format) "
              "(a plain clone() keeps a view's strides), so every chunk feeds the layout the warm-up compiled"
              if strided else "warm up every chunk shape and state layout the stream feeds the step, and keep them "
                                  "the same from chunk to chunk")
    return Finding("stream_recompile", grading.severity("stream_recompile"),
                   f"{run.late_compiles} compile(s) during the stream after warm-up ({run.backend}), first at "
                   f"chunk {first.get('chunk', '?')}: {reason}", advice,
                   consequence="each is a compile paid in the middle of a stream on the device")


def stream_output(run: streaming.TargetStream, check: dict) -> Finding:
    """A streamed output outside its budget (a check of streaming.output_metrics) as the target's finding, graded as
    the drift (_stream_case): the target's float32 precision tried on the same stream."""
    case, tried = _stream_case(run, check)
    return Finding("stream_output", grading.severity("stream_output", case),
                   f"streamed output '{check['output']}' at precision '{run.precision}' ({run.backend}): "
                   f"{check['label']} {check['value']:.4g} over the stream ({check['budget']})",
                   tried + ("" if case == grading.FIXED_BY_SETTING else ": the target's rounding, carried in the "
                            "state, changes what the stream decides"))
