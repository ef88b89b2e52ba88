"""Stage 1's cost: forward time under portkit's op recorder vs the plain forward, side by side.

    .venv/bin/python benchmarks/bench_recording.py [--repeats 15]

minilm (real weights), batch 8, sequence 128, real stdlib texts, torch.no_grad, interleaved runs
after warm-up; the medians are compared. Aim: ratio 1.2 or less. Also the share of the recording
that naming each op's source frame costs (#18): the recorder with portkit.core.owners.caller as it is,
against the same recorder with it stubbed out, interleaved in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from portkit.corpora import corpus
from portkit.stages.fallbacks import stage
from portkit.core import owners
from portkit.models import registry
from portkit.stages.fallbacks import recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = registry.load("minilm")
    inputs, described = corpus.example_batch(model, corpus.load_corpus(), 8, 128, seed=0)
    module = model.module

    def plain():
        with torch.no_grad():
            module(**inputs)

    def recorded():
        stage.record(model, inputs, train=False)

    def without_frames():
        recording.owners.caller = lambda depth=1: None
        try:
            stage.record(model, inputs, train=False)
        finally:
            recording.owners.caller = caller

    caller = owners.caller
    for _ in range(3):
        plain(), recorded()
    times = {"plain": [], "recorded": [], "without_frames": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("recorded", recorded), ("without_frames", without_frames)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    p, r = statistics.median(times["plain"]), statistics.median(times["recorded"])
    print(f"model minilm, {described}, {args.repeats} interleaved repeats, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"plain forward    median {p * 1e3:8.1f} ms")
    print(f"recorded forward median {r * 1e3:8.1f} ms")
    print(f"ratio recorded/plain = {r / p:.3f} (aim: <= 1.2)")
    n = statistics.median(times["without_frames"])
    print(f"recorded without source frames median {n * 1e3:8.1f} ms; ratio recorded/without frames = {r / n:.3f}")


if __name__ == "__main__":
    main()
