"""The whole workbook: wall time of `portkit run --model minilm --target neuron --target tpu`, per stage.

    .venv/bin/python benchmarks/bench_workbook.py [--cold] [--out DIR] [--lanes 2,3 [--pairs 3]]

Runs the CLI exactly as a user would (a fresh process, one papermill kernel for the stages) and prints each
stage's seconds beside the total, so the slowest stage is visible. Without --cold: one run with the
caches as found. --cold: a run from empty caches, as on a fresh machine (a new portkit cache root,
so no XLA verdicts, lowerings or derived corpora, and an empty Inductor cache), then a warm rerun in
a new run folder with the caches the cold run filled; both side by side, with the host's speed at the time
(one MiniLM Dynamo trace, timed before and after: on a shared machine it varies by half), and the aims (COLD_AIM,
WARM_AIM) on a 2-core machine. --lanes A,B: warm runs with `--lanes A` and `--lanes B` alternated (--pairs
of them, the first pair's runs warming the caches uncounted), each pair's seconds and the mean difference: the
number of stages a run holds at once, measured side by side on this host.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _inductor_cache import own_inductor_cache

ROOT = Path(__file__).resolve().parents[1]
CACHE_VARIABLE = "PORTKIT_CACHE_DIR"      # portkit.corpora.corpus.CACHE_VARIABLE: portkit's cache root
# What the default workbook aims at for both targets, in seconds, on a host whose MiniLM trace takes about 1.1 s
# (printed below): an everyday rerun after each change to the model.
COLD_AIM, WARM_AIM = 60, 40
# A stage's line as `portkit run` prints it: "[stage] summary (N s)" or "(N s, peak X GiB)"
STAGE_LINE = re.compile(r"^\[(\w+)\] .* \((\d+) s(?:, peak [^)]*)?\)$", re.M)


def _run(out: Path, extra: tuple[str, ...] = ()) -> tuple[float, dict, dict]:
    """One `portkit run` in a fresh process: (wall seconds, seconds per stage, the report's verdicts)."""
    portkit = Path(sys.executable).parent / "portkit"
    start = time.perf_counter()
    done = subprocess.run([str(portkit), "run", "--model", "minilm", "--target", "neuron", "--target", "tpu",
                           "--out", str(out), "--no-progress", *extra], capture_output=True, text=True)
    total = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        sys.exit(f"portkit run failed with exit code {done.returncode}")
    stages = {m.group(1): float(m.group(2)) for m in STAGE_LINE.finditer(done.stdout)}
    verdicts = json.loads((out / "report.json").read_text())["targets"]
    return total, stages, {n: f"{t['verdict']} ({t['mode']})" for n, t in verdicts.items()}


# The host's speed at the time, for reading the seconds above on a shared machine: the same MiniLM Dynamo trace
# (no backend work) timed in a fresh process before and after the runs; most of a warm run is such tracing.
_TRACE = """
import statistics, time, torch
from portkit.corpora import corpus
from portkit.models import registry
m, times = registry.load("minilm"), []
text = corpus.load_corpus().sample(1, seed=0)
with torch.no_grad():
    for length in (40, 41, 42):
        torch.compiler.reset()
        start = time.perf_counter()
        torch.compile(m.module, backend=lambda gm, example: gm.forward, dynamic=False)(**m.encode(text, pad_to=length))
        times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def _trace_seconds() -> float:
    done = subprocess.run([sys.executable, "-c", _TRACE], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true",
                        help="a cold run from empty caches (portkit's, the XLA verdicts included, and Inductor's), "
                             "then a warm rerun with the caches it filled, side by side")
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--lanes", default=None, metavar="A,B",
                        help="alternate warm runs with --lanes A and --lanes B (two positive whole numbers)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of runs for --lanes (default 3)")
    args = parser.parse_args()
    if args.lanes is not None and args.cold:
        parser.error("--lanes compares warm runs: leave out --cold")
    lanes = _lanes_pair(parser, args.lanes, args.pairs) if args.lanes is not None else None
    out = Path(args.out or tempfile.mkdtemp(prefix="portkit-bench-"))
    if lanes is not None:
        _compare_lanes(out, lanes, args.pairs)
        return
    print(f"portkit run --model minilm --target neuron --target tpu ({os.cpu_count()} CPUs) -> {out}")
    if not args.cold:
        total, stages, verdicts = _run(out)
        for name, seconds in stages.items():
            print(f"  {name:10s} {seconds:6.0f} s  {'#' * int(seconds / 2)}")
        slowest = max(stages, key=stages.get) if stages else "?"
        print(f"total wall time {total:.0f} s ({total / 60:.1f} min; caches as found; aim <= {WARM_AIM} s warm, "
              f"<= {COLD_AIM} s cold); slowest stage: {slowest}")
        print("verdicts: " + ", ".join(f"{n}: {v}" for n, v in verdicts.items()))
        return
    trace_before = _trace_seconds()
    cache = tempfile.mkdtemp(prefix="portkit-bench-cache-")
    before = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = cache          # portkit's cache root: the run inherits it
    try:
        with own_inductor_cache():
            cold = _run(out / "cold")
            warm = _run(out / "warm")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if before is None:
            os.environ.pop(CACHE_VARIABLE, None)
        else:
            os.environ[CACHE_VARIABLE] = before
    print(f"  {'stage':10s} {'cold':>7s} {'warm':>7s}   (stage seconds as `portkit run` prints them, whole seconds)")
    for name in dict.fromkeys([*cold[1], *warm[1]]):
        print(f"  {name:10s} {cold[1].get(name, float('nan')):6.0f}s {warm[1].get(name, float('nan')):6.0f}s")
    met = {name: "met" if run[0] <= aim else "NOT met" for name, run, aim in (("cold", cold, COLD_AIM),
                                                                             ("warm", warm, WARM_AIM))}
    print(f"total wall time: cold {cold[0]:.0f} s (aim <= {COLD_AIM} s: {met['cold']}), warm {warm[0]:.0f} s "
          f"(aim <= {WARM_AIM} s: {met['warm']}); cold/warm {cold[0] / warm[0]:.1f}x")
    for name, run in (("cold", cold), ("warm", warm)):
        print(f"verdicts {name}: " + ", ".join(f"{n}: {v}" for n, v in run[2].items()))
    print(f"host speed: one MiniLM Dynamo trace (no backend work, median of 3) took {trace_before:.2f} s before "
          f"the runs, {_trace_seconds():.2f} s after")


def _lanes_pair(parser, text: str, pairs: int) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts) or pairs < 1:
        parser.error(f"--lanes {text} --pairs {pairs}: give two positive whole numbers, e.g. --lanes 2,3, and "
                     "--pairs 1 or more")
    return int(parts[0]), int(parts[1])


def _compare_lanes(out: Path, lanes: tuple[int, int], pairs: int) -> None:
    """Warm runs alternated between the two lane counts, after one uncounted pair that fills the caches."""
    print(f"host speed: one MiniLM Dynamo trace took {_trace_seconds():.2f} s before the runs")
    for lane in lanes:
        _run(out / f"warm-up-{lane}", ("--lanes", str(lane)))
    seconds: dict[int, list[float]] = {lane: [] for lane in lanes}
    for i in range(pairs):
        for lane in lanes:
            seconds[lane].append(_run(out / f"pair{i}-lanes{lane}", ("--lanes", str(lane)))[0])
        a, b = (seconds[lane][-1] for lane in lanes)
        print(f"  pair {i + 1}: --lanes {lanes[0]} {a:5.1f} s, --lanes {lanes[1]} {b:5.1f} s ({b - a:+.1f} s)",
              flush=True)
    mean = sum(seconds[lanes[1]][i] - seconds[lanes[0]][i] for i in range(pairs)) / pairs
    fewer = sum(seconds[lanes[1]][i] < seconds[lanes[0]][i] for i in range(pairs))
    print(f"--lanes {lanes[1]} against --lanes {lanes[0]}: {mean:+.1f} s on average over {pairs} pairs, less in "
          f"{fewer} of {pairs}")
    print(f"host speed: one MiniLM Dynamo trace took {_trace_seconds():.2f} s after the runs")


if __name__ == "__main__":
    main()
