"""Cost per million requests of a run's bucket plan, read from its run folder: an estimate, never a measurement.

    >>> from portkit.deploy import cost
    >>> cost.estimate("runs/minilm", "tpu")                       # priced from data/targets/prices.json
    >>> cost.comparison("runs/minilm", ["neuron", "tpu"], prices=cost.read_prices("my-prices.json"))

The method, its assumptions and the price table are portkit.planning.cost's (one owner); this module reads the
run folder's buckets.json and xla.json for it.
"""
from __future__ import annotations

from portkit.planning import cost as _cost
from portkit.runfolder import results

LABEL, MILLION = _cost.LABEL, _cost.MILLION
read_prices, line = _cost.read_prices, _cost.line


def _stages(run_dir) -> tuple[dict, dict]:
    return results.read_stage(run_dir, "buckets") or {}, results.read_stage(run_dir, "xla") or {}


def _accuracy(run_dir) -> dict:
    return results.read_stage(run_dir, "accuracy") or {}


def estimate(run_dir, target: str, prices: dict | None = None) -> dict:
    """One target's chip-seconds and dollars per million requests (planning.cost.estimate)."""
    return _cost.estimate(*_stages(run_dir), target, prices, _accuracy(run_dir))


def comparison(run_dir, targets, prices: dict | None = None) -> dict:
    """Every target and each named GPU side by side, with the verdicts (planning.cost.comparison)."""
    return _cost.comparison(*_stages(run_dir), targets, prices, _accuracy(run_dir))
