"""report.html opened in headless Chromium: its tables and plots render. Screenshot kept in test-artifacts/."""
import pytest

from conftest import ROOT
from portkit import probes, runner

ARTIFACTS = ROOT / "test-artifacts"


@pytest.mark.slow
@pytest.mark.skipif(probes.chromium_path() is None, reason="needs Debian's chromium (scripts/test.sh installs it)")
def test_report_renders_in_chromium(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "run"
    runner.run("lstm", ["neuron", "tpu"], str(out), {"batch_size": 2, "seq_len": 16},
               stages="fallbacks,report", progress=False, log=lambda line: None)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=probes.chromium_path(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((out / "report.html").as_uri())
            tables = page.evaluate("[...document.querySelectorAll('table')].map(t => t.rows.length)")
            images = page.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
            verdicts = page.evaluate("[...document.querySelectorAll('.verdict')].map(v => v.textContent)")
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert len(tables) >= 5 and all(rows >= 2 for rows in tables), tables
    assert images and all(done and w > 100 and h > 100 for done, w, h in images), images
    assert verdicts == ["blocked", "ready with work"]
    assert (ARTIFACTS / "report.png").stat().st_size > 20_000
