"""Stage 2, compile (notebooks/02_compile.py): stage.py; steps.py (graph breaks, the fixed shape), storm.py (the
recompile storm), loops.py (a Python loop over the input length, named as a storm's cause), generation.py and
training.py (the other workloads compiled)."""
