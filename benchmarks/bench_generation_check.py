"""Stage 2's generation check (workload "generate") for both targets: one Dynamo trace shared by the emulated
targets (generation.generate_static_for / generate_dynamic_for) against one trace per target, side by side in one run.

    PYTHONPATH=. python benchmarks/bench_generation_check.py [--model llama] [--prompts 4] [--tokens 16]

Both ways run portkit.stages.compile.generation.check: once with both targets (one trace), then once per target
(each its own trace, as before the traces were shared). Every target's compiles, warm-up compiles and tokens must be
equal both ways (checked, printed). A short check runs first so that neither way pays the first call's costs. The
host's speed is printed beside the seconds: one MiniLM Dynamo trace in a fresh process (bench_workbook's probe), 1.1
s on a quiet host of this kind.
"""
from __future__ import annotations

import argparse
import time

import torch
from _inductor_cache import own_inductor_cache
from bench_workbook import _trace_seconds

from portkit.corpora import corpus
from portkit.models import registry
from portkit.stages.compile.generation import check

TARGETS = ("neuron", "tpu")


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _counts(found) -> tuple:
    return (found.dynamic.compiles, found.static.warmup_compiles, found.static.compiles,
            found.dynamic.tokens.tolist(), found.static.tokens.tolist())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    lm = registry.load(args.model)
    texts = corpus.load_corpus().sample(args.prompts, seed=0)
    trace = _trace_seconds()
    print(f"{lm.summary()}; {args.prompts} prompts, {args.tokens} new tokens, targets {', '.join(TARGETS)} (emulated)")
    check(lm, texts[:1], ["tpu"], 2, "auto")    # first-call costs (imports, the backends) apart
    separate, apart = {}, 0.0
    for name in TARGETS:
        found, seconds = _timed(lambda n=name: check(lm, texts, [n], args.tokens, "auto"))
        separate[name], apart = found[name], apart + seconds
    shared, together = _timed(lambda: check(lm, texts, list(TARGETS), args.tokens, "auto"))
    same = all(_counts(shared[n]) == _counts(separate[n]) for n in TARGETS)
    for name in TARGETS:
        d, s = shared[name].dynamic, shared[name].static
        print(f"  {name}: dynamic cache {d.compiles} compiles; static cache {s.warmup_compiles} in warm-up, "
              f"{s.compiles} after")
    print(f"every target's compiles and tokens equal both ways: {same}")
    print(f"one trace per target: {apart:.1f} s; one trace shared: {together:.1f} s; ratio {apart / together:.2f}x "
          f"(host: one MiniLM Dynamo trace {trace:.2f} s, about 1.1 s on a quiet host)")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    with own_inductor_cache():
        main()
