"""portkit's foundations: errors, atomic files, findings and whose code they come from, the grading policy, what a
stage could not assess, tables, progress, availability probes, where portkit's files are, the module stack,
placement, parameter checks, and the one boundary to torch's private APIs. One module here is stage logic, not a
foundation: reconcile.py checks stage 1's eager findings against stage 2's compiled graphs. Nothing here imports
another portkit package."""
