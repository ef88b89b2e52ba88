"""Stage 3, shape bucketing (notebooks/03_buckets.py): stage.py; bucketed.py (running with buckets), plots.py,
generation.py (prefill and decode buckets), grid.py (two varying dimensions)."""
