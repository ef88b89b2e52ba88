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
# # Stage 3 — Shape buckets
#
# Trainium (TorchNeuron) and TPU (TorchTPU) compile **one graph per input shape**. Served as they come,
# real requests bring a new length almost every time, and each new length is a compile
# (pytorch/xla#2422: 27 compiles in step 0). Padding every request up to one of a few **buckets** pays
# a few compiles, and some compute on padding tokens.
#
# This notebook measures the real length distribution under the model's own tokenizer, compares four
# ways to place the buckets (pow2, linear, padding_bounded, and the exact `optimal`), lets `auto` choose
# how many buckets pay for themselves given each target's compile cost (measured XLA for TPU, an estimate
# with its sources for Neuron, the vendor's own time natively) within a warm-up time budget, then replays
# real requests:
# without buckets (one compile per shape) and with each plan, with every compile after warm-up **caught**
# and counted (`torch.compiler.set_stance("fail_on_recompile")`), and checks every bucket's outputs at the
# real positions against unpadded eager outputs.
#
# Logic: `portkit/planning/planner.py` (planning), `portkit/planning/economics.py` (compile costs),
# `portkit/stages/buckets/bucketed.py` (padding), `portkit/stages/buckets/trace_replay.py`
# (compiling, replay) and `portkit/stages/buckets/stage.py` (the stage).
# Headless: `portkit run --stages buckets`.

# %% tags=["parameters"]
model = "minilm"  # model: a portkit name, a local HF directory, or module:factory (its inputs must vary)
targets = ["neuron", "tpu"]  # targets to plan for: neuron, tpu, cpu, cuda
out_dir = "../runs/notebook"  # folder holding compile.json from stage 2, and where buckets.json goes
corpus = "stdlib"  # stdlib docstrings, a .txt/.jsonl/.csv file (audio models: spoken), a folder of .wav/.flac or images
text_column = "text"  # column that holds the text in a .jsonl/.csv corpus
bucket_count = 4  # buckets every fixed-k planner gets in the comparison and the replay
max_batch = 1  # each request batches 1..max_batch texts; batch sizes are bucketed as powers of two
requests = 100  # requests replayed from the corpus, in random order (each new length is a compile)
overflow = "truncate"  # inputs longer than the largest bucket: "truncate" to it, or "reject" with an error
serve_requests = 10000000  # requests one warm-up serves, the plan is priced for: compiles once, padding on each
warmup_budget_seconds = 600.0  # most seconds the warm-up may spend compiling buckets, per target
neuron_compile_seconds = None  # seconds per Neuron graph; None: the estimate from public reports (planning/economics)
backend = "auto"  # auto: each target's backend (native with its device, else portkit's emulated one); or name one
seed = 0  # which texts are sampled
workload = "inference"  # "inference"; "generate" (causal LMs): prefill and decode buckets; "train": packing
new_tokens = 16  # tokens each request generates when workload is "generate" (its context: prompt + new_tokens)

# %%
from portkit import models
from portkit.planning import economics
from portkit.runfolder import environment, results
from portkit.stages import options
from portkit.stages.buckets import stage
from portkit.corpora.corpus import corpus_for, make_trace

# %%
model, targets, out = options.common(model, targets, out_dir)
results.skip_if_abstract(model, out, "buckets", targets=targets)  # no weights: stage 3b checks it
opts = stage.Options.of(globals(), model=model)   # this stage's parameters, checked
opts.check_targets(targets)   # the backend, for every target
opts

# %%
print(environment.block(targets))

# %% [markdown]
# ## The real length distribution, under the model's own tokenizer
#
# Every text of the corpus tokenized by the model's tokenizer, before truncation. The largest bucket is
# the model's `max_length` (or the longest text, if shorter); longer texts follow the `overflow` policy:
# how many are cut, and the share of their tokens lost, is a finding (work when any text is cut).

# %%
m = models.load(model)
stage.skip_unless_it_applies(m, out, targets)   # a model with one input shape has nothing to bucket
texts = corpus_for(m, opts.corpus, opts.text_column)
dist = stage.distribution(texts, m)
hist = stage.histogram(dist, overflow=opts.overflow)
cut = stage.truncation(dist, hist)   # what the overflow policy cuts: a finding of its own
print(dist)
print(hist)
print(stage.truncation_finding(cut)["message"])
dist.plot();

# %% [markdown]
# ## Four planners at the same number of buckets
#
# Same number of compiles, different padding: `pow2` and `linear` ignore the data, `padding_bounded`
# bounds each request's padding, `optimal` places the boundaries where the requests are (exact
# dynamic programming over the histogram).

# %%
plans = stage.compare(hist, opts.bucket_count, opts.max_batch)
for plan in plans:
    print(plan)
stage.plot_histogram(hist, plans);

# %% [markdown]
# ## How many buckets? `auto` prices compiles against padding
#
# Each bucket costs one compile per batch size on the target: TPU's is the real XLA compile time for the
# topology, measured on this host at a few lengths and interpolated; Neuron's is an estimate from public
# reports (its source is printed), shown again at half and twice itself. Each padded token costs the
# target the FLOPs and activation bytes it adds, counted on the model's graph, at the chip's roofline at the
# target's default precision (an estimate; measured on the device natively), never this CPU's time. `auto`
# takes the number of buckets with the least total for the requests to be served (`serve_requests`), within
# the warm-up budget, and says when the budget binds.

# %%
curves = stage.sweep(hist)
token_seconds = economics.padding_prices(m, targets, hist.top)
trace = make_trace(texts, m, opts.requests, seed=opts.seed, max_batch=opts.max_batch, dist=dist)
print(trace)
for price in token_seconds.values():
    print(f"a padded token on {price.target}: {price.label()}")

# %%
costs = stage.stage_costs(m, hist, targets, out_dir=out, options=opts)
chosen = stage.choose(hist, costs, token_seconds, options=opts)
# workload "generate": the prefill and decode buckets (shown below), saved with the plans
served = stage.serving_plans(m, texts, costs, token_seconds=token_seconds, options=opts)
stage.save_plans(chosen, out, served)   # stages 4 and 3b may start on these while the replay below runs
alternatives = stage.what_if(hist, costs, token_seconds, options=opts)
for name, plans_at in alternatives.items():
    for factor, plan in plans_at.items():
        print(f"{name} at {factor:g}x the estimate: {plan}")

# %%
stage.plot_padding(curves, chosen, opts.bucket_count);

# %% [markdown]
# In JupyterLab, move the slider to redraw the buckets and the padding for another number of buckets
# (headless runs skip it).

# %%
stage.padding_slider(hist, curves, opts.bucket_count)

# %% [markdown]
# ## Generation (workload "generate"): prefill and decode buckets
#
# Serving with a static KV cache compiles a prefill graph per prompt bucket and a decode step per context
# bucket (the cache's length); an encoder-decoder, its encoder and decode steps per source bucket, with one
# decoder context. Per target, the auto plan (warm-up compiles against padding for `serve_requests`, each
# compile at the target's cost) beside the powers of two the serving stacks make.

# %%
served

# %% [markdown]
# ## Training (workload "train"): packing against padding
#
# A static-shape training step compiles once per batch shape. Packed rows (whole texts one after another,
# every slot a token; language models) are one shape; so is padding every batch to one length (128); padding
# each batch to the bucket of its longest text costs a compile per bucket used. Per target (its chosen
# buckets): compiles, real tokens per step, and the fill.

# %%
layouts = None
if opts.workload == "train":
    layouts = stage.training_layouts(m, texts, chosen)
    for name, rows in layouts.items():
        for row in rows:
            print(f"{name}: {row['layout']}: {row['compiles']} compile(s), {row['tokens_per_step']:.0f} real "
                  f"tokens per step, fill {row['fill']:.0%}")

# %% [markdown]
# ## Two varying dimensions: a grid of buckets
#
# A model that declares two varying dimensions (an encoder's and a decoder's length) pads each request to a
# bucket on both, so every (bucket, bucket) cell is one shape to compile. Per target, the least-cost grid
# (each dimension's exact least-padding boundaries, every k1 x k2) against the best one-dimensional plan
# (one dimension bucketed and the other padded to its longest, or one shared length), both priced for
# `serve_requests` requests: the TPU's cell compile measured by XLA at the corner cells, padding by the
# FLOPs and bytes a position adds along each dimension at the chip's roofline
# (portkit/stages/buckets/grid_costs.py). The replay below buckets the first dimension.

# %%
grid = stage.grid(m, texts, targets, costs=costs, options=opts)
grid if grid is not None else print(f"{m.name} has one varying dimension: no grid to fit")

# %% [markdown]
# ## Replay real requests: no buckets, then each plan
#
# Without buckets the model compiles once per distinct shape, as on the targets (Dynamo's recompile
# limit is raised so it does not quietly fall back to eager after 8). With a plan, warm-up compiles
# every bucket once; the replay then runs under `fail_on_recompile`, so PyTorch itself catches any compile
# after warm-up: each is counted, with its request, shape and guard failure. Each shape's compile is
# charged at its first measured time, so the order of
# the runs favours no plan. The comparison runs on the first target's backend; every target replays
# its own chosen plan on its own backend (`stage.replay_targets(...,
# replay=stage.Replay(compare_every_target=True))` compares on all of them). In emulated mode every time is
# this CPU's, never the target's.

# %%
per_target = stage.replay_targets(m, trace, plans, chosen=chosen, costs=costs, options=opts, what_ifs=alternatives)
report = stage.BucketReport(m.describe(), dist.to_dict(), hist, k=opts.bucket_count, plans=plans, curves=curves,
                              token_seconds=token_seconds, trace=trace.describe(), targets=per_target,
                              grid=grid.to_dict() if grid is not None else None,
                              generation=served.to_dict() if served is not None else None, training=layouts,
                              truncation=cut)
report

# %%
report.plot();

# %% [markdown]
# ## Padding correctness, per bucket
#
# Real texts cut to lengths inside each bucket, padded and run compiled, against the same texts run
# unpadded in eager mode (`torch.testing.assert_close` on the real positions). A mask bug, where real
# tokens attend to padding, fails here (vllm-project/tpu-inference#3466).

# %%
report.padding_table()

# %% [markdown]
# ## Save the chosen plan for the later stages and the report
#
# `targets[t]["chosen"]` holds the planner, boundaries, batch sizes, why, and every shape to compile.

# %%
report.save(out / "buckets.json")
print(f"wrote {out / 'buckets.json'}")
print(report.summary())
