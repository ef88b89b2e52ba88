"""From the verdict to deployment: export.py writes a run's bucket plan as a serving stack's own configuration
(a plain-PyTorch wrapper, vLLM, NxD Inference) and gate.py compares a run with a baseline for CI (`portkit check`).
The cost per million requests is portkit.planning.cost's, over what runfolder.results.run_cost_figures reads of a
run folder."""
