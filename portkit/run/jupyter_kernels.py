"""The kernels a run's stages execute in: one per lane, kept for the run.

    >>> with kernels.SharedKernel() as kernel:
    ...     papermill.execute_notebook(a, a_out, km=kernel.for_stage())   # starts the kernel
    ...     papermill.execute_notebook(b, b_out, km=kernel.for_stage())   # the same kernel, its namespace cleared

A fresh kernel per stage pays for a new interpreter and for importing torch, transformers and portkit again; a kept
kernel pays for them once per run, and a new one is forked from a server that has imported them
(run/kernel_forks.py), so the run's second kernel and a replaced one start with them imported. A kept kernel is
cleared between stages: IPython's reset empties the namespace (no variable of one stage reaches the next), open
figures are closed, Dynamo's compiled code dropped (torch.compiler.reset) and the cells numbered from 1 again, so a
stage starts as it would in a new kernel, with its imports already done. The stages seed what they sample, so kept
kernels give the same results as fresh ones. A kernel that died is replaced for the next stage. Each notebook still
runs on its own in a fresh kernel (JupyterLab, nbval): nothing in a stage may rely on an earlier stage's kernel.

Stages that do not read each other's results run at once, each in its own kernel (a lane), up to LANES where the
machine has the cores and the memory for them (lanes_for).
"""
from __future__ import annotations

import contextlib
import os

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from portkit.core import memory
from portkit.core.progress import HEADLESS_VARIABLE
from portkit.run import kernel_forks
from portkit.targets import allocator

# The kernels' environment, set by the runner where the user has not:
# - OpenMP's threads sleep when idle instead of spinning: two stages side by side, each with torch's threads
#   on a 2-core machine, otherwise spend the cores waiting on each other, so stages side by side are then
#   much slower than with this (a stage alone is as fast either way);
# - glibc's malloc serves blocks under 32 MiB from its heap and keeps up to 64 MiB of freed memory
#   (portkit.targets.allocator: why, and the values' one owner). Other C libraries ignore the names.
ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", **allocator.ENVIRONMENT}

KERNEL = "python3"
# Stages a run may hold at once, each in a kernel of its own (runner: a stage starts once the stages it reads
# have ended), and at most one more than the machine has cores. Three: stages 1, 2 and 3 of the default run can
# start at once, and stage 4 once stage 3 has written its plans. Two lanes on two cores left one idle for more
# than a quarter of the default run while stage 4 waited for stage 2's kernel; a third lets stage 4 start beside
# stage 3's replay (a small gain on 2 cores, within the host's spread: docs/benchmarks/speed.md). Dynamo's tracing
# is Python, one core a stage, and a stage waits at times (on a file, on papermill), so the cores stay busy.
LANES = 3
# What a kernel may take while it runs a stage, to decide how many fit in memory: the interpreter with
# torch, transformers and jax imported and the stage's working memory (the default run's kernels peaked at
# 1178 MiB resident with MiniLM's 22.7 M parameters, sampled from /proc; 445 MiB after the imports alone), with
# margin; and per parameter the float32 weights, stage 4's float64 copy and room for activations, optimizer
# state and copies (about 2.5 times those 12 bytes).
KERNEL_BYTES = 2 * 2 ** 30
BYTES_PER_PARAMETER = 32
# Whether a new kernel is forked from a server that has imported torch, transformers and the stages already
# (run/kernel_forks.py: where it can; elsewhere it starts as jupyter_client starts it)
FORK = True
# seconds to wait for the kept kernel to answer, and to clear its namespace (a reset takes well under one)
READY_SECONDS = 60
# Run in the kept kernel before each later stage. Nothing here imports a module the stage did not.
# get_ipython().reset is `%reset -f` in a new history session: the stage's cells are numbered from 1, as in
# a new kernel (numbering them from 1 in the old session clashes with its saved lines: IPython then prints
# "Session/line number was not unique in database" into a cell's output).
CLEAR = """\
get_ipython().reset(new_session=True)
import gc as _gc, sys as _sys
if "matplotlib.pyplot" in _sys.modules:
    _sys.modules["matplotlib.pyplot"].close("all")
if "torch" in _sys.modules:
    _sys.modules["torch"].compiler.reset()
del _gc, _sys
"""


def kernel_folder(model_spec: str) -> str | None:
    """The folder first on the kernels' Python path for `model_spec`: a spec with ":" is file.py:factory or
    package.module:factory, and the kernel (working in notebooks/) imports a package module from the folder the user
    ran portkit in; None for the others."""
    return os.getcwd() if ":" in model_spec and not model_spec.rpartition(":")[0].endswith(".py") else None


@contextlib.contextmanager
def kernel_environment(folder: str | None):
    """The environment of the kernels started inside the block: `folder` first on their Python path, headless (nobody
    watches a kernel: its stages skip widgets, core.progress), and ENVIRONMENT where the user set none of it. Set once
    for the run, before any stage starts, and put back after."""
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", HEADLESS_VARIABLE, *ENVIRONMENT)}
    if folder is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, before["PYTHONPATH"]) if p)
    for key, value in {HEADLESS_VARIABLE: "1", **ENVIRONMENT}.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_early(model_spec: str) -> None:
    """Start the fork server the run's kernels will be forked from (run/kernel_forks.py) now, in the environment they
    will have: it imports torch, transformers and the stages while this process imports and checks what it needs
    (`portkit run` calls this first), instead of after. Nothing where kernels are not forked."""
    if FORK:
        with kernel_environment(kernel_folder(model_spec)):
            kernel_forks.start()


class SharedKernel:
    """The kernel manager papermill gets for each stage (`km=`): a kernel started for the first stage, the same
    kernel, cleared, for the later ones."""

    def __init__(self, kernel_name: str = KERNEL, lane: int = 0, cwd: str | None = None, extra_arguments=(),
                 log: str | os.PathLike | None = None):
        self.kernel_name, self.lane = kernel_name, lane
        # where the kernel process's own stdout and stderr go (None: this process's): what libraries write to the
        # file descriptors (libtpu's C++ warnings), which ipykernel copies into the notebook and onto them
        self.log = log
        # where a new kernel works, and its command-line arguments (set here, not by papermill: its cwd= would
        # change this whole process's folder, which two stages side by side would leave wrong)
        self.cwd, self.extra_arguments = cwd, list(extra_arguments)
        self.km: AsyncKernelManager | None = None
        self.closed = False    # the run closed it: a stage that was running in it was stopped
        self.prepared = False  # cleared (or new) since its last stage: the next one starts at once
        self.killed = False    # kill() was called (an interrupted run): no stage runs in it from then on

    def prepare(self) -> None:
        """Make the kernel ready for a stage: clear the kept one, or start a new one. The runner calls this
        as soon as a stage has ended, so that the next stage to get this kernel does not wait for it. Once
        the run has closed the kernel, nothing is started."""
        if not self.closed and self.km is not None and self.km.has_kernel and run_sync(self.km.is_alive)():
            if run_sync(_clear)(self.km):
                self.prepared = True
                return
        self._stop()   # none yet, or a dead kernel, or one that could not be cleared: start a new one
        if self.closed:
            return
        self.km = AsyncKernelManager(kernel_name=self.kernel_name)
        if FORK:
            self.km.provisioner = kernel_forks.provisioner(self.km)
        with contextlib.ExitStack() as stack:
            streams = {}
            if self.log is not None:
                handle = stack.enter_context(open(self.log, "ab"))   # the kernel holds its own copy once started
                streams = {"stdout": handle, "stderr": handle}
            run_sync(self.km.start_kernel)(cwd=self.cwd, extra_arguments=self.extra_arguments, **streams)
            started = getattr(self.km.provisioner, "started", "")
            if self.log is not None and started:
                handle.write(f"---- kernel lane {self.lane} started: {started}\n".encode())
        self.prepared = True
        if self.killed:   # killed while it started: the new kernel goes too
            self.kill()

    def for_stage(self) -> AsyncKernelManager:
        if self.killed:
            raise KernelKilled("the run was interrupted before this stage's kernel started")
        self.closed = False
        if not (self.prepared and self.km is not None and self.km.has_kernel and run_sync(self.km.is_alive)()):
            self.prepare()
        self.prepared = False   # the stage about to run dirties it
        return self.km

    def close(self) -> None:
        self.closed, self.prepared = True, False
        self._stop()

    def reset_peak(self) -> None:
        """Start counting the kernel's peak resident memory afresh (core.memory): the next stage's own peak."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        if process is not None:
            memory.reset_peak(process.pid)

    def peak_memory(self) -> int | None:
        """The kernel process's peak resident bytes since reset_peak() (None: not known, or no kernel)."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return memory.peak(process.pid) if process is not None else None

    def exit_status(self) -> int | None:
        """A dead kernel's exit status as subprocess reports it (negative: killed by that signal); None: it is
        running, or the status is not known."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        try:
            status = process.poll() if process is not None else None
        except OSError:
            return None
        return status if getattr(process, "status_known", True) else None   # a forked kernel's, after its server

    def kill(self) -> None:
        """Stop the kernel's processes at once (SIGKILL to its process group), from any thread: an interrupted run
        stops a stage mid-cell without going through the kernel manager's event loop, which the stage's own thread
        is using (shutting it down from another thread leaves that loop's futures in an invalid state). close()
        afterwards, once the stage's thread has ended, releases what is left."""
        import signal
        self.killed = self.closed = True
        self.prepared = False
        provisioner = getattr(self.km, "provisioner", None)
        group = getattr(provisioner, "pgid", None) or getattr(provisioner, "pid", None)
        if group:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)

    def _stop(self) -> None:
        km, self.km = self.km, None
        if km is not None and km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)

    def __enter__(self) -> SharedKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class KernelKilled(RuntimeError):
    """A stage asked for a kernel that an interrupted run has killed."""


async def _clear(km: AsyncKernelManager) -> bool:
    """Clear the kernel's namespace (CLEAR); True when it answered ok."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=READY_SECONDS)
        reply = await kc.execute_interactive(CLEAR, store_history=False, allow_stdin=False, timeout=READY_SECONDS,
                                             output_hook=lambda msg: None)
        return reply["content"]["status"] == "ok"
    except (RuntimeError, TimeoutError):   # the kernel did not answer in time: the caller starts a new one
        return False
    finally:
        kc.stop_channels()


def lanes_for(parameters: int | None, lanes: int = LANES) -> int:
    """How many stages may run at once: `lanes` where this machine has the memory available for that many kernels
    with a model of `parameters` and at least one core fewer than that (LANES: why one more); 1 while the model's
    size is not known yet."""
    if lanes <= 1 or parameters is None:
        return 1
    fits = available_memory() // (KERNEL_BYTES + BYTES_PER_PARAMETER * parameters)
    return max(1, min(lanes, (os.cpu_count() or 1) + 1, fits))


# Bytes of memory available to new processes (core.memory owns the reading; tests replace this name)
available_memory = memory.available

