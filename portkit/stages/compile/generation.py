"""Stage 2 with `-p workload generate`: greedy generation compiled for each target, the dynamic KV cache
against the bucketed static one.

    >>> from portkit.stages.compile import generation
    >>> lm = models.load("gpt2")
    >>> found = generation.check(lm, texts.sample(4, seed=0), ["neuron", "tpu"], 16, "auto")
    >>> found["tpu"].summary()

Per target, on its compile backend (selection.backend_for: emulated here, the vendor's natively):
- the model's default DynamicCache, every step compiled at static shapes as the targets require: every
  generated token is a new cache length, so a guard failure and a compile, until Dynamo's recompile limit
  runs the step eagerly (where that happens is measured, not assumed);
- the fix: transformers' StaticCache with prompts left-padded to powers-of-two prompt buckets and the cache
  in powers-of-two context buckets (generation.plan_for), every graph compiled in a warm-up, then the whole
  generation under set_stance("fail_on_recompile"): any compile there is refused by PyTorch, so "0 after
  warm-up" is PyTorch's word, not portkit's; a refused compile is counted, paid, and a finding with the guard
  that failed and its source line.
The two runs' tokens are compared (the same greedy decoding, so they should agree where the numerics do). The
emulated targets share one Dynamo trace per cache (generation.generate_static_for). A compiled run that raises
is run again eagerly (generation.refusal): where the model raises there too, it refuses the cache, a result.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from portkit.core import owners, grading
from portkit.workloads import encoder_decoder, generation
from portkit.targets import selection
from portkit.targets import specs


@dataclass
class TargetGeneration:
    target: dict                       # DetectedTarget.to_dict()
    backend: str
    prompts: int
    new_tokens: int
    plan: dict                         # the static cache's buckets
    dynamic: generation.Generation | None    # None where the model refuses the cache (refused)
    static: generation.Generation | None
    refused: dict = field(default_factory=dict)   # {cache: generation.Refused}, eagerly as compiled

    @property
    def agreement(self) -> float | None:
        """Share of generated tokens the dynamic and static runs agree on; None where one did not run."""
        if self.dynamic is None or self.static is None:
            return None
        return float((self.dynamic.tokens == self.static.tokens).float().mean())

    def summary(self) -> str:
        d, s = self.dynamic, self.static
        seq2seq = self.plan.get("encoder_decoder", False)     # sources for its encoder, not prompts
        head = f"{self.target['name']} ({self.target['mode']}, {self.backend}): {self.prompts} " \
               f"{'sources' if seq2seq else 'prompts'} x {self.new_tokens} new tokens"
        parts = [f"dynamic cache: {self.refused['dynamic'].text()}" if d is None else
                 f"dynamic cache: {d.compiles} compiles ({d.compiles_per_token:.2f} per generated token)"
                 + (f"; from token {d.eager_from_step + 1} the decode step ran eagerly (Dynamo's recompile limit)"
                    if d.eager_from_step is not None else "")]
        parts.append(f"static cache: {self.refused['static'].text()}" if s is None else
                     f"static cache ({'source' if seq2seq else 'prompt'} buckets {self.plan['prompt_buckets']}, "
                     f"{'decoder context' if seq2seq else 'context buckets'} {self.plan['context_buckets']}): "
                     f"{s.warmup_compiles} compiles in warm-up, {s.compiles} during "
                     "the generation under fail_on_recompile")
        if self.agreement is not None:
            parts.append(f"tokens agree {self.agreement:.0%}")
        return "; ".join([head, *parts])

    __str__ = __repr__ = summary

    def late_where(self) -> dict | None:
        """The source line behind the first compile after warm-up: the innermost frame of its guard's user
        stack trace outside torch and portkit (Dynamo prints it with the guard failure)."""
        if not self.static.late:
            return None
        return owners.innermost(owners.from_trace("\n".join(self.static.late[0]["guard_failures"])))

    def findings(self) -> list[tuple]:
        """(kind, case, message, advice, where), graded by the policy (core.grading): a static cache the model
        refuses where the dynamic one runs; a compile during the static-cache generation, after every bucket's
        graph was warmed up, is one per decode step it recurs at."""
        if self.static is None:
            if self.dynamic is None:        # nothing generated: an open question (open_questions), no finding
                return []
            refused = self.refused["static"]
            return [("static_cache", grading.ANY,
                     f"{refused.text()}; with the dynamic cache it generates, at {self.dynamic.compiles} compiles "
                     f"for {self.new_tokens} tokens on {self.target['name']} ({self.dynamic.compiles_per_token:.2f} "
                     "per generated token)",
                     "a lead, not tried: the model needs a fixed-size KV cache it accepts (transformers' "
                     "StaticCache raised above) before its decode step can be compiled once per context bucket; "
                     "a serving stack's own cache for this architecture, or a cache layer written for it",
                     refused.where)]
        late = self.static.late
        if not late:
            return []
        steps, guard = sorted({entry["request"] for entry in late}), " ".join(late[0]["reason"].split())
        return [("recompile_after_warmup", grading.ANY,
                 f"static-cache generation: {len(late)} compile(s) after warm-up on {self.target['name']}, at "
                 f"{len(steps)} of {self.new_tokens - 1} decode steps; the guard that failed: {guard}",
                 "a decode step must reuse its context bucket's graph: the guard names Python state the step "
                 "reads that changes every token (a cache layer keeping its position count in a Python int is "
                 "one); keep it in a tensor, or use a cache whose layers do",
                 self.late_where())]

    def open_questions(self) -> list[tuple[str, str]]:
        """(question, why) this check left open: generation itself, where the model raised with every cache."""
        if self.static is None and self.dynamic is None:
            return [(f"generation on {self.target['name']} (its compiles per token, the static cache)",
                     "; ".join(r.text() for r in self.refused.values()))]
        return []

    def to_dict(self) -> dict:
        def run(g: generation.Generation | None) -> dict | None:
            if g is None:
                return None
            return {"compiles": g.compiles, "compiles_per_token": g.compiles_per_token, "seconds": g.seconds,
                    "warmup_compiles": g.warmup_compiles, "warmup_seconds": g.warmup_seconds,
                    "eager_from_step": g.eager_from_step, "truncated": g.truncated,
                    "first_guard_failure": g.guard_failures[0] if g.guard_failures else None,
                    "late": [{k: e[k] for k in ("request", "shape", "reason")} for e in g.late]}
        return {"target": self.target, "backend": self.backend, "prompts": self.prompts,
                "new_tokens": self.new_tokens, "plan": self.plan, "dynamic": run(self.dynamic),
                "static": run(self.static), "token_agreement": self.agreement, "summary": self.summary(),
                "refused": {k: r.to_dict() for k, r in self.refused.items()}}


def check(lm, texts: list[str], targets, new_tokens: int, backend: str, precision=None) -> dict[str, TargetGeneration]:
    """Greedy generation of `new_tokens` for the `texts` (one batch) on every target's compile backend
    (`backend`: "auto" or a backend name, selection.py), with the dynamic cache and with the bucketed static
    cache. The stage passes its options (stage.check_generation)."""
    generation.check_generates(lm)
    plan = generation.plan_of(lm, texts, new_tokens)
    names = specs.parse_targets(targets)
    detected = {n: specs.detect(n) for n in names}
    chosen = {n: selection.backend_for(detected[n], backend, (precision or {}).get(n))[0] for n in names}
    fresh = {n: selection.backend_for(detected[n], backend, (precision or {}).get(n))[0] for n in names}  # own records
    runs = {"dynamic": generation.generate_dynamic_for(lm, texts, new_tokens, chosen, max_length=generation.MAX_PROMPT),
            "static": generation.generate_static_for(lm, texts, new_tokens, plan, fresh)}
    eager: dict = {}         # {cache: Refused or None}, the eager rerun, once for every target
    out = {}
    for name in names:
        found, refused = {}, {}
        for cache, per_target in runs.items():
            run = per_target[name]
            if isinstance(run, BaseException):
                if cache not in eager:
                    eager[cache] = generation.refusal(lm, texts, cache)
                if eager[cache] is None:      # it runs eagerly: the compiled failure is not the model's refusal
                    raise run
                run, refused[cache] = None, eager[cache]
            found[cache] = run
        label = chosen[name] if isinstance(chosen[name], str) else getattr(chosen[name], "__name__",
                                                                           type(chosen[name]).__name__)
        out[name] = TargetGeneration(detected[name].to_dict(), label, len(texts), new_tokens,
                                     {"prompt_buckets": list(plan.prompt_buckets),
                                      "context_buckets": list(plan.context_buckets), "batch": plan.batch,
                                      "overflow": plan.overflow,
                                      "encoder_decoder": generation.is_encoder_decoder(lm),
                                      "fixed_source": encoder_decoder.fixed_source(lm)},
                                     found["dynamic"], found["static"], refused)
    torch.compiler.reset()
    return out
