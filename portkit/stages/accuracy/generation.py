"""Stage 4 with `-p workload generate`: greedy generation under each target's numerics against the float32
eager reference.

    >>> found = generation_accuracy.compare(lm, texts, ["neuron", "tpu"], accuracy.Options.of({"new_tokens": 16}))
    >>> found.targets["tpu"].summary()

Both runs use the same bucketed static cache (generation.plan_for; the dynamic one where the model raises with
it, generation.generate_eager) and run eagerly: the reference in
float32, each target under numerics.emulate (its dtype rules and matmul rounding). Per target and prompt: the
generated tokens' agreement, the first step where they part, and the largest logit error of every step up to
there (after it the two runs continue different texts, so their logits are no longer comparable).

A greedy token can flip on a near-tie: where the reference's top-1 and top-2 logits differ by less than the
target's own logit error at that step, the pick between them is decided by rounding, not by the model. Such a
divergence is counted as a near-tie and the agreement is judged without it (tolerance.DEFAULT_TASK_BOUNDS
"agreement"); a divergence with a clear reference margin is a failure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from portkit.core import grading
from portkit.workloads import generation
from portkit.targets import numerics
from portkit.targets import specs


@dataclass
class PromptResult:
    agreement: float                  # share of the generated tokens equal to the reference's
    first_divergence: int | None      # the first step whose token differs (0-based), None if none
    margin: float | None              # the reference's top-1 minus top-2 logit at that step
    error_at_divergence: float | None  # the target's largest logit error at that step
    step_errors: list[float]          # largest |logit - reference logit| per step, up to the divergence

    @property
    def near_tie(self) -> bool:
        return self.first_divergence is not None and self.margin is not None and self.margin <= (
            self.error_at_divergence or 0.0)


@dataclass
class TargetGeneration:
    target: str
    precision: str
    budget: float                     # the lowest judged agreement that passes (task bound "agreement")
    prompts: list[PromptResult] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return sum(p.agreement for p in self.prompts) / len(self.prompts)

    @property
    def judged_agreement(self) -> float:
        """The agreement with near-tie divergences counted as agreeing (see the module docstring)."""
        return sum(1.0 if p.near_tie else p.agreement for p in self.prompts) / len(self.prompts)

    @property
    def passed(self) -> bool:
        return self.judged_agreement >= self.budget

    def summary(self) -> str:
        parted = [p for p in self.prompts if p.first_divergence is not None]
        ties = sum(p.near_tie for p in parted)
        worst = max((e for p in self.prompts for e in p.step_errors), default=0.0)
        return (f"{self.target} ({self.precision}, eager emulation): {'PASS' if self.passed else 'FAIL'}; greedy "
                f"tokens agree {self.agreement:.1%} with the float32 reference over {len(self.prompts)} prompts; "
                f"{len(parted)} part"
                + (f" (first at step {min(p.first_divergence for p in parted)}; {ties} near-tie(s): the reference's "
                   f"top-2 margin within the target's logit error)" if parted else "")
                + f"; largest logit error before parting {worst:.3g}; judged agreement {self.judged_agreement:.1%} "
                f"(budget {self.budget:g})")

    __str__ = __repr__ = summary

    def to_dict(self) -> dict:
        return {"target": self.target, "precision": self.precision, "agreement": self.agreement,
                "judged_agreement": self.judged_agreement, "passed": self.passed, "summary": self.summary(),
                "prompts": [{**vars(p), "near_tie": p.near_tie} for p in self.prompts]}


@dataclass
class GenerationComparison:
    model: str
    new_tokens: int
    plan: dict
    targets: dict[str, TargetGeneration] = field(default_factory=dict)
    cache: str = "static"             # the KV cache both runs used (generation.generate_eager)
    refused: str | None = None        # why nothing was generated: the model raised with every cache

    def summary(self) -> str:
        if self.refused:
            return f"generation {grading.NOT_ASSESSED}: {self.refused}"
        return " | ".join(t.summary() for t in self.targets.values()) + (
            "" if self.cache == "static" else f" ({self.cache} KV cache: the model raises with the static one)")

    __str__ = __repr__ = summary

    def to_dict(self) -> dict:
        return {"model": self.model, "new_tokens": self.new_tokens, "plan": self.plan, "summary": self.summary(),
                "cache": self.cache, "refused": self.refused,
                "targets": {n: t.to_dict() for n, t in self.targets.items()}}


def _prompt(ref_tokens, ref_logits, tokens, logits, row: int) -> PromptResult:
    differ = (tokens[row] != ref_tokens[row]).nonzero()
    first = int(differ[0]) if len(differ) else None
    upto = len(ref_logits) if first is None else first + 1
    errors = [float((logits[s][row] - ref_logits[s][row]).abs().max()) for s in range(upto)]
    margin = None
    if first is not None:
        top2 = ref_logits[first][row].topk(2).values
        margin = float(top2[0] - top2[1])
    return PromptResult(float((tokens[row] == ref_tokens[row]).float().mean()), first, margin,
                        errors[-1] if first is not None else None, errors)


def compare(lm, texts: list[str], targets, options) -> GenerationComparison:
    """Greedy generation of options.new_tokens for `texts` (one batch) in float32 and under each migration
    target's numerics (options.precision: {target: name}, default the target's own), judged against the
    task bound "agreement" (options.bounds). options: the stage's options (stage.Options)."""
    new_tokens, precision, budget = options.new_tokens, options.precision, options.bounds["agreement"]
    plan = generation.plan_of(lm, texts, new_tokens)
    found = GenerationComparison(lm.name, new_tokens, {"prompt_buckets": list(plan.prompt_buckets),
                                                       "context_buckets": list(plan.context_buckets)})
    try:
        ref = generation.generate_eager(lm, texts, new_tokens, plan, keep_logits=True)
    except generation.GenerationRefused as refused:      # nothing generated: the comparison is not assessed
        found.refused = str(refused)
        return found
    found.cache = ref.mode
    for name in specs.parse_targets(targets):
        target = specs.get(name)
        if target.reference:
            continue
        chosen = target.precision((precision or {}).get(name) or target.default_precision.name)
        with numerics.emulate(target, chosen):
            run = generation.generate_eager(lm, texts, new_tokens, plan, keep_logits=True, cache=ref.mode)
        found.targets[name] = TargetGeneration(name, chosen.name, budget, [
            _prompt(ref.tokens, ref.logits, run.tokens, run.logits, row) for row in range(len(texts))])
    torch.compiler.reset()
    return found
