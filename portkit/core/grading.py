"""The grading policy: one table decides every finding's severity, and one rule turns severities and open
questions into a target's verdict. docs/reference/verdicts.md is generated from this module (tools/build_docs.py).

    >>> from portkit.core import grading
    >>> grading.severity("accuracy", grading.FIXED_BY_SETTING)
    'work'
    >>> grading.verdict({"work"}, open_questions=["HBM fit (stage xla)"])
    'not assessed'

A stage never writes a severity of its own: it names the kind of result and its case, and asks `severity`. The
op and feature findings of stage 1 take the severity of the target's rule for that feature (portkit.targets.specs
FeatureRule, one table per target, drawn in docs/reference/verdicts.md beside this one): their case is the target.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.core.findings import BLOCKER, INFO, WORK

READY, READY_WITH_WORK, BLOCKED, NOT_ASSESSED = "ready", "ready with work", "blocked", "not assessed"
VERDICTS = (BLOCKED, NOT_ASSESSED, READY_WITH_WORK, READY)     # the order the rule below tries them

# The cases a kind of result is graded in. ANY: the kind has one grade whatever the case.
ANY = "any"
FIXED_BY_SETTING = "a setting portkit tried on the failing case passes"
NOT_FIXED = "no setting portkit tried passes"
RUNS_ON_HOST = "the target runs it on the host CPU"
NO_KERNEL = "no kernel on the target and no CPU fallback"
RESOLVED = "resolved by the bucket plan"
UNRESOLVED = "not resolved"
CUT, NOTHING_CUT, REJECTED = "inputs are cut", "nothing is cut", "inputs are rejected"
PLAIN_TORCH = "a torch.library op whose kernel is a Python function of torch ops"
VANISHED = "traced away under torch.compile"
NEEDS_CUDA = "the code needs a CUDA device to run"
OFF_CUDA_BRANCH = "off CUDA the code takes another branch or precision"
NO_EFFECT = "no effect off NVIDIA"
GUARDED = "its import is guarded: the model runs without it"


@dataclass(frozen=True)
class Grade:
    """How one kind of result is graded in one case, and why: the consequence on the target."""
    stage: str
    kind: str
    case: str
    severity: str
    rule: str


def _g(stage: str, kind: str, case: str, severity: str, rule: str) -> Grade:
    return Grade(stage, kind, case, severity, rule)


# Severity by consequence (portkit.core.findings): blocker, the model cannot run or cannot compile on the target;
# work, it runs, at a named cost; info, noted, no cost found. A question a stage could not answer is no finding
# at all: it is an open question (`unassessed`), and the verdict says so.
POLICY: tuple[Grade, ...] = (
    _g("model", "tokenizer_roundtrip", ANY, BLOCKER,
       "the tokenizer loses the text: every stage's inputs are not the text the model was trained on"),
    _g("fallbacks", "recurrent", NO_KERNEL, BLOCKER,
       "the device's fused recurrent cell op has no kernel anywhere, whatever the target's rule for recurrent "
       "modules"),
    _g("fallbacks", "custom_op", PLAIN_TORCH, WORK,
       "an op outside ATen whose kernel is plain torch runs on the target, opaque to its compiler: stage 2 grades "
       "what it holds (foreign_op); a CUDA or Triton kernel takes the target's custom_op rule below"),
    _g("fallbacks", "gpu_kernel", ANY, BLOCKER, "a CUDA or Triton kernel does not carry over: it must be rewritten"),
    _g("fallbacks", "gpu_kernel", GUARDED, INFO, "an optional kernel: the model runs without it"),
    _g("fallbacks", "gpu_package", ANY, BLOCKER, "a GPU-only package the model needs does not run on the target"),
    _g("fallbacks", "gpu_package", GUARDED, INFO, "an optional package: the model runs without it"),
    _g("fallbacks", "gpu_device", NEEDS_CUDA, BLOCKER, "code that names a CUDA device or NCCL fails off NVIDIA"),
    _g("fallbacks", "gpu_device", OFF_CUDA_BRANCH, WORK,
       "the code runs off CUDA, on another branch or at another precision than on the GPU"),
    _g("fallbacks", "gpu_device", NO_EFFECT, INFO, "a CUDA setting with no effect elsewhere"),
    _g("fallbacks", "gpu_device", GUARDED, INFO, "optional CUDA code: the model runs without it"),
    _g("compile", "compile_refused", ANY, BLOCKER,
       "the target's compiler refuses the graph: the model cannot run compiled there. One cause is one finding, "
       "whichever stages (2, 3, 4) met it"),
    _g("compile", "compile_failed", ANY, BLOCKER,
       "the model raises under the target's compile backend: it does not run there as written"),
    _g("compile", "not_lowered", NO_KERNEL, BLOCKER, "an op with no kernel and no fallback cannot run"),
    _g("compile", "not_lowered", RUNS_ON_HOST, WORK, "a round trip to the host CPU per call"),
    _g("compile", "graph_break", ANY, WORK, "the graph is cut: a host round trip and a separate compile per piece"),
    _g("compile", "fullgraph", ANY, WORK, "fullgraph=True fails: serving stacks that need one graph need a rewrite"),
    _g("compile", "recompile_storm", UNRESOLVED, WORK, "a compile per new input shape, minutes each on the target"),
    _g("compile", "recompile_storm", RESOLVED, INFO, "the bucket plan pads every request to a shape warmed up"),
    _g("compile, buckets", "recompile_after_warmup", ANY, WORK, "a shape the warm-up missed compiles while serving"),
    _g("compile", "train_refused", ANY, BLOCKER, "the target's compiler refuses the training step: training cannot "
       "run compiled there"),
    _g("compile", "train_not_lowered", NO_KERNEL, BLOCKER, "an op of the training step with no kernel and no "
       "fallback cannot run"),
    _g("compile", "train_not_lowered", RUNS_ON_HOST, WORK, "a round trip to the host CPU per training step"),
    _g("compile", "train_graph_break", ANY, WORK, "each graph of the training step has its own backward, compiled "
       "and run apart"),
    _g("compile", "train_recompile", ANY, WORK, "the training step compiles again mid-run"),
    _g("compile", "eager_feature", VANISHED, INFO,
       "a stage-1 finding torch.compile traces away costs nothing compiled, the way both vendors run models"),
    _g("compile", "static_cache", ANY, WORK,
       "the model raises with a fixed-size KV cache and generates with the growing one only: on a static-shape "
       "target every generated token is a new shape and a compile, until the model gets a fixed-size cache"),
    _g("compile", "fixed_shape", ANY, WORK, "a fixed shape still recompiles: a guard on something else changes"),
    _g("compile", "foreign_op", ANY, WORK,
       "an op that is not ATen (a library's or the user's torch.library op) runs opaque in the compiled graph: "
       "portkit cannot check what it does inside, so it must be measured on the device"),
    _g("buckets", "padding", ANY, WORK,
       "padding changes the outputs at real positions: the model runs, but needs exact-length batches or "
       "per-length buckets (a compile per length)"),
    _g("buckets", "padding_unchecked", ANY, WORK, "the bucket plan is not proven to leave real positions unchanged"),
    _g("buckets", "truncation", CUT, WORK, "inputs longer than the largest bucket are cut: the model sees only "
       "their beginning"),
    _g("buckets", "truncation", NOTHING_CUT, INFO, "no input is longer than the largest bucket"),
    _g("buckets", "truncation", REJECTED, INFO, "inputs longer than the largest bucket are rejected, as the "
       "overflow policy chosen asks: never served, nothing computed wrong"),
    _g("buckets", "bucket_plan", ANY, INFO, "the plan itself: what to serve with"),
    _g("buckets, accuracy", "model_raises", ANY, WORK,
       "the model itself raises at a bucket's shape, eagerly in float32 on the CPU, so on every device: not the "
       "target's failure; the plan must stay below that shape, and what it would show stays open"),
    _g("xla", "hbm", ANY, BLOCKER, "the compiled shape does not fit the topology's HBM per device"),
    _g("xla", "xla_compile", ANY, BLOCKER, "the real XLA TPU compiler rejects the shape"),
    _g("xla", "xla_conversion", ANY, INFO,
       "portkit's own PyTorch-to-JAX conversion stopped before the compiler: portkit's gap, owned by portkit, one "
       "finding per cause; the question the check was to answer (the HBM fit, the lowering) is open"),
    _g("xla", "abstract_model", ANY, WORK, "a real-size model without weights: its numerics are not measured"),
    _g("accuracy", "accuracy", FIXED_BY_SETTING, WORK,
       "a task metric outside its budget at the target's default precision, brought back by a precision setting "
       "portkit ran on the same path (a bucket that fails only padded is padding's; one whose texts fail at their "
       "own length too is judged there): the cost is that setting's"),
    _g("accuracy", "accuracy", NOT_FIXED, BLOCKER,
       "a task metric outside its budget at every precision portkit ran: the task sees the error"),
    _g("accuracy", "accuracy_inconclusive", ANY, WORK, "the sample cannot tell the metric from its budget yet"),
    _g("accuracy", "output_shape", ANY, WORK, "an output's shape changes on the target: declare its axes"),
    _g("accuracy", "stream_drift", FIXED_BY_SETTING, WORK,
       "the streaming state drifts at the target's default precision, not at a float32 precision portkit ran on the "
       "same stream: the cost is that setting's"),
    _g("accuracy", "stream_drift", NOT_FIXED, BLOCKER, "the streaming state drifts beyond noise at every precision "
       "portkit ran: long streams degrade"),
    _g("accuracy", "stream_state", FIXED_BY_SETTING, WORK,
       "the streaming state is wrong from the first chunk at the default precision, not at a float32 precision "
       "portkit ran on the same stream: the cost is that setting's"),
    _g("accuracy", "stream_state", NOT_FIXED, BLOCKER,
       "the streaming state is wrong beyond its precision's tolerance from the first chunk on, at every precision "
       "portkit ran: every chunk carries it, however long the stream"),
    _g("accuracy", "stream_recompile", ANY, WORK, "a compile during a stream, after warm-up"),
    _g("accuracy", "stream_output", FIXED_BY_SETTING, WORK, "a stream output outside its budget at the default "
       "precision, within it at a float32 precision portkit ran on the same stream"),
    _g("accuracy", "stream_output", NOT_FIXED, BLOCKER, "a stream output outside its budget at every precision "
       "portkit ran"),
)


def severity(kind: str, case: str = ANY) -> str:
    """The severity POLICY gives `kind` in `case`; a kind or case the policy does not hold raises KeyError,
    so a new kind of result cannot be graded anywhere but here."""
    for grade in POLICY:
        if grade.kind == kind and grade.case == case:
            return grade.severity
    cases = [g.case for g in POLICY if g.kind == kind]
    raise KeyError(f"the grading policy has no grade for {kind!r} in case {case!r}"
                   + (f"; its cases: {', '.join(cases)}" if cases else "; add it to portkit.core.grading.POLICY"))


def verdict(severities, open_questions) -> str:
    """A target's verdict from its findings' severities and the questions no stage answered: a blocker found is
    blocked whatever else did not run; else an open question leaves it not assessed (a blocker may be missed);
    else work makes it ready with work; else ready."""
    severities = set(severities)
    if BLOCKER in severities:
        return BLOCKED
    if open_questions:
        return NOT_ASSESSED
    return READY_WITH_WORK if WORK in severities else READY
