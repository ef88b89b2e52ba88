"""The other padding side, tried on a bucket that fails only padded: a text model's tokenizer pads on one side
(its `padding_side`), and whether padding reaches the real positions can depend on that side. A causal decoder
whose positions count from the first slot (not from its mask) moves every real position under left padding, while
right padding leaves them alone; a model that reads its last slot is hurt by right padding only. So before the
padding finding advises exact-length batches, stage 4 pads the failing bucket's texts on the other side and runs
them again on the same target side and precision; the advice then says "tried: passes" or "tried: still fails".

    >>> from portkit.stages.accuracy import padding_side
    >>> padding_side.other(model)                    # "right" for a tokenizer that pads on the left; None: no side
    >>> with padding_side.padding_on(model, "right"):
    ...     batch = model.encode(texts, pad_to=64)   # padded on the right, whatever the tokenizer's own side
"""
from __future__ import annotations

from contextlib import contextmanager

SIDES = ("right", "left")


def side_of(model) -> str | None:
    """The side the model's tokenizer pads on; None where it has no tokenizer with a side (images, audio)."""
    side = getattr(getattr(model, "tokenizer", None), "padding_side", None)
    return side if side in SIDES else None


def other(model) -> str | None:
    """The side the tokenizer does not pad on, to try; None where there is no side to flip."""
    side = side_of(model)
    return None if side is None else SIDES[1 - SIDES.index(side)]


@contextmanager
def padding_on(model, side: str):
    """The model's tokenizer padding on `side` inside the block (transformers' PreTrainedTokenizerBase.padding_side,
    which every call reads), its own side again after it."""
    if side not in SIDES:
        raise ValueError(f"padding side {side!r}: one of {SIDES}")
    tokenizer = model.tokenizer
    own = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield
    finally:
        tokenizer.padding_side = own


def lands_on(model, batch: dict, side: str) -> bool:
    """Whether `batch` (built by the model's declaration) holds its padding on `side`: every row's real positions,
    by the declaration's mask, start at the first slot (right) or end at the last (left). False where the
    declaration names no mask, or builds its batches without the tokenizer's side (then flipping it tried nothing)."""
    real = model.declaration.real_mask(batch, model.seq_dim) if model.seq_dim else None
    if real is None or real.dim() != 2:
        return False
    return bool(real[:, 0 if side == "right" else -1].all())


def advice(tried: list[dict], paths: list[str]) -> str:
    """The padding finding's advice from the other side's tries (entries with "padding_side", one per path): pad on
    that side where it passed on every path that fails only padded; else exact-length batches, saying what was
    tried."""
    exact = ("this model needs exact-length batches or per-length buckets (stage 3's padding check names the same "
             "cause)")
    sides = [t for t in tried if t.get("padding_side") and t["path"] in paths]
    if not sides:
        return exact
    side = sides[0]["padding_side"]
    failed = [t["path"] for t in sides if not t["passed"]]
    untried = [p for p in paths if p not in {t["path"] for t in sides}]
    if not failed and not untried:
        own = SIDES[1 - SIDES.index(side)]
        return (f"pad on the {side} (tokenizer.padding_side = '{side}'; the tokenizer pads on the {own}): tried: "
                f"{', '.join(paths)} padded on the {side} pass(es) at the same precision")
    if failed:
        return f"{exact}; tried: padding on the {side} still fails on {', '.join(failed)}"
    return f"{exact}; padding on the {side} passes on the paths tried, not tried on {', '.join(untried)}"
