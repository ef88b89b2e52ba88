"""The six stages, one package each, one notebook each (notebooks/NN_name.py):

1 fallbacks, 2 compile, 3 buckets, 3b xla, 4 accuracy, 5 report. A stage's package holds its notebook's
logic (stage.py) and helpers of its own; one helper that stage 4 alone uses lives in a lower layer:
targets/gpu_baseline.py (its GPU baseline). No stage imports another (they read earlier results from the run
folder). options.py validates what every stage shares; reconcile.py checks stage 1's eager findings against stage
2's compiled graphs (stages 1, 2 and 5 call it)."""
