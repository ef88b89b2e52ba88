"""Progress bars (portkit.core.progress): text on stderr in headless runs, tqdm.auto's choice otherwise, and
the long loops (tokenizing a corpus, per-layer passes, accuracy's passes and buckets) show one."""
import re

import pytest
import torch
import tqdm.auto
import tqdm.std

from conftest import fixture_model
from portkit.stages.accuracy import stage as accuracy
from portkit.corpora import corpus as data
from portkit.models import registry as models
from portkit.core import progress


@pytest.mark.parametrize("value,headless", [("1", True), ("0", False), ("", False)])
def test_headless_runs_get_a_text_bar_on_stderr(monkeypatch, capsys, value, headless):
    monkeypatch.setenv(progress.HEADLESS_VARIABLE, value)
    assert progress.headless() is headless
    with progress.bar(range(3), desc="counting", unit="thing") as bar:
        assert sum(bar) == 3
    if headless:
        assert type(bar) is tqdm.std.tqdm and bar.fp is not None and bar.mininterval == progress.HEADLESS_INTERVAL
        captured = capsys.readouterr()
        assert "counting: 100%" in captured.err and "3/3" in captured.err and not captured.out
    else:
        assert type(bar) is tqdm.auto.tqdm


def test_the_long_loops_report_progress_headless(monkeypatch, capsys):
    monkeypatch.setenv(progress.HEADLESS_VARIABLE, "1")
    m = models.load(fixture_model("tiny_encoder"))
    corpus = data.Corpus("three texts", "test", ("a b c", "def f(x): return x", "Sum of two numbers."))
    assert list(data.length_distribution(corpus, m).lengths) == m.token_lengths(list(corpus.texts))
    inputs = m.encode(list(corpus.texts), pad_to=8)
    accuracy.check_accuracy(m, inputs, ["tpu"], all_precisions=False, compiled=False, float64_reference=False)
    err = capsys.readouterr().err
    for label in ("tokenizing three texts", "layers: reference", "layers: compared", "accuracy: 100%"):
        assert label in err, label
    # the compared pass counts modules, its total learnt from the reference pass
    assert re.search(rf"layers: compared: +0%\|[^|]*\| 0/{sum(1 for _ in m.module.modules())} \[.*module/s", err)
    torch.compiler.reset()
