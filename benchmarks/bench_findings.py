"""Eager findings against the compiled graphs on real architectures (#18), and what the check costs.

    .venv/bin/python benchmarks/bench_findings.py [--model minilm --model t5 ...] [--seq 16]

Per model (MiniLM with its real weights; gpt2, llama, t5, bert, vit, mamba from their configs), one batch
of 2 real stdlib texts: stage 1's eager recording, then stage 2's capture (torch._dynamo.explain and
one fullgraph capture checked by both emulated targets), timed side by side in one run; then every eager
finding per target with its eager severity, its status under torch.compile, its final severity, whose
code it is and its line. First, what recording the graphs' contents adds to the capture (MiniLM, with
and without, interleaved). Times are this CPU's and noisy (a shared 2-core host): read the ratio.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from portkit.stages.compile.stage import find_graph_breaks
from portkit.corpora.corpus import example_batch, load_corpus
from portkit.stages.fallbacks.stage import find_fallbacks
from portkit.models import registry
from portkit.stages import reconcile

MODELS = ("minilm", "gpt2", "llama", "t5", "bert")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"models to check (default: {', '.join(MODELS)})")
    parser.add_argument("--seq", type=int, default=16, help="tokens per text")
    args = parser.parse_args()
    corpus, targets = load_corpus(), ["neuron", "tpu"]
    contents_cost(registry.load("minilm"), example_batch(registry.load("minilm"), corpus, 2, args.seq)[0], targets)
    for name in args.model or MODELS:
        m = registry.load(name)
        inputs, described = example_batch(m, corpus, 2, args.seq)
        start = time.perf_counter()
        eager = find_fallbacks(m, inputs, targets)
        recorded = time.perf_counter() - start
        start = time.perf_counter()
        breaks = find_graph_breaks(m, inputs, targets)
        captured = time.perf_counter() - start
        print(f"== {name} ({described}): stage 1 eager pass {recorded:.2f} s, stage 2 capture with its graph "
              f"contents {captured:.2f} s; {breaks.summary()}")
        compiled = {"graph_breaks": breaks.to_dict()}
        for target in targets:
            found = reconcile.reconcile(eager.to_dict()["targets"][target]["findings"], compiled, target)
            counts = collections.Counter(f["compiled"] for f in found)
            print(f"  {target}: {len(found)} eager findings: " + ", ".join(f"{n} {k}" for k, n in counts.items())
                  + (f"; {reconcile.vanished_line(found)}" if reconcile.vanished_line(found) else ""))
            for f in found:
                where = (f.get("where") or {}).get("text", "(no line)")
                print(f"    {f['eager_severity']:>7} -> {f['severity']:<7} {f['compiled']:<11} "
                      f"{f['owner']['owner']:<20} {f['kind']:<15} {where[:100]}")


def contents_cost(m, inputs, targets, repeats: int = 3) -> None:
    """What recording the graphs' contents adds to stage 2's capture: interleaved runs, medians."""
    times = {True: [], False: []}
    for _ in range(repeats + 1):
        for contents in (True, False):
            start = time.perf_counter()
            find_graph_breaks(m, inputs, targets, contents=contents)
            times[contents].append(time.perf_counter() - start)
    on, off = (statistics.median(times[c][1:]) for c in (True, False))
    print(f"minilm capture ({len(times[True]) - 1} interleaved repeats after a warm-up): with graph contents "
          f"{on:.2f} s, without {off:.2f} s; ratio with/without = {on / off:.3f}")


if __name__ == "__main__":
    main()
