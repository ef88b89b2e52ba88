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
from portkit.deploy import cost, export, gate


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


def test_vllm_and_nxdi_use_documented_keys_and_say_what_is_lost(run_dir, tmp_path):
    written, skipped = export.export(run_dir, "vllm", tmp_path / "vllm")
    for item in written:
        config = json.loads(item.path.read_text())
        assert set(config["engine_args"]) <= set(export.DOCUMENTED["vllm.engine_args"].keys)
        assert config["portkit"]["lost"] == list(item.lost)
        assert config["portkit"]["warmup"]
        if item.target == "neuron":
            neuron = config["engine_args"]["additional_config"]["neuron_config"]
            assert set(neuron) <= set(export.DOCUMENTED["vllm.additional_config.neuron_config"].keys)
            assert neuron["num_batched_tokens_buckets"][-1] == config["engine_args"]["max_num_batched_tokens"]
        else:
            assert set(config["env"]) <= set(export.DOCUMENTED["vllm.env.tpu"].keys)
            assert any("cannot list buckets" in line for line in item.lost)
    written, skipped = export.export(run_dir, "nxdi", tmp_path / "nxdi")
    assert [w.target for w in written] == ["neuron"] and any("Neuron only" in s for s in skipped)
    config = json.loads(written[0].path.read_text())["neuron_config"]
    assert set(config) <= set(export.DOCUMENTED["nxdi.neuron_config"].keys)
    boundaries = json.loads((run_dir / "buckets.json").read_text())["targets"]["neuron"]["chosen"]["boundaries"]
    assert config["context_encoding_buckets"] == boundaries and config["enable_bucketing"] is True
    with pytest.raises(Exception, match="not documented"):
        export.checked_keys("nxdi.neuron_config", {"made_up_key": 1})


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
    found = cost.estimate(run_dir, "tpu", json.loads(prices.read_text()))
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
    from portkit.planning import cost as planning_cost
    found = cost.comparison(run_dir, ["neuron", "tpu"])
    assert set(found["gpus"]) == set(planning_cost.GPUS) and found["label"] == "estimate, not measured"
    for side in [*found["targets"].values(), *found["gpus"].values()]:
        assert side["chip_seconds_per_million_requests"] > 0 and side["label"] == "estimate, not measured"
        if "usd_per_million_requests" in side:        # every price names its page and its date
            assert side["price"]["source"].startswith("https://") and side["price"]["date"]
    neuron = found["targets"]["neuron"]
    assert neuron["chip"] == "trn2"                     # TorchNeuron runs on Trn2/Trn3 only, never trn1
    assert "no price" in found["gpus"]["H200"]["problem"]                    # no source found: said, not invented
    assert set(found["verdicts"]) == {"neuron", "tpu"}
    # a user's price for a chip replaces the table's, and instance prices divide by the chips they hold
    mine = cost.comparison(run_dir, ["neuron"], {"trn2": {"usd_per_instance_hour": 16.0, "chips_per_instance": 16,
                                                           "source": "our contract", "date": "2026-12-01"}})
    usd = mine["targets"]["neuron"]["usd_per_million_requests"]["bound"]
    assert usd == pytest.approx(neuron["chip_seconds_per_million_requests"] / 3600 * 1.0)
    assert mine["targets"]["neuron"]["price"]["supplied_by"] == "the user (--prices)"


def test_every_price_names_its_page_and_date():
    from portkit.planning import cost as planning_cost
    from portkit.targets import capacity
    table = json.loads(planning_cost.PRICES.read_text())
    assert "_provenance" in table
    for chip, entry in planning_cost.price_table().items():
        assert entry["source"].startswith("https://") and entry["as_of"], chip
        assert chip in capacity.chips(), chip                 # a price for a chip whose peak portkit knows
    assert set(planning_cost.GPUS) <= set(capacity.chips("gpu"))


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
        assert f"${usd['low']:.3g} to ${usd['high']:.3g}" in cost.line(cost.estimate(run_dir, name))


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


def test_an_improvement_passes(copies):
    new, old = copies
    _edit(old, "buckets.json", _more_compiles)    # the baseline compiled more after warm-up
    _edit(old, "report.json", _worse_verdict)     # and had a worse verdict
    assert not gate.compare(new, old).failed


def test_check_without_report_is_bad_input(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty"), "--baseline", str(tmp_path / "empty")]) == 2
    assert "report.json" in capsys.readouterr().err
