"""Stage 3 with workload "generate": the buckets for serving a causal LM (prompts and contexts) or an encoder-decoder
(sources and its decoder context), priced per target.

    >>> found = generation_buckets.fit(m, corpus, costs, token_seconds, new_tokens=16, serve_requests=10_000_000,
    ...                                max_batch=1)      # the stage passes its options (buckets.serving_plans)

Serving a causal LM with a static KV cache compiles two kinds of graph (portkit/workloads/generation.py): a prefill
graph per prompt bucket, and a decode step per context bucket (the cache's length: the prompt plus the
tokens generated so far). The prompt lengths are the corpus's real ones (token counts under the model's
tokenizer); each request's context reaches its prompt plus `new_tokens`. For each target, with its own
compile cost (portkit/planning/economics.py: measured XLA for TPU, the cited estimate for Neuron):
- `auto`: each of the two bucket sets minimises warm-up compiles + padding for `serve_requests` requests
  (planner.plan_auto); a padded prompt position is priced at the target's `token_seconds`
  (economics.padding_prices: FLOPs and bytes at the chip's roofline, an estimate; measured natively),
  and a padded cache position the same, once per request: an upper bound, as a decode step reads the
  padded cache rather than recomputing it;
- `pow2`: what vLLM-TPU and NxD Inference make, powers of two from MIN_PROMPT_BUCKET (prompts) and twice
  that (contexts) up to the longest.
Batch buckets multiply both sets (planner.batch_buckets(max_batch)); every compile is priced. An encoder-decoder
is served with source buckets and one decoder context instead (fit_sources; docs/guides/generation.md says why).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from portkit.corpora.corpus import percentiles
from portkit.planning import economics
from portkit.workloads import encoder_decoder, generation
from portkit.workloads.decoding import CAUSAL, ENCODER_DECODER, SERVING_HEADERS, SERVING_LABELS
from portkit.planning.planner import BucketPlan, Prices, batch_buckets, histogram, plan_auto, plan_pow2
from portkit.core.tables import HtmlTable


def lengths(model, corpus, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, context lengths): each corpus text's tokens, cut so that its context (prompt +
    new_tokens) fits the model; the context is the prompt plus new_tokens."""
    counted = np.array([len(x) for x in model.tokenizer(list(corpus.texts), verbose=False)["input_ids"]])
    prompts = np.clip(counted, 1, max(1, model.max_length - new_tokens))
    return prompts, prompts + new_tokens


@dataclass
class ServingPlans:
    """Per target: the auto and pow2 prefill and decode bucket sets, each priced."""
    new_tokens: int
    serve_requests: int
    batch_sizes: tuple[int, ...]
    percentiles: dict
    targets: dict           # name -> {"compile": label, "kind": KIND, "auto": {...}, "pow2": {...}}
    kind: str = CAUSAL

    def summary(self) -> str:
        parts = []
        first, second = SERVING_LABELS[self.kind]
        for name, t in self.targets.items():
            a, p = t["auto"], t["pow2"]
            parts.append(f"{name}: auto {a['prompt']['k']} {first} x {a['context']['k']} {second}, "
                         f"{a['compiles']} warm-up compiles ({a['warmup_seconds']:,.0f} s) against pow2 "
                         f"{p['prompt']['k']} x {p['context']['k']}, {p['compiles']} compiles "
                         f"({p['warmup_seconds']:,.0f} s)")
        return (f"{'encoder-decoder ' if self.kind == ENCODER_DECODER else ''}generation of {self.new_tokens} tokens, "
                f"{self.serve_requests:,} requests: " + " | ".join(parts))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "new_tokens": self.new_tokens, "serve_requests": self.serve_requests,
                "batch_sizes": list(self.batch_sizes), "percentiles": self.percentiles, "targets": self.targets,
                "summary": self.summary()}

    def table(self) -> HtmlTable:
        rows = []
        for name, t in self.targets.items():
            for plan in ("auto", "pow2"):
                p = t[plan]
                rows.append([name, plan, str(p["prompt"]["boundaries"]), f"{p['prompt']['padding_waste']:.1%}",
                             str(p["context"]["boundaries"]), f"{p['context']['padding_waste']:.1%}", p["compiles"],
                             f"{p['warmup_seconds']:,.0f}", f"{p['padding_seconds']:,.0f}",
                             f"{p['warmup_seconds'] + p['padding_seconds']:,.0f}",
                             t["compile"] if plan == "auto" else ""])
        return HtmlTable(["target", "plan", *SERVING_HEADERS[self.kind], "warm-up compiles", "warm-up s", "padding s",
                          "total s", "one compile"], rows, self.summary())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def __str__(self) -> str:
        return str(self.table())


def _priced(prompt: BucketPlan, context: BucketPlan, cost, token_seconds: float, batches: int, requests: int) -> dict:
    warmup = batches * sum(cost.seconds(b) for b in (*prompt.boundaries, *context.boundaries))
    padded = prompt.padded_tokens * requests / prompt.requests + context.padded_tokens * requests / context.requests
    return {"prompt": _plan(prompt), "context": _plan(context), "compiles": batches * (prompt.k + context.k),
            "warmup_seconds": float(warmup), "padding_seconds": float(padded * token_seconds)}


def _plan(p: BucketPlan) -> dict:
    return {"boundaries": list(p.boundaries), "k": p.k, "padding_waste": p.padded_tokens /
            max(p.padded_tokens + p.real_tokens, 1), "why": p.why}


def fit(model, corpus, costs: dict, token_seconds, new_tokens: int, serve_requests: int,
        max_batch: int, budget_seconds: float | None = None) -> ServingPlans:
    """The auto and pow2 prefill/decode bucket sets per target (see the module docstring)."""
    generation.check_causal(model)
    prompts, contexts = lengths(model, corpus, new_tokens)
    hists = histogram(prompts), histogram(contexts)
    batches = batch_buckets(max_batch)
    out = {}
    for name, cost in costs.items():
        price = economics.price_of(token_seconds, name)
        prices = Prices(cost.seconds, float(price), cost.label(), economics.price_source(price))
        auto = [plan_auto(h, prices, serve_requests, batch_buckets=len(batches), budget_seconds=budget_seconds)
                for h in hists]
        pow2 = [plan_pow2(hists[0], minimum=generation.MIN_PROMPT_BUCKET),
                plan_pow2(hists[1], minimum=2 * generation.MIN_PROMPT_BUCKET)]
        out[name] = {"compile": cost.label(), "kind": CAUSAL,
                     "auto": _priced(*auto, cost, float(price), len(batches), serve_requests),
                     "pow2": _priced(*pow2, cost, float(price), len(batches), serve_requests),
                     "padding_price": economics.prices_to_dict({name: price})[name]}
    pct = {"prompt": percentiles(prompts), "context": percentiles(contexts)}
    return ServingPlans(int(new_tokens), int(serve_requests), tuple(batches), pct, out)


def fit_sources(hist, costs: dict, token_seconds, new_tokens: int, serve_requests: int, max_batch: int,
                 budget_seconds: float | None = None) -> ServingPlans:
    """An encoder-decoder's serving plans per target: auto and pow2 source buckets over `hist` (its source lengths,
    the stage's histogram), one decoder context (encoder_decoder.decoder_context), GRAPHS_PER_SOURCE graphs per
    source bucket and batch size."""
    graphs, context = encoder_decoder.GRAPHS_PER_SOURCE, encoder_decoder.decoder_context(new_tokens)
    batches = batch_buckets(max_batch)
    one = {"boundaries": [context], "k": 1, "padding_waste": (context - new_tokens) / context,
           "why": f"one decoder context: {new_tokens} new tokens, rounded up as stage 2 compiled them"}
    out = {}
    for name, cost in costs.items():
        price = economics.price_of(token_seconds, name)
        per_bucket = lambda b, cost=cost: graphs * cost.seconds(b)   # noqa: E731 (one source bucket's graphs)
        label = f"{graphs} graphs per source bucket, each {cost.label()}"
        prices = Prices(per_bucket, float(price), label, economics.price_source(price))
        plans = {"auto": plan_auto(hist, prices, serve_requests, batch_buckets=len(batches),
                                   budget_seconds=budget_seconds),
                 "pow2": plan_pow2(hist, minimum=generation.MIN_PROMPT_BUCKET)}
        out[name] = {"compile": label, "kind": ENCODER_DECODER,
                     "padding_price": economics.prices_to_dict({name: price})[name]}
        for which, plan in plans.items():
            out[name][which] = {
                "prompt": _plan(plan), "context": one, "compiles": len(batches) * graphs * plan.k,
                "warmup_seconds": float(len(batches) * sum(per_bucket(b) for b in plan.boundaries)),
                "padding_seconds": float(plan.padded_tokens * serve_requests / plan.requests * float(price))}
    pct = {"prompt": percentiles(np.repeat(hist.values, hist.counts)), "context": percentiles(np.array([context]))}
    return ServingPlans(int(new_tokens), int(serve_requests), tuple(batches), pct, out, ENCODER_DECODER)
