"""Stage 2 with workload "train": the training step compiled for each target.

    >>> found = compile_training.check(m, corpus, ["neuron", "tpu"], seq_len=64)   # STEPS steps of BATCH texts
    >>> found["tpu"].summary()      # graphs, what the backward does not lower, compiles after the first step

One AdamW step (forward, the model's own loss, backward, optimizer; training.TrainingStep) is compiled with
each target's backend: the emulated backends take the joint graph Dynamo captures, refuse what the target
refuses (symbolic shapes), split it with AOTAutograd into its forward and backward ATen graphs and classify
every op of each with the target's table, the backward's own ops included; the optimizer step runs eagerly
(as torch.compile leaves it unless it is compiled apart). Every batch has the same shape (static shapes, as
both targets compile). The first step compiles; the later steps run under set_stance("fail_on_recompile"),
so a compile across steps is caught and counted with the guard failure behind it. Beside it, the same
steps eagerly under the target's numerics: the step time ratio and the largest loss difference (the same
numerics, so the losses should agree to rounding).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import torch

from portkit.core import grading
from portkit.core import torch_private
from portkit.targets import backends
from portkit.targets import specs
from portkit.workloads import training
from portkit.core.errors import CompileRefused

PARTS = ("forward", "backward")
# Not notebook parameters (the notebook keeps to the choices most runs make): the steps checked, one that
# compiles and the rest under fail_on_recompile, and the texts per batch.
STEPS = 4
BATCH = 4


@dataclass
class TrainCompile:
    """One target's compiled training step."""
    target: dict
    backend: str
    precision: str
    loss: str
    shape: dict                          # input name -> shape of every batch
    steps: int
    joint_graphs: int = 0                # Dynamo's graphs of the step (more than one: a graph break)
    graphs: dict = field(default_factory=dict)          # part -> AOTAutograd graphs compiled
    not_lowered: list = field(default_factory=list)     # op, status, detail, part, where
    foreign_ops: list = field(default_factory=list)     # ops outside PyTorch's namespaces (GraphCheck.foreign_ops)
    refused: dict | None = None          # {"message", "where"} when the target's compiler refuses the step
    late: list = field(default_factory=list)            # compiles after the first step, with their guards
    first_seconds: float = 0.0           # the first (compiling) step
    step_seconds: float = 0.0            # median of the later compiled steps
    eager_seconds: float = 0.0           # median eager step under the target's numerics
    losses: list = field(default_factory=list)
    eager_losses: list = field(default_factory=list)

    @property
    def loss_difference(self) -> float | None:
        pairs = list(zip(self.losses, self.eager_losses))
        return max(abs(a - b) for a, b in pairs) if pairs else None

    def summary(self) -> str:
        head = f"{self.target['name']} ({self.target['mode']}, {self.backend}) training step"
        if self.refused:
            return f"{head}: refused: {self.refused['message']}"
        ops = ", ".join(sorted({f"{o['op']} ({o['part']})" for o in self.not_lowered})) or "none"
        diff = self.loss_difference
        return (f"{head}: {self.joint_graphs} graph(s) ({', '.join(f'{self.graphs.get(p, 0)} {p}' for p in PARTS)}); "
                f"not lowered: {ops}; {len(self.late)} compile(s) after the first of {self.steps} steps; "
                # the step's measured times stay in step_seconds and eager_seconds, out of the text
                "compiled and eager steps under the same numerics"
                + (f", losses within {diff:.2g}" if diff is not None else ""))

    def findings(self) -> list[tuple]:
        """(kind, its case in the grading policy, message, advice, where) for the stage's findings."""
        name = self.target["name"]
        if self.refused:
            # the step was compiled with dynamic=False at its first batch's fixed shape (TrainingStep): refused there
            shape = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.shape.items())
            return [("train_refused", grading.ANY, f"the training step does not compile for {name}: "
                     f"{self.refused['message']}", backends.refusal_advice(
                         self.refused["message"], self.refused.get("where"), f"the batch's fixed shape ({shape})"),
                     self.refused.get("where"))]
        out = []
        if self.joint_graphs > 1:
            out.append(("train_graph_break", grading.ANY, f"the training step compiles as {self.joint_graphs} graphs "
                        "(graph breaks in the step)", "remove the breaks (stage 2's graph breaks name them): each "
                        "graph's backward is compiled and run apart", None))
        for op in self.not_lowered:
            where = op["where"][0] if op.get("where") else None
            case = grading.NO_KERNEL if op["status"] == "unsupported" else grading.RUNS_ON_HOST
            out.append(("train_not_lowered", case,
                        f"{op['op']} in the {op['part']} pass would not lower ({op['status']}: {op['detail']})",
                        "replace the op in the model, or write its kernel (forward and backward) for the target",
                        where))
        if self.late:
            out.append(("train_recompile", grading.ANY, f"{len(self.late)} compile(s) across training steps after the "
                        f"first: {self.late[0]['reason']}", "keep every batch's shapes and the step's Python "
                        "state the same across steps", None))
        return out

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "summary": self.summary(), "loss_difference": self.loss_difference}


def _not_lowered(checks) -> list[dict]:
    seen, out = set(), []
    for check in checks:
        if check.part not in PARTS:
            continue
        for op in check.not_lowered:
            key = (op["op"], check.part)
            if key not in seen:
                seen.add(key)
                out.append({"op": op["op"], "status": op["status"], "detail": op.get("detail", ""),
                            "part": check.part, "where": op.get("where") or []})
    return out


def _timed(step, batch) -> tuple[float, float]:
    start = time.perf_counter()
    loss, _ = step(batch, norms=False)
    return loss, time.perf_counter() - start


def check_target(model, batches: list[dict], target: str, precision=None) -> TrainCompile:
    """The training step compiled with `target`'s emulated backend over `batches` (see the module docstring)."""
    detected = specs.detect(target)
    step = training.TrainingStep(model, target=target, precision=precision, compiled=True)
    eager = training.TrainingStep(model, target=target, precision=precision)
    shape = {k: list(v.shape) for k, v in batches[0].items()}
    found = TrainCompile(detected.to_dict(), step.runs, step.precision, step.loss, shape, len(batches))
    torch.compiler.reset()
    try:
        try:
            loss, found.first_seconds = _timed(step, batches[0])
        except (CompileRefused, torch_private.backend_compiler_failed()) as exc:
            inner = getattr(exc, "inner_exception", None) or exc
            found.refused = {"message": str(inner).splitlines()[0], "where": getattr(inner, "where", None)}
            return found
        found.losses.append(loss)
        times = []
        with torch.compiler.set_stance("fail_on_recompile"):
            for i, batch in enumerate(batches[1:], 1):
                start = time.perf_counter()
                loss, _ = backends.call_counting_recompiles(lambda b: step(b, norms=False), batch, found.late, i)
                times.append(time.perf_counter() - start)
                found.losses.append(loss)
        found.step_seconds = statistics.median(times) if times else found.first_seconds
        checks = list(step.backend.checks)
        found.joint_graphs = sum(c.part == "joint" for c in checks)
        found.graphs = {p: sum(c.part == p for c in checks) for p in PARTS}
        found.not_lowered = _not_lowered(checks)
        found.foreign_ops = list({op["op"]: op for c in checks if c.part in PARTS for op in c.foreign_ops}.values())
    finally:
        torch.compiler.reset()
    eager_times = []
    for batch in batches:
        loss, seconds = _timed(eager, batch)
        found.eager_losses.append(loss)
        eager_times.append(seconds)
    found.eager_seconds = statistics.median(eager_times[1:] or eager_times)
    return found


def check(model, corpus, targets, steps: int = STEPS, batch_size: int = BATCH, *, seq_len: int, precision=None,
          seed: int = 0) -> dict[str, TrainCompile]:
    """check_target for every target on the same real batches of batch_size x seq_len (training.batches:
    padded, one text a row). The stage passes its options (stage.check_training)."""
    batches = training.batches(model, corpus, steps, batch_size, seq_len, seed=seed)
    names = specs.parse_targets(targets)
    return {n: check_target(model, batches, n, precision.get(n) if isinstance(precision, dict) else precision)
            for n in names}
