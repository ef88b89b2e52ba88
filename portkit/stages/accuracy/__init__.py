"""Stage 4, accuracy (notebooks/04_accuracy.py): stage.py (the verb); settings.py (options and sizes); reference.py
(the reference and the task sample); target_check.py (one target's run); result.py (the verdict), tables.py,
advice.py, stream_findings.py; comparison.py, stats.py (the task metrics' n, 95% intervals and decision),
localize.py (where the error enters), target_runs.py, training.py, generation.py, footprint.py (the memory one row of
a pass takes). The other padding side, tried on a bucket that fails only padded, is portkit/models/padding_side.py's
(stage 3 tries it too)."""
