"""Stage 3b, the real XLA compile (notebooks/03b_xla.py): stage.py; realsize.py (a real-size model without
weights, sharded), training.py, generation.py and seq2seq_serving.py (the other workloads' graphs: a training step, a
causal LM's and an encoder-decoder's serving graphs)."""
