"""Stage options as data: each stage's options are one frozen dataclass, built from its notebook's
parameters cell (the one source of every default and its help text), validated in one place.

    >>> from portkit.stages.fallbacks.stage import Options
    >>> Options.defaults().batch_size                          # the default written in notebooks/01_fallbacks.py
    8
    >>> Options.of({"batch_size": 4}).batch_size               # a user's values over the defaults, checked
    4
    >>> Options.of({"batch_size": -1})                         # BadParameter: invalid batch_size -1: ...

A stage declares only how each field is checked (`CHECKS`: one check per parameter, a function of (name, value)
that returns the value to use) and any rule across fields or on the model (`check`); the fields, their
defaults and their documentation come from the notebook. What every stage shares (model, targets, out_dir)
is checked by `common`.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, ClassVar

from portkit.core.errors import BadParameter
from portkit.core.locations import NOTEBOOKS
from portkit.models import meta_device
from portkit.models import registry
from portkit.targets import specs

SHARED = ("model", "targets", "out_dir")   # every notebook's first three parameters, checked by common()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One line of a notebook's parameters cell: `name = default  # help`."""
    name: str
    default: Any
    help: str
    source: str          # the default as written


def declared(notebook: str) -> dict[str, dict]:
    """`notebooks/<notebook>`'s parameters cell as papermill's inspector reads it: {name: {name, default, help}}."""
    path = NOTEBOOKS / notebook
    return {name: dict(info) for name, info in _inspect(str(path), path.stat().st_mtime_ns).items()}


@functools.lru_cache(maxsize=32)
def _inspect(path: str, mtime_ns: int) -> dict[str, dict]:
    """The cell tagged "parameters" (papermill's tag), one `name = default  # help` per line, read with the
    standard library: papermill's own inspector imports nbformat and with it jsonschema, whose format checkers
    build their grammars at import, a cost every stage kernel would pay to build its options. The notebook is JSON
    (nbformat 4); each top-level assignment is a parameter, its default the value's source and its help the
    comment on its line, as papermill's PythonTranslator.inspect reads them."""
    import io
    import json
    import tokenize
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    cell = next((c for c in cells if "parameters" in c.get("metadata", {}).get("tags", ())), None)
    if cell is None:
        return {}
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            found[name] = {"name": name, "default": ast.get_source_segment(source, node.value),
                           "help": comments.get(node.end_lineno, "")}
    return found


def literal_default(source: str):
    """A notebook parameter's default as written in its parameters cell, read as the Python literal it is;
    ValueError where it is not one (an expression the notebook evaluates)."""
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"not a literal: {source}") from exc


def notebook_parameters(notebook: str) -> tuple[Parameter, ...]:
    """The parameters `notebooks/<notebook>` declares, in the cell's order."""
    found = []
    for name, info in declared(notebook).items():
        try:
            default = literal_default(info["default"])
        except ValueError as exc:
            raise TypeError(f"{notebook}: parameter {name} = {info['default']} is not a literal") from exc
        found.append(Parameter(name, default, (info.get("help") or "").strip(), info["default"]))
    return tuple(found)


def check_corpus(name: str, value) -> str:
    """A check (name, value) -> value for a stage's corpus parameter: corpora.corpus.check_corpus's reading of it."""
    from portkit.corpora import corpus
    return corpus.check_corpus(value)


class StageOptions:
    """The base of every stage's options: subclass with NOTEBOOK and CHECKS, then call `options_for`."""
    NOTEBOOK: ClassVar[str] = ""
    CHECKS: ClassVar[dict[str, Callable[[str, Any], Any]]] = {}

    def check(self, model: str | None) -> None:
        """Rules across fields, or on the model spec (override); a single field's rule belongs in CHECKS."""

    def check_targets(self, targets) -> None:
        """Rules on the run's targets, e.g. a backend or a precision each target accepts (override)."""

    @classmethod
    def parameters(cls) -> tuple[Parameter, ...]:
        return tuple(p for p in notebook_parameters(cls.NOTEBOOK) if p.name not in SHARED)

    @classmethod
    def defaults(cls):
        return cls.of({})

    @classmethod
    def of(cls, values: dict[str, Any], model: str | None = None):
        """The options from `values` (a notebook's namespace, the runner's -p values, keyword arguments):
        each field takes its value there, else the notebook's default; anything else in `values` is ignored.
        Each field is checked, then the rules across fields and on `model` (a validated spec)."""
        built = options_for(cls)
        names = {f.name for f in dataclasses.fields(built)}
        chosen = built(**{k: v for k, v in values.items() if k in names})
        chosen.check(model)
        return chosen


def _post_init(self) -> None:
    for field in dataclasses.fields(self):
        value = self.CHECKS[field.name](field.name, getattr(self, field.name))
        object.__setattr__(self, field.name, value)


@functools.cache
def options_for(cls: type) -> type:
    """The frozen dataclass for a StageOptions subclass: one field per notebook parameter, its default and
    help from the cell (in the field's metadata), every field checked on construction."""
    params = cls.parameters()
    unchecked = [p.name for p in params if p.name not in cls.CHECKS]
    unknown = sorted(set(cls.CHECKS) - {p.name for p in params})
    if unchecked or unknown:
        raise TypeError(f"{cls.__qualname__}: parameters without a check {unchecked}, checks without a parameter "
                        f"{unknown} (notebooks/{cls.NOTEBOOK})")
    fields = [(p.name, Any, dataclasses.field(default_factory=functools.partial(copy.deepcopy, p.default),
                                              metadata={"help": p.help, "default": p.source}))
              for p in params]
    built = dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), frozen=True,
                                       namespace={"__post_init__": _post_init, "__module__": cls.__module__,
                                                  "__doc__": cls.__doc__})
    return built


def common(model: str, targets, out_dir: str, announce: bool = True) -> tuple[str, list[str], Path]:
    """Validate the parameters every stage shares; print the decisions a user should see (each target's mode), or,
    with announce=False, leave them to the caller (the runner prints them once its whole plan holds, so that bad
    input is the only line). A model is a portkit.models spec, or an abstract model's name (a real-size config
    without weights: llama3-8b)."""
    registry.refuse_url(model)
    if not meta_device.is_name(model):
        try:
            model = registry.validate(model)
        except BadParameter as exc:
            if exc.what == "model" and exc.choices:      # an unknown name: the abstract models are names too
                raise BadParameter("model", model, [*exc.choices, *meta_device.names()]) from None
            raise
    names = specs.parse_targets(targets)
    if not isinstance(out_dir, str) or not out_dir:
        raise BadParameter("out_dir", out_dir, hint="give a folder path")
    try:
        out = Path(out_dir).expanduser().resolve()
    except (OSError, RuntimeError):   # pathlib raises RuntimeError on a symlink loop (Python < 3.13)
        from portkit.core import checks
        raise BadParameter("out_dir", out_dir, hint=checks.missing_path(Path(out_dir).expanduser())) from None
    for name in names if announce else ():
        print(specs.detect(name))
    return model, names, out


def announce_targets(names) -> list[str]:
    """Each target's mode line ("target neuron: emulated, ..."), as common() prints it."""
    return [str(specs.detect(name)) for name in names]
