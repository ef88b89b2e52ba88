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
# # Stage 5 — The migration report
#
# A verdict per target — **ready**, **ready with work** or **blocked** — with the findings that decide it,
# Neuron and TPU side by side, and the checklist of work a migration needs. Built only from the stage
# results already in `out_dir`: a missing or unreadable stage is named as a gap. Each figure says what it counts
# and over which requests (stage 2's storm and stage 3's replay each have their own); a recompile storm that
# stage 3's plan serves with no compile after warm-up is shown resolved by that plan, not as work.
#
# Logic: `portkit/stages/report/stage.py`. Headless: `portkit report DIR` (no stage is rerun).

# %% tags=["parameters"]
model = "minilm"  # model the run folder was made for (shown in the report)
targets = ["neuron", "tpu"]  # targets to report on, side by side
out_dir = "../runs/notebook"  # run folder holding the stage results; report.html and report.json go here

# %%
from portkit.stages import options
from portkit.stages.report.stage import build_report

# %%
model, targets, out = options.common(model, targets, out_dir)

# %% [markdown]
# ## Verdicts, side by side
#
# With the machine that produced the results: its environment is read from the stage results (recorded when
# each stage ran), not from the machine building the report.

# %%
migration = build_report(targets, run_dir=out)
migration

# %% [markdown]
# ## Write report.html (self-contained, opens offline) and report.json (stable keys for CI)

# %%
html_path = migration.save(out)
print(f"wrote {html_path} and {out / 'report.json'}")
