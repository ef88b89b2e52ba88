"""A four-model sweep on a local Ray against the same four runs one after another.

    .venv/bin/python benchmarks/bench_sweep.py [--stages fallbacks] [--target neuron] [--out DIR]

Both sides run the same workbooks (portkit.run.runner.run: papermill, a kernel per stage) on four small
fixture models (tests/fixtures/models.py). Prints each side's wall time, their ratio, the CPU
utilisation of each side (the CPU seconds of this process and everything it started, sampled every
0.2 s, over wall time × cores; and the whole machine's, which other work on it also loads), and the
sweep's own overhead per task: Ray's start and the other fixed costs shared out, plus each task's
dispatch latency (from a free slot to the task starting), its time in the task outside the workbook,
and the time its result takes to come back. Aim: under 5 s per task. The ratio is near 1 where the
workbooks already keep every core busy (a papermill kernel is a process of its own).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from portkit.runfolder import layout  # noqa: E402
from portkit.run import runner  # noqa: E402
from portkit.run import sweep  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "models.py"
MODELS = ["tiny_encoder", "gru_model", "small_encoder_model", "float64_model"]
PARAMETERS = {"batch_size": 2, "seq_len": 16}


class TreeCPU:
    """CPU seconds of this process and its descendants, sampled in a thread (a process that ends
    between two samples loses at most one interval), and the machine's CPU seconds over the same time."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.seen, self._stop = interval, {}, threading.Event()

    def _sample(self) -> None:
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                self.seen[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample()
        self.before, self.machine_before = sum(self.seen.values()), _machine_busy()
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.perf_counter() - self.start
        self.cpu = sum(self.seen.values()) - self.before
        self.machine = _machine_busy() - self.machine_before

    def utilisation(self) -> str:
        cores = psutil.cpu_count()
        return (f"{self.cpu:.0f} CPU s over {self.wall:.0f} s x {cores} cores = {self.cpu / self.wall / cores:.0%} "
                f"(whole machine busy {self.machine / self.wall / cores:.0%})")


def _machine_busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


def overhead(outcome: sweep.SweepOutcome) -> dict[str, float]:
    """The sweep's own seconds per task, from the records' epoch times."""
    done = [r for r in outcome.records if r.get("started") is not None]
    n = len(done)
    slots = int(outcome.engine["cluster_cpus"] // outcome.engine["cpus_per_task"])
    ends = sorted(r["ended"] for r in done)
    dispatch = []
    for i, r in enumerate(sorted(done, key=lambda r: r["started"])):
        # a task can start once it is submitted and, past the first wave, once an earlier task has ended
        free = r["submitted"] if i < slots else max(r["submitted"], ends[i - slots])
        dispatch.append(max(0.0, r["started"] - free))
    span = max(r["received"] for r in done) - min(r["submitted"] for r in done)
    start = outcome.engine["start_seconds"] or 0.0
    other = outcome.wall_seconds - span - start   # Ray's shutdown, the skip check, the report
    return {"Ray start shared out": start / n, "other fixed costs shared out": other / n,
            "dispatch": sum(dispatch) / n,
            "in the task, outside the workbook": sum(r["task_seconds"] - r["seconds"] for r in done) / n,
            "result back": sum(r["result_seconds"] for r in done) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="fallbacks", help="stages of every run (report is always added)")
    parser.add_argument("--target", default="neuron")
    parser.add_argument("--out", default=None, help="folder for both sides' runs (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out or tempfile.mkdtemp(prefix="portkit-bench-sweep-"))
    specs = [f"{FIXTURES}:{name}" for name in MODELS]
    quiet = lambda line: None  # noqa: E731
    cells = sweep.plan_sweep(specs, [args.target], str(out / "sweep"), PARAMETERS, stages=args.stages, log=quiet)
    stages = list(cells[0].stages)

    seconds = []   # each runner.run, timed as the sweep times it in its task
    with TreeCPU() as serial:
        for spec in specs:
            start = time.perf_counter()
            runner.run(spec, [args.target], str(out / "serial" / layout.model_tag(spec)), PARAMETERS, stages,
                       progress=False, log=quiet)
            seconds.append(time.perf_counter() - start)
    with TreeCPU() as swept:
        outcome = sweep.run_sweep(cells, out / "sweep", progress=False, log=quiet)
    if outcome.counts()["finished"] != len(cells):
        sys.exit(f"the sweep did not finish every run: {outcome.counts()}; see {out / 'sweep' / 'sweep.html'}")

    print(f"{len(specs)} models x {args.target}, stages {','.join(stages)}, {psutil.cpu_count()} cores; "
          f"Ray {outcome.engine['ray_version']}, {outcome.engine['cluster_cpus']:g} CPUs, "
          f"{outcome.engine['cpus_per_task']:g} per task -> {out}")
    print(f"one after another: {serial.wall:6.1f} s  (workbooks {sum(seconds):.1f} s); "
          f"CPU {serial.utilisation()}")
    print(f"sweep on Ray:      {swept.wall:6.1f} s  (workbooks {sum(r['seconds'] for r in outcome.records):.1f} s, "
          f"Ray start {outcome.engine['start_seconds']:.1f} s); CPU {swept.utilisation()}")
    print(f"wall time ratio, one after another / sweep: {serial.wall / swept.wall:.2f} "
          f"({serial.wall / (swept.wall - outcome.engine['start_seconds']):.2f} without Ray's start, "
          "as on a cluster already running: --address)")
    parts = overhead(outcome)
    print(f"sweep overhead per task: {sum(parts.values()):.2f} s (aim < 5 s) = "
          + " + ".join(f"{v:.2f} s {k}" for k, v in parts.items()))


if __name__ == "__main__":
    main()
