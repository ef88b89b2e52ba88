"""The XLA verdict cache (issue #12): stage 3b run cold (empty verdict cache) then rerun warm, wall times and ratio.

    python benchmarks/bench_xla_cache.py                    # minilm, targets neuron and tpu, v5e:1x1
    python benchmarks/bench_xla_cache.py --targets tpu --run runs/minilm    # the shapes of a real run folder

Each run is its own fresh process, as a rerun of `portkit run` is, with the same new, empty-at-start
cache root ($PORTKIT_CACHE_DIR, removed at exit). In both, what every run pays before the stage
(the torch, transformers, jax and torchax imports, the model load, libtpu's start-up) is charged to
neither; the time is portkit.xla.run_stage alone: per target the torchax conversion, per shape the
trace and lowering to StableHLO (which the cache key needs), then the XLA TPU compile (cold) or the
read of its cached verdict (warm). Neuron's check is a StableHLO lowering with no compile, so it is
never cached and costs the same in both runs; its time is printed apart.

Without --run the shapes are stage 3's kind of plan written into a temporary run folder: batch 1 at
sequence lengths 64, 128, 256 and 512 (powers of two up to minilm's 512 tokens).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BUCKETS = [64, 128, 256, 512]
TARGET_RATIO = 20       # issue #12: a rerun of the xla stage at least 20x faster than its cold run


def _child(args) -> None:
    """One run of the stage in this process; prints one JSON line with its timings."""
    from jax.experimental import topologies

    from portkit import models, xla, xla_compile
    model = models.load(args.model)
    xla_compile.require_xla()                       # imports and libtpu's start-up: charged to neither run
    topologies.get_topology_desc(platform="tpu", topology_name=args.topology, **xla.TOPOLOGIES[args.topology])
    seconds = {}
    section = xla.xla_section

    def timed(model, name, *rest, **kwargs):
        start = time.perf_counter()
        try:
            return section(model, name, *rest, **kwargs)
        finally:
            seconds[name] = time.perf_counter() - start

    xla.xla_section = timed                          # run_stage calls it once per target
    start = time.perf_counter()
    stage = xla.run_stage(model, args.targets, args.run, topology=args.topology)
    wall = time.perf_counter() - start
    shapes = {name: [{"label": s.label, "status": s.status, "cached": s.cached, "lower": s.lower_seconds,
                      "compile": s.compile_seconds} for s in r.shapes]
              for name, r in stage.reports.items() if hasattr(r, "shapes")}
    print(json.dumps({"wall": wall, "targets": seconds, "shapes": shapes}))


def _run(args, cache: str) -> dict:
    env = {**os.environ, "PORTKIT_CACHE_DIR": cache}   # portkit.data.CACHE_VARIABLE
    command = [sys.executable, __file__, "--child", "--model", args.model, "--topology", args.topology,
               "--run", args.run, "--targets", *args.targets]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the stage run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a portkit model name (default: minilm)")
    parser.add_argument("--targets", nargs="+", default=["neuron", "tpu"], help="default: neuron tpu")
    parser.add_argument("--topology", default="v5e:1x1", help="TPU topology (default: v5e:1x1)")
    parser.add_argument("--run", help="a run folder whose compile.json/buckets.json give the shapes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    scratch = tempfile.mkdtemp(prefix="portkit-bench-xla-cache-")
    try:
        if args.run is None:
            args.run = os.path.join(scratch, "run")
            os.makedirs(args.run)
            plan = {"planner": "pow2", "shapes": [{"batch": 1, "seq": s} for s in BUCKETS]}
            with open(os.path.join(args.run, "buckets.json"), "w") as handle:
                json.dump({"targets": {t: {"chosen": plan} for t in args.targets}}, handle)
        cache = os.path.join(scratch, "cache")
        print(f"model {args.model}, targets {' '.join(args.targets)}, topology {args.topology}, shapes from "
              f"{args.run}; host: {os.cpu_count()} CPU cores; each run a fresh process, the cache empty at the start")
        cold, warm = _run(args, cache), _run(args, cache)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, run in (("cold", cold), ("warm", warm)):
        parts = ", ".join(f"{t} {s:.2f} s" for t, s in run["targets"].items())
        served = sum(s["cached"] for shapes in run["shapes"].values() for s in shapes)
        total = sum(len(shapes) for t, shapes in run["shapes"].items() if t == "tpu")
        print(f"{name}: run_stage {run['wall']:.2f} s ({parts}); TPU verdicts from the cache: {served}/{total}")
    for s in cold["shapes"].get("tpu", []):
        print(f"  tpu {s['label']}: cold lowering {s['lower']:.2f} s + compile {s['compile']:.2f} s")
    for s in warm["shapes"].get("tpu", []):
        print(f"  tpu {s['label']}: warm lowering {s['lower']:.2f} s + cached verdict (compile {s['compile']:.2f} s "
              "as measured cold)")
    ratio = cold["wall"] / warm["wall"]
    print(f"ratio cold / warm, whole stage: {ratio:.1f}x (target >= {TARGET_RATIO}x: "
          f"{'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    if "tpu" in cold["targets"]:
        print(f"ratio cold / warm, TPU target alone: {cold['targets']['tpu'] / warm['targets']['tpu']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
