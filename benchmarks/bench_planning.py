"""Stage 3's planning time: one million request lengths to an exact `optimal` plan, and to the
`auto` plan (which solves every k up to 16), histogram included.

    .venv/bin/python benchmarks/bench_planning.py [--repeats 7]

The lengths are drawn (seeded, with replacement) from the standard library's docstrings tokenized
by minilm's tokenizer, capped at its 512 tokens. Aim: under 0.2 seconds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from portkit.stages.buckets import stage
from portkit.corpora import corpus
from portkit.models import registry
from portkit.planning import planner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    model = registry.load("minilm")
    dist = stage.distribution(corpus.load_corpus("stdlib"), model)
    lengths = np.random.default_rng(0).choice(dist.lengths, size=1_000_000)
    times = {"optimal": [], "auto": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        best = stage.plan_buckets(lengths, "optimal", k=args.k, max_seq=model.max_length)
        times["optimal"].append(time.perf_counter() - start)
        start = time.perf_counter()
        auto = stage.plan_buckets(lengths, "auto", max_seq=model.max_length, prices=planner.Prices(10.0, 2e-4))
        times["auto"].append(time.perf_counter() - start)
    hist = stage.histogram(lengths, model.max_length)
    print(f"{lengths.size:,} lengths, {hist.values.size} distinct after the cap at {model.max_length}; "
          f"median of {args.repeats} runs")
    print(f"optimal k={args.k}: {best}  median {statistics.median(times['optimal']):.4f} s")
    print(f"auto (k <= {stage.K_MAX}): {auto}  median {statistics.median(times['auto']):.4f} s")
    print(f"planning time for 1,000,000 lengths: optimal {statistics.median(times['optimal']):.3f} s, auto "
          f"{statistics.median(times['auto']):.3f} s (aim: < 0.2 s)")


if __name__ == "__main__":
    main()
