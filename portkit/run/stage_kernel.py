"""One stage notebook executed under papermill in a kept kernel, and what a run learns when that kernel dies:
the run's peak memory, the dead kernel's one line, the library noise kept off the terminal.

    >>> from portkit.run import stage_kernel
    >>> error = stage_kernel.execute(stage, values, out, progress=False, kernel=kernel)   # None, or its one line

A notebook is executed under a partial name and renamed when done, so a killed run leaves no half-written notebook;
a failing one is moved into place showing the error.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

from portkit.core import atomic_io
from portkit.core.errors import StageSkipped
from portkit.core.locations import NOTEBOOKS
from portkit.run import jupyter_kernels
from portkit.run import notebook_parameters
from portkit.runfolder import layout
from portkit.runfolder.layout import Stage

def _keep_if_whole(partial: Path, output: Path) -> None:
    """Move an executed notebook into place if it reads as a notebook; remove it otherwise."""
    import nbformat
    try:
        nbformat.read(str(partial), as_version=4)
    except (OSError, ValueError):
        partial.unlink(missing_ok=True)
        return
    os.replace(partial, output)



class PeakMemory:
    """The largest resident memory this process and its children (the kernels, their fork server) held together,
    sampled every `every` seconds on a daemon thread while the stages run (psutil), to say what a dead kernel had
    reached. Pages a forked kernel shares with its server count in both: a bound from above."""

    def __init__(self, every: float = 0.5):
        import threading
        self.peak, self.every, self._stop = 0, every, threading.Event()
        self._thread = threading.Thread(target=self._sample, name="portkit-peak-memory", daemon=True)

    def _sample(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += process.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


class KernelDied(Exception):
    """A stage's kernel process died mid-stage (nbclient's DeadKernelError): its exit status (negative: the signal
    that killed it, as subprocess reports it; None: not known), the stage's batch size and its executed notebook."""

    def __init__(self, stage: str, status: int | None, batch_size, notebook: Path):
        super().__init__(stage)
        self.status, self.batch_size, self.notebook = status, batch_size, notebook


# The share of the machine's memory the run's processes must have reached for a kernel killed by SIGKILL to be
# called likely out of memory (the Linux OOM killer sends SIGKILL; a kill far below the machine's memory is
# something else: a container's own limit, or a person)
OOM_SHARE = 0.5


def kernel_died(stage: Stage, peak: int, died: KernelDied, lanes: int) -> str:
    """The one line a dead kernel's stage fails with: what is known (the kernel died, how it ended, the run's
    memory peak against the machine's) and, where memory is the likely cause, only what the run has not done
    already (one kernel at a time, a batch of one); otherwise where to look."""
    import psutil
    import signal
    total = psutil.virtual_memory().total
    if died.status is None:
        how = "its exit status is not known"
    elif died.status < 0:
        number = -died.status
        try:
            how = f"killed by {signal.Signals(number).name} (signal {number})"
        except ValueError:
            how = f"killed by signal {number}"
    else:
        how = f"it exited with code {died.status}"
    reached = f"the run's processes had reached {peak / 2**30:.1f} GiB of the machine's {total / 2**30:.1f} GiB" \
        if peak else f"the run's memory peak was not sampled (the machine has {total / 2**30:.1f} GiB)"
    line = f"the kernel running stage {stage.name} ({stage.notebook}) died, {how}; {reached}"
    if died.status == -signal.SIGKILL and peak >= OOM_SHARE * total:
        left = [text for text, done in (("one kernel at a time (--lanes 1)", lanes <= 1),
                                        ("a smaller -p batch_size", not isinstance(died.batch_size, int)
                                         or died.batch_size <= 1)) if not done]
        return line + ("; likely out of memory (the Linux OOM killer sends SIGKILL): run with less: " +
                       " or ".join(left) if left else "; likely out of memory (the Linux OOM killer sends SIGKILL), "
                       "with one kernel and a batch of one already: it needs a machine with more memory")
    return line + f"; the executed notebook {died.notebook} shows the last cell that ran"




# Lines the libraries under a stage write to the kernel's stderr that are no news to the user: libtpu's host-bounds
# warning (it looks for a TPU's metadata; compile-only stage 3b has no TPU by design) and glog-style lines of XLA's
# C++ ("W1205 08:22:21.123 ..."). They go to the run's kernel log, not to the terminal.
LIBRARY_NOISE = re.compile(r"Failed to find host bounds for accelerator type|could not determine TPU accelerator "
                           r"type|^[IWE]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)


class StageStderr:
    """The kernel's stderr stream as papermill forwards it (stderr_file): the stage's progress bars to the terminal,
    LIBRARY_NOISE to the run's kernel log."""

    def __init__(self, terminal, log: Path):
        self.terminal, self.log = terminal, log

    def write(self, text: str) -> int:
        if LIBRARY_NOISE.search(text):
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(text if text.endswith("\n") else text + "\n")
        else:
            self.terminal.write(text)
        return len(text)

    def flush(self) -> None:
        self.terminal.flush()


def execute(stage: Stage, values: dict, out: Path, progress: bool, kernel: jupyter_kernels.SharedKernel) -> str | None:
    """Run one stage notebook into the run folder; None, or the failure's one line."""
    km = kernel.for_stage()   # first: a new kernel starts up while papermill is imported
    kernel.reset_peak()       # the stage's own peak memory from here (run.json's peak_memory_bytes)
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError
    output = out / stage.notebook
    partial = atomic_io.partial_path(output)
    with open(out / layout.KERNEL_LOG, "a", encoding="utf-8") as log:
        log.write(f"---- stage {stage.name} ({stage.notebook}) starts in kernel lane {kernel.lane}\n")
    try:
        papermill.execute_notebook(
            str(NOTEBOOKS / stage.notebook), str(partial), parameters=values, kernel_name=jupyter_kernels.KERNEL,
            km=km,
            progress_bar={"desc": f"  {stage.name} cells", "leave": False, "position": kernel.lane + 1}
            if progress else False,
            # the stage's own progress bars (portkit.core.progress: text on the kernel's stderr) reach the terminal
            stderr_file=StageStderr(sys.stderr, out / layout.KERNEL_LOG) if progress else None,
            request_save_on_cell_execute=True)
    except PapermillExecutionError as exc:
        os.replace(partial, output)   # papermill saved it whole before raising: the error cell shows
        last = exc.evalue.strip().splitlines()[-1] if exc.evalue.strip() else ""
        if exc.ename == StageSkipped.__name__:
            raise StageSkipped(last) from None
        return (f"cell {exc.exec_count} of {stage.notebook} raised {exc.ename}: {last}; "
                f"the executed notebook is {output}")
    except DeadKernelError:
        if kernel.closed:
            partial.unlink(missing_ok=True)
            raise
        _keep_if_whole(partial, output)   # shows how far it got
        declared = notebook_parameters.declared_parameters(stage)
        batch = values.get("batch_size", notebook_parameters.default(declared, "batch_size"))
        raise KernelDied(stage.name, kernel.exit_status(), batch, output) from None
    except Exception:
        if kernel.closed:
            partial.unlink(missing_ok=True)   # the run stopped it (an interrupt, another stage's error)
        else:
            _keep_if_whole(partial, output)   # a dead kernel: show how far it got
        raise
    except BaseException:
        partial.unlink(missing_ok=True)   # interrupted, perhaps mid-save
        raise
    os.replace(partial, output)
    return None
