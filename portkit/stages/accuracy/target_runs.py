"""How a target's outputs are produced for the accuracy comparison, and the float64 reference.

    >>> from portkit.targets import numerics, specs
    >>> from portkit.stages.accuracy.target_runs import TargetSide
    >>> side = TargetSide(specs.detect("tpu"), model.module.eval(), numerics.emulate, compiled=True)
    >>> out, rows, reason, changed, f64 = side.run(inputs, specs.get("tpu").default_precision)
    >>> out, *_ = side.run(inputs, precision, compiled=True, batch=4)     # stage 2's emulated backend
    >>> side.refused               # a Refusal when the target's compiler refused the model, else None
    >>> side.label(True)           # "compiled with portkit_tpu (retraced ATen graph, eager on the CPU)"

Eager, the model runs under the target's numerics mode (numerics.emulate) or, natively, on the device;
compiled, it runs through the target's backend in calls of the deployment's batch. Outputs always come
back on the CPU, and the model is left where it was (portkit.core.placement).

A compiler that refuses the model (a symbolic shape after a graph break, say) is a finding, not a
crash: the side records the refusal, in the compiler's own words with the user's source line, and runs
eagerly from then on; its label says so ("eager emulation (compiled path refused: ...)").
"""
from __future__ import annotations

import collections
import contextlib
import copy
from dataclasses import dataclass

import torch

from portkit.core import torch_private
from portkit.core import placement
from portkit.core import availability
from portkit.targets import specs
from portkit.core.errors import CompileRefused
from portkit.stages.accuracy import footprint
from portkit.stages.accuracy.localize import LayerProbe
from portkit.targets.tolerance import Tolerance, rounds
from portkit.targets.shared_trace import Turns

EAGER = "eager emulation"


@dataclass(frozen=True)
class Refusal:
    """The target's compiler refused the model: its message, and the user's source line when known."""
    backend: str
    message: str
    where: str | None = None
    place: dict | None = None     # the source frame (core.owners.place) the cause is known by, stage 2's too

    @property
    def short(self) -> str:
        """The compiler's message up to its first detail, for labels."""
        return self.message.split(" (")[0].split(". ")[0][:100]

    def to_dict(self) -> dict:
        return {"backend": self.backend, "message": self.message, "where": self.where, "place": self.place}


def refusal(exc: BaseException, backend: str, native: bool) -> Refusal | None:
    """The refusal inside `exc`, or None for any other error. torch.compile wraps a backend's exception
    in torch._dynamo.exc.BackendCompilerFailed (its inner_exception, and __cause__); emulated, the
    refusal is portkit's CompileRefused; natively, whatever the vendor's compiler raised."""
    seen, inner = set(), exc
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if isinstance(inner, CompileRefused):
            return Refusal(backend, str(inner), inner.where["text"] if inner.where else None, inner.where)
        wrapped = getattr(inner, "inner_exception", None)
        if native and wrapped is not None and type(inner).__name__ == "BackendCompilerFailed":
            return Refusal(backend, f"{type(wrapped).__name__}: {' '.join(str(wrapped).split())[:400]}")
        inner = wrapped or inner.__cause__
    return None


def forward(module, inputs) -> dict:
    """One eager pass without autograd."""
    with torch.no_grad():
        return module(**inputs)


# The target's dtype rules alone (float64 run as float32), no rounding: what the cast alone changes.
DTYPE_RULES_ONLY = specs.Precision("dtype rules only", "(none: the dtype rules apply at every setting)",
                                         "float64 run as float32, no rounding")


def _floating(module) -> list[torch.Tensor]:
    return [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]


def float64_model(module) -> bool:
    """Whether the model is a float64 model: every floating parameter and buffer is float64."""
    found = _floating(module)
    return bool(found) and all(t.dtype == torch.float64 for t in found)


def has_float64(module) -> bool:
    """Whether any floating parameter or buffer is float64."""
    return any(t.dtype == torch.float64 for t in _floating(module))


class Float64Reference:
    """The model in float64 on the CPU, where it runs in float64 (some ops or models do not): one float64
    copy of the module, made at the first call, for every batch compared (the main batch and each bucket's).
    With a `budget` (bytes), a batch runs in calls of as many rows as fit it, sized once by one row's measured peak
    (footprint.added_bytes): a batch that fits runs whole. Float64 has no fast kernels on the CPU for some ops (a
    convolution unfolds its input into columns), so a row can cost many times its float32 pass.

        >>> out, note = Float64Reference(module, budget)(inputs)   # out None where the model does not run in float64
    """

    def __init__(self, module, budget: int | None = None):
        self.module, self._wide, self.budget = module, None, budget
        self.rows: int | None = None     # rows a call holds, once measured (None: not yet)

    def __call__(self, inputs) -> tuple[dict | None, str]:
        try:
            if self._wide is None:
                self._wide = copy.deepcopy(self.module).double()
            out = self._forward({k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
            return out, "float64 eager on the CPU"
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            return None, f"not available: the model does not run in float64 ({str(exc).splitlines()[0][:160]})"


    def _forward(self, inputs: dict) -> dict:
        """The float64 copy on `inputs`, in calls of `rows` rows where a budget is set and every output has the
        batch's rows first (else in one call)."""
        rows = len(next(iter(inputs.values()))) if inputs else 0
        if self.budget is None or rows <= 1 or any(v.dim() == 0 or len(v) != rows for v in inputs.values()):
            return forward(self._wide, inputs)
        if self.rows is None:     # one row measured first: a batch that fits runs whole, as without a budget
            try:
                _, used = footprint.added_bytes(lambda: forward(self._wide, {k: v[:1] for k, v in inputs.items()}))
                self.rows = max(1, self.budget // max(1, used))
            except Exception:  # noqa: BLE001 - a model that takes no single row (a group norm over a 1x1 map at
                # batch 1 has one value a group: Deformable DETR's input projection) runs the batch whole, as
                # without a budget; the row is portkit's measure, not the model's input
                self.rows = rows
        if self.rows >= rows:
            return forward(self._wide, inputs)
        parts = [(len(range(start, min(rows, start + self.rows))),
                  forward(self._wide, {k: v[start:start + self.rows] for k, v in inputs.items()}))
                 for start in range(0, rows, self.rows)]
        if any(not isinstance(part, dict) or any(not isinstance(t, torch.Tensor) or t.dim() == 0 or len(t) != n
                                                 for t in part.values()) for n, part in parts):
            return forward(self._wide, inputs)    # outputs whose rows do not come first: one call
        parts = [part for _, part in parts]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def compiled_label(detected: specs.DetectedTarget) -> str:
    """How a target's compiled outputs are produced, in words. Emulated, stage 2's backend runs its
    retraced ATen graph (the target's casts and rounding included) eagerly: no code generation."""
    where = f"on {detected.target.device}" if detected.native else "retraced ATen graph, eager on the CPU"
    return f"compiled with {detected.backend} ({where})"


class SharedCompile:
    """The emulated targets' compiled runs in one Dynamo pass (portkit.targets.shared_trace), each target's backend
    at the
    precision judged: a shape is traced once, not once a target; what each target's rules changed is recorded
    per input shape, whichever target's call compiled it.

        >>> shared = SharedCompile.for_targets(module, ["neuron", "tpu"], None, compiled=True)
        >>> TargetSide(specs.detect("tpu"), module, numerics.emulate, True, shared)
    """

    def __init__(self, module, precisions: dict):
        from portkit.targets import backends  # stage 2: registers portkit_neuron / portkit_tpu
        self.backends = {n: backends.emulated_backend(n, p) for n, p in precisions.items()}
        self.counters = {n: backends.CompileCounter(b) for n, b in self.backends.items()}
        self.turns = Turns(self.counters)
        self.precisions, self.shapes = precisions, set()
        self.numerics: dict[str, dict] = {n: {} for n in precisions}     # target -> input shape -> its rules' changes
        torch.compiler.reset()
        self.fn = torch.compile(module, backend=self.turns, dynamic=False)

    @classmethod
    def for_targets(cls, module, names, precision: dict | None, compiled: bool) -> SharedCompile | None:
        """One for the emulated targets of `names` at their chosen precisions; None where fewer than two."""
        chosen = {n: specs.get(n).precision((precision or {}).get(n, specs.get(n).default_precision.name))
                  for n in names if not specs.detect(n).native}
        return cls(module, chosen) if compiled and len(chosen) > 1 else None

    def run(self, name: str, inputs: dict) -> tuple[dict, dict | None]:
        """(outputs, what the target's rules changed in the graphs of this input shape, whichever target's
        call compiled them; None where none was compiled)."""
        shape, before = input_shape(inputs), {n: len(c.events) for n, c in self.counters.items()}
        self.turns.turn = name
        self.shapes.add(shape)
        try:
            # every shape compiles (see TargetSide)
            with torch.no_grad(), torch_private.recompile_limit(len(self.shapes)):
                out = self.fn(**inputs)
        finally:   # also where this target refused: the others compiled in its call
            for target, counter in self.counters.items():
                if len(counter.events) > before[target]:
                    changed = collections.Counter()
                    for event in counter.events[before[target]:]:
                        changed.update(event.check.numerics)
                    self.numerics[target][shape] = dict(changed)
        return out, self.numerics[name].get(shape)


class TargetSide:
    """How one target's outputs are produced: eager under the emulation mode, or compiled with the
    target's backend (stage 2's emulated one, its graph run eagerly on the CPU; with `shared`, in one Dynamo
    pass with the other emulated targets); natively, on the device."""

    def __init__(self, detected: specs.DetectedTarget, module, emulation, compiled: bool,
                 shared: SharedCompile | None = None):
        self.detected, self.module, self.emulation, self.compiled = detected, module, emulation, compiled
        self.shared = shared if shared is not None and detected.name in shared.backends else None
        self.eager_label = f"native on {detected.target.device}, eager" if detected.native else EAGER
        if not detected.native and getattr(emulation, "__name__", "emulate") != "emulate":
            self.eager_label = f"{EAGER}, {emulation.__name__}"
        self.compiled_label = compiled_label(detected)
        # the compiled function and its backend per precision: an emulated backend bakes its precision in
        self._compiled: dict[str, tuple] = {}
        self._numerics, self._shapes = {}, set()
        self.refused: Refusal | None = None
        # rows split into calls of `batch` only where every input's batch axis is its first (a recurrent state
        # is (layers, batch, hidden)): otherwise the whole batch goes in one call
        self.batch_first = True
        self.float64_cast = False    # an eager emulated run has run a float64 op as float32

    def float32_on_cpu(self, precision) -> bool:
        """Whether this side computes what the CPU's own float32 computes: emulated, at a precision that rounds
        nothing, and no float64 op cast (seen in the eager runs, which come first). Its error against float64 is
        then the CPU's float32 rounding, summed in the order its graph sums, and says nothing about the target."""
        return not self.detected.native and not rounds(precision) and not self.float64_cast

    def label(self, compiled: bool) -> str:
        if compiled and self.refused is not None:
            return f"{self.eager_label} (compiled path refused: {self.refused.short})"
        return self.compiled_label if compiled else self.eager_label

    def run(self, inputs, precision, probe: LayerProbe | None = None, tol: Tolerance | None = None,
            compiled: bool = False, batch: int | None = None):
        """Returns (outputs on the CPU, layer rows or None, first layer reason, what the target's rules
        changed, float64 ops run as float32). Compiled, `batch` rows go in each call (see chunks); once the
        target's compiler has refused the model, compiled runs are eager (see `refused`)."""
        device = self.detected.target.device if self.detected.native else "cpu"
        with placement.on_device(self.module, device, inputs) as inputs:
            if compiled and self.refused is None:
                try:
                    calls = list(chunks(inputs, batch if self.batch_first else None))
                    parts = [self._run_compiled(chunk, precision) for chunk in calls]
                except Exception as exc:   # only a refusal is kept; any other error propagates
                    self.refused = refusal(exc, self.detected.backend, self.detected.native)
                    if self.refused is None:
                        raise
                else:
                    rows = len(next(iter(inputs.values())))
                    out = {k: torch.cat([p[k] for p in parts])[:rows] for k in parts[0]}
                    return out, None, None, self._numerics.get(input_shape(calls[0]), {}), {}
            mode = None if self.detected.native else self.emulation(self.detected.target, precision)

            def fn():
                with mode or contextlib.nullcontext():
                    return self.module(**inputs)
            if probe is None:
                with torch.no_grad():
                    out, rows, reason = fn(), None, None
            else:
                out, rows, reason = probe.compare(fn, tol, mode)
        self.float64_cast = self.float64_cast or bool(mode and mode.float64_ops)
        return (placement.to_device(out, "cpu"), rows, reason, dict(mode.stats) if mode else {},
                dict(mode.float64_ops) if mode else {})

    def _run_compiled(self, inputs, precision) -> dict:
        if self.shared is not None and self.shared.precisions[self.detected.name] == precision:
            out, changed = self.shared.run(self.detected.name, inputs)
            if changed is not None:
                self._numerics[input_shape(inputs)] = changed
            return placement.to_device(out, "cpu")
        if precision.name not in self._compiled:
            # One target's graphs at a time (torch.compiler.reset docs: reset between unrelated compilations).
            torch.compiler.reset()
            self._compiled.clear()
            if self.detected.native:
                backend = self.detected.backend   # the vendor's compiler; its precision is its flag
            else:
                from portkit.targets import backends  # stage 2: registers portkit_neuron / portkit_tpu
                backend = backends.emulated_backend(self.detected.name, precision)
            self._compiled[precision.name] = (torch.compile(self.module, backend=backend, dynamic=False), backend)
            self._shapes = set()
        fn, backend = self._compiled[precision.name]
        checks = getattr(backend, "checks", None)
        before = len(checks) if checks is not None else 0
        # Dynamo runs a function eagerly after recompile_limit shapes (pytorch/pytorch#114511): an
        # uncompiled bucket would pass for a compiled one, so every shape this side runs must compile.
        self._shapes.add(input_shape(inputs))
        with torch.no_grad(), torch_private.recompile_limit(len(self._shapes)):
            out = fn(**inputs)
        if checks is not None and len(checks) > before:
            changed = collections.Counter()
            for check in list(checks)[before:]:
                changed.update(check.numerics)
            self._numerics[input_shape(inputs)] = dict(changed)
        return placement.to_device(out, "cpu")


def chunks(inputs: dict, batch: int | None):
    """The batch in calls of `batch` rows, the last one filled with copies of its first row, as a
    bucketed deployment calls its compiled graphs (bucketed.BucketedModel). The same shapes as stage 2's
    fixed shape and stage 3's buckets are the same graphs, checked as the deployment's were."""
    rows = len(next(iter(inputs.values())))
    if not batch or batch == rows:
        yield inputs
        return
    for start in range(0, rows, batch):
        chunk = {k: v[start:start + batch] for k, v in inputs.items()}
        short = batch - len(next(iter(chunk.values())))
        yield {k: torch.cat([v, v[:1].expand(short, *v.shape[1:])]) if short else v for k, v in chunk.items()}


def input_shape(inputs: dict) -> tuple:
    return tuple((k, tuple(v.shape)) for k, v in inputs.items())


def compiled_available() -> bool:
    """Whether stage 2's emulated backends are present (portkit/targets/backends.py)."""
    return availability.module_available("portkit.targets.backends")
