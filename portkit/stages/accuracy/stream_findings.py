"""Stage 4's stream findings: a streamed run (streaming.TargetStream.to_dict()) whose checks fail, as findings.

    >>> from portkit.stages.accuracy import stream_findings
    >>> stream_findings.stream_drift(run)        # its state's error grows with the stream: a blocker
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


def _keep_float32(run: dict) -> str:
    """What keeps a stream run's step in float32 on its target: its float32 precision setting where it has one."""
    target = specs.get(run["target"]) if run["target"] in specs.TARGETS else None
    fp32 = next((q for q in target.precisions if compute_dtype(q) == torch.float32), None) if target else None
    return (f"precision '{fp32.name}' ({fp32.setting}) for the step" if fp32 and fp32.name != run["precision"] else
            "float32 for the recurrent matmuls")


def stream_drift(run: dict) -> Finding:
    """A stream run (streaming.TargetStream.to_dict()) that fails its drift check, as the target's finding.
    A blocker: its state's error grows with the stream's length beyond noise, so a long enough stream goes wrong
    in deployment, and no precision setting was measured that brings it back (this stage's rule: a budget miss
    that no measured setting fixes is a blocker)."""
    failed = next(c for c in run["checks"] if c["metric"] == "drift_growth")
    p = (failed.get("trend") or run.get("drift_trend") or {}).get("p")
    leaf = f" in state leaf {failed['leaf']}" if len(run.get("leaves") or {}) > 1 else ""
    return Finding("stream_drift", grading.severity("stream_drift"),
                   f"streamed state drifts at precision '{run['precision']}' ({run['backend']}): its error against "
                   f"float64{leaf} grows {failed['value']:.2f}x over the stream ({failed['budget']}), a rise beyond "
                   f"noise (Mann-Whitney U p = {p:.2g})" if p is not None else
                   f"streamed state drifts at precision '{run['precision']}': growth {failed['value']:.2f}x "
                   f"({failed['budget']})",
                   f"keep the carried state in float32: {_keep_float32(run)}, or cast the state to float32 where it "
                   "is carried from step to step; a state rounded every step accumulates the rounding (recompute the "
                   "stream check after the change)")


def stream_recompile(run: dict) -> Finding:
    """Compiles during the stream, after warm-up: each is a compile paid mid-stream on the device. Where Dynamo's
    guard names a stride, the step hands a state part back as a view of a larger tensor (a slice of the chunk
    it read): its strides differ from the warm-up's fresh state, and Dynamo guards on strides."""
    first = (run.get("late") or [{}])[0]
    reason = first.get("reason") or "?"
    strided = "stride" in reason
    advice = ("return each state part as a fresh buffer: x[:, -n:].clone(memory_format=torch.contiguous_format) "
              "(a plain clone() keeps a view's strides), so every chunk feeds the layout the warm-up compiled"
              if strided else "warm up every chunk shape and state layout the stream feeds the step, and keep them "
                                  "the same from chunk to chunk")
    return Finding("stream_recompile", grading.severity("stream_recompile"),
                   f"{run['late_compiles']} compile(s) during the stream after warm-up ({run['backend']}), first at "
                   f"chunk {first.get('chunk', '?')}: {reason}", advice,
                   consequence="each is a compile paid in the middle of a stream on the device")


def stream_output(run: dict, check: dict) -> Finding:
    """A streamed output outside its budget (a check of streaming.output_metrics) as the target's finding: a
    blocker by the same rule as the drift, since the stream runs at one precision setting and none was measured
    that brings it back."""
    return Finding("stream_output", grading.severity("stream_output"),
                   f"streamed output '{check['output']}' at precision '{run['precision']}' ({run['backend']}): "
                   f"{check['label']} {check['value']:.4g} over the stream ({check['budget']})",
                   f"run the step in float32 ({_keep_float32(run)}) and recompute the stream check: the target's "
                   "rounding, carried in the state, changes what the stream decides")
