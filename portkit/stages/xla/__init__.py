"""Stage 3b, the real XLA compile (notebooks/03b_xla.py): stage.py; realsize.py (a real-size model without
weights, sharded), training.py and generation.py (the other workloads' graphs)."""
