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
# # Stage 2 — Compile for the target
#
# Both targets compile **one graph per input shape** (`dynamic=True` is refused), so real traffic,
# where every request has its own length, turns into a **recompile storm**. This notebook finds out:
#
# 1. the model's graph breaks, and whether `fullgraph=True` captures it;
# 2. what each target's compiler would refuse (symbolic shapes) or not lower (ops missing from its table);
# 3. the storm on real requests: compiles against requests, the guard failure behind each compile, time
#    compiling vs running, and when Dynamo's recompile limit would silently fall back to eager;
# 4. the fix: one fixed shape compiles once, and `set_stance("fail_on_recompile")` catches and counts any
#    other compile.
#
# In emulated mode portkit's backends (`portkit_neuron`, `portkit_tpu`) enforce the target's rules and
# numerics and run each graph eagerly (no codegen), so a long storm is cheap to measure here. Every compile
# is then priced with the target's own compile cost, and says where it came from: **measured XLA** for TPU
# (the real XLA compiler for the topology, on this host), an **estimate** with its public sources for Neuron
# (no Neuron compiler is installable here; `neuron_compile_seconds` overrides it), the **vendor's own time**
# in native mode. Logic: `portkit/stages/compile/stage.py`, `portkit/planning/economics.py`.
# Headless: `portkit run --stages compile`.

# %% tags=["parameters"]
model = "minilm"  # model: a portkit name (see portkit.models.registry.SOURCES), a local HF directory, or module:factory
targets = ["neuron", "tpu"]  # targets to compile for: neuron, tpu, cpu, cuda
out_dir = "../runs/notebook"  # folder this stage writes compile.json into
corpus = "stdlib"  # stdlib docstrings, a .txt/.jsonl/.csv file (audio models: spoken), a folder of .wav/.flac or images
text_column = "text"  # column that holds the text in a .jsonl/.csv corpus
requests = 100  # real requests streamed through the compiled model, each at its own length
batch_size = 1  # texts per request
seq_len = 64  # longest request in tokens (longer texts are truncated), and the one fixed shape of the fix
fullgraph = False  # True compiles with fullgraph as the targets recommend, and a graph break fails the compile
backend = "auto"  # auto picks the native backend with its device, else portkit's emulated one; or name one
precision = {}  # per target, e.g. {"neuron": "matmult", "tpu": "highest"}; a target left out uses its default
seed = 4  # which texts are sampled
neuron_compile_seconds = None  # seconds per Neuron graph; None: the estimate from public reports (planning/economics)
workload = "inference"  # "inference"; "train": the training step too; "generate" (causal LMs, encoder-decoders)
new_tokens = 16  # tokens each prompt generates when workload is "generate"
prompts = 4  # real prompts from the corpus, one batch, when workload is "generate"

# %%
from IPython.display import display
from portkit import models
from portkit.runfolder import environment, results
from portkit.stages import options
from portkit.stages.compile.stage import (CompileReport, Options, check_fixed_shapes, check_generation,
    check_training, compile_costs, eager_findings, find_graph_breaks, make_requests, recompile_storms)
from portkit.corpora.corpus import corpus_for

# %%
model, targets, out = options.common(model, targets, out_dir)
results.skip_if_abstract(model, out, "compile", targets=targets)  # no weights: stage 3b checks it
opts = Options.of(globals(), model=model)   # this stage's parameters, checked
opts.check_targets(targets)                            # the backend and the precision, for each target
opts

# %%
print(environment.block(targets))

# %% [markdown]
# ## The model and a stream of real requests
#
# Each request is tokenized to its own length, as a server receives it: no padding to a bucket.

# %%
m = models.load(model)
texts = corpus_for(m, opts.corpus, opts.text_column)   # the items its declaration builds batches from
stream = make_requests(m, texts, opts.requests, batch_size=opts.batch_size, max_tokens=opts.seq_len,
                                 seed=opts.seed)
print(f"{m.name}: {m.kind}, {m.parameters / 1e6:.1f} M parameters, {m.origin}")
print(stream)

# %% [markdown]
# ## Graph breaks, and what each target's compiler would refuse or not lower
#
# `torch._dynamo.explain` lists the breaks with the user's source line; then one `fullgraph=True`
# capture runs every emulated target's checks (no compile yet).

# %%
breaks = find_graph_breaks(m, stream.inputs[0], targets, precision=opts.precision)
breaks

# %% [markdown]
# ## Stage 1's eager findings under `torch.compile`
#
# Stage 1 recorded one eager pass; both vendors run models compiled. Each eager finding is checked against
# the graphs just captured: it **persists** (its op is in a compiled graph, or its line is a graph break),
# **vanishes** (traced away: info, no cost compiled) or is **not checked**; and it names whose code it is.

# %%
for table in eager_findings(breaks, out, targets).values():
    display(table)

# %% [markdown]
# ## The recompile storm
#
# The model compiled with `dynamic=False` (what both targets require) meets the requests one by one.
# Every compile is counted by a wrapper around the backend; the guard failure that triggered it is
# Dynamo's own text (the emulated targets share one trace per shape, each checking it). The first
# 8 shapes (Dynamo's own recompile limit) are compiled here; every later request still goes through Dynamo under
# `fail_on_recompile`, and a new shape's refusal (its guard failures, in Dynamo's words) is counted as the
# compile the target would pay, the request then running eagerly ("counted" in the table). The recompile
# limit is raised so that every compile is paid, as on the targets; the table shows where Dynamo's default
# limit would have fallen back to eager. The times here are this CPU's (trace and check); what the
# compiles cost on each target follows below.

# %%
storms = recompile_storms(m, stream, targets, options=opts)
for storm in storms.values():
    display(storm)

# %% [markdown]
# ## The fix: one fixed shape, and proof that nothing else compiles
#
# Every request padded to `seq_len`: one compile in warm-up, then the requests run under
# `torch.compiler.set_stance("fail_on_recompile")`, where PyTorch refuses any compile. A refused compile is
# recorded (request, shape, the guard that failed), then paid and counted: a finding, not a crash.

# %%
fixed = check_fixed_shapes(m, stream, targets, options=opts)
for result in fixed.values():
    print(result)

# %% [markdown]
# ## What the storm costs on each target
#
# TPU: the real XLA compiler, run on this host for a few shapes spread over the stream's lengths and
# interpolated (the verdict cache makes a rerun free). Neuron: an estimate, with its sources. The middle
# plot carries the same stream on (tokenized, not run): the compiles keep growing with the distinct lengths.

# %%
costs = compile_costs(m, stream, targets, options=opts, storms=storms)
for name, cost in costs.items():
    print(f"{name}: {cost.seconds(opts.seq_len):.1f} s to compile one {opts.seq_len}-token shape ({cost.label()})")

# %% [markdown]
# ## Generation (workload "generate"): the dynamic KV cache against the bucketed static one
#
# Greedy generation of real prompts compiled for each target. With the model's default dynamic cache every
# generated token is a new shape, so a compile, until Dynamo's recompile limit runs the step eagerly; with a
# static cache in power-of-two prompt and context buckets every graph compiles in the warm-up, and the whole
# generation then runs under `fail_on_recompile`.

# %%
generated = {}
if opts.workload == "generate":
    generated = check_generation(m, texts, targets, options=opts)
    for found in generated.values():
        print(found)

# %% [markdown]
# ## Training (workload "train"): the step compiled for each target
#
# One AdamW step of the model's own loss, compiled with each target's backend: the joint graph Dynamo
# captures is split into its forward and backward graphs, and every op of each is classified with the
# target's table (what the backward does not lower is named with its pass). The first step compiles; the
# later ones run under `fail_on_recompile`. Beside it, the same steps eagerly under the target's numerics.

# %%
trained = {}
if opts.workload == "train":
    trained = check_training(m, texts, targets, options=opts)
    for found in trained.values():
        print(found.summary())

# %%
report = CompileReport.from_steps(m, stream, breaks, storms=storms, fixed=fixed, costs=costs,
                                            generation=generated, training=trained)
report

# %%
report.plot();

# %% [markdown]
# ## Save the result for the later stages and the report

# %%
report.save(out / "compile.json")
print(f"wrote {out / 'compile.json'}")
print(report.summary())
