"""How sure a task metric is: the items it was decided on, a 95% interval, and a three-way decision.

    >>> from portkit.stages.accuracy import stats
    >>> stats.wilson(1797, 1797)                     # (0.99787..., 1.0): a rate's Wilson score interval
    >>> stats.bootstrap(cosines, stats.MIN)         # a seeded percentile interval for any other statistic
    >>> stats.decide((0.51, 1.0), "agreement", {"agreement": 0.99})     # 'inconclusive': it straddles 0.99

A metric measured on a handful of items says little: four agreeing images put top-1 agreement's 95% interval at
[0.51, 1], which holds both a pass and a fail of a 0.99 budget. So every task metric carries `n` and `ci95`, and
its decision is "pass" only where the whole interval lies inside the budget, "fail" where it lies wholly
outside, and "inconclusive" where it straddles the budget (never a pass).

Rates (a share of decisions that agree) get the Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001,
"Interval Estimation for a Binomial Proportion", recommend it over the Wald interval, which collapses to a point
at 0 or n successes). Every other statistic (a lowest cosine, a mean KL, a 95th percentile) gets a bootstrap
percentile interval (Efron & Tibshirani 1993, ch. 13): BOOTSTRAP_RESAMPLES resamples of the items with
replacement, seeded, so a run repeats.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from portkit.core import figures
from portkit.targets.tolerance import UPPER_BOUNDS

Z95 = 1.959963984540054      # the standard normal's 97.5th percentile: a two-sided 95% interval
BOOTSTRAP_RESAMPLES = 1000   # resamples of a bootstrap interval (Efron & Tibshirani suggest 1000 for percentiles)
BOOTSTRAP_SEED = 0
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
DECISIONS = (PASS, FAIL, INCONCLUSIVE)
_BLOCK = 50                  # bootstrap resamples drawn at once


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate of `successes` in `n`; (0, 1) where n is 0 (nothing is known)."""
    if n <= 0:
        return 0.0, 1.0
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # the interval always holds the observed rate; clamp the float rounding at the ends
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def bootstrap(values: torch.Tensor, statistic: Callable[[torch.Tensor], torch.Tensor],
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of `statistic` over `resamples` seeded resamples of the items.
    `statistic` reduces the last dimension of a (resamples, items) tensor, e.g. MIN, MEAN or quantile(0.95).
    One item: the point itself; none: (nan, nan)."""
    values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        return math.nan, math.nan
    if values.numel() == 1:
        point = float(statistic(values.reshape(1, 1))[0])
        return point, point
    generator = torch.Generator().manual_seed(seed)
    stats = []
    for start in range(0, resamples, _BLOCK):      # a block of resamples at a time bounds the memory
        picks = torch.randint(values.numel(), (min(_BLOCK, resamples - start), values.numel()), generator=generator)
        stats.append(statistic(values[picks]).double())
    low, high = torch.quantile(torch.cat(stats), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def MIN(v: torch.Tensor) -> torch.Tensor:
    return v.min(-1).values


def MEAN(v: torch.Tensor) -> torch.Tensor:
    return v.mean(-1)


def quantile(q: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def statistic(v: torch.Tensor) -> torch.Tensor:
        return torch.quantile(v, q, dim=-1)
    return statistic


def decide(ci95, key: str, bounds: dict) -> str:
    """'pass' where the whole interval lies inside the budget of `key`, 'fail' where it lies wholly outside,
    'inconclusive' where it straddles the budget. An interval that could not be measured (nan) is inconclusive."""
    low, high = ci95
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    bound = bounds[key]
    inside, outside = ((high <= bound, low > bound) if key in UPPER_BOUNDS else (low >= bound, high < bound))
    return PASS if inside else FAIL if outside else INCONCLUSIVE


def described(check: dict) -> str:
    """A task check with its sample, e.g. 'top-1 agreement 1.000 [0.998, 1.000] on 1,797 images'."""
    bound = check.get("bound")
    text = f"{check['label']} {figures.share(check['value'], bound)}"
    if check.get("ci95") is not None:
        low, high = check["ci95"]
        text += f" [{figures.share(low, bound)}, {figures.share(high, bound)}]"
    if check.get("n") is not None:
        text += f" on {check['n']:,} {check.get('unit') or 'items'}"
    return text
