"""Stage 3, shape bucketing (notebooks/03_buckets.py): stage.py; result.py (buckets.json: the truncation finding,
each target's plan and replays, the report); bucketed.py (the bucketed model, the padding check), output_probe.py
(how each output follows the input), trace_replay.py (replaying real requests), plots.py, generation.py (prefill and
decode buckets), grid_costs.py (two varying dimensions)."""
