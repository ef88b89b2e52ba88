"""Stage 4's verdicts on real architectures: what the task metrics decide, next to what the element-wise
assert_close alone would have said (the verdict before the task metrics), per target at its default precision.

    .venv/bin/python benchmarks/bench_verdicts.py [--models minilm gpt2 ...] [--gpu-numerics fp32]

minilm has its real weights; the others are Hugging Face architectures built from small configs with
seeded random weights (portkit.models.registry). Real stdlib texts, batch 4 x 64 tokens, buckets [32, 64], every
precision setting measured, eager emulation. Prints one line per model and target: verdict, what it
rests on, the element-wise result, and each precision setting's task metrics with its vendor-stated cost.
"""
from __future__ import annotations

import argparse
import time

import torch

from portkit.stages.accuracy import stage
from portkit.corpora.corpus import example_batch, load_corpus
from portkit.models import registry
from portkit.targets import numerics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "bert", "gpt2", "llama", "t5", "vit", "lstm"])
    parser.add_argument("--gpu-numerics", default=stage.Options.defaults().gpu_numerics,
                        choices=list(numerics.GPU_NUMERICS))
    args = parser.parse_args()
    corpus = load_corpus()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPU baseline {args.gpu_numerics}")
    for name in args.models:
        start = time.perf_counter()
        m = registry.load(name)
        inputs, described = example_batch(m, corpus if m.takes_text else None, 4, 64, seed=0)
        opts = stage.Options.of({"batch_size": 4, "gpu_numerics": args.gpu_numerics})
        report = stage.check_accuracy(m, inputs, ["neuron", "tpu"], opts, corpus=corpus, buckets=[32, 64],
                                         description=described, scope=stage.Scope(compiled=False, progress=False))
        print(f"\n{name} ({m.kind}, {m.origin}); {described}; {time.perf_counter() - start:.0f} s")
        for t in report.targets.values():
            elementwise = "FAIL" if t.details else "pass"
            print(f"  {t.name} {t.chosen.name}: {t.verdict.upper()} (element-wise assert_close alone: {elementwise})")
            print(f"    {t.chosen.basis()}")
            for r in t.reasons:
                print(f"    reason: {r}")
            for line in t.advice_lines():
                print(f"    {line}")


if __name__ == "__main__":
    main()
