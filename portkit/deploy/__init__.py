"""From the verdict to deployment: export.py writes a run's bucket plan as a serving stack's own configuration
(a plain-PyTorch wrapper, vLLM, NxD Inference), gate.py compares a run with a baseline for CI (`portkit check`),
and cost.py turns the plan and the XLA cost analysis into chip-seconds per million requests (an estimate)."""
