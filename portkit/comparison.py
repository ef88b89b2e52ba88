"""How a target's output is compared with the reference: elementwise errors and the task's own metric.

    >>> from portkit import comparison, models, targets, tolerance
    >>> tol = tolerance.tolerance_for(targets.get("tpu").default_precision)
    >>> found = comparison.compare(actual, expected, tol, mask=inputs["attention_mask"])
    >>> found["max_abs"], found["passed"], found["reason"]        # reason: assert_close's message, or None
    >>> comparison.task_metrics(models.EMBEDDING, actual, expected, mask, tolerance.DEFAULT_TASK_BOUNDS)

Only real positions count: a (batch, seq, ...) tensor is cut to its real tokens by the attention mask.
Errors are measured in float64, so the measurement adds no rounding of its own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from portkit import models
from portkit.tolerance import Tolerance


def real_positions(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Real positions only: a (batch, seq, ...) tensor becomes (tokens, ...) under the attention mask."""
    if mask is not None and t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape):
        return t[mask.to(t.device, torch.bool)]
    return t


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1) if t.dim() < 2 else t.reshape(t.shape[0], -1)


def compare(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None, mask=None) -> dict:
    """Max absolute/relative error, relative L2 error and cosine per row on real positions; with a
    tolerance, pass/fail and the reason from assert_close."""
    a, e = real_positions(actual.detach().cpu(), mask), real_positions(expected.detach().cpu(), mask)
    a64, e64 = a.double(), e.double()
    diff = torch.where(a64 == e64, 0.0, a64 - e64).abs()
    rel = diff / e64.abs()
    rel = torch.where(diff == 0, 0.0, rel)
    cos = F.cosine_similarity(_rows(a64), _rows(e64), dim=1, eps=1e-30)
    found = {"shape": list(actual.shape), "real_elements": a.numel(),
             "max_abs": diff.max().item() if a.numel() else 0.0,
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
    wanted = "embedding" if kind == models.EMBEDDING else "logits"
    return wanted if wanted in names else names[0]


def task_metrics(kind: str, actual: torch.Tensor, expected: torch.Tensor, mask, bounds: dict) -> dict:
    """The model kind's own measure of agreement with the reference, and whether it holds."""
    a, e = real_positions(actual.detach().cpu(), mask).double(), real_positions(expected.detach().cpu(), mask).double()
    if kind == models.EMBEDDING:
        cos = F.cosine_similarity(_rows(a), _rows(e), dim=1)
        found = {"metric": "cosine to the reference", "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item()}
        fails = [f"cosine {found['cosine_min']:.6f} < {bounds['cosine']}"] \
            if found["cosine_min"] < bounds["cosine"] else []
    elif kind in (models.CAUSAL_LM, models.SEQ2SEQ_LM):
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
