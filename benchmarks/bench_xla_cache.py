"""The XLA verdict cache: stage 3b run cold (empty verdict cache) then rerun warm, wall times and ratio.

    python benchmarks/bench_xla_cache.py                    # minilm, targets neuron and tpu, v5e:1x1
    python benchmarks/bench_xla_cache.py --targets tpu --run runs/minilm    # the shapes of a real run folder

Each run is its own fresh process, as a rerun of `portkit run` is, with the same new, empty-at-start
cache root ($PORTKIT_CACHE_DIR, removed at exit). In both, what every run pays before the stage
(the torch, transformers, jax and torchax imports, the model load, libtpu's start-up) is charged to
neither; the time is portkit.stages.xla.stage.run_stage alone: cold, per target the torchax conversion and per
shape the trace and lowering to StableHLO, then the XLA TPU compile; warm, per shape the program key
(model source digests, weight shapes, inputs, versions) and the read of the cached verdict or lowering
figures, with no conversion and no lowering. A second pair of runs (--processes) times each whole
process instead, imports included: a warm run needs no jax, so it imports none.

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
TARGET_RATIO = 20       # a rerun of the xla stage at least 20x faster than its cold run


def _child(args) -> None:
    """One run of the stage in this process; prints one JSON line with its timings."""
    from portkit.models import registry
    from portkit.stages.xla import stage
    from portkit.tpu_compile import compiler
    model = registry.load(args.model)
    if not args.no_preload:
        from jax.experimental import topologies
        compiler.require_xla()                   # imports and libtpu's start-up: charged to neither run
        topologies.get_topology_desc(platform="tpu", topology_name=args.topology, **stage.TOPOLOGIES[args.topology])
    seconds = {}
    section = stage.xla_section

    def timed(model, name, *rest, **kwargs):
        start = time.perf_counter()
        try:
            return section(model, name, *rest, **kwargs)
        finally:
            seconds[name] = time.perf_counter() - start

    stage.xla_section = timed                          # run_stage calls it once per target
    start = time.perf_counter()
    ran = stage.run_stage(model, args.targets, stage.Options.of({"topology": args.topology}), run_dir=args.run)
    wall = time.perf_counter() - start
    shapes = {name: [{"label": s.label, "status": s.status, "cached": s.cached, "lower": s.lower_seconds,
                      "compile": s.compile_seconds} for s in r.shapes]
              for name, r in ran.reports.items() if hasattr(r, "shapes")}
    print(json.dumps({"wall": wall, "targets": seconds, "shapes": shapes}))


def _run(args, cache: str, preload: bool = True) -> dict:
    env = {**os.environ, "PORTKIT_CACHE_DIR": cache}   # portkit.corpora.corpus.CACHE_VARIABLE
    command = [sys.executable, __file__, "--child", "--model", args.model, "--topology", args.topology,
               "--run", args.run, "--targets", *args.targets] + ([] if preload else ["--no-preload"])
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the stage run failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a portkit model name (default: minilm)")
    parser.add_argument("--targets", nargs="+", default=["neuron", "tpu"], help="default: neuron tpu")
    parser.add_argument("--topology", default="v5e:1x1", help="TPU topology (default: v5e:1x1)")
    parser.add_argument("--run", help="a run folder whose compile.json/buckets.json give the shapes")
    parser.add_argument("--processes", action="store_true",
                        help="also time a cold and a warm whole process, imports included (fresh cache)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-preload", action="store_true", help=argparse.SUPPRESS)
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
        if args.processes:
            shutil.rmtree(cache, ignore_errors=True)
            whole = _run(args, cache, preload=False), _run(args, cache, preload=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, run in (("cold", cold), ("warm", warm)):
        parts = ", ".join(f"{t} {s:.2f} s" for t, s in run["targets"].items())
        served = "; ".join(f"{t} {'verdicts' if t == 'tpu' else 'lowerings'} from the cache: "
                           f"{sum(s['cached'] for s in shapes)}/{len(shapes)}" for t, shapes in run["shapes"].items())
        print(f"{name}: run_stage {run['wall']:.2f} s ({parts}); {served}")
    for s in cold["shapes"].get("tpu", []):
        print(f"  tpu {s['label']}: cold lowering {s['lower']:.2f} s + compile {s['compile']:.2f} s")
    for s in warm["shapes"].get("tpu", []):
        print(f"  tpu {s['label']}: warm: cached verdict, not lowered (lowering {s['lower']:.2f} s and compile "
              f"{s['compile']:.2f} s as measured cold)")
    ratio = cold["wall"] / warm["wall"]
    print(f"ratio cold / warm, whole stage: {ratio:.1f}x (target >= {TARGET_RATIO}x: "
          f"{'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    if "tpu" in cold["targets"]:
        print(f"ratio cold / warm, TPU target alone: {cold['targets']['tpu'] / warm['targets']['tpu']:.1f}x")
    if args.processes:
        (c, w) = whole
        print(f"whole process (python start, imports, model load, stage; the cache emptied first): cold "
              f"{c['process']:.2f} s (run_stage {c['wall']:.2f} s), warm {w['process']:.2f} s (run_stage "
              f"{w['wall']:.2f} s): {c['process'] / w['process']:.1f}x; run_stage with its imports: "
              f"{c['wall'] / w['wall']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
