"""Stage 1, fallback discovery (notebooks/01_fallbacks.py): stage.py; recording.py, the eager op recorder;
source_scan.py, the static scan of the model's source (which files, the findings per target), with scan_rules.py
(what it looks for, as data) and scan_visitor.py (the AST visitor over one file)."""
