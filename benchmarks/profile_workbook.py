"""Where the default workbook's CPU goes, by kind: py-spy over every process of one `portkit run`.

    .venv/bin/python benchmarks/profile_workbook.py [--out DIR] [--rate HZ]
    .venv/bin/python benchmarks/profile_workbook.py --raw FILE [--rate HZ]

Runs `portkit run --model minilm --target neuron --target tpu` with the caches as found (run it twice for a warm
profile) under `py-spy record --subprocesses -f raw` (py-spy: pip install py-spy), so every process is sampled: the
CLI, the kernels' fork server and each stage kernel. Each busy sample goes to the first kind in KINDS its stack holds;
samples of threads that wait (ipykernel's pollers and heartbeat, zmq's devices, a condition or a selector) are left
out. The samples are CPU-seconds of the sampled processes, slowed by the sampling: read the shares, and the run's
own wall and CPU (printed beside them) for seconds. --raw FILE: the kinds of a raw file py-spy wrote, nothing run.
"""
from __future__ import annotations

import argparse
import collections
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_workbook import _trace_seconds

# Kinds of work, in order: a sample is the first kind any frame of its stack matches (a Dynamo trace that runs an
# emulated backend's retrace is the retrace's; an import inside a trace is the trace's).
KINDS = (
    ("XLA compiles (jax, torchax)", ("/jax/", "/jaxlib/", "/torchax/")),
    ("the emulated backends' retrace (ATen ops on fake tensors)", ("_AtenRecorder",)),
    ("Dynamo's tracing", ("torch/_dynamo/",)),
    ("other emulated-backend work (numerics, checks)", ("portkit/targets/",)),
    ("imports", ("_find_and_load",)),
    ("eager forwards (torch.nn, transformers' models)", ("torch/nn/modules/", "transformers/models/")),
    ("plots (matplotlib)", ("matplotlib/",)),
    ("tokenizers", ("tokenization_utils", "tokenizers/")),
)
REST = "the rest (papermill, JSON, planning, comparisons)"
# The innermost frame of a thread that waits: sampled by py-spy, but using no CPU
WAITING = ("EpollSelector.select", "_watch_pipe_fd", "Condition.wait", "Event.wait", "ParentPollerUnix.run",
           "GarbageCollectorThread.run", "device (zmq", "poll (", "sleep", "_wait_for_tstate_lock")
RATE = 50   # samples a second


def cpu_by_kind(lines, rate: float = RATE) -> dict[str, float]:
    """{kind: CPU-seconds} of py-spy's raw lines ("frame;frame;... COUNT"), busiest first; waiting threads left
    out. A process's frame ("process PID:COMMAND") is not matched: a command line names modules it never ran."""
    seconds: collections.Counter = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not frames or any(w in frames[-1] for w in WAITING):
            continue
        # the fork server's own frame holds its command (-c ... main(..., [PRELOAD's modules])): not a frame of work
        text = ";".join(f for f in frames if "forkserver import main" not in f)
        kind = next((k for k, patterns in KINDS if any(p in text for p in patterns)), REST)
        seconds[kind] += int(count) / rate
    return dict(seconds.most_common())


def table(seconds: dict[str, float]) -> str:
    total = sum(seconds.values())
    rows = [f"| {kind} | {s:.1f} | {100 * s / total:.0f}% |" for kind, s in seconds.items()]
    return "\n".join(["| kind | CPU-s sampled | share |", "|---|---|---|", *rows, f"| all | {total:.1f} | |"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="the run folder (default: a new temporary one)")
    parser.add_argument("--raw", default=None, metavar="FILE", help="classify this py-spy raw file, run nothing")
    parser.add_argument("--rate", type=int, default=RATE, help=f"py-spy's samples a second (default {RATE})")
    args = parser.parse_args()
    if args.rate <= 0:
        parser.error(f"invalid --rate {args.rate}: must be a positive whole number")
    if args.raw:
        if not Path(args.raw).is_file():
            parser.error(f"no such file: {args.raw}")
        print(table(cpu_by_kind(Path(args.raw).open(encoding="utf-8"), args.rate)))
        return
    spy = shutil.which("py-spy")
    if spy is None:
        parser.error("py-spy is not installed: pip install py-spy")
    work = Path(tempfile.mkdtemp(prefix="portkit-profile-"))
    out, raw = Path(args.out) if args.out else work / "run", work / "profile.raw"
    print(f"host speed: one MiniLM Dynamo trace took {_trace_seconds():.2f} s before the run")
    portkit = Path(sys.executable).parent / "portkit"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([spy, "record", "-r", str(args.rate), "--subprocesses", "-f", "raw", "-o", str(raw), "--",
                           str(portkit), "run", "--model", "minilm", "--target", "neuron", "--target", "tpu",
                           "--out", str(out), "--no-progress"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or not raw.is_file():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        sys.exit(f"the profiled run failed with exit code {done.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"the run under py-spy: {wall:.1f} s wall, {cpu:.1f} CPU-s (py-spy's own included); raw samples: {raw}")
    print(table(cpu_by_kind(raw.open(encoding="utf-8"), args.rate)))
    print(f"host speed: one MiniLM Dynamo trace took {_trace_seconds():.2f} s after the run")


if __name__ == "__main__":
    main()
