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

from portkit.models import inputs
from portkit.models import registry as models
from portkit.core.errors import BadParameter
from portkit.targets.tolerance import TASK_BOUND_REASONS, Tolerance, budget_text, within


def real_positions(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Real positions only: a (batch, seq, features...) tensor becomes (tokens, features...) under the
    attention mask. A 2-d tensor is (batch, features), a pooled embedding say, and is kept whole even when
    its width equals the sequence length."""
    if mask is not None and t.dim() >= 3 and tuple(t.shape[:2]) == tuple(mask.shape):
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


def check(key: str, label: str, value: float, bounds: dict) -> dict:
    """One task metric's measurement against its budget (tolerance.DEFAULT_TASK_BOUNDS' key)."""
    return {"metric": key, "label": label, "value": value, "budget": budget_text(key, bounds),
            "bound": bounds[key], "passed": within(key, value, bounds), "why": TASK_BOUND_REASONS[key]}


def _embedding(a, e, mask, bounds, inputs):
    cos = F.cosine_similarity(_rows(a), _rows(e), dim=1)
    found = {"metric": "cosine to the reference", "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item()}
    return found, [check("cosine", "lowest cosine to the reference", found["cosine_min"], bounds)]


def _language_model(a3, e3, mask, bounds, inputs):
    """a3, e3: the whole (batch, seq, vocab) logits; agreement and KL count real positions only."""
    a, e = real_positions(a3, mask), real_positions(e3, mask)
    a, e = a.reshape(-1, a.shape[-1]), e.reshape(-1, e.shape[-1])
    top1 = (a.argmax(-1) == e.argmax(-1)).double().mean().item()
    top5 = (a.topk(min(5, a.shape[-1]), -1).indices == e.argmax(-1, keepdim=True)).any(-1).double().mean().item()
    kl = F.kl_div(F.log_softmax(a, -1), F.log_softmax(e, -1), log_target=True, reduction="none").sum(-1)
    found = {"metric": "greedy next-token agreement at real positions", "top1_agreement": top1,
             "top5_agreement": top5, "kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "positions": a.shape[0]}
    checks = [check("agreement", "greedy-token agreement", top1, bounds),
              check("kl", "mean KL(reference || target)", found["kl_mean"], bounds)]
    ids = (inputs or {}).get("input_ids")
    if ids is not None and a3.dim() == 3 and tuple(ids.shape) == tuple(a3.shape[:2]) and ids.shape[1] > 1:
        ids = ids.cpu()
        keep = (mask[:, 1:] if mask is not None else torch.ones_like(ids[:, 1:])).to(torch.bool)
        def ppl(logits):
            return F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep]).exp().item()
        found["perplexity_reference"], found["perplexity_target"] = ppl(e3), ppl(a3)
        found["perplexity_change"] = abs(found["perplexity_target"] / found["perplexity_reference"] - 1)
        checks.append(check("perplexity", "relative perplexity change on the batch's own text",
                            found["perplexity_change"], bounds))
    else:
        found["perplexity_note"] = "perplexity not measured: the logits do not predict the input ids"
    return found, checks


def _classifier(a, e, mask, bounds, inputs):   # one label per image, or per real token
    agree = (a.argmax(-1) == e.argmax(-1)).double()
    found = {"metric": "top-1 agreement", "argmax_agreement": agree.mean().item(), "decisions": agree.numel()}
    checks = [check("agreement", "top-1 agreement", found["argmax_agreement"], bounds)]
    labels = (inputs or {}).get("labels")
    if labels is not None and labels.numel() == agree.numel():
        labels = labels.reshape(-1)
        found["accuracy_reference"] = (e.argmax(-1).reshape(-1) == labels).double().mean().item()
        found["accuracy_target"] = (a.argmax(-1).reshape(-1) == labels).double().mean().item()
        found["accuracy_change"] = found["accuracy_target"] - found["accuracy_reference"]
    else:
        found["accuracy_note"] = "accuracy change not measured: the inputs carry no labels"
    return found, checks


# CREPE's confidence above which a frame counts as voiced: torchcrepe's README thresholds periodicity at 0.21.
PITCH_VOICED = 0.21


def _pitch(a, e, mask, bounds, inputs):
    """a, e: (frames, 2) at real frames, each row (cents, confidence): the cents error on frames voiced in
    both runs, and how many frames keep their voiced/unvoiced decision."""
    voiced_a, voiced_e = a[..., 1] >= PITCH_VOICED, e[..., 1] >= PITCH_VOICED
    both = voiced_a & voiced_e
    error = (a[..., 0][both] - e[..., 0][both]).abs()
    voicing = (voiced_a == voiced_e).double().mean().item() if voiced_e.numel() else 1.0
    found = {"metric": "pitch error in cents on voiced frames, and voicing agreement",
             "frames": int(voiced_e.numel()), "voiced_reference": int(voiced_e.sum()), "voiced_both": int(both.sum()),
             "voicing_agreement": voicing, "voiced_threshold": PITCH_VOICED}
    if error.numel():
        q = torch.quantile(error, torch.tensor([0.5, 0.95], dtype=error.dtype))
        found.update(cents_median=q[0].item(), cents_p95=q[1].item(), cents_max=error.max().item())
    else:
        found.update(cents_median=0.0, cents_p95=0.0, cents_max=0.0,
                     cents_note="no frame is voiced in both runs: the pitch error is not measured")
    return found, [check("cents", "95th-percentile absolute pitch error (cents, voiced frames)", found["cents_p95"],
                         bounds),
                   check("voicing", "voiced/unvoiced agreement", voicing, bounds)]


# Task metrics by output kind (models' kind strings; a model declaration names one of these keys).
TASK_METRICS = {models.EMBEDDING: _embedding, models.CAUSAL_LM: _language_model, models.SEQ2SEQ_LM: _language_model,
                models.IMAGE_CLASSIFIER: _classifier, models.TOKEN_CLASSIFIER: _classifier,
                inputs.CLASSIFIER: _classifier, inputs.PITCH: _pitch}


def task_metrics(kind: str, actual: torch.Tensor, expected: torch.Tensor, mask, bounds: dict,
                 inputs: dict | None = None) -> dict:
    """The output kind's task metrics against the reference, each with its budget ("checks"), and
    whether all hold. `inputs` (the batch) gives language models their tokens for the perplexity."""
    if kind not in TASK_METRICS:
        raise BadParameter("output kind", kind, list(TASK_METRICS))
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    mask = mask.cpu() if mask is not None else None
    if kind in (models.CAUSAL_LM, models.SEQ2SEQ_LM):
        found, checks = _language_model(a, e, mask, bounds, inputs)
    else:
        found, checks = TASK_METRICS[kind](real_positions(a, mask), real_positions(e, mask), mask, bounds, inputs)
    return finish(found, checks)


def finish(found: dict, checks: list[dict]) -> dict:
    """A task result's verdict and reasons from its checks (also after more checks are added)."""
    fails = [f"{c['label']} {c['value']:.6g} outside its {c['budget']}" for c in checks if not c["passed"]]
    found.update(checks=checks, passed=not fails, reason="; ".join(fails) or None)
    return found


def neighbour_agreement(actual: torch.Tensor, expected: torch.Tensor, k: int = 5) -> float:
    """Mean share of each row's k nearest neighbours (cosine, itself excluded) that the target keeps."""
    def top(x):
        x = F.normalize(_rows(x.detach().cpu().double()), dim=1)
        sims = x @ x.T
        sims.fill_diagonal_(-2.0)
        return sims.topk(k, dim=1).indices
    a, e = top(actual), top(expected)
    return sum(len(set(r.tolist()) & set(q.tolist())) for r, q in zip(a, e)) / (k * a.shape[0])
