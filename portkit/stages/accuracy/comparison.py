"""How a target's output is compared with the reference: elementwise errors and the task's own metric.

    >>> from portkit.models import inputs
    >>> from portkit.stages.accuracy import comparison
    >>> from portkit.targets import specs, tolerance
    >>> tol = tolerance.tolerance_for(specs.get("tpu").default_precision)
    >>> found = comparison.compare(actual, expected, tol, mask=batch["attention_mask"])
    >>> found["max_abs"], found["passed"], found["reason"]        # reason: assert_close's message, or None
    >>> comparison.task_metrics(inputs.EMBEDDING, actual, expected, mask, tolerance.DEFAULT_TASK_BOUNDS)
    >>> comparison.snr_db(decoded, reference_audio), comparison.si_sdr_db(decoded, reference_audio)   # in dB

Only real positions count: a (batch, seq, ...) tensor is cut to its real tokens by the attention mask.
Errors are measured in float64, so the measurement adds no rounding of its own, a piece of the real positions at a
time (PIECE_BYTES; language models' logits are vocabulary-wide): a comparison's memory does not grow with the
output. An output whose shape on the target differs from the reference's is not compared: compare() says so
("shape_mismatch") and task_metrics() returns an unmeasured result that fails, for the stage to report as a finding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from portkit.models import inputs
from portkit.models import registry
from portkit.models.inputs import CODES, PROBABILITY, WAVEFORM
from portkit.core.errors import BadParameter
from portkit.stages.accuracy import stats
from portkit.targets.tolerance import TASK_BOUND_REASONS, Tolerance, budget_text, within


# The most float64 bytes one piece of a comparison holds: compare() and a language model's per-item values work
# through an output's real positions a piece at a time, so their copies (float64, differences, log-softmax) take a
# piece's memory, not the output's. A bucket of 4 texts of 512 tokens over a 30,522-word vocabulary is 500 MiB of
# float64 logits, and each step of the comparison made another copy of it. A batch within it is one piece.
PIECE_BYTES = 64 * 2**20


def _cut(t: torch.Tensor, mask: torch.Tensor | None, per_position: bool) -> bool:
    return mask is not None and (t.dim() >= 3 or per_position and t.dim() == 2) and \
        tuple(t.shape[:2]) == tuple(mask.shape)


def real_positions(t: torch.Tensor, mask: torch.Tensor | None, per_position: bool = False) -> torch.Tensor:
    """Real positions only: a (batch, seq, features...) tensor becomes (tokens, features...) under the
    attention mask. A 2-d tensor is (batch, features), a pooled embedding say, and is kept whole even when
    its width equals the sequence length, unless the output kind has one value per position (`per_position`:
    codes, probabilities), where a (batch, seq) tensor of the mask's shape is cut to its real positions too."""
    if _cut(t, mask, per_position):
        return t[mask.to(t.device, torch.bool)]
    return t


def real_shape(t: torch.Tensor, mask: torch.Tensor | None, per_position: bool = False) -> tuple:
    """The shape real_positions(t, mask, per_position) has, without making it."""
    if _cut(t, mask, per_position):
        return (int(mask.to(torch.bool).sum()), *t.shape[2:])
    return tuple(t.shape)


def real_pieces(t: torch.Tensor, mask: torch.Tensor | None, per_position: bool = False, piece_bytes: int | None = None):
    """real_positions(t, mask, per_position) on the CPU in consecutive pieces of its rows, each at most `piece_bytes`
    in float64 (None: PIECE_BYTES; one row at least), in order: torch.cat of the pieces is real_positions' tensor, and
    one that fits is a single piece. A tensor of fewer than 2 dimensions is one piece."""
    t, piece_bytes = t.detach(), piece_bytes or PIECE_BYTES
    if t.dim() < 2:
        yield t.cpu()
        return
    if _cut(t, mask, per_position):
        where = mask.to(t.device, torch.bool).nonzero()           # (batch, position) of each real one, in order
        rows = max(1, piece_bytes // (8 * max(1, math.prod(t.shape[2:]))))
        for start in range(0, max(1, len(where)), rows):     # no real position: one empty piece
            part = where[start:start + rows]
            yield t[part[:, 0], part[:, 1]].cpu()
        return
    rows = max(1, piece_bytes // (8 * max(1, math.prod(t.shape[1:]))))
    for start in range(0, max(1, t.shape[0]), rows):
        yield t[start:start + rows].cpu()


def recordings(t: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
    """A waveform output as one flat tensor per item, each cut to its real samples: rows of a (batch, [channels,]
    samples) or (batch, samples, channels) output, the mask's (batch, samples) along the axis of its length (an
    output of another length, a hop's frames say, is kept whole); a 1-d output is one recording."""
    if t.dim() <= 1:
        return [t.reshape(-1)]
    rows = [t[i] for i in range(t.shape[0])]
    if mask is None or mask.dim() != 2 or mask.shape[0] != t.shape[0]:
        return [r.reshape(-1) for r in rows]
    keep = mask.to(t.device, torch.bool)
    if t.shape[-1] == mask.shape[1]:
        return [r[..., k].reshape(-1) for r, k in zip(rows, keep)]
    if t.shape[1] == mask.shape[1]:
        return [r[k].reshape(-1) for r, k in zip(rows, keep)]
    return [r.reshape(-1) for r in rows]


def shape_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> dict | None:
    """The two shapes where a target's output has another shape than the reference's (a decoder whose output
    length rounds with the input's, say), else None: elementwise, nothing can be compared then."""
    if tuple(actual.shape) == tuple(expected.shape):
        return None
    return {"shape": list(actual.shape), "reference_shape": list(expected.shape)}


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1) if t.dim() < 2 else t.reshape(t.shape[0], -1)


def compare(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None, mask=None) -> dict:
    """Max absolute/relative error, relative L2 error and cosine per row on real positions; with a
    tolerance, pass/fail and the reason from assert_close. Shapes that differ: every error is nan and
    "shape_mismatch" holds both shapes (with a tolerance, a fail whose reason says so)."""
    differs = shape_mismatch(actual, expected)
    if differs is not None:
        nan = math.nan
        found = {"shape": differs["shape"], "shape_mismatch": differs, "real_elements": 0, "max_abs": nan,
                 "max_rel": nan, "rel_l2": nan, "cosine_min": nan, "cosine_mean": nan}
        if tol is not None:
            found.update(passed=False, reason=mismatch_text(differs), tolerance=tol.to_dict(), atol_to_pass=nan)
        return found
    mask = mask.cpu() if mask is not None else None
    errors = _Errors(tol, real_shape(actual, mask))
    for a, e in zip(real_pieces(actual, mask), real_pieces(expected, mask)):    # a piece at a time: PIECE_BYTES
        errors.add(a, e)
    return errors.found(list(actual.shape))


class _Errors:
    """compare()'s errors, gathered a piece of the real positions at a time: maxima, the L2 norms the relative
    error is made of, each row's cosine (a piece holds whole rows), and the tolerance's misses."""

    def __init__(self, tol: Tolerance | None, shape: tuple):
        self.tol, self.elements = tol, 0
        self.misses = tol.misses(shape) if tol is not None and len(shape) else None
        self.whole = [] if tol is not None and not len(shape) else None    # a 0-d tensor: assert_close's own words
        self.max_abs, self.max_rel, self.over, self.diff_norms, self.norms, self.cos = [], [], [], [], [], []

    def add(self, a: torch.Tensor, e: torch.Tensor) -> None:
        a64, e64 = a.double(), e.double()
        diff = torch.where(a64 == e64, 0.0, a64 - e64).abs()
        rel = diff / e64.abs()
        rel = torch.where(diff == 0, 0.0, rel)
        self.cos.append(F.cosine_similarity(_rows(a64), _rows(e64), dim=1, eps=1e-30))
        self.diff_norms.append(diff.norm().item())
        self.norms.append(e64.norm().item())
        if a.numel():
            self.max_abs.append(diff.max())
            self.max_rel.append(rel.max())
            if self.tol is not None:    # the smallest atol that passes at this rtol
                self.over.append((diff - self.tol.rtol * e64.abs()).max())
        if self.misses is not None:
            self.misses.add(a, e.to(a.dtype))
        elif self.whole is not None:
            self.whole.append((a, e))
        self.elements += a.numel()

    def found(self, shape: list) -> dict:
        cos = torch.cat(self.cos)
        found = {"shape": shape, "real_elements": self.elements,
                 "max_abs": _greatest(self.max_abs), "max_rel": _greatest(self.max_rel),
                 "rel_l2": math.hypot(*self.diff_norms) / max(math.hypot(*self.norms), 1e-300),
                 "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item()}
        if self.tol is not None:
            reason = self.misses.reason() if self.misses is not None else \
                self.tol.check(self.whole[0][0], self.whole[0][1].to(self.whole[0][0].dtype))
            found.update(passed=reason is None, reason=reason, tolerance=self.tol.to_dict(),
                         # a concrete number for a looser policy
                         atol_to_pass=max(0.0, _greatest(self.over)))
        return found


def _greatest(maxima: list[torch.Tensor]) -> float:
    """The greatest of the pieces' maxima (NaN where any is), 0.0 where there were no elements."""
    return torch.stack(maxima).max().item() if maxima else 0.0


def mismatch_text(differs: dict, name: str | None = None) -> str:
    """A shape mismatch in words, e.g. "output 'audio' has shape [1, 23936] on the target, [1, 24000] in the
    reference: not compared"."""
    what = f"output {name!r}" if name else "the output"
    return f"{what} has shape {differs['shape']} on the target, {differs['reference_shape']} in the reference: " \
        "not compared"


def primary_output(kind: str, names) -> str:
    names = list(names)
    wanted = "embedding" if kind == registry.EMBEDDING else "logits"
    return wanted if wanted in names else names[0]


def check(key: str, label: str, value: float, bounds: dict, n: int | None = None, ci95=None,
          unit: str | None = None) -> dict:
    """One task metric's measurement against its budget (tolerance.DEFAULT_TASK_BOUNDS' key), with the items it
    was decided on (`n`, `unit`) and its 95% interval (stats.py): "decision" is pass only where the whole
    interval lies inside the budget, inconclusive where it straddles it; without an interval, the point decides."""
    interval = [float(ci95[0]), float(ci95[1])] if ci95 is not None else None
    decision = stats.decide(interval or (value, value), key, bounds)
    return {"metric": key, "label": label, "value": value, "n": n, "unit": unit, "ci95": interval,
            "budget": budget_text(key, bounds), "bound": bounds[key], "decision": decision,
            "passed": decision == stats.PASS, "within": within(key, value, bounds), "why": TASK_BOUND_REASONS[key]}


def _rate(key: str, label: str, hits: torch.Tensor, bounds: dict, unit: str) -> dict:
    """A share of decisions that agree, with its Wilson interval."""
    n = int(hits.numel())
    return check(key, label, hits.double().mean().item() if n else 1.0, bounds, n,
                 stats.wilson(int(hits.sum()), n), unit)


# ---------------------------------------------------------------- per-item values, then the metrics over them
# Each kind's task metric is computed from per-item values (one per text, decision, position or frame), so a
# sample measured in batches is judged as one: item_values per batch, joined (join_values), then summarize.
def _embedding_items(a, e, mask, inputs):
    return {"cosine": F.cosine_similarity(_rows(a), _rows(e), dim=1), "actual": _rows(a), "expected": _rows(e)}


def _embedding(v, bounds, unit):
    cos = v["cosine"]
    found = {"metric": "cosine to the reference", "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item(),
             "items": int(cos.numel())}
    return found, [check("cosine", "lowest cosine to the reference", found["cosine_min"], bounds, found["items"],
                         stats.bootstrap(cos, stats.MIN), unit)]


def _language_model_items(a3, e3, mask, inputs):
    """a3, e3: the whole (batch, seq, vocab) logits as the model returned them; agreement and KL count real positions
    only. Each value is one position's, so they are computed a piece of positions at a time in float64
    (real_pieces): the logits are never copied whole."""
    values = join_values([_positions(a.double().reshape(-1, a.shape[-1]), e.double().reshape(-1, e.shape[-1]))
                          for a, e in zip(real_pieces(a3, mask), real_pieces(e3, mask))])
    ids = (inputs or {}).get("input_ids")
    if ids is not None and a3.dim() == 3 and tuple(ids.shape) == tuple(a3.shape[:2]) and ids.shape[1] > 1:
        ids = ids.cpu()
        keep = (mask[:, 1:] if mask is not None else torch.ones_like(ids[:, 1:])).to(torch.bool)
        targets = ids[:, 1:][keep]
        for name, logits in (("ce_reference", e3), ("ce_target", a3)):
            found, start = [], 0
            for piece in real_pieces(logits[:, :-1], keep):
                found.append(F.cross_entropy(piece.double(), targets[start:start + len(piece)], reduction="none"))
                start += len(piece)
            values[name] = torch.cat(found)
    return values


def _positions(a: torch.Tensor, e: torch.Tensor) -> dict:
    """A language model's values at each position of (positions, vocab) float64 logits."""
    top = e.argmax(-1, keepdim=True)
    return {"agree": a.argmax(-1) == top[:, 0],
            "top5": (a.topk(min(5, a.shape[-1]), -1).indices == top).any(-1),
            "kl": F.kl_div(F.log_softmax(a, -1), F.log_softmax(e, -1), log_target=True, reduction="none").sum(-1)}


def _ppl_change(d: torch.Tensor) -> torch.Tensor:
    """|perplexity_target / perplexity_reference - 1| from per-position cross-entropy differences."""
    return (d.mean(-1).exp() - 1).abs()


def _language_model(v, bounds, unit):
    kl, positions = v["kl"], int(v["agree"].numel())
    found = {"metric": "greedy next-token agreement at real positions",
             "top1_agreement": v["agree"].double().mean().item(), "top5_agreement": v["top5"].double().mean().item(),
             "kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "positions": positions}
    checks = [_rate("agreement", "greedy-token agreement", v["agree"], bounds, "token positions"),
              check("kl", "mean KL(reference || target)", found["kl_mean"], bounds, positions,
                    stats.bootstrap(kl, stats.MEAN), "token positions")]
    if "ce_reference" in v:
        found["perplexity_reference"] = v["ce_reference"].mean().exp().item()
        found["perplexity_target"] = v["ce_target"].mean().exp().item()
        found["perplexity_change"] = abs(found["perplexity_target"] / found["perplexity_reference"] - 1)
        d = v["ce_target"] - v["ce_reference"]
        checks.append(check("perplexity", "relative perplexity change on the batch's own text",
                            found["perplexity_change"], bounds, int(d.numel()), stats.bootstrap(d, _ppl_change),
                            "token positions"))
    else:
        found["perplexity_note"] = "perplexity not measured: the logits do not predict the input ids"
    return found, checks


def _classifier_items(a, e, mask, inputs):   # one label per image, or per real token
    values = {"agree": a.argmax(-1).reshape(-1) == e.argmax(-1).reshape(-1)}
    labels = (inputs or {}).get("labels")
    if labels is not None and labels.numel() == values["agree"].numel():
        labels = labels.reshape(-1).cpu()
        values["correct_reference"] = e.argmax(-1).reshape(-1) == labels
        values["correct_target"] = a.argmax(-1).reshape(-1) == labels
    return values


def _classifier(v, bounds, unit):
    agree = v["agree"]
    found = {"metric": "top-1 agreement", "argmax_agreement": agree.double().mean().item(),
             "decisions": int(agree.numel())}
    checks = [_rate("agreement", "top-1 agreement", agree, bounds, unit or "decisions")]
    if "correct_reference" in v:
        found["accuracy_reference"] = v["correct_reference"].double().mean().item()
        found["accuracy_target"] = v["correct_target"].double().mean().item()
        found["accuracy_change"] = found["accuracy_target"] - found["accuracy_reference"]
    else:
        found["accuracy_note"] = "accuracy change not measured: the inputs carry no labels"
    return found, checks


# CREPE's confidence above which a frame counts as voiced: torchcrepe's README thresholds periodicity at 0.21.
PITCH_VOICED = 0.21


def _pitch_items(a, e, mask, inputs):
    """a, e: (frames, 2) at real frames, each row (cents, confidence)."""
    voiced_a, voiced_e = (a[..., 1] >= PITCH_VOICED).reshape(-1), (e[..., 1] >= PITCH_VOICED).reshape(-1)
    both = voiced_a & voiced_e
    return {"cents": (a[..., 0].reshape(-1)[both] - e[..., 0].reshape(-1)[both]).abs(),
            "voicing": voiced_a == voiced_e, "voiced_reference": voiced_e}


def _pitch(v, bounds, unit):
    """The cents error on frames voiced in both runs, and how many frames keep their voiced/unvoiced decision."""
    error = v["cents"]
    found = {"metric": "pitch error in cents on voiced frames, and voicing agreement",
             "frames": int(v["voicing"].numel()), "voiced_reference": int(v["voiced_reference"].sum()),
             "voiced_both": int(error.numel()), "voiced_threshold": PITCH_VOICED,
             "voicing_agreement": v["voicing"].double().mean().item() if v["voicing"].numel() else 1.0}
    if error.numel():
        q = torch.quantile(error, torch.tensor([0.5, 0.95], dtype=error.dtype))
        found.update(cents_median=q[0].item(), cents_p95=q[1].item(), cents_max=error.max().item())
    else:
        found.update(cents_median=0.0, cents_p95=0.0, cents_max=0.0,
                     cents_note="no frame is voiced in both runs: the pitch error is not measured")
    return found, [check("cents", "95th-percentile absolute pitch error (cents, voiced frames)", found["cents_p95"],
                         bounds, int(error.numel()), stats.bootstrap(error, stats.quantile(0.95))
                         if error.numel() else None, "voiced frames"),
                   _rate("voicing", "voiced/unvoiced agreement", v["voicing"], bounds, "frames")]


# float64 resolves an amplitude ratio down to its machine epsilon: beyond 20 log10(1 / eps) ~ 313 dB two signals
# are the same as far as the measurement can tell, so a ratio in dB is held within +-DB_LIMIT (identical signals,
# and silence on both sides, read +DB_LIMIT; an error against a silent reference -DB_LIMIT).
DB_LIMIT = 20 * math.log10(1 / torch.finfo(torch.float64).eps)


def _db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) of two energies, within +-DB_LIMIT."""
    if noise == 0:
        return DB_LIMIT
    if signal == 0:
        return -DB_LIMIT
    return max(-DB_LIMIT, min(DB_LIMIT, 10 * math.log10(signal / noise)))


def snr_db(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-noise ratio of `estimate` against `reference`, in dB: 10 log10(|s|^2 / |estimate - s|^2), the
    noise being every difference (a gain change included), in float64."""
    s, x = reference.detach().cpu().double().reshape(-1), estimate.detach().cpu().double().reshape(-1)
    return _db(float(s.square().sum()), float((x - s).square().sum()))


def si_sdr_db(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    """Scale-invariant signal-to-distortion ratio in dB (Le Roux, Wisdom, Erdogan & Hershey 2019, "SDR - half-baked
    or well done?", ICASSP, eq. 4): the reference scaled to its projection on the estimate, alpha s with
    alpha = <estimate, s> / |s|^2, against what the scaling cannot explain. Any gain of the estimate leaves it
    unchanged. Not made zero-mean first (torchmetrics' default): a DC offset the target adds counts as distortion."""
    s, x = reference.detach().cpu().double().reshape(-1), estimate.detach().cpu().double().reshape(-1)
    energy = float(s.square().sum())
    target = s * (float(x @ s) / energy) if energy > 0 else torch.zeros_like(s)
    return _db(float(target.square().sum()), float((x - target).square().sum()))


def _waveform_items(a, e, mask, inputs):
    """a, e: the whole outputs; one SNR and one SI-SDR per recording, over its real samples (recordings())."""
    pairs = list(zip(recordings(a, mask), recordings(e, mask)))
    return {"snr_db": torch.tensor([snr_db(x, s) for x, s in pairs], dtype=torch.float64),
            "si_sdr_db": torch.tensor([si_sdr_db(x, s) for x, s in pairs], dtype=torch.float64),
            "samples": torch.tensor([s.numel() for _, s in pairs], dtype=torch.float64)}


def _waveform(v, bounds, unit):
    """The lowest SNR and SI-SDR of any recording (as an embedding's lowest cosine), each with its interval."""
    snr, sdr = v["snr_db"], v["si_sdr_db"]
    found = {"metric": "SNR and SI-SDR against the reference, in dB, over real samples", "items": int(snr.numel()),
             "samples": int(v["samples"].sum()), "snr_db_min": snr.min().item(), "snr_db_mean": snr.mean().item(),
             "si_sdr_db_min": sdr.min().item(), "si_sdr_db_mean": sdr.mean().item()}
    return found, [check("snr_db", "lowest SNR (dB)", found["snr_db_min"], bounds, found["items"],
                         stats.bootstrap(snr, stats.MIN), unit),
                   check("si_sdr_db", "lowest SI-SDR (dB)", found["si_sdr_db_min"], bounds, found["items"],
                         stats.bootstrap(sdr, stats.MIN), unit)]


def codes(t: torch.Tensor) -> torch.Tensor:
    """Discrete codes: an integer (or bool) tensor as it is, float logits as their argmax over the last axis."""
    return t.argmax(-1) if t.is_floating_point() or t.is_complex() else t


def _codes_items(a, e, mask, inputs):     # a, e: codes at real positions (item_values)
    return {"agree": (a == e).reshape(-1)}


def _codes(v, bounds, unit):
    agree = v["agree"]
    found = {"metric": "code agreement at real positions", "code_agreement": agree.double().mean().item()
             if agree.numel() else 1.0, "codes": int(agree.numel())}
    return found, [_rate("codes", "code agreement", agree, bounds, "codes")]


PROBABILITY_THRESHOLD = inputs.DECISION_THRESHOLD     # one owner: portkit.models.inputs


def _probability_items(a, e, mask, inputs):     # a, e: probabilities at real positions (item_values)
    a, e = a.reshape(-1), e.reshape(-1)
    return {"abs_error": (a - e).abs(), "decision": (a >= PROBABILITY_THRESHOLD) == (e >= PROBABILITY_THRESHOLD),
            "in_range": (e >= 0) & (e <= 1)}


def _probability(v, bounds, unit):
    """Mean absolute error of the probabilities, and how many keep their side of PROBABILITY_THRESHOLD."""
    error, n = v["abs_error"], int(v["abs_error"].numel())
    found = {"metric": "probability error and decision agreement", "values": n, "threshold": PROBABILITY_THRESHOLD,
             "mae": error.mean().item() if n else 0.0, "max_abs": error.max().item() if n else 0.0,
             "decision_agreement": v["decision"].double().mean().item() if n else 1.0}
    outside = int((~v["in_range"]).sum())
    if outside:
        found["range_note"] = (f"{outside} of the reference's {n} values lie outside [0, 1]: not probabilities; "
                               "declare logits as a classifier output")
    return found, [check("probability_mae", "mean absolute probability error", found["mae"], bounds, n,
                         stats.bootstrap(error, stats.MEAN) if n else None, "probabilities"),
                   _rate("agreement", f"decision agreement at {PROBABILITY_THRESHOLD:g}", v["decision"], bounds,
                         "probabilities")]


def _detection_items(a, e, mask, inputs):    # (batch, queries, classes): one decision per query
    return _classifier_items(a.reshape(-1, a.shape[-1]), e.reshape(-1, e.shape[-1]), mask, None)


def _detection(v, bounds, unit):
    return _classifier(v, bounds, "queries")


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of each box in `a` with the box at the same index in `b`, both (..., 4) as (cx, cy, w, h), the centre and
    size DETR-style heads predict (transformers' center_to_corners_format); two empty boxes agree (1)."""
    def corners(t):
        half = t[..., 2:].clamp(min=0) / 2
        return t[..., :2] - half, t[..., :2] + half
    (a0, a1), (b0, b1) = corners(a), corners(b)
    inter = (torch.minimum(a1, b1) - torch.maximum(a0, b0)).clamp(min=0).prod(-1)
    union = (a1 - a0).prod(-1) + (b1 - b0).prod(-1) - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.ones_like(union))


def _boxes_items(a, e, mask, inputs):        # (batch, queries, 4) boxes
    return {"iou": box_iou(a.reshape(-1, 4), e.reshape(-1, 4))}


def _boxes(v, bounds, unit):
    iou = v["iou"]
    found = {"metric": "IoU of each query's box with the reference's", "iou_min": iou.min().item(),
             "iou_mean": iou.mean().item(), "boxes": int(iou.numel())}
    return found, [check("box_iou", "lowest box IoU with the reference", found["iou_min"], bounds, found["boxes"],
                         stats.bootstrap(iou, stats.MIN), "boxes")]


def _segmentation_items(a, e, mask, inputs):   # (batch, classes, height, width): the argmax map, per pixel
    return _classifier_items(a.movedim(1, -1).reshape(-1, a.shape[1]), e.movedim(1, -1).reshape(-1, e.shape[1]),
                             mask, None)


def _segmentation(v, bounds, unit):
    found, checks = _classifier(v, bounds, "pixels")
    found["metric"] = "agreement of the argmax (class) map, per pixel"
    return found, checks


# Task metrics by output kind (models' kind strings; a model declaration names one of these keys): the per-item
# values of one batch, and the metrics with their checks over the values of every batch.
#   embedding: lowest cosine; top-k neighbour agreement over the task sample
#   causal-lm, seq2seq-lm: greedy-token agreement, mean KL, perplexity change on the batch's own text
#   image-classifier, token-classifier, classifier: top-1 agreement
#   pitch: 95th-percentile cents error on voiced frames, voicing agreement
#   waveform: lowest SNR and SI-SDR of any recording in dB, over its real samples
#   codes: agreement of discrete codes (integer tensors; float logits by their argmax) at real positions
#   probability: mean absolute error of values in [0, 1], and agreement of their side of PROBABILITY_THRESHOLD
#   detection: top-1 class agreement per query; boxes: lowest IoU of a query's box with the reference's
#   segmentation: agreement of the per-pixel argmax (class) map
TASK_METRICS = {registry.EMBEDDING: (_embedding_items, _embedding),
                registry.CAUSAL_LM: (_language_model_items, _language_model),
                registry.SEQ2SEQ_LM: (_language_model_items, _language_model),
                registry.IMAGE_CLASSIFIER: (_classifier_items, _classifier),
                registry.TOKEN_CLASSIFIER: (_classifier_items, _classifier),
                inputs.CLASSIFIER: (_classifier_items, _classifier), inputs.PITCH: (_pitch_items, _pitch),
                WAVEFORM: (_waveform_items, _waveform), CODES: (_codes_items, _codes),
                PROBABILITY: (_probability_items, _probability), inputs.DETECTION: (_detection_items, _detection),
                inputs.BOXES: (_boxes_items, _boxes), inputs.SEGMENTATION: (_segmentation_items, _segmentation)}
# Kinds whose per-item values take the whole outputs and the mask (the others get the real positions only), and
# those with one value per position (a (batch, seq) output of the mask's shape is cut to its real positions).
_WHOLE = (registry.CAUSAL_LM, registry.SEQ2SEQ_LM, WAVEFORM)
_PER_POSITION = (CODES, PROBABILITY)
# Kinds whose per-item values cast to float64 a piece at a time themselves (their outputs are vocabulary-wide).
_PIECEWISE = (registry.CAUSAL_LM, registry.SEQ2SEQ_LM)


def item_values(kind: str, actual: torch.Tensor, expected: torch.Tensor, mask, inputs: dict | None = None) -> dict:
    """One batch's per-item values of the output kind's task metrics (see TASK_METRICS), in float64. The shapes
    must match (shape_mismatch; task_metrics checks it)."""
    if kind not in TASK_METRICS:
        raise BadParameter("output kind", kind, list(TASK_METRICS))
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if kind == CODES:       # codes before the cast: an integer code stays exact, logits become their argmax
        a, e = codes(a), codes(e)
    if kind not in _PIECEWISE:
        a, e = a.double(), e.double()
    mask = mask.cpu() if mask is not None else None
    if kind in _WHOLE:
        return TASK_METRICS[kind][0](a, e, mask, inputs)
    each = kind in _PER_POSITION
    return TASK_METRICS[kind][0](real_positions(a, mask, each), real_positions(e, mask, each), mask, inputs)


def join_values(batches: list[dict]) -> dict:
    """Several batches' item_values as one sample (a value only some batches have is dropped)."""
    keys = set.intersection(*(set(b) for b in batches)) if batches else set()
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k in keys} if batches else {}


def summarize(kind: str, values: dict, bounds: dict, unit: str | None = None) -> dict:
    """The task metrics over item_values (one batch's, or join_values' sample): each check with its n and ci95."""
    found, checks = TASK_METRICS[kind][1](values, bounds, unit)
    return finish(found, checks)


def task_metrics(kind: str, actual: torch.Tensor, expected: torch.Tensor, mask, bounds: dict,
                 inputs: dict | None = None, unit: str | None = None, name: str | None = None) -> dict:
    """The output kind's task metrics against the reference, each with its budget, n and interval ("checks"), and
    whether all hold. `inputs` (the batch) gives language models their tokens for the perplexity. An output of
    another shape than the reference's is not measured (unmeasured(); `name` names it)."""
    differs = shape_mismatch(actual, expected)
    if differs is not None:
        return unmeasured(kind, differs, name)
    return summarize(kind, item_values(kind, actual, expected, mask, inputs), bounds, unit)


def unmeasured(kind: str, differs: dict, name: str | None = None) -> dict:
    """The task result of an output whose shape on the target differs from the reference's: nothing measured, and a
    fail, since what the deployment passes on has another shape than today's; "shape_mismatch" holds both
    shapes and the output's name, for the stage's finding."""
    if kind not in TASK_METRICS:
        raise BadParameter("output kind", kind, list(TASK_METRICS))
    return {"metric": f"{kind}: not measured", "shape_mismatch": {**differs, "output": name}, "checks": [],
            "decision": stats.FAIL, "passed": False, "reason": mismatch_text(differs, name)}


def finish(found: dict, checks: list[dict]) -> dict:
    """A task result's decision and reasons from its checks (also after more checks are added): fail where any
    check fails, inconclusive where none fails and one straddles its budget, else pass."""
    fails = [f"{stats.described(c)} outside its {c['budget']}" for c in checks if c["decision"] == stats.FAIL]
    open_ = [f"{stats.described(c)} straddles its {c['budget']}: inconclusive" for c in checks
             if c["decision"] == stats.INCONCLUSIVE]
    decision = stats.FAIL if fails else stats.INCONCLUSIVE if open_ else stats.PASS
    found.update(checks=checks, decision=decision, passed=decision == stats.PASS,
                 reason="; ".join(fails + open_) or None)
    return found


def neighbour_shares(actual: torch.Tensor, expected: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Per row, the share of its k nearest neighbours (cosine, itself excluded) that the target keeps."""
    def top(x):
        x = F.normalize(_rows(x.detach().cpu().double()), dim=1)
        sims = x @ x.T
        sims.fill_diagonal_(-2.0)
        return sims.topk(k, dim=1).indices
    a, e = top(actual), top(expected)
    return torch.tensor([len(set(r.tolist()) & set(q.tolist())) / k for r, q in zip(a, e)], dtype=torch.float64)


def neighbour_agreement(actual: torch.Tensor, expected: torch.Tensor, k: int = 5) -> float:
    """Mean share of each row's k nearest neighbours (cosine, itself excluded) that the target keeps."""
    return neighbour_shares(actual, expected, k).mean().item()
