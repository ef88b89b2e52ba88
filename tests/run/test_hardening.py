"""Hardening, round two: a stage whose kernel dies, two runs into one folder, the report's JSON and HTML as a
pair, repeated options, cut corpus texts, and the sweep on a host where Ray does not start or kills a worker."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, fixture_model
from portkit import cli
from portkit.corpora import corpus
from portkit.run import runner
from portkit.run import preflight
from portkit.run import scheduling
from portkit.run import stage_kernel
from portkit.runfolder import layout

DYING = f"{ROOT / 'tests' / 'fixtures' / 'dying.py'}:killed_model"
CHEAP = ["--target", "neuron", "--stages", "fallbacks", "--no-progress", "-p", "batch_size", "1", "-p", "seq_len", "8"]


def test_a_stage_whose_kernel_dies_fails_in_one_line_and_the_report_names_the_gap(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "--model", DYING, "--out", str(out), *CHEAP]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    # what is known: it died, the signal, the memory peak; far below the machine's memory it is not called "out of
    # memory", and no advice is given that the run already follows (CHEAP runs a batch of one)
    assert lines[0].startswith("portkit: stage fallbacks failed: the kernel running stage fallbacks "
                               "(01_fallbacks.ipynb) died, killed by SIGKILL (signal 9); the run's processes had "
                               "reached "), lines[0]
    assert lines[0].endswith(f"the executed notebook {out / '01_fallbacks.ipynb'} shows the last cell that ran")
    assert "out of memory" not in lines[0] and "--lanes 1" not in lines[0] and "batch_size" not in lines[0]
    assert "Traceback" not in captured.err + captured.out and "DeadKernelError" not in captured.err
    assert layout.read_log(out)["stages"]["fallbacks"]["status"] == "failed"
    saved = json.loads((out / "report.json").read_text())
    assert any("the kernel running stage fallbacks" in gap for gap in saved["gaps"]), saved["gaps"]


def _hold_in_another_process(out: Path) -> subprocess.Popen:
    code = (f"import time\nfrom portkit.runfolder import layout\nwith layout.hold({str(out)!r}):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_run_folder_in_use_by_another_run_is_refused_and_a_stale_lock_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = _hold_in_another_process(out)
    try:
        before = sorted(p.name for p in out.iterdir())
        assert cli.main(["run", "--model", fixture_model("tiny_encoder"), "--out", str(out), *CHEAP]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"portkit: error: invalid out folder '{out}': in use by another run (process {holder.pid}); "
                         "wait for it to end, or give another --out"]
        assert sorted(p.name for p in out.iterdir()) == before   # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)   # a killed run: its lock file stays, naming a process that is gone
        holder.wait()
    assert (out / layout.LOCK).read_text().strip() == str(holder.pid)
    with layout.hold(out):                   # the stale lock is taken over
        assert (out / layout.LOCK).read_text().strip() == str(os.getpid())
    assert layout.is_run_folder(out)


def test_the_report_pair_is_written_html_first_json_last_and_a_json_alone_is_incomplete(tmp_path, monkeypatch,
                                                                                        capsys):
    from portkit.stages.report.stage import build_report
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append(Path(b).name), real_replace(a, b)))
    (tmp_path / "fallbacks.json").write_text('{"stage": "fallbacks", "targets": {}}')
    r = build_report(["neuron"], run_dir=tmp_path)
    r.save(tmp_path)
    assert renamed[-2:] == ["report.html", "report.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no partial name left
    assert layout.read_report(tmp_path)["targets"]
    (tmp_path / "report.html").unlink()       # a save killed between its two renames, the other way round
    with pytest.raises(layout.IncompleteReport, match="has no report.html beside it"):
        layout.read_report(tmp_path)
    cli._print_verdicts(tmp_path)
    assert capsys.readouterr().out.startswith("report: none (")


def test_repeated_lists_are_deduplicated_with_a_note(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(runner, "run", lambda model, targets, out, user, stages, **kw: seen.update(
        targets=targets, stages=stages, user=user) or scheduling.RunResult(Path(out)))
    assert cli.main(["run", "--target", "tpu", "--target", "tpu", "--stages", "fallbacks,fallbacks,",
                     "--out", "nowhere-written", "-p", "batch_size", "2"]) == 0
    assert seen == {"targets": ["tpu"], "stages": "fallbacks", "user": {"batch_size": 2}}
    out = capsys.readouterr().out
    assert "portkit: note: target given more than once; using tpu" in out
    assert "portkit: note: stage given more than once; using fallbacks" in out
    assert "portkit: note: empty stage name in --stages 'fallbacks,fallbacks,' ignored" in out


def test_a_text_far_beyond_any_models_maximum_is_cut_in_the_plan_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "long.txt").write_text("short text\n" + "word " * (corpus.MAX_TEXT_CHARS // 2) + "\n")
    preflight.plan("minilm", ["neuron"], "run", {"corpus": "long.txt"}, "fallbacks")
    assert (f"corpus long.txt: 1 text(s) longer than {corpus.MAX_TEXT_CHARS:,} characters (the longest "
            f"{corpus.MAX_TEXT_CHARS * 5 // 2 - 1:,}) cut to {corpus.MAX_TEXT_CHARS:,}") in capsys.readouterr().out
    assert max(len(t) for t in corpus.load_corpus(str(tmp_path / "long.txt")).texts) == corpus.MAX_TEXT_CHARS
    assert not (tmp_path / "run").exists()


needs_ray = pytest.mark.skipif(__import__("importlib").util.find_spec("ray") is None, reason="Ray is not installed")


@needs_ray
def test_ray_that_does_not_start_is_one_line_and_its_temporary_folder_is_removed(tmp_path, monkeypatch, capsys):
    import ray
    from portkit.run import sweep
    made = []
    real_mkdtemp = sweep.tempfile.mkdtemp
    monkeypatch.setattr(sweep.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])

    tries = []

    def refuse(*args, **kwargs):
        tries.append(1)
        raise RuntimeError("Failed to start the GCS server.\nIt exited with code 1.")
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(sweep, "START_PAUSE_SECONDS", 0)
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), "--model", fixture_model("tiny_encoder"), "--memory-per-task", "1",
                     *CHEAP]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["portkit: error: Ray did not start on this machine in 3 tries (RuntimeError: Failed to start the "
                     "GCS server. It exited with code 1.); try --address of a running Ray cluster, or fewer workers at "
                     "once (a larger --cpus-per-task or --memory-per-task), or free memory and rerun"]
    assert len(tries) == sweep.START_ATTEMPTS       # a start a loaded machine missed is tried again
    assert made and not any(Path(m).exists() for m in made)


@needs_ray
def test_a_worker_killed_by_rays_memory_monitor_is_recorded_as_such(tmp_path):
    import ray
    from portkit.run import sweep

    class FakeRay:
        exceptions = ray.exceptions

        @staticmethod
        def get(ref):
            raise ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.\n"
                                                  "Memory on the node (IP: 10.0.0.1, ID: abc) ... Refer to the "
                                                  "documentation on how to address the out of memory issue")
    cell = sweep.plan_sweep([fixture_model("tiny_encoder")], ["neuron"], tmp_path / "sweep", stages="fallbacks")[0]
    record = sweep._collect(FakeRay, object(), time.time(), cell)
    assert record["status"] == "failed" and record["attempts"] == sweep.SYSTEM_RETRIES + 1
    assert record["error"].startswith("Ray's memory monitor killed the run's worker (the node ran low on memory), "
                                      "2 attempt(s); give each run more memory (--memory-per-task)")
    assert "Refer to the documentation" not in record["error"]


def test_a_dead_kernels_advice_is_only_what_the_run_has_not_done():
    """A kernel killed by SIGKILL near the machine's memory is likely out of memory; the advice names only the
    settings the run did not already use (one lane, a batch of one)."""
    import psutil
    total = psutil.virtual_memory().total
    stage = layout.stage("fallbacks")
    died = stage_kernel.KernelDied("fallbacks", -signal.SIGKILL, 8, Path("run/01_fallbacks.ipynb"))
    line = stage_kernel.kernel_died(stage, total, died, lanes=2)
    assert "likely out of memory" in line and line.endswith("run with less: one kernel at a time (--lanes 1) or a "
                                                            "smaller -p batch_size")
    assert stage_kernel.kernel_died(stage, total, died, lanes=1).endswith("run with less: a smaller -p batch_size")
    alone = stage_kernel.KernelDied("fallbacks", -signal.SIGKILL, 1, Path("nb"))
    assert stage_kernel.kernel_died(stage, total, alone, lanes=1).endswith(
        "with one kernel and a batch of one already: it needs a machine with more memory")
    segfault = stage_kernel.KernelDied("fallbacks", -signal.SIGSEGV, 8, Path("nb"))
    line = stage_kernel.kernel_died(stage, total, segfault, lanes=2)
    assert "killed by SIGSEGV (signal 11)" in line and "out of memory" not in line


# ---------------------------------------------------------------- round three
@needs_ray
def test_ray_address_in_the_environment_is_named(tmp_path, monkeypatch, capsys):
    """RAY_ADDRESS set and no --address: the sweep joins that cluster, says so in a note, and an error names the
    environment variable (Ray would otherwise refuse the local Ray's options, "object_store_memory must not be
    provided", naming neither)."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")   # nothing listens on port 1
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), "--model", fixture_model("tiny_encoder"), *CHEAP]) == 2
    captured = capsys.readouterr()
    assert ("portkit: note: RAY_ADDRESS=127.0.0.1:1 is set in the environment: the sweep joins that Ray cluster "
            "(unset RAY_ADDRESS for a local Ray)") in captured.out
    assert captured.err.strip().splitlines() == ["portkit: error: invalid Ray address (from environment variable "
                                                 "RAY_ADDRESS) '127.0.0.1:1': nothing answers there (Connection "
                                                 "refused)"]


def test_an_image_declaration_is_the_one_source_of_the_image_size():
    """image_declaration(8, outputs, channels=1) handed to LoadedModel without image_size: the model's image_size is
    the declaration's 8, and a batch of image crops is built at it; a different image_size besides is refused."""
    import torch
    from portkit.core.errors import BadParameter
    from portkit.models import inputs, registry
    declaration = inputs.image_declaration(8, (inputs.Output("logits", "classifier"),), channels=1)
    model = registry.LoadedModel("gray", "classifier", torch.nn.Flatten(), "test", declaration=declaration)
    assert model.image_size == 8
    batch, label = corpus.example_batch(model, None, 2, 8)
    assert batch["pixel_values"].shape == (2, 1, 8, 8) and label == "2 image crops of 8x8"
    with pytest.raises(BadParameter, match="invalid image_size 16: the declaration's images are 8x8"):
        registry.LoadedModel("gray", "classifier", torch.nn.Flatten(), "test", declaration=declaration, image_size=16)


def test_libraries_fd_output_in_a_kernel_goes_to_the_run_kernel_log_not_the_terminal(tmp_path, capfd):
    """libtpu's "Failed to find host bounds" WARNING is written to the kernel's file descriptor 2, which ipykernel
    copies into the notebook and onto the descriptor: a kernel started with a log holds it there, never on the
    terminal; the same line forwarded by papermill (progress shown) goes to the log too."""
    from jupyter_core.utils import run_sync
    from portkit.run import jupyter_kernels
    log = tmp_path / layout.KERNEL_LOG
    warning = "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
    with jupyter_kernels.SharedKernel(log=log) as kernel:
        client = kernel.for_stage().client()
        client.start_channels()
        try:
            run_sync(client.wait_for_ready)(timeout=60)
            reply = run_sync(client.execute_interactive)(f"import os; os.write(2, b{warning + chr(10)!r})",
                                                         timeout=60, output_hook=lambda msg: None)
        finally:
            client.stop_channels()
    assert reply["content"]["status"] == "ok"
    assert warning in log.read_text() and warning not in capfd.readouterr().err
    terminal = tmp_path / "terminal.txt"
    with open(terminal, "w", newline="") as shown:
        stream = stage_kernel.StageStderr(shown, log)
        stream.write(warning + "\n")
        stream.write("  fallbacks cells: 40%\r")
    assert terminal.read_bytes() == b"  fallbacks cells: 40%\r" and log.read_text().count(warning) == 2


def test_portkit_report_removes_what_a_killed_report_stage_left(tmp_path, capsys):
    """A kill -9 during the report stage leaves .05_report.partial.ipynb: `portkit report` removes it (holding the
    folder, as a run does) and says so; a folder a live run holds is refused."""
    (tmp_path / layout.MARKER).write_text("a run\n")
    (tmp_path / "fallbacks.json").write_text('{"stage": "fallbacks", "targets": {}}')
    partial = tmp_path / ".05_report.partial.ipynb"
    partial.write_text("{")
    cli.main(["report", str(tmp_path), "--target", "neuron"])
    assert not partial.exists()
    assert "portkit: note: removed 1 partial file(s) a killed run left: .05_report.partial.ipynb" in \
        capsys.readouterr().out
    holder = _hold_in_another_process(tmp_path)
    try:
        assert cli.main(["report", str(tmp_path)]) == 2
        assert capsys.readouterr().err.strip() == (f"portkit: error: invalid run folder '{tmp_path}': in use by a run "
                                                   f"(process {holder.pid}); wait for it to end")
    finally:
        holder.kill()
        holder.wait()


def test_check_against_itself_passes_with_a_note(tmp_path, capsys):
    """`portkit check RUN --baseline RUN` cannot fail: it passes, and its output says the baseline is the run
    itself (a baseline of another model is refused: tests/cli/test_bad_input.py)."""
    (tmp_path / "report.json").write_text('{"model": {"name": "minilm", "kind": "embedding"}, "targets": '
                                          '{"tpu": {"verdict": "ready"}}}')
    assert cli.main(["check", str(tmp_path), "--baseline", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out.splitlines()[0]
    assert out.splitlines()[1] == ("  note: the baseline is the run itself: every check compares the run with "
                                   "itself, so it cannot fail; give an earlier run as --baseline")
