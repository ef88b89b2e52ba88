"""Stage 3's padding figure: padded tokens of `optimal` divided by those of `pow2` with the same
number of buckets, on the standard library's docstrings tokenized by minilm's own tokenizer.

    .venv/bin/python benchmarks/bench_padding.py

Every number of buckets pow2 can make (k = 1 .. 10 at minilm's 512 tokens) is printed; the figure
is pow2's default recipe, NxD Inference's generate_buckets(128, max_length) = [128, 256, 512].
Aim: 0.6 or less.
"""
from __future__ import annotations

from portkit.stages.buckets import stage
from portkit.corpora import corpus
from portkit.models import registry


def main() -> None:
    model = registry.load("minilm")
    dist = stage.distribution(corpus.load_corpus("stdlib"), model)
    hist = stage.histogram(dist)
    print(f"{dist}")
    print(f"{hist}; {hist.real_tokens:,} real tokens")
    print(f"{'k':>3} {'pow2 boundaries':<44} {'pow2 padded':>12} {'optimal padded':>15} {'ratio':>6}")
    pow2_max = stage.plan_pow2(hist, k=64).k
    for k in range(1, pow2_max + 1):
        pow2, best = stage.plan_pow2(hist, k=k), stage.plan_optimal(hist, k)
        print(f"{k:>3} {str(list(pow2.boundaries)):<44} {pow2.padded_tokens:>12,} {best.padded_tokens:>15,} "
              f"{best.padded_tokens / pow2.padded_tokens:>6.3f}")
    pow2 = stage.plan_pow2(hist)
    best = stage.plan_optimal(hist, pow2.k)
    print(f"pow2 default (from 128, NxD Inference): {list(pow2.boundaries)}, {pow2.padded_tokens:,} padded tokens "
          f"({pow2.waste:.1%} of computed tokens)")
    print(f"optimal with {best.k} buckets: {list(best.boundaries)}, {best.padded_tokens:,} padded tokens "
          f"({best.waste:.1%} of computed tokens)")
    ratio = best.padded_tokens / pow2.padded_tokens
    print(f"ratio optimal/pow2 padded tokens at k={best.k} = {ratio:.3f} (aim: <= 0.6)")


if __name__ == "__main__":
    main()
