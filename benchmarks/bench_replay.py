"""Stage 3's end-to-end figure: 256 real requests through minilm compiled with Inductor, without
buckets (one compile per distinct shape, Dynamo's recompile limit raised so none runs eagerly) and
with the `auto` plan (warm-up, then recompiles forbidden). Total time without / with buckets.

    .venv/bin/python benchmarks/bench_replay.py [--requests 256] [--compile-seconds S]

auto prices a compile at the measured cold compile time of one minilm shape on this machine
(as stage 2 measures it) unless --compile-seconds is given, and padding at the measured eager time
per token. Each run starts from an empty Inductor cache (fresh_caches=True), as a fresh deployment
does, so neither run reuses the other's compiled kernels; the whole benchmark compiles into an Inductor
cache of its own, so a rerun starts as cold as the first. Aim: ratio 10 or more.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from _inductor_cache import own_inductor_cache

from portkit.stages.buckets import bucketed
from portkit.stages.buckets import trace_replay
from portkit.stages.buckets import stage
from portkit.corpora.corpus import load_corpus, make_trace
from portkit.planning import economics
from portkit.models import registry
from portkit.planning import planner


def cold_compile_seconds(model, lengths=(7, 13)) -> float:
    """Median first-call time of minilm at fresh shapes, with a fresh Inductor cache each."""
    from torch._inductor.utils import fresh_cache
    bucketed.warm_inductor()
    times = []
    for length in lengths:
        torch._dynamo.reset()
        with fresh_cache(), torch.no_grad():
            compiled = torch.compile(model.module, backend="inductor", dynamic=False)
            inputs = model.encode(["Return the sum of a and b."], pad_to=length)
            start = time.perf_counter()
            compiled(**inputs)
            times.append(time.perf_counter() - start)
    torch._dynamo.reset()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--compile-seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, corpus = registry.load("minilm"), load_corpus("stdlib")
    dist = stage.distribution(corpus, model)
    hist = stage.histogram(dist)
    token_seconds = economics.padding_price(model, "cpu", hist.top).seconds   # this CPU is the target here
    compile_seconds = args.compile_seconds or cold_compile_seconds(model)
    source = "--compile-seconds" if args.compile_seconds else "measured cold compile of one minilm shape"
    trace = make_trace(corpus, model, args.requests, args.seed, dist=dist)
    prices = planner.Prices(compile_seconds, token_seconds, compile_source=source)
    auto = stage.plan_buckets(hist, "auto", prices=prices, requests=len(trace.texts))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend inductor")
    print(trace)
    print(f"auto: {auto}\n  why: {auto.why}")
    base, mine = trace_replay.replay(model, trace, [auto], backend="inductor",
                                 settings=trace_replay.ReplaySettings(progress=False, fresh_caches=True))
    for run in (base, mine):
        print(run)
    print(f"padding check per bucket: {'ok' if mine.padding_ok else 'FAILED'} "
          f"(max abs error {max(c['max_abs_error'] for c in mine.padding_checks):.1e}); "
          f"compiles after warm-up: {mine.compiles_after_warmup}")
    print(f"ratio total time no buckets/auto = {base.total_seconds / mine.total_seconds:.1f} "
          f"({base.compiles} vs {mine.compiles} compiles) (aim: >= 10)")


if __name__ == "__main__":
    with own_inductor_cache():
        main()
