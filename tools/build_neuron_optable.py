"""Build data/targets/neuron.json from the op data read from a public copy of TorchNeuron's development tree.

    python tools/build_neuron_optable.py [--source data/sources/neuron_ops_devtree_2026-04.json] [--out FILE]

torch-neuronx's compiler and runtime do not install on a CPU host, so the table comes from a static
reading (nothing executed) of github.com/parmoham-aws/test-repo-parmoham at one commit: a public
repository holding a copy of the backend's development tree, not an AWS release. The source file
records the commit and the method. The vendor's release table, aws-neuron/torch-neuronx
docs/torch_api_compatibility.md (regenerated each release), supersedes it. With torch-neuronx
installed on a Trainium host, portkit reads the table live from the dispatcher instead.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from portkit.core.atomic_io import write_json  # noqa: E402

DEFAULT_SOURCE = ROOT / "data" / "sources" / "neuron_ops_devtree_2026-04.json"
RELEASE_TABLE = "aws-neuron/torch-neuronx docs/torch_api_compatibility.md"
SOURCE_KEYS = ("source", "method", "native", "cpu_fallback", "decomposed", "unsupported_notes", "dtype_rules")


def _fail(message: str):
    """Bad input: one line, exit 2, nothing written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_source(path: Path) -> dict:
    """The source snapshot, or a one-line error naming the file and what is wrong with it."""
    try:
        source = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        _fail(f"cannot read --source {str(path)!r}: {exc}")
    missing = [k for k in SOURCE_KEYS if k not in source] if isinstance(source, dict) else list(SOURCE_KEYS)
    if missing:
        _fail(f"--source {str(path)!r} is not an op snapshot: it lacks {', '.join(missing)}")
    return source


def _shown(path: Path) -> str:
    """A path as the provenance shows it: relative to the repository when it lies inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def build(source: dict, source_path: str) -> dict:
    src = source["source"]
    commit, day = src["commit"], src["date"][:10]
    return {
        "target": "neuron",
        "provenance": {
            "source": f"github.com/{src['repo']} at commit {commit} ({day}): a public repository holding a "
                      "copy of the development tree of torch-neuronx's native (PrivateUse1) backend, "
                      "read statically (nothing executed); not an AWS release",
            "version": f"development-tree snapshot {commit[:12]} of {day} (no release number)",
            "method": source["method"],
            "superseded_by": f"{RELEASE_TABLE}, the vendor's per-release status table",
            "generated_by": f"tools/build_neuron_optable.py from {source_path}",
            "date": datetime.date.today().isoformat(),
        },
        "native": sorted(set(source["native"]) - set(source["cpu_fallback"])),
        "cpu_fallback": sorted(source["cpu_fallback"]),
        "compile_decomposed": sorted(source["decomposed"]),
        "unsupported_notes": source["unsupported_notes"],
        "dtype_rules": source["dtype_rules"],
        "fallback_message": "generic boxed fallback neuron_cpu_fallback -> at::native::cpu_fallback "
                            "(runs on CPU, copies the result back; logged once per op)",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(DEFAULT_SOURCE), help="op snapshot (default: %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "data" / "targets" / "neuron.json"),
                        help="table to write (default: %(default)s)")
    args = parser.parse_args(argv)
    source_path = Path(args.source)
    table = build(read_source(source_path), _shown(source_path))
    write_json(args.out, table)
    print(f"read {source_path}; wrote {args.out}: {len(table['native'])} native, "
          f"{len(table['cpu_fallback'])} explicit CPU fallbacks, "
          f"{len(table['compile_decomposed'])} compile-time decompositions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
