"""portkit/deploy: `portkit export` (the bucket plan as a serving stack's configuration, the generated PyTorch wrapper
run on this CPU with the emulated backend) and `portkit check` (regressions built by editing copies of a run's JSON)."""
import importlib.util
import json
import shutil
import sys
import xml.etree.ElementTree as ElementTree

import pytest
import torch

from conftest import ROOT
from portkit import cli
from portkit.deploy import export, gate
from portkit.planning import cost
from portkit.runfolder import results
from portkit.runfolder import layout


@pytest.fixture(scope="module")
def run_dir(tiny_run):
    assert all((tiny_run / name).exists() for name in ("buckets.json", "accuracy.json", "xla.json", "report.json"))
    return tiny_run


@pytest.fixture
def copies(run_dir, tmp_path):
    """(new, baseline): two copies of the run; a test edits the new one's JSON."""
    new, old = tmp_path / "new", tmp_path / "old"
    shutil.copytree(run_dir, new)
    shutil.copytree(run_dir, old)
    return new, old


def _edit(folder, name, change):
    path = folder / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- export
def test_pytorch_wrapper_imports_and_serves_every_bucket_without_a_compile(run_dir, tmp_path):
    written, _ = export.export(run_dir, "pytorch", tmp_path / "out")
    assert {w.target for w in written} == {"neuron", "tpu"}
    path = next(w.path for w in written if w.target == "neuron")
    plan = json.loads((run_dir / "buckets.json").read_text())["targets"]["neuron"]["chosen"]
    module = _load(path)
    assert module.BACKEND == "portkit_neuron" and module.BUCKETS == plan["boundaries"]
    assert module.WARMUP == [(b, s) for b in plan["batch_sizes"] for s in plan["boundaries"]]
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    try:
        import models
    finally:
        sys.path.remove(str(ROOT / "tests" / "fixtures"))
    model = models.tiny_encoder()
    server = module.Server(model)
    server.warm_up()
    for length in (3, plan["boundaries"][-1] + 20):   # a short request and one truncated to the largest bucket
        ids = torch.randint(1, 100, (1, length))
        mask = torch.ones(1, length, dtype=torch.int64)
        out = server(input_ids=ids, attention_mask=mask)   # fail_on_recompile: a compile here raises
        kept = min(length, plan["boundaries"][-1])
        with torch.no_grad():
            ref = model(input_ids=ids[:, :kept], attention_mask=mask[:, :kept])
        assert out["hidden"].shape == ref["hidden"].shape
        torch.testing.assert_close(out["hidden"], ref["hidden"], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="largest batch bucket"):
        server(input_ids=torch.ones(9, 4, dtype=torch.int64), attention_mask=torch.ones(9, 4, dtype=torch.int64))
    assert "torch._dynamo.mark_static" in path.read_text()


def test_vllm_export_is_what_vllm_reads_ready_to_paste(run_dir, tmp_path):
    """vLLM's export is a `vllm serve` line that a shell parses back to the intended argv (shlex), the same as
    Python's LLM(...) (ast), and an env file of KEY=value strings; portkit's provenance is a file of its own. Every
    key is one vLLM documents; an embedding model is caveated with vLLM's pooling-model page."""
    import ast
    import shlex
    written, skipped = export.export(run_dir, "vllm", tmp_path / "vllm")
    assert {w.target for w in written} == {"neuron", "tpu"} and not skipped
    boundaries = json.loads((run_dir / "buckets.json").read_text())["targets"]
    for item in written:
        names = [f.name for f in item.files]
        assert names == [f"vllm_{item.target}.{ext}" for ext in ("sh", "py", "env", "portkit.json")]
        meta = json.loads(item.files[3].read_text())
        assert meta["lost"] == list(item.lost) and meta["warmup"] and meta["model"] == "tiny_encoder"
        argv = shlex.split(item.path.read_text().splitlines()[-1])
        assert argv[:3] == ["vllm", "serve", "tiny_encoder"]
        flags = dict(zip(argv[3::2], argv[4::2]))
        engine = {k[2:].replace("-", "_"): v for k, v in flags.items()}
        assert set(engine) <= set(export.DOCUMENTED["vllm.engine_args"].keys)
        top = boundaries[item.target]["chosen"]["boundaries"][-1]
        assert flags["--max-model-len"] == str(top)
        call = next(n for n in ast.walk(ast.parse(item.files[1].read_text())) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", "") == "LLM")
        python = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        assert python["model"] == "tiny_encoder" and python["max_model_len"] == top
        env = dict(line.split("=", 1) for line in item.files[2].read_text().splitlines() if not line.startswith("#"))
        assert all(isinstance(v, str) for v in env.values())
        assert set(env) <= set(export.DOCUMENTED["vllm.env.tpu"].keys)
        if item.target == "neuron":
            neuron = json.loads(flags["--additional-config"])["neuron_config"]
            assert neuron == python["additional_config"]["neuron_config"]
            assert set(neuron) <= set(export.DOCUMENTED["vllm.additional_config.neuron_config"].keys)
            assert neuron["num_batched_tokens_buckets"][-1] == int(flags["--max-num-batched-tokens"])
            assert not env
        else:
            assert env["VLLM_TPU_BUCKET_PADDING_GAP"].isdigit()
            assert any("cannot list buckets" in line for line in item.lost)
        assert any(export.VLLM_POOLING in line for line in item.lost)     # an embedding model: vLLM's pooling


def test_nxdi_export_is_a_neuron_config_call_for_a_decoder_and_refused_for_an_encoder(run_dir, copies, tmp_path):
    """NxD Inference serves the decoder LLMs its model reference lists: the tiny encoder's export is refused with
    that page; a causal LM's is NeuronConfig(...) as Python a user pastes (ast), with documented keys only."""
    import ast
    written, skipped = export.export(run_dir, "nxdi", tmp_path / "nxdi")
    assert written == [] and any("Neuron only" in s for s in skipped)
    assert any(s.startswith("neuron: NxD Inference serves decoder LLMs") and export.NXDI_MODELS.url in s
               for s in skipped)
    new, _ = copies
    for name in ("buckets.json", "buckets.plan.json"):
        if (new / name).exists():
            _edit(new, name, lambda d: d.get("model", {}).update(kind="causal-lm"))
    written, _ = export.export(new, "nxdi", tmp_path / "nxdi-lm")
    assert [w.target for w in written] == ["neuron"]
    tree = ast.parse(written[0].path.read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "NeuronConfig")
    config = {k.arg: ast.unparse(k.value) if k.arg == "torch_dtype" else ast.literal_eval(k.value)
              for k in call.keywords}
    assert set(config) <= set(export.DOCUMENTED["nxdi.neuron_config"].keys)
    assert config["torch_dtype"].startswith("torch.") and config["enable_bucketing"] is True
    boundaries = json.loads((new / "buckets.json").read_text())["targets"]["neuron"]["chosen"]["boundaries"]
    assert config["context_encoding_buckets"] == boundaries
    assert json.loads(written[0].files[1].read_text())["lost"] == list(written[0].lost)
    with pytest.raises(Exception, match="not documented"):
        export.checked_keys("nxdi.neuron_config", {"made_up_key": 1})


def test_the_pytorch_wrapper_cuts_each_output_along_its_own_axes(run_dir, tmp_path):
    """serve_*.py unpads by each output's own axes (found by two eager runs, counted by its declared stride): a
    pooled output as wide as the largest bucket is never cut, the hidden states are; the file says Server wants
    the model as portkit loads it."""
    written, _ = export.export(run_dir, "pytorch", tmp_path / "out", targets=["tpu"])
    module = _load(written[0].path)
    assert "Server wants the model as portkit loads it" in written[0].path.read_text()
    top = module.BUCKETS[-1]
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    try:
        import models
    finally:
        sys.path.remove(str(ROOT / "tests" / "fixtures"))

    class Wide(torch.nn.Module):     # a pooled output whose width is the largest bucket
        def __init__(self):
            super().__init__()
            self.inner = models.tiny_encoder()

        def forward(self, input_ids, attention_mask):
            out = self.inner(input_ids, attention_mask)
            return {**out, "wide": out["pooled"].repeat(1, -(-top // 16))[:, :top]}
    server = module.Server(Wide())
    server.warm_up()
    length = top - 1                 # padded to the largest bucket: the old rule cut any dim equal to it
    out = server(input_ids=torch.randint(1, 100, (1, length)), attention_mask=torch.ones(1, length, dtype=torch.int64))
    assert out["wide"].shape == (1, top) and out["hidden"].shape[:2] == (1, length)
    assert out["pooled"].shape == (1, 16)


def test_tpu_ladder_follows_the_documented_gap_rule():
    assert export.tpu_ladder(8, 40) == [16, 24, 32, 40]     # vllm/envs.py: "8, ... [16, 24, 32, ...]"
    assert export.tpu_ladder(0, 100) == [16, 32, 64, 128]


def test_export_bad_stack_is_one_line_exit_2(run_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(run_dir), "--to", "triton"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pytorch" in err and "vllm" in err and "nxdi" in err


def test_export_command_with_prices_prints_an_estimate(run_dir, tmp_path, capsys):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"tpu": {"usd_per_chip_hour": 2.0, "source": "test page", "date": "2026-01-01"}}))
    args = ["export", str(run_dir), "--to", "vllm", "--out", str(tmp_path / "o"), "--prices", str(prices)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "lost:" in out and "estimate, not measured" in out and "per million" in out
    found = cost.estimate(results.run_cost_figures(run_dir), "tpu", json.loads(prices.read_text()))
    usd = found["usd_per_million_requests"]
    # the range never extends past the bound it claims: every figure costs at least the roofline's
    assert usd["bound"] <= usd["low"] <= usd["estimate"] <= usd["high"]
    assert f"${usd['low']:.3g} to ${usd['high']:.3g}" in out and "verdict: tpu: the estimate favours" in out
    prices.write_text("{}" + "x")
    assert cli.main(["export", str(run_dir), "--to", "vllm", "--prices", str(prices)]) == 2
    prices.write_text(json.dumps({"v5e": {"usd_per_chip_hour": "cheap"}}))
    assert cli.main(["export", str(run_dir), "--to", "vllm", "--prices", str(prices)]) == 2
    assert "v5e" in capsys.readouterr().err


def test_cost_compares_each_target_with_named_gpus_from_sourced_prices(run_dir):
    found = cost.comparison(results.run_cost_figures(run_dir), ["neuron", "tpu"])
    assert set(found["gpus"]) == set(cost.GPUS) and found["label"] == "estimate, not measured"
    for side in [*found["targets"].values(), *found["gpus"].values()]:
        assert side["chip_seconds_per_million_requests"] > 0 and side["label"] == "estimate, not measured"
        if "usd_per_million_requests" in side:        # every price names its page and its date
            assert side["price"]["source"].startswith("https://") and side["price"]["date"]
    neuron = found["targets"]["neuron"]
    assert neuron["chip"] == "trn2"                     # TorchNeuron runs on Trn2/Trn3 only, never trn1
    assert "no price" in found["gpus"]["H200"]["problem"]                    # no source found: said, not invented
    assert set(found["verdicts"]) == {"neuron", "tpu"}
    # a user's price for a chip replaces the table's, and instance prices divide by the chips they hold
    mine = cost.comparison(results.run_cost_figures(run_dir), ["neuron"], {
        "trn2": {"usd_per_instance_hour": 16.0, "chips_per_instance": 16, "source": "our contract",
                 "date": "2026-12-01"}})
    usd = mine["targets"]["neuron"]["usd_per_million_requests"]["bound"]
    assert usd == pytest.approx(neuron["chip_seconds_per_million_requests"] / 3600 * 1.0)
    assert mine["targets"]["neuron"]["price"]["supplied_by"] == "the user (--prices)"


def test_every_price_names_its_page_and_date():
    from portkit.targets import capacity
    table = json.loads(cost.PRICES.read_text())
    assert "_provenance" in table
    for chip, entry in cost.price_table().items():
        assert entry["source"].startswith("https://") and entry["as_of"], chip
        assert chip in capacity.chips(), chip                 # a price for a chip whose peak portkit knows
    assert set(cost.GPUS) <= set(capacity.chips("gpu"))


def test_report_json_has_a_verdict_per_target_numbers_and_the_cost(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdicts"] == {n: t["verdict"] for n, t in report["targets"].items()}
    numbers = report["targets"]["tpu"]["numbers"]
    assert isinstance(numbers["compiles"], int) and isinstance(numbers["hbm_bytes"], int)
    assert all(isinstance(c["value"], float) for c in numbers["task_checks"].values())
    assert set(report["cost"]["targets"]) == set(report["targets"]) and report["cost"]["assumptions"]
    html = (run_dir / "report.html").read_text()
    assert 'id="cost"' in html and "estimate, not measured" in html and 'class="cost-plot"' in html
    # the report's cost section states each target's verdict and the calibrated range export prints
    verdicts = report["cost"]["verdicts"]
    assert set(verdicts) == set(report["targets"]) and "calibrated range" in html
    banner = html.split("<h2>Verdicts</h2>")[0]                     # read before anything else, never "savings"
    assert "savings" not in banner and all(f"the estimate favours {v['favours']}" in banner for v in verdicts.values())
    for name, verdict in verdicts.items():
        assert verdict["favours"] in ("moving", "staying") and verdict["break_even_usd_per_chip_hour"] > 0
        assert html.count(f"the estimate favours {verdict['favours']}") >= 1
        usd = report["cost"]["targets"][name]["usd_per_million_requests"]
        found = cost.estimate(results.run_cost_figures(run_dir), name)
        assert f"${usd['low']:.3g} to ${usd['high']:.3g}" in cost.line(found)


# ---------------------------------------------------------------- check
def test_identical_runs_pass_and_junit_is_written(copies, tmp_path, capsys):
    new, old = copies
    junit = tmp_path / "check.xml"
    assert cli.main(["check", str(new), "--baseline", str(old), "--junit", str(junit)]) == 0
    out = capsys.readouterr().out
    assert "0 failed -> PASS" in out and len(out.splitlines()) <= 24
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) >= 8


def _worse_verdict(report):
    report["targets"]["tpu"]["verdict"] = "blocked"


def _new_blocker(report):
    report["targets"]["neuron"]["findings"].append({"stage": "fallbacks", "severity": "blocker", "kind": "unsupported",
                                                    "message": "aten::foo cannot run on neuron"})


def _metric_crossed(accuracy):
    accuracy["targets"]["tpu"]["task"]["checks"][0]["passed"] = False


def _more_compiles(buckets):
    buckets["targets"]["neuron"]["compiles_after_warmup"] += 2


def _more_hbm(xla):
    for shape in xla["targets"]["tpu"]["shapes"]:
        if shape.get("memory"):
            shape["memory"]["total"] += 1


@pytest.mark.parametrize("name, change, failing", [
    ("report.json", _worse_verdict, "tpu     verdict"),
    ("report.json", _new_blocker, "neuron  new blockers"),
    ("accuracy.json", _metric_crossed, "tpu     task metric"),
    ("buckets.json", _more_compiles, "neuron  compiles after warm-up"),
    ("xla.json", _more_hbm, "tpu     HBM need"),
])
def test_each_regression_fails_the_gate(copies, tmp_path, capsys, name, change, failing):
    new, old = copies
    _edit(new, name, change)
    junit = tmp_path / "check.xml"
    assert cli.main(["check", str(new), "--baseline", str(old), "--junit", str(junit)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {failing}" in out, out
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1"
    assert not list(tmp_path.glob("*.partial*")) and not [p for p in tmp_path.iterdir() if p.name != "check.xml"
                                                          and p.name not in ("new", "old")]


def test_a_metric_that_moved_below_the_baselines_interval_fails_though_within_budget(copies, capsys):
    new, old = copies
    check = json.loads((old / "accuracy.json").read_text())["targets"]["tpu"]["task"]["checks"][0]
    low, high = check["ci95"]

    def moved(accuracy):     # still passing its budget, but below what the baseline's sample allows
        found = accuracy["targets"]["tpu"]["task"]["checks"][0]
        found["value"] = low - max((high - low), 1e-9)
    _edit(new, "accuracy.json", moved)
    assert cli.main(["check", str(new), "--baseline", str(old)]) == 1
    out = capsys.readouterr().out
    assert "FAIL tpu     task metric" in out and "95% interval" in out


def test_a_task_metric_below_its_budget_says_so_and_an_interval_move_says_that(copies):
    """The gate names the reason that holds: a task metric out of its budget says 'below its budget (bound)', not
    the baseline's interval; one that moved below the interval within its budget names the interval."""
    new, old = copies
    check = json.loads((old / "accuracy.json").read_text())["targets"]["tpu"]["task"]["checks"][0]
    bound = check["bound"]

    def crossed(accuracy):
        found = accuracy["targets"]["tpu"]["task"]["checks"][0]
        found.update(value=bound - 0.01, passed=False, decision="fail")
    _edit(new, "accuracy.json", crossed)
    (failed,) = [c for c in gate.compare(new, old).failed if c.name.startswith("task metric")]
    assert f"below its budget ({bound:g}), where the baseline was within it" in failed.message
    assert "interval" not in failed.message
    _edit(new, "accuracy.json", lambda a: a["targets"]["tpu"]["task"]["checks"][0].update(
        value=check["ci95"][0] - max(check["ci95"][1] - check["ci95"][0], 1e-9), passed=True, decision="pass"))
    (moved,) = [c for c in gate.compare(new, old).failed if c.name.startswith("task metric")]
    assert "outside the baseline's 95% interval [" in moved.message and "budget" not in moved.message


def test_a_changed_run_parameter_is_listed_among_the_differences(copies, capsys):
    """The run's parameters (each stage notebook's papermill parameters): a changed batch_size is listed as a
    difference and noted, while the same parameters say so; the run folder's place (out_dir) is no difference."""
    new, old = copies
    same = gate.compare(new, old)
    assert ("run", "run parameters", "pass", "the same in both runs") in [
        (c.target, c.name, c.status, c.message) for c in same.checks]
    for folder, batch in ((old, 2), (new, 4)):      # as `portkit run -p batch_size N` gives it to each notebook
        for notebook in folder.glob("*.ipynb"):
            nb = json.loads(notebook.read_text())
            nb["metadata"]["papermill"]["parameters"]["batch_size"] = batch
            notebook.write_text(json.dumps(nb))
    assert layout.run_parameters(old)["batch_size"] == 2 and "out_dir" not in layout.run_parameters(old)
    changed = gate.compare(new, old)
    (row,) = [c for c in changed.checks if c.name == "run parameters"]
    assert row.message == "differ: batch_size: 2 -> 4"
    assert any("batch_size" in n for n in changed.notes)
    assert cli.main(["check", str(new), "--baseline", str(old)]) == 0
    assert "batch_size" in capsys.readouterr().out


def test_an_improvement_passes(copies):
    new, old = copies
    _edit(old, "buckets.json", _more_compiles)    # the baseline compiled more after warm-up
    _edit(old, "report.json", _worse_verdict)     # and had a worse verdict
    assert not gate.compare(new, old).failed


def test_check_without_report_is_bad_input(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty"), "--baseline", str(tmp_path / "empty")]) == 2
    assert "report.json" in capsys.readouterr().err
