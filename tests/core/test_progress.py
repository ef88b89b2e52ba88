"""Progress bars (portkit.core.progress): text on stderr in headless runs, tqdm.auto's choice otherwise, and
the long loops (tokenizing a corpus, per-layer passes, accuracy's passes and buckets) show one."""
import io
import json
import re
import sys

import pytest
import torch
import tqdm.auto
import tqdm.std

from conftest import fixture_model
from portkit.stages.accuracy.stage import Scope, check_accuracy
from portkit.corpora.corpus import Corpus, length_distribution
from portkit.models import registry
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
    m = registry.load(fixture_model("tiny_encoder"))
    corpus = Corpus("three texts", "test", ("a b c", "def f(x): return x", "Sum of two numbers."))
    assert list(length_distribution(corpus, m).lengths) == m.token_lengths(list(corpus.texts))
    inputs = m.encode(list(corpus.texts), pad_to=8)
    check_accuracy(m, inputs, ["tpu"], scope=Scope(all_precisions=False, compiled=False,
                                                                     float64_reference=False))
    err = capsys.readouterr().err
    for label in ("tokenizing three texts", "layers: reference", "layers: compared", "accuracy: 100%"):
        assert label in err, label
    # the compared pass counts modules, its total learnt from the reference pass
    assert re.search(rf"layers: compared: +0%\|[^|]*\| 0/{sum(1 for _ in m.module.modules())} \[.*module/s", err)
    torch.compiler.reset()


class _Terminal(io.StringIO):
    """What a terminal receives: stdout and stderr both write here, and it says it is a tty."""

    def isatty(self):
        return True


def test_progress_is_watched_in_a_terminal_not_in_a_file_or_a_pipe():
    assert progress.watched(_Terminal()) and not progress.watched(io.StringIO())
    closed = open("/dev/null")   # closed, its isatty raises: no bar, no error
    closed.close()
    assert not progress.watched(closed) and not progress.watched(object())


@pytest.mark.parametrize("terminal,no_progress", [(False, False), (True, False), (True, True)])
def test_portkit_run_draws_bars_in_a_terminal_alone_and_each_stage_line_starts_a_line(tmp_path, monkeypatch,
                                                                                      terminal, no_progress):
    from portkit import cli
    from portkit.run import runner
    from portkit.run import stage_kernel

    def execute(stage, values, out, shown, kernel):   # a stage without a kernel: its result names it
        (out / stage.result).write_text(json.dumps({"summary": f"{stage.name} checked"}))
    monkeypatch.setattr(stage_kernel, "execute", execute)
    monkeypatch.setattr(runner.jupyter_kernels.SharedKernel, "prepare",
                        lambda kernel: setattr(kernel, "prepared", True))
    screen = _Terminal() if terminal else io.StringIO()   # a log file or a pipe: not a tty
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    args = ["run", "--model", "lstm", "--out", str(tmp_path / "run"), "--stages", "fallbacks,compile", "--no-report"]
    assert cli.main(args + ["--no-progress"] * no_progress) == 0
    text = screen.getvalue()
    stages = ["[fallbacks] fallbacks checked (0 s)", "[compile] compile checked (0 s)"]
    if terminal and not no_progress:
        assert "portkit: 100%" in text and "2/2" in text and "\r" in text        # the run's bar, redrawn
        for line in stages:     # each at column 0: after a newline, or after the bar cleared (which ends in \r)
            at = text.index(line + "\n")
            assert text[at - 1] in "\r\n", repr(text[max(0, at - 80):at + len(line)])
    else:                       # one plain line per stage, nothing redrawn
        assert "\r" not in text and "\x1b[" not in text and "portkit:" not in text, repr(text)
        # stages 1 and 2 run side by side (stage 2 reads stage 1 late): each line once, in the order they end
        assert sorted(line for line in text.splitlines() if line.startswith("[")) == sorted(stages)
