"""The runner: user paths made absolute in the plan, the run-folder rule, partial files, and (slow) a run
killed mid-stage that reruns cleanly, and the same seed giving the same result."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT, fixture_model
from portkit.core import atomic_io
from portkit.core import locations
from portkit import cli
from portkit.run import runner
from portkit.run import preflight
from portkit.run import scheduling
from portkit.core.progress import HEADLESS_VARIABLE
from portkit.run import stage_kernel
from portkit.stages import options

# Keys whose values are measured times or shares of a measured time (each named *time_share): two runs with one
# seed differ there and nowhere else. A list whose order is by time (the op and module tables) is compared as a
# multiset.
TIME_KEYS = frozenset({"seconds", "time_share", "fallback_time_share"})
CHEAP_RUN = ["--model", fixture_model("tiny_encoder"), "--target", "neuron", "--stages", "fallbacks",
             "--no-progress", "-p", "batch_size", "1", "-p", "seq_len", "8", "-p", "seed", "3"]


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_plan_makes_every_user_path_absolute_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts.jsonl").write_text('{"body": "first text"}\n{"body": "second text"}\n')
    (tmp_path / "mine.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    before = _files(tmp_path)
    _, per_stage = preflight.plan("mine.py:build", ["cpu"], "run", {"corpus": "texts.jsonl", "text_column": "body"},
                               "fallbacks")
    (stage, values), = per_stage
    assert values["corpus"] == str(tmp_path / "texts.jsonl")
    assert values["model"] == f"{tmp_path / 'mine.py'}:build"
    assert values["out_dir"] == str((tmp_path / "run").resolve())
    assert _files(tmp_path) == before


def test_a_run_folder_is_marked_or_holds_only_run_files(tmp_path):
    assert runner.is_run_folder(tmp_path)                        # empty
    (tmp_path / "fallbacks.json").write_text("{}")
    (tmp_path / "01_fallbacks.ipynb").write_text("{}")
    (tmp_path / ".01_fallbacks.partial.ipynb").write_text("{")
    assert runner.is_run_folder(tmp_path)                        # written by the notebooks alone
    (tmp_path / "holiday.jpg").write_bytes(b"\xff\xd8")
    assert not runner.is_run_folder(tmp_path)                    # someone else's file
    (tmp_path / runner.MARKER).write_text("")
    assert runner.is_run_folder(tmp_path)                        # a run wrote here before


def test_partial_names_are_hidden_recognised_and_removed(tmp_path):
    target = tmp_path / "01_fallbacks.ipynb"
    partial = atomic_io.partial_path(target)
    assert partial.parent == tmp_path and partial.name.startswith(".") and partial.suffix == ".ipynb"
    assert atomic_io.is_partial(partial.name) and not atomic_io.is_partial(target.name)
    assert not atomic_io.is_partial("fallbacks.json") and not atomic_io.is_partial(runner.MARKER)
    atomic_io.write_json(tmp_path / "fallbacks.json", {"ok": True})
    assert [p.name for p in tmp_path.iterdir()] == ["fallbacks.json"]   # write_json leaves no temp file
    partial.write_text("{half")
    (tmp_path / ".fallbacks.json.x1y2.tmp").write_text("{half")
    assert sorted(p.name for p in atomic_io.remove_partials(tmp_path)) == [".01_fallbacks.partial.ipynb",
                                                                     ".fallbacks.json.x1y2.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["fallbacks.json"]


def _half_written(out: Path) -> list[str]:
    """The files that are not partial names and do not read whole: JSON that does not parse, a notebook that is
    not valid nbformat, a page without its end."""
    broken = []
    for path in out.iterdir():
        if atomic_io.is_partial(path.name):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".ipynb":
                nbformat.validate(nbformat.read(str(path), as_version=4))
            elif path.suffix == ".html" and not path.read_text().rstrip().endswith("</html>"):
                raise ValueError("no </html>")
        except (ValueError, nbformat.ValidationError) as exc:
            broken.append(f"{path.name}: {exc}")
    return broken


def _executed_cells(path: Path) -> int:
    try:
        notebook = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0   # not there yet, or papermill is saving it this instant
    return sum(1 for cell in notebook.get("cells", []) if cell.get("execution_count"))


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory):
    """CHEAP_RUN as a command, SIGKILLed with its kernel once the stage has executed two cells, what that left in
    the folder, then the same run again in that folder (in-process): the killed run's tests read it, and its
    finished result is the first of the two runs with one seed."""
    from portkit.targets import specs
    psutil = pytest.importorskip("psutil")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(specs.MODE_VARIABLE, "emulated")      # as conftest's emulated_unless_native sets it for a test
        return _kill_then_rerun(psutil, tmp_path_factory.mktemp("killed") / "run")


def _kill_then_rerun(psutil, out: Path) -> tuple[Path, dict, int]:
    """killed_and_rerun's run, kill and rerun in `out`: (out, what the kill left, the rerun's exit code)."""
    args = ["run", "--out", str(out), *CHEAP_RUN]
    process = subprocess.Popen([sys.executable, "-m", "portkit.cli", *args], cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = atomic_io.partial_path(out / "01_fallbacks.ipynb")
    try:
        deadline = time.monotonic() + 300
        while _executed_cells(partial) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        running, started = process.poll() is None, _executed_cells(partial)
    finally:
        # SIGKILL the command and its kernel (the kernel runs in a session of its own)
        tree = [process, *psutil.Process(process.pid).children(recursive=True)]
        for proc in tree:
            try:
                proc.send_signal(signal.SIGKILL)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        process.wait(timeout=60)
    killed = {"running": running, "started cells": started, "half written": _half_written(out),
              "notebook shown done": (out / "01_fallbacks.ipynb").exists()}
    return out, killed, cli.main(args)


@pytest.mark.slow
def test_a_run_killed_mid_stage_leaves_no_half_written_file_and_reruns(killed_and_rerun):
    out, killed, rerun = killed_and_rerun
    assert killed["running"], "the stage ended before it could be killed"
    assert killed["started cells"] >= 2, "the stage did not start within 300 s"
    assert not killed["notebook shown done"]    # the stage did not finish: no notebook shown as done
    assert killed["half written"] == []

    assert rerun == 0                           # the rerun completes in the same folder
    assert not [p.name for p in out.iterdir() if atomic_io.is_partial(p.name)]
    assert _half_written(out) == []
    assert json.loads((out / "fallbacks.json").read_text())["stage"] == "fallbacks"
    assert _executed_cells(out / "01_fallbacks.ipynb") >= 2


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in TIME_KEYS}
    if isinstance(value, list):
        items = [_without_times(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return value


@pytest.mark.slow
def test_the_same_seed_gives_the_same_result_apart_from_times(tmp_path, killed_and_rerun):
    first, _, rerun = killed_and_rerun          # CHEAP_RUN's finished result, rerun after a kill
    assert rerun == 0
    assert cli.main(["run", "--out", str(tmp_path / "second"), *CHEAP_RUN]) == 0
    results = [json.loads((folder / "fallbacks.json").read_text()) for folder in (first, tmp_path / "second")]
    assert _without_times(results[0]) == _without_times(results[1])
    assert results[0]["inputs"]["shapes"]["input_ids"] == [1, 8]


def _stub_stages(monkeypatch, failing=()):
    """Stage execution without kernels: a stage in `failing` fails as a notebook cell would; the others
    write the stage 1 result of the lstm model (a real one, made once per test)."""
    from portkit.corpora import corpus
    from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
    from portkit.models import registry
    m = registry.load("lstm")
    inputs, described = corpus.example_batch(m, corpus.load_corpus(), 2, 8)
    made = find_fallbacks(m, inputs, ["neuron", "tpu"], RecordSettings(description=described))
    ran = []

    def execute(stage, values, out, progress, kernel):
        ran.append(stage.name)
        if stage.name in failing:
            return f"cell 3 of {stage.notebook} raised CompileRefused: refused on purpose"
        made.save(out / stage.result)   # every stub writes a fallbacks-shaped result under its own name
        return None
    monkeypatch.setattr(stage_kernel, "execute", execute)
    # clearing a kernel for the next stage, without a kernel
    monkeypatch.setattr(runner.jupyter_kernels.SharedKernel, "prepare",
                        lambda kernel: setattr(kernel, "prepared", True))
    return ran


def test_a_failed_stage_does_not_stop_the_run_and_the_report_names_it(tmp_path, monkeypatch, capsys):
    ran = _stub_stages(monkeypatch, failing={"fallbacks"})
    out = tmp_path / "run"
    (out).mkdir()
    (out / "fallbacks.json").write_text('{"targets": {}, "summary": "from an older run"}')   # stale
    rc = cli.main(["run", "--model", "lstm", "--out", str(out), "--stages", "fallbacks,compile", "--no-progress"])
    assert rc == 1 and ran == ["fallbacks", "compile"]            # compile ran after the failure
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["portkit: stage fallbacks failed: cell 3 of 01_fallbacks.ipynb raised CompileRefused: "
                   "refused on purpose"]
    assert not (out / "fallbacks.json").exists()                  # the older result did not survive
    log = json.loads((out / "run.json").read_text())["stages"]
    assert log["fallbacks"]["status"] == "failed" and log["compile"]["status"] == "ok"
    saved = json.loads((out / "report.json").read_text())         # rebuilt although a stage failed
    assert saved["stages"]["fallbacks"]["status"] == "failed"
    assert any("stage fallbacks failed in the latest run: cell 3 of 01_fallbacks.ipynb" in g for g in saved["gaps"])


def test_a_run_of_one_stage_rebuilds_the_report_unless_told_not_to(tmp_path, monkeypatch):
    _stub_stages(monkeypatch)
    out = tmp_path / "run"
    result = runner.run("lstm", ["neuron", "tpu"], str(out), {}, "fallbacks", progress=False, log=lambda line: None)
    assert result.report_rebuilt and result.failures == {}
    first = (out / "report.json").stat().st_mtime_ns
    runner.run("lstm", ["neuron", "tpu"], str(out), {}, "fallbacks", progress=False, log=lambda line: None)
    before = (out / "report.json").stat().st_mtime_ns
    assert before != first
    kept = runner.run("lstm", ["neuron", "tpu"], str(out), {}, "fallbacks", progress=False, log=lambda line: None,
                      settings=runner.RunSettings(rebuild_report=False))
    assert not kept.report_rebuilt and (out / "report.json").stat().st_mtime_ns == before


def test_params_shows_each_stages_own_default(capsys):
    import papermill
    assert cli.main(["params"]) == 0
    shown = capsys.readouterr().out
    for stage in runner.STAGES:
        declared = papermill.inspect_notebook(str(locations.NOTEBOOKS / stage.notebook))
        for name, info in declared.items():
            if name in options.SHARED:
                continue
            one = f"{name} = {info['default']}  # "
            many = f"    = {info['default']}  ["
            lines = [line for line in shown.splitlines() if line.startswith(one) or line.startswith(many)]
            assert any(stage.name in line.split("[")[-1] for line in lines), f"{stage.name}: {name}"


def test_a_stage_that_does_not_apply_is_skipped_with_its_reason_not_failed(tmp_path, monkeypatch, capsys):
    from portkit.stages.buckets.stage import NOTHING_TO_BUCKET, skip_unless_it_applies
    from portkit.runfolder import results

    class ImageModel:        # what the stage reads of a model that takes one fixed image shape
        name, seq_dim = "vit", None      # no dimension of its inputs varies with the data

        def describe(self):
            return {"name": self.name}
    ran = _stub_stages(monkeypatch)
    stub = stage_kernel.execute

    def execute(stage, values, out, progress, kernel):
        if stage.name == "buckets":      # the notebook's first step, as 03_buckets runs it
            skip_unless_it_applies(ImageModel(), out, ["neuron", "tpu"])
        return stub(stage, values, out, progress, kernel)
    monkeypatch.setattr(stage_kernel, "execute", execute)
    out = tmp_path / "run"
    rc = cli.main(["run", "--model", "lstm", "--out", str(out), "--stages", "fallbacks,buckets", "--no-progress"])
    reason = f"vit {NOTHING_TO_BUCKET}"
    assert rc == 0 and ran == ["fallbacks"]
    assert f"[buckets] skipped: {reason}" in capsys.readouterr().out
    logged = json.loads((out / "run.json").read_text())["stages"]["buckets"]
    assert logged.pop("seconds") >= 0      # a measured time: what the skip took on this host
    assert logged == {"status": "skipped", "error": reason, "notebook": "03_buckets.ipynb", "peak_memory_bytes": None}
    assert results.read_buckets(out) is None and results.read_stage(out, "buckets") is None   # later stages: absent
    saved = json.loads((out / "report.json").read_text())
    assert saved["stages"]["buckets"]["status"] == "skipped" and saved["stages"]["buckets"]["problem"] == reason
    assert not any("buckets" in g for g in saved["gaps"])          # not applying is not a gap
    text_model = type("TextModel", (ImageModel,), {"seq_dim": "tokens"})()
    assert skip_unless_it_applies(text_model, out, ["tpu"]) is None       # a text model goes on


def test_an_abstract_model_skips_the_stages_that_need_weights_without_starting_them(tmp_path, monkeypatch, capsys):
    from portkit.stages import options
    from portkit.runfolder import results
    from portkit.core.errors import BadParameter
    ran = []
    monkeypatch.setattr(stage_kernel, "execute", lambda stage, *args: ran.append(stage.name))
    out = tmp_path / "run"
    rc = cli.main(["run", "--model", "tiny-llama", "--out", str(out), "--stages", "fallbacks,compile,buckets,accuracy",
                   "--no-progress"])
    assert rc == 0 and ran == []                                   # no notebook started
    log = json.loads((out / "run.json").read_text())["stages"]
    assert {s: e["status"] for s, e in log.items()} == dict.fromkeys(["fallbacks", "compile", "buckets", "accuracy"],
                                                                       "skipped")
    assert all(e["error"].startswith(f"{results.ABSTRACT}: tiny-llama") for e in log.values())
    saved = json.loads((out / "report.json").read_text())
    assert saved["stages"]["accuracy"]["status"] == "skipped" and "xla.json is missing" in saved["gaps"]
    assert not any((out / s.notebook).exists() for s in runner.STAGES)
    results.skip_if_abstract("tiny-llama", out, "xla", ["tpu"])      # stage 3b runs it: no skip
    results.skip_if_abstract("minilm", out, "fallbacks", ["tpu"])    # a model with weights: no skip
    with pytest.raises(BadParameter, match="unknown model 'llama3-9b'; choose one of: .*llama3-70b, llama3-8b"):
        options.common("llama3-9b", ["tpu"], str(out))


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_the_stages_share_one_kernel_cleared_between_them_and_a_dead_one_is_replaced(tmp_path):
    import papermill
    from portkit.run import jupyter_kernels
    first = _notebook(tmp_path / "first.ipynb", "import os\nleft_behind = 1\nprint(os.getpid())")
    later = _notebook(tmp_path / "later.ipynb", "import os\nassert 'left_behind' not in globals()\nprint(os.getpid())")

    def pid(notebook, km) -> int:
        done = papermill.execute_notebook(str(notebook), str(tmp_path / "out.ipynb"), km=km, progress_bar=False,
                                          kernel_name=jupyter_kernels.KERNEL)
        assert done.cells[0].execution_count == 1            # numbered as in a new kernel
        return int(done.cells[0].outputs[0]["text"])
    with jupyter_kernels.SharedKernel() as kernel:
        one = pid(first, kernel.for_stage())
        assert pid(later, kernel.for_stage()) == one          # the same interpreter, its namespace empty
        subprocess.run(["kill", "-9", str(one)], check=True)  # a stage that kills its kernel
        assert pid(later, kernel.for_stage()) != one          # the next stage gets a new one
        km = kernel.km
    assert not km.has_kernel                                   # shut down with the run



def test_stages_start_once_what_they_read_has_ended_three_at_a_time_where_cores_and_memory_allow(tmp_path, monkeypatch):
    import threading
    from portkit.stages.buckets.stage import reads
    from portkit.run import jupyter_kernels
    _stub_stages(monkeypatch)
    # the order of events, not their times: each stage's start and end and each kernel cleared, as they happen;
    # a stage in `beside` waits at a barrier that the stage that must run beside it reaches too (a scheduler
    # that runs them one after another breaks the barrier and fails the run)
    stub, events, lock, beside = stage_kernel.execute, [], threading.Lock(), {}

    def record(*event):
        with lock:
            events.append(event)

    def execute(stage, values, out, progress, kernel):
        record("start", stage.name, kernel.lane, kernel.prepared)
        # while it runs, its marker holds the run's process id (a stage that reads it late waits on it)
        assert (Path(out) / runner.layout.running_marker(stage.name)).read_text() == str(os.getpid())
        kernel.prepared = False          # as for_stage: the stage dirties its kernel
        if stage.early:                  # stage 3: its chosen plans first, then a long replay
            assert not (Path(out) / stage.early).exists()      # an earlier run's plans are gone
            (Path(out) / stage.early).write_text("{}")
        for barrier in beside.get(stage.name, ()):
            barrier.wait()
        error = stub(stage, values, out, progress, kernel)
        record("end", stage.name, kernel.lane)
        return error
    monkeypatch.setattr(stage_kernel, "execute", execute)

    def prepare(kernel):
        record("cleared", kernel.lane)
        kernel.prepared = True
    monkeypatch.setattr(jupyter_kernels.SharedKernel, "prepare", prepare)
    monkeypatch.setattr(jupyter_kernels, "available_memory", lambda: 64 * 2 ** 30)
    monkeypatch.setattr(jupyter_kernels.os, "cpu_count", lambda: 2)
    assert reads(["neuron", "tpu"]) == () and reads(["tpu", "cpu"]) == ("compile",)
    # stage 2 reads stage 1 late (in a later cell, which waits while stage 1 runs) and stage 3 reads neither
    # (emulated targets): the three start at once on two cores (one lane more than cores), a built-in model being
    # known to be small before it is loaded; stage 4 needs stage 3's plans only: it starts in the kernel stage 1
    # left, while stage 2 compiles and stage 3 replays; stage 3b needs stage 2's result and stage 3's plans: it
    # starts in a kernel left free, while stage 3 replays
    first, plans = threading.Barrier(3, timeout=120), threading.Barrier(3, timeout=120)
    late = threading.Barrier(2, timeout=120)
    beside.update(fallbacks=[first], compile=[first, plans], buckets=[first, plans, late], accuracy=[plans],
                  xla=[late])
    runner.run("lstm", ["neuron", "tpu"], str(tmp_path / "run"), progress=False, log=lambda line: None)
    assert not list((tmp_path / "run").glob(".*.running"))   # every stage's marker removed as it ended

    def spans():   # stage: (index of its start event, of its end event, its kernel's lane, its kernel cleared)
        starts = {e[1]: (i, e[2], e[3]) for i, e in enumerate(events) if e[0] == "start"}
        ends = {e[1]: i for i, e in enumerate(events) if e[0] == "end"}
        return {name: (start, ends[name], lane, prepared) for name, (start, lane, prepared) in starts.items()}
    ran = spans()
    assert sorted(ran) == sorted(s.name for s in runner.STAGES)
    overlap = lambda a, b: ran[a][0] < ran[b][1] and ran[b][0] < ran[a][1]   # noqa: E731
    assert overlap("fallbacks", "compile") and overlap("fallbacks", "buckets")
    assert len({ran[name][2] for name in ("fallbacks", "compile", "buckets")}) == 3   # each in a kernel of its own
    for stage in runner.STAGES:                     # and none starts before what it reads has ended,
        for read in scheduling.reads(stage, ["neuron", "tpu"]):
            if read in stage.reads_early or read in stage.reads_late:   # or for stage 4, before stage 3 has
                assert ran[stage.name][0] > ran[read][0], (stage.name, read)   # written its plans; stage 2: started
            else:
                assert ran[stage.name][0] > ran[read][1], (stage.name, read)
    # stage 4 starts in the kernel stage 1 left, while stage 3 still replays and stage 2 compiles in the others
    assert overlap("accuracy", "buckets") and overlap("accuracy", "compile")
    assert ran["accuracy"][2] == ran["fallbacks"][2]
    assert overlap("xla", "buckets") and ran["xla"][0] > ran["compile"][1]
    assert scheduling.reads(runner.layout.stage("buckets"), ["cpu"]) == ("compile",)   # compile times read
    # a kernel is cleared as soon as its stage has ended, while the next stage waits for what it reads: the
    # stages after the first three (new kernels) start in a cleared kernel; none is cleared after the last stage
    assert {name for name, span in ran.items() if not span[3]} == {"fallbacks", "compile", "buckets"}
    cleared = [i for i, e in enumerate(events) if e[0] == "cleared"]
    assert len(cleared) < len(ran) and max(cleared) < ran["report"][1]

    events.clear()
    beside.clear()
    runner.run("lstm", ["neuron", "tpu"], str(tmp_path / "one"), progress=False, log=lambda line: None,
               settings=runner.RunSettings(lanes=1))
    ran = spans()
    assert not overlap("fallbacks", "buckets")      # one lane: one after another
    assert all(not overlap(a, b) for a in ran for b in ran if a != b)
    monkeypatch.setattr(jupyter_kernels, "available_memory", lambda: 3 * 2 ** 30)   # room for one kernel with the model
    assert jupyter_kernels.lanes_for(10 ** 6) == 1 and jupyter_kernels.lanes_for(None) == 1
    monkeypatch.setattr(jupyter_kernels, "available_memory", lambda: 5 * 2 ** 30)   # room for two
    assert jupyter_kernels.lanes_for(10 ** 6) == 2
    monkeypatch.setattr(jupyter_kernels, "available_memory", lambda: 64 * 2 ** 30)
    assert jupyter_kernels.lanes_for(10 ** 6) == 3 and jupyter_kernels.lanes_for(10 ** 6, lanes=1) == 1
    monkeypatch.setattr(jupyter_kernels.os, "cpu_count", lambda: 1)      # one core: one lane more, two
    assert jupyter_kernels.lanes_for(10 ** 6) == 2


def test_the_size_a_run_assumes_before_loading_a_model_bounds_it(tmp_path):
    from portkit.models import registry
    for name in registry.SOURCES:                       # a built-in: the bound the runner assumes holds
        assert registry.load(name).parameters <= registry.size_hint(name) == registry.BUILTIN_MAX_PARAMETERS, name
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(bytes(4000))   # 1000 float32 or 2000 half-precision weights
    assert registry.size_hint(str(tmp_path)) == 2000 and registry.size_hint("mine.py:build") is None


def test_the_kernels_environment_is_set_for_the_run_where_the_user_set_none_and_then_restored(monkeypatch):
    from portkit.run import jupyter_kernels
    first, *others = jupyter_kernels.ENVIRONMENT
    monkeypatch.setenv(first, "mine")
    for key in others:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv(HEADLESS_VARIABLE, raising=False)
    with jupyter_kernels.kernel_environment("/models"):
        assert os.environ[first] == "mine"                 # the user's own setting is kept
        assert all(os.environ[key] == jupyter_kernels.ENVIRONMENT[key] for key in others)
        assert os.environ["PYTHONPATH"].split(os.pathsep) == ["/models", "/elsewhere"]
        assert os.environ[HEADLESS_VARIABLE] == "1"       # nobody watches a kernel
    assert os.environ[first] == "mine" and os.environ["PYTHONPATH"] == "/elsewhere"
    assert not any(key in os.environ for key in (*others, HEADLESS_VARIABLE))   # this process is as it was


def test_the_kernels_import_a_package_modules_model_from_the_users_folder():
    from portkit.run import jupyter_kernels
    assert jupyter_kernels.kernel_folder("mypackage.models:build") == os.getcwd()
    assert jupyter_kernels.kernel_folder("/abs/models.py:build") is None        # a file: the kernel imports it by path
    assert jupyter_kernels.kernel_folder("minilm") is None
