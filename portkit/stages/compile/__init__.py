"""Stage 2, compile (notebooks/02_compile.py): stage.py; steps.py (graph breaks, the fixed shape), storm.py (the
recompile storm), generation.py and training.py (the other workloads compiled)."""
