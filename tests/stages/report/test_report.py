"""Stage 5: the report holds every section, describes the machine that ran the stages (not the one building
the report), names every missing, corrupt or wrongly shaped stage result as a gap, and escapes every value."""
import contextlib
import html
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from portkit import cli
from portkit.corpora import corpus
from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
from portkit.models import registry
from portkit.stages.report.stage import DAMAGED, SCHEMA, build_report
from portkit.runfolder import results


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder with stage 1 for an LSTM model (a blocker on Neuron, work on TPU)."""
    out = tmp_path_factory.mktemp("run")
    m = registry.load("lstm")
    inputs, described = corpus.example_batch(m, corpus.load_corpus(), 2, 16)
    settings = RecordSettings(description=described)
    find_fallbacks(m, inputs, ["neuron", "tpu"], settings).save(out / "fallbacks.json")
    return out


def test_verdicts_and_checklist(run_dir):
    r = build_report(run_dir=run_dir)
    # stage 1 alone: its blocker decides neuron; tpu's stage 1 found only work, and the stages that could still
    # find a blocker did not run, so tpu is not assessed (never ready) and the reason names them
    assert r.verdicts() == {"neuron": "blocked", "tpu": "not assessed"}
    tpu = r.to_dict()["targets"]["tpu"]
    assert tpu["unassessed"] == ["compile", "buckets", "xla", "accuracy"] and tpu["based_on"] == ["fallbacks"]
    assert tpu["verdict_reason"].startswith("stage(s) compile, buckets, xla, accuracy did not assess tpu")
    neuron = r.to_dict()["targets"]["neuron"]
    assert neuron["mode"] == "emulated" and "fallbacks" in neuron["based_on"]
    kernels = neuron["checklist"]["kernels"]
    assert kernels[0]["op"] == "aten::_thnn_fused_lstm_cell" and kernels[0]["language"] == "NKI"
    assert kernels[0]["recorded_as"] == "aten::mkldnn_rnn_layer"
    assert any("recurrent in lstm" in x for x in neuron["checklist"]["rewrite"])
    assert neuron["checklist"]["measure_on_hardware"]
    assert r.to_dict()["schema"] == SCHEMA


def test_saved_files_are_self_contained(run_dir, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    r = build_report(run_dir=folder)
    html_path = r.save(folder)
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page and "https://" not in page
    assert "portkit environment" in page and "Emulated:" in page and "blocked" in page
    saved = json.loads((folder / "report.json").read_text())
    assert saved["targets"]["tpu"]["verdict"] == "not assessed"


def _copy(run_dir, tmp_path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    return folder


def _edit(path: Path, change) -> None:
    result = json.loads(path.read_text())
    change(result)
    path.write_text(json.dumps(result))


def _set(result, keys, value):
    """result[k1][k2]...[kn] = value"""
    for k in keys[:-1]:
        result = result[k]
    result[keys[-1]] = value


def test_stage_results_record_their_environment(run_dir):
    env = json.loads((run_dir / "fallbacks.json").read_text())["environment"]
    assert env["platform"] == platform.platform() and env["python"] == sys.version.split()[0]
    assert {n: t["mode"] for n, t in env["targets"].items()} == {"neuron": "emulated", "tpu": "emulated"}
    assert list(results.stamp({"target": "tpu"})["environment"]["targets"]) == ["tpu"]     # xla's per-target files
    assert results.stamp({"targets": {"made-up": {}}})["environment"]["targets"] == {}


FOREIGN = {"platform": "Linux-5.10.220-209.869.amzn2.aarch64-with-glibc2.26", "python": "3.10.14",
           "targets.neuron.mode": "native", "targets.neuron.reason": "torch-neuronx 2.9.0 with a neuron device",
           "targets.neuron.backend": "neuronx"}


def _foreign(result):
    for key, value in FOREIGN.items():
        _set(result["environment"], key.split("."), value)


def test_report_describes_the_machine_that_ran_the_stages(run_dir, tmp_path):
    """A run folder made on another machine (a Trainium host): the report shows its mode and platform."""
    folder = _copy(run_dir, tmp_path)
    _edit(folder / "fallbacks.json", _foreign)
    r = build_report(run_dir=folder)
    assert {n: t.mode for n, t in r.targets.items()} == {"neuron": "native", "tpu": "emulated"}
    assert not r.targets["neuron"].measure_on_hardware and r.targets["tpu"].measure_on_hardware
    assert r.environment["platform"] == FOREIGN["platform"] and r.environment["python"] == "3.10.14"
    assert r.environment_source == "recorded at run time by fallbacks.json"
    assert not [g for g in r.gaps if "environment" in g], r.gaps
    page = html.unescape(r.html())
    assert FOREIGN["platform"] in page and platform.platform() not in page
    assert "target neuron: NATIVE (torch-neuronx 2.9.0 with a neuron device); compile backend neuronx" in page
    assert "<b>Emulated:</b> tpu ran on the CPU" in page
    saved = r.to_dict()
    assert saved["targets"]["neuron"]["mode"] == "native" and saved["environment"]["platform"] == FOREIGN["platform"]


def test_stages_that_disagree_on_the_environment_are_a_gap(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)
    fallbacks_result = json.loads((folder / "fallbacks.json").read_text())
    compile_result = {"stage": "compile", "model": fallbacks_result["model"], "summary": "from another machine",
                      "targets": {"neuron": {"findings": []}, "tpu": {"findings": []}},
                      "environment": fallbacks_result["environment"]}
    _foreign(compile_result)
    (folder / "compile.json").write_text(json.dumps(compile_result))
    gaps = build_report(run_dir=folder).gaps
    assert (f"stage results disagree on the environment: platform is {platform.platform()!r} in fallbacks.json "
            f"but {FOREIGN['platform']!r} in compile.json") in gaps, gaps
    assert ("stage results disagree on target neuron: mode is 'emulated' in fallbacks.json but 'native' in "
            "compile.json") in gaps, gaps


def test_old_run_folder_is_described_by_this_machine_and_says_so(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)
    _edit(folder / "fallbacks.json", lambda result: result.pop("environment"))
    r = build_report(run_dir=folder)
    assert r.environment_source == results.NOT_RECORDED == "environment not recorded; detected at report time"
    assert f"fallbacks.json: {results.NOT_RECORDED}" in r.gaps
    assert r.environment["platform"] == platform.platform() and r.targets["neuron"].mode == "emulated"
    assert results.NOT_RECORDED in r.html()


def test_html_escapes_every_value(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)

    def inject(result):
        result["model"]["name"] = "<script>alert('model')</script>"
        result["targets"]["neuron"]["findings"][0]["message"] = "<script>alert('finding')</script>"
    _edit(folder / "fallbacks.json", inject)
    build_report(run_dir=folder).save(folder)
    page = (folder / "report.html").read_text()
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&#39;model&#39;)&lt;/script&gt;") == 2      # title and heading
    assert "&lt;script&gt;alert(&#39;finding&#39;)&lt;/script&gt;" in page
    assert json.loads((folder / "report.json").read_text())["model"]["name"] == "<script>alert('model')</script>"


def _ops_share_text(result):
    for op in result["targets"]["neuron"]["ops"]:
        op["time_share"] = "lots"


# (what is wrong, how to make it, the gap named, whether the tpu half of fallbacks.json is still read)
DAMAGE = [
    ("truncated", lambda f: f.write_text(f.read_text()[:500]), "fallbacks.json cannot be read (JSONDecodeError", False),
    ("not UTF-8", lambda f: f.write_bytes(b"\xff\xfe{"), "fallbacks.json cannot be read (UnicodeDecodeError", False),
    ("a folder", lambda f: (f.unlink(), f.mkdir()), "fallbacks.json cannot be read (IsADirectoryError", False),
    ("a JSON list", lambda f: f.write_text("[1, 2]"), "fallbacks.json holds a JSON list, not an object", False),
    ("no targets", lambda f: f.write_text('{"stage": "fallbacks"}'),
     'fallbacks.json has no per-target results (no "targets" object)', False),
    ("target not an object", lambda f: _edit(f, lambda r: _set(r, ["targets", "neuron"], 3)),
     "fallbacks.json: targets.neuron is 3, not an object", True),
    ("counts a list", lambda f: _edit(f, lambda r: _set(r, ["targets", "neuron", "counts"], [])),
     "fallbacks.json: targets.neuron.counts is [], not an object; rerun stage fallbacks", True),
    ("finding not an object", lambda f: _edit(f, lambda r: _set(r, ["targets", "neuron", "findings"], ["x"])),
     "fallbacks.json: targets.neuron.findings.0 is 'x', not an object", True),
    ("op share not a number", lambda f: _edit(f, _ops_share_text),
     "fallbacks.json: targets.neuron.ops.0.time_share is 'lots', not a number", True),
    ("environment a list", lambda f: _edit(f, lambda r: _set(r, ["environment"], ["x"])),
     "fallbacks.json: environment is a list, not an object", None),
    ("environment without targets", lambda f: _edit(f, lambda r: r["environment"].pop("targets")),
     "fallbacks.json: environment lacks targets", None),
    ("notebook not a notebook", lambda f: (f.parent / "01_fallbacks.ipynb").write_text("[]"),
     "01_fallbacks.ipynb cannot be read, its plots are left out (AttributeError", None),
    ("other stages missing", lambda f: None, "compile.json is missing", None),
]


@pytest.mark.parametrize("damage,expected,tpu_read", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_run_folder_is_reported_with_its_gaps(run_dir, tmp_path, capsys, damage, expected, tpu_read):
    folder = _copy(run_dir, tmp_path)
    damage(folder / "fallbacks.json")
    code = cli.main(["report", str(folder)])
    captured = capsys.readouterr()
    damaged = json.loads((folder / "report.json").read_text())["stages"]["fallbacks"]["status"] in DAMAGED
    # a damaged result exits 1 naming it (the report still written); missing stages and notebooks' plots do not
    assert code == (1 if damaged else 0)
    assert captured.err.strip().splitlines() == ([f"portkit: damaged result(s) in {folder}: fallbacks.json (the "
                                                  "report names the gap); rerun their stages"] if damaged else [])
    if tpu_read is not None:   # the result file itself is damaged
        assert damaged
    gap_lines = [line for line in captured.out.splitlines() if line.startswith("gap: ")]
    assert any(expected in line for line in gap_lines), captured.out
    assert "gap: compile.json is missing" in gap_lines and len(gap_lines) == len(set(gap_lines))
    saved = json.loads((folder / "report.json").read_text())
    assert any(expected in gap for gap in saved["gaps"])
    assert expected in html.unescape((folder / "report.html").read_text())
    verdicts = {n: t["verdict"] for n, t in saved["targets"].items()}
    if tpu_read is False:       # the whole file is unreadable: no target to report on
        assert verdicts == {} and saved["stages"]["fallbacks"]["status"] in ("unreadable", "incomplete")
    elif tpu_read:              # one target's half is unreadable: the other is still assessed
        assert verdicts == {"neuron": "not assessed", "tpu": "not assessed"}
        assert saved["stages"]["fallbacks"]["status"] == "incomplete"
    else:
        assert verdicts == {"neuron": "blocked", "tpu": "not assessed"}


def test_folder_without_stage_results_is_bad_input(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a run")
    assert cli.main(["report", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"invalid run folder '{tmp_path}': it holds no stage result (fallbacks.json" in lines[0]
    assert not (tmp_path / "report.json").exists() and not (tmp_path / "report.html").exists()


def test_cli_report_from_any_folder(run_dir, tmp_path):
    portkit = Path(sys.executable).parent / "portkit"
    done = subprocess.run([str(portkit), "report", str(run_dir)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("verdict ")]
    assert verdicts[0].startswith("verdict neuron (emulated): BLOCKED")
    done = subprocess.run([str(portkit), "report", str(tmp_path / "nope")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "invalid run folder" in done.stderr


@pytest.mark.slow
def test_a_refused_compile_runs_the_workbook_to_a_report_with_the_blocker(tmp_path):
    """The target's compiler refuses the model: the accuracy stage judges it in eager emulation, says so,
    and the run goes on to a report that shows the refusal as a blocker."""
    from conftest import fixture_model
    from portkit.targets import specs
    out = tmp_path / "run"
    rc = cli.main(["run", "--model", fixture_model("dynamic_after_break_model"), "--target", "tpu", "--out", str(out),
                   "--stages", "accuracy,report", "--no-progress", "-p", "batch_size", "2", "-p", "seq_len", "16",
                   "-p", "default_buckets", "[16]"])
    assert rc == 0
    accuracy = json.loads((out / "accuracy.json").read_text())["targets"]["tpu"]
    assert accuracy["target_side"].startswith("eager emulation (compiled path refused")
    tpu = json.loads((out / "report.json").read_text())["targets"]["tpu"]
    assert tpu["verdict"] == "blocked"
    blocker = tpu["findings"][0]
    assert (blocker["stage"], blocker["severity"], blocker["kind"]) == ("accuracy", "blocker", "compile_refused")
    assert specs.get("tpu").dynamic_shape_error in blocker["message"] and "models.py:" in blocker["message"]
    assert tpu["metrics"]["accuracy"]["judged on"] == accuracy["target_side"]
    page = (out / "report.html").read_text()
    assert "refuses the compiled model" in page and "compiled path refused" in page


@pytest.mark.skipif(not __import__("portkit.core.availability").core.availability.xla_tpu_compile_available(),
                    reason="needs jax, jaxlib, libtpu and torchax (pip install 'portkit[xla]')")
def test_an_abstract_models_real_size_check_and_capacity_are_in_the_report(tmp_path):
    from portkit.runfolder import layout
    from portkit.stages.xla.stage import Options, load, run_stage
    out = tmp_path / "run"
    out.mkdir()
    for stage in layout.STAGES:       # what `portkit run --model tiny-llama` leaves of the stages with values
        with pytest.raises(results.StageSkipped) if stage.needs_weights else contextlib.nullcontext():
            results.skip_if_abstract("tiny-llama", out, stage.name, ["neuron", "tpu"])
    m = load("tiny-llama")           # the same shapes as tests/stages/xla/test_scale.py: the verdict cache serves them
    run_stage(m, ["neuron", "tpu"], Options.of(
        {"scale_topologies": ["v5e:2x2", "v5e:1x1"], "scale_batch": 4, "scale_seq": 16}),
        run_dir=out).save(out / "xla.json")
    r = build_report(run_dir=out)
    saved = r.to_dict()
    assert saved["gaps"] == [] and saved["model"]["abstract"] is True
    assert {n: s["status"] for n, s in saved["stages"].items()} == {
        "fallbacks": "skipped", "compile": "skipped", "buckets": "skipped", "xla": "ok", "accuracy": "skipped"}
    tpu, neuron = saved["targets"]["tpu"], saved["targets"]["neuron"]
    assert tpu["verdict"] == "ready with work" and tpu["first"][0]["kind"] == "abstract_model"
    assert tpu["metrics"]["scale"]["smallest topology that fits"].startswith("v5e:1x1 (")
    assert tpu["metrics"]["scale"]["largest batch that fits HBM, seq 16"] == (
        "1024+ (the search's limit) on v5e:1x1 (1 compiles)")
    assert [row["topology"] for row in tpu["details"]["scale topologies"]] == ["v5e:1x1"]
    capacity = neuron["details"]["capacity (estimate, not measured)"]
    assert [row["chip"] for row in capacity] == ["inf2", "trn1", "trn2"]
    assert neuron["metrics"]["scale"]["model copies per instance (estimate, not measured)"] == (
        "inf2.48xlarge 24, trn1.32xlarge 32, trn2.48xlarge 64")
    page = r.html()
    assert "scale topologies" in page and "capacity (estimate, not measured)" in page and "trn2.48xlarge" in page
    assert "No op falls back" not in page and "Ops not checked: stage 1 (fallbacks) has no result" in page


def _storm_finding() -> dict:
    return {"stage": "compile", "kind": "recompile_storm", "severity": "work", "resolved_by": "",
            "message": "36 compiles for 100 requests of varying length, 49 s compiling on tpu", "consequence": "work"}


def _bucketed(chosen: dict, replay: list[dict]):
    """A target's typed part of buckets.json holding `chosen` and `replay`, read as the report reads it."""
    from portkit.runfolder import buckets_result, reading
    node = reading.Node({"targets": {"tpu": {"chosen": chosen, "replay": replay}}}, Path("buckets.json"), "buckets")
    return buckets_result.Target.from_dict(node.obj("targets").obj("tpu"))


def test_a_storm_the_bucket_plan_resolves_is_shown_resolved_and_one_it_does_not_stays_work():
    from portkit.stages.report import sections
    chosen = {"planner": "auto", "boundaries": [17, 35, 512]}
    replay = [{"plan": None, "compiles": 55, "compiles_after_warmup": 0, "requests": 100},
              {"plan": dict(chosen), "compiles": 3, "compiles_after_warmup": 0, "requests": 100}]
    storm = _storm_finding()
    sections.resolve_storm([storm], _bucketed(chosen, replay))
    assert storm["severity"] == "info" and storm["consequence"].startswith("resolved")
    assert storm["resolved_by"] == ("stage 3's plan auto [17, 35, 512]: 3 compiles in warm-up, 0 after "
                                    "(its replay of 100 requests)")
    assert storm["message"].endswith("; resolved by " + storm["resolved_by"]
                                     + "; serve it with `portkit export RUN --to pytorch|vllm|nxdi`")
    late = _storm_finding()
    replay[1] = {**replay[1], "compiles": 5, "compiles_after_warmup": 2}
    sections.resolve_storm([late], _bucketed(chosen, replay))
    assert late["severity"] == "work" and not late["resolved_by"]
    assert "not resolved by stage 3's plan auto [17, 35, 512]: 3 compiles in warm-up, 2 after" in late["message"]
    alone = _storm_finding()
    sections.resolve_storm([alone], None)        # stage 3 skipped or missing: stage 2's finding as it is
    assert alone == _storm_finding()


def _log(folder: Path, **statuses) -> None:
    (folder / "run.json").write_text(json.dumps({"stages": {name: {"status": status, "seconds": 1.0, "error": "",
                                                                    "notebook": f"{name}.ipynb"}
                                                             for name, status in statuses.items()}}))


def test_a_result_the_run_log_records_as_ok_and_is_gone_is_damage_not_a_stage_never_run(run_dir, tmp_path, capsys):
    """A result the run log (run.json) records as ok that is not there went after the run: damage, exit 1, the file
    named; a result of a stage the log does not record is missing, as before (exit 0)."""
    folder = _copy(run_dir, tmp_path)
    _log(folder, fallbacks="ok", compile="ok")
    assert cli.main(["report", str(folder)]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [f"portkit: damaged result(s) in {folder}: compile.json (the report "
                                                 "names the gap); rerun their stages"]
    gaps = json.loads((folder / "report.json").read_text())["gaps"]
    assert any(g.startswith("compile.json is missing, but run.json records stage compile as ok") for g in gaps)
    assert "buckets.json is missing" in gaps        # never run: a gap, not damage
    _log(folder, fallbacks="ok")
    assert cli.main(["report", str(folder)]) == 0
    assert "compile.json is missing" in json.loads((folder / "report.json").read_text())["gaps"]


@pytest.mark.parametrize("text, words", [("{not json", "run.json cannot be read (JSONDecodeError"),
                                         ("[1]", "run.json holds a list"),
                                         ('{"stages": {"compile": {"status": 3}}}', "stages.compile.status is 3")])
def test_a_damaged_run_log_is_named_and_exits_1(run_dir, tmp_path, capsys, text, words):
    """A run log (run.json) that cannot be read is damage: the report names it as a gap and exits 1."""
    folder = _copy(run_dir, tmp_path)
    (folder / "run.json").write_text(text)
    assert cli.main(["report", str(folder)]) == 1
    captured = capsys.readouterr()
    assert f"damaged result(s) in {folder}: run.json" in captured.err
    gaps = json.loads((folder / "report.json").read_text())["gaps"]
    assert any(words in g and "portkit run" in g for g in gaps), gaps


@pytest.mark.parametrize("damage", ["graph_breaks a list", "storm a list"])
def test_an_unreadable_stage_leaves_the_target_not_assessed_and_keeps_the_findings_read_elsewhere(
        run_dir, tmp_path, damage):
    """One stage's damaged file (compile.json, whole or for one target) makes the target not assessed, with the
    stage in "unassessed"; the work item stage 1 found (intact) stays, and the reason names it: never "no work"."""
    folder = _copy(run_dir, tmp_path)
    compiled = {"stage": "compile", "summary": "s", "graph_breaks": {"breaks": [], "fullgraph": {"ok": True}},
                "targets": {"tpu": {"summary": "tpu", "findings": [], "storm": {"requests": [[1, 8]]}}}}
    if damage == "graph_breaks a list":
        compiled["graph_breaks"] = [1]
    else:
        compiled["targets"]["tpu"]["storm"] = []
    (folder / "compile.json").write_text(json.dumps(compiled))
    saved = build_report(run_dir=folder).to_dict()
    assert saved["stages"]["compile"]["status"] == "incomplete"
    tpu = saved["targets"]["tpu"]
    assert tpu["verdict"] == "not assessed" and "compile" in tpu["unassessed"] and tpu["based_on"] == ["fallbacks"]
    work = [f for f in tpu["findings"] if f["severity"] == "work" and f["stage"] == "fallbacks"]
    assert work and "no work found" not in tpu["verdict_reason"]
    assert f"{len(work)} item(s) of work, first:" in tpu["verdict_reason"]
    assert any("compile.json: " in g and ("graph_breaks is [1]" in g or "targets.tpu.storm is []" in g)
               for g in saved["gaps"])


def test_a_finding_reads_in_plain_words_with_its_detail_behind_a_disclosure(run_dir):
    """A finding's headline drops the ATen op names and the cut source line; its detail (ops, place, the whole
    source line marked where the statement goes on, torch.compile's reading) is behind a <details> disclosure."""
    from portkit.stages.report import wording
    where = "transformers/sdpa_attention.py:182 in forward: out = torch.nn.functional.scaled_dot_product_attention("
    f = {"message": f"attention mask in layer.* (6 modules): attn_mask (float32) (aten::_sdpa_for_cpu) at {where}; "
         "6 calls", "where": where, "compiled": "persists", "compiled_detail": "in the compiled graph",
         "severity": "work", "eager": "work", "stage": "fallbacks", "notebook": "01_fallbacks.ipynb"}
    assert wording.headline(f) == "attention mask in layer.* (6 modules): attn_mask (float32); 6 calls"
    detail = dict(wording.detail(f))
    assert detail["ops"] == "aten::_sdpa_for_cpu" and detail["where"] == "transformers/sdpa_attention.py:182 in forward"
    assert detail["source line"].endswith("(the statement continues on the next lines)")
    assert detail["under torch.compile"] == "persists: in the compiled graph"
    page = build_report(run_dir=run_dir).html()
    assert page.count("<summary>technical detail</summary>") == sum(
        len(t.findings) for t in build_report(run_dir=run_dir).targets.values())
    assert "<h2>What to fix first</h2>" in page


def test_an_emulated_float32_error_of_zero_says_it_compares_nothing():
    """In emulation at float32 both sides run the same CPU kernels: a max abs error of 0 and an error equal to the
    GPU's say so, instead of a figure that reads like a hardware result; a native 0 stays a figure."""
    from portkit.stages.report import sections
    main = ("embedding", {"max_abs": 0.0})
    assert sections._max_abs(main, "emulated").startswith("0: emulated at float32, the target side ran the same CPU")
    assert sections._max_abs(main, "native") == "0"
    assert sections._max_abs(("embedding", {"max_abs": 8.6e-4}), "emulated") == "0.00086"
    same = {"gpu_numerics": "fp32", "truth": "the float64 reference", "gpu_error": 5e-7, "target_error": 5e-7,
            "ratio": 1.0, "factor": 2.0, "within": True}
    assert "compares nothing" in sections._versus_gpu(same, "emulated") and "1x" not in sections._versus_gpu(
        same, "emulated")
    assert sections._versus_gpu(same, "native").startswith("1x the error of GPU 'fp32'")
    # the compiled graph sums in another order than the eager one: not the same error, still nothing about hardware
    reordered = {**same, "target_error": 5.15e-7, "ratio": 1.03, "float32_on_cpu": True}
    assert "nothing about the target's hardware" in sections._versus_gpu(reordered, "emulated")
    assert "nothing about" not in sections._versus_gpu({**reordered, "float32_on_cpu": False}, "emulated")


def test_figures_read_without_float_noise():
    """Shares against a budget keep the digit that decides them and no float noise; other floats 4 significant
    figures, in the report's tables and the task checks."""
    from portkit.core import figures
    from portkit.stages.report import sections
    assert figures.share(0.9999999999999998, 0.999) == "1.0000" and figures.share(0.99995, 0.999) == "0.99995"
    assert figures.sig(0.9944999999999999) == "0.9945" and figures.sig(3) == 3 and figures.sig(True) is True
    check = {"value": 0.997, "ci95": [0.9944999999999999, 0.9990000000000001], "n": 400, "unit": "texts",
             "budget": "budget >= 0.9", "bound": 0.9, "decision": "pass"}
    assert sections._accuracy_check(check) == "0.997 [0.994, 0.999] on 400 texts (budget >= 0.9): within"
