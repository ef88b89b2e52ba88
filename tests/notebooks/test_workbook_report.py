"""The report of the minilm workbook for both targets holds every section with real values.

It reads the run folder the notebooks wrote when nbval executed them in this same pytest session
(scripts/test.sh prepares them with tools/prepare_notebooks.py, then runs `pytest test-artifacts/notebooks
tests/notebooks/test_workbook_report.py --nbval-lax`), so the workbook runs once for both checks. conftest.py moves this test after the notebooks.
"""
import json

import pytest

from conftest import ROOT

RUN = ROOT / "runs" / "notebook"          # the notebooks' out_dir (tools/prepare_notebooks.RUN_DIR)
STAGES = ["fallbacks", "compile", "buckets", "xla", "accuracy"]


@pytest.mark.after_notebooks
def test_minilm_report_holds_every_section(request):
    executed = [i.nodeid for i in request.session.items if "05_report.ipynb" in i.nodeid]
    if not executed:
        pytest.skip("needs the notebooks executed in this session (scripts/test.sh: tools/prepare_notebooks.py, "
                    "then pytest test-artifacts/notebooks tests/notebooks/test_workbook_report.py --nbval-lax)")
    path = RUN / "report.json"
    assert path.stat().st_mtime >= request.config.portkit_started, "report.json was not rewritten by this run"
    report = json.loads(path.read_text())
    assert report["model"]["name"] == "minilm" and report["gaps"] == []
    assert all(report["stages"][s]["status"] == "ok" for s in STAGES)
    from portkit.targets import specs
    for name in ("neuron", "tpu"):
        t = report["targets"][name]
        assert t["mode"] == specs.detect(name).mode and t["based_on"] == STAGES
        assert t["verdict"] in ("ready", "ready with work", "blocked")
        assert set(t["metrics"]) == set(STAGES)
        compile_ = t["metrics"]["compile"]
        assert " s (" in compile_["compile per shape on the target"]
        buckets = t["checklist"]["buckets"]
        assert buckets["boundaries"] and buckets["boundaries"] == sorted(buckets["boundaries"])
        assert "(0 after warm-up)" in t["metrics"]["buckets"]["replay with the chosen plan"]
        # stage 3's plan serves the requests with no compile after warm-up: stage 2's storm is shown resolved,
        # and the first work item is what remains (the texts cut to 512 tokens, or stage 1's work)
        storm = next(f for f in t["findings"] if f["kind"] == "recompile_storm")
        assert storm["severity"] == "info" and "resolved by stage 3's plan" in storm["message"]
        assert all(f["kind"] != "recompile_storm" for f in t["first"])
        assert any(f["kind"] == "truncation" and f["severity"] == "work" for f in t["first"])
        assert t["checklist"]["precision"]["setting"] and t["checklist"]["measure_on_hardware"]
        details = t["details"]
        assert len(details["accuracy buckets"]) == len(buckets["boundaries"])
        assert all(float(row["max abs"]) >= 0 for row in details["accuracy outputs"])
        assert details["accuracy layers"] and details["xla shapes"]
    # transformers' eager-only mask shortcut (padding_mask.all()) vanishes under compile: counted, not work
    tpu = report["targets"]["tpu"]
    assert "host sync" in tpu["vanished"] and not any(f["kind"] == "host_sync" for f in tpu["first"])
    tpu_shapes = report["targets"]["tpu"]["details"]["xla shapes"]
    assert all(s["status"] == "compiled" and s["HBM MiB"] > 0 and s["GFLOP"] > 0 and s["fits HBM"] for s in tpu_shapes)
    page = (RUN / "report.html").read_text()
    import report_numbers      # every number in the metric and finding cells is a stage figure
    assert report_numbers.unowned(RUN) == []
    for heading in ("Verdicts", "What to fix first", "Side by side", "Migration checklist",
                    "Details, side by side", "Findings", "Stages"):
        assert f"<h2>{heading}</h2>" in page
