"""Peak memory per stage for every built-in model: `portkit run` on both targets, each stage's peak from run.json.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_memory.py [--models crepe,minilm] [--out DIR] [-p NAME VALUE]
    .venv/bin/python benchmarks/bench_memory.py --read-only --out DIR    # print what earlier runs recorded

Runs the CLI as a user would (`portkit run --model NAME --target neuron --target tpu`), one model after another,
and prints, per model and stage, the status, the wall time and the stage's peak resident memory (the kernel's
VmHWM from the stage's start, recorded by the runner under run.json's `peak_memory_bytes`), with the host's memory
and the largest peak against BOUND (the budget every built-in model is held to on a 24 GiB machine). Resumable: a
model whose run folder already records every stage ended is not run again (delete its folder to rerun it).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from portkit.core import memory  # noqa: E402
from portkit.models import registry  # noqa: E402
from portkit.runfolder import layout, run_log  # noqa: E402

BOUND = 8 * memory.GIB     # every stage of every built-in model peaks below this (docs/benchmarks/memory.md)
DEFAULT_OUT = Path("/tmp/portkit-bench-memory")


def _complete(folder: Path) -> bool:
    """Whether the run folder records every stage as ended (ok or skipped), each with its peak."""
    try:
        log = run_log.read(folder)
    except Exception:   # noqa: BLE001 (a damaged log: run again)
        return False
    return log is not None and all(
        (s := log.stages.get(stage.name)) is not None and s.status in ("ok", "skipped")
        and s.peak_memory_bytes is not None for stage in layout.STAGES)


def _run(name: str, folder: Path, params: list[list[str]]) -> tuple[int, float]:
    """`portkit run` for one model into `folder`: (exit status, wall seconds); its output goes to FOLDER.log beside
    it (a run folder holds only what a run writes)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "portkit.cli", "run", "--model", name, "--target", "neuron", "--target", "tpu",
               "--out", str(folder), "--no-progress", *[x for p in params for x in ("-p", *p)]]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    with open(folder.with_suffix(".log"), "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return done.returncode, time.perf_counter() - start


def _rows(name: str, folder: Path) -> list[list[str]]:
    try:
        log = run_log.read(folder)
    except Exception as exc:   # noqa: BLE001
        return [[name, "-", f"run.json unreadable: {exc}", "-", "-"]]
    if log is None:
        return [[name, "-", "no run.json", "-", "-"]]
    rows = []
    for stage in layout.STAGES:
        s = log.stages.get(stage.name)
        if s is None:
            rows.append([name, stage.name, "not run", "-", "-"])
            continue
        peak = s.peak_memory_bytes
        over = " OVER" if peak is not None and peak >= BOUND else ""
        rows.append([name, stage.name, s.status, f"{s.seconds:,.0f}" if s.seconds is not None else "-",
                     memory.gib(peak) + over])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(registry.SOURCES), help="comma-separated built-in models")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of one run folder per model")
    parser.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    parser.add_argument("--read-only", action="store_true", help="run nothing; print what the folders record")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in registry.SOURCES]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from: {', '.join(registry.SOURCES)}")
    print(f"host: {memory.gib(memory.total())} memory, {memory.gib(memory.available())} available at the start, "
          f"{os.cpu_count()} CPUs; bound per stage {memory.gib(BOUND)}", flush=True)
    for name in names:
        folder = args.out / name
        if args.read_only or _complete(folder):
            continue
        status, seconds = _run(name, folder, args.param)
        print(f"{name}: portkit run exited {status} after {seconds:,.0f} s ({folder.with_suffix('.log')})", flush=True)
    rows = [r for name in names for r in _rows(name, args.out / name)]
    widths = [max(len(str(r[i])) for r in rows + [["model", "stage", "status", "s", "peak"]]) for i in range(5)]
    for row in [["model", "stage", "status", "s", "peak"], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    peaks = [s.peak_memory_bytes for n in names if (log := _read(args.out / n)) for s in log.stages.values()
             if s.peak_memory_bytes is not None]
    if peaks:
        print(f"largest stage peak: {memory.gib(max(peaks))} (bound {memory.gib(BOUND)}): "
              f"{'within' if max(peaks) < BOUND else 'OVER'}")
    return 0


def _read(folder: Path):
    try:
        return run_log.read(folder)
    except Exception:   # noqa: BLE001
        return None


if __name__ == "__main__":
    raise SystemExit(main())
