"""Write a workbook notebook from a compact cell list, so notebooks are reviewed as Python.

Each notebook in notebooks/ has a spec in tools/notebooks/<name>.py defining CELLS, a list of
("md" | "code" | "params", source). `python tools/nbbuild.py` rewrites every notebook from its spec
(outputs stripped); tests/test_notebooks.py checks the committed notebooks match their specs.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "tools" / "notebooks"


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for index, (kind, source) in enumerate(cells):
        source = source.strip("\n")
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
        cell["id"] = f"cell-{index:02d}"   # stable ids keep diffs small
        nb.cells.append(cell)
    return nb


def render(spec: Path) -> str:
    module_spec = importlib.util.spec_from_file_location(spec.stem, spec)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return nbformat.writes(build(module.CELLS)) + "\n"


def main() -> int:
    for spec in sorted(SPECS.glob("*.py")):
        target = ROOT / "notebooks" / f"{spec.stem}.ipynb"
        target.write_text(render(spec))
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
