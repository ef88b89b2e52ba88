"""Stage 2's cost: portkit's emulated compile backends vs plain Inductor, side by side in one run.

    .venv/bin/python benchmarks/bench_compile.py [--rounds 3] [--repeats 15] [--threads 1]

minilm (real weights), real stdlib texts, torch.no_grad, dynamic=False.
- compile time: time inside the backend for one new shape (batch 1), every compile at a length no
  other compile used, in an Inductor cache of this run's own (so no cache serves it, on any rerun
  either), torch._dynamo.reset() before each, the backends interleaved in a rotating order, medians
  over the rounds;
- steady-state forward: batch 8 x 128 compiled once per backend, calls interleaved, medians.
Aim: ratios of at most 1.1 (compile) and 1.02 (forward). portkit_tpu at its default precision also
compiles and runs the TPU's bf16 rounding (more kernels: the rounded attention cannot use the fused
attention kernel), which plain Inductor does not do; portkit_tpu:highest has no rounding and shows
the cost of portkit's own machinery (refusal checks, retrace, op table).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from _inductor_cache import own_inductor_cache

from portkit import backends, data, models

VARIANTS = ("inductor", "portkit_neuron", "portkit_tpu", "portkit_tpu:highest")


def _backend(variant: str):
    # A fresh emulated backend per compile (its own checks); plain Inductor by its registered name.
    if variant == "inductor":
        return variant
    name, _, precision = variant.partition(":")
    return backends.emulated_backend(name.removeprefix("portkit_"), precision or None)


def _rotated(items, k):
    return items[k % len(items):] + items[:k % len(items)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads for the forward timing (the host may be shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = models.load("minilm")
    corpus = data.load_corpus()
    text = max(corpus.sample(50, seed=0), key=len)
    warmup = backends.warm_inductor()

    compile_s = {v: [] for v in VARIANTS}
    length = 40
    for r in range(args.rounds):
        for variant in _rotated(VARIANTS, r):
            length += 1
            inputs = model.encode([text], pad_to=length)
            torch._dynamo.reset()
            counter = backends.CompileCounter(_backend(variant))
            with torch.no_grad():
                torch.compile(model.module, backend=counter, dynamic=False)(**inputs)
            assert len(counter.events) == 1 and not counter.events[0].cache_hit, counter.events
            compile_s[variant].append(counter.events[0].seconds)

    inputs, described = data.example_batch(model, corpus, 8, 128, seed=0)
    torch._dynamo.reset()
    compiled, forward_s = {}, {v: [] for v in VARIANTS}
    with torch.no_grad():
        for variant in VARIANTS:
            compiled[variant] = torch.compile(model.module, backend=_backend(variant), dynamic=False)
            for _ in range(3):
                compiled[variant](**inputs)
        for rep in range(args.repeats):
            for variant in _rotated(VARIANTS, rep):
                start = time.perf_counter()
                compiled[variant](**inputs)
                forward_s[variant].append(time.perf_counter() - start)
    torch._dynamo.reset()

    c = {v: statistics.median(s) for v, s in compile_s.items()}
    f = {v: statistics.median(s) for v, s in forward_s.items()}
    print(f"model minilm, torch {torch.__version__}; Inductor warm-up {warmup:.1f} s (not counted); compile: "
          f"batch 1, {args.rounds} rounds at fresh lengths; forward: {described}, {args.repeats} interleaved "
          f"repeats, {args.threads} thread(s)")
    for v in VARIANTS:
        print(f"{v:20s} compile median {c[v]:6.2f} s   forward median {f[v] * 1e3:7.1f} ms")
    for v in VARIANTS[1:]:
        print(f"ratio {v}/inductor: compile = {c[v] / c['inductor']:.3f} (aim <= 1.1), "
              f"forward = {f[v] / f['inductor']:.3f} (aim <= 1.02)")


if __name__ == "__main__":
    with own_inductor_cache():
        main()
