"""Compile-only check of a Llama-3-8B-sized config (no weights) for TPU v5e 2x4, sharded FSDP-style.

    .venv/bin/python benchmarks/bench_sharded.py [--model llama3-8b] [--topology v5e:2x4] [--batch 8] [--seq 1024]

The model is built from its published config on the meta device (portkit.models.meta_device) and
compiled by the real XLA TPU compiler (JAX + libtpu, compile-only) with its weights sharded over the
topology's devices (portkit.tpu_compile.sharded). Each run is in a fresh child process, so its peak host
memory (resource.getrusage maxrss of that child) is this check alone. Aim: under 4 GiB. Prints the
compile verdict, HBM per device, collectives, the time to build, lower and compile, and the peak.
The verdict cache is set to a fresh temporary folder, so the compile is measured, not read back.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from portkit.models import meta_device
from portkit.targets import capacity
from portkit.tpu_compile import sharded
name, topology, batch, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
m = meta_device.build(name)
built = time.perf_counter() - start
r = sharded.compile_sharded(m, [meta_device.text_shape(m, batch, seq)], topology)
x = r.shapes[0]
roof = capacity.roofline(r, x, tokens=batch * seq) if x.status == "compiled" else None
print(json.dumps({"parameters": r.parameters, "parameter_bytes": r.parameter_bytes, "build_s": built,
                  "lower_s": x.lower_seconds, "compile_s": x.compile_seconds, "status": x.status,
                  "describe": x.describe(r.hbm_bytes_per_device), "collectives": x.collectives,
                  "total_s": time.perf_counter() - start, "roofline": roof,
                  "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--topology", default="v5e:2x4")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PORTKIT_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", CHILD, a.model, a.topology, str(a.batch), str(a.seq)],
                             env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"child failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    gib = r["maxrss_bytes"] / 2**30
    print(f"{a.model} ({r['parameters'] / 1e9:.2f} B parameters, {r['parameter_bytes'] / 2**30:.1f} GiB of weights "
          f"never allocated) on {a.topology}, batch {a.batch} x seq {a.seq}:")
    print(f"  {r['describe']}")
    print(f"  collectives in the compiled HLO: {r['collectives']}")
    print(f"  build {r['build_s']:.1f} s, lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s, "
          f"child total {r['total_s']:.1f} s")
    if r["roofline"]:
        f = r["roofline"]
        print(f"  roofline ({f['label']}; peaks: {f['source']}): {f['tokens_per_second_per_chip']:,.0f} tokens/s "
              f"per chip, {f['bound']}-bound, step >= {f['step_seconds'] * 1e3:.1f} ms")
    print(f"  peak host memory (child maxrss): {gib:.2f} GiB — aim < 4 GiB: {'met' if gib < 4 else 'NOT met'}")


if __name__ == "__main__":
    main()
