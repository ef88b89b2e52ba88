"""From the verdict to deployment: export.py writes a run's bucket plan as a serving stack's own configuration
(a plain-PyTorch wrapper, vLLM, NxD Inference), gate.py compares a run with a baseline for CI (`portkit check`),
and cost.py reads a run folder's bucket plan and XLA cost analysis and hands them to portkit.planning.cost, which
prices them in chip-seconds and dollars per million requests (an estimate)."""
