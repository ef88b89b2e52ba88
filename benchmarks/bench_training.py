"""Training (#17): the emulated backends' cost on a training step against eager, and packing against padding.

    .venv/bin/python benchmarks/bench_training.py [--model minilm] [--steps 8] [--batch-size 8] [--seq-len 128]

One process, side by side, on real stdlib texts:
- step time: one AdamW step (forward, loss, backward, optimizer; no gradient-norm bookkeeping) of the
  model's own loss (training.TrainingStep), each variant on its own copy of the loaded weights:
  plain eager float32; eager under the TPU's numerics (numerics.emulate, bf16 matmul operands); and
  torch.compile with portkit_tpu and portkit_neuron (the joint graph split by AOTAutograd, each half
  retraced under the target's numerics and run eagerly). The first (compiling) step of each variant is
  a warm-up, not counted; then the variants' steps are interleaved in a rotating order, medians.
  Aim: compiled step <= 1.2x plain eager.
- tokens per step: real (non-padding) tokens in a batch of texts padded one a row against the same
  batch shape packed with whole texts (training.tokens_per_step), for a causal LM on MiniLM's tokenizer.
Timings on a shared CPU are noisy: compare the ratios, measured side by side, not the seconds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from portkit.corpora.corpus import load_corpus
from portkit.models import registry
from portkit.workloads import training

STEP_AIM = 1.2
VARIANTS = (("eager", None, False), ("eager under tpu numerics", "tpu", False),
            ("portkit_tpu", "tpu", True), ("portkit_neuron", "neuron", True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a portkit model with a training loss (minilm, gpt2, llama)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant, after one warm-up step")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (the host may be shared)")
    args = parser.parse_args()
    for name in ("steps", "batch_size", "seq_len", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    model, corpus = registry.load(args.model), load_corpus("stdlib")
    batches = training.batches(model, corpus, args.steps + 1, args.batch_size, args.seq_len)
    steps = {label: training.TrainingStep(model, 1e-5, target, None, compiled) for label, target, compiled in VARIANTS}
    warmup, times = {}, {label: [] for label in steps}
    for label, step in steps.items():
        start = time.perf_counter()
        step(batches[0], norms=False)
        warmup[label] = time.perf_counter() - start
    labels = list(steps)
    for i, batch in enumerate(batches[1:]):
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            start = time.perf_counter()
            steps[label](batch, norms=False)
            times[label].append(time.perf_counter() - start)
    torch.compiler.reset()
    eager = statistics.median(times["eager"])
    print(f"{model.name}: one AdamW training step ({training.loss_for(model)[0]}), batch {args.batch_size} x "
          f"{args.seq_len}, {args.threads} thread(s), median of {args.steps} interleaved steps")
    for label in labels:
        median = statistics.median(times[label])
        aim = f"  (aim <= {STEP_AIM}x: {'met' if median / eager <= STEP_AIM else 'NOT met'})" \
            if steps[label].compiled else ""
        print(f"  {label:26s} {median * 1e3:8.1f} ms  {median / eager:5.2f}x eager   first step "
              f"{warmup[label]:6.2f} s{aim}")
    lm = registry.load("gpt2")   # tokens per step need a language model; gpt2 shares MiniLM's tokenizer
    found = training.tokens_per_step(lm, corpus, args.batch_size, args.seq_len, steps=64)
    print(f"tokens per step on {corpus.name}, batch {args.batch_size} x {args.seq_len} ({found['slots_per_step']} "
          f"slots), 64 steps: padded {found['padded_tokens_per_step']:.0f} real tokens "
          f"({found['padded_fill']:.0%} of the slots), packed {found['packed_tokens_per_step']} "
          f"({found['packed_texts_per_step']:.1f} texts a step): packed / padded = {found['packed_over_padded']:.2f}x")


if __name__ == "__main__":
    main()
