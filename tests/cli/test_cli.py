"""The command line: bad input exits 2 with one line and writes nothing; stages run with papermill."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, fixture_model
from portkit import cli


def portkit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "portkit.cli", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=900)


@pytest.mark.parametrize("args,message", [
    (["--target", "trn"], "unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda"),
    (["--model", "gpt5"], "unknown model 'gpt5'; choose one of: minilm, gpt2"),
    (["--model", "org/some-model"], "does not download"),
    (["-p", "batchsize", "4"], "unknown parameter 'batchsize'; choose one of:"),
    (["-p", "batch_size", "0"], "invalid batch_size 0: must be a positive whole number"),
    (["-p", "corpus", "nowhere.jsonl"], "nowhere.jsonl'; choose one of: stdlib"),
    (["--stages", "fallback"], "unknown stage 'fallback'; choose one of: fallbacks"),
    (["-p", "model", "gpt2"], "give model with its own option"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    # in-process (cli.main is the console script's function); the process exit code is checked below
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--no-progress", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert not out.exists()


def test_bad_input_exits_2_from_the_console_script(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([str(Path(sys.executable).parent / "portkit"), "run", "--model", "gpt5", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("portkit: error: unknown model 'gpt5'; choose one of: ")
    assert not out.exists()


def test_argparse_errors_are_one_line():
    done = portkit("run", "--no-such-flag")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_targets_and_params_commands(capsys):
    # in-process, as the console script calls it (its own process: test_bad_input_exits_2_from_the_console_script)
    assert cli.main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "target neuron: EMULATED" in out and "target cpu: NATIVE" in out
    assert cli.main(["params"]) == 0
    out = capsys.readouterr().out
    assert "    = 8  [fallbacks]" in out and "[fallbacks]" in out


@pytest.mark.slow
def test_run_fallbacks_stage_end_to_end(tmp_path):
    out = tmp_path / "run"
    done = portkit("run", "--model", "lstm", "--target", "neuron", "--target", "tpu", "--out", str(out),
                   "--stages", "fallbacks", "--no-progress", "-p", "batch_size", "2", "-p", "seq_len", "16")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[fallbacks] neuron (emulated):" in done.stdout and f"results: {out}" in done.stdout
    result = json.loads((out / "fallbacks.json").read_text())
    assert result["inputs"]["shapes"]["input_ids"] == [2, 16]
    assert result["targets"]["neuron"]["counts"]["unsupported"] == 1
    assert result["targets"]["tpu"]["target"]["mode"] == "emulated"
    assert (out / "01_fallbacks.ipynb").exists()


@pytest.mark.slow
def test_failed_stage_names_notebook_and_cell(tmp_path):
    out = tmp_path / "run"
    done = portkit("run", "--model", fixture_model("broken_model"), "--out", str(out), "--stages", "fallbacks",
                   "--no-progress", "-p", "batch_size", "1", "-p", "seq_len", "8")
    assert done.returncode == 1
    assert "stage fallbacks failed: cell" in done.stderr and "01_fallbacks.ipynb" in done.stderr
    assert "fails on purpose" in done.stderr
    executed = json.loads((out / "01_fallbacks.ipynb").read_text())
    assert any(o.get("output_type") == "error" for c in executed["cells"] for o in c.get("outputs", []))
    assert not (out / "fallbacks.json").exists()


def test_main_returns_codes_in_process(tmp_path, capsys):
    assert cli.main(["run", "--target", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown target 'nope'" in capsys.readouterr().err
