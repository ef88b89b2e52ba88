"""Stage 2, compile (notebooks/02_compile.py): stage.py; graph_breaks.py, fixed_shape.py, storm.py (the
recompile storm), loops.py (a Python loop over the input length, named as a storm's cause), generation.py and
training.py (the other workloads compiled)."""
