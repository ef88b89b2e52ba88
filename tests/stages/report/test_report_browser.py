"""report.html opened in headless Chromium: its tables and plots render, and no page is wider than the window.
Screenshot kept in test-artifacts/."""
import pytest

from conftest import ROOT
from portkit.core.availability import chromium_path, xla_tpu_compile_available
from portkit.run import runner

ARTIFACTS = ROOT / "test-artifacts"
WIDTHS = (1400, 1920, 390)   # a laptop, a desktop and a phone (390x844): the page never scrolls sideways


def _overflow(page, url) -> dict:
    """{viewport width: (the page's scroll width, the elements that run past the window)} at each of WIDTHS: tables
    wrap or scroll inside their own box, so the page itself is never wider than the window."""
    found = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 844 if width < 800 else 900})
        page.goto(url)
        found[width] = page.evaluate(
            "[document.documentElement.scrollWidth, window.innerWidth, [...document.querySelectorAll('body *')]"
            ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1 && !e.closest('.scroll'))"
            ".slice(0, 3).map(e => e.tagName + ' ' + e.textContent.slice(0, 40)), "
            "[...document.querySelectorAll('td.why')].map(e => e.getBoundingClientRect().right)]")
    return found


@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium (scripts/test.sh installs it)")
def test_report_renders_in_chromium(tmp_path, corpus):
    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "run"
    runner.run("lstm", ["neuron", "tpu"], str(out), {"batch_size": 2, "seq_len": 16},
               stages="fallbacks,report", progress=False, log=lambda line: None)
    accuracy_page = _accuracy_verdicts_report(tmp_path / "accuracy", corpus)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((out / "report.html").as_uri())
            tables = page.evaluate("[...document.querySelectorAll('table')].map(t => t.rows.length)")
            images = page.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
            verdicts = page.evaluate("[...document.querySelectorAll('.verdict')].map(v => v.textContent)")
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            widths = {"stage 1": _overflow(page, (out / "report.html").as_uri()),
                      "stage 4": _overflow(page, accuracy_page.as_uri())}
            page.set_viewport_size({"width": 1280, "height": 900})
            page.goto(accuracy_page.as_uri())
            accuracy_verdicts = page.evaluate(
                "[...document.querySelectorAll('.accuracy-verdict')].map(v => v.innerText)")
            accuracy_reasons = page.evaluate("[...document.querySelectorAll('.accuracy-reason')].map(v => v.innerText)")
        finally:
            browser.close()
    assert len(tables) >= 5 and all(rows >= 2 for rows in tables), tables
    assert images and all(done and w > 100 and h > 100 for done, w, h in images), images
    assert verdicts == ["blocked", "not assessed"]   # stage 1 alone: tpu's other stages did not run
    assert (ARTIFACTS / "report.png").stat().st_size > 20_000
    for report, found in widths.items():
        for width, (scroll, inner, past, why) in found.items():
            assert inner == width and scroll <= inner, (report, width, scroll, past)
            # the verdict's why is read whole in the window, never cut at its edge (at 390 its rows stack)
            assert why and all(right <= inner for right in why), (report, width, why)
    # stage 4's verdicts: a PASS says against which baseline, each task metric next to its budget; a FAIL
    # names the task metric, its budget and the module where the error enters (the TESTING_ONLY wrong op)
    passed, failed = accuracy_verdicts
    # the tiny model's few tokens cannot decide its 0.99 budget: within 2x of the GPU baseline decides the PASS,
    # and the page says the task metric's interval straddles its budget
    assert passed.startswith("Accuracy verdict: PASS against the GPU baseline 'fp32': no regression"), accuracy_verdicts
    assert "top-1 agreement 1.000 [" in passed and "straddles its budget >= 0.99: inconclusive" in passed
    assert failed.startswith("Accuracy verdict: FAIL: top-1 agreement") and "(budget >= 0.99: FAIL)" in failed
    (reason,) = accuracy_reasons
    assert "outside its budget >= 0.99" in reason and "the error enters at `model.qkv` (Linear)" in reason, reason


def _accuracy_verdicts_report(out, corpus):
    """report.html of a stage 4 result with one PASS (neuron) and one FAIL (tpu under a wrong addmm)."""
    from conftest import fixture_model
    from portkit.stages.accuracy.stage import Options, Scope, check_accuracy
    from portkit.corpora.corpus import example_batch
    from portkit.models import registry
    from portkit.targets import numerics
    from portkit.stages.accuracy.result import AccuracyReport
    from portkit.stages.report.stage import build_report
    m = registry.load(fixture_model("tiny_encoder"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    run = {"all_precisions": False, "compiled": False, "progress": False, "float64_reference": False}
    good = check_accuracy(m, inputs, ["neuron"], scope=Scope(**run))
    bad = check_accuracy(m, inputs, ["tpu"], Options.of({"precision": {"tpu": "highest"}}),
                                  scope=Scope(**run, emulation=numerics.wrong_op_TESTING_ONLY(
                                      "aten::addmm", call=1, error=5.0)))
    AccuracyReport(good.model, good.inputs, good.reference, {**good.targets, **bad.targets}).save(
        out / "accuracy.json")
    return build_report(run_dir=out).save(out)



@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium (scripts/test.sh installs it)")
@pytest.mark.skipif(not xla_tpu_compile_available(), reason="needs jax, jaxlib, libtpu and torchax")
def test_an_abstract_models_scale_sections_render_in_chromium(tmp_path):
    """An abstract model's report (stage 3b alone, the other stages skipped): its scale and capacity tables show."""
    import contextlib

    from portkit.stages.report.stage import build_report
    from portkit.runfolder import results
    from portkit.runfolder import layout
    from portkit.stages.xla.stage import Options, load, run_stage
    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "run"
    out.mkdir()
    for stage in layout.STAGES:
        with pytest.raises(results.StageSkipped) if stage.needs_weights else contextlib.nullcontext():
            results.skip_if_abstract("tiny-llama", out, stage.name, ["neuron", "tpu"])
    run_stage(load("tiny-llama"), ["neuron", "tpu"], Options.of(
        {"scale_topologies": ["v5e:2x2", "v5e:1x1"], "scale_batch": 4, "scale_seq": 16}),
        run_dir=out).save(out / "xla.json")
    page_path = build_report(run_dir=out).save(out)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_path.as_uri())
            text = page.evaluate("document.body.innerText")
            rows = page.evaluate("[...document.querySelectorAll('table')].map(t => t.innerText)")
        finally:
            browser.close()
    assert "capacity (estimate, not measured)" in text and "scale topologies" in text
    capacity = next(t for t in rows if "copies per instance" in t and "trn2.48xlarge" in t)
    assert "inf2.48xlarge" in capacity and "trn1.32xlarge" in capacity
    assert any("v5e:1x1" in t and "all-gather" not in t and "compiled" in t for t in rows)
    assert "Ops not checked: stage 1 (fallbacks) has no result" in text
