"""Stage 4, accuracy: the target's numerics against a reference, per output, per bucket and per layer.

    >>> from portkit import accuracy, data, models
    >>> model, corpus = models.load("minilm"), data.load_corpus()
    >>> inputs, _ = data.example_batch(model, corpus, batch_size=4, seq_len=64)
    >>> plan = accuracy.bucket_plan("runs/minilm", ["tpu"])      # stage 3's buckets.json, else [32, 64, 128]
    >>> report = accuracy.check_accuracy(model, inputs, ["tpu"], corpus=corpus, buckets=plan)
    >>> print(report)          # verdict, reasons, the first module out of tolerance, suggestions
    >>> report.plot()          # error against depth (module execution order), one line per precision
    >>> report.save("runs/minilm/accuracy.json")

Reference: eager float32 on the CPU, and the model in float64 where it runs in float64 (a second
reference that shows how far float32 itself is from exact). Target: in native mode the device; in
emulated mode the CPU under `numerics.emulate(target, precision)`, the target's documented dtype rules
and matmul precision, on the same real inputs. Every result names its precision (with the flag that
selects it on hardware) and its target side ("eager emulation", or the device).

The pass/fail decision is `torch.testing.assert_close` with the (rtol, atol) of the dtype the target
computes in (its precision's lowest: bf16 when matmul operands are rounded to bf16), starting from
assert_close's own defaults; its message becomes the reason. Task metrics follow the model kind:
embeddings (cosine to the reference), language models (top-1/top-5 next-token agreement, KL divergence),
classifiers (argmax agreement). Only real positions count: the attention mask selects them.

Per layer, hooks on every module keep the reference activations and compare the target's as soon as
they are produced; the first module (in execution order) whose output is out of tolerance is named,
and the suggestions are drawn from what was measured (a higher precision's measured error, norm
layers that amplify the error, float64 ops that ran as float32, the atol a task-level pass needs).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from portkit import models as models_mod, numerics, probes, targets as targets_mod
from portkit._io import read_json
from portkit.errors import BadParameter
from portkit.fallbacks import ROOT, HtmlTable
from portkit.results import save_result

STAGE = "accuracy"
# torch.testing.assert_close's defaults (its docstring's table); tests check they still match torch.
DEFAULT_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
                      "float64": (1e-7, 1e-7)}
DEFAULT_TASK_BOUNDS = {"cosine": 0.999, "agreement": 0.99, "kl": 0.01}
DEFAULT_BUCKETS = (32, 64, 128)
NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")
EAGER = "eager emulation"
_BUCKET_POOL = 512       # texts sampled and tokenized to fill the buckets


# ---------------------------------------------------------------- tolerance policy
@dataclass(frozen=True)
class Tolerance:
    """The (rtol, atol) one dtype is held to; `check` is torch.testing.assert_close with them."""
    dtype: str
    rtol: float
    atol: float

    def check(self, actual: torch.Tensor, expected: torch.Tensor) -> str | None:
        """None when close; otherwise assert_close's message, made one line."""
        try:
            torch.testing.assert_close(actual, expected, rtol=self.rtol, atol=self.atol)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"not within {self.dtype} tolerance (rtol {self.rtol:g}, atol {self.atol:g}): " + \
                "; ".join(lines[1:] or lines)
        return None

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "rtol": self.rtol, "atol": self.atol, "check": "torch.testing.assert_close"}


def compute_dtype(precision: targets_mod.Precision) -> torch.dtype:
    """The lowest dtype a precision setting computes in: what its results are held to."""
    return precision.all_ops or precision.matmul_inputs or torch.float32


def tolerance_for(precision: targets_mod.Precision, tolerances: dict | None = None,
                  output_dtype: torch.dtype = torch.float32) -> Tolerance:
    dtype = compute_dtype(precision)
    if output_dtype.is_floating_point and torch.finfo(output_dtype).eps > torch.finfo(dtype).eps:
        dtype = output_dtype   # a model that is already low precision is held to its own dtype
    name = str(dtype).replace("torch.", "")
    rtol, atol = {**DEFAULT_TOLERANCES, **(tolerances or {})}[name]
    return Tolerance(name, float(rtol), float(atol))


# ---------------------------------------------------------------- metrics
def _real(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Real positions only: a (batch, seq, ...) tensor becomes (tokens, ...) under the attention mask."""
    if mask is not None and t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape):
        return t[mask.to(t.device, torch.bool)]
    return t


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1) if t.dim() < 2 else t.reshape(t.shape[0], -1)


def compare(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None, mask=None) -> dict:
    """Max absolute/relative error, relative L2 error and cosine per row on real positions; with a
    tolerance, pass/fail and the reason from assert_close."""
    a, e = _real(actual.detach().cpu(), mask), _real(expected.detach().cpu(), mask)
    a64, e64 = a.double(), e.double()
    diff = torch.where(a64 == e64, 0.0, a64 - e64).abs()
    rel = diff / e64.abs()
    rel = torch.where(diff == 0, 0.0, rel)
    cos = F.cosine_similarity(_rows(a64), _rows(e64), dim=1, eps=1e-30)
    found = {"shape": list(actual.shape), "real_elements": a.numel(), "max_abs": diff.max().item() if a.numel() else 0.0,
             "max_rel": rel.max().item() if a.numel() else 0.0,
             "rel_l2": (diff.norm() / e64.norm().clamp_min(1e-300)).item(),
             "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item()}
    if tol is not None:
        reason = tol.check(a, e.to(a.dtype))
        found.update(passed=reason is None, reason=reason, tolerance=tol.to_dict(),
                     # the smallest atol that passes at this rtol: a concrete number for a looser policy
                     atol_to_pass=max(0.0, (diff - tol.rtol * e64.abs()).max().item()) if a.numel() else 0.0)
    return found


def primary_output(kind: str, names) -> str:
    names = list(names)
    wanted = "embedding" if kind == models_mod.EMBEDDING else "logits"
    return wanted if wanted in names else names[0]


def task_metrics(kind: str, actual: torch.Tensor, expected: torch.Tensor, mask, bounds: dict) -> dict:
    """The model kind's own measure of agreement with the reference, and whether it holds."""
    a, e = _real(actual.detach().cpu(), mask).double(), _real(expected.detach().cpu(), mask).double()
    if kind == models_mod.EMBEDDING:
        cos = F.cosine_similarity(_rows(a), _rows(e), dim=1)
        found = {"metric": "cosine to the reference", "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item()}
        fails = [f"cosine {found['cosine_min']:.6f} < {bounds['cosine']}"] if found["cosine_min"] < bounds["cosine"] else []
    elif kind in (models_mod.CAUSAL_LM, models_mod.SEQ2SEQ_LM):
        a, e = a.reshape(-1, a.shape[-1]), e.reshape(-1, e.shape[-1])
        top1 = (a.argmax(-1) == e.argmax(-1)).double().mean().item()
        top5 = (a.topk(min(5, a.shape[-1]), -1).indices == e.argmax(-1, keepdim=True)).any(-1).double().mean().item()
        kl = F.kl_div(F.log_softmax(a, -1), F.log_softmax(e, -1), log_target=True, reduction="none").sum(-1)
        found = {"metric": "next-token agreement at real positions", "top1_agreement": top1,
                 "top5_agreement": top5, "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
                 "positions": a.shape[0]}
        fails = [f"top-1 agreement {top1:.4f} < {bounds['agreement']}"] if top1 < bounds["agreement"] else []
        if found["kl_mean"] > bounds["kl"]:
            fails.append(f"mean KL(reference || target) {found['kl_mean']:.3g} > {bounds['kl']}")
    else:   # classifiers: one label per image, or per real token
        agree = (a.argmax(-1) == e.argmax(-1)).double()
        found = {"metric": "argmax agreement", "argmax_agreement": agree.mean().item(), "decisions": agree.numel()}
        fails = [f"argmax agreement {found['argmax_agreement']:.4f} < {bounds['agreement']}"] \
            if found["argmax_agreement"] < bounds["agreement"] else []
    found.update(passed=not fails, reason="; ".join(fails) or None)
    return found


# ---------------------------------------------------------------- per layer
def _floats(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for v in items for t in _floats(v)]


class LayerProbe:
    """Forward hooks on every module of `module`, in the order modules finish (innermost first).

    capture(): the reference pass keeps a copy of every module's floating outputs at real positions.
    compare(): the target pass compares each output with its copy as soon as it is produced (so no
    later in-place op can change it), and counts what the numerics mode changed inside each module.
    The hooks run outside any dispatch mode: their own arithmetic must not be emulated or counted."""

    def __init__(self, module: torch.nn.Module, mask: torch.Tensor | None):
        self.module, self.mask = module, mask
        self.reference: dict[str, tuple[list[torch.Tensor], float]] = {}   # key -> (outputs, squared norm)

    def _run(self, fn, pre, post):
        calls: collections.Counter = collections.Counter()
        handles = []
        for name, sub in self.module.named_modules():
            path = name or ROOT

            def enter(m, args, path=path):
                pre(path)

            def leave(m, args, output, path=path):
                calls[path] += 1
                key = path if calls[path] == 1 else f"{path}#{calls[path]}"
                with _disable_current_modes():
                    post(key, type(m).__name__, output)
            handles += [sub.register_forward_pre_hook(enter), sub.register_forward_hook(leave, always_call=True)]
        try:
            with torch.no_grad():
                return fn()
        finally:
            for h in handles:
                h.remove()

    def capture(self, fn):
        def post(key, kind, output):
            real = []
            for t in _floats(output):   # masking already copies; a plain output is copied here
                r = _real(t.detach(), self.mask).cpu()
                real.append(r.clone() if r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else r)
            norm2 = sum(float(torch.linalg.vector_norm(r)) ** 2 for r in real)
            self.reference[key] = (real, norm2)
        return self._run(fn, lambda path: None, post)

    def compare(self, fn, tol: Tolerance, mode=None) -> tuple[object, list[dict], str | None]:
        rows: list[dict] = []
        frames: list[list] = []      # per open module: [float64 counter at entry, stats at entry, children's]
        first_reason: list[str] = []

        def pre(path):
            if mode is not None:
                frames.append([mode.float64_ops.copy(), mode.stats.copy(), collections.Counter(),
                               collections.Counter()])

        def post(key, kind, output):
            entry = {"index": len(rows), "module": key, "type": kind}
            if mode is not None and frames:
                f64_in, stats_in, child_f64, child_stats = frames.pop()
                f64, stats = mode.float64_ops - f64_in, mode.stats - stats_in
                if frames:
                    frames[-1][2].update(f64)
                    frames[-1][3].update(stats)
                entry["float64_ops"] = dict(f64 - child_f64)
                entry["changes"] = dict(stats - child_stats)
            ref = self.reference.get(key)
            mine = [_real(t.detach(), self.mask).cpu() for t in _floats(output)]
            if ref is None or len(ref[0]) != len(mine) or any(a.shape != b.shape for a, b in zip(mine, ref[0])):
                entry.update(compared=False)
                rows.append(entry)
                return
            err2, max_abs, bad, numel = 0.0, 0.0, 0, 0
            for a, r in zip(mine, ref[0]):
                a = a.to(r.dtype)
                d = (a - r).abs_()
                worst = float(d.max()) if d.numel() else 0.0
                if math.isfinite(worst):   # fast path: |a - r| > atol + rtol |r| is torch.isclose's test
                    bad += int(torch.count_nonzero(d > r.abs().mul_(tol.rtol).add_(tol.atol)))
                else:                      # infinities or NaN: let isclose (assert_close's own check) decide
                    bad += int((~torch.isclose(a, r, rtol=tol.rtol, atol=tol.atol)).sum())
                    d = torch.where(a == r, 0, d)
                    worst = float(d.max())
                err2 += float(torch.linalg.vector_norm(d)) ** 2
                max_abs, numel = max(max_abs, worst), numel + r.numel()
            entry.update(compared=True, numel=numel, max_abs=max_abs, rel_l2=math.sqrt(err2 / max(ref[1], 1e-300)),
                         mismatched=bad, passed=bad == 0)
            if bad and not first_reason:
                first_reason.append(next(filter(None, (tol.check(a.to(r.dtype), r) for a, r in zip(mine, ref[0]))), ""))
            rows.append(entry)
        out = self._run(fn, pre, post)
        return out, rows, (first_reason[0] if first_reason else None)


def layer_summary(rows: list[dict], reason: str | None, tol: Tolerance, precision: targets_mod.Precision,
                  target_side: str) -> dict:
    first = next((r for r in rows if r.get("compared") and not r["passed"]), None)
    return {"precision": precision.to_dict(), "target_side": target_side, "tolerance": tol.to_dict(), "order": "module execution order (a module after its children)",
            "first_failing": first and {k: first[k] for k in ("index", "module", "type", "max_abs", "rel_l2",
                                                            "mismatched", "numel")},
            "reason": reason, "modules_compared": sum(1 for r in rows if r.get("compared")),
            "modules_failing": sum(1 for r in rows if r.get("compared") and not r["passed"]), "modules": rows}


def localize(model, inputs: dict[str, torch.Tensor], target: str, precision=None, tolerances=None,
             emulation=numerics.emulate) -> dict:
    """Per-layer localization alone: one reference pass that keeps every module's output, one target
    pass compared module by module. Returns layer_summary(); check_accuracy shares its reference pass."""
    detected = targets_mod.detect(target)
    chosen = detected.target.precision(precision) if isinstance(precision, str) else \
        precision or detected.target.default_precision
    tol = tolerance_for(chosen, tolerances)
    probe = LayerProbe(model.module.eval(), inputs.get("attention_mask"))
    probe.capture(lambda: model.module(**inputs))
    side = _TargetSide(detected, model.module, emulation, False)
    _, rows, reason, _, _ = side.run(inputs, chosen, probe, tol)
    return layer_summary(rows, reason, tol, chosen, side.label(False))


# ---------------------------------------------------------------- buckets
@dataclass
class BucketBoundaries:
    boundaries: list[int]
    source: str
    batch: int | None = None   # rows per compiled call (the plan's largest batch bucket); None: the whole batch

    def __str__(self) -> str:
        rows = f", compiled batch {self.batch}" if self.batch else ""
        return f"buckets {self.boundaries} ({self.source}{rows})"


def bucket_plan(out_dir, targets, default=DEFAULT_BUCKETS) -> dict[str, BucketBoundaries]:
    """Per target: stage 3's chosen boundaries from out_dir/buckets.json when present, else `default`."""
    path = Path(out_dir) / "buckets.json" if out_dir is not None else None
    saved = read_json(path) if path is not None and path.exists() else None
    plans = {}
    for name in targets_mod.parse_targets(targets):
        chosen = ((saved or {}).get("targets", {}).get(name) or {}).get("chosen") or {}
        if chosen.get("boundaries"):
            plans[name] = BucketBoundaries(sorted(int(b) for b in chosen["boundaries"]),
                                           f"stage 3, {path.name} planner {chosen.get('planner', '?')}",
                                           max((int(b) for b in chosen.get("batch_sizes") or [1]), default=1))
        else:
            plans[name] = BucketBoundaries(list(default), "parameter (no buckets.json from stage 3"
                                     + (f" for {name})" if saved else ")"))
        print(f"target {name}: {plans[name]}")
    return plans


def _bucket_batches(model, corpus, boundaries, batch_size, seed):
    """Real texts for each bucket: those whose token length falls in (previous boundary, boundary];
    the last bucket also takes longer texts, truncated to it as the target would."""
    pool = corpus.sample(min(len(corpus), _BUCKET_POOL), seed)
    sized = list(zip(pool, model.token_lengths(pool)))
    low = 0
    for i, high in enumerate(boundaries):
        last = i == len(boundaries) - 1
        chosen = [(t, n) for t, n in sized if n > low and (n <= high or last)][:batch_size]
        yield low, high, [t for t, _ in chosen], sum(n > high for _, n in chosen)
        low = high


def _unpadded(inputs: dict, padding_side: str) -> dict:
    """The same batch at its own longest length, as an eager GPU run sees it (no bucket padding)."""
    longest = int(inputs["attention_mask"].sum(1).max())
    cut = slice(None, longest) if padding_side == "right" else slice(-longest, None)
    return {k: v[:, cut] for k, v in inputs.items()}


def _align(target_out: torch.Tensor, ref_out: torch.Tensor, padding_side: str) -> torch.Tensor:
    """A bucket-padded output cut to the reference's length (the padding positions dropped)."""
    if target_out.dim() >= 2 and ref_out.dim() >= 2 and target_out.shape[1] != ref_out.shape[1]:
        n = ref_out.shape[1]
        return target_out[:, :n] if padding_side == "right" else target_out[:, -n:]
    return target_out


# ---------------------------------------------------------------- running both sides
def _forward(module, inputs) -> dict:
    with torch.no_grad():
        return module(**inputs)


def _float64_reference(module, inputs) -> tuple[dict | None, str]:
    """The model in float64 on the CPU, where it runs in float64 (some ops or models do not)."""
    try:
        wide = copy.deepcopy(module).double()
        out = _forward(wide, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
        return out, "float64 eager on the CPU"
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return None, f"not available: the model does not run in float64 ({str(exc).splitlines()[0][:160]})"


class _TargetSide:
    """How one target's outputs are produced: eager under the emulation mode, or compiled with the
    target's backend (stage 2's emulated one, Inductor on the CPU); natively, on the device."""

    def __init__(self, detected: targets_mod.DetectedTarget, module, emulation, compiled: bool):
        self.detected, self.module, self.emulation, self.compiled = detected, module, emulation, compiled
        self.eager_label = f"native on {detected.target.device}, eager" if detected.native else EAGER
        if not detected.native and getattr(emulation, "__name__", "emulate") != "emulate":
            self.eager_label = f"{EAGER}, {emulation.__name__}"
        where = f"on {detected.target.device}" if detected.native else "Inductor on the CPU"
        self.compiled_label = f"compiled with {detected.backend} ({where})"
        self._fn, self._backend, self._numerics = None, None, {}

    def label(self, compiled: bool) -> str:
        return self.compiled_label if compiled else self.eager_label

    def run(self, inputs, precision, probe: LayerProbe | None = None, tol: Tolerance | None = None,
            compiled: bool = False, batch: int | None = None):
        """Returns (outputs on the CPU, layer rows or None, first layer reason, what the target's rules
        changed, float64 ops run as float32). Compiled, `batch` rows go in each call (see _chunks)."""
        device = self.detected.target.device if self.detected.native else "cpu"
        inputs = {k: v.to(device) for k, v in inputs.items()}
        self.module.to(device)
        try:
            if compiled:
                chunks = list(_chunks(inputs, batch))
                parts = [self._run_compiled(chunk, precision) for chunk in chunks]
                rows = len(next(iter(inputs.values())))
                out = {k: torch.cat([p[k] for p in parts])[:rows] for k in parts[0]}
                return out, None, None, self._numerics.get(_shape(chunks[0]), {}), {}
            mode = None if self.detected.native else self.emulation(self.detected.target, precision)

            def fn():
                with mode or contextlib.nullcontext():
                    return self.module(**inputs)
            if probe is None:
                with torch.no_grad():
                    out, rows, reason = fn(), None, None
            else:
                out, rows, reason = probe.compare(fn, tol, mode)
        finally:
            self.module.to("cpu")
        return ({k: v.cpu() for k, v in out.items()}, rows, reason, dict(mode.stats) if mode else {},
                dict(mode.float64_ops) if mode else {})

    def _run_compiled(self, inputs, precision) -> dict:
        if self._fn is None:
            # One target's graphs at a time (torch.compiler.reset docs: reset between unrelated compilations).
            torch._dynamo.reset()
            if self.detected.native:
                self._backend = self.detected.backend   # the vendor's compiler; its precision is its flag
            else:
                from portkit import backends           # stage 2: registers portkit_neuron / portkit_tpu
                self._backend = backends.emulated_backend(self.detected.name, precision)
            self._fn = torch.compile(self.module, backend=self._backend, dynamic=False)
        checks = getattr(self._backend, "checks", None)
        before = len(checks) if checks is not None else 0
        # Dynamo runs a function eagerly after recompile_limit (8) shapes (pytorch/pytorch#114511): an
        # uncompiled bucket would pass for a compiled one, so the limit is raised for these calls.
        with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=256):
            out = self._fn(**inputs)
        if checks is not None and len(checks) > before:
            changed = collections.Counter()
            for check in list(checks)[before:]:
                changed.update(check.numerics)
            self._numerics[_shape(inputs)] = dict(changed)
        return {k: v.cpu() for k, v in out.items()}


def _chunks(inputs: dict, batch: int | None):
    """The batch in calls of `batch` rows, the last one filled with copies of its first row, as a
    bucketed deployment calls its compiled graphs (bucketed.BucketedModel). The same shapes as stage 2's
    fixed shape and stage 3's buckets are the same graphs: Inductor's cache serves them again."""
    rows = len(next(iter(inputs.values())))
    if not batch or batch == rows:
        yield inputs
        return
    for start in range(0, rows, batch):
        chunk = {k: v[start:start + batch] for k, v in inputs.items()}
        short = batch - len(next(iter(chunk.values())))
        yield {k: torch.cat([v, v[:1].expand(short, *v.shape[1:])]) if short else v for k, v in chunk.items()}


def _shape(inputs: dict) -> tuple:
    return tuple((k, tuple(v.shape)) for k, v in inputs.items())


def compiled_available() -> bool:
    """Whether stage 2's emulated backends are present (portkit/backends.py)."""
    return probes.module_available("portkit.backends")


def target_side(targets, compiled: bool | None = None) -> bool:
    """Decide (None: compiled when stage 2's backends are present) and print how each target runs."""
    compiled = compiled_available() if compiled is None else compiled
    for name in targets_mod.parse_targets(targets):
        d = targets_mod.detect(name)
        where = f"on {d.target.device}" if d.native else "Inductor on the CPU"
        main = f"compiled with {d.backend} ({where})" if compiled else ("eager on the device" if d.native else EAGER)
        print(f"target {name}: outputs and buckets {main}; per-layer hooks and other precisions: "
              f"{'eager on the device' if d.native else EAGER}")
    return compiled


# ---------------------------------------------------------------- results
@dataclass
class PrecisionResult:
    """One precision setting of one target on the main batch."""
    precision: dict            # Precision.to_dict(): name, the flag to set on hardware, what it rounds
    target_side: str
    outputs: dict[str, dict]
    task: dict
    vs_float64: dict | None
    layers: dict | None
    numerics: dict             # what the emulation changed, by kind (NumericsMode.stats)
    float64_ops: dict
    compiled_vs_eager: dict | None = None   # compiled outputs against eager emulation, per output

    @property
    def name(self) -> str:
        return self.precision["name"]

    @property
    def reasons(self) -> list[str]:
        found = [f"{name}: {o['reason']}" for name, o in self.outputs.items() if not o["passed"]]
        return found + ([f"task: {self.task['reason']}"] if not self.task["passed"] else [])

    @property
    def passed(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        return {"precision": self.precision, "target_side": self.target_side, "passed": self.passed,
                "reasons": self.reasons, "outputs": self.outputs, "task": self.task,
                "vs_float64": self.vs_float64, "layers": self.layers, "numerics": self.numerics,
                "float64_ops": self.float64_ops, "compiled_vs_eager": self.compiled_vs_eager}


@dataclass
class TargetAccuracy:
    target: dict               # DetectedTarget.to_dict()
    chosen: PrecisionResult
    others: list[PrecisionResult]
    bucket_plan: dict
    buckets: list[dict]
    suggestions: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.target["name"]

    @property
    def reasons(self) -> list[str]:
        return self.chosen.reasons + [f"bucket {b['boundary']}: {'; '.join(b['reasons'])}"
                                      for b in self.buckets if not b.get("skipped") and not b["passed"]]

    @property
    def verdict(self) -> str:
        return "fail" if self.reasons else "pass"

    def summary(self) -> str:
        p, task = self.chosen, self.chosen.task
        metric = {k: v for k, v in task.items() if isinstance(v, float)}
        shown = ", ".join(f"{k} {v:.6g}" for k, v in list(metric.items())[:2])
        first = (p.layers or {}).get("first_failing")
        return (f"{self.name} ({self.target['mode']}, {p.target_side}, precision {p.name}): "
                f"{self.verdict.upper()}; {shown}; {len(self.reasons)} reasons"
                + (f"; first module out of tolerance: {first['module']}" if first else ""))

    def findings(self) -> list[dict]:
        """This stage's findings in the report's terms. A miss of the elementwise tolerance while the
        task metric holds, or that another precision setting fixes, is work; a task metric that fails
        at every precision measured is a blocker."""
        if self.verdict == "pass":
            return []
        passing = [r for r in self.others if r.passed]
        task_ok = self.chosen.task["passed"]
        fixable = bool(passing) or task_ok
        advice = (f"set {passing[0].precision['setting']} (precision '{passing[0].name}' passes)" if passing else
                  "; ".join(self.suggestions[:2]) or "see the accuracy notebook's suggestions")
        first = (self.chosen.layers or {}).get("first_failing")
        where = f"; first module out of tolerance: {first['module']}" if first else ""
        return [{"kind": "accuracy", "severity": "work" if fixable else "blocker",
                 "message": f"precision '{self.chosen.name}' ({self.chosen.target_side}): "
                            f"{'; '.join(self.reasons)[:300]}{where}", "advice": advice}]

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "verdict": self.verdict,
                "findings": self.findings(),
                "reasons": self.reasons, "suggestions": self.suggestions, "target_side": self.chosen.target_side,
                "precision": self.chosen.precision, "tolerance": next(iter(self.chosen.outputs.values()))["tolerance"],
                "outputs": self.chosen.outputs, "task": self.chosen.task, "vs_float64": self.chosen.vs_float64,
                "layers": self.chosen.layers, "numerics": self.chosen.numerics,
                "float64_ops": self.chosen.float64_ops, "bucket_plan": self.bucket_plan, "buckets": self.buckets,
                "precisions": [r.to_dict() for r in (self.chosen, *self.others)]}


@dataclass
class AccuracyReport:
    """Stage 4's result: the references, and each target's comparison with them."""
    model: dict
    inputs: dict
    reference: dict
    targets: dict[str, TargetAccuracy]

    @property
    def verdict(self) -> str:
        return "pass" if all(t.verdict == "pass" for t in self.targets.values()) else "fail"

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def to_dict(self) -> dict:
        return {"stage": STAGE, "model": self.model, "inputs": self.inputs, "reference": self.reference,
                "summary": self.summary(), "verdict": self.verdict,
                "reasons": [f"{n}: {r}" for n, t in self.targets.items() for r in t.reasons],
                "targets": {n: t.to_dict() for n, t in self.targets.items()}}

    def save(self, path) -> None:
        save_result(path, self.to_dict())

    def __str__(self) -> str:
        lines = [f"Accuracy of {self.model['name']} ({self.inputs['description']}): {self.verdict.upper()}; "
                 f"reference {self.reference['description']}, second reference {self.reference['float64']}"]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            lines += [f"    reason: {r}" for r in t.reasons]
            lines += [f"    suggestion: {s}" for s in t.suggestions]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        parts = [f"<p><b>Accuracy</b> of <code>{html.escape(self.model['name'])}</code> "
                 f"({html.escape(self.inputs['description'])}): <b>{self.verdict.upper()}</b>. Reference: "
                 f"{html.escape(self.reference['description'])}; second reference: "
                 f"{html.escape(self.reference['float64'])}.</p>"]
        for t in self.targets.values():
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{t.target['mode']}</i>, "
                         f"{html.escape(t.chosen.target_side)}</h4><p>{html.escape(t.summary())}</p>")
            rows = [["reason", r] for r in t.reasons] + [["suggestion", s] for s in t.suggestions]
            if rows:
                parts.append(HtmlTable(["", ""], rows)._repr_html_())
        return "\n".join(parts)

    # -- tables and plots for the notebook
    def outputs_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for name, o in t.chosen.outputs.items():
                rows.append([t.name, t.chosen.name, t.chosen.target_side, name, f"{o['max_abs']:.3g}", f"{o['max_rel']:.3g}",
                             f"{o['rel_l2']:.3g}", f"{o['cosine_min']:.7f}",
                             f"{o['tolerance']['dtype']} ({o['tolerance']['rtol']:g}, {o['tolerance']['atol']:g})",
                             "pass" if o["passed"] else "FAIL"])
        return HtmlTable(["target", "precision", "run as", "output", "max abs", "max rel", "rel L2", "cosine min",
                          "tolerance (rtol, atol)", "assert_close"], rows, "outputs at real positions vs the "
                         "float32 reference")

    def precision_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for r in (t.chosen, *t.others):
                o = r.outputs[primary_output(self.model["kind"], r.outputs)]
                task = ", ".join(f"{k} {v:.5g}" for k, v in r.task.items() if isinstance(v, float))
                first = (r.layers or {}).get("first_failing")
                rows.append([t.name, r.name, r.precision["setting"], r.target_side, f"{o['max_abs']:.3g}", task,
                             first["module"] if first else "-", "pass" if r.passed else "FAIL"])
        return HtmlTable(["target", "precision", "set on hardware with", "run as", "max abs (main output)", "task",
                          "first module out of tolerance (eager)", "verdict"], rows,
                         "every precision setting of each target (chosen first)")

    def bucket_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for b in t.buckets:
                if b.get("skipped"):
                    rows.append([t.name, b["boundary"], 0, "-", "-", "-", b["skipped"]])
                    continue
                o = b["outputs"][b["primary"]]
                task = ", ".join(f"{k} {v:.5g}" for k, v in b["task"].items() if isinstance(v, float))
                rows.append([t.name, b["boundary"], b["texts"], f"{b['padding']:.0%}", f"{o['max_abs']:.3g}", task,
                             "pass" if b["passed"] else "FAIL: " + "; ".join(b["reasons"])[:120]])
        return HtmlTable(["target", "bucket", "texts", "padding", "max abs", "task", "verdict"], rows,
                         "per bucket: reference unpadded (as on the GPU), target padded to the bucket")

    def layer_table(self, target: str, limit: int = 12) -> HtmlTable:
        r = self.targets[target].chosen
        mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
        first = next((i for i, m in enumerate(mods) if not m["passed"]), None)
        if first is None:
            shown, caption = sorted(mods, key=lambda m: -m["rel_l2"])[:limit], "none out of tolerance; largest errors"
        else:
            shown, caption = mods[first:first + limit], "execution order from the first module out of tolerance"
        rows = [[m["index"], m["module"], m["type"], f"{m['max_abs']:.3g}", f"{m['rel_l2']:.3g}",
                 f"{m['mismatched']}/{m['numel']}", ", ".join(f"{k} x{v}" for k, v in m.get("changes", {}).items())]
                for m in shown]
        return HtmlTable(["#", "module", "type", "max abs", "rel L2", "out of tolerance", "changed by the target"],
                         rows, f"{target} ({r.name}, {(r.layers or {}).get('target_side', r.target_side)}): {caption}")

    def plot(self):
        """Left: relative L2 error of every module's output against depth, one line per precision.
        Right: the main output's max abs error per bucket."""
        import matplotlib.pyplot as plt
        names = list(self.targets)
        fig, axes = plt.subplots(len(names), 2, figsize=(13, 3.4 * len(names)), squeeze=False,
                                 gridspec_kw={"width_ratios": [3, 1]})
        floor = 1e-10
        for row, name in enumerate(names):
            t, ax = self.targets[name], axes[row][0]
            for r in (t.chosen, *t.others):
                mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
                if mods:
                    ax.plot([m["index"] for m in mods], [max(m["rel_l2"], floor) for m in mods], lw=1,
                            label=f"{r.name}{' (chosen)' if r is t.chosen else ''}")
            first = (t.chosen.layers or {}).get("first_failing")
            if first:
                ax.axvline(first["index"], color="#C44E52", ls="--", lw=1)
                ax.text(first["index"], ax.get_ylim()[1], f" first out of tolerance: {first['module']}",
                        color="#C44E52", fontsize=7, va="top")
            ax.set_yscale("log")
            ax.set_xlabel("module, in execution order")
            ax.set_ylabel(f"rel. L2 error (floor {floor:g})")
            ax.set_title(f"{name} ({t.target['mode']}, layers in {(t.chosen.layers or {}).get('target_side', '-')}): "
                         "error against depth", fontsize=10)
            ax.legend(fontsize=7, loc="lower right")
            done = [b for b in t.buckets if not b.get("skipped")]
            axes[row][1].bar([str(b["boundary"]) for b in done],
                             [b["outputs"][b["primary"]]["max_abs"] for b in done],
                             color=["#55A868" if b["passed"] else "#C44E52" for b in done])
            axes[row][1].set_title(f"{name}: max abs error per bucket", fontsize=9)
            axes[row][1].set_xlabel("bucket (tokens)")
        fig.tight_layout()
        return fig


# ---------------------------------------------------------------- suggestions from what was measured
def _suggest(target: targets_mod.Target, t: TargetAccuracy, kind: str) -> list[str]:
    out: list[str] = []
    chosen, results = t.chosen, (t.chosen, *t.others)
    measured = {r.name: r for r in results}
    fp32 = next((p for p in target.precisions if compute_dtype(p) == torch.float32), None)
    main = primary_output(kind, chosen.outputs)
    first = (chosen.layers or {}).get("first_failing")
    if first:
        row = chosen.layers["modules"][first["index"]]
        changed = ", ".join(f"{k} x{v}" for k, v in row.get("changes", {}).items()) or "nothing counted"
        if compute_dtype(target.precision(chosen.name)) != torch.float32 and fp32 is not None:
            text = (f"error first exceeds the {chosen.layers['tolerance']['dtype']} tolerance in `{first['module']}` "
                    f"({first['type']}; the target changed: {changed}): run it at precision '{fp32.name}' "
                    f"({fp32.setting})")
            if fp32.name in measured:
                r = measured[fp32.name]
                text += (f"; the whole model at '{fp32.name}' measured max abs error "
                         f"{r.outputs[main]['max_abs']:.2g} ({'passes' if r.passed else 'still fails'}; {r.target_side})")
            out.append(text)
        else:
            out.append(f"error first exceeds the tolerance in `{first['module']}` ({first['type']}) although "
                       f"precision '{chosen.name}' computes in float32: the target changed {changed} there; "
                       "check that module's ops on the target")
    for r in results:   # norm layers out of tolerance only because a setting rounds every op, not just matmuls
        p = target.precision(r.name)
        sibling = next((q for q in target.precisions if q.all_ops is None and q.matmul_inputs == p.matmul_inputs
                        and q.name in measured and measured[q.name].layers), None) if p.all_ops else None
        if sibling is None or not r.layers:
            continue
        fine = {m["module"]: m for m in measured[sibling.name].layers["modules"] if m.get("compared") and m["passed"]}
        norms = [m for m in r.layers["modules"] if m.get("compared") and not m["passed"] and m["module"] in fine
                 and any(n in m["type"] for n in NORM_TYPES)]
        if norms:
            m = norms[0]
            out.append(f"{'with' if r is chosen else 'if you use'} precision '{r.name}' ({p.setting}): keep "
                       f"{', '.join(sorted({n['type'] for n in norms}))} in float32: {len(norms)} norm module(s) are "
                       f"out of tolerance only under it, first `{m['module']}` (rel. L2 error {m['rel_l2']:.2g}, "
                       f"{fine[m['module']]['rel_l2']:.2g} under '{sibling.name}', {sibling.setting}, which rounds "
                       "only matmuls)")
    rows = [m for m in (chosen.layers or {}).get("modules", []) if m.get("float64_ops")]
    for m in rows:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(m["float64_ops"].items()))
        out.append(f"avoid float64 in `{m['module']}` ({m['type']}): {sum(m['float64_ops'].values())} float64 ops ran "
                   f"as float32 on {target.name} ({ops}); make it float32 (.float()) on the GPU too, so the "
                   f"reference is what the target runs; measured effect on `{main}`: max abs error "
                   f"{chosen.outputs[main]['max_abs']:.2g}")
    if not rows and chosen.float64_ops:
        out.append(f"avoid float64: {sum(chosen.float64_ops.values())} float64 ops ran as float32 on {target.name} "
                   f"({', '.join(sorted(chosen.float64_ops))}); run with layers=True to find their modules")
    failing = [o for o in chosen.outputs.values() if not o["passed"]]
    # Loosening is advice for the drift a lower-precision setting brings by design, never for a float32 miss.
    if failing and chosen.task["passed"] and compute_dtype(target.precision(chosen.name)) != torch.float32:
        tol = failing[0]["tolerance"]
        atol = float(f"{max(o['atol_to_pass'] for o in failing) * 1.05:.2g}")
        out.append(f"the task metric holds ({chosen.task['metric']}) while outputs differ beyond the {tol['dtype']} "
                   f"tolerance: if the task metric is what you ship on, the smallest atol that passes at rtol "
                   f"{tol['rtol']:g} is about {atol:g}: tolerances={{'{tol['dtype']}': [{tol['rtol']:g}, {atol:g}]}}")
    for b in t.buckets:
        if not b.get("skipped") and not b["passed"] and chosen.passed:
            out.append(f"bucket {b['boundary']} fails while the main batch passes ({b['reasons'][0][:100]}): padding "
                       "changes the result; check that the model masks padded positions, or choose buckets that pad less")
    if not out and t.verdict == "pass":
        out.append(f"no change needed at precision '{chosen.name}': outputs, task and every bucket pass"
                   + (" (emulated: confirm on hardware)" if t.target["mode"] == "emulated" else ""))
    return out


# ---------------------------------------------------------------- the stage's verb
def check_parameters(targets=None, batch_size: int = 4, seq_len: int = 64, precision=None, tolerances=None,
                     task_bounds=None, default_buckets=DEFAULT_BUCKETS, seed: int = 0, corpus: str = "stdlib",
                     all_precisions: bool = True, layers: bool = True, float64_reference: bool = True) -> None:
    """The notebook's validation cell, also run by the runner before anything is written."""
    from portkit import data, params
    params.positive_int("batch_size", batch_size)
    params.positive_int("seq_len", seq_len)
    params.non_negative_int("seed", seed)
    data.check_corpus(corpus)
    for name, value in (("all_precisions", all_precisions), ("layers", layers), ("float64_reference", float64_reference)):
        params.boolean(name, value)
    if targets is not None:
        targets_mod.parse_targets(targets)
    for name, value, hint in (("precision", precision, "target name -> precision name, e.g. {'tpu': 'highest'}"),
                              ("tolerances", tolerances, "dtype -> [rtol, atol]"),
                              ("task_bounds", task_bounds, f"with keys {', '.join(DEFAULT_TASK_BOUNDS)}")):
        if not isinstance(value or {}, dict):
            raise BadParameter(name, value, hint=f"give a dict of {hint}")
    for name, value in (precision or {}).items():
        targets_mod.get(name).precision(value)
    for dtype, pair in (tolerances or {}).items():
        params.choice("tolerance dtype", dtype, DEFAULT_TOLERANCES)
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in pair)):
            raise BadParameter(f"tolerance for {dtype}", pair, hint="give [rtol, atol], two numbers >= 0")
    for key, value in (task_bounds or {}).items():
        params.choice("task bound", key, DEFAULT_TASK_BOUNDS)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (key != "kl" and value > 1):
            raise BadParameter(f"task bound {key}", value, hint="cosine and agreement lie in [0, 1]; kl is >= 0")
    if not isinstance(default_buckets, (list, tuple)) or not default_buckets:
        raise BadParameter("default_buckets", default_buckets, hint="give a list of sequence lengths, e.g. [32, 64, 128]")
    for boundary in default_buckets:
        params.positive_int("bucket boundary", boundary)
    if list(default_buckets) != sorted(set(default_buckets)):
        raise BadParameter("default_buckets", default_buckets, hint="boundaries must be ascending and distinct")


def check_accuracy(model, inputs: dict[str, torch.Tensor], targets=("neuron", "tpu"), *, precision=None,
                   all_precisions: bool = True, tolerances=None, task_bounds=None, corpus=None, buckets=None,
                   batch_size: int = 4, layers: bool = True, float64_reference: bool = True, seed: int = 0,
                   emulation=numerics.emulate, compiled: bool | None = None, description: str | None = None,
                   progress: bool = True) -> AccuracyReport:
    """Compare every target's numerics with the float32 (and float64) reference on `inputs`.

    model: a portkit.models.LoadedModel; inputs: the dict its encode() returns.
    precision: {target: precision name}; a target not named uses its default.
    buckets: bucket_plan()'s result, or one list of boundaries for every target; needs `corpus`.
    emulation: a callable like numerics.emulate (tests pass numerics.wrong_op_TESTING_ONLY(...)).
    compiled: judge the chosen precision's outputs and buckets with the model compiled by the target's
    backend (stage 2's emulated one); None: when those backends are present. The other precisions and
    the per-layer hooks run eagerly (hooks cannot see inside a compiled graph); every result says which.
    """
    from tqdm.auto import tqdm
    names = targets_mod.parse_targets(targets)
    check_parameters(names, batch_size=batch_size, precision=precision, tolerances=tolerances,
                     task_bounds=task_bounds, seed=seed, all_precisions=all_precisions, layers=layers,
                     float64_reference=float64_reference,
                     default_buckets=DEFAULT_BUCKETS if isinstance(buckets, dict) else list(buckets or DEFAULT_BUCKETS))
    if compiled is None:
        compiled = compiled_available() and emulation is numerics.emulate
    elif compiled and emulation is not numerics.emulate:
        raise BadParameter("compiled", compiled, hint=f"{emulation.__name__} runs eagerly only; pass compiled=False")
    bounds = {**DEFAULT_TASK_BOUNDS, **(task_bounds or {})}
    module, kind = model.module.eval(), model.kind
    mask = inputs.get("attention_mask")
    probe = LayerProbe(module, mask) if layers else None
    ref = probe.capture(lambda: module(**inputs)) if probe else _forward(module, inputs)
    ref64, ref64_note = _float64_reference(module, inputs) if float64_reference else (None, "not requested")
    reference = {"description": "eager float32 on the CPU", "float64": ref64_note,
                 "float32_vs_float64": {k: compare(ref[k], ref64[k], None, mask) for k in ref} if ref64 else None}
    if not isinstance(buckets, dict):
        buckets = {n: BucketBoundaries(list(buckets or DEFAULT_BUCKETS), "parameter") for n in names}
    steps = sum(1 + (len(targets_mod.get(n).precisions) - 1) * all_precisions for n in names) + \
        (sum(len(buckets[n].boundaries) for n in names) if corpus is not None and model.takes_text else 0)
    bar = tqdm(total=steps, desc="accuracy", unit="pass", disable=not progress)
    bucket_refs: dict = {}
    per_target = {}
    for name in names:
        detected = targets_mod.detect(name)
        target, side = detected.target, _TargetSide(detected, module, emulation, compiled)
        chosen = target.precision((precision or {}).get(name, target.default_precision.name))
        # natively, a precision is a flag set before the process starts: only the one in effect is measured
        settings = [chosen] + ([p for p in target.precisions if p != chosen] if all_precisions and not detected.native else [])
        results = []
        for p in settings:
            bar.set_postfix_str(f"{name} {p.name}")
            tol = tolerance_for(p, tolerances)
            out, rows, reason, changed, f64 = side.run(inputs, p, probe, tol)
            judged_by, vs_eager = side.label(False), None
            if compiled and p == chosen:
                eager, (out, _, _, changed, _) = out, side.run(inputs, p, compiled=True, batch=buckets[name].batch)
                judged_by, vs_eager = side.label(True), {k: compare(out[k], eager[k], None, mask) for k in ref}
            results.append(PrecisionResult(
                precision=p.to_dict(), target_side=judged_by, compiled_vs_eager=vs_eager,
                outputs={k: compare(out[k], ref[k], tolerance_for(p, tolerances, ref[k].dtype), mask) for k in ref},
                task=task_metrics(kind, out[primary_output(kind, ref)], ref[primary_output(kind, ref)], mask, bounds),
                vs_float64={k: compare(out[k], ref64[k], None, mask) for k in ref} if ref64 else None,
                layers=layer_summary(rows, reason, tol, p, side.label(False)) if rows is not None else None,
                numerics=changed, float64_ops=f64))
            bar.update()
        plan = buckets[name]
        bucket_rows = _buckets(model, corpus, plan, chosen, side, compiled, tolerances, bounds, batch_size, seed,
                               bucket_refs, bar) if corpus is not None and model.takes_text else \
            [{"boundary": None, "skipped": "no buckets: the model takes images (one shape)" if not model.takes_text
              else "no corpus given"}]
        result = TargetAccuracy(detected.to_dict(), results[0], results[1:],
                                {"boundaries": plan.boundaries, "source": plan.source}, bucket_rows)
        result.suggestions = _suggest(target, result, kind)
        per_target[name] = result
    bar.close()
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    first = next(iter(shapes.values()), [])
    return AccuracyReport(model.describe(), {"description": description or "batch " + " x ".join(map(str, first)),
                                             "shapes": shapes}, reference, per_target)


def _buckets(model, corpus, plan, precision, side, compiled, tolerances, bounds, batch_size, seed, cache,
             bar) -> list[dict]:
    rows = []
    side_padding = getattr(model.tokenizer, "padding_side", "right")
    for low, high, texts, truncated in _bucket_batches(model, corpus, plan.boundaries, batch_size, seed):
        bar.update()
        if not texts:
            rows.append({"boundary": high, "skipped": f"no text of {low + 1}-{high} tokens in the sample"})
            continue
        padded = model.encode(texts, pad_to=high)
        if (high, tuple(texts)) not in cache:
            plain = _unpadded(padded, side_padding)
            cache[(high, tuple(texts))] = (plain, _forward(model.module, plain))
        plain, ref = cache[(high, tuple(texts))]
        out = side.run(padded, precision, compiled=compiled, batch=plan.batch)[0]
        mask = plain["attention_mask"]
        outputs = {k: compare(_align(out[k], ref[k], side_padding), ref[k],
                              tolerance_for(precision, tolerances, ref[k].dtype), mask) for k in ref}
        main = primary_output(model.kind, ref)
        task = task_metrics(model.kind, _align(out[main], ref[main], side_padding), ref[main], mask, bounds)
        reasons = [f"{k}: {o['reason']}" for k, o in outputs.items() if not o["passed"]] + \
            ([f"task: {task['reason']}"] if not task["passed"] else [])
        real = int(padded["attention_mask"].sum())
        rows.append({"boundary": high, "lengths": [low + 1, high], "texts": len(texts), "truncated": truncated,
                     "padding": 1 - real / padded["attention_mask"].numel(), "primary": main,
                     "precision": precision.to_dict(),
                     "reference": f"eager float32 at the batch's own length ({mask.shape[1]} tokens)",
                     "target": f"{side.label(compiled)}, padded to {high} tokens", "outputs": outputs, "task": task,
                     "passed": not reasons, "reasons": reasons})
    return rows
