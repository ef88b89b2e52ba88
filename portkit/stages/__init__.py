"""The six stages, one package each, one notebook each (notebooks/NN_name.py):

1 fallbacks, 2 compile, 3 buckets, 3b xla, 4 accuracy, 5 report. A stage's package holds its notebook's
logic (stage.py) and helpers of its own; a few helpers that one stage alone uses live in lower layers:
targets/gpu_baseline.py (stage 4's GPU baseline) and core/reconcile.py (stage 2 checks stage 1's findings
against its graphs). No stage imports another (they read earlier results from the run folder). options.py
validates what every stage shares."""
