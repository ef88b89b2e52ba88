"""Stage kernels forked from the fork server (portkit/run/kernel_forks.py): a forked kernel is what a launched one would
be (its environment, folder, Python path, arguments, session, output), its death and exit status are seen as a
launched kernel's, it does not outlive the process that started it, and a kernel that cannot be forked starts as a
new interpreter with the reason in the run's kernel log."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from portkit.core import torch_private
from portkit.run import kernel_forks

# In a process of its own (the fork server takes this process's environment when it starts): two kernels as the
# runner starts them, one launched (FORK off) and one forked, each answering what it was started with; then the forked
# one killed and its status read; one started after the environment changed (not forked); one whose server is killed
# under it; and a last forked kernel, from a new server, left running when the process exits.
PROBE = textwrap.dedent('''
    import json, os, signal, sys, time
    from jupyter_core.utils import run_sync
    from portkit.run import jupyter_kernels, kernel_forks, stage_kernel

    CELL = """
    import gc, json, multiprocessing, os, sys, time, psutil
    import mine
    held = multiprocessing.get_context("spawn").Semaphore()   # registered with a resource tracker, never released
    busy = time.process_time()
    while time.process_time() - busy < 0.5:   # half a second of the kernel's own CPU
        pass
    os.write(2, b"written on the kernel's stderr\\\\n")
    print(json.dumps({"cwd": os.getcwd(), "path": sys.path, "argv0": sys.argv[0], "mine": mine.__file__,
                      "variables": {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_WAIT_POLICY", "PROBE_VALUE")},
                      "own_group": os.getpgid(0) == os.getpid(), "own_session": os.getsid(0) == os.getpid(),
                      "stdin": os.path.realpath("/proc/self/fd/0"),
                      "parent_threads": len(psutil.Process(os.getppid()).threads()),
                      "frozen": gc.get_freeze_count()}))
    """

    async def ask(km):
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        out = []
        await kc.execute_interactive(CELL, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", ""))
                                     if m["msg_type"] == "stream" and m["content"]["name"] == "stdout" else None)
        kc.stop_channels()
        return json.loads("".join(out))

    folder, log = sys.argv[1], sys.argv[2]
    answers = {}
    with jupyter_kernels.kernel_environment(folder):
        for fork in (False, True):
            jupyter_kernels.FORK = fork
            kernel = jupyter_kernels.SharedKernel(cwd=folder, log=log)
            km = kernel.for_stage()
            answers["forked" if fork else "launched"] = {**run_sync(ask)(km),
                                                         "process": type(km.provisioner.process).__name__}
            if fork:
                cpu = kernel_forks.cpu_seconds()
                pid = km.provisioner.process.pid
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while kernel.exit_status() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                answers["killed_status"] = kernel.exit_status()
                answers["ended_kernel_cpu"] = kernel_forks.cpu_seconds() - cpu
            kernel.close()
        os.environ["PROBE_VALUE"] = "changed after the server started"   # read at import by nothing, but unknown
        kernel = jupyter_kernels.SharedKernel(cwd=folder, log=log)
        answers["changed"] = {**run_sync(ask)(kernel.for_stage()),
                              "process": type(kernel.km.provisioner.process).__name__}
        kernel.close()
        os.environ["PROBE_VALUE"] = "from the run"
        orphan = jupyter_kernels.SharedKernel(cwd=folder, log=log)   # its server killed under it
        process = orphan.for_stage().provisioner.process
        os.kill(kernel_forks.server_pid(), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        answers["orphan"] = [process.poll(), orphan.exit_status(), os.path.exists(f"/proc/{process.pid}")]
        orphan.close()
        left = jupyter_kernels.SharedKernel(cwd=folder, log=log)   # from a new server
        answers["left_pid"] = left.for_stage().provisioner.process.pid
    print("ANSWERS " + json.dumps(answers))
''')


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernel-folder")
    (folder / "mine.py").write_text("VALUE = 1\n")
    log = folder / "kernels.log"
    script = folder / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "PROBE_VALUE": "from the run"}
    done = subprocess.run([sys.executable, str(script), str(folder), str(log)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=folder)
    line = next((x for x in done.stdout.splitlines() if x.startswith("ANSWERS ")), None)
    assert done.returncode == 0 and line, done.stdout + done.stderr
    # what a kernel leaves to its resource tracker is the kernel's: its tracker reports it, not the run's at exit
    assert "leaked semaphore" not in done.stderr, done.stderr
    return json.loads(line.removeprefix("ANSWERS ")), log.read_text(), folder


def test_a_forked_kernel_is_what_a_launched_one_would_be(probed):
    answers, log, folder = probed
    launched, forked = answers["launched"], answers["forked"]
    assert launched["process"] == "Popen" and forked["process"] == "ForkedKernel"
    for key in ("cwd", "path", "argv0", "mine", "variables", "own_group", "own_session"):
        assert forked[key] == launched[key], key
    # stdin: the launched kernel's is a pipe nobody writes to (jupyter_client's), the forked one's /dev/null: neither
    # is ever read (a kernel's input comes over its stdin channel) nor a terminal
    assert forked["cwd"] == str(folder) and forked["mine"] == str(folder / "mine.py")   # the run's folder imports
    assert forked["variables"]["PROBE_VALUE"] == "from the run" and forked["variables"]["OMP_WAIT_POLICY"]
    assert forked["own_group"] and forked["own_session"] and forked["stdin"] == os.devnull
    assert launched["stdin"].startswith("/proc/") and "pipe:" in launched["stdin"]
    # the server it was forked from runs one thread: a fork copies only the forking one, so a lock another thread
    # held at the fork would stay held in the kernel for ever
    assert forked["parent_threads"] == 1
    # what the server imported came frozen (frozen_heap): the kernel's collections neither scan nor write to it; a
    # launched kernel froze nothing
    assert forked["frozen"] > 100_000 and launched["frozen"] == 0
    # both kernels' own output reached the run's kernel log, and the log says how each started
    assert log.count("written on the kernel's stderr") == 3   # launched, forked, launched after the change


def test_a_kernel_whose_server_died_ends_with_it_and_its_status_is_not_made_up(probed):
    """ipykernel's parent poller watches the server: the kernel ends; how it ended only the server could say, so its
    exit status is not known (None), never a guessed signal; the next kernel is forked from a new server."""
    answers, log, _ = probed
    assert answers["orphan"] == [1, None, False]
    assert log.count("forked from the fork server") == 3   # the probed kernel, the orphan, the one left running


def test_a_kernel_that_cannot_be_forked_starts_as_a_new_interpreter_and_the_log_says_why(probed):
    answers, log, _ = probed
    changed = answers["changed"]
    assert changed["process"] == "Popen" and changed["variables"]["PROBE_VALUE"] == "changed after the server started"
    assert ("started: a new interpreter (not forked: its environment differs from the fork server's in PROBE_VALUE)"
            in log)


def test_a_forked_kernels_death_is_seen_with_its_signal_its_cpu_counted_and_none_outlives_its_process(probed):
    answers, _, _ = probed
    assert answers["killed_status"] == -signal.SIGKILL   # as subprocess.Popen reports a SIGKILL
    # its CPU time (half a second busy in its cell, and its start) is counted once it has ended, as a launched
    # kernel's is in getrusage(RUSAGE_CHILDREN): a sweep's and the zoo's CPU seconds per run include it
    assert answers["ended_kernel_cpu"] >= 0.5
    deadline = time.monotonic() + 30   # the process that started it has exited: so has the kernel
    while time.monotonic() < deadline and os.path.exists(f"/proc/{answers['left_pid']}"):
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{answers['left_pid']}")


def test_a_kernel_is_forked_only_where_nothing_read_at_import_differs(monkeypatch):
    monkeypatch.setattr(kernel_forks, "_server", {})   # no server yet in this process: one would start with os.environ
    monkeypatch.delenv("PORTKIT_PROBE_VALUE", raising=False)
    command = [sys.executable, "-m", "ipykernel_launcher", "-f", "connection.json"]
    assert kernel_forks.forkable(command, {"env": {**os.environ, "PYTEST_CURRENT_TEST": "another"}}) == ""
    why = kernel_forks.forkable(command, {"env": {**os.environ, "PORTKIT_PROBE_VALUE": "1"}})
    assert why == "its environment differs from the fork server's in PORTKIT_PROBE_VALUE"
    # importing torch._dynamo sets Inductor's cache folder to torch's default (the server imports it): a kernel that
    # holds that default is forked whether or not the process that started the server held it then; another is not
    monkeypatch.setattr(kernel_forks, "_server", {"environment": kernel_forks._comparable(
        {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"})})
    default = torch_private.inductor_default_cache_dir()
    assert kernel_forks.forkable(command, {"env": {**os.environ, "TORCHINDUCTOR_CACHE_DIR": default}}) == ""
    why = kernel_forks.forkable(command, {"env": {**os.environ, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}})
    assert why == "its environment differs from the fork server's in TORCHINDUCTOR_CACHE_DIR"
    monkeypatch.setattr(kernel_forks, "_server", {})
    why = kernel_forks.forkable(["/usr/bin/env", "python", "-m", "ipykernel_launcher"], {})
    assert why.startswith("its command is not this Python's ipykernel_launcher")
    assert kernel_forks.forkable(command, {"stdout": subprocess.PIPE}) == "its stdout is not a file"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert kernel_forks.forkable(command, {}) == "kernels are forked on Linux only, this is darwin"
    monkeypatch.undo()
    # options a launched kernel would not get (the server is started with this interpreter's, its forks run with them)
    asked = subprocess.run([sys.executable, "-X", "faulthandler", "-W", "error::DeprecationWarning", "-c",
                            "import sys; from portkit.run import kernel_forks; "
                            "print(kernel_forks.forkable([sys.executable, '-m', 'ipykernel_launcher'], {}))"],
                           capture_output=True, text=True, timeout=120)
    assert asked.stdout.strip() == "this Python was started with options a new interpreter lacks: -W, -X faulthandler"


def test_a_fork_server_that_fails_leaves_the_kernels_to_be_launched_with_the_reason(monkeypatch):
    monkeypatch.setattr(kernel_forks, "_server", {})

    def refused(handshake):
        raise ConnectionRefusedError("no server")
    monkeypatch.setattr(kernel_forks, "_connect", refused)
    command = [sys.executable, "-m", "ipykernel_launcher", "-f", "connection.json"]
    assert kernel_forks.forkable(command, {}) == ""
    assert kernel_forks._fork(command, {}) is None
    why = "the fork server failed: ConnectionRefusedError: no server"
    assert kernel_forks.forkable(command, {}) == why   # every later kernel is launched, with the reason


def test_a_server_started_early_that_fails_leaves_the_kernels_to_be_launched_with_the_reason(monkeypatch):
    """`portkit run` starts the server before its own imports (jupyter_kernels.start_early): a server that cannot
    start then is every kernel's reason to be launched, as one that fails at the first fork is."""
    monkeypatch.setattr(kernel_forks, "_server", {})

    def broken():
        raise OSError("no fork here")
    monkeypatch.setattr(kernel_forks, "_fork_server", broken)
    kernel_forks.start()
    command = [sys.executable, "-m", "ipykernel_launcher", "-f", "connection.json"]
    assert kernel_forks.forkable(command, {}) == "the fork server failed: OSError: no fork here"
