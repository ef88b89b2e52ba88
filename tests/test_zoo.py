"""The conformance zoo's quick subset (benchmarks/zoo.py --quick: one architecture of each family) through the
cheapest stages: the table is written, the last line counts what the table holds, and no stage crashes."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "benchmarks" / "zoo.py"
STAGES = ("fallbacks", "report")
LAST_LINE = re.compile(r"^zoo: (\d+) architectures, (\d+) stage crashes, (\d+) not assessed \(wall \d+ s; host .+\)$")
# A portkit defect the zoo finds: the fallbacks notebook reads the text corpus of a model that takes images
# (notebooks/01_fallbacks.py passes texts.texts where an image model has no text corpus).

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    doc = folder / "zoo.md"
    done = subprocess.run([sys.executable, str(ZOO), "--quick", "--serial", "--stages", ",".join(STAGES),
                           "--out", str(folder / "runs"), "--doc", str(doc)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    return done, lines[-1], doc


def _rows(table: str) -> list[list[str]]:
    """The body rows of the architecture table (the first markdown table), split into cells."""
    block = table.split("| architecture | family |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in block]


def test_the_quick_zoo_writes_its_table_and_a_last_line_that_counts_it(quick_zoo):
    done, last, doc = quick_zoo
    match = LAST_LINE.match(last)
    assert match, f"last line {last!r}; stderr: {done.stderr[-2000:]}"
    architectures, crashes, not_assessed = map(int, match.groups())
    text = doc.read_text()
    rows = _rows(text)
    assert architectures == len(rows) == 6
    assert {r[0].split()[0] for r in rows} == {"bert", "gpt2", "t5", "wav2vec2", "vit", "clip"}
    assert "- commit: `" in text and "- date: " in text and "--quick" in text
    verdicts = [cell for r in rows for cell in r[2 + len(STAGES):4 + len(STAGES)]]
    assert not_assessed == verdicts.count("not assessed")
    crash_rows = text.split("## Crashes", 1)[1]
    assert crashes == crash_rows.count("\n| ") - (1 if crashes else 0)    # less the header row
    assert crashes == sum("failed" in cell for r in rows for cell in r[2:2 + len(STAGES)])
    assert done.returncode == (1 if crashes else 0)


def test_the_quick_zoo_has_no_stage_crash(quick_zoo):
    done, last, doc = quick_zoo
    assert LAST_LINE.match(last) and ", 0 stage crashes," in last, doc.read_text().split("## Crashes", 1)[1]
