"""Stage 5: the report holds every section, survives missing or corrupt stage results, and renders."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from portkit import data, fallbacks, models, report


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder with stage 1 for an LSTM model (a blocker on Neuron, work on TPU)."""
    out = tmp_path_factory.mktemp("run")
    m = models.load("lstm")
    inputs, described = data.example_batch(m, data.load_corpus(), 2, 16)
    fallbacks.find_fallbacks(m, inputs, ["neuron", "tpu"], description=described).save(out / "fallbacks.json")
    return out


def test_verdicts_and_checklist(run_dir):
    r = report.build_report(run_dir)
    assert r.verdicts() == {"neuron": "blocked", "tpu": "ready with work"}
    neuron = r.to_dict()["targets"]["neuron"]
    assert neuron["mode"] == "emulated" and "fallbacks" in neuron["based_on"]
    kernels = neuron["checklist"]["kernels"]
    assert kernels[0]["op"] == "aten::_thnn_fused_lstm_cell" and kernels[0]["language"] == "NKI"
    assert kernels[0]["recorded_as"] == "aten::mkldnn_rnn_layer"
    assert any("recurrent in lstm" in x for x in neuron["checklist"]["rewrite"])
    assert neuron["checklist"]["measure_on_hardware"]
    assert r.to_dict()["schema"] == report.SCHEMA


def test_saved_files_are_self_contained(run_dir, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    r = report.build_report(folder)
    html_path = r.save(folder)
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page and "https://" not in page
    assert "portkit environment" in page and "Emulated:" in page and "blocked" in page
    saved = json.loads((folder / "report.json").read_text())
    assert saved["targets"]["tpu"]["verdict"] == "ready with work"


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_missing_or_corrupt_stage_is_named(run_dir, tmp_path, damage):
    folder = tmp_path / "damaged"
    shutil.copytree(run_dir, folder)
    target = folder / "fallbacks.json"
    if damage == "delete":
        target.unlink()
    else:
        target.write_text(target.read_text()[:500])
    r = report.build_report(folder, ["neuron", "tpu"])
    r.save(folder)
    expected = "fallbacks.json is missing" if damage == "delete" else "fallbacks.json cannot be read"
    assert any(expected in g for g in r.gaps), r.gaps
    saved = json.loads((folder / "report.json").read_text())
    assert saved["stages"]["fallbacks"]["status"] == ("missing" if damage == "delete" else "unreadable")
    assert saved["targets"]["neuron"]["verdict"] == "not assessed"
    assert expected in (folder / "report.html").read_text()


def test_cli_report_from_any_folder(run_dir, tmp_path):
    portkit = Path(sys.executable).parent / "portkit"
    done = subprocess.run([str(portkit), "report", str(run_dir)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2].startswith("verdict neuron (emulated): BLOCKED")
    done = subprocess.run([str(portkit), "report", str(tmp_path / "nope")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "invalid run folder" in done.stderr
