"""Cost per million requests of a run's bucket plan, read from its run folder: an estimate, never a measurement.

    >>> from portkit.deploy import cost
    >>> cost.estimate("runs/minilm", "tpu")                       # priced from data/targets/prices.json
    >>> cost.comparison("runs/minilm", ["neuron", "tpu"], prices=cost.read_prices("my-prices.json"))

The method, its assumptions and the price table are portkit.planning.cost's (one owner); this module reads the
run folder's buckets.json, xla.json and accuracy.json for it (portkit.runfolder.results.cost_figures).
"""
from __future__ import annotations

from portkit.planning import cost
from portkit.runfolder import results

LABEL, MILLION = cost.LABEL, cost.MILLION
read_prices, line = cost.read_prices, cost.line


def _figures(run_dir) -> cost.Figures:
    buckets = results.load(run_dir, "buckets")
    if buckets is None:
        return cost.Figures()
    return results.cost_figures(buckets, results.load(run_dir, "xla"), results.load(run_dir, "accuracy"))


def estimate(run_dir, target: str, prices: dict | None = None) -> dict:
    """One target's chip-seconds and dollars per million requests (planning.cost.estimate)."""
    return cost.estimate(_figures(run_dir), target, prices)


def comparison(run_dir, targets, prices: dict | None = None) -> dict:
    """Every target and each named GPU side by side, with the verdicts (planning.cost.comparison)."""
    return cost.comparison(_figures(run_dir), targets, prices)
