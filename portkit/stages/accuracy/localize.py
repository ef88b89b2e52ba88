"""Per-layer localization: where a target's error enters the model, module by module.

    >>> from portkit.stages.accuracy.localize import LayerProbe, layer_summary
    >>> probe = LayerProbe(module, inputs.get("attention_mask"), progress=True)   # a bar per pass, per module
    >>> probe.capture(lambda: module(**inputs))                        # reference: every module's output
    >>> out, rows, reason = probe.compare(lambda: run_on_target(inputs), tol, mode)
    >>> layer_summary(rows, reason, tol, precision, "eager emulation")["first_failing"]

Rows come in module execution order (a module after its children); a module called twice appears as
"path" and "path#2". With the numerics mode of the target pass, each row also counts what the mode
changed inside that module (its own ops, not its children's) and which float64 ops ran as float32.
"""
from __future__ import annotations

import collections
import math

import torch

from portkit.core.progress import bar as progress_bar
from portkit.stages.accuracy.comparison import real_positions
from portkit.targets.tolerance import Tolerance
from portkit.core.module_stack import ModuleTracker


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

    def __init__(self, module: torch.nn.Module, mask: torch.Tensor | None, progress: bool = False):
        self.module, self.mask, self.progress = module, mask, progress
        self.reference: dict[str, tuple[list[torch.Tensor], float]] = {}   # key -> (outputs, squared norm)

    def _run(self, fn, pre, post, desc: str):
        calls: collections.Counter = collections.Counter()
        # one step per module output; the reference pass learns how many there are
        bar = progress_bar(total=len(self.reference) or None, desc=desc, unit="module", leave=False,
                                disable=not self.progress)

        def leave(path, module, output):
            calls[path] += 1
            post(path if calls[path] == 1 else f"{path}#{calls[path]}", type(module).__name__, output)
            bar.update()
        with bar, ModuleTracker(self.module, on_enter=pre, on_leave=leave), torch.no_grad():
            return fn()

    def capture(self, fn):
        def post(key, kind, output):
            real = []
            for t in _floats(output):   # masking already copies; a plain output is copied here
                r = real_positions(t.detach(), self.mask).cpu()
                real.append(r.clone() if r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else r)
            norm2 = sum(float(torch.linalg.vector_norm(r)) ** 2 for r in real)
            self.reference[key] = (real, norm2)
        return self._run(fn, None, post, "layers: reference")

    def compare(self, fn, tol: Tolerance, mode=None) -> tuple[object, list[dict], str | None]:
        rows: list[dict] = []
        frames: list[list] = []      # per open module: [float64 counter at entry, stats at entry, children's]
        first_reason: list[str] = []

        def pre(path, module):
            frames.append([mode.float64_ops.copy(), mode.stats.copy(), collections.Counter(), collections.Counter()])

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
            mine = [real_positions(t.detach(), self.mask).cpu() for t in _floats(output)]
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
        out = self._run(fn, pre if mode is not None else None, post, "layers: compared")
        return out, rows, (first_reason[0] if first_reason else None)


def layer_summary(rows: list[dict], reason: str | None, tol: Tolerance, precision, target_side: str) -> dict:
    """The per-layer result: the first module out of tolerance (execution order), counts, every row."""
    first = next((r for r in rows if r.get("compared") and not r["passed"]), None)
    return {"precision": precision.to_dict(), "target_side": target_side, "tolerance": tol.to_dict(),
            "order": "module execution order (a module after its children)",
            "first_failing": first and {k: first[k] for k in ("index", "module", "type", "max_abs", "rel_l2",
                                                            "mismatched", "numel")},
            "reason": reason, "modules_compared": sum(1 for r in rows if r.get("compared")),
            "modules_failing": sum(1 for r in rows if r.get("compared") and not r["passed"]), "modules": rows}
