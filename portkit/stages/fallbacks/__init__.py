"""Stage 1, fallback discovery (notebooks/01_fallbacks.py): stage.py; recording.py, the eager op recorder;
source_scan.py, the static scan of the model's source (GPU-only code, the vendors' lists)."""
