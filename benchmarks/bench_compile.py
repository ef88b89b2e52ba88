"""Stage 2's cost: portkit's emulated backends (checks + target numerics, no codegen) vs plain eager.

    .venv/bin/python benchmarks/bench_compile.py [--rounds 5] [--repeats 15] [--threads 1] [--inductor]
                                                 [--allocator kernels|default]

minilm (real weights), real stdlib texts, torch.no_grad, dynamic=False, one process, side by side:
- compile for a new shape: batch 1 at a sequence length no other compile used (64, 65, ...), the
  backends interleaved in a rotating order, torch.compiler.reset() before each, medians over the
  rounds. "backend" is the time inside the backend (refusal checks, retrace under the target's
  numerics, op table: what portkit adds), wall and this thread's CPU time; "first call" is the whole
  first call (Dynamo's trace, the backend, one forward), beside plain eager's own first call;
- steady forward: batch 8 x 128 compiled once per variant, calls interleaved, medians.
Aims (#12): backend time for a new shape <= 0.5 s; steady forward <= 1.1x plain eager, the TPU's
bf16 rounding of matmul operands included (portkit_tpu). portkit_neuron's default precision rounds
nothing, so its forward shows the cost of running the retraced graph itself.
--allocator kernels (the default) runs the benchmark, eager included, under the malloc settings of the
kernels portkit runs its stages in (portkit.targets.allocator, which the emulated backends also apply with mallopt in
any other process); default: this C library's own (the backends' mallopt turned off).
--inductor adds plain Inductor and the emulated backends with options={"inductor": True} (CPU code
generation; in an Inductor cache of this run's own, after a warm-up that is not counted); slow.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import statistics
import time

import torch
from _inductor_cache import own_inductor_cache

from portkit.targets import allocator
from portkit.targets import backends
from portkit.corpora.corpus import example_batch, load_corpus
from portkit.models import registry

EMULATED = ("portkit_neuron", "portkit_tpu")
COMPILE_AIM_S, FORWARD_AIM = 0.5, 1.1


def _backend(variant: str):
    """A fresh backend per compile (its own checks); "eager" is no compile at all."""
    if variant in ("eager", "inductor"):
        return variant
    name, _, codegen = variant.partition("+")
    return backends.emulated_backend(name.removeprefix("portkit_"), inductor=codegen == "inductor")


def _compiled(module, variant: str, counter=None):
    if variant == "eager":
        return module
    return torch.compile(module, backend=counter or _backend(variant), dynamic=False)


class _CpuTimed:
    """A backend timed by this thread's CPU time as well: on a shared host the wall time of a compile
    also counts other processes' work (a backend's compile runs in the calling thread)."""

    def __init__(self, counter):
        self.counter, self.cpu = counter, []

    def __call__(self, gm, example_inputs, **kwargs):
        start = time.thread_time()
        try:
            return self.counter(gm, example_inputs, **kwargs)
        finally:
            self.cpu.append(time.thread_time() - start)


def _rotated(items, k):
    return items[k % len(items):] + items[:k % len(items)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh shapes compiled per variant")
    parser.add_argument("--repeats", type=int, default=15, help="steady forward calls per variant")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads for the forward timing (the host may be shared)")
    parser.add_argument("--inductor", action="store_true", help="also Inductor code generation (slow)")
    parser.add_argument("--allocator", choices=("kernels", "default"), default="kernels",
                        help="malloc settings: those of portkit's stage kernels, or the C library's defaults")
    args = parser.parse_args()
    settings = allocator.ENVIRONMENT
    if args.allocator == "kernels" and any(os.environ.get(k) != v for k, v in settings.items()):
        # malloc reads its settings when the process starts: run again with them
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **settings})
    if args.allocator == "default":
        if set_here := sorted(k for k in settings if k in os.environ):
            parser.error(f"--allocator default, but the environment sets {set_here}")
        allocator.tune = lambda: False   # the emulated backends' mallopt, off: the C library's own settings
    for name in ("rounds", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    variants = ["eager", *EMULATED]
    warmup = None
    if args.inductor:
        variants += ["inductor", *(f"{v}+inductor" for v in EMULATED)]
        warmup = backends.warm_inductor()
    model = registry.load("minilm")
    corpus = load_corpus()
    text = max(corpus.sample(50, seed=0), key=len)

    backend_s = {v: [] for v in variants if v != "eager"}
    backend_cpu_s = {v: [] for v in backend_s}
    first_s = {v: [] for v in variants}
    length = 63
    with torch.no_grad():
        model.module(**model.encode([text], pad_to=length))   # the process's first forward, not counted
        for r in range(args.rounds):
            for variant in _rotated(variants, r):
                length += 1
                inputs = model.encode([text], pad_to=length)
                torch.compiler.reset()
                counter = backends.CompileCounter(_backend(variant)) if variant != "eager" else None
                timed = _CpuTimed(counter) if counter is not None else None
                start = time.perf_counter()
                _compiled(model.module, variant, timed)(**inputs)
                first_s[variant].append(time.perf_counter() - start)
                if counter is not None:
                    assert len(counter.events) == 1 and not counter.events[0].cache_hit, counter.events
                    backend_s[variant].append(counter.events[0].seconds)
                    backend_cpu_s[variant].extend(timed.cpu)

    inputs, described = example_batch(model, corpus, 8, 128, seed=0)
    torch.compiler.reset()
    compiled, forward_s, forward_cpu_s = {}, {v: [] for v in variants}, {v: [] for v in variants}
    with torch.no_grad():
        for variant in variants:
            compiled[variant] = _compiled(model.module, variant)
            for _ in range(3):
                compiled[variant](**inputs)
        for rep in range(args.repeats):
            for variant in _rotated(variants, rep):
                start, start_cpu = time.perf_counter(), time.thread_time()
                compiled[variant](**inputs)
                forward_s[variant].append(time.perf_counter() - start)
                forward_cpu_s[variant].append(time.thread_time() - start_cpu)
    torch.compiler.reset()

    b = {v: statistics.median(s) for v, s in backend_s.items()}
    b_cpu = {v: statistics.median(s) for v, s in backend_cpu_s.items()}
    first = {v: statistics.median(s) for v, s in first_s.items()}
    f = {v: statistics.median(s) for v, s in forward_s.items()}
    f_cpu = {v: statistics.median(s) for v, s in forward_cpu_s.items()}
    print(f"model minilm, torch {torch.__version__}, {args.threads} thread(s), allocator {args.allocator} ("
          + (", ".join(f"{k}={v}" for k, v in settings.items()) if args.allocator == "kernels" else "defaults")
          + f"); new shape: batch 1, {args.rounds} "
          f"fresh lengths per variant; forward: {described}, {args.repeats} interleaved repeats"
          + (f"; Inductor warm-up {warmup:.1f} s (not counted)" if warmup is not None else ""))
    print("wall time, and this thread's CPU time in brackets (the forward runs on this one thread)")
    print(f"{'variant':24s} {'backend':>19s} {'first call':>10s} {'forward':>19s} {'fwd/eager':>16s}")
    for v in variants:
        backend = f"{b[v]:6.3f} s ({b_cpu[v]:5.3f})" if v in b else f"{'-':>19s}"
        print(f"{v:24s} {backend} {first[v]:8.3f} s {f[v] * 1e3:7.1f} ms ({f_cpu[v] * 1e3:6.1f}) "
              f"{f[v] / f['eager']:6.3f}x ({f_cpu[v] / f_cpu['eager']:5.3f})")

    def verdict(value, aim):
        return f"{value:.3f} {'met' if value <= aim else 'NOT met'}"
    for v in EMULATED:
        print(f"aims {v}: new-shape backend <= {COMPILE_AIM_S} s: wall {verdict(b[v], COMPILE_AIM_S)}, CPU "
              f"{verdict(b_cpu[v], COMPILE_AIM_S)}; forward <= {FORWARD_AIM}x eager: wall "
              f"{verdict(f[v] / f['eager'], FORWARD_AIM)}, CPU {verdict(f_cpu[v] / f_cpu['eager'], FORWARD_AIM)}")


if __name__ == "__main__":
    with own_inductor_cache() if "--inductor" in __import__("sys").argv else contextlib.nullcontext():
        main()
