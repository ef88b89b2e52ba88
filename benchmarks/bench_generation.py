"""Generating 64 tokens for 16 real corpus prompts: the default dynamic KV cache compiled for a
target against the bucketed static cache, compiles and total time side by side, in one run. An encoder-decoder
(--model a T5, BART or Whisper folder) generates from 16 sources with its two caches (workloads.encoder_decoder).

    PYTHONPATH=. python benchmarks/bench_generation.py [--model llama] [--target tpu] [--tokens 64]

Dynamic: every decode step is a new cache length, so a compile (the recompile limit lifted, as on a
static-shape target with no eager fallback). Static: transformers' StaticCache, one prefill per prompt
bucket and one decode per context bucket compiled in warm-up, then the generation under
fail_on_recompile. Model: from a small config with seeded weights (portkit.models.registry), labelled so.
Timings on a shared CPU are noisy; the ratio is what the run measured.
"""
from __future__ import annotations

import argparse

import torch
from _inductor_cache import own_inductor_cache
from bench_workbook import _trace_seconds

from portkit.targets import backends
from portkit.corpora import corpus
from portkit.workloads import generation
from portkit.models import registry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--target", default="tpu", choices=sorted(backends.REGISTERED))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    lm = registry.load(args.model)
    texts = corpus.corpus_for(lm).sample(args.prompts, seed=0)     # an encoder-decoder's sources (clips: speech)
    if generation.is_encoder_decoder(lm):
        plan, what = generation.plan_of(lm, texts, args.tokens), "sources (encoder-decoder)"
    else:
        plan, what = generation.Plan(prompt_buckets=(32, 64), context_buckets=(64, 128), batch=args.prompts), "prompts"
    sizes = lm.token_lengths(texts) if lm.seq_dim == "tokens" else [0]
    print(f"{lm.summary()}; {args.prompts} {what} of {min(sizes)}-{max(sizes)} tokens, "
          f"{args.tokens} new tokens, target {args.target} (emulated); plan {plan}")
    dynamic = generation.generate_dynamic(lm, texts, args.tokens, backends.emulated_backend(args.target),
                                          max_length=64, limit=False)
    static = generation.generate_static(lm, texts, args.tokens, plan, backend=backends.emulated_backend(args.target))
    dyn_total, st_total = dynamic.seconds, static.warmup_seconds + static.seconds
    st_compiles = static.warmup_compiles + static.compiles
    print(f"{'':24}{'dynamic cache':>16}{'static buckets':>16}{'ratio':>10}")
    print(f"{'compiles':24}{dynamic.compiles:>16}{st_compiles:>16}{dynamic.compiles / max(st_compiles, 1):>9.1f}x")
    print(f"{'compiles after warm-up':24}{dynamic.compiles:>16}{static.compiles:>16}")
    print(f"{'total seconds':24}{dyn_total:>16.1f}{st_total:>16.1f}{dyn_total / st_total:>9.1f}x")
    print(f"{'  of which warm-up':24}{0:>16.1f}{static.warmup_seconds:>16.1f}")
    agree = (dynamic.tokens == static.tokens).float().mean().item() * 100
    print(f"token agreement dynamic vs static (target numerics both, truncation at 64 both): {agree:.1f}%")
    print(f"host: one MiniLM Dynamo trace {_trace_seconds():.2f} s (about 1.1 s on a quiet host)")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    with own_inductor_cache():
        main()
