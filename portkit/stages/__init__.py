"""The six stages, one package each, one notebook each (notebooks/NN_name.py):

1 fallbacks, 2 compile, 3 buckets, 3b xla, 4 accuracy, 5 report. A stage's package holds its notebook's
logic (stage.py) and the helpers only it uses; no stage imports another (they read earlier results from the
run folder). options.py validates what every stage shares."""
