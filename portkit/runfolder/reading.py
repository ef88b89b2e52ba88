"""Reading a stage result as types: each value is read at its key path and checked as it is read, so a damaged
file is named with its key and what is wrong, once, by the reader that owns its layout.

    >>> from portkit.runfolder import reading
    >>> node = reading.Node(data, path, "compile")          # a stage result's JSON object, its file, its stage
    >>> node.obj("graph_breaks").integer("graphs")           # an int, None where absent
    >>> node.number("targets")      # UnreadableResult: "<path>: targets is {...}, not a number; rerun stage compile"

A value that is absent or null reads as the default (None, or an empty container); a value of another type raises
UnreadableResult. Keys a reader does not ask for are ignored: a stage may add keys without breaking a reader.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from portkit.core import assessed
from portkit.core.atomic_io import read_json
from portkit.core.errors import PortkitError


class UnreadableResult(PortkitError):
    """A stage result in the run folder exists but cannot be used; the message names the file and why."""


def short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_object(path: Path, stage: str, remedy: str = "") -> dict:
    """A JSON object `stage` wrote (its result, or its early file); UnreadableResult naming the file otherwise."""
    try:
        saved = read_json(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UnreadableResult(f"{path} cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); "
                               f"{remedy or f'rerun stage {stage} or remove the file'}") from None
    if not isinstance(saved, dict):
        raise UnreadableResult(f"{path} holds a {type(saved).__name__}, not a stage result; "
                               f"{remedy or f'rerun stage {stage}'}")
    return saved


@dataclass(frozen=True)
class Node:
    """One JSON value of a stage result, where it sits (file and key path) and the stage that wrote it."""
    value: object
    path: Path
    stage: str
    key: str = ""
    remedy: str = ""        # what to do about damage; default: rerun the stage

    def fail(self, what: str):
        where = self.key or "the result"
        raise UnreadableResult(f"{self.path}: {where} is {short(self.value)}, not {what}; "
                               f"{self.remedy or f'rerun stage {self.stage}'}")

    def _child(self, value, key) -> Node:
        return replace(self, value=value, key=f"{self.key}.{key}" if self.key else str(key))

    def at(self, key) -> Node:
        """The value under `key` of this object (None where absent)."""
        if not isinstance(self.value, dict):
            self.fail("an object")
        return self._child(self.value.get(key), key)

    def has(self, key) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def _typed(self, key, ok, what: str, default):
        node = self.at(key)
        if node.value is None:
            return default
        if not ok(node.value):
            node.fail(what)
        return node.value

    def text(self, key, default=None):
        return self._typed(key, lambda v: isinstance(v, str), "a string", default)

    def integer(self, key, default=None):
        return self._typed(key, is_int, "an integer", default)

    def number(self, key, default=None):
        return self._typed(key, is_number, "a number", default)

    def flag(self, key, default=None):
        return self._typed(key, lambda v: isinstance(v, bool), "true or false", default)

    def raw(self, key, default=None):
        """The JSON value under `key` as it is (a scalar the reader passes on without computing with it)."""
        value = self.at(key).value
        return default if value is None else value

    def obj(self, key) -> Node:
        """The object under `key` (an empty one where absent or null)."""
        node = self.at(key)
        if node.value is None:
            return replace(node, value={})
        if not isinstance(node.value, dict):
            node.fail("an object")
        return node

    def optional_obj(self, key) -> Node | None:
        """The object under `key`, or None where absent, null or empty."""
        node = self.obj(key)
        return node if node.value else None

    def record(self, key) -> dict | None:
        """The object under `key` as a plain dict (a record the report renders whole), None where absent or empty."""
        node = self.optional_obj(key)
        return dict(node.value) if node else None

    def items(self, key) -> list[Node]:
        """The list under `key`, one node per element (empty where absent or null)."""
        node = self.at(key)
        if node.value is None:
            return []
        if not isinstance(node.value, list):
            node.fail("a list")
        return [node._child(v, i) for i, v in enumerate(node.value)]

    def objects(self, key) -> list[Node]:
        """The list of objects under `key`."""
        found = self.items(key)
        for node in found:
            if not isinstance(node.value, dict):
                node.fail("an object")
        return found

    def entries(self, key) -> dict[str, Node]:
        """The object under `key`, one node per member."""
        node = self.obj(key)
        return {k: node.at(k) for k in node.value}

    def records(self, key) -> dict[str, dict]:
        """The object under `key` whose members are objects, as plain dicts (null members left out)."""
        found = {k: n for k, n in self.entries(key).items() if n.value is not None}
        for node in found.values():
            if not isinstance(node.value, dict):
                node.fail("an object")
        return {k: dict(n.value) for k, n in found.items()}

    def numbers(self, key) -> dict[str, float]:
        """The object under `key` whose members are all numbers (counts, shares)."""
        found = self.entries(key)
        for node in found.values():
            if not is_number(node.value):
                node.fail("a number")
        return {k: n.value for k, n in found.items()}


SHAPE = '{"batch": positive int, "seq": positive int}'


def is_positive(value) -> bool:
    return is_int(value) and value > 0


def positive_ints(node: Node, key) -> list[int] | None:
    """The list of positive integers under `key` (bucket boundaries, batch sizes); None where absent."""
    found = node.at(key)
    if found.value is None:
        return None
    if not isinstance(found.value, list) or not all(is_positive(v) for v in found.value):
        found.fail("a list of positive integers")
    return list(found.value)


def shape(node: Node, key: str) -> tuple[int, int | None]:
    """(batch, seq) of an input shape {"batch": positive int (1 when absent), "seq": positive int or None (an image
    model)}; `key` names it in the message (its list, or the shape itself)."""
    value = node.value
    if isinstance(value, dict) and is_positive(value.get("batch", 1)) and (value.get("seq") is None
                                                                           or is_positive(value["seq"])):
        return value.get("batch", 1), value.get("seq")
    raise UnreadableResult(f"{node.path}: {key} has {short(value)}, not {SHAPE}; "
                           f"{node.remedy or f'rerun stage {node.stage}'}")


def targets_of(root: Node, read_target) -> tuple[dict, dict[str, str]]:
    """({target: read_target(its node)}, {target: why it cannot be read}) of a result's "targets" object: one
    target's damage leaves the others readable."""
    per_target = root.at("targets")
    if not isinstance(per_target.value, dict):
        raise UnreadableResult(f"{root.path} has no per-target results (no \"targets\" object); "
                               f"rerun stage {root.stage}")
    found, damaged = {}, {}
    for name in per_target.value:
        node = per_target.at(name)
        try:
            if not isinstance(node.value, dict):
                node.fail("an object")
            found[name] = read_target(node)
        except UnreadableResult as exc:
            damaged[name] = str(exc)
    return found, damaged


ENVIRONMENT = "environment"   # the key save_result stamps every result with (results.KEY)


@dataclass(frozen=True)
class StageFile:
    """What every stage result holds: its file, the model, its summary, the environment it was stamped with
    (checked by results.recorded), and its per-target parts, each read by the stage's reader (`damaged`: the
    targets whose part cannot be read, and why)."""
    path: Path
    model: dict | None
    summary: str | None
    environment: object
    stamped: bool
    targets: dict
    damaged: dict[str, str]
    names: tuple[str, ...]       # every target the result holds, damaged or not, in its order

    @staticmethod
    def common(root: Node, read_target) -> dict:
        """The common fields of a stage result's root node, its targets read by `read_target`."""
        targets, damaged = targets_of(root, read_target)
        model = root.at("model").value
        if model is not None and not isinstance(model, dict):
            root.at("model").fail("an object")
        return {"path": root.path, "model": model, "summary": root.text("summary"),
                "environment": root.raw(ENVIRONMENT), "stamped": root.has(ENVIRONMENT),
                "targets": targets, "damaged": damaged, "names": tuple(root.value["targets"])}

    def target(self, name: str):
        """The typed part of target `name`; None where the result has none; UnreadableResult where it is damaged."""
        if name in self.damaged:
            raise UnreadableResult(self.damaged[name])
        return self.targets.get(name)

    def declared(self) -> Declared:
        """The model's declaration (its name, kind and inputs) as the result recorded it."""
        model = {} if self.model is None else self.model
        return Declared.from_dict(Node(model, Path(self.path), Path(self.path).stem, "model"))

    def stamp(self) -> dict:
        """The environment as results.run_environment reads it: {"environment": ...}, or {} where not stamped."""
        return {ENVIRONMENT: self.environment} if self.stamped else {}


@dataclass(frozen=True)
class TargetPart:
    """What every stage records per target: its one-line summary, its findings (each a JSON object, passed on
    to the report and portkit.stages.reconcile as they are), and the questions it left open (core.assessed)."""
    summary: str | None
    findings: tuple[dict, ...]
    not_assessed: tuple[dict, ...]      # {"question", "why"}: what the stage could not assess for the target

    @staticmethod
    def common(t: Node) -> dict:
        findings = t.objects("findings")
        for f in findings:      # the parts the report and reconcile read inside a finding
            f.obj("owner"), f.obj("where")
        questions = []
        for q in t.objects(assessed.KEY):
            question, why = q.text("question"), q.text("why")
            if not question or not why:
                q.fail('an open question {"question": text, "why": text}')
            questions.append(assessed.open_question(question, why))
        return {"summary": t.text("summary"), "findings": tuple(dict(f.value) for f in findings),
                "not_assessed": tuple(questions)}


@dataclass(frozen=True)
class TargetInfo:
    """The target a stage ran for, as it recorded it (its "target" block) and the backend it compiled with."""
    mode: str | None
    backend: str | None             # the stage's own backend, else the target's
    default_precision: dict | None

    @classmethod
    def from_dict(cls, t: Node) -> TargetInfo:
        info = t.obj("target")
        return cls(info.text("mode"), t.text("backend") or info.text("backend"), info.record("default_precision"))


@dataclass(frozen=True)
class Declared:
    """The model a stage result names ("model"): its name, kind and declared inputs."""
    name: str | None
    kind: str | None
    inputs: dict[str, list]           # input name -> [dtype, [dim names]]
    roles: dict[str, str]             # a dimension's role (batch, varies) -> its name
    masks: tuple[str, ...]
    # output name -> [stride, window, ceil]: input positions per output position along the varying dimension
    # (portkit.models.inputs.Output; [1, 1, False] where the declaration states none)
    outputs: dict[str, list] = field(default_factory=dict)
    origin: str | None = None         # where the model came from, as the run recorded it

    @classmethod
    def from_dict(cls, model: Node) -> Declared:
        declaration = model.obj("declaration")
        inputs = {}
        for i in declaration.objects("inputs"):
            inputs[i.text("name")] = [i.text("dtype", "int64"), [d.value for d in i.items("dims")]]
        roles = {d.text("role"): d.text("name") for d in declaration.objects("dims")}
        masks = tuple(declaration.obj("masks").value.values())
        outputs = {}
        for o in declaration.objects("outputs"):
            stride = o.integer("stride") or 1
            outputs[o.text("name")] = [stride, _or_int(o.integer("window"), stride), bool(o.flag("ceil"))]
        return cls(model.text("name"), model.text("kind"), inputs, roles, masks, outputs, model.text("origin"))


def _or_int(value: int | None, default: int) -> int:
    return default if value is None else value
