"""Compile time for one input shape: XLA for a TPU topology (compile-only) beside Inductor on this CPU.

    python benchmarks/bench_xla_compile.py                  # minilm, batch 1, seq 128, v5e:1x1
    python benchmarks/bench_xla_compile.py --batch 8 --topology v6e:1x1

Both compiles start cold in this process. Inductor's on-disk caches point at a fresh temporary
folder (a warm cache would skip the C++ compile); JAX's persistent compilation cache is off, its
default. XLA's figure is lowering (torchax trace to StableHLO) plus the TPU compiler; the one-time
conversion (imports, weights copied into JAX) is printed apart, as a notebook pays it once per
model. Inductor's figure is the first call of torch.compile(module, backend="inductor",
dynamic=False) on real text: Dynamo trace, Inductor code generation, C++ compile, one run.
"""
import argparse
import os
import sys
import tempfile
import time

# Before torch is imported: Inductor reads its cache location once.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="portkit-bench-inductor-")

import torch  # noqa: E402

from portkit import data, models, xla  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a portkit model name (default: minilm)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (default: 128)")
    parser.add_argument("--topology", default="v5e:1x1", choices=list(xla.TOPOLOGIES),
                        help="TPU topology to compile for (default: v5e:1x1)")
    args = parser.parse_args(argv)

    model = models.load(args.model)
    shape = {"batch": args.batch, "seq": args.seq}
    print(f"model {model.name} ({model.parameters / 1e6:.1f} M parameters), batch {args.batch}, seq {args.seq}, "
          f"float32; host: {os.cpu_count()} CPU cores, torch {torch.__version__}")

    start = time.perf_counter()
    report = xla.compile_for_tpu(model, [shape], topology=args.topology)
    wall = time.perf_counter() - start
    result = report.shapes[0]
    if result.status != "compiled":
        print(f"XLA {args.topology}: {result.describe(report.hbm_bytes_per_device)}")
        return 1
    xla_seconds = result.lower_seconds + result.compile_seconds
    print(f"XLA      {args.topology} ({report.headline}): {xla_seconds:.2f} s = lowering "
          f"{result.lower_seconds:.2f} s + TPU compile {result.compile_seconds:.2f} s "
          f"[once per process and model: imports and conversion {wall - xla_seconds:.2f} s]")

    inputs = model.encode(data.load_corpus("stdlib").sample(args.batch, seed=0), pad_to=args.seq)
    compiled = torch.compile(model.module, backend="inductor", dynamic=False)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
    inductor_seconds = time.perf_counter() - start
    print(f"Inductor CPU (first call of torch.compile, cold cache): {inductor_seconds:.2f} s")
    print(f"ratio Inductor / XLA: {inductor_seconds / xla_seconds:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
