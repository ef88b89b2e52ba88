"""Ctrl-C during a run (portkit.run.runner): the stages' kernels stop, run.json records the stage as
interrupted, one line, exit 130, and the same command reruns it. Its own file so that scripts/test.sh runs it
beside the notebooks (two real runs: the interrupted one in a subprocess, the rerun in-process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from portkit import cli
from portkit.core import offline
from portkit.runfolder import layout

SLOW = f"{ROOT / 'tests' / 'fixtures' / 'dying.py'}:slow_model"   # sleeps in its kernel while told to
CHEAP = ["--target", "neuron", "--stages", "fallbacks", "--no-progress", "-p", "batch_size", "1", "-p", "seq_len", "8"]


def test_ctrl_c_stops_the_kernels_records_the_stage_interrupted_exits_130_and_a_rerun_completes(
        tmp_path, monkeypatch):
    """Ctrl-C (SIGINT to the terminal's process group) mid-stage: the kernel is killed, run.json records the stage
    as interrupted, its result is gone, no partial file stays, one line on stderr, exit 130; the same command
    then runs the stage to its end. The model's forward sleeps in the first run's kernel, so the stage is still
    running when Ctrl-C comes, however fast the host."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "portkit.cli", "run", "--model", SLOW, "--out", str(out), *CHEAP]
    # PYTHONFAULTHANDLER: a hang after Ctrl-C is reported with every thread's stack (SIGABRT, below); set in the
    # environment, not as -X faulthandler, so that the run's kernel is forked as a user's is (kernel_forks.forkable)
    # and without the offline switches, as a user's shell: the CLI sets them before it starts its fork server
    env = {**{k: v for k, v in os.environ.items() if k not in offline.VARIABLES}, "PYTHONPATH": str(ROOT),
           "PYTHONFAULTHANDLER": "1"}
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           env={**env, "PORTKIT_TEST_SLOW_FORWARD": "120"},
                           start_new_session=True,   # its own process group, as a shell gives a foreground job
                           # and SIGINT at its default, as in a terminal: a job a script starts with `&` (the test
                           # command's notebook half) inherits SIGINT ignored, and Python then never raises
                           # KeyboardInterrupt (POSIX sh: asynchronous lists ignore SIGINT without job control)
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    partial = out / ".01_fallbacks.partial.ipynb"
    for _ in range(600):          # the stage has started once papermill saved its first cell
        if partial.exists() or run.poll() is not None:
            break
        time.sleep(0.1)
    started = partial.exists()
    os.killpg(run.pid, signal.SIGINT)
    try:
        stdout, stderr = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGABRT)
        stdout, stderr = run.communicate(timeout=30)
        log = out / layout.KERNEL_LOG
        pytest.fail(f"no exit within 120 s of Ctrl-C ({'mid-stage' if started else 'the stage had not started'}); "
                    f"its threads:\n{stderr[-6000:]}\nkernel log:\n{log.read_text()[-2000:] if log.exists() else '-'}")
    assert run.returncode == 130, stderr
    assert "forked from the fork server" in (out / layout.KERNEL_LOG).read_text()   # the kernel a user's run has
    assert stderr.strip().splitlines() == [f"portkit: interrupted: stage(s) fallbacks stopped and recorded as "
                                           f"interrupted in {out / 'run.json'}; rerun the same command to run them "
                                           "again"]
    assert "Traceback" not in stdout + stderr
    assert layout.read_log(out)["stages"]["fallbacks"]["status"] == "interrupted"
    assert not (out / "fallbacks.json").exists()
    assert not [p.name for p in out.iterdir() if ".partial." in p.name or p.name.endswith(".tmp")]
    assert not (out / layout.running_marker("fallbacks")).exists()   # a stopped stage is no longer running
    # the same command again, in-process (the signal and the exit code are the process's, above); its model sleeps
    # only where PORTKIT_TEST_SLOW_FORWARD is set, as it was for the first run alone
    monkeypatch.delenv("PORTKIT_TEST_SLOW_FORWARD", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv[3:]) == 0
    assert layout.read_log(out)["stages"]["fallbacks"]["status"] == "ok" and (out / "fallbacks.json").is_file()
