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
# # Stage 4 — Accuracy
#
# Does the model compute the same thing on the target? The **reference** is the model as written, eager
# on the CPU (float32, and float64 where the model computes in it), with a second float64 reference that
# shows how far float32 itself is from exact; where float64 runs as float32 on the target, the error is
# split by cause (the cast alone, the precision's rounding). The **target**
# is the device in native mode; in emulated mode, the CPU under the target's documented numerics: float64
# run as float32, and its matmul precision (TPU default: operands rounded to bf16, one pass, fp32
# accumulation; Neuron `--auto-cast` none / matmult / all), applied to the model as stage 2 compiles it
# (its emulated backends `portkit_neuron` / `portkit_tpu`) and padded to stage 3's buckets. Compared per
# output, per bucket, and per layer.
#
# **The verdict is the task's**: each output kind's task metrics against their budgets (embeddings: cosine
# to the reference and top-5 nearest-neighbour agreement over a corpus sample; classifiers: top-1
# agreement; language models: greedy-token agreement, KL and perplexity change), and **against today's
# GPU** (`gpu_numerics`: on the GPU where one is present, else emulated): a target whose error against
# float64 is within `baseline_factor` times the GPU setup's own is no regression and passes; beyond it the
# task metrics decide (a large ratio to an fp32 GPU, whose own error is float32 rounding, is no regression by
# itself). The task metrics are
# decided on a sample of the corpus (`accuracy.TASK_ITEMS` items, for the precision judged), each with its n
# and 95% interval (Wilson for a rate, a seeded bootstrap otherwise); one whose
# interval straddles its budget is **inconclusive**, never a pass. A FAIL names the metric, its budget and
# the first module where the error enters; `torch.testing.assert_close` at the dtype tolerance stays as
# detail and does not decide. A stream whose state drifts is a blocker finding of its target. Each
# precision setting is measured, next to the matmul cost its vendor documents. Where the target's
# compiler refuses the model (a dynamic shape after a graph break, say), that refusal is a blocker for
# the report and the numerics are judged in eager emulation, labelled so.
#
# Logic: `portkit/stages/accuracy/stage.py`; its tolerance policy: `portkit/targets/tolerance.py`.
# Headless: `portkit run --stages accuracy`.

# %% tags=["parameters"]
model = "minilm"  # model: a portkit name (see portkit.models.registry.SOURCES), a local HF directory, or module:factory
targets = ["neuron", "tpu"]  # targets to check: neuron, tpu, cpu, cuda
out_dir = "../runs/notebook"  # folder holding earlier stages' JSON (buckets.json); accuracy.json is written here
corpus = "stdlib"  # stdlib docstrings, a .txt/.jsonl/.csv file (audio models: spoken), a folder of .wav/.flac or images
text_column = "text"  # column that holds the text in a .jsonl/.csv corpus
batch_size = 4  # texts in the compared batch, and in each bucket's batch
seq_len = 64  # tokens every text of the main batch is padded or truncated to
seed = 0  # which texts are sampled
precision = {}  # setting judged per target, e.g. {"tpu": "highest", "neuron": "matmult"}; others: their default
tolerances = {}  # [rtol, atol] per compute dtype, e.g. {"bfloat16": [3e-2, 1e-3]}; others: tolerance.DEFAULT_TOLERANCES
task_bounds = {}  # verdict budgets, e.g. {"cosine": 0.9999, "baseline_factor": 2}; others: DEFAULT_TASK_BOUNDS
gpu_numerics = "fp32"  # how the model runs on the GPU today, the baseline: fp32, tf32, bf16_autocast, fp16_autocast
default_buckets = None  # boundaries when out_dir holds no buckets.json from stage 3; None: accuracy.DEFAULT_BUCKETS
workload = "inference"  # "inference"; "train": AdamW steps too; "generate" (causal LMs, encoder-decoders)
new_tokens = 16  # tokens each prompt generates when workload is "generate"
train_steps = 20  # AdamW steps (one batch of batch_size x seq_len real texts each) when workload is "train"

# %%
from IPython.display import display
from portkit import models
from portkit.runfolder import environment, results
from portkit.stages import options
from portkit.targets import tolerance
from portkit.workloads import streaming
from portkit.stages.accuracy.stage import (Options, Scope, bucket_plan, check_accuracy, check_generation,
    check_training, target_side)
from portkit.corpora.corpus import corpus_for, example_batch

# %%
model, targets, out = options.common(model, targets, out_dir)
results.skip_if_abstract(model, out, "accuracy", targets=targets)  # no weights: stage 3b checks it
opts = Options.of(globals(), model=model)   # this stage's parameters, checked
print(tolerance.describe(opts.tolerances, opts.task_bounds))
opts

# %%
print(environment.block(targets))

# %% [markdown]
# ## The model, one batch of real inputs, the bucket plan, and how each target runs
#
# The bucket boundaries come from stage 3 (`buckets.json` in `out_dir`) when it ran, or from the plans it chose
# before its replay (`buckets.plan.json`: a run starts this stage on them), else from the parameter.
# The chosen precision's outputs and buckets run compiled with the target's backend when stage 2's backends
# are present; per-layer hooks cannot see inside a compiled graph, so the layers run in eager emulation.

# %%
m = models.load(model)
print(m.summary())

# %%
texts = corpus_for(m, opts.corpus, opts.text_column)
inputs, described = example_batch(m, texts, batch_size=opts.batch_size, seq_len=opts.seq_len, seed=opts.seed)
print(described)

# %%
plan = bucket_plan(out, targets, opts.default_buckets)

# %%
compiled = target_side(targets)

# %% [markdown]
# ## Reference against target, for every precision setting
#
# One reference pass records every module's output; each eager target pass is compared module by module
# as it runs. The verdict is for the chosen precision (each target's default unless `precision` says
# otherwise), judged on the compiled model where it is compiled; under each target, the reasons for a
# failed verdict and what to change, from what was measured.

# %%
report = check_accuracy(m, inputs, targets, options=opts, corpus=texts, buckets=plan, description=described,
                                 scope=Scope(compiled=compiled))
report

# %% [markdown]
# ## Outputs: errors at real positions, and the tolerance they are held to

# %%
report.outputs_table()

# %% [markdown]
# ## Every precision setting, with the flag that selects it on hardware: what it buys and what it costs

# %%
report.precision_table()

# %% [markdown]
# ## Per layer: where the error enters (error against depth), and per bucket

# %%
report.plot();

# %%
for name in targets:
    display(report.layer_table(name))

# %%
report.bucket_table()

# %% [markdown]
# ## Save the result for the report

# %%
report.save(out / "accuracy.json")
print(f"wrote {out / 'accuracy.json'}")

# %% [markdown]
# ## State carried across a real stream (a model with a streaming step)
#
# The step is compiled once per chunk shape for each target, warmed up, then carried across a real stream
# (recordings, then spoken corpus texts, end to end) under `fail_on_recompile`; at every chunk its state is
# measured against a float64 run of the same stream, beside the error of one step alone. It fails where the
# state part that drifts most keeps rising beyond noise, or an output misses its declared metric.

# %%
streamed = None
if m.stream is not None:
    stream = streaming.speech_stream(clips=texts.texts, source=texts.source)   # the run's recordings, end to end
    streamed = streaming.check_stream(m.stream, stream, targets, task_bounds=opts.task_bounds,
                                      precision=opts.precision)
    report.stream = streamed
    report.save(out / "accuracy.json")   # the inference result above was saved first: kept if this cell fails
streamed

# %%
if streamed is not None:
    streamed.plot();

# %% [markdown]
# ## Generation (workload "generate")
#
# Greedy generation of `batch_size` real prompts with a bucketed static KV cache, in float32 and under each target's
# numerics: the tokens' agreement, the first step where they part, the logit error of every step before it.
# A divergence where the reference's top-2 margin is within the target's own logit error is a near-tie.

# %%
generated = None
if opts.workload == "generate":
    generated = check_generation(m, texts, targets, options=opts)
    report.generation = generated
    report.save(out / "accuracy.json")   # the inference result above was saved first: kept if this cell fails
generated

# %% [markdown]
# ## Training (workload "train")
#
# The model's own loss (next-token for language models, in-batch contrastive for embedding models) on
# real batches, `train_steps` AdamW steps from the loaded weights: fp32 against each target precision that
# rounds below float32, eager under the target's numerics over forward, backward and optimizer. Where the
# loss curves and per-layer gradient norms part (at the precision's tolerance), the advice, and the ops of
# one step compiled with the target's emulated backend (backward and optimizer kernels called out).

# %%
training = None
if opts.workload == "train":
    training = check_training(m, texts, targets, options=opts)
    report.training = training
    report.save(out / "accuracy.json")   # the inference result above was saved first: kept if this cell fails
training

# %%
if training is not None:
    training.plot();
