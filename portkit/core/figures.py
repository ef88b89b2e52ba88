"""Measured numbers as a reader reads them: a share against its budget with the digits that decide it, anything
else to a few significant figures, never float noise ("0.9944999999999999", "0.9999999999999998").

    >>> from portkit.core import figures
    >>> figures.share(0.9999999999999998, 0.999)    # '1.0000': a few ulps below 1 is 1
    >>> figures.share(0.99995, 0.999)               # '0.99995': the digit that shows it is below 1
    >>> figures.sig(0.9944999999999999)             # '0.9945'
"""
from __future__ import annotations

import math

NOISE = 1e-9   # a float64 sum of float32 figures a few ulps from 1 is 1: far below any budget's last digit
SIGNIFICANT = 4


def share(value: float, bound: float | None = None) -> str:
    """A measurement against its budget `bound`: a share (0 to 1, budget in 0 to 1) with one decimal more than its
    budget (at least three: 1.000, 0.9995; more where it would read 1 and is not, up to 7), anything else to
    SIGNIFICANT figures. A share within NOISE of 1 is 1."""
    if bound is not None and 0 <= bound <= 1 and 0 <= value <= 1:
        decimals = max(3, len(f"{bound:g}".partition(".")[2]) + 1)
        while decimals < 7 and 1 - value > NOISE and f"{value:.{decimals}f}" == f"{1:.{decimals}f}":
            decimals += 1      # a share just below 1 keeps the digit that shows it is below
        return f"{value:.{decimals}f}"
    return sig(value)


def sig(value, digits: int = SIGNIFICANT):
    """A float to `digits` significant figures (as text); anything else (an int, a bool, a text, None) as it is."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"
