"""Parameter checks for the notebooks' validation cells and the CLI: one line per bad value.

papermill only warns about parameters a notebook does not declare, and passes any value through;
so every notebook's second cell calls these and stops at once with a message that names the value
and the valid choices.

    >>> from portkit.core import checks
    >>> checks.positive_int("batch_size", 8)
    8
    >>> checks.positive_int("batch_size", -3)
    Traceback (most recent call last):
    ...
    portkit.core.errors.BadParameter: invalid batch_size -3: must be a positive whole number
    >>> checks.choice("planner", "pow3", ["pow2", "linear"])
    Traceback (most recent call last):
    ...
    portkit.core.errors.BadParameter: unknown planner 'pow3'; choose one of: pow2, linear
"""
from __future__ import annotations

from portkit.core.errors import BadParameter


# The workloads a run can check: one forward pass per request ("inference"), greedy generation with a KV
# cache ("generate", causal LMs: stage 2 compiles it with the dynamic and the bucketed static cache), or
# training steps of the model's own loss with AdamW ("train"). Every stage that reads `workload` checks it here.
WORKLOADS = ("inference", "generate", "train")


def workload(value) -> str:
    return choice("workload", value, WORKLOADS)


def positive_int(name: str, value, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadParameter(name, value, hint="must be a positive whole number")
    if maximum is not None and value > maximum:
        raise BadParameter(name, value, hint=f"must be at most {maximum}")
    return value


def non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadParameter(name, value, hint="must be a whole number >= 0")
    return value


def positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BadParameter(name, value, hint="must be a positive number")
    return float(value)


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise BadParameter(name, value, hint="must be True or False")
    return value


def choice(name: str, value, choices) -> str:
    choices = list(choices)
    if value not in choices:
        raise BadParameter(name, value, choices)
    return value


def text(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadParameter(name, value, hint="must be a non-empty string")
    return value


def one_of(choices):
    """A check (name, value) -> value that accepts one of `choices`."""
    choices = tuple(choices)
    return lambda name, value: choice(name, value, choices)
