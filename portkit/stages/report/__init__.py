"""Stage 5, the migration report (notebooks/05_report.py): stage.py; sections.py (what each stage adds),
realsize.py (the real-size section), wording.py (a finding's headline and detail), templates/ (the HTML)."""
