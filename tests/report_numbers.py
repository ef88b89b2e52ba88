"""Every number report.html prints in its metric and finding cells, traced to the run's stage JSONs.

A figure is owned by a stage result when some value of that stage's JSON, shown to the digits the page shows,
gives it. The JSON's values are its numbers (also those written inside its strings: a label the stage wrote
is its own), and these derived figures, each by one documented rule:

- a list's length (a count of shapes, of breaks, of buckets);
- in a list of objects, how many have a key true (shapes passing, buckets passing);
- an object's numbers summed (distinct ops: native + composite + ...);
- a replay row's compiles less its compiles after warm-up (the compiles in warm-up);
- a share shown as a percentage (x 100), bytes as MiB or GiB (/ 2**20, / 2**30), FLOPs as GFLOP (/ 1e9),
  a parameter count in millions (/ 1e6).

"Stage N" in the page's own words is a name, not a figure.
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

STAGE_FILES = ("fallbacks.json", "compile.json", "buckets.json", "xla.json", "accuracy.json")
NUMBER = re.compile(r"(?<![\w.:#-])\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?(?:%|x(?!\w))?(?![\w.]\d|\w)")
SCALES = (1.0, 1e-6, 1e-9, 2.0 ** -20, 2.0 ** -30)


class _Cells(HTMLParser):
    """The page's text cells by section (its <h2>): table rows (cells' text) and list items."""

    def __init__(self):
        super().__init__()
        self.section, self.rows, self.items, self._cell, self._row, self._item = "", [], [], None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self.section = ""
            self._cell = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "li":
            self._item = []

    def handle_endtag(self, tag):
        if tag == "h2":
            self.section, self._cell = "".join(self._cell), None
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append((self.section, self._row))
            self._row = None
        elif tag == "li" and self._item is not None:
            self.items.append((self.section, "".join(self._item)))
            self._item = None

    def handle_data(self, data):
        for part in (self._cell, self._item):
            if part is not None:
                part.append(data)


def printed_figures(page: str) -> list[tuple[str, str]]:
    """(where, number) for every number in the side-by-side metric cells, the first findings and the findings'
    messages of a report.html."""
    cells = _Cells()
    cells.feed(page)
    texts = [(f"{row[0]} / {row[1]}", cell) for section, row in cells.rows if section == "Side by side"
             for cell in row[2:]]
    texts += [("first", item) for section, item in cells.items if section == "What to fix first"]
    texts += [("finding", row[1]) for section, row in cells.rows if section == "Findings" and len(row) == 5
              and row[0] != "severity"]
    return [(where, n) for where, text in texts for n in NUMBER.findall(re.sub(r"\bstages? \d+b?", "", text))]


def _walk(value, out: list[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, str):
        out += [float(n.rstrip("%x").replace(",", "")) for n in NUMBER.findall(value)]
    elif isinstance(value, dict):
        numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) > 1:
            out.append(float(sum(numbers)))
        if isinstance(value.get("compiles"), int) and isinstance(value.get("compiles_after_warmup"), int):
            out.append(float(value["compiles"] - value["compiles_after_warmup"]))
        for v in value.values():
            _walk(v, out)
    elif isinstance(value, list):
        out.append(float(len(value)))
        keys = {k for v in value if isinstance(v, dict) for k, x in v.items() if isinstance(x, bool)}
        out += [float(sum(bool(v.get(k)) for v in value if isinstance(v, dict))) for k in keys]
        for v in value:
            _walk(v, out)


def stage_figures(run_dir: Path) -> np.ndarray:
    """Every figure the run's stage results own, by the rules above (before scaling), sorted."""
    out: list[float] = []
    for name in STAGE_FILES:
        if (run_dir / name).exists():
            _walk(json.loads((run_dir / name).read_text()), out)
    return np.unique(np.asarray(out, dtype=float))


def _half_unit(text: str) -> float:
    """Half of the last digit shown: the most a figure shown so can differ from the value it rounds."""
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)


def owned(number: str, figures: np.ndarray) -> bool:
    """Whether a printed number is some stage figure, scaled by one of the rules, to the digits shown."""
    text = number.replace(",", "")
    percent = text.endswith("%")
    text = text.rstrip("%x")
    x, half = float(text), _half_unit(text)
    for scale in (100.0,) if percent else SCALES:
        scaled = np.sort(figures * scale)
        i = np.searchsorted(scaled, x - half)
        if i < scaled.size and scaled[i] <= x + half:
            return True
    return False


def unowned(run_dir: Path) -> list[tuple[str, str]]:
    """The numbers report.html prints that no stage figure gives."""
    figures = stage_figures(run_dir)
    return [(where, n) for where, n in printed_figures((run_dir / "report.html").read_text()) if not owned(n, figures)]
