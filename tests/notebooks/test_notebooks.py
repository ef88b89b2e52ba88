"""The notebooks: each notebooks/NN_name.py (a jupytext percent script) is the source of the paired
NN_name.ipynb that papermill and nbval run. The pairs are in sync, the cells short, every parameter
documented, and the notebook code passes the library's linter.

After editing either file of a pair: jupytext --sync notebooks/*.py
"""
import ast
import json
import subprocess
import sys

import jupytext
import nbformat
import pytest

from conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"
SCRIPTS = sorted(NOTEBOOKS.glob("*.py"))
SYNC = "jupytext --sync notebooks/*.py"


def cell_inputs(nb) -> list[tuple[str, str, list[str]]]:
    """What a pair must agree on: each cell's type, source and tags (outputs and ids live in the .ipynb only)."""
    return [(cell.cell_type, cell.source, cell.metadata.get("tags", [])) for cell in nb.cells]


def test_every_notebook_has_its_script():
    scripts = [p.stem for p in SCRIPTS]
    assert scripts, "no notebooks/*.py found"
    assert scripts == sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")), f"unpaired notebook: run {SYNC}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_pair_in_sync(script):
    source = cell_inputs(jupytext.read(script))
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    paired = cell_inputs(notebook)
    for index, (want, got) in enumerate(zip(source, paired)):
        assert want == got, f"{script.name} cell {index} differs from the .ipynb's: run {SYNC}\n{want}\n{got}"
    assert len(source) == len(paired), f"{script.name}: {len(source)} cells, its .ipynb {len(paired)}: run {SYNC}"
    assert notebook.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert notebook.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_notebook_shape(script):
    cells = jupytext.read(script).cells
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "one cell tagged parameters"
    lines = params[0].source.splitlines()
    for line in lines:
        assert " = " in line and "  # " in line, f"parameter line without a comment: {line!r}"
    assert len(lines) <= 16, "too many parameters for one notebook"
    for cell in cells:
        if cell.cell_type == "code" and cell is not params[0]:
            assert len(cell.source.splitlines()) <= 12, f"logic belongs in portkit/: {cell.source[:60]!r}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_notebook_committed_without_outputs(script):
    for cell in json.loads(script.with_suffix(".ipynb").read_text())["cells"]:
        assert not cell.get("outputs") and cell.get("execution_count") is None, "clear the outputs before committing"


def test_library_and_notebook_code_pass_ruff():
    """The rules are pyproject.toml's [tool.ruff]; the notebooks are checked through their .py."""
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "portkit", "notebooks"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr, pytrace=False)


def test_runner_knows_every_notebook():
    from portkit.run import runner
    assert sorted(s.notebook for s in runner.STAGES) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


MAX_POSITIONAL = 3


def positional_calls(script) -> list[str]:
    """Calls in a notebook script that pass more than MAX_POSITIONAL arguments by position."""
    tree = ast.parse(script.read_text(), filename=script.name)
    return [f"line {node.lineno}: {ast.unparse(node)[:80]}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and len(node.args) > MAX_POSITIONAL]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_calls_name_their_arguments(script):
    """A call with more than three arguments names them: a reader of the cell sees what each value is."""
    found = positional_calls(script)
    assert not found, f"{script.name}: use keyword arguments beyond the first {MAX_POSITIONAL}: {found}"
