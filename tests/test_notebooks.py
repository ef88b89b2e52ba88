"""The notebooks are short, parameterized, and built from their specs in tools/notebooks/."""
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import nbbuild  # noqa: E402

SPECS = sorted((ROOT / "tools" / "notebooks").glob("*.py"))


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_notebook_matches_its_spec(spec):
    committed = (ROOT / "notebooks" / f"{spec.stem}.ipynb").read_text()
    assert committed == nbbuild.render(spec), f"run: python tools/nbbuild.py (spec {spec.name} changed)"


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_notebook_shape(spec):
    nb = json.loads((ROOT / "notebooks" / f"{spec.stem}.ipynb").read_text())
    params = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1
    lines = "".join(params[0]["source"]).splitlines()
    for line in lines:
        assert " = " in line and "  # " in line, f"parameter line without a comment: {line!r}"
    assert len(lines) <= 16, "too many parameters for one notebook"
    for cell in nb["cells"]:
        assert not cell.get("outputs"), "notebooks are committed without outputs"
        if cell["cell_type"] == "code" and cell not in params:
            assert len("".join(cell["source"]).splitlines()) <= 12, "logic belongs in portkit/"


def test_runner_knows_every_notebook():
    from portkit import runner
    assert sorted(s.notebook for s in runner.STAGES) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
