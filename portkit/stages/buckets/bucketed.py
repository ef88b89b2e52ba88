"""Running with buckets (stage 3's runtime half): pad every input to its bucket, run the compiled
model, slice the outputs back; warm every bucket once, then replay real requests under
set_stance("fail_on_recompile"), so every compile after warm-up is caught by PyTorch and counted,
with the shape and the guard failure behind it, rather than assumed to be none.

    >>> import torch
    >>> from portkit import bucketed, buckets, data, models
    >>> m, corpus = models.load("minilm"), data.load_corpus()
    >>> plan = buckets.plan_buckets(buckets.distribution(corpus, m), "optimal", k=3)
    >>> model = bucketed.BucketedModel(m, plan, backend="inductor")
    >>> model.warm_up()                                   # one compile per (batch, seq) shape
    >>> with torch.compiler.set_stance("fail_on_recompile"):
    ...     out = model(model.encode(["Return the sum of a and b."]))   # outputs at the true length
    >>> model.late                                        # compiles the stance refused, then paid: []
    >>> runs = bucketed.replay(m, data.make_trace(corpus, m, 24), [plan], backend="inductor")

`replay` also runs without buckets as a static-shape target does: one compile per distinct shape, the recompile
limit raised so none silently runs eagerly (NVIDIA/TensorRT-LLM#6142, pytorch/pytorch#114511)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import torch

from portkit.core import torch_private as _torch
from portkit.targets import numerics
from portkit.core import frames
from portkit.core import placement
from portkit.models import inputs
from portkit.targets import tolerance
from portkit.targets.backends import (CompileCounter, EmulatedBackend, call_counting_recompiles, compile_failure,
                                      failure_text, warm_inductor)
from portkit.core.errors import BadParameter
from portkit.corpora.corpus import Trace
from portkit.planning.planner import BucketPlan
from portkit.targets.tolerance import Tolerance

NO_BUCKETS = "no buckets"


def compile_backend(backend, inductor: bool = False):
    """What torch.compile gets for `backend`: a name Dynamo knows, or a backend object. The name of an
    emulated target backend (portkit_neuron, portkit_tpu) becomes a fresh EmulatedBackend with Inductor
    codegen only when asked: the replay checks and emulates each graph, then runs it eagerly."""
    if isinstance(backend, str):
        known = _torch.known_backends()
        found = _torch.backend_by_name(backend) if backend in known else None
        if isinstance(found, EmulatedBackend):
            return EmulatedBackend(found.target, found.precision.name, inductor=inductor)
        if found is None:
            raise BadParameter("compile backend", backend, sorted(known), hint="see torch._dynamo.list_backends()")
    return backend


def _name(backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def _emulated(backend) -> EmulatedBackend | None:
    """The emulated backend behind `backend` (an object or a registered name), or None for any other."""
    if isinstance(backend, EmulatedBackend):
        return backend
    found = _torch.backend_by_name(backend) if isinstance(backend, str) and backend in _torch.known_backends() else None
    return found if isinstance(found, EmulatedBackend) else None


def _warm(backend) -> None:
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


# The probe's second length: up to this many times the first (within the dimension's largest), far enough apart that
# an output with one position per chunk of input positions still grows between them (a chunk of 512 probed at 512 and
# 514 samples did not). It is taken coprime to the first, so no stride above 1 divides both: with window = stride, a
# whole-windows (floor) and a padded-last-window (ceil) output then differ at one of them, and at most one of the two
# explains both probes (_probed_stride).
PROBE_SPAN = 16
FOLLOWS_ADVICE = ("declare how the output follows the input: portkit.models.inputs.Output(name, metric, stride=input "
                  "positions per output position, window=positions the first one reads, ceil=True where a partial "
                  "last window counts), so that the padding check compares the output's real positions only")


@dataclass(frozen=True)
class OutputDims:
    """How one output follows the model's input: its dims that follow the batch and the varying dimension, and how
    many of its positions along the latter are real for n real input positions (positions: inputs.Output.count at
    stride and window). `how` says where that came from: "declared" (the Output's stride), "one per position",
    "probed stride", "pooled" (no dim varies with the input); `unchecked` says why the padding check cannot tell its
    real positions (None where it can)."""
    batch: tuple[int, ...] = ()
    seq: tuple[int, ...] = ()
    stride: int = 1
    window: int = 1
    ceil: bool = False
    how: str = "one per position"
    unchecked: str | None = None

    def positions(self, n: int) -> int:
        return inputs.Output.count(n, self.stride, self.window, self.ceil)


def probe_lengths(dim) -> tuple[int, int]:
    """The two lengths output_dims probes a varying dimension at: its smallest size (at least 3), then the largest
    length up to PROBE_SPAN times that plus one, within its largest, that shares no factor with the first (at least
    2 more than the first)."""
    short = max(3, dim.min)
    cap = max(short + 2, min(dim.max or short + 2, PROBE_SPAN * short + 1))
    return short, next((n for n in range(cap, short + 1, -1) if math.gcd(n, short) == 1), short + 2)


def _probed_stride(n: tuple[int, int], size: tuple[int, int]) -> tuple[int, bool] | None:
    """The stride (window = stride, floor or ceil) that gives `size` output positions at both probe lengths `n`:
    the slope's, where exactly one rounding reproduces both probes; None where none (or both) does."""
    if size[1] <= size[0]:
        return None
    stride = round((n[1] - n[0]) / (size[1] - size[0]))
    if stride < 2:
        return None
    fits = [c for c in (False, True) if all(inputs.Output.count(k, stride, stride, c) == m for k, m in zip(n, size))]
    return (stride, fits[0]) if len(fits) == 1 else None


def _follows(name: str, a: tuple, b: tuple, n: tuple[int, int], declared) -> OutputDims:
    """One output's OutputDims from its shapes `a` (2 rows, n[0] positions) and `b` (3 rows, n[1])."""
    batch = tuple(d for d in range(len(a)) if (a[d], b[d]) == (2, 3))
    rest = [d for d in range(len(a)) if d not in batch]
    if len(a) != len(b):
        return OutputDims(batch, how="unknown", unchecked=f"output {name!r} has {len(a)} dims at {n[0]} input "
                          f"positions and {len(b)} at {n[1]}: {FOLLOWS_ADVICE}")
    if declared is not None and declared.strided:
        window = declared.stride if declared.window is None else declared.window
        want = tuple(declared.positions(k) for k in n)
        seq = tuple(d for d in rest if (a[d], b[d]) == want)
        if not seq:
            return OutputDims(batch, how="declared", unchecked=(
                f"output {name!r} declares stride {declared.stride}, window {window}, ceil {declared.ceil} "
                f"({want[0]} then {want[1]} positions), but reads {a} then {b} at {n[0]} then {n[1]} input "
                f"positions: {FOLLOWS_ADVICE}"))
        return OutputDims(batch, seq, declared.stride, window, declared.ceil, "declared")
    seq = tuple(d for d in rest if (a[d], b[d]) == n)
    if seq:
        return OutputDims(batch, seq)
    grows = [d for d in rest if a[d] != b[d]]
    if not grows:
        return OutputDims(batch, how="pooled")
    probed = {d: _probed_stride(n, (a[d], b[d])) for d in grows}
    rules = {r for r in probed.values() if r is not None}
    if len(rules) != 1:
        return OutputDims(batch, how="unknown", unchecked=(
            f"output {name!r} reads {a} then {b} at {n[0]} then {n[1]} input positions, and no one stride explains "
            f"which dim follows the input: {FOLLOWS_ADVICE}"))
    (stride, ceil), = rules
    return OutputDims(batch, tuple(d for d, r in probed.items() if r == (stride, ceil)), stride, stride, ceil,
                      "probed stride")


def output_dims(model, device: str = "cpu") -> dict[str, OutputDims]:
    """Which dims of each output follow the batch and the varying dimension, from two tiny eager runs of the
    declaration's probe inputs (Declaration.dummy): 2 rows at the dimension's smallest size (at least 3), then 3
    rows at PROBE_SPAN times that plus one (probe_lengths). A dim that reads 2 then 3 is a batch dim. An output
    that declares a stride (inputs.Output) has the dims that read its positions at both lengths; any other, the
    dims that read the two lengths, else the dims a stride explains exactly (_probed_stride). Pooled outputs
    (minilm's "embedding") have no such dim and are never sliced; an output whose dims no rule explains is marked
    unchecked, with what to declare."""
    decl, dim = model.declaration, model.seq_dim
    n = probe_lengths(decl.dim(dim))
    shapes = []
    for rows, length in zip((2, 3), n):
        with torch.no_grad():
            outputs = model.module(**decl.dummy(rows, {dim: length}, device=device))
            shapes.append({k: tuple(v.shape) for k, v in outputs.items()})
    declared = {o.name: o for o in decl.outputs}
    return {name: _follows(name, a, shapes[1].get(name, ()), n, declared.get(name))
            for name, a in shapes[0].items()}


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
        self.device = device             # the target's device in native mode; the module must be there
        self.follows = output_dims(model, device)     # per output: its batch and varying dims, its real positions
        self.dims = {name: (o.batch, o.seq) for name, o in self.follows.items()}

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
        padded = self.declaration.fit(inputs, {self.dim: seq}, rows=batch)
        return {name: _dense(t).to(self.device) for name, t in padded.items()}, rows, length

    def unpad(self, outputs: dict[str, torch.Tensor], rows: int, length: int) -> dict[str, torch.Tensor]:
        """Outputs cut to the true rows and, along the dims that follow the input, the real positions of
        `length` input positions (OutputDims.positions: `length` itself, or a strided output's frames)."""
        return {name: self.real_part(name, t, slice(0, rows), length) for name, t in outputs.items()}

    def real_part(self, name: str, t: torch.Tensor, rows: slice, length: int) -> torch.Tensor:
        """Output `name` at the given rows (along its batch dims) and its real positions for `length`."""
        follows = self.follows.get(name, OutputDims())
        index = [slice(None)] * t.dim()
        for d in follows.batch:
            index[d] = rows
        for d in follows.seq:
            index[d] = slice(0, follows.positions(length))
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
        """Inputs of one bucket's shape, for warm-up: a short real text cut or padded; other data: dummy()."""
        if not self.model.takes_text or len(self.declaration.varying) > 1:    # items are not plain texts
            return {k: _dense(v).to(self.device) for k, v in self.declaration.dummy(batch, {self.dim: seq}).items()}
        # the tokenizer cannot cut below its special tokens: slice for buckets of 1 or 2 tokens
        one = self.model.encode(["Return the sum of a and b."], max_length=max(seq, 3))
        return {k: _dense(v).to(self.device) for k, v in self.declaration.fit(one, {self.dim: seq}, rows=batch).items()}

    def warm_up(self, progress: bool = False, costs: dict | None = None) -> list[dict]:
        """Compile every (batch, seq) shape of the plan once. Returns per shape: seconds (wall time of
        the first call) and graphs compiled."""
        from portkit.core.progress import bar as progress_bar
        done = []
        with _torch.recompile_limit(self.plan.compiles), torch.no_grad():
            for shape in progress_bar(self.plan.shapes(), desc=f"warm-up {self.plan.planner}", disable=not progress,
                              leave=False):
                inputs = self.example(shape["batch"], shape["seq"])
                before, start = self.compiles, time.perf_counter()
                self.compiled(**inputs)
                seconds = time.perf_counter() - start
                graphs = self.compiles - before
                charged = _charge(costs, self.model, _name(self.backend), inputs, seconds) if graphs else 0.0
                done.append({**shape, "seconds": seconds, "charged_seconds": charged, "graphs": graphs})
        return done


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A fresh row-major copy. Dynamo guards on strides too, even of size-1 dims, so a sliced view
    of the same shape would be a new graph (a recompile, an error under fail_on_recompile)."""
    return torch.empty(t.shape, dtype=t.dtype).copy_(t)


def _charge(costs: dict | None, model, backend: str, inputs: dict, seconds: float) -> float:
    """The compile time charged for a shape: its first measured compile in this session. A later run
    that compiles the same shape may hit the compiler's cache; charging the first (cold) measurement
    keeps the order of the runs from favouring any plan."""
    if costs is None:
        return seconds
    key = (id(model.module), backend, tuple((k, tuple(v.shape)) for k, v in inputs.items()))
    return costs.setdefault(key, seconds)


def _compile_cache(fresh: bool):
    """An empty Inductor cache for the block (_torch.fresh_compile_cache), or nothing."""
    return _torch.fresh_compile_cache() if fresh else contextlib.nullcontext()


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

    Real positions are each output's OutputDims.positions of the row's length. An output whose real positions
    cannot be told (OutputDims.unchecked, or a padded output whose real part is not the unpadded output's shape)
    is not compared: it is listed in "unchecked" with why, and the shape's "ok" is None unless another output
    failed (False) — a padding check that could not run is no evidence that padding changes the outputs."""
    reference = reference or reference_numerics(bm.backend)
    if rtol is None or atol is None:
        tol = padding_tolerance(bm.backend)
        rtol, atol = tol.rtol, tol.atol
    results = []
    batches, seqs = (0, *bm.plan.batch_sizes), (0, *bm.plan.boundaries)
    for bi in range(1, len(batches)):
        for si in range(1, len(seqs)):
            rows, lengths = check_inputs(bm, trace, batches[bi], seqs[si], batches[bi - 1], seqs[si - 1])
            got = bm(bm.declaration.stack(rows))
            found = {"worst": 0.0, "failures": [], "unchecked": {}}
            for r, (row, length) in enumerate(zip(rows, lengths)):
                with torch.no_grad(), reference():
                    want = bm.model.module(**{k: v.to(bm.device) for k, v in row.items()})
                for name, expected in want.items():
                    _compare(bm, name, got[name], expected.cpu(), (r, length), (rtol, atol), found)
            failures, unchecked = found["failures"], found["unchecked"]
            results.append({"batch": batches[bi], "seq": seqs[si], "rows": len(rows), "lengths": lengths,
                            "max_abs_error": found["worst"], "ok": False if failures else None if unchecked else True,
                            "failures": failures, "unchecked": unchecked, "rtol": rtol, "atol": atol})
    return results


def mask_is_read(model, trace, extra: int = 8) -> bool | None:
    """Tried on one corpus item padded by `extra` positions: whether the model's outputs change when its mask input
    marks the padding as real. False: the model does not read its mask (an adapter that drops it, as Mamba's does),
    so no mask handling can keep padding out; None: the model takes no mask input, or the try could not run."""
    name = model.declaration.masks.get(model.seq_dim)
    if name is None or not trace.pool_texts:
        return None
    try:
        one = model.encode([trace.pool_texts[0]])
        padded = model.encode([trace.pool_texts[0]], pad_to=model.declaration.size_of(one, model.seq_dim) + extra)
        with torch.no_grad():
            masked = model.module(**padded)
            unmasked = model.module(**{**padded, name: torch.ones_like(padded[name])})
    except Exception:   # noqa: BLE001 - the try is advice only: one that cannot run leaves the advice a lead
        return None
    return any(not torch.equal(masked[k], unmasked[k]) for k in masked)


def _compare(bm: BucketedModel, name: str, padded: torch.Tensor, expected: torch.Tensor, row: tuple[int, int],
             tol: tuple[float, float], found: dict) -> None:
    """One output of one row of the padding check: its real part of the padded output against the unpadded
    output, into found["failures"], found["unchecked"] (why it could not be compared) and found["worst"]."""
    (r, length), follows = row, bm.follows.get(name, OutputDims())
    if follows.unchecked:
        found["unchecked"].setdefault(name, follows.unchecked)
        return
    actual = bm.real_part(name, padded, slice(r, r + 1), length).cpu()
    if actual.shape != expected.shape:
        found["unchecked"].setdefault(name, (
            f"output {name!r} at {length} real input positions: the padded run's real part is "
            f"{tuple(actual.shape)}, the unpadded run's {tuple(expected.shape)} (its dims read as {follows.how}): "
            + FOLLOWS_ADVICE))
        return
    if actual.is_floating_point() and actual.numel():
        found["worst"] = max(found["worst"], float((actual - expected).abs().max()))
    try:
        torch.testing.assert_close(actual, expected, rtol=tol[0], atol=tol[1])
    except AssertionError as exc:
        found["failures"].append(f"{name} (row {r}, length {length}): {str(exc).splitlines()[0]}")


# ---------------------------------------------------------------- replay
@dataclass
class ReplayRun:
    """One replay of a trace: without buckets, or with one plan."""
    name: str
    backend: str
    plan: dict | None
    requests: int
    compiles: int                     # graphs the backend compiled, counted by the backend itself
    compiles_after_warmup: int        # graphs compiled after warm-up (caught by fail_on_recompile, then paid)
    real_tokens: int
    computed_tokens: int
    compile_seconds: float            # each shape charged its first measured compile (see _charge)
    compile_wall_seconds: float       # what the calls that compiled took in this run
    run_seconds: float
    padding_checks: list[dict] = field(default_factory=list)
    note: str = ""
    late_compiles: list[dict] = field(default_factory=list)   # request, shape, guard failures behind each
    compiled_seqs: list = field(default_factory=list)          # the sequence length of every graph compiled
    failure: dict | None = None       # why the run could not be measured (_failed_run): the model refused or raised

    @property
    def waste(self) -> float:
        return 1 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def total_seconds(self) -> float:
        return self.compile_seconds + self.run_seconds

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.total_seconds if self.total_seconds else float("inf")

    @property
    def padding_ok(self) -> bool | None:
        """False where padding changed an output at real positions; None where nothing was checked, or some
        output could not be (padding_unchecked); else True."""
        oks = [c["ok"] for c in self.padding_checks]
        return False if False in oks else None if not oks or None in oks else True

    @property
    def not_measured(self) -> str:
        """Why the run could not be measured ("" where it was): the failure in one line, and its step."""
        f = self.failure
        return f"not measured: {failure_text(f)} (in the {f['step']})" if f else ""

    @property
    def padding_unchecked(self) -> dict[str, str]:
        """The outputs the padding check could not compare, and why (the first reason for each)."""
        found: dict[str, str] = {}
        for c in self.padding_checks:
            for name, why in (c.get("unchecked") or {}).items():
                found.setdefault(name, why)
        return found

    def to_dict(self) -> dict:
        """The run as a result file holds it; a run that could not be measured has no compile counts (None)."""
        counted = not self.failure
        return {"name": self.name, "backend": self.backend, "plan": self.plan, "requests": self.requests,
                "compiles": self.compiles if counted else None,
                "compiles_after_warmup": self.compiles_after_warmup if counted else None,
                "real_tokens": self.real_tokens, "computed_tokens": self.computed_tokens,
                "padding_waste": self.waste, "compile_seconds": self.compile_seconds,
                "compile_wall_seconds": self.compile_wall_seconds, "run_seconds": self.run_seconds,
                "total_seconds": self.total_seconds, "requests_per_second": self.requests_per_second,
                "padding_ok": self.padding_ok, "padding_checks": self.padding_checks, "note": self.note,
                "late_compiles": self.late_compiles, "compiled_seqs": self.compiled_seqs,
                "padding_unchecked": self.padding_unchecked, "failure": self.failure}

    def __str__(self) -> str:
        if self.failure:
            return f"{self.name:>16} [{self.backend}]: {self.not_measured}"
        return (f"{self.name:>16} [{self.backend}]: {self.compiles:3d} compiles, {self.waste:6.1%} padding, "
                f"compile {self.compile_seconds:7.1f} s + run {self.run_seconds:6.2f} s = "
                f"{self.total_seconds:7.1f} s, {self.requests_per_second:7.2f} requests/s")


def _replay_unbucketed(model, encoded, backend, costs, progress, device) -> ReplayRun:
    from portkit.core.progress import bar as progress_bar
    counter = CompileCounter(backend)
    compiled = torch.compile(model.module, backend=counter, dynamic=False)
    compile_wall = charged = run = 0.0
    with _torch.recompile_limit(len(encoded)), torch.no_grad():
        for inputs in progress_bar(encoded, desc=f"replay {NO_BUCKETS}", disable=not progress, leave=False):
            before, start = len(counter.events), time.perf_counter()
            compiled(**{k: v.to(device) for k, v in inputs.items()})
            seconds = time.perf_counter() - start
            if len(counter.events) > before:
                compile_wall += seconds
                charged += _charge(costs, model, _name(backend), inputs, seconds)
            else:
                run += seconds
    shapes = {tuple(next(iter(i.values())).shape) for i in encoded}
    if len(counter.events) < len(shapes):   # never silently eager: every distinct shape must have compiled
        raise RuntimeError(f"{len(shapes)} distinct shapes but only {len(counter.events)} compiles: Dynamo fell "
                           "back to eager; raise torch._dynamo.config.recompile_limit")
    seqs = [_seq_of(model, e.shapes) for e in counter.events if e.shapes]
    return ReplayRun(NO_BUCKETS, _name(backend), None, len(encoded), len(counter.events), 0,
                     _real_tokens(model, encoded), sum(_computed(model, i) for i in encoded), charged, compile_wall,
                     run, compiled_seqs=seqs)


def _counted(model, encoded, backend, runs: list[ReplayRun], progress, device, plan=None) -> ReplayRun:
    """A replay counted, not compiled: without a plan one compile per distinct shape, with one a compile per
    bucket shape (the note says why that holds). Each distinct (padded) shape runs once, eagerly under the
    backend's numerics, its time charged to every request of that shape (static shapes: a request's run time
    is its shape's). Compiling here is the mean of the replay's measured compiles."""
    from portkit.core.progress import bar as progress_bar
    bm = BucketedModel(model, plan, backend, device) if plan is not None else None
    seqs, seconds, run, computed = [], {}, 0.0, 0
    with torch.no_grad():
        for inputs in progress_bar(encoded, desc=f"replay {plan.planner if plan else NO_BUCKETS} (counted)",
                                   disable=not progress, leave=False):
            inputs = bm.pad(inputs)[0] if bm is not None else {k: v.to(device) for k, v in inputs.items()}
            shape, computed = tuple(tuple(v.shape) for v in inputs.values()), computed + _computed(model, inputs)
            if shape not in seconds:
                seqs.append(_seq_of(model, inputs))
                start = time.perf_counter()
                with reference_numerics(backend)():
                    model.module(**inputs)
                seconds[shape] = time.perf_counter() - start
            run += seconds[shape]
    seqs = [s["seq"] for s in plan.shapes()] if plan is not None else seqs
    measured = [r for r in runs if r.plan is not None and r.compiles and not r.note]
    per = sum(r.compile_wall_seconds for r in measured) / sum(r.compiles for r in measured) if measured else 0.0
    what = (f"{len(seqs)} bucket shapes, one compile each in warm-up (the replay under fail_on_recompile and the "
            "padding check ran on the chosen plans)" if plan is not None else
            f"{len(seqs)} distinct shapes, one compile each under static shapes (stage 2's storm compiles or "
            "counts every new shape)")
    note = (f"counted, not compiled: {what}; each distinct shape ran once eagerly under the backend's numerics, "
            "its time charged to every request of that shape; "
            + (f"compiling here estimated per shape as the mean of this replay's {sum(r.compiles for r in measured)} "
               "measured compiles (in its compile seconds)" if measured else "no compile measured here"))
    return ReplayRun(plan.planner if plan else NO_BUCKETS, _name(backend), plan.to_dict() if plan else None,
                     len(encoded), len(seqs), 0, _real_tokens(model, encoded), computed, per * len(seqs), 0.0, run,
                     note=note, compiled_seqs=seqs)


def _real_tokens(model, encoded) -> int:   # real positions along the varying dimension (its mask's ones)
    return sum(sum(model.declaration.real_lengths(i)[model.seq_dim]) for i in encoded)


def _computed(model, inputs) -> int:       # positions computed along the varying dimension: rows x length
    return model.declaration.rows(inputs) * model.declaration.size_of(inputs, model.seq_dim)


def _seq_of(model, shapes) -> int:
    """A batch's (or a graph's input shapes') length along the varying dimension; a graph after a break
    takes other inputs: then its first input's second dimension."""
    try:
        return model.declaration.size_of(shapes, model.seq_dim)
    except BadParameter:
        return int(next(iter(shapes.values()))[1])


@dataclass(frozen=True)
class ReplaySettings:
    """How `replay` runs (see its docstring): which runs, the padding check's reference and tolerance, where."""
    baseline: bool = True             # also replay without buckets, first
    check: bool = True                # the padding check of every bucket shape
    reference: object = None          # a context manager factory for the eager reference (reference_numerics)
    rtol: float | None = None         # the padding check's tolerance (padding_tolerance)
    atol: float | None = None
    progress: bool = True
    fresh_caches: bool = False        # every run from an empty Inductor cache, as a fresh deployment
    device: str = "cpu"               # the target's device in native mode
    inductor: bool = False            # Inductor's code behind an emulated target's backend
    count_baseline: bool = False      # count the baseline's compiles instead of compiling them
    count: tuple = ()                 # plans counted (one compile per bucket shape) instead of compiled


def _replay_plan(model, plan, encoded, trace, backend, costs, settings: ReplaySettings, at: list[str]):
    """One plan compiled: warm-up, the replay under fail_on_recompile, the padding check. `at` holds the step
    running (for _failed_run, where the model refuses or raises)."""
    from portkit.core.progress import bar as progress_bar
    progress, device = settings.progress, settings.device
    at[0] = "probe of the outputs"
    bm = BucketedModel(model, plan, backend, device)
    at[0] = "warm-up"
    warm = bm.warm_up(progress, costs)
    after_warmup = bm.compiles
    charged, compile_wall = sum(w["charged_seconds"] for w in warm), sum(w["seconds"] for w in warm if w["graphs"])
    run, computed = 0.0, 0
    at[0] = "replay"
    # From here PyTorch refuses every compile; each refusal is recorded (bm.late), then paid and counted.
    with torch.compiler.set_stance("fail_on_recompile"):
        bar = progress_bar(encoded, desc=f"replay {plan.planner}", disable=not progress, leave=False)
        for i, inputs in enumerate(bar):
            padded, rows, length = bm.pad(inputs)
            computed += _computed(model, padded)
            before, start = bm.compiles, time.perf_counter()
            bm.unpad(bm.run_padded(padded, i), rows, length)
            seconds = time.perf_counter() - start
            if bm.compiles > before:   # a compile after warm-up is compile time, not run time
                compile_wall += seconds
                charged += _charge(costs, model, _name(backend), padded, seconds)
            else:
                run += seconds
        at[0] = "padding check"
        checks = check_padding(bm, trace, settings.reference, settings.rtol, settings.atol) if settings.check else []
    return ReplayRun(plan.planner, _name(backend), plan.to_dict(), len(encoded), bm.compiles,
                     bm.compiles - after_warmup, _real_tokens(model, encoded), computed, charged, compile_wall, run,
                     checks, late_compiles=bm.late,
                     compiled_seqs=[_seq_of(model, e.shapes) for e in bm.counter.events if e.shapes])


def _measured(run, model, encoded, plan, backend) -> ReplayRun:
    """run(at) -> ReplayRun, or, where the model refuses to compile or raises, the run not measured (_failed_run).
    What the model does inside the stage is a result, never a crash of the stage: the other runs and targets go
    on. A BadParameter is the user's input, not the model's behaviour: it still stops the stage."""
    at = ["run"]
    try:
        return run(at)
    except BadParameter:
        raise
    except Exception as exc:   # the model's own code: whatever it raises is recorded
        return _failed_run(model, encoded, plan, backend, exc, at[0])


def _failed_run(model, encoded, plan, backend, exc: BaseException, step: str) -> ReplayRun:
    """A run the model stopped in `step`: why (backends.compile_failure, stage 2's reading of the same exception:
    a refusal of the target's compiler, or what the model raised) and where (the refused node's line, or the
    innermost frame of the model's code in the traceback); nothing measured."""
    failure = {**compile_failure(exc), "step": step}
    if failure["where"] is None:
        found = frames.innermost([frames.place(f.filename, f.lineno, f.name, f.line or "")
                                  for f in traceback.extract_tb(exc.__traceback__)])
        failure["where"] = {k: v for k, v in found.items() if k != "line_key"} if found else None
    torch.compiler.reset()   # what Dynamo kept of the failed compile is no later run's
    run = ReplayRun(plan.planner if plan else NO_BUCKETS, _name(backend), plan.to_dict() if plan else None,
                    len(encoded), 0, 0, _real_tokens(model, encoded), 0, 0.0, 0.0, 0.0, failure=failure)
    return dataclasses.replace(run, note=run.not_measured)


def _encoded(model, trace: Trace, plans: list[BucketPlan]) -> list[dict]:
    """The trace's requests tokenized up front, cut at the plans' largest bucket under "truncate"; under
    "reject" the longer ones are left out, and said so."""
    top = max((p.top for p in plans), default=model.max_length)
    policy = plans[0].overflow if plans else "truncate"
    kept = [texts for texts, lengths in zip(trace.requests, trace.lengths)
            if policy == "truncate" or max(lengths) <= top]
    if len(kept) < len(trace.requests):
        print(f"overflow policy 'reject': {len(trace.requests) - len(kept)} requests longer than {top} tokens "
              "are rejected and left out of every run")
    return [model.encode(texts, max_length=top) for texts in kept]


def replay(model, trace: Trace, plans: list[BucketPlan], backend="inductor", settings: ReplaySettings | None = None,
           costs: dict | None = None) -> list[ReplayRun]:
    """Replay the trace through the compiled model: without buckets (if settings.baseline), then with each plan.

    Dynamo is reset before every run, so each run counts its own compiles from zero. Requests are
    tokenized up front (cut at the plans' largest bucket under "truncate"); timing covers the model
    calls only. With settings.check, every bucket shape's outputs are compared with unpadded eager outputs,
    run under settings.reference (default: reference_numerics(backend), the emulated target's numerics)
    within rtol/atol (default: padding_tolerance(backend)). An emulated target's backend checks and emulates
    every graph and runs it eagerly unless settings.inductor asks for Inductor's code (compile_backend).

    Compile time: by default each shape is charged its first measured compile in this session (see
    _charge; `costs` holds those charges, shared between calls), so runs that share a shape cost the same
    whatever their order. settings.fresh_caches starts every run from an empty Inductor cache instead, as a
    fresh deployment would (slower; for benchmarks). settings.count_baseline: count the baseline's compiles
    (one per distinct shape) instead of compiling them, and settings.count: plans counted (one compile per
    bucket shape) instead of compiled (_counted); the stage counts all but the chosen plans, as stage 2
    already measured the storm and the proof needs the chosen ones only."""
    settings = settings or ReplaySettings()
    encoded = _encoded(model, trace, plans)
    costs = None if settings.fresh_caches else {} if costs is None else costs
    backend = compile_backend(backend, settings.inductor)
    _warm(backend)
    with placement.on_device(model.module, settings.device):   # native mode: the target's device (as stage 2)
        runs = _replay_runs(model, encoded, trace, plans, backend, costs, settings)
    torch.compiler.reset()
    return runs


def _replay_runs(model, encoded, trace, plans, backend, costs, settings: ReplaySettings) -> list[ReplayRun]:
    """replay's runs, in order: the baseline (compiled or counted), then each plan's (compiled or counted)."""
    progress, device, runs = settings.progress, settings.device, []
    if settings.baseline and not settings.count_baseline:
        torch.compiler.reset()
        with _compile_cache(settings.fresh_caches):
            runs.append(_measured(lambda at: _replay_unbucketed(model, encoded, backend, costs, progress, device),
                                  model, encoded, None, backend))
    done = {}   # (boundaries, batch sizes) -> the run that compiled (or counted) those shapes
    for plan in plans:
        shapes = (plan.boundaries, plan.batch_sizes)
        if shapes in done or plan in settings.count:
            continue
        torch.compiler.reset()
        with _compile_cache(settings.fresh_caches):
            done[shapes] = _measured(lambda at: _replay_plan(model, plan, encoded, trace, backend, costs, settings, at),
                                     model, encoded, plan, backend)
    compiled = list(done.values())    # counted runs state their compile time from these
    for plan in (p for p in plans if (p.boundaries, p.batch_sizes) not in done):
        done[plan.boundaries, plan.batch_sizes] = _measured(
            lambda at: _counted(model, encoded, backend, compiled, progress, device, plan), model, encoded, plan,
            backend)
    for plan in plans:    # in the plans' order; the same shapes as an earlier plan: the same run
        first = done[plan.boundaries, plan.batch_sizes]
        runs.append(first if first.plan == plan.to_dict() else dataclasses.replace(
            first, name=plan.planner, plan=plan.to_dict(), note=f"same shapes as {first.name}: replayed once"))
    if settings.baseline and settings.count_baseline:
        runs.insert(0, _measured(lambda at: _counted(model, encoded, backend, compiled, progress, device),
                                 model, encoded, None, backend))
    return runs
