"""Stage 1, fallback discovery (notebooks/01_fallbacks.py): stage.py, and recording.py, the eager op recorder."""
