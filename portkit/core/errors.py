"""portkit's exceptions: one base class, a few subclasses.

    >>> from portkit.core.errors import BadParameter
    >>> raise BadParameter("target", "trn", ["neuron", "tpu", "cpu", "cuda"])
    Traceback (most recent call last):
    ...
    portkit.core.errors.BadParameter: unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda
    >>> raise BadParameter("batch_size", -3, hint="must be a positive whole number")
    Traceback (most recent call last):
    ...
    portkit.core.errors.BadParameter: invalid batch_size -3: must be a positive whole number
"""
from __future__ import annotations

from collections.abc import Iterable


class PortkitError(Exception):
    """Base class of every error portkit raises on purpose."""


class BadParameter(PortkitError, ValueError):
    """A user-supplied value that portkit does not accept.

    The message names the bad value. With `choices` the value is not one of a finite set of names:
    "unknown X 'v'; choose one of: ...". Without, X is known and its value breaks a rule that `hint`
    states: "invalid X v: hint".
    """

    def __init__(self, what: str, value: object, choices: Iterable[object] | None = None,
                 hint: str | None = None):
        self.what, self.value, self.hint = what, value, hint
        self.choices = list(choices) if choices is not None else None
        if self.choices is not None:
            message = f"unknown {what} {value!r}; choose one of: " + ", ".join(str(c) for c in self.choices)
            if hint:
                message += f" ({hint})"
        else:
            message = f"invalid {what} {value!r}" + (f": {hint}" if hint else "")
        super().__init__(message)


class NeedsNetwork(PortkitError):
    """The request would need a download; portkit runs offline."""


class MissingPackage(PortkitError):
    """An optional package a stage needs is absent or does not import; the message says what to install."""


class StageFailed(PortkitError):
    """A workbook notebook failed; the message names the notebook and the cell."""


class StageSkipped(PortkitError):
    """A stage that does not apply to the model (for example bucketing a model that takes one fixed image
    shape): its result file says why (results.skip_stage), and the runner records the stage as skipped, not
    failed. The message is the reason."""


class CompileRefused(PortkitError):
    """An emulated compile backend refuses a graph the target's own compiler would refuse
    (a symbolic shape); `where` is the source frame of the refused node when known
    (a dict with "file", "line", "function", "code" and "text": owners.place)."""

    def __init__(self, message: str, where: dict | None = None):
        self.where = where
        super().__init__(message)
