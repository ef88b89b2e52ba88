"""Stage options read each notebook's parameters cell as papermill's inspector reads it, without importing
papermill or nbformat (every stage kernel builds its options; nbformat's import brings jsonschema's grammars)."""
import sys

import papermill
import pytest

from portkit.core.locations import NOTEBOOKS
from portkit.runfolder import layout
from portkit.stages import options


@pytest.mark.parametrize("notebook", [stage.notebook for stage in layout.STAGES])
def test_a_notebooks_parameters_are_read_as_papermill_reads_them(notebook):
    """Rule: name, default (as written) and help of every parameter, in the cell's order, are papermill's."""
    theirs = papermill.inspect_notebook(str(NOTEBOOKS / notebook))
    mine = options.declared(notebook)
    assert list(mine) == list(theirs) and mine
    assert mine == {name: {key: info[key] for key in ("name", "default", "help")} for name, info in theirs.items()}


def test_reading_the_parameters_imports_neither_papermill_nor_nbformat(tmp_path, monkeypatch):
    """Rule: the parameters cell is read with the standard library (an import of either module here fails)."""
    for module in ("papermill", "nbformat", "jsonschema"):
        monkeypatch.setitem(sys.modules, module, None)      # `import papermill` raises ImportError
    notebook = NOTEBOOKS / layout.STAGES[0].notebook
    copy = tmp_path / notebook.name
    copy.write_bytes(notebook.read_bytes())
    read = options._inspect(str(copy), copy.stat().st_mtime_ns)   # a path the cache has not seen
    assert read["batch_size"] == {"name": "batch_size", "default": "8", "help": "texts in the recorded batch"}


def test_a_notebook_without_a_parameters_cell_declares_nothing(tmp_path):
    notebook = tmp_path / "plain.ipynb"
    notebook.write_text('{"cells": [{"cell_type": "code", "metadata": {}, "source": ["x = 1  # not a parameter"]}], '
                        '"metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    assert options._inspect(str(notebook), notebook.stat().st_mtime_ns) == {}
