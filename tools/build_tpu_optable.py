"""Build data/targets/tpu.json from the real torch-tpu wheel, by asking PyTorch's dispatcher.

    python tools/build_tpu_optable.py [--version 0.2.0] [--compare data/sources/torch_tpu_0.2.0_dispatcher_ops.json]

torch_tpu registers itself for PyTorch's backend autoload (entry points loaded by `import torch`:
docs.pytorch.org/docs/stable/accelerator/autoload.html; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off),
so once installed every `import torch` in that environment loads it. This script therefore never
installs it into the running environment: it unpacks the wheel into a temporary folder with
`pip --target`, queries the dispatcher in a child process that has that folder on PYTHONPATH, and
deletes the folder. No TPU is needed: the import registers the kernels without initialising a device.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from portkit.core.atomic_io import write_json  # noqa: E402

DEFAULT_COMPARE = ROOT / "data" / "sources" / "torch_tpu_0.2.0_dispatcher_ops.json"

IMPORT_DEPS = ("absl-py", "portpicker", "frozendict", "immutabledict")
KEYS = ("PrivateUse1", "AutogradPrivateUse1", "AutocastPrivateUse1")
QUERY = f"""
import json, torch, torch_tpu
names = torch._C._dispatch_get_all_op_names()
has = torch._C._dispatch_has_kernel_for_dispatch_key
print(json.dumps({{"torch": torch.__version__,
    "ops": {{key: sorted(o for o in names if has(o, key)) for key in {KEYS!r}}}}}))
"""


def query_wheel(version: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="portkit-torch-tpu-") as tmp:
        site = Path(tmp) / "site"
        # Only the light import-time dependencies; torch and numpy come from this environment,
        # and libtpu too when it is already here (it is large).
        needs = [f"torch-tpu=={version}", *IMPORT_DEPS]
        if importlib.util.find_spec("libtpu") is None:
            needs.append("libtpu")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", str(site), *needs], check=True)
        wheel_name = next((p.name for p in site.glob("torch_tpu-*.dist-info")), f"torch_tpu-{version}")
        env = {**os.environ, "PYTHONPATH": str(site), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
               "TPU_WORKER_HOSTNAMES": "localhost"}
        done = subprocess.run([sys.executable, "-c", QUERY], env=env, capture_output=True, text=True,
                              check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["dist_info"] = wheel_name
    return result


def read_snapshot(path: Path) -> set[str]:
    """The PrivateUse1 names of a dispatcher snapshot, or a one-line error (exit 2): read before the
    wheel is fetched, so a bad --compare costs nothing and writes nothing."""
    try:
        names = json.loads(path.read_text())["PrivateUse1"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read --compare {str(path)!r} as a dispatcher snapshot with a PrivateUse1 "
              f"list: {exc!r}", file=sys.stderr)
        raise SystemExit(2) from None
    return set(names)


def comparison(ops: list[str], reference: set[str], name: str) -> dict:
    mine = set(ops)
    return {"file": name, "same": mine == reference,
            "only_here": sorted(mine - reference), "only_there": sorted(reference - mine)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.2.0", help="torch-tpu version to query (default: %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "data" / "targets" / "tpu.json"),
                        help="table to write (default: %(default)s)")
    parser.add_argument("--compare", default=str(DEFAULT_COMPARE),
                        help="dispatcher snapshot to compare with (default: %(default)s)")
    args = parser.parse_args(argv)
    compare = Path(args.compare)
    reference = read_snapshot(compare)
    try:
        got = query_wheel(args.version)
    except subprocess.CalledProcessError as exc:   # pip cannot fetch that version, or the import fails
        print(f"error: querying torch-tpu=={args.version} failed: {' '.join(map(str, exc.cmd[:4]))} ... "
              f"exited {exc.returncode}; nothing written", file=sys.stderr)
        return 1
    ops = got["ops"]
    table = {
        "target": "tpu",
        "provenance": {
            "source": f"PyPI torch-tpu=={args.version} ({got['dist_info']})",
            "version": args.version,
            "torch": got["torch"],
            "method": "pip install --no-deps --target <tmp>; in a child process with that folder on "
                      "PYTHONPATH: import torch, torch_tpu; every name in "
                      "torch._C._dispatch_get_all_op_names() for which "
                      "torch._C._dispatch_has_kernel_for_dispatch_key(name, KEY) is true, KEY in "
                      + ", ".join(KEYS) + ". native = the aten:: names with a PrivateUse1 kernel.",
            "generated_by": "tools/build_tpu_optable.py",
            "date": datetime.date.today().isoformat(),
        },
        "native": [o for o in ops["PrivateUse1"] if o.startswith("aten::")],
        "native_other_namespaces": [o for o in ops["PrivateUse1"] if not o.startswith("aten::")],
        "autograd": ops["AutogradPrivateUse1"],
        "autocast": ops["AutocastPrivateUse1"],
        "cpu_fallback": [],
        "compile_decomposed": [],
        "fallback_message": "'<op>' is not implemented for TPU. Falling back to CPU",
    }
    compared = table["provenance"]["compared_with"] = comparison(ops["PrivateUse1"], reference, compare.name)
    print(f"compared with {compare}: {'identical' if compared['same'] else 'DIFFERENT'} "
          f"({len(ops['PrivateUse1'])} vs {len(reference)} PrivateUse1 names)")
    write_json(args.out, table)
    print(f"wrote {args.out}: {len(table['native'])} native aten overloads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
