"""The stage notebooks' parameters: what each declares (papermill's inspector), a command-line value read as the
notebook's default is written, and the stages a run selects.

    >>> from portkit.run import notebook_parameters
    >>> notebook_parameters.all_parameters()["batch_size"]["stages"]
    ['fallbacks', 'compile', ...]

options.SHARED are the parameters every notebook takes from the run itself (model, targets, out_dir), never -p.
"""
from __future__ import annotations

import ast
import json

from portkit.core.errors import BadParameter
from portkit.runfolder.layout import STAGE_NAMES, STAGES, Stage
from portkit.stages import options


def declared_parameters(stage: Stage) -> dict[str, dict]:
    """The parameters a stage notebook declares, with default and help text (papermill's inspector)."""
    return options.declared(stage.notebook)


def parameters_by_stage(stages=STAGES) -> dict[str, dict[str, dict]]:
    """{parameter: {stage: its declaration (default, help)}}: one parameter may differ per stage."""
    found: dict[str, dict[str, dict]] = {}
    for stage in stages:
        for name, info in declared_parameters(stage).items():
            found.setdefault(name, {})[stage.name] = info
    return found


def all_parameters(stages=STAGES) -> dict[str, dict]:
    """{parameter: its first stage's declaration, with "stages": every stage that declares it, in order}."""
    return {name: {**next(iter(per_stage.values())), "stages": list(per_stage)}
            for name, per_stage in parameters_by_stage(stages).items()}


def coerce(name: str, raw: str, declared: dict):
    """A value typed on the command line, read the way the notebook's default is written: a Python literal, else
    JSON (true, null). Text where a list belongs, or a list or dict that does not parse, is BadParameter saying
    so (and where it breaks); other text passes through for the parameter's own check."""
    default_value = default(declared, name)
    if isinstance(default_value, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        pass
    try:
        return json.loads(raw)
    except ValueError as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else exc
    if raw.lstrip().startswith(("[", "{")):
        raise BadParameter(name, raw, hint=f"malformed JSON ({where})")
    if isinstance(default_value, (list, tuple)):
        example = json.dumps(default_value[:1] or ["..."])
        raise BadParameter(name, raw, hint=f"must be a list, not a single value; e.g. -p {name} '{example}'")
    return raw


def select_stages(names) -> list[Stage]:
    """None: every stage. Otherwise a list or comma-separated string of stage names, at least one."""
    if names is None:
        return list(STAGES)
    given = names
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    for n in names:
        if n not in STAGE_NAMES:
            raise BadParameter("stage", n, STAGE_NAMES)
    if not names:
        raise BadParameter("stage list", given, STAGE_NAMES, hint="give at least one stage")
    return [s for s in STAGES if s.name in names]



NO_DEFAULT = object()


def default(declared: dict, name: str):
    """A notebook parameter's default value; NO_DEFAULT for an expression the notebook evaluates."""
    try:
        return options.literal_default(declared[name]["default"])
    except (KeyError, ValueError):
        return NO_DEFAULT
