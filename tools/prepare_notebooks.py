"""Prepare the workbook's notebooks for the test suite: each with its parameters for a quick run.

    python tools/prepare_notebooks.py test-artifacts/notebooks

The notebooks' own defaults are the workbook's (100 requests a storm, a warm-up budget of minutes);
the tests execute the same notebooks with smaller values, injected by papermill (`--prepare-only`:
the injected-parameters cell is added, nothing is run) and then executed by nbval. Every notebook
writes into RUN_DIR, which tests/notebooks/test_workbook_report.py reads afterwards.
"""
from __future__ import annotations

import sys
from pathlib import Path

import papermill

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = ROOT / "runs" / "notebook"
# Small values, one place: enough requests for a storm with several shapes and a plan of a few buckets.
QUICK = {
    "02_compile": {"requests": 12},
    # the auto plan priced for a million requests, not ten: a few buckets per target (TPU 5, not 13), each one
    # compiled in the warm-up and checked by stage 4; the same planner, replay and checks
    "03_buckets": {"requests": 12, "warmup_budget_seconds": 40.0, "serve_requests": 1_000_000},
    "03b_xla": {"max_shapes": 2},
    # the main batch and the task sample padded to 32 tokens, not 64: the same checks on half the compute
    "04_accuracy": {"seq_len": 32},
}


def prepare(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        declared = papermill.inspect_notebook(str(notebook))
        values = {"out_dir": str(RUN_DIR), **QUICK.get(notebook.stem, {})}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise SystemExit(f"prepare_notebooks: {notebook.name} declares no parameter {', '.join(unknown)}")
        target = out_dir / notebook.name
        papermill.execute_notebook(str(notebook), str(target), parameters=values, prepare_only=True,
                                   progress_bar=False)
        written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/prepare_notebooks.py OUT_DIR")
    for path in prepare(Path(sys.argv[1])):
        print(f"prepared {path}")
