"""The report says each figure once and right: every number report.html prints in its metric and finding cells
is a figure of the run's stage results (report_numbers.py's rules), on a real run of the workbook on a tiny
model; text cut at portkit's length cap (the tiny model states none) is a finding; a recompile storm that stage 3's plan resolves is shown
resolved, and the first work item is what remains."""
import json
import re

import numpy as np
import pytest

import report_numbers


@pytest.fixture(scope="module")
def run_dir(tiny_run):
    return tiny_run


@pytest.mark.slow
def test_every_number_the_report_prints_is_a_stage_figure(run_dir):
    printed = report_numbers.printed_figures((run_dir / "report.html").read_text())
    assert len(printed) > 100, "the page's metric and finding cells were not found"
    assert report_numbers.unowned(run_dir) == []


@pytest.mark.slow
def test_the_check_names_a_figure_no_stage_wrote(run_dir):
    figures = report_numbers.stage_figures(run_dir)
    buckets = json.loads((run_dir / "buckets.json").read_text())
    share = buckets["truncation"]["lost_share_of_over"]
    assert report_numbers.owned(f"{share:.1%}", figures) and report_numbers.owned("8,604", figures)
    # a figure no stage wrote: the run's own figures vary run to run, so one is picked that is none of them
    stray = next(f"{n / 10:.1f}" for n in range(8188, 9999) if not report_numbers.owned(f"{n / 10:.1f}", figures))
    assert report_numbers.owned(stray, np.array([float(stray)]))       # the same number once a stage writes it
    page = (run_dir / "report.html").read_text().replace("<td>captures the model</td>", f"<td>{stray} s</td>", 1)
    assert ("compile / fullgraph=True", stray) in report_numbers.printed_figures(page)


@pytest.mark.slow
def test_truncation_is_a_finding_and_a_resolved_storm_is_shown_resolved(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    buckets = json.loads((run_dir / "buckets.json").read_text())
    cut = buckets["truncation"]
    assert cut["over"] == buckets["distribution"]["over_max_length"] > 0 and cut["limit"] == 512
    for name, t in report["targets"].items():
        found = next(f for f in t["findings"] if f["kind"] == "truncation")
        assert found["severity"] == "work" and found["stage"] == "buckets"
        assert f"{cut['over']:,} of {cut['items']:,}" in found["message"]
        assert f"lose {cut['lost_share_of_over']:.1%} of their tokens" in found["message"]
        # the tiny model states no length limit: the cap is portkit's, with no advice that assumes a position table
        assert "portkit's, not the model's" in found["advice"] and "-p overflow reject" in found["advice"]
        assert "sliding windows" not in found["advice"]
        storm = next(f for f in t["findings"] if f["kind"] == "recompile_storm")
        plan = buckets["targets"][name]["chosen"]["boundaries"]
        assert storm["severity"] == "info" and f"resolved by stage 3's plan auto {plan}" in storm["message"]
        assert re.search(r"\d+ compiles? in warm-up, 0 after", storm["resolved_by"])
        assert "portkit export RUN --to" in storm["message"]            # the command that serves the plan
        assert all(f["kind"] != "recompile_storm" for f in t["first"])
        assert t["first"][0]["kind"] == "truncation" or t["first"][0]["stage"] == "fallbacks"
        metrics = t["metrics"]
        assert "stage 2's 100 requests" in metrics["compile"]["compiles without buckets (stage 2's requests)"]
        assert "stage 3's 100 requests" in metrics["buckets"]["replay with the chosen plan"]
        shapes = metrics["xla"]["shapes passing"]
        missed = [b for b in plan if not re.search(rf"seq={b}\b", json.dumps(t["details"]["xla shapes"]))]
        assert (f"{len(missed)} of stage 3's {len(plan)} buckets not checked" in shapes) == bool(missed)
    page = (run_dir / "report.html").read_text()
    assert "M parameters" not in page and "489,168 parameters" in page      # the tiny encoder's count, in full
