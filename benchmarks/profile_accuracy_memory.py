"""Where stage 4's memory goes: its verb run in this process on a run folder, the peak resident memory per call.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/profile_accuracy_memory.py gpt2 RUN_FOLDER [OUT_FOLDER]

Runs what notebooks/04_accuracy.py runs with its defaults (the run folder's buckets.json from stage 3, both
targets), with the stage's calls wrapped: each prints the resident memory before and after it and the process's
peak (VmHWM) so far, and a thread reading /proc/self/statm every 2 ms charges each reading to the innermost three
calls running. At the end: the process's peak and the 25 call paths with the highest readings. OUT_FOLDER: where
to save accuracy.json too (to compare with tools/compare_runs.py).
"""
import collections
import functools
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from portkit import models  # noqa: E402
from portkit.core import memory  # noqa: E402
from portkit.corpora.corpus import corpus_for, example_batch  # noqa: E402
from portkit.stages.accuracy import comparison, reference, target_check, target_runs  # noqa: E402
from portkit.stages.accuracy import stage  # noqa: E402

STACK, PEAKS = ["(top)"], collections.defaultdict(int)


def _sample(stop: threading.Event) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    while not stop.wait(0.002):
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * page
        label = " > ".join(STACK[-3:])
        PEAKS[label] = max(PEAKS[label], rss)


def _wrap(owner, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        STACK.append(label)
        before = memory.resident()
        try:
            return fn(*args, **kwargs)
        finally:
            STACK.pop()
            print(f"  {label:32s} rss {memory.gib(before)} -> {memory.gib(memory.resident())}, "
                  f"peak {memory.gib(memory.peak())}", flush=True)
    setattr(owner, attr, inner)


def main(name: str, folder: Path, out: Path | None) -> None:
    for f in ("check_target", "_precision_result", "_buckets", "_bucket_row", "_try_others", "_try_other_side",
              "_try_unpadded", "_split_by_cause", "_try_compiled"):
        _wrap(target_check, f, f)
    _wrap(reference.Reference, "bucket", "Reference.bucket")
    _wrap(reference.Reference, "_sampled", "Reference._sampled")
    _wrap(reference, "measure_baseline", "measure_baseline")
    _wrap(reference.TaskSample, "size_passes", "TaskSample.size_passes")
    _wrap(target_runs.TargetSide, "run", "TargetSide.run")
    _wrap(target_runs.Float64Reference, "__call__", "Float64Reference")
    for f in ("compare", "item_values", "task_metrics"):
        _wrap(comparison, f, f)
        for module in (target_check, reference):
            if hasattr(module, f):
                setattr(module, f, getattr(comparison, f))
    stop = threading.Event()
    threading.Thread(target=_sample, args=(stop,), daemon=True).start()
    memory.reset_peak()
    model, opts, targets = models.load(name), stage.Options.of({}), ["neuron", "tpu"]
    texts = corpus_for(model, opts.corpus, opts.text_column)
    inputs, described = example_batch(model, texts, batch_size=opts.batch_size, seq_len=opts.seq_len,
                                      seed=opts.seed)
    plan = stage.bucket_plan(folder, targets, opts.default_buckets)
    compiled = stage.target_side(targets)
    start = time.time()
    STACK.append("check_accuracy")
    report = stage.check_accuracy(model, inputs, targets, options=opts, corpus=texts, buckets=plan,
                                  description=described, scope=stage.Scope(compiled=compiled, progress=False))
    stop.set()
    print(f"done in {time.time() - start:.0f} s; process peak {memory.gib(memory.peak())}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        report.save(out / "accuracy.json")
    for label, high in sorted(PEAKS.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{memory.gib(high):>10}  {label}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
