"""The whole workbook: wall time of `portkit run --model minilm --target neuron --target tpu`, per stage.

    .venv/bin/python benchmarks/bench_workbook.py [--cold] [--out DIR]

Runs the CLI exactly as a user would (a fresh process, papermill kernels per stage) and prints each
stage's seconds beside the total, so the slowest stage is visible. --cold gives Inductor an empty
compile cache first, as on a fresh machine (the XLA verdict cache under portkit's cache root is kept:
delete its xla-verdicts folder for XLA compiles from scratch). Aim on a 2-core machine: 120 s or less
cold, 60 s or less warm (issue #12).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _inductor_cache import own_inductor_cache

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="start from an empty Inductor cache")
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="portkit-bench-"))
    portkit = Path(sys.executable).parent / "portkit"
    with own_inductor_cache() if args.cold else contextlib.nullcontext():   # the run inherits it
        start = time.perf_counter()
        done = subprocess.run([str(portkit), "run", "--model", "minilm", "--target", "neuron", "--target", "tpu",
                               "--out", str(out), "--no-progress"], capture_output=True, text=True)
        total = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        sys.exit(f"portkit run failed with exit code {done.returncode}")
    stages = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\[(\w+)\] .* \((\d+) s\)$", done.stdout, re.M)}
    print(f"portkit run --model minilm --target neuron --target tpu ({'cold' if args.cold else 'warm'} "
          f"Inductor cache, {os.cpu_count()} CPUs) -> {out}")
    for name, seconds in stages.items():
        print(f"  {name:10s} {seconds:6.0f} s  {'#' * int(seconds / 2)}")
    slowest = max(stages, key=stages.get) if stages else "?"
    aim = 120 if args.cold else 60
    print(f"total wall time {total:.0f} s ({total / 60:.1f} min; aim <= {aim} s); slowest stage: {slowest}")
    verdicts = json.loads((out / "report.json").read_text())["targets"]
    print("verdicts: " + ", ".join(f"{n}: {t['verdict']}" for n, t in verdicts.items()))


if __name__ == "__main__":
    main()
