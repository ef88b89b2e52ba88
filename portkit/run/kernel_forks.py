"""Stage kernels forked from a server that has already imported torch, transformers, ipykernel and the stages.

    >>> km = AsyncKernelManager(kernel_name="python3")
    >>> km.provisioner = kernel_forks.provisioner(km)   # before start_kernel: its kernel is forked where it can be
    >>> await km.start_kernel(cwd=..., stdout=log, stderr=log)

A new kernel pays for a new interpreter and for importing torch, transformers and the stages before its first cell
(about 3 s on a compiled install: docs/benchmarks/speed.md). Here the process's first kernel starts a server
(multiprocessing's ForkServer, PRELOAD imported once) and each kernel is a fork of it, its imports done, their
memory shared until written. A forked kernel is what jupyter_client's `python -m ipykernel_launcher -f CONNECTION`
would be: the same arguments, environment, folder and Python path, its own session (process group = pid), its
output to the file it was given; stdin is /dev/null (a kernel reads its input over its stdin channel).

It is forked only where nothing it would differ in was read at import time: its environment equal to the server's
(but PER_KERNEL), its command this Python's ipykernel_launcher, no interpreter option (-W, -X) a new interpreter
would lack, its output a file or this process's.
Otherwise, or where the server cannot fork, jupyter_client starts it (LocalProvisioner): the same kernel, slower.
The run's kernel log says which. The server ignores Ctrl-C (the run stops its kernels) and is killed when the process
that started it exits; a kernel whose server has gone exits (ipykernel's parent poller); one left at exit is killed.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pickle
import signal
import sys
import threading

from jupyter_client.provisioning import LocalProvisioner

from portkit.runfolder.layout import STAGES

# What the server imports once, so that a kernel forked from it starts with them imported: the kernel itself,
# torch with Dynamo, transformers, and what the stage notebooks import (each stage's module and the modules
# beside it that the notebooks name); last, frozen_heap, which freezes what they made (its docstring says why).
# None of them starts a thread or reads a variable that differs between the kernels of one run (checked by
# tests/run/test_kernel_forks.py).
PRELOAD = (__name__, "ipykernel.kernelapp", "torch", "torch._dynamo", "transformers",
           # what loading any Hugging Face model imports first (its classes and tokenizers by name, the modeling base):
           # about 2 s a kernel otherwise; each model's own module is left to the kernel that loads it
           "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "portkit.models",
           "portkit.corpora.corpus", "portkit.runfolder.results", "portkit.runfolder.environment",
           "portkit.stages.options", *(stage.module for stage in STAGES), "portkit.run.frozen_heap")
# Variables a kernel's environment may hold differently from the server's: set per kernel or per test by
# jupyter_client and pytest, read by nothing at import time. The kernel gets its own values of them.
PER_KERNEL = ("JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTEST_CURRENT_TEST")
# seconds a forked kernel has to say it has its own session (the fork itself is well under one)
STARTED_SECONDS = 30

# The Python path this module was first imported with: in the fork server, its path before the other imports, which
# is the kernels' (multiprocessing sets a forked child's path to the starting process's; _Kernel sets it back)
_IMPORTED_WITH_PATH = list(sys.path)
_lock = threading.Lock()
# "server": the fork server, "environment": the environment it was started with, "failed": why it cannot fork
_server: dict = {}
_forked: list = []          # the kernels forked here that may still run (killed at exit, see _kill_at_exit)


def _comparable(environment) -> dict:
    """The variables a kernel and the server must agree on: all but PER_KERNEL, and Inductor's cache folder where it
    holds torch's default. Torch sets that variable to its default the first time anything asks for the folder, and
    importing torch._dynamo does (torch/_dynamo/package.py, DynamoCache; cache_dir_utils.cache_dir): the server, which
    imports it (PRELOAD), holds the default whether or not the process that started it had imported torch._dynamo by
    then, so a kernel that holds the default differs from it in nothing."""
    found = {k: v for k, v in environment.items() if k not in PER_KERNEL}
    if INDUCTOR_CACHE in found and found[INDUCTOR_CACHE] == _inductor_default():
        del found[INDUCTOR_CACHE]
    return found


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def _inductor_default() -> str:
    from portkit.core.torch_private import inductor_default_cache_dir     # imports torch: only when asked
    return inductor_default_cache_dir()


def _fork_server():
    """The run's fork server (multiprocessing's ForkServer, an instance of this module's own: not the process-wide one
    another library may have started with another environment), made the first time with PRELOAD and this process's
    environment, which it starts with (when it first runs)."""
    from multiprocessing import forkserver
    if "server" not in _server:
        server = forkserver.ForkServer()
        server.set_forkserver_preload(list(PRELOAD))
        _server.update(server=server, environment=_comparable(os.environ))
        atexit.register(_kill_at_exit)
    return _server["server"]


def _connect(handshake: int) -> tuple[int, int]:
    """A new child of the run's fork server: (status, data) file descriptors, as multiprocessing's forkserver Popen
    gets them. `handshake` is passed on to the child."""
    return _fork_server().connect_to_new_process([handshake])


def start() -> None:
    """Start this process's fork server now, where kernels are forked (Linux) and none was started: it imports PRELOAD
    while this process goes on with its own work, instead of when the first kernel is asked for. It takes os.environ as
    it is now; a kernel started later with another environment is launched, not forked (forkable says why). A server
    that cannot start is the reason every later kernel is launched."""
    if _not_here():
        return
    with _lock:
        if "server" in _server or _server.get("failed"):
            return
        try:
            _fork_server().ensure_running()
        except Exception as exc:   # noqa: BLE001 - whatever stops the server, the kernels start without it
            _server["failed"] = f"the fork server failed: {type(exc).__name__}: {exc}"


def _not_here() -> str:
    """Why kernels are not forked on this platform ("" on Linux): macOS's system libraries are not fork-safe once
    loaded (Python's multiprocessing docs, "Contexts and start methods"), and Windows has no fork."""
    return "" if sys.platform.startswith("linux") else f"kernels are forked on Linux only, this is {sys.platform}"


def forkable(cmd: list[str], kwargs: dict) -> str:
    """Why a kernel cannot be forked ("" where it can): what it would start with that the server's fork lacks."""
    if why := _not_here():
        return why
    if _server.get("failed"):
        return _server["failed"]
    if len(cmd) < 3 or cmd[1:3] != ["-m", "ipykernel_launcher"] or os.path.realpath(cmd[0]) != \
            os.path.realpath(sys.executable):
        return f"its command is not this Python's ipykernel_launcher: {cmd[:3]}"
    for stream in ("stdout", "stderr"):
        if kwargs.get(stream) is not None and not isinstance(getattr(kwargs[stream], "name", None), str):
            return f"its {stream} is not a file"
    environment = _comparable(kwargs.get("env") or os.environ)
    started = _server.get("environment") or _comparable(os.environ)   # a new server starts with os.environ
    if environment != started:
        differ = sorted(k for k in set(environment) | set(started) if environment.get(k) != started.get(k))
        return f"its environment differs from the fork server's in {', '.join(differ[:3])}"
    if "options" not in _server:
        _server["options"] = _own_options()
    return _server["options"]


# This interpreter's options (-O, -W, -X, ...): the fork server is started with them (multiprocessing passes them
# on), a launched kernel gets only what its environment sets. One expression, read here and in a new interpreter.
_OPTIONS = ("{**{f'sys.flags.{n}': getattr(sys.flags, n) for n in dir(sys.flags) if not n.startswith('_') "
            "and n not in ('count', 'index')}, **{f'-X {k}': v for k, v in sys._xoptions.items()}, "
            "'-W': sys.warnoptions}")


def _own_options() -> str:
    """Why a kernel cannot be forked for the options this interpreter was started with ("" where a new interpreter
    with this environment has the same): a forked kernel would run with them, a launched one would not."""
    import json
    import subprocess
    try:
        fresh = json.loads(subprocess.run([sys.executable, "-c", f"import json, sys; print(json.dumps({_OPTIONS}))"],
                                          capture_output=True, text=True, timeout=60, check=True).stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"this Python's options could not be compared with a new interpreter's: {exc}"
    own = json.loads(json.dumps(eval(_OPTIONS, {"sys": sys})))   # a constant expression of this module
    differ = sorted(k for k in set(fresh) | set(own) if fresh.get(k) != own.get(k))
    return f"this Python was started with options a new interpreter lacks: {', '.join(differ)}" if differ else ""


class ForkedKernel:
    """A forked kernel seen as jupyter_client sees a kernel's subprocess.Popen: pid, poll, wait, send_signal, kill,
    terminate. Its exit status is what the fork server reports on `status` once it has reaped it (negative: the
    signal that ended it, as Popen's)."""
    stdin = stdout = stderr = None
    status_known = True   # False: it ended after its server, which alone could say how (returncode is then 1)

    def __init__(self, pid: int, status: int):
        self.pid, self.status, self.returncode = pid, status, None

    def wait(self, timeout: float | None = None) -> int | None:
        import time
        from multiprocessing import connection, forkserver

        import psutil
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.status is None:   # its server went before reporting it: ended, or running on without it
                if not psutil.pid_exists(self.pid):
                    self.returncode, self.status_known = 1, False
                elif left != 0:
                    time.sleep(0.1 if left is None else min(0.1, left))
                    continue
                break
            if not connection.wait([self.status], left):
                break
            try:
                self.returncode = forkserver.read_signed(self.status)
            except EOFError:
                pass
            os.close(self.status)
            self.status = None
        return self.returncode

    def poll(self) -> int | None:
        return self.wait(0)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkingProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, whose kernel is forked from the fork server where `forkable` allows."""

    started = ""   # how its kernel started, in words (the run's kernel log says it)

    async def launch_kernel(self, cmd: list[str], **kwargs):
        with _lock:
            why = forkable(cmd, kwargs)
            kernel = None if why else _fork(cmd, kwargs)
            why = why or _server.get("failed", "")
        if kernel is None:
            self.started = f"a new interpreter (not forked: {why})"
            return await super().launch_kernel(cmd, **kwargs)
        self.started = f"process {kernel.pid}, forked from the fork server"
        self.process, self.pid, self.pgid = kernel, kernel.pid, kernel.pid   # its own session: group = pid
        self.cwd = kwargs.get("cwd") or os.getcwd()
        return self.connection_info


def provisioner(km) -> ForkingProvisioner:
    """A forking provisioner for `km`, to set as km.provisioner before km.start_kernel (as jupyter_client's own
    factory would create one from the kernel spec)."""
    import uuid
    km.kernel_id = km.kernel_id or str(uuid.uuid4())
    return ForkingProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km)


def _fork(cmd: list[str], kwargs: dict) -> ForkedKernel | None:
    """The kernel forked from the server, once it has its own session; None where the server could not start or
    fork it (the reason is kept: later kernels start as subprocesses at once)."""
    from multiprocessing import connection, forkserver
    child = _Kernel(cmd[3:], dict(kwargs.get("env") or os.environ), str(kwargs.get("cwd") or os.getcwd()),
                    {k: os.path.abspath(kwargs[k].name) for k in ("stdout", "stderr") if kwargs.get(k) is not None})
    ready, handshake = os.pipe()
    status = pid = None
    try:
        try:
            status, data = _connect(handshake)
        finally:
            os.close(handshake)
        # what multiprocessing's forkserver child reads (spawn._main): its preparation, nothing here (not this
        # process's path, folder or main module: the kernel's are set by _Kernel), then the object it runs
        with open(data, "wb", closefd=True) as pipe:
            pickle.dump({}, pipe)
            pickle.dump(child, pipe)
        pid = forkserver.read_signed(status)
        if not connection.wait([ready], STARTED_SECONDS):
            raise TimeoutError(f"the forked kernel did not start within {STARTED_SECONDS} s")
        if not os.read(ready, 1):
            raise EOFError("the forked kernel ended before it started")
    except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
        _server["failed"] = f"the fork server failed: {type(exc).__name__}: {exc}"
        if pid is not None:   # forked, but never said it started: it goes, and a launched kernel replaces it
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if status is not None:
            os.close(status)
        return None
    finally:
        os.close(ready)
    kernel = ForkedKernel(pid, status)
    _forked[:] = [k for k in _forked if k.poll() is None] + [kernel]
    return kernel


class _Kernel:
    """What the fork server's child runs (multiprocessing's spawn._main calls its _bootstrap): becomes what
    `python -m ipykernel_launcher ARGUMENTS`, started by jupyter_client, would be, then runs the kernel."""

    def __init__(self, arguments: list[str], environment: dict, cwd: str, streams: dict):
        self.arguments, self.environment, self.cwd, self.streams = arguments, environment, cwd, streams

    def _bootstrap(self, parent_sentinel=None) -> int:
        from multiprocessing import forkserver
        handshake, = forkserver.get_inherited_fds()
        _own_resource_tracker()
        os.setsid()   # its own session and process group, as start_new_session=True gives a launched kernel
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            if name in self.streams:
                os.dup2(os.open(self.streams[name], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), fd)
        os.environ.clear()
        os.environ.update(self.environment)
        # ipykernel's parent poller watches the server, which exits with the run: a kernel never outlives its run.
        # The variable for what the kernel starts; the option for the poller itself, whose default ipykernel read from
        # the variable when the server imported it.
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        os.chdir(self.cwd)
        # the server's path, without its first entry: the server was started with `python -c`, so that entry is ""
        # (the folder it started in), which ipykernel_launcher removes too (InteractiveShellApp adds the kernel's)
        sys.path[:] = _IMPORTED_WITH_PATH[1:] if _IMPORTED_WITH_PATH[:1] == [""] else _IMPORTED_WITH_PATH
        sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin,   # as `-m` sets it
                    *self.arguments, f"--IPKernelApp.parent_handle={os.getppid()}"]
        os.write(handshake, b"1")
        os.close(handshake)
        from ipykernel import kernelapp
        code = 0
        try:
            kernelapp.launch_new_instance()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        finally:
            atexit._run_exitfuncs()   # the fork server ends its children with os._exit, which skips them
        return code


def _own_resource_tracker() -> None:
    """In the forked kernel: forget the resource tracker of the process that asked for it (the fork server hands every
    child that process's), so that the kernel starts its own on first use, as a launched kernel does: what the
    kernel's own multiprocessing leaves (a killed kernel's semaphores) is reported on the kernel's stderr, the run's
    kernel log, not on the terminal of the run when it exits."""
    from multiprocessing import resource_tracker
    tracker = resource_tracker._resource_tracker
    fd = getattr(tracker, "_fd", None)
    if fd is not None:
        os.close(fd)
        tracker._fd, tracker._pid = None, None


def server_pid() -> int | None:
    """The process id of this process's fork server; None where none was started."""
    return getattr(_server.get("server"), "_forkserver_pid", None)


def cpu_seconds() -> float:
    """User and system CPU seconds of this process, of its children that ended, and of its fork server with the
    kernels the server forked that ended: the server reaps them, so their time is its children's, which
    getrusage(RUSAGE_CHILDREN) here never sees while the server runs. A sweep's cell and a zoo row take the
    difference across their run."""
    import resource
    import psutil
    total = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))
    pid = server_pid()
    if pid is None:
        return total
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return total
    return total + times.user + times.system + times.children_user + times.children_system


def _kill_at_exit() -> None:
    """At exit: a forked kernel still running is killed with its group, as the run would have closed it (a kernel
    started as a subprocess would wait for its parent poller to notice); then the server. A server started early
    (start) that is still importing would otherwise finish its imports before it saw this process gone, holding this
    process's stdout and stderr open until then: a `portkit run` refusing its input would keep a pipe reading it
    waiting for seconds."""
    for kernel in _forked:
        if kernel.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(kernel.pid, signal.SIGKILL)
            kernel.wait(5)
    pid = server_pid()
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
