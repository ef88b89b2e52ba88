"""The run's stages scheduled: each starts once the stages whose results it reads have ended, up to the lanes the
machine holds, each in a kept kernel; each is recorded in the run log as it ends, and Ctrl-C stops them all.

    >>> from portkit.run import scheduling
    >>> scheduling.run_stages(per_stage, scheduling.Run(out, "minilm", False, printer, result), lanes=2)

A stage that fails does not stop the run: its failure is recorded in the RunResult and the stages after it run.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core import atomic_io
from portkit.core import memory
from portkit.core.errors import StageSkipped
from portkit.core.locations import NOTEBOOKS
from portkit.run import jupyter_kernels
from portkit.run import stage_kernel
from portkit.runfolder import layout
from portkit.runfolder import results
from portkit.runfolder import run_log
from portkit.runfolder.layout import Stage

@dataclass
class RunResult:
    out_dir: Path
    summaries: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)   # stage: its one-line error
    report_rebuilt: bool = False




def _summary(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("summary", "(no summary)")
    except (OSError, ValueError):
        return "(its result file is missing or unreadable)"




def reads(stage: Stage, targets) -> tuple[str, ...]:
    """The stages whose results `stage` reads in a run for `targets`: its declared ones, narrowed by its
    module's reads(targets) where it has one."""
    narrowed = getattr(importlib.import_module(stage.module), "reads", None)
    return tuple(narrowed(targets)) if narrowed is not None else stage.reads


def _model_parameters(out: Path, stage: Stage) -> int | None:
    """The model's parameter count from a stage's result (None where it has none)."""
    return results.model_parameters(out, stage.name)


class Printer:
    """What a run shows as its stages end: each one's line through `log`; where progress is shown, a bar of
    the stages besides, cleared (with the stages' cell bars) before each line so that the line starts a line
    of its own, not glued onto a bar, and drawn again below it."""

    def __init__(self, total: int, progress: bool, log):
        from tqdm.auto import tqdm
        self.log = log
        self.bar = tqdm(total=total, desc="portkit", unit="stage", disable=not progress)

    def running(self, names) -> None:
        self.bar.set_postfix_str(", ".join(names))

    def ended(self, line: str) -> None:
        if self.bar.disable:
            self.log(line)
        else:
            with type(self.bar).external_write_mode():
                self.log(line)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()



@dataclass
class Run:
    """What starting, running and recording a stage read: the run folder, the model, whether progress shows,
    the printer, the result being filled in, and the peak memory sampled while the stages run."""
    out: Path
    model_spec: str
    progress: bool
    printer: Printer
    result: RunResult
    memory: stage_kernel.PeakMemory = field(default_factory=stage_kernel.PeakMemory)
    lanes: int = jupyter_kernels.LANES   # the most stages the run allowed at once (RunSettings.lanes)


@dataclass
class _Schedule:
    """The stages of a run: waiting (pending, each with the stages it reads: waits), running ({future: (stage,
    start, kernel)}) and ended; the kernels free or being cleared ({future: kernel}); and the model's size for
    the lanes: a bound before it is loaded (None: one lane), then the first count a stage reports (counted)."""
    pending: list
    waits: dict
    free: list
    parameters: int | None
    running: dict = field(default_factory=dict)
    clearing: dict = field(default_factory=dict)
    ended: list = field(default_factory=list)
    counted: bool = False

    def ready(self, out: Path) -> list:
        """The waiting stages whose reads have ended (or written the early file they need), in order."""
        return [p for p in self.pending if not _unmet(p[0], self.waits, self.ended, self.pending, out)]

    def polls_early(self, out: Path) -> bool:
        """Whether a waiting stage may start on a running stage's early file (which nothing signals)."""
        return any(_unmet(p[0], self.waits, self.ended, self.pending, out) & set(p[0].reads_early)
                   for p in self.pending)

    def take_kernel(self) -> jupyter_kernels.SharedKernel:
        kernel = next((k for k in reversed(self.free) if k.prepared), self.free[-1])   # a cleared one first
        self.free.remove(kernel)
        return kernel

    def all_kernels(self) -> list:
        return [*self.free, *self.clearing.values(), *(k for _, _, k in self.running.values())]


def run_stages(per_stage, run: Run, lanes: int) -> None:
    """Start each stage once the stages it reads have ended (or written the early file it needs: _unmet), in
    order, up to the lanes the machine holds, each in a kernel cleared when its last stage ended; record each
    as it ends (this thread alone writes the run log)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from portkit.models import registry
    selected = {s.name for s, _ in per_stage}
    targets = per_stage[0][1]["targets"]
    # the kernel's own start-up warnings (loopback TCP) are noise on the user's terminal
    free = [jupyter_kernels.SharedKernel(lane=i, cwd=str(NOTEBOOKS), extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                 log=run.out / layout.KERNEL_LOG)
            for i in reversed(range(max(1, lanes)))]
    schedule = _Schedule(list(per_stage), {s.name: set(reads(s, targets)) & selected for s, _ in per_stage},
                         free, registry.size_hint(run.model_spec))
    with ThreadPoolExecutor(max_workers=len(free)) as pool, run.memory:
        try:
            while schedule.pending or schedule.running:
                _start_ready(schedule, pool, run, lanes)
                if not schedule.running and not schedule.clearing:
                    continue
                run.printer.running(s.name for s, _, _ in schedule.running.values())
                # a stage that may start on a running stage's early file: look for it every quarter second
                for future in wait([*schedule.running, *schedule.clearing], return_when=FIRST_COMPLETED,
                                   timeout=0.25 if schedule.polls_early(run.out) else None)[0]:
                    _collect(future, schedule, pool, run)
            wait(schedule.clearing)
        except KeyboardInterrupt:
            raise RunInterrupted(run.out, _stop_interrupted(schedule, run)) from None
        finally:
            for kernel in schedule.all_kernels():
                kernel.close()   # a stage still running (an error, an interrupt) ends with its kernel
            for stage, _, _ in schedule.running.values():   # stopped (Ctrl-C) or failed: no longer running
                (run.out / layout.running_marker(stage.name)).unlink(missing_ok=True)
    run.printer.close()


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during the stages: the kernels were stopped, each stage that was running is recorded in the run log
    as interrupted (its result removed), the stages that had ended keep theirs; the same command runs them again."""

    def __init__(self, out: Path, stopped: list[str]):
        self.out, self.stopped = out, stopped
        which = f"stage(s) {', '.join(stopped)} stopped and recorded as interrupted in {out / layout.RUN_LOG}" \
            if stopped else f"no stage was running; the run log {out / layout.RUN_LOG} holds the stages that ended"
        super().__init__(f"interrupted: {which}; rerun the same command to run them again")


@contextlib.contextmanager
def _quiet_stop():
    """While an interrupted run stops: a second Ctrl-C is ignored (the main thread only can set it), and the kernel
    libraries' log lines about the kernels being killed (nbclient's "Kernel died", asyncio's) stay off the terminal."""
    import logging
    import signal
    import threading
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    loggers = [logging.getLogger(name) for name in ("papermill", "nbclient", "traitlets", "asyncio", "")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        if main:
            signal.signal(signal.SIGINT, before)


def _stop_interrupted(schedule: _Schedule, run: Run) -> list[str]:
    """Ctrl-C: kill every kernel (a stage mid-cell stops writing at once), wait for the stages' threads, record a
    stage that ended meanwhile as it ended and each one still running as interrupted, its result and early file
    removed (a result of a stopped stage is not one), and remove the partial files. Returns the stopped stages."""
    from concurrent.futures import wait
    stopped = []
    with _quiet_stop():
        for kernel in schedule.all_kernels():
            kernel.kill()
        wait([*schedule.running, *schedule.clearing])
        for kernel in schedule.all_kernels():
            with contextlib.suppress(Exception):   # the kernel is dead: only its manager's files are left
                kernel.close()
        for future, (stage, start, _) in schedule.running.items():
            outcome = future.exception() or future.result()
            if outcome is None or isinstance(outcome, (str, StageSkipped)):   # it ended before the kill
                _ended(stage, start, outcome, run)
                continue
            (run.out / stage.result).unlink(missing_ok=True)
            if stage.early:
                (run.out / stage.early).unlink(missing_ok=True)
            run_log.record(run.out, stage.name, layout.INTERRUPTED, time.perf_counter() - start,
                             "interrupted (Ctrl-C) before it ended; rerun the stage")
            stopped.append(stage.name)
        atomic_io.remove_partials(run.out)
        run.printer.close()
    return stopped


def _start_ready(schedule: _Schedule, pool, run: Run, lanes: int) -> None:
    """Start the stages that are ready, in order, while a lane and a kernel are free (each start may make a stage
    that reads it late ready); a stage an abstract model (no weights) cannot run ends skipped without its notebook."""
    now = jupyter_kernels.lanes_for(schedule.parameters, lanes)
    while (ready := schedule.ready(run.out)) and len(schedule.running) < now and schedule.free:
        item = ready[0]
        stage, values = item
        schedule.pending.remove(item)
        # this run rewrites the stage's result: one from an earlier run must not outlive a failure now
        (run.out / stage.result).unlink(missing_ok=True)
        if stage.early:
            (run.out / stage.early).unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            results.skip_if_abstract(run.model_spec, run.out, stage.name, values["targets"])
        except StageSkipped as skipped:
            _ended(stage, start, skipped, run)
            schedule.ended.append(stage.name)
            continue
        kernel = schedule.take_kernel()
        (run.out / layout.running_marker(stage.name)).write_text(str(os.getpid()))
        future = pool.submit(stage_kernel.execute, stage, values, run.out, run.progress, kernel)
        schedule.running[future] = (stage, start, kernel)


def _collect(future, schedule: _Schedule, pool, run: Run) -> None:
    """A future that finished: a cleared kernel is free again (a failed clear leaves it unprepared: its next
    stage retries); a stage that ended is recorded, its kernel cleared for the next stage, and the first count
    of the model's parameters it reports sizes the lanes from then on."""
    if future in schedule.clearing:
        schedule.free.append(schedule.clearing.pop(future))
        return
    stage, start, kernel = schedule.running.pop(future)
    peak = kernel.peak_memory()   # before the kernel is cleared for the next stage
    if schedule.pending:
        schedule.clearing[pool.submit(kernel.prepare)] = kernel
    else:
        schedule.free.append(kernel)
    try:
        outcome = future.result()
    except StageSkipped as skipped:      # the stage does not apply to the model: its result says why
        outcome = skipped
    except stage_kernel.KernelDied as died:   # a failure of the stage (the report names the gap), not a traceback
        outcome = stage_kernel.kernel_died(stage, run.memory.peak, died, run.lanes)
    _ended(stage, start, outcome, run, peak)
    schedule.ended.append(stage.name)
    if not schedule.counted and (found := _model_parameters(run.out, stage)) is not None:
        schedule.parameters, schedule.counted = found, True


def _unmet(stage: Stage, waits: dict, ended: list, pending: list, out: Path) -> set[str]:
    """The stages `stage` still waits for: those it reads that have not ended, except one it reads late that has
    started (its cell waits for it) and one whose early file (runfolder.Stage.early) is all it needs and that this
    run's stage has written."""
    waiting = {s.name for s, _ in pending}   # not started yet

    def enough(read: str) -> bool:   # started, and read late or its early file written
        return read not in waiting and (read in stage.reads_late or
                                        (read in stage.reads_early and (out / layout.stage(read).early).exists()))
    return {read for read in waits[stage.name] - set(ended) if not enough(read)}


def _ended(stage: Stage, start: float, outcome, run: Run, peak: int | None = None) -> None:
    """Record how a stage ended: skipped (outcome is the StageSkipped), failed (its one-line error) or ok (None),
    with its kernel's peak resident memory (`peak` bytes, None: not measured)."""
    out, result = run.out, run.result
    seconds = result.seconds[stage.name] = time.perf_counter() - start
    (out / layout.running_marker(stage.name)).unlink(missing_ok=True)
    if isinstance(outcome, StageSkipped):
        run_log.record(out, stage.name, "skipped", seconds, str(outcome), peak)
        result.summaries[stage.name] = f"skipped: {outcome}"
        run.printer.ended(f"[{stage.name}] skipped: {outcome} ({seconds:.0f} s)")
        return
    run_log.record(out, stage.name, "failed" if outcome else "ok", seconds, outcome or "", peak)
    if outcome:
        result.failures[stage.name] = outcome
        run.printer.ended(f"[{stage.name}] FAILED: {outcome} ({seconds:.0f} s)")
        return
    result.summaries[stage.name] = _summary(out / stage.result)
    used = f", peak {memory.gib(peak)}" if peak is not None else ""
    run.printer.ended(f"[{stage.name}] {result.summaries[stage.name]} ({seconds:.0f} s{used})")

