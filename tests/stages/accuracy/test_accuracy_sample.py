"""Stage 4's task metrics decided on a stated sample: Wilson and bootstrap intervals, the inconclusive verdict,
the sample beside each verdict in the report, and a stream's drift as a finding."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fixture_model
from portkit.core.findings import BLOCKER, WORK
from portkit.models import registry
from portkit.stages.accuracy import comparison
from portkit.stages.accuracy import stats
from portkit.stages.accuracy import stage
from portkit.stages.report.stage import build_report
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS
from portkit.workloads import streaming


# ---------------------------------------------------------------- the statistics
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.floats(0, 1))
def test_the_wilson_interval_holds_the_rate_and_lies_in_0_1(n, share):
    k = round(share * n)
    low, high = stats.wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2000), st.floats(0, 1))
def test_the_wilson_interval_narrows_as_n_grows_at_the_same_rate(n, share):
    k = round(share * n)
    low, high = stats.wilson(k, n)
    low4, high4 = stats.wilson(4 * k, 4 * n)
    assert high4 - low4 < high - low


def test_the_wilson_interval_of_the_cases_that_matter():
    assert stats.wilson(4, 4)[0] == pytest.approx(4 / (4 + stats.Z95 ** 2))          # four agreeing images
    assert stats.wilson(380, 380)[0] < 0.99 < stats.wilson(381, 381)[0]             # where 0.99 becomes decidable
    assert stats.wilson(0, 0) == (0.0, 1.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=60))
def test_a_bootstrap_interval_is_seeded_and_ordered(values):
    v = torch.tensor(values, dtype=torch.float64)
    first = stats.bootstrap(v, stats.MEAN)
    assert first == stats.bootstrap(v, stats.MEAN)                  # seeded: a run repeats
    assert v.min() - 1e-9 <= first[0] <= first[1] <= v.max() + 1e-9
    low, high = stats.bootstrap(v, stats.MIN)
    assert low == pytest.approx(v.min().item())                       # a resample's minimum is never below it


def test_a_decision_is_pass_fail_or_inconclusive_by_the_whole_interval():
    bounds = DEFAULT_TASK_BOUNDS
    assert stats.decide((0.995, 1.0), "agreement", bounds) == stats.PASS
    assert stats.decide((0.5, 1.0), "agreement", bounds) == stats.INCONCLUSIVE
    assert stats.decide((0.5, 0.98), "agreement", bounds) == stats.FAIL
    assert stats.decide((0.001, 0.02), "kl", bounds) == stats.INCONCLUSIVE           # an upper bound: kl <= 0.01
    assert stats.decide((0.001, 0.005), "kl", bounds) == stats.PASS


def test_top1_agreement_on_four_images_is_inconclusive_and_on_1797_it_passes():
    logits = torch.randn(1797, 10, generator=torch.Generator().manual_seed(0))
    four = comparison.task_metrics(registry.IMAGE_CLASSIFIER, logits[:4], logits[:4], None, DEFAULT_TASK_BOUNDS,
                                   unit="images")
    (check,) = four["checks"]
    assert check["n"] == 4 and check["ci95"][0] < 0.99 and check["decision"] == "inconclusive"
    assert not four["passed"] and four["decision"] == "inconclusive"
    assert "straddles its budget >= 0.99" in four["reason"]
    every = comparison.task_metrics(registry.IMAGE_CLASSIFIER, logits, logits, None, DEFAULT_TASK_BOUNDS, unit="images")
    (check,) = every["checks"]
    assert every["passed"] and check["n"] == 1797 and check["ci95"][0] > 0.99
    assert stats.described(check) == "top-1 agreement 1.000 [0.998, 1.000] on 1,797 images"


def test_every_task_metric_carries_n_and_ci95():
    torch.manual_seed(0)
    ref = torch.randn(3, 6, 11)
    ids = torch.randint(0, 11, (3, 6))
    lm = comparison.task_metrics(registry.CAUSAL_LM, ref + 0.01 * torch.randn(3, 6, 11), ref, None,
                                 DEFAULT_TASK_BOUNDS, {"input_ids": ids})
    emb = comparison.task_metrics(registry.EMBEDDING, ref[:, 0] + 1e-4, ref[:, 0], None, DEFAULT_TASK_BOUNDS)
    for found in (lm, emb):
        for c in found["checks"]:
            assert isinstance(c["n"], int) and c["n"] > 0 and c["ci95"][0] <= c["ci95"][1], c
    assert {c["metric"] for c in lm["checks"]} == {"agreement", "kl", "perplexity"}
    assert lm["checks"][0]["n"] == 18 and lm["checks"][2]["n"] == 15            # positions; next-token pairs


# ---------------------------------------------------------------- the verdict and the report
def _agreeing_classifier(rows):
    """near_tie_model on inputs whose two logits are far apart: every decision agrees."""
    m = registry.load(fixture_model("near_tie_model"))
    inputs = {"pixel_values": torch.tensor([[0.0, 0.0, -1.0]] * rows, dtype=torch.float64)}
    return m, stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                      scope=stage.Scope(all_precisions=False, compiled=False, progress=False))


def test_an_undecided_verdict_is_inconclusive_work_never_a_pass(tmp_path):
    m, report = _agreeing_classifier(4)
    items = m.declaration.items          # the fixture's inputs are built by the test, not drawn from data
    tpu = report.targets["tpu"]
    assert tpu.chosen.task["argmax_agreement"] == 1.0 and tpu.chosen.task["decisions"] == 4
    assert tpu.verdict == "inconclusive" and report.verdict == "inconclusive" and not tpu.chosen.passed
    assert tpu.reasons == [] and f"on 4 {items}" in tpu.undecided[0]
    assert tpu.chosen.basis().startswith(f"INCONCLUSIVE: top-1 agreement 1.000 [0.510, 1.000] on 4 {items}")
    (finding,) = tpu.findings()
    assert (finding.kind, finding.severity) == ("accuracy_inconclusive", WORK)
    assert "give a larger corpus" in finding.advice
    assert "inconclusive: " in str(report) and "INCONCLUSIVE" in report._repr_html_()
    report.save(tmp_path / "accuracy.json")
    saved = json.loads((tmp_path / "accuracy.json").read_text())
    check = saved["targets"]["tpu"]["task"]["checks"][0]
    assert check["n"] == 4 and len(check["ci95"]) == 2 and saved["verdict"] == "inconclusive"
    target = build_report(run_dir=tmp_path).to_dict()["targets"]["tpu"]
    assert target["verdict"] != "ready"
    assert any(f["kind"] == "accuracy_inconclusive" and f["severity"] == WORK
               for f in target["findings"])
    metrics = target["metrics"]["accuracy"]
    top1 = metrics["task: top-1 agreement"]
    assert top1.startswith("1.000 [0.510, 1.000]") and f"on 4 {items}" in top1 and "INCONCLUSIVE" in top1


def test_the_report_says_what_decides_and_labels_the_element_wise_detail(minilm, corpus, tmp_path):
    from portkit.corpora.corpus import example_batch
    inputs, described = example_batch(minilm, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(minilm, inputs, ["tpu"], stage.Options.defaults(), corpus=corpus,
                                     buckets=[16], description=described,
                                     scope=stage.Scope(task_items=12, all_precisions=False, layers=False,
                                                          compiled=False, progress=False))
    tpu = report.targets["tpu"]
    assert tpu.verdict == "pass" and tpu.chosen.baseline["ratio"] > 100 and not tpu.chosen.baseline["within"]
    basis = tpu.chosen.basis()
    assert "so the task metrics decide" in basis and "no regression by itself" in basis
    assert "on 12 texts" in basis and "12 texts from" in basis
    assert "element-wise assert_close (detail, does not decide)" in report.outputs_table().header
    report.save(tmp_path / "accuracy.json")
    target = build_report(run_dir=tmp_path).to_dict()["targets"]["tpu"]
    gpu = target["metrics"]["accuracy"]["error vs today's GPU"]
    assert "so it does not decide (the task metrics do)" in gpu and "no regression by itself" in gpu
    assert "on 12 texts" in target["metrics"]["accuracy"]["task: lowest cosine to the reference"]
    assert all("element-wise assert_close (detail, does not decide)" in row
               for row in target["details"]["accuracy outputs"])


# ---------------------------------------------------------------- a stream's drift
def test_a_drifting_stream_is_a_blocker_finding_of_its_target(tmp_path):
    _, report = _agreeing_classifier(400)
    assert report.verdict == "pass"
    rising = [1e-4 * (1 + i / 4) for i in range(40)]          # the state's error grows along the stream
    run = streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, rising, [1e-4] * 40, 1.0)
    run.checks = [streaming.drift_check(run, DEFAULT_TASK_BOUNDS)]
    assert not run.passed
    report.stream = streaming.StreamResult({"name": "step", "origin": "test", "chunk_seconds": 0.1},
                                           {"seconds": 4.0, "source": "test", "label": "recorded", "rate": 16000},
                                           40, [run])
    assert report.verdict == "fail" and report.targets["tpu"].verdict == "pass"     # the inference verdict stands
    report.save(tmp_path / "accuracy.json")
    saved = json.loads((tmp_path / "accuracy.json").read_text())
    (drift,) = [f for f in saved["targets"]["tpu"]["findings"] if f["kind"] == "stream_drift"]
    assert drift["severity"] == BLOCKER and f"grows {run.growth:.2f}x" in drift["message"]
    assert "Mann-Whitney U p = " in drift["message"] and "float32" in drift["advice"]
    assert any("streamed state drifts" in r for r in saved["reasons"])
    assert build_report(run_dir=tmp_path).to_dict()["targets"]["tpu"]["verdict"] == "blocked"
