"""Stage 4's cost: per-layer localization time vs one reference forward plus one target forward.

    .venv/bin/python benchmarks/bench_accuracy.py [--repeats 7]

minilm (real weights), batch 8, sequence 128, real stdlib texts, target TPU at its default precision
(eager emulation: matmul operands rounded to bf16). Localization = the reference pass that keeps every
module's output + the target pass compared module by module + the summary (accuracy.localize). The
baseline is the same two passes without hooks. Interleaved runs after warm-up; medians compared.
Aim: ratio 2 or less.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from portkit.stages.accuracy import stage
from portkit.corpora import corpus
from portkit.models import registry
from portkit.targets import numerics
from portkit.targets import specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model = registry.load("minilm")
    inputs, described = corpus.example_batch(model, corpus.load_corpus(), 8, 128, seed=0)
    module, tpu = model.module.eval(), specs.get("tpu")

    def plain():
        with torch.no_grad():
            module(**inputs)
            with numerics.emulate(tpu):
                module(**inputs)

    found = {}

    def localized():
        found.update(stage.localize(model, inputs, "tpu"))

    for _ in range(2):
        plain(), localized()
    times = {"plain": [], "localized": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("localized", localized)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    p, loc = statistics.median(times["plain"]), statistics.median(times["localized"])
    print(f"model minilm, {described}, target tpu precision default (eager emulation), {args.repeats} "
          f"interleaved repeats, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"reference + target forward     median {p * 1e3:8.1f} ms")
    print(f"per-layer localization        median {loc * 1e3:8.1f} ms ({found['modules_compared']} modules compared, "
          f"first out of tolerance: {(found['first_failing'] or {}).get('module')})")
    print(f"ratio localization/(reference+target) = {loc / p:.3f} (aim: <= 2)")


if __name__ == "__main__":
    main()
