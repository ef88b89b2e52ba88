"""Parameter checks for the notebooks' validation cells and the CLI: one line per bad value.

papermill only warns about parameters a notebook does not declare, and passes any value through;
so every notebook's second cell calls these and stops at once with a message that names the value
and the valid choices.

    >>> from portkit import params
    >>> params.positive_int("batch_size", 8)
    8
    >>> params.positive_int("batch_size", -3)
    Traceback (most recent call last):
    ...
    portkit.errors.BadParameter: invalid batch_size -3: must be a positive whole number
    >>> params.choice("planner", "pow3", ["pow2", "linear"])
    Traceback (most recent call last):
    ...
    portkit.errors.BadParameter: unknown planner 'pow3'; choose one of: pow2, linear
"""
from __future__ import annotations

from pathlib import Path

from portkit import abstract_models, models, targets as targets_mod
from portkit.errors import BadParameter


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


def common(model: str, targets, out_dir: str) -> tuple[str, list[str], Path]:
    """Validate the parameters every stage shares; print the decisions a user should see. A model is a
    portkit.models spec, or an abstract model's name (a real-size config without weights: llama3-8b)."""
    if not abstract_models.is_name(model):
        try:
            model = models.validate(model)
        except BadParameter as exc:
            if exc.what == "model" and exc.choices:      # an unknown name: the abstract models are names too
                raise BadParameter("model", model, [*exc.choices, *abstract_models.names()]) from None
            raise
    names = targets_mod.parse_targets(targets)
    if not isinstance(out_dir, str) or not out_dir:
        raise BadParameter("out_dir", out_dir, hint="give a folder path")
    out = Path(out_dir).expanduser().resolve()
    for name in names:
        print(targets_mod.detect(name))
    return model, names, out
