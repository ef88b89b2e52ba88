"""Build data/targets/neuron.json from the checked op data of TorchNeuron's development tree.

    python tools/build_neuron_optable.py [--source ../shared/data/neuron_ops_devtree_2026-04.json]

torch-neuronx's compiler and runtime do not install on a CPU host, so the table comes from a
static reading of the backend's public development tree (method recorded in the source file);
the release table aws-neuron/torch-neuronx docs/torch_api_compatibility.md supersedes it. With
torch-neuronx installed on a Trainium host, portkit reads the table live from the dispatcher instead.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from portkit._io import write_json  # noqa: E402

DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "neuron_ops_devtree_2026-04.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(DEFAULT_SOURCE))
    parser.add_argument("--out", default=str(ROOT / "data" / "targets" / "neuron.json"))
    args = parser.parse_args(argv)
    source = json.loads(Path(args.source).read_text())
    src = source["source"]
    table = {
        "target": "neuron",
        "provenance": {
            "source": f"{src['repo']}@{src['commit'][:12]} ({src['date'][:10]})",
            "version": f"development tree {src['date'][:10]}",
            "method": source["method"],
            "note": src.get("note", ""),
            "generated_by": "tools/build_neuron_optable.py from " + Path(args.source).name,
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
    write_json(args.out, table)
    print(f"wrote {args.out}: {len(table['native'])} native, {len(table['cpu_fallback'])} explicit "
          f"CPU fallbacks, {len(table['compile_decomposed'])} compile-time decompositions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
