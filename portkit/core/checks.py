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

import errno
import os

from portkit.core.errors import BadParameter

# Upper bounds of the whole-number parameters, each with what it means. A value past them is refused in the
# plan step: a huge batch_size otherwise builds a list of that many texts before anything fails.
# numpy.random.seed and RandomState take seeds in [0, 2**32 - 1] (numpy's documentation of RandomState).
MAX_SEED = 2**32 - 1
# Items in one batch: the batch is built in memory as batch_size items, each padded to seq_len; the largest
# batch any stage needs to show a migration problem is far smaller.
MAX_BATCH = 4096
# Tokens in one sequence before the model's own maximum is known (the plan step checks that one where it loads
# the model): 2**20, past the longest context of public models (Llama 3.1: 131,072 tokens, Meta's model card).
MAX_SEQ = 2**20
# Steps, requests and counts that each cost at least one model call on the CPU.
MAX_STEPS = 100_000
# Requests a plan is priced for (arithmetic only): a decade of a service at 3,000 requests a second.
MAX_SERVED = 10**12

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


def non_negative_int(name: str, value, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadParameter(name, value, hint="must be a whole number >= 0")
    if maximum is not None and value > maximum:
        raise BadParameter(name, value, hint=f"must be at most {maximum}")
    return value


def up_to(maximum: int):
    """A check (name, value) -> value: a positive whole number no larger than `maximum`."""
    return lambda name, value: positive_int(name, value, maximum=maximum)


def seed(name: str, value) -> int:
    """A random seed: a whole number in numpy's range [0, MAX_SEED]."""
    return non_negative_int(name, value, maximum=MAX_SEED)


def list_of(check, example: str):
    """A check (name, value) -> value for a non-empty list, `check`(name, entry) on each entry; a single
    value (a string given where a list belongs) is refused saying so, with `example`."""
    def checked(name: str, value):
        if isinstance(value, (list, tuple)) and not value:
            raise BadParameter(name, value, hint=f"must be a non-empty list, not an empty one; e.g. {example}")
        if not isinstance(value, (list, tuple)):
            kind = {str: "a string", dict: "a dict", bool: "True or False", type(None): "None", int: "a number",
                    float: "a number"}.get(type(value), "a single value")
            raise BadParameter(name, value, hint=f"must be a non-empty list, not {kind}; e.g. {example}")
        for entry in value:
            check(name, entry)
        return value
    return checked


def missing_path(path) -> str:
    """Why `path` cannot be opened, in a few words: a symlink loop, a broken symlink (naming its target), or no
    such file. os.stat raises ELOOP for a loop (POSIX: too many levels of symbolic links)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (too many levels of symbolic links)"
        if os.path.islink(path):
            return f"a broken symlink (to {os.readlink(path)})"
        if exc.errno == errno.ENOTDIR:
            return "a part of its path is a file, not a folder"
        return "no such file or folder"
    return "it exists"


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
