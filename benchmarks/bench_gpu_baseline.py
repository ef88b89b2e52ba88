"""Stage 4's GPU baseline: each GPU setting measured on a real GPU beside portkit's CPU emulation of it.

    .venv/bin/python benchmarks/bench_gpu_baseline.py

minilm (real weights), 64 real stdlib texts padded to 128 tokens; the truth is the model in float64 on the same
GPU. For each setting of numerics.GPU_NUMERICS (fp32, TF32, bf16 and fp16 autocast): the relative L2 error of
the hidden states on real tokens and 1 - cosine of the mean-pooled, normalised embeddings, measured on the GPU
(gpu_baseline.measure) and emulated on the CPU (numerics.emulate), and the ratio emulated/real, beside the
reference figures of an H200. Without a CUDA device it prints one line saying so and exits 0.
"""
from __future__ import annotations

import copy
import platform

import torch

from portkit.core import availability
from portkit.core import placement
from portkit.corpora import corpus
from portkit.models import registry
from portkit.stages.accuracy.comparison import compare
from portkit.targets import gpu_baseline, numerics
from portkit.targets import specs

# Reference figures (relative L2 of the hidden states, 1 - cosine of the embeddings) on an NVIDIA H200 with
# torch 2.11, same model and batch; portkit's emulation came within 0.65-1.13x of each.
REFERENCE = {"fp32": (1.1e-6, 2.5e-13), "tf32": (6.6e-4, 1.7e-7), "bf16_autocast": (6.5e-3, 1.4e-5),
             "fp16_autocast": (8.1e-4, 2.3e-7)}
TEXTS, TOKENS = 64, 128


def errors(out: dict, truth: dict, mask: torch.Tensor) -> tuple[float, float]:
    """(relative L2 of the hidden states on real tokens, 1 - mean cosine of the embeddings) against `truth`."""
    hidden = compare(out["last_hidden_state"], truth["last_hidden_state"], None, mask)
    return hidden["rel_l2"], 1.0 - compare(out["embedding"], truth["embedding"], None)["cosine_mean"]


def ratio(emulated: float, real: float) -> str:
    return f"{emulated / real:.2f}x" if real > 0 else "-"


def main() -> int:
    if not availability.cuda_available():
        print("bench_gpu_baseline: skipped: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    model = registry.load("minilm")
    inputs, described = corpus.example_batch(model, corpus.load_corpus(), TEXTS, TOKENS, seed=0)
    module, mask, device = model.module.eval(), inputs["attention_mask"], specs.get("cuda").device
    with torch.no_grad():   # the truth: float64 on the same GPU
        truth = placement.to_device(copy.deepcopy(module).to(device, torch.float64)(**placement.to_device(
            inputs, device)), "cpu")
    print(f"model minilm, {described}; host {platform.node()}, {gpu_baseline.device_name(device)}, "
          f"torch {torch.__version__}; truth: float64 on the same GPU")
    print(f"{'setting':<14} {'rel L2 GPU':>10} {'emulated':>9} {'ratio':>6} {'reference':>9}   "
          f"{'1-cos GPU':>9} {'emulated':>9} {'ratio':>6} {'reference':>9}")
    for name, precision in numerics.GPU_NUMERICS.items():
        real, _ = gpu_baseline.measure(module, inputs, name, device)
        with torch.no_grad(), numerics.emulate(specs.get("cuda"), precision):
            emulated = module(**inputs)
        (l2, cos), (el2, ecos), (rl2, rcos) = errors(real, truth, mask), errors(emulated, truth, mask), REFERENCE[name]
        print(f"{name:<14} {l2:>10.2g} {el2:>9.2g} {ratio(el2, l2):>6} {rl2:>9.2g}   "
              f"{cos:>9.2g} {ecos:>9.2g} {ratio(ecos, cos):>6} {rcos:>9.2g}")
    print("reference: the published figures of an NVIDIA H200 with torch 2.11 (not measured here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
