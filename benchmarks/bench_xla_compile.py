"""Compile time for one input shape: XLA for a TPU topology (compile-only) beside Inductor on this CPU,
both timed the same way: start-up and conversion, then the compile.

    python benchmarks/bench_xla_compile.py                  # minilm, batch 1, seq 128, v5e:1x1
    python benchmarks/bench_xla_compile.py --batch 8 --topology v6e:1x1

Both sides start cold in this process, after torch, transformers and portkit are imported and the
model is loaded (paid once, shared, charged to neither side):
- XLA start-up and conversion: the jax and torchax imports, libtpu's start-up, the weights copied into
  JAX (torchax), and the shape traced and lowered to StableHLO. Compile: the XLA TPU compiler alone.
- Inductor start-up: its C++ toolchain (precompiled header, compile workers), paid by compiling a one-op
  function (portkit.targets.backends.warm_inductor). Compile: the first call of torch.compile(module,
  backend="inductor", dynamic=False) on real text: Dynamo trace, code generation, C++ compile and one
  forward pass (timed apart on a second call, and printed).
Every run has fresh caches, so a second run measures the same thing: Inductor's on-disk caches and
portkit's XLA verdict cache point at a new temporary folder (removed at exit), and JAX's persistent
compilation cache is off.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

# Before torch and jax are imported: both read these once.
CACHE = tempfile.mkdtemp(prefix="portkit-bench-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = CACHE
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import torch  # noqa: E402

from portkit.targets import backends  # noqa: E402
from portkit.corpora import corpus  # noqa: E402
from portkit.models import registry  # noqa: E402
from portkit.stages.xla import stage  # noqa: E402
from portkit.tpu_compile import compiler  # noqa: E402

os.environ[corpus.CACHE_VARIABLE] = CACHE        # read at each compile: no XLA verdict comes from a past run


def _xla(model, shape, topology) -> dict | None:
    """Seconds per part of the XLA side, or None (after printing why) when the shape does not compile."""
    start = time.perf_counter()
    compiler.require_xla()                       # jax and torchax imports
    imports = time.perf_counter() - start
    start = time.perf_counter()
    report = stage.compile_for_tpu(model, [shape], topology=topology)
    wall = time.perf_counter() - start
    result = report.shapes[0]
    if result.status != "compiled":
        print(f"XLA {topology}: {result.describe(report.hbm_bytes_per_device)}")
        return None
    convert = wall - result.lower_seconds - result.compile_seconds   # libtpu start-up, weights into JAX
    return {"start-up": imports + convert + result.lower_seconds, "compile": result.compile_seconds,
            "detail": f"imports {imports:.2f} s + libtpu start-up and weights into JAX {convert:.2f} s + "
                      f"trace and lowering to StableHLO {result.lower_seconds:.2f} s"}


def _inductor(model, batch: int, seq: int) -> dict:
    warm = backends.warm_inductor()
    inputs = model.encode(corpus.load_corpus("stdlib").sample(batch, seed=0), pad_to=seq)
    compiled = torch.compile(model.module, backend="inductor", dynamic=False)
    seconds = []
    with torch.no_grad():
        for _ in range(2):                           # the first call compiles, the second only runs
            start = time.perf_counter()
            compiled(**inputs)
            seconds.append(time.perf_counter() - start)
    return {"start-up": warm, "compile": seconds[0],
            "detail": f"toolchain start-up (one-op compile) {warm:.2f} s; compile = first call, of which one "
                      f"forward pass (second call) {seconds[1]:.3f} s"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a portkit model name (default: minilm)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (default: 128)")
    parser.add_argument("--topology", default="v5e:1x1", choices=list(stage.TOPOLOGIES),
                        help="TPU topology to compile for (default: v5e:1x1)")
    args = parser.parse_args(argv)

    model = registry.load(args.model)
    shape = {"batch": args.batch, "seq": args.seq}
    print(f"model {model.name} ({model.parameters / 1e6:.1f} M parameters), batch {args.batch}, seq {args.seq}, "
          f"float32; host: {os.cpu_count()} CPU cores, torch {torch.__version__}; fresh caches")
    xla_side = _xla(model, shape, args.topology)
    if xla_side is None:
        return 1
    inductor_side = _inductor(model, args.batch, args.seq)

    rows = [(f"XLA {args.topology} (compile-only, nothing run on a TPU)", xla_side),
            ("Inductor on this CPU", inductor_side)]
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  {'start-up+conversion':>19}  {'compile':>9}  {'total':>9}")
    for name, side in rows:
        print(f"{name:{width}}  {side['start-up']:>17.2f} s  {side['compile']:>7.2f} s  "
              f"{side['start-up'] + side['compile']:>7.2f} s")
    ratios = [inductor_side[k] / xla_side[k] for k in ("start-up", "compile")]
    total = (inductor_side["start-up"] + inductor_side["compile"]) / (xla_side["start-up"] + xla_side["compile"])
    print(f"{'ratio Inductor / XLA':{width}}  {ratios[0]:>18.1f}x  {ratios[1]:>8.1f}x  {total:>8.1f}x")
    for name, side in rows:
        print(f"  {name.split(' (')[0]}: {side['detail']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(CACHE, ignore_errors=True)
