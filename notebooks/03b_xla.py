# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Stage 3b — The real XLA compiler, without a TPU
#
# TorchTPU compiles through OpenXLA. JAX with libtpu compiles for a **real TPU topology** on this CPU host
# (compile-only devices: nothing executes on a TPU), and torchax runs the PyTorch model as a JAX function.
# So every shape the workbook uses — stage 2's fixed shape and stage 3's buckets — gets the real compiler's
# verdict: compiled or not, HBM per device, FLOPs, and whether it fits the chip. For Neuron (neuronx-cc is
# not installable here) the same conversion stops at StableHLO: a lowering check, not a Neuron compile.
#
# Each TPU verdict is kept in portkit's verdict cache (`$PORTKIT_CACHE_DIR`, default `~/.cache/portkit`):
# a rerun reads a shape's verdict back instead of compiling it again, and says so, with the compile
# seconds measured the first time.
#
# Logic: `portkit/stages/xla/stage.py` (compiles: `portkit/tpu_compile/compiler.py`).
# Needs `pip install 'portkit[xla]'`; without
# it this stage says so and skips.

# %% tags=["parameters"]
model = "minilm"  # model: a portkit name, a local HF directory, module:factory, or a real-size config (llama3-8b)
targets = ["neuron", "tpu"]  # tpu: real XLA compile; neuron: StableHLO lowering check; cpu/cuda: skipped
out_dir = "../runs/notebook"  # run folder: shapes come from compile.json / buckets.json there; writes xla.json
topology = "v5e:1x1"  # TPU topology: v5e, v6e (1x1, 2x2, 2x4), v5p (2x2x1, 2x2x2), v4:2x2x1, tpu7x:2x2x1
dtype = "float32"  # dtype the model is compiled in: float32 or bfloat16
batch_size = 1  # batch of the shape checked when no earlier stage chose shapes
seq_len = 128  # sequence length checked when no earlier stage chose shapes
max_shapes = 4  # at most this many shapes per target (the largest are kept)
largest_batch = False  # also search each TPU shape's largest batch that fits HBM (a few more compiles a shape)
workload = "inference"  # train: the whole training step too; generate: prefill and decode with the KV cache
scale_topologies = ["v5e:1x1", "v5e:2x2", "v5e:2x4"]  # real-size model: topologies tried, fewest chips first
scale_batch = 8  # real-size model: batch checked (split data-parallel over the devices)
scale_seq = 1024  # real-size model: sequence length checked
scale_buckets = []  # real-size model: sequence buckets whose largest fitting batch is searched ([]: scale_seq)

# %%
from portkit.runfolder import environment
from portkit.stages import options
from portkit.stages.xla.stage import Options, describe, load, plot_hbm, run_stage, shape_table

# %%
model, targets, out = options.common(model, targets, out_dir)
opts = Options.of(globals(), model=model)   # this stage's parameters, checked
opts

# %%
print(environment.block(targets))

# %% [markdown]
# ## The shapes to check, and where they come from
#
# A real-size model named by its published config (`llama3-8b`, `llama3-70b`) is built on the meta device:
# shapes and dtypes, no weights in memory. The stages that need values skipped it; here it is compiled
# with its weights sharded FSDP-style and the batch split data-parallel over each of `scale_topologies`,
# fewest chips first, until one fits (`portkit/stages/xla/realsize.py`).

# %%
m = load(model)
print(describe(m))

# %%
shape_table(out, targets, m, opts=opts)

# %% [markdown]
# ## Compile (TPU) or lower (Neuron) every shape
#
# With `largest_batch`, each TPU shape's largest batch that fits HBM. For a real-size model: the smallest
# topology that fits, the largest batch per bucket that fits HBM
# (a search over compiles whose boundary is the compiler's own out-of-HBM verdict), and capacity per chip,
# TPU from the compiler's cost analysis, Neuron from the FLOPs counted on the graph: estimates, not
# measurements. `benchmarks/bench_sharded.py` measures what such a compile takes on this host (time and memory).

# %%
stage = run_stage(m, targets, opts, run_dir=out)
stage

# %% [markdown]
# ## Training (workload "train"): the whole step compiled for the topology
#
# The model's own loss and its gradients (`jax.value_and_grad` over the torchax-converted module), then AdamW
# in float32 with the weights and moments updated in place, compiled by XLA for `topology` at
# `batch_size` x `seq_len` of real text (`portkit/stages/xla/training.py`). Its HBM per device in parts that add up
# to the compiler's total, and the largest micro-batch that fits one device (a compile per try).

# %%
for name, step in stage.training.items():
    print(f"{name}: {step['summary']}")
    if step.get("breakdown"):
        plot_hbm({f"training step, batch {step['batch']}": step["breakdown"]}, step["hbm_bytes_per_device"]);

# %% [markdown]
# ## Generation (workload "generate"): prefill and decode with the KV cache in HBM
#
# The prefill graph of the largest prompt bucket and the decode step of the largest context bucket of
# stage 3's serving plan, each the model over a static KV cache it is given and returns updated (donated,
# so HBM holds it once), compiled for `topology` at `batch_size`; HBM in parts, and the largest batch whose
# decode step fits one device at that context (`portkit/stages/xla/generation.py`).

# %%
for name, served in stage.serving.items():
    print(f"{name}: {served['summary']}")
    graphs = {f"{g} ({served[g]['tokens']} into {served[g]['context']})": served[g]["breakdown"]
              for g in ("prefill", "decode") if served.get(g, {}).get("breakdown")}
    if graphs:
        plot_hbm(graphs, served["decode"]["hbm_bytes_per_device"]);

# %% [markdown]
# ## Save the result for the later stages and the report

# %%
stage.save(out / "xla.json")
print(f"wrote {out / 'xla.json'}")
print(stage.summary())
