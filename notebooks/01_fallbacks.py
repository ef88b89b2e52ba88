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
# # Stage 1 — Fallback discovery
#
# Which ATen ops does the model call, from which module, and which of them would **fall back to the
# CPU** or **not run at all** on each target? Also: the features the vendors name as unsupported or
# slow (float64, LSTM/GRU, sparse, NestedTensor, data-dependent shapes, custom kernels, attention masks).
#
# Logic: `portkit/stages/fallbacks/stage.py`. Headless: `portkit run --stages fallbacks`.

# %% tags=["parameters"]
model = "minilm"  # model: a portkit name (see portkit.models.registry.SOURCES), a local HF directory, or module:factory
targets = ["neuron", "tpu"]  # targets to check: neuron, tpu, cpu, cuda
out_dir = "../runs/notebook"  # folder this stage writes fallbacks.json into
corpus = "stdlib"  # stdlib docstrings, a .txt/.jsonl/.csv file (audio models: spoken), a folder of .wav/.flac or images
text_column = "text"  # column that holds the text in a .jsonl/.csv corpus
batch_size = 8  # texts in the recorded batch
seq_len = 128  # tokens every text is padded or truncated to
train = False  # also record the backward pass
workload = "inference"  # generate (causal LMs, encoder-decoders): greedy generation with a static KV cache instead
seed = 0  # which texts are sampled

# %%
from IPython.display import display
from portkit import models
from portkit.runfolder import environment, results
from portkit.stages import options
from portkit.corpora.corpus import corpus_for, example_batch
from portkit.stages.fallbacks.stage import Options, RecordSettings, find_fallbacks

# %%
model, targets, out = options.common(model, targets, out_dir)
results.skip_if_abstract(model, out, "fallbacks", targets=targets)  # no weights: stage 3b checks it
opts = Options.of(globals(), model=model)   # this stage's parameters, checked
opts

# %%
print(environment.block(targets))

# %% [markdown]
# ## The model and one batch of real inputs

# %%
m = models.load(model)
print(m.summary())

# %%
texts = corpus_for(m, opts.corpus, opts.text_column)
inputs, described = example_batch(m, texts, batch_size=opts.batch_size, seq_len=opts.seq_len, seed=opts.seed)
print(described)

# %% [markdown]
# ## Record one eager pass and classify every op for each target
#
# An op is *native* (a kernel on the target), *composite* (runs as other ops the target has),
# *cpu_fallback* (runs on the host and copies back, every call) or *unsupported* (cannot run at all).
# Each finding names its source line and whose code it is: yours, a library's with a setting, or a
# library's you cannot change. This is the eager pass: stage 2 checks which findings persist under
# `torch.compile` and which vanish (traced away), and the report weighs them by that. With `workload`
# "generate" the pass recorded is greedy generation of a few tokens with a static KV cache (prefill, then
# decode steps writing the cache), the ops serving runs.

# %%
prompts = list(texts.sample(opts.batch_size, opts.seed)) if opts.workload == "generate" else None   # its texts
report = find_fallbacks(m, inputs, targets, settings=RecordSettings(
    train=opts.train, description=described, workload=opts.workload, prompts=prompts,
    texts=getattr(texts, "texts", None)))
report

# %% [markdown]
# ## Where the calls come from, and which ops take the time

# %%
report.plot();

# %%
for name in targets:
    display(report.op_table(name, limit=15))

# %%
for name in targets:
    display(report.module_table(name, depth=4))

# %% [markdown]
# ## Save the result for the later stages and the report

# %%
report.save(out / "fallbacks.json")
print(f"wrote {out / 'fallbacks.json'}")
