"""How much memory one row of a pass takes, and how many rows a pass of the accuracy stage may hold.

    >>> from portkit.stages.accuracy import footprint
    >>> per_row = footprint.row_bytes(model, inputs, fixed_rows=False)   # peak activations of one row, longest item
    >>> footprint.rows_per_pass(per_row, wanted=32, budget=footprint.pass_budget())   # 32, or fewer where they
    ...                                                                                # would not fit

The stage streams its task sample through the model pass by pass and keeps per-item values, not outputs: a
pass's memory is its rows' activations. Those are measured, not guessed: LiveBytes counts the bytes of the
tensors the model's ops create and still hold, at their peak, on one row of the main batch. A pass holds at most
`wanted` rows and no more than fit pass_budget() at PASS_OVERHEAD times that peak, one row at least.
"""
from __future__ import annotations

import weakref

import torch

from portkit.core import memory
from portkit.core.torch_private import TorchDispatchMode, tree_leaves
from portkit.models.inputs import BATCH

# portkit's cap on one pass's activations, and the share of the memory available when the stage starts that a pass
# may take at most: the model, its float64 copy, the compiled graphs and the other kernel of the run share the rest
PASS_BYTES = 2 * memory.GIB
PASS_SHARE = 0.25
# An emulated pass holds more than the plain one measured: the numerics mode rounds each matmul's two operands
# into copies beside the op's output (portkit/targets/numerics.py), so up to three tensors where eager holds one.
PASS_OVERHEAD = 3


class LiveBytes(TorchDispatchMode):
    """The peak bytes of the tensors ops create while the mode is active and that are still referenced (the
    activations): a storage counts once, however many views share it, until its last tensor is freed; a view of
    a tensor made before (an input, a weight) counts nothing.

        >>> with LiveBytes() as meter:
        ...     module(**inputs)
        >>> meter.peak
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._storages: dict[int, list[int]] = {}      # storage address -> [tensors alive, bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        older = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in given:
                self._track(t, older)
        return out

    def _track(self, t: torch.Tensor, older: set) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        entry = self._storages.get(key)
        if entry is None:
            if key == 0 or key in older:          # empty, or a view of a tensor this pass did not create
                return
            entry = self._storages[key] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._storages[key]


def added_bytes(fn) -> tuple[object, int]:
    """Run `fn` once: (its result, the bytes it added at its peak). The larger of what LiveBytes counts and what
    the process's resident memory rose by (memory.Sampled): an op's own workspace (the columns a float64
    convolution unfolds its input into, say) is no tensor an op returns, and the allocator's pages are more than
    the tensors they hold."""
    with memory.Sampled() as seen, LiveBytes() as meter:
        out = fn()
    return out, max(meter.peak, seen.added or 0)


def row_bytes(model, inputs: dict, fixed_rows: bool, metric=None) -> int:
    """The peak bytes one row of `inputs` adds through the model (eager, no autograd: added_bytes), then through
    `metric(outputs, row)` where given (a language model's per-item values hold several copies of its logits),
    scaled to the longest item the model takes along its varying dimension where a pass's rows are padded to
    their own longest item (`fixed_rows` False: a recording of the declared maximum length costs that much more)."""
    # one row along each input's declared batch axis (a recurrent state is (layers, batch, hidden))
    row = model.declaration.fit(inputs, {BATCH: 1}, pad=False)
    try:
        peak = _measured(model, row, metric)
    except Exception:  # noqa: BLE001 - a model that takes no single row (a group norm over a 1x1 map has one value
        # a group at batch 1: Deformable DETR's input projection): the batch as given, per row; one row is portkit's
        # measure, not the model's input
        row, rows = inputs, max(1, len(next(iter(inputs.values()))))
        peak = _measured(model, inputs, metric) // rows
    scale = 1.0
    dim = model.seq_dim
    if dim and not fixed_rows:
        longest = model.declaration.dim(dim).max
        scale = max(1.0, longest / max(1, model.declaration.size_of(row, dim))) if longest else 1.0
    return int(peak * scale)


def _measured(model, row: dict, metric) -> int:
    """The peak bytes `row` adds through the model, and through metric(outputs, row) where given."""
    with torch.no_grad():
        # Once unmeasured first: a first call's one-time costs are no row's activations. Weights loaded from
        # safetensors are memory-mapped (safetensors.torch.load_file maps the file) and enter resident memory
        # when an op first reads them; a module may build a buffer on its first call and keep it. The first call
        # runs under the measure too, its result dropped: the measure's own first use in a process (its sampling
        # thread, its dispatch mode) raised resident memory by about 36 MiB, counted as the row's.
        added_bytes(lambda: model.module(**row))
        out, peak = added_bytes(lambda: model.module(**row))
        if metric is not None:
            peak += added_bytes(lambda: metric(out, row))[1]
    return peak


def pass_budget(available: int | None = None) -> int:
    """Bytes one pass's activations may take: PASS_BYTES, or PASS_SHARE of the memory available (`available`
    bytes; None: the machine's now) where that is less."""
    free = memory.available() if available is None else available
    return min(PASS_BYTES, int(PASS_SHARE * free)) if free else PASS_BYTES


def rows_per_pass(per_row: int, wanted: int, budget: int) -> int:
    """Rows a pass holds: `wanted`, or as many as fit `budget` at PASS_OVERHEAD times `per_row` bytes each where
    fewer; one at least (a single row is the least a pass can hold)."""
    return max(1, min(wanted, budget // max(1, per_row * PASS_OVERHEAD)))


# ---------------------------------------------------------------- the plan step's estimate
# The stage's memory beside its passes, for the plan step's estimate (an estimate: the bench measures the real peak,
# docs/benchmarks/memory.md). The interpreter with torch and portkit imported; the model's weights three times (the
# float32 model and its float64 copy, twice as wide); the main batch's rows at MAIN_BATCH_OVERHEAD times one row's
# activations: an emulated pass (PASS_OVERHEAD), the layer probe's copy of every module's output (one more), the
# float64 pass (two more: twice as wide); and one task-sample pass at its budget.
INTERPRETER_BYTES = memory.GIB
WEIGHT_COPIES = 3
MAIN_BATCH_OVERHEAD = PASS_OVERHEAD + 3


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _at_longest(model, row: dict, budget: int, scaled: int) -> int:
    """One row's bytes measured at the longest length its varying dimension takes, where row_bytes' proportional
    estimate (`scaled`) would refuse the batch and one such row is safe to run (within MEASURE_SHARE of `budget`):
    activations need not grow with the length (Kimi Linear's chunked attention: about 205 MiB at 16, 32 and 64
    tokens), and a refusal rests on a measure, not on a scale. `scaled` where it cannot be measured."""
    dim = model.seq_dim
    longest = model.declaration.dim(dim).max if dim else None
    if not longest or scaled > MEASURE_SHARE * budget:
        return scaled
    at = model.declaration.fit(row, {dim: longest})
    if model.declaration.size_of(at, dim) != longest:
        return scaled
    return _measured(model, at, None)


MEASURE_SHARE = 0.5     # one row measured at its longest length where its estimate is within this share of the budget


def stage_estimate(model, row: dict, batch_size: int, budget: int | None = None) -> tuple[int, int]:
    """An estimate of the stage's peak bytes with a main batch of `batch_size` rows like `row` (one row of the main
    batch, padded as the stage pads it), and the largest batch_size whose estimate is within `budget` bytes (None:
    the estimate's own batch_size), 0 where not even one row is."""
    per_row = row_bytes(model, row, fixed_rows=False) * MAIN_BATCH_OVERHEAD
    fixed = INTERPRETER_BYTES + WEIGHT_COPIES * weight_bytes(model.module) + pass_budget()
    if budget is not None and fixed + batch_size * per_row > budget:
        per_row = _at_longest(model, row, budget, per_row // MAIN_BATCH_OVERHEAD) * MAIN_BATCH_OVERHEAD
    fits = batch_size if budget is None else max(0, (budget - fixed) // max(1, per_row))
    return fixed + batch_size * per_row, int(fits)
