"""The bucketed model (stage 3's runtime half): pad every input to its bucket, run the compiled model, slice the
outputs back to their real positions (output_probe.py), and check that padding changes no real output.

    >>> from portkit.stages.buckets import bucketed
    >>> model = bucketed.BucketedModel(m, plan, backend="inductor")
    >>> model.warm_up()                                   # one compile per (batch, seq) shape
    >>> with torch.compiler.set_stance("fail_on_recompile"):
    ...     out = model(model.encode(["Return the sum of a and b."]))   # outputs at the true length
    >>> model.late                                        # compiles the stance refused, then paid: []

Replaying a trace through it is trace_replay.py's.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from portkit.core import torch_private
from portkit.models import padding_side
from portkit.targets import numerics
from portkit.targets import tolerance
from portkit.targets.backends import (CompileCounter, EmulatedBackend, call_counting_recompiles, warm_inductor)
from portkit.core.errors import BadParameter
from portkit.corpora.corpus import Trace
from portkit.planning.planner import BucketPlan
from portkit.targets.tolerance import Tolerance
from portkit.stages.buckets import output_probe


def compile_backend(backend, inductor: bool = False):
    """What torch.compile gets for `backend`: a name Dynamo knows, or a backend object. The name of an
    emulated target backend (portkit_neuron, portkit_tpu) becomes a fresh EmulatedBackend with Inductor
    codegen only when asked: the replay checks and emulates each graph, then runs it eagerly."""
    if isinstance(backend, str):
        known = torch_private.known_backends()
        found = torch_private.backend_by_name(backend) if backend in known else None
        if isinstance(found, EmulatedBackend):
            return EmulatedBackend(found.target, found.precision.name, inductor=inductor)
        if found is None:
            raise BadParameter("compile backend", backend, sorted(known), hint="see torch._dynamo.list_backends()")
    return backend


def backend_name(backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def _emulated(backend) -> EmulatedBackend | None:
    """The emulated backend behind `backend` (an object or a registered name), or None for any other."""
    if isinstance(backend, EmulatedBackend):
        return backend
    known = isinstance(backend, str) and backend in torch_private.known_backends()
    found = torch_private.backend_by_name(backend) if known else None
    return found if isinstance(found, EmulatedBackend) else None


def warm(backend) -> None:
    # Inductor's first compile in a process also starts its toolchain: pay it before any run is timed, when the
    # replay compiles with Inductor at all.
    emulated = _emulated(backend)
    if backend == "inductor" or (emulated is not None and emulated.inductor):
        warm_inductor()


def padding_tolerance(backend) -> Tolerance:
    """The padding check's tolerance (tolerance.padding_tolerance) for the backend's precision."""
    emulated = _emulated(backend)
    return tolerance.padding_tolerance(emulated.precision if emulated is not None else None)


def reference_numerics(backend):
    """What the unpadded eager reference runs under: the emulated backend's own target numerics
    (numerics.emulate), so the padding check compares padding, not precision; else nothing."""
    emulated = _emulated(backend)
    if emulated is None:
        return contextlib.nullcontext
    return lambda: numerics.emulate(emulated.target, emulated.precision.name)


# Texts of two lengths: the warm-up's example, and the batch the side the model pads on is read from.
EXAMPLE_TEXTS = ("Return the sum of a and b.", "Sum.")


class BucketedModel:
    """A model that pads every input along its varying dimension (its declaration's, portkit/models/inputs.py) to
    its plan's bucket, runs one torch.compile'd module, and slices sequence- and batch-shaped outputs back
    to the true size."""

    def __init__(self, model, plan: BucketPlan, backend="inductor", device: str = "cpu", inductor: bool = False):
        if model.seq_dim is None:
            raise BadParameter("model for shape bucketing", model.name, hint="no dimension of its inputs varies")
        if plan.top > model.max_length:
            raise BadParameter("largest bucket", plan.top, hint=f"{model.name} takes at most {model.max_length}")
        self.model, self.plan = model, plan
        self.backend = compile_backend(backend, inductor)
        self.counter = CompileCounter(self.backend)      # stage 2's: counts and times every compile
        self.late: list[dict] = []       # compiles refused under fail_on_recompile: request, shape, guard
        self.compiled = torch.compile(model.module, backend=self.counter, dynamic=False)
        self.declaration, self.dim = model.declaration, model.seq_dim
        # the side the model's own batches hold their padding on (a decoder's tokenizer pads on the left): every
        # bucket is padded there, so the padding check checks the padding the model gets
        self.side = padding_side.pads_on(model, list(EXAMPLE_TEXTS) if self.plain_texts else None)
        self.device = device             # the target's device in native mode; the module must be there
        # per output: its batch and varying dims, its real positions
        self.follows = output_probe.output_dims(model, device)
        self.dims = {name: (o.batch, o.seq) for name, o in self.follows.items()}

    @property
    def plain_texts(self) -> bool:
        return plain_texts(self.model)

    @contextlib.contextmanager
    def padded_on(self, side: str):
        """Every bucket padded on `side` inside the block, the tokenizer's side too where the model has one (as the
        advice to flip it would set it), the model's own side again after it."""
        own, self.side = self.side, side
        try:
            with padding_side.padding_on(self.model, side) if padding_side.side_of(self.model) else \
                    contextlib.nullcontext():
                yield
        finally:
            self.side = own

    @property
    def compiles(self) -> int:
        return len(self.counter.events)

    def encode(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Tokenize with the plan's overflow policy: cut at the largest bucket (special tokens kept),
        or raise BadParameter naming the length."""
        return self.model.encode(list(texts), max_length=self.plan.top, truncate=self.plan.overflow == "truncate")

    def pad(self, inputs: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int, int]:
        """Inputs padded to their (batch, seq) bucket; also the true rows and length."""
        rows, length = self.declaration.rows(inputs), self.declaration.size_of(inputs, self.dim)
        self.plan._check_overflow(np.array([length]))
        length = min(length, self.plan.top)          # overflow "truncate": cut at the largest bucket
        seq, batch = self.plan.bucket_for(length), self.plan.batch_for(rows)
        # cut or padded along the varying dimension; more rows are copies of a real one (Declaration.fit)
        padded = self.declaration.fit(inputs, {self.dim: seq}, rows=batch, side=self.side)
        return {name: _dense(t).to(self.device) for name, t in padded.items()}, rows, length

    def unpad(self, outputs: dict[str, torch.Tensor], rows: int, length: int) -> dict[str, torch.Tensor]:
        """Outputs cut to the true rows and, along the dims that follow the input, the real positions of
        `length` input positions (output_probe.OutputDims.positions: `length` itself, or a strided output's frames)."""
        return {name: self.real_part(name, t, slice(0, rows), length) for name, t in outputs.items()}

    def real_part(self, name: str, t: torch.Tensor, rows: slice, length: int) -> torch.Tensor:
        """Output `name` at the given rows (along its batch dims) and its real positions for `length`: the first
        ones, or the last where the buckets are padded on the left."""
        follows = self.follows.get(name, output_probe.OutputDims())
        index = [slice(None)] * t.dim()
        for d in follows.batch:
            index[d] = rows
        for d in follows.seq:
            n = follows.positions(length)
            index[d] = slice(0, n) if self.side == "right" else slice(t.shape[d] - n, t.shape[d])
        return t[tuple(index)]

    def run_padded(self, padded: dict[str, torch.Tensor], request: int | None = None) -> dict[str, torch.Tensor]:
        """The compiled module on inputs already padded to a bucket. Under fail_on_recompile a compile
        the stance refuses (a shape the warm-up left out) is recorded in self.late, then compiled with
        the stance lifted and counted (backends.call_counting_recompiles): counted, not fatal."""
        self.counter.request = request
        with torch.no_grad():
            return call_counting_recompiles(lambda x: self.compiled(**x), padded, self.late, request)

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        padded, rows, length = self.pad(inputs)
        return self.unpad(self.run_padded(padded), rows, length)

    def example(self, batch: int, seq: int) -> dict[str, torch.Tensor]:
        """Inputs of one bucket's shape, for warm-up (example_inputs), on the run's device."""
        return {k: v.to(self.device) for k, v in example_inputs(self.model, batch, seq, self.side).items()}

    def warm_up(self, progress: bool = False, costs: dict | None = None) -> list[dict]:
        """Compile every (batch, seq) shape of the plan once. Returns per shape: seconds (wall time of
        the first call) and graphs compiled."""
        from portkit.core.progress import bar as progress_bar
        done = []
        with torch_private.recompile_limit(self.plan.compiles), torch.no_grad():
            for shape in progress_bar(self.plan.shapes(), desc=f"warm-up {self.plan.planner}", disable=not progress,
                              leave=False):
                inputs = self.example(shape["batch"], shape["seq"])
                before, start = self.compiles, time.perf_counter()
                self.compiled(**inputs)
                seconds = time.perf_counter() - start
                graphs = self.compiles - before
                charged = charge(costs, self.model, backend_name(self.backend), inputs, seconds) if graphs else 0.0
                done.append({**shape, "seconds": seconds, "charged_seconds": charged, "graphs": graphs})
        return done


def plain_texts(model) -> bool:
    """Whether the model's items are plain texts (one varying dimension, tokens)."""
    return bool(model.takes_text) and len(model.declaration.varying) == 1


def example_inputs(model, batch: int, seq: int, side: str | None = None) -> dict[str, torch.Tensor]:
    """Inputs of one bucket's shape: a short real text cut or padded (on `side`, default the side the model's batches
    pad on); data other than plain texts: the declaration's dummy()."""
    declaration, dim = model.declaration, model.seq_dim
    if not plain_texts(model):
        return {k: _dense(v) for k, v in declaration.dummy(batch, {dim: seq}).items()}
    # the tokenizer cannot cut below its special tokens: slice for buckets of 1 or 2 tokens
    one = model.encode([EXAMPLE_TEXTS[0]], max_length=max(seq, 3))
    fitted = declaration.fit(one, {dim: seq}, rows=batch, side=side or padding_side.pads_on(model))
    return {k: _dense(v) for k, v in fitted.items()}


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A fresh row-major copy. Dynamo guards on strides too, even of size-1 dims, so a sliced view
    of the same shape would be a new graph (a recompile, an error under fail_on_recompile)."""
    return torch.empty(t.shape, dtype=t.dtype).copy_(t)


def charge(costs: dict | None, model, backend: str, inputs: dict, seconds: float) -> float:
    """The compile time charged for a shape: its first measured compile in this session. A later run
    that compiles the same shape may hit the compiler's cache; charging the first (cold) measurement
    keeps the order of the runs from favouring any plan."""
    if costs is None:
        return seconds
    key = (id(model.module), backend, tuple((k, tuple(v.shape)) for k, v in inputs.items()))
    return costs.setdefault(key, seconds)


def compile_cache(fresh: bool):
    """An empty Inductor cache for the block (_torch.fresh_compile_cache), or nothing."""
    return torch_private.fresh_compile_cache() if fresh else contextlib.nullcontext()


# ---------------------------------------------------------------- padding correctness
def check_inputs(bm: BucketedModel, trace: Trace, batch: int, seq: int, prev_batch: int, prev_seq: int,
                 seed: int = 0) -> tuple[list[dict], list[int]]:
    """Real texts that land in bucket (batch, seq): prev_batch + 1 rows (so batch padding is
    exercised when the bucket is wider), lengths spread over (prev_seq, seq] from the shortest (the
    most padding) up, each a corpus text cut at that length by the tokenizer (kept at least 3 tokens
    long where the bucket allows). Returns the per-row inputs (unpadded) and their lengths."""
    rng = np.random.default_rng(seed + seq * 131 + batch)
    rows = prev_batch + 1
    # [CLS] word [SEP]: the most padding a real text gets; any other item: the dimension's smallest size
    shortest = max(prev_seq + 1, min(max(3, bm.declaration.dim(bm.dim).min), seq))
    wanted = np.linspace(shortest, seq, rows + 1)[:-1].round().astype(int) if rows > 1 else [shortest]
    out, lengths = [], []
    for length in wanted:
        candidates = np.flatnonzero(trace.pool_lengths >= length)
        text = trace.pool_texts[int(rng.choice(candidates))] if candidates.size else max(trace.pool_texts, key=len)
        # the tokenizer cannot cut below its special tokens ([CLS] x [SEP]); shorter rows are sliced
        enc = bm.model.encode([text], max_length=max(int(length), 3))
        enc = bm.declaration.fit(enc, {bm.dim: int(length)}, pad=False)
        got = bm.declaration.size_of(enc, bm.dim)
        if not prev_seq < got <= seq:
            raise RuntimeError(f"no check input of {length} tokens for bucket {seq}: the corpus gave {got}")
        out.append(enc)
        lengths.append(got)
    return out, lengths


def check_padding(bm: BucketedModel, trace: Trace, reference=None, rtol: float | None = None,
                  atol: float | None = None) -> list[dict]:
    """Per bucket shape: the bucketed (padded, compiled) outputs at real positions against the
    unpadded eager outputs, with torch.testing.assert_close. `reference` is a context manager factory
    the eager run happens under (default: reference_numerics(bm.backend), the emulated target's
    numerics); rtol/atol default to padding_tolerance(bm.backend).

    Each bucket is padded on the side the model's own batches are (bm.side). A shape that fails is checked again
    padded on the other side where the tokenizer's side moves the declaration's padding (padding_side.flippable):
    its "other_side" says whether that side passes ({"side", "ok", "failures"}), which the padding finding's advice
    says it tried.

    Real positions are each output's OutputDims.positions of the row's length (output_probe.py). An output whose real
    positions cannot be told (OutputDims.unchecked, or a padded output whose real part is not the unpadded output's
    shape) is not compared: it is listed in "unchecked" with why, and the shape's "ok" is None unless another output
    failed (False) — a padding check that could not run is no evidence that padding changes the outputs."""
    reference = reference or reference_numerics(bm.backend)
    if rtol is None or atol is None:
        tol = padding_tolerance(bm.backend)
        rtol, atol = tol.rtol, tol.atol
    results, other = [], None
    batches, seqs = (0, *bm.plan.batch_sizes), (0, *bm.plan.boundaries)
    for bi in range(1, len(batches)):
        for si in range(1, len(seqs)):
            shape = (batches[bi], seqs[si], batches[bi - 1], seqs[si - 1])
            rows, lengths = check_inputs(bm, trace, *shape)
            found = _check_shape(bm, rows, lengths, reference, (rtol, atol))
            entry = {"batch": shape[0], "seq": shape[1], "rows": len(rows), "lengths": lengths, "side": bm.side,
                     **found, "rtol": rtol, "atol": atol}
            if found["ok"] is False and bm.plain_texts:
                other = other or padding_side.flippable(bm.model, trace.pool_texts[:2]) or "none"
                if other != "none":
                    with bm.padded_on(other):
                        tried = _check_shape(bm, rows, lengths, reference, (rtol, atol))
                    entry["other_side"] = {"side": other, "ok": tried["ok"], "failures": tried["failures"][:3]}
            results.append(entry)
    return results


def _check_shape(bm: BucketedModel, rows: list[dict], lengths: list[int], reference, tol: tuple) -> dict:
    """One bucket shape's check: `rows` stacked and padded on bm.side, run bucketed, each row's real part against
    its unpadded eager run. Returns "ok", "max_abs_error", "failures" and "unchecked"."""
    got = bm(bm.declaration.stack(rows, side=bm.side))
    found = {"worst": 0.0, "failures": [], "unchecked": {}}
    for r, (row, length) in enumerate(zip(rows, lengths)):
        try:
            with torch.no_grad(), reference():
                want = bm.model.module(**{k: v.to(bm.device) for k, v in row.items()})
        except Exception as exc:  # noqa: BLE001 - the model refuses the item unpadded: nothing to compare it with
            # eager, outside any target's compiler: the model itself does not take this length (Funnel's pooling
            # blocks take no fewer than 5 positions), on every device; padded, the bucket ran it
            found["unchecked"].setdefault(f"item of {length}", f"the model does not run it at its own length "
                                          f"{length}, eagerly: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        for name, expected in want.items():
            _compare(bm, name, got[name], expected.cpu(), (r, length), tol, found)
    failures, unchecked = found["failures"], found["unchecked"]
    return {"max_abs_error": found["worst"], "ok": False if failures else None if unchecked else True,
            "failures": failures, "unchecked": unchecked}


def mask_is_read(model, trace, extra: int = 8) -> bool | str | None:
    """Tried on one corpus item padded by `extra` positions: whether the model's outputs change when its mask input
    marks the padding as real. False: the model does not read its mask (an adapter that drops it, as Mamba's does),
    so no mask handling can keep padding out; None: the model takes no mask input; a string: why the try could not
    run (the model raised), so nothing is said of its mask."""
    name = model.declaration.masks.get(model.seq_dim)
    if name is None:
        return None
    if not trace.pool_texts:
        return "no corpus item to try it on"
    try:
        one = model.encode([trace.pool_texts[0]])
        padded = model.encode([trace.pool_texts[0]], pad_to=model.declaration.size_of(one, model.seq_dim) + extra)
        with torch.no_grad():
            masked = model.module(**padded)
            unmasked = model.module(**{**padded, name: torch.ones_like(padded[name])})
    except Exception as exc:   # noqa: BLE001 - the try is advice only: one that cannot run leaves the advice a lead
        return f"the model raised on a padded item, eagerly: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return any(not torch.equal(masked[k], unmasked[k]) for k in masked)


def _compare(bm: BucketedModel, name: str, padded: torch.Tensor, expected: torch.Tensor, row: tuple[int, int],
             tol: tuple[float, float], found: dict) -> None:
    """One output of one row of the padding check: its real part of the padded output against the unpadded
    output, into found["failures"], found["unchecked"] (why it could not be compared) and found["worst"]."""
    (r, length), follows = row, bm.follows.get(name, output_probe.OutputDims())
    if follows.unchecked:
        found["unchecked"].setdefault(name, follows.unchecked)
        return
    if bm.side == "left" and (follows.stride, follows.window) != (1, 1) and follows.seq:
        # a strided output's windows start at the padded input's first slot: under left padding they do not
        # line up with the unpadded run's, so its real part cannot be told
        found["unchecked"].setdefault(name, f"output {name!r} has one position per {follows.stride} input "
                                            "positions and the buckets are padded on the left: its windows start "
                                            "in the padding and do not line up with the unpadded run's")
        return
    actual = bm.real_part(name, padded, slice(r, r + 1), length).cpu()
    if actual.shape != expected.shape:
        found["unchecked"].setdefault(name, (
            f"output {name!r} at {length} real input positions: the padded run's real part is "
            f"{tuple(actual.shape)}, the unpadded run's {tuple(expected.shape)} (its dims read as {follows.how}): "
            + output_probe.FOLLOWS_ADVICE))
        return
    if actual.is_floating_point() and actual.numel():
        found["worst"] = max(found["worst"], float((actual - expected).abs().max()))
    try:
        torch.testing.assert_close(actual, expected, rtol=tol[0], atol=tol[1])
    except AssertionError as exc:
        found["failures"].append(f"{name} (row {r}, length {length}): {str(exc).splitlines()[0]}")
