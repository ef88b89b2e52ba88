"""Stage 4 for training: loss curves and per-layer gradient norms under each target's numerics against fp32.

    >>> from portkit import models
    >>> from portkit.corpora import corpus
    >>> from portkit.stages.accuracy import stage
    >>> opts = stage.Options.of({"train_steps": 20})
    >>> found = stage.check_training(models.load("gpt2"), corpus.load_corpus(), ["neuron", "tpu"], opts)
    >>> print(found)        # per target and precision: where the loss and the gradients part, and the advice
    >>> found.plot()        # the loss curves side by side; the largest per-layer gradient-norm gap per step

Every run is training.train from the same loaded weights on the same real batches: the float32 CPU
reference, and each target precision that rounds (TPU's default one-pass bf16 matmuls; Neuron's
--auto-cast=matmult and --auto-cast=all), eager under numerics.emulate. Two curves part at the first
step where the loss is out of the precision's tolerance (tolerance.tolerance_for: |a - b| <= atol +
rtol * |b|, assert_close's rule); the gradients part at the first step where a layer's gradient norm is
out of it, and that step's layer with the largest relative gap is named. The advice follows from what
parted and from the target's own precisions: bf16 weight updates (an all-ops setting) call for fp32
master weights; bf16 matmuls call for the target's higher matmul precision on the named layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from portkit.targets import specs
from portkit.targets import tolerance
from portkit.targets.specs import UNSUPPORTED
from portkit.workloads.training import StepOps, TrainingRun


def _outside(value: float, reference: float, tol: tolerance.Tolerance) -> bool:
    return not abs(value - reference) <= tol.atol + tol.rtol * abs(reference)


def _relative(value: float, reference: float) -> float:
    return abs(value - reference) / abs(reference) if reference else (0.0 if value == reference else math.inf)


@dataclass
class TrainingDivergence:
    """One target precision's run against the reference."""
    target: str
    precision: str
    setting: str                     # how the precision is chosen on the hardware
    tolerance: dict
    run: TrainingRun
    loss_parts_at: int | None = None                 # first step whose loss is out of tolerance
    grads_part_at: int | None = None                 # first step with a layer's gradient norm out of tolerance
    layer: str | None = None                         # that step's layer with the largest relative gap
    layer_gap: float = 0.0
    final_loss_gap: float = 0.0                      # relative gap of the last step's loss
    max_grad_gap: list[float] = field(default_factory=list)   # per step: the largest relative layer gap
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"target": self.target, "precision": self.precision, "setting": self.setting,
                "tolerance": self.tolerance,
                "loss_parts_at": self.loss_parts_at, "grads_part_at": self.grads_part_at, "layer": self.layer,
                "layer_gap": self.layer_gap, "final_loss_gap": self.final_loss_gap,
                "max_grad_gap": self.max_grad_gap, "advice": self.advice, "run": self.run.to_dict()}

    def __str__(self) -> str:
        loss = (f"loss parts at step {self.loss_parts_at}" if self.loss_parts_at is not None
                else "loss within tolerance at every step")
        grads = (f"gradients part at step {self.grads_part_at} in {self.layer} ({self.layer_gap:.2%} off)"
                 if self.grads_part_at is not None else "every layer's gradient norm within tolerance")
        return (f"{self.target} {self.precision} ({self.setting}): {loss}; {grads}; last loss "
                f"{self.run.losses[-1]:.4f} ({self.final_loss_gap:.2%} from fp32)\n"
                + "\n".join(f"  advice: {a}" for a in self.advice))


def diverge(reference: TrainingRun, run: TrainingRun) -> TrainingDivergence:
    """Where `run` (one target precision) parts from the fp32 `reference` over the same steps."""
    target = specs.get(run.target)
    precision = target.precision(run.precision)
    tol = tolerance.tolerance_for(precision)
    found = TrainingDivergence(run.target, run.precision, precision.setting, tol.to_dict(), run)
    for step, (loss, ref) in enumerate(zip(run.losses, reference.losses)):
        if found.loss_parts_at is None and _outside(loss, ref, tol):
            found.loss_parts_at = step
        norms, ref_norms = run.grad_norms[step], reference.grad_norms[step]
        gaps = {name: _relative(norms[name], value) for name, value in ref_norms.items()}
        found.max_grad_gap.append(max(gaps.values(), default=0.0))
        if found.grads_part_at is None and any(_outside(norms[n], v, tol) for n, v in ref_norms.items()):
            found.grads_part_at = step
            found.layer = max(gaps, key=gaps.get)
            found.layer_gap = gaps[found.layer]
    found.final_loss_gap = _relative(run.losses[-1], reference.losses[-1])
    found.advice = _advice(found, target, precision)
    return found


def _advice(found: TrainingDivergence, target: specs.Target, precision) -> list[str]:
    if found.loss_parts_at is None and found.grads_part_at is None:
        return [f"{precision.setting}: the loss and every layer's gradient norm stay within {found.tolerance['dtype']} "
                f"tolerance of fp32 over {len(found.run.losses)} steps; no change needed for training"]
    exact = next((p for p in target.precisions if not tolerance.rounds(p)), None)
    advice = []
    if precision.all_ops is not None:
        keeps_fp32 = next((p for p in target.precisions if p.all_ops is None and tolerance.rounds(p)), exact)
        advice.append(f"keep fp32 master weights: under {precision.setting} the optimizer's update runs in "
                      f"{str(precision.all_ops).replace('torch.', '')} too, and updates below its resolution are "
                      "lost; keep the weights and AdamW's state in fp32"
                      + (f" ({keeps_fp32.setting}: {keeps_fp32.description})" if keeps_fp32 else ""))
    elif precision.matmul_inputs is not None and found.layer and exact is not None:
        advice.append(f"run the matmuls of {found.layer} (where the gradients part, step {found.grads_part_at}) at "
                      f"a higher precision: {exact.setting} ({exact.description})")
    return advice


def measured_master_weights(runs: list[TrainingDivergence]) -> None:
    """Add to each all-ops run's master-weights advice what the same target measured with fp32 updates
    (its precision that rounds matmuls only), where that run is among `runs`."""
    for r in runs:
        target = specs.get(r.target)
        if target.precision(r.precision).all_ops is None:
            continue
        for other in runs:
            p = target.precision(other.precision) if other.target == r.target else None
            if p is not None and p.all_ops is None and tolerance.rounds(p):
                r.advice.append(f"measured: with fp32 updates ({other.precision}) the last loss is "
                                f"{other.final_loss_gap:.2%} from fp32, against {r.final_loss_gap:.2%} here")


@dataclass
class TrainingComparison:
    """The reference run and each target precision's divergence from it: stage 4's training result."""
    model: str
    loss: str
    batch: dict
    steps: int
    reference: TrainingRun
    runs: list[TrainingDivergence] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)    # target -> the precision stage 4 judges
    ops: dict[str, StepOps] = field(default_factory=dict)   # target -> the ops of one compiled step

    def verdicts(self) -> dict[str, dict]:
        """Per target: "blocked" (a training op with no kernel and no fallback), "ready with work" (ops that
        fall back to the CPU; the chosen precision's loss or gradients part from fp32), or "ready"."""
        out = {}
        for target, precision in self.chosen.items():
            blockers, work = [], []
            found = self.ops.get(target)
            for row in found.not_lowered() if found else []:
                (blockers if row["status"] == UNSUPPORTED else work).append(
                    f"{row['op']} ({row['phase']}): {row['status']}, {row['detail']}")
            run = next((r for r in self.runs if (r.target, r.precision) == (target, precision)), None)
            if run is None:
                numerics = f"{precision} rounds nothing below float32: training follows the fp32 reference"
            else:
                numerics = str(run).splitlines()[0]
                if run.loss_parts_at is not None or run.grads_part_at is not None:
                    work.append(numerics)
            verdict = "blocked" if blockers else "ready with work" if work else "ready"
            out[target] = {"verdict": verdict, "precision": precision, "numerics": numerics, "blockers": blockers,
                           "work": work, "advice": run.advice if run else []}
        return out

    def to_dict(self) -> dict:
        return {"model": self.model, "loss": self.loss, "batch": self.batch, "steps": self.steps,
                "verdicts": self.verdicts(), "reference": self.reference.to_dict(),
                "runs": [r.to_dict() for r in self.runs], "ops": {t: o.to_dict() for t, o in self.ops.items()}}

    def __str__(self) -> str:
        head = (f"{self.model} training, {self.steps} AdamW steps ({self.loss}) from the loaded weights, fp32 loss "
                f"{self.reference.losses[0]:.4f} -> {self.reference.losses[-1]:.4f}; each target emulated on the CPU")
        verdicts = [f"training verdict {t}: {v['verdict'].upper()} "
                    f"({'; '.join(v['blockers'] + v['work']) or v['numerics']})" for t, v in self.verdicts().items()]
        return "\n".join([head, *map(str, self.runs), *map(str, self.ops.values()), *verdicts])

    def plot(self, axes=None):
        """The loss curves side by side (left); the largest relative per-layer gradient-norm gap (right)."""
        import matplotlib.pyplot as plt
        axes = axes if axes is not None else plt.subplots(1, 2, figsize=(11, 3.2))[1]
        steps = range(len(self.reference.losses))
        axes[0].plot(steps, self.reference.losses, label="fp32 (reference)", color="black", lw=2)
        for r in self.runs:
            axes[0].plot(steps, r.run.losses, label=f"{r.target} {r.precision}", ls="--")
            axes[1].plot(steps, r.max_grad_gap, label=f"{r.target} {r.precision}")
        axes[0].set(xlabel="step", ylabel="loss", title=f"{self.model}: loss per step")
        axes[1].set(xlabel="step", ylabel="largest relative gap", yscale="log", title="per-layer gradient norm vs fp32")
        for ax in axes:
            ax.legend(fontsize=8)
        return axes
