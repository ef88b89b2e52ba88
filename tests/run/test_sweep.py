"""portkit sweep: a two-model sweep on a local Ray (one failing model beside it), its report, reruns that
skip finished runs, bad input that writes nothing, and the install line where Ray is missing."""
import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import ROOT, fixture_model
from portkit import cli
from portkit.stages.report import stage
from portkit.run import sweep

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install 'portkit[sweep]')")
CHEAP = ["--target", "neuron", "--stages", "fallbacks", "-p", "batch_size", "2", "-p", "seq_len", "16",
         "--memory-per-task", "1", "--no-progress"]
GOOD = [fixture_model("tiny_encoder"), fixture_model("gru_model")]   # ready; blocked (GRU has no Neuron kernel)
BROKEN = fixture_model("broken_model")                              # its fallbacks stage raises


def _without(argv, args):
    """argv less the option (or -p NAME) that `args` gives its own value: one that takes one value may not be
    given twice."""
    for i in range(len(argv)):
        if argv[i] == args[0] and (args[0] != "-p" or argv[i + 1] == args[1]) and args[0] != "--target":
            return argv[:i] + argv[i + (3 if args[0] == "-p" else 2):]
    return argv


def _models(*specs):
    return [arg for spec in specs for arg in ("--model", spec)]


def test_missing_ray_gives_the_install_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), *_models(*GOOD), *CHEAP]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "portkit: error: portkit sweep needs Ray: pip install 'portkit[sweep]'"]
    assert not out.exists()


@needs_ray
@pytest.mark.parametrize("args,message", [
    (["--target", "trn"], "unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda"),
    (["--stages", "fallback"], "unknown stage 'fallback'; choose one of: fallbacks"),
    (["-p", "batch_size", "0"], "invalid batch_size 0: must be a positive whole number"),
    (["--options", "seq_len"], "invalid option set 'seq_len': write it as NAME=VALUE"),
    (["--options", "seq_len=0"], "invalid seq_len 0"),
    (["--memory-per-task", "0"], "invalid memory per task 0.0: must be a positive number"),
    (["--address", "127.0.0.1:1"], "invalid Ray address (from --address) '127.0.0.1:1': nothing answers there"),
    (["--address", "head-node"], "give HOST:PORT of the cluster's head, or auto"),
    (["--model", fixture_model("tiny_encoder").replace("models.py", "nowhere.py")], "no such file"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), *_models(*GOOD), *_without(CHEAP, args), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


@needs_ray
def test_two_models_sharing_a_run_folder_are_bad_input(tmp_path, capsys):
    other = tmp_path / "models.py"
    other.write_text("from tests.fixtures.models import tiny_encoder\n")
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), *_models(GOOD[0], f"{other}:tiny_encoder"), *CHEAP]) == 2
    assert "its run folder 'models.py-tiny_encoder' is also that of" in capsys.readouterr().err
    assert not out.exists()


def test_cell_summary_reads_verdict_blockers_buckets_hbm_and_accuracy():
    t = stage.TargetReport("tpu", "Google TPU", "emulated", based_on=["buckets", "xla", "accuracy"],
                            findings=[{"stage": "fallbacks", "notebook": "01_fallbacks.ipynb", "severity": "blocker",
                                       "kind": "sparse", "message": "sparse tensors", "advice": "use dense"}],
                            buckets={"planner": "auto", "boundaries": [32, 64], "batch_sizes": [1], "why": "cheapest"},
                            precision={"name": "tpu", "setting": "highest", "verdict": "passed", "suggestions": []},
                            details={"xla shapes": [{"shape": "2x32", "HBM MiB": 12.5, "fits HBM": True},
                                                    {"shape": "2x64", "HBM MiB": 20.0, "fits HBM": True}],
                                     "accuracy outputs": [{"output": "pooled", "max abs": "3e-07"}]})
    summary = sweep.cell_summary({"targets": {"tpu": t.to_dict()}}, "tpu")
    assert summary["verdict"] == "blocked" and summary["blockers"] == ["sparse tensors"]
    assert summary["bucket_plan"] == {"planner": "auto", "boundaries": [32, 64], "batch_sizes": [1]}
    assert summary["hbm"]["peak_mib"] == 20.0 and summary["hbm"]["fits"] is True
    assert summary["accuracy"] == {"verdict": "passed", "setting": "highest", "output": "pooled", "max_abs": "3e-07"}


def test_sweep_report_escapes_and_links(tmp_path):
    cell = sweep.Cell("<script>alert(1)</script>", "neuron", {}, "", {}, ("fallbacks", "report"),
                      tmp_path / "m" / "neuron", tmp_path / sweep.RECORDS / "m" / "neuron")
    cell.run_dir.mkdir(parents=True)
    (cell.run_dir / "01_fallbacks.ipynb").write_text("{}")
    record = {"status": "failed", "attempts": 2, "error": "stage fallbacks failed <b>", "seconds": 3.0,
              "notebook": str(cell.run_dir / "01_fallbacks.ipynb")}
    outcome = sweep.SweepOutcome(tmp_path, [cell], [record], {"name": "ray", "ray_version": "x", "address": "local",
                                                              "cluster_cpus": 2, "cpus_per_task": 1,
                                                              "memory_per_task_gib": 3, "start_seconds": 1},
                                 wall_seconds=5.0)
    html = outcome.save().read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "href='m/neuron/01_fallbacks.ipynb'" in html and "failed &lt;b&gt;" in html


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep on a local Ray: two good models and one whose stage fails (retried once).

    The failing model comes first: its two attempts hold one worker while the good models run one after the other
    on the other, two rounds of runs where it last would take three. It runs as `portkit sweep` in a new
    interpreter: ray.init forks its processes (preexec_fn), and this
    test process may hold JAX's threads, started by earlier tests (forking those can deadlock)."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    done = subprocess.run([sys.executable, "-m", "portkit.cli", "sweep", "--out", str(out),
                           *_models(BROKEN, *GOOD), *CHEAP], capture_output=True, text=True, cwd=ROOT, timeout=900)
    return out, done.returncode, done


@needs_ray
@pytest.mark.slow
def test_sweep_runs_every_model_and_writes_the_matrix(swept):
    out, code, done = swept
    assert code == 1 and "2 finished, 0 skipped, 1 failed" in done.stdout, done.stderr[-3000:]   # one run failed
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["schema"] == sweep.SCHEMA and saved["engine"]["address"] == "local"
    assert saved["stages"] == ["fallbacks"] and saved["counts"] == {"finished": 2, "skipped": 0, "failed": 1}
    cells = {c["model_tag"]: c for c in saved["cells"]}
    tiny, gru = cells["models.py-tiny_encoder"], cells["models.py-gru_model"]
    # stage 1 alone: no blocker for the tiny encoder, and the stages that could find one did not run
    assert (tiny["status"], tiny["verdict"], tiny["mode"], tiny["blockers"]) == ("finished", "not assessed", "emulated",
                                                                                  [])
    assert gru["verdict"] == "blocked" and any("GRU" in b or "recurrent" in b for b in gru["blockers"]), gru["blockers"]
    html = (out / "sweep.html").read_text()
    for c in (tiny, gru):
        assert c["report"] == f"{c['model_tag']}/neuron/report.html" and (out / c["report"]).exists()
        assert f"href='{c['report']}'" in html
        run_report = json.loads((out / c["run_dir"] / "report.json").read_text())
        assert run_report["targets"]["neuron"]["verdict"] == c["verdict"]
    assert "not assessed</span>" in html and "blocked</span>" in html and "Emulated:" in html


@needs_ray
@pytest.mark.slow
def test_failed_run_is_retried_once_and_reported_with_its_notebook(swept):
    out, _, _ = swept
    failed = next(c for c in json.loads((out / "sweep.json").read_text())["cells"] if c["status"] == "failed")
    assert failed["attempts"] == 2 and "fails on purpose" in failed["error"]
    assert failed["notebook"] == "models.py-broken_model/neuron/01_fallbacks.ipynb"
    executed = json.loads((out / failed["notebook"]).read_text())
    assert any(o.get("output_type") == "error" for c in executed["cells"] for o in c.get("outputs", []))
    assert failed["log"] == f"{sweep.RECORDS}/models.py-broken_model/neuron/{sweep.LOG_FILE}"
    log = (out / failed["log"]).read_text()
    assert "attempt 1 of 2" in log and "attempt 2 of 2" in log
    assert f"href='{failed['notebook']}'" in (out / "sweep.html").read_text()


@needs_ray
@pytest.mark.slow
def test_rerun_skips_finished_runs(swept, capsys, monkeypatch):
    out, _, _ = swept
    started = []   # the work a rerun does: none, no Ray task and no notebook

    def on_ray(ray, cells, *args):
        started.extend(cells)
        raise AssertionError("the rerun started Ray")
    monkeypatch.setattr(sweep, "_on_ray", on_ray)
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix == ".ipynb" or
               p.name in (sweep.LOG_FILE, sweep.CELL_FILE)}   # each run's notebook, log and record
    assert cli.main(["sweep", "--out", str(out), *_models(*GOOD), *CHEAP]) == 0
    saved = json.loads((out / "sweep.json").read_text())
    assert [c["status"] for c in saved["cells"]] == ["skipped", "skipped"]
    assert saved["engine"]["start_seconds"] is None and started == []   # nothing to run: Ray was not started
    assert [c["attempts"] for c in saved["cells"]] == [1, 1]            # the first sweep's, not a new one
    assert len(written) >= 6 and {p: p.stat().st_mtime_ns for p in written} == written   # nothing rewritten
    assert "(finished before)" in capsys.readouterr().out


@needs_ray
@pytest.mark.slow
def test_a_finished_run_with_other_inputs_is_not_skipped(swept):
    out, _, _ = swept
    cells = sweep.plan_sweep(GOOD[:1], ["neuron"], str(out), {"batch_size": 2, "seq_len": 16}, stages="fallbacks",
                             log=lambda line: None)
    assert sweep.is_finished(cells[0])
    assert not sweep.is_finished(replace(cells[0], parameters={"batch_size": 2, "seq_len": 32}))
    assert not sweep.is_finished(replace(cells[0], stages=("fallbacks", "compile", "report")))
