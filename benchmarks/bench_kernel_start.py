"""A stage kernel's start: from asking for a kernel to the end of a cell of the stages' imports, launched as
jupyter_client launches it (a new interpreter) against forked from portkit's fork server (portkit/run/kernel_forks.py).

    .venv/bin/python benchmarks/bench_kernel_start.py [--kernels 3]

Side by side in one process, as a run starts them (run/jupyter_kernels.SharedKernel, its kernel log): N kernels
launched one after another, then N forked (the first of them also starts the server). Prints each kernel's seconds,
the medians and their ratio, and the host's speed (one MiniLM Dynamo trace,
as bench_workbook.py times it). Forking pays where a process starts more than one kernel: a run's second lane, a
replaced kernel, every later run in the same process (a sweep's worker, the zoo's rows).

Then the heap a forked kernel inherits (run/frozen_heap.py): a process imports the server's PRELOAD with and without
its last module (which freezes what the others made) and forks; the child's first full collection is timed, and the
server's pages it copied are read from /proc (Private_Dirty before and after).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_workbook import _trace_seconds  # noqa: E402

# the first cell of a stage notebook, in effect: what the stages import
CELL = ("import torch, torch._dynamo, transformers\n"
        "from portkit.stages.compile.stage import Options\n"
        "from portkit.stages.accuracy.stage import check_accuracy\n")


async def _first_cell(km) -> str:
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        reply = await kc.execute_interactive(CELL, timeout=120, output_hook=lambda msg: None)
        return reply["content"]["status"]
    finally:
        kc.stop_channels()


def _starts(fork: bool, kernels: int, folder: str, log: str) -> list[float]:
    from jupyter_core.utils import run_sync
    from portkit.run import jupyter_kernels
    jupyter_kernels.FORK = fork
    seconds = []
    for _ in range(kernels):
        kernel = jupyter_kernels.SharedKernel(cwd=folder, log=log,
                                              extra_arguments=["--IPKernelApp.log_level=ERROR"])
        start = time.perf_counter()
        status = run_sync(_first_cell)(kernel.for_stage())
        seconds.append(time.perf_counter() - start)
        kernel.close()
        if status != "ok":
            sys.exit(f"the kernel's first cell ended {status}: see {log}")
    return seconds


# A fork server's heap, frozen or not, and what a fork's first full collection costs: its seconds, the pages it copied
_HEAP = """
import gc, importlib, json, os, sys, time
from portkit.run import kernel_forks
for name in kernel_forks.PRELOAD:
    if name != "portkit.run.frozen_heap" or sys.argv[1] == "frozen":
        importlib.import_module(name)

def private_mib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1]) / 1024

read, write = os.pipe()
child = os.fork()
if child == 0:
    before, start = private_mib(), time.perf_counter()
    gc.collect()
    seconds = time.perf_counter() - start
    os.write(write, json.dumps({"copied_mib": private_mib() - before, "seconds": seconds,
                                "frozen": gc.get_freeze_count()}).encode())
    os._exit(0)
os.waitpid(child, 0)
print(os.read(read, 4096).decode())
"""


def _heap(frozen: bool) -> dict:
    import json
    import subprocess
    done = subprocess.run([sys.executable, "-c", _HEAP, "frozen" if frozen else "not"], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=3, help="kernels started each way (default 3)")
    args = parser.parse_args()
    if args.kernels < 1:
        parser.error(f"--kernels {args.kernels}: give 1 or more")
    before = _trace_seconds()
    with tempfile.TemporaryDirectory(prefix="portkit-bench-kernels-") as folder:
        log = os.path.join(folder, "kernels.log")
        launched = _starts(False, args.kernels, folder, log)
        forked = _starts(True, args.kernels, folder, log)
        how = [line.split("started: ", 1)[1].strip() for line in Path(log).read_text().splitlines()
               if line.startswith("---- kernel")]
    if not all("forked from the fork server" in h for h in how):
        sys.exit(f"not every kernel was forked: {how}")
    launch, later = statistics.median(launched), statistics.median(forked[1:] or forked)
    print(f"kernel start to the end of the stages' imports, {args.kernels} kernels each way (seconds):")
    print(f"  launched (a new interpreter): {', '.join(f'{s:.2f}' for s in launched)}; median {launch:.2f}")
    print(f"  forked (the first starts the server): {', '.join(f'{s:.2f}' for s in forked)}")
    print(f"  a later kernel: launched {launch:.2f} s, forked {later:.2f} s ({launch / later:.1f}x faster)")
    if sys.platform.startswith("linux"):
        print("a forked kernel's first full garbage collection (the server's PRELOAD imported, then a fork):")
        for frozen in (False, True):
            found = _heap(frozen)
            print(f"  server heap {'frozen (frozen_heap)' if frozen else 'not frozen':22s}: {found['seconds']:.3f} s, "
                  f"{found['copied_mib']:.0f} MiB of the server's pages copied into the kernel "
                  f"({found['frozen']:,} objects frozen)")
    print(f"host speed: one MiniLM Dynamo trace (no backend work, median of 3) took {before:.2f} s before, "
          f"{_trace_seconds():.2f} s after")


if __name__ == "__main__":
    main()
