"""Two varying dimensions: a grid bucket plan (portkit/planning/grid.py) against the best one-dimensional plan, for
an encoder-decoder model whose source and target lengths both vary with the data.

    .venv/bin/python benchmarks/bench_grid.py          # ~1-2 min: 4 real XLA compiles, FLOPs counted

The model: portkit's T5 (2+2 layers, random weights) declared with two varying dimensions (portkit/models/inputs.py):
`source` (encoder tokens) and `target` (decoder tokens). The data: the standard library's docstrings that
have a summary paragraph, the summary as the target and the rest as the source (real pairs, MiniLM's
tokenizer, at most 512 tokens each). The prices, measured here and labelled:
- one cell's compile, TPU: the real XLA compile for v5e:1x1 (compile-only) of four cells, fitted as
  a + s1 * source + s2 * target; Neuron: portkit's cited estimate per graph (economics.neuron_estimate);
- one padded position, per dimension and target: the FLOPs it adds, counted on the graph from the (64, 16)
  cell, at the chip's peak bf16 (grid_costs.padding_prices: an estimate, labelled).
Priced for stage 3's default serve_requests. Prints each target's grid plan, its best 1-D plan
(one dimension bucketed and the other padded to its longest, or one shared length), and the ratio of their
total costs (warm-up compiles + padded compute), with CPU time beside wall time.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch
from torch import nn

from portkit.stages.buckets import stage
from portkit.corpora.corpus import load_corpus
from portkit.planning import economics
from portkit.planning import grid
from portkit.stages.buckets import grid_costs
from portkit.models import inputs
from portkit.models import registry

REQUESTS = stage.Options.defaults().serve_requests     # the notebook's default
CORNERS = ((64, 512), (16, 256))       # each dimension's short corner and longest size
CELLS = ((32, 8), (256, 8), (32, 64), (256, 64))


class T5Pairs(nn.Module):
    """T5 with its decoder fed the target (teacher forcing): source and target lengths vary apart."""

    def __init__(self, t5):
        super().__init__()
        self.model = t5

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return {"logits": self.model(input_ids=input_ids, attention_mask=attention_mask,
                                     decoder_input_ids=decoder_input_ids, use_cache=False).logits}


def declared_t5() -> registry.LoadedModel:
    base = registry.load("t5")
    tok = base.tokenizer

    def build(pairs, sizes):
        src = tok([s for s, _ in pairs], padding="max_length", max_length=sizes["source"], truncation=True,
                  return_tensors="pt")
        tgt = tok([t for _, t in pairs], padding="max_length", max_length=sizes["target"], truncation=True,
                  return_tensors="pt")
        return {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"],
                "decoder_input_ids": tgt["input_ids"]}

    def measure(pairs):
        count = [len(x) for x in tok([s for s, _ in pairs] + [t for _, t in pairs], verbose=False)["input_ids"]]
        return {"source": count[:len(pairs)], "target": count[len(pairs):]}

    decl = inputs.Declaration(
        inputs=(inputs.TensorSpec("input_ids", torch.long, ("batch", "source")),
                inputs.TensorSpec("attention_mask", torch.long, ("batch", "source")),
                inputs.TensorSpec("decoder_input_ids", torch.long, ("batch", "target"))),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim("source", varies=True, max=512),
              inputs.Dim("target", varies=True, max=512)),
        build=build, measure=measure, outputs=(inputs.Output("logits", inputs.SEQ2SEQ_LM),), data=inputs.TEXT,
        masks={"source": "attention_mask"}, item_label="(body, summary) pairs")
    return registry.LoadedModel("t5-pairs", inputs.SEQ2SEQ_LM, T5Pairs(base.module.model).eval(), base.origin,
                              tokenizer=tok, declaration=decl)


def pairs_from(corpus) -> list[tuple[str, str]]:
    out = []
    for text in corpus.texts:
        summary, sep, body = text.partition("\n\n")
        if sep and summary.strip() and body.strip():
            out.append((body, summary))
    return out


def xla_cells(model) -> tuple[callable, str]:
    from portkit.tpu_compile import compiler
    points = []
    for a, b in CELLS:
        shape = {"input_ids": ((1, a), "int64"), "attention_mask": ((1, a), "int64"),
                 "decoder_input_ids": ((1, b), "int64")}
        seconds, source = compiler.compile_seconds(model, shape, "v5e:1x1")
        if seconds is None:
            raise SystemExit(f"no XLA compile for cell {a}x{b}: {source}")
        points.append((a, b, seconds))
        print(f"  XLA v5e:1x1 compile, source {a} x target {b}: {seconds:.2f} s ({source})")
    x = np.array([[1, a, b] for a, b, _ in points], dtype=float)
    coef = np.linalg.lstsq(x, np.array([s for *_, s in points]), rcond=None)[0]
    floor = min(s for *_, s in points)
    label = (f"measured XLA at {len(points)} cells, fitted {coef[0]:.2f} + {coef[1]:.4f} x source + "
             f"{coef[2]:.4f} x target s")
    return (lambda a, b: max(floor, coef[0] + coef[1] * a + coef[2] * b)), label


def main() -> None:
    wall, cpu = time.perf_counter(), os.times()
    model = declared_t5()
    pairs = pairs_from(load_corpus("stdlib"))
    measured = model.declaration.lengths(pairs)
    lengths = np.column_stack([np.minimum(measured["source"], 512), np.minimum(measured["target"], 512)])
    p = {d: np.percentile(lengths[:, i], [50, 90, 99]).astype(int).tolist() for i, d in enumerate(("source", "target"))}
    print(f"{len(pairs)} (body, summary) pairs from the stdlib docstrings; tokens p50/p90/p99: source {p['source']}, "
          f"target {p['target']}")
    tpu, tpu_label = xla_cells(model)
    neuron = economics.neuron_estimate(model.parameters)
    for target, price, label in (("tpu", tpu, tpu_label), ("neuron", lambda a, b: neuron.seconds(a), neuron.label())):
        prices = grid_costs.padding_prices(model, CORNERS, target)
        per_token = tuple(p.seconds for p in prices)
        found = grid.compare(lengths, ("source", "target"), price, per_token, requests=REQUESTS)
        print(f"\n{target} (emulated; compile: {label}; for {REQUESTS:,} requests)")
        print(f"  padded position: source {prices[0].label()}; target {per_token[1]:.2e} s")
        print(f"  grid plan:        {found['grid']}")
        print(f"  best 1-D plan:    {found['one_dimensional']}")
        print(f"  ratio grid / best 1-D total cost = {found['ratio']:.3f}"
              + (f" ({found['k_max_binds']})" if found["k_max_binds"] else ""))
    used = os.times()
    print(f"\nwall {time.perf_counter() - wall:.1f} s, CPU {used.user - cpu.user + used.system - cpu.system:.1f} s "
          f"(user+sys)")


if __name__ == "__main__":
    main()
