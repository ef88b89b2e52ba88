"""Stage 2's recompile storm: every shape compiled here against the first COMPILE_SHAPES compiled and the
rest counted from Dynamo's own refusals (portkit/stages/compile/storm.py), side by side in one run.

    .venv/bin/python benchmarks/bench_storm.py [--requests 100] [--model minilm]

Both replay the same real requests (stdlib docstrings, each at its own length, batch 1) for both emulated
targets; printed: wall time of each, the ratio, and the compile counts per target (they must agree: the
counted storm is the same storm, only cheaper here).
"""
from __future__ import annotations

import argparse
import time

from portkit.stages.compile import stage
from portkit.corpora import corpus
from portkit.models import registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = stage.Options.defaults()          # the notebook's parameters cell
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args()
    m = registry.load(args.model)
    stream = stage.make_requests(m, corpus.load_corpus(), args.requests, batch_size=1,
                                     max_tokens=defaults.seq_len, seed=defaults.seed)
    results = {}
    for label, shapes in (("counted past the first shapes", stage.COMPILE_SHAPES),
                          ("every shape compiled", None)):
        start = time.perf_counter()
        storms = stage.recompile_storms(m, stream, ["neuron", "tpu"], defaults, progress=False,
                                            compile_shapes=shapes)
        results[label] = (time.perf_counter() - start, storms)
        counts = ", ".join(f"{n}: {s.compile_count()} compiles ({len(s.compiles)} made here, {s.counted()} counted)"
                           for n, s in storms.items())
        print(f"{label:32s} {results[label][0]:6.1f} s   {counts}")
    (fast, counted), (slow, full) = results.values()
    same = all(counted[n].compile_count() == full[n].compile_count() for n in full)
    print(f"storm of {args.requests} requests, {counted['tpu'].distinct_shapes()} shapes: counted/compiled-all time "
          f"ratio {fast / slow:.2f} ({slow / fast:.1f}x faster); compile counts agree: {same}")


if __name__ == "__main__":
    main()
