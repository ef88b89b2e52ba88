"""The padding side of a text model's batches, and the other side tried where padding fails: a tokenizer pads on one
side (its `padding_side`), and whether padding reaches the real positions can depend on that side. A causal decoder
whose positions count from the first slot (not from its mask) moves every real position under left padding, while
right padding leaves them alone; a model that reads its last slot is hurt by right padding only. So stage 3 pads its
buckets on the side the model's own batches are padded on (pads_on), and stages 3 and 4 both pad a case that fails
only padded on the other side (flippable) and run it again; the padding finding's advice (advice) then says
"tried: passes" or "tried: still fails". This module is the one owner of that rule for both stages.

    >>> from portkit.models import padding_side
    >>> padding_side.pads_on(model, texts)           # "left" where the declaration's batches hold padding on the left
    >>> padding_side.flippable(model, texts)         # "right" for a tokenizer that pads on the left; None: no side
    >>> with padding_side.padding_on(model, "right"):
    ...     batch = model.encode(texts, pad_to=64)   # padded on the right, whatever the tokenizer's own side
"""
from __future__ import annotations

from contextlib import contextmanager

SIDES = ("right", "left")
# What a model needs where padding reaches its real positions on either side (the grading policy's "padding": work).
EXACT = ("this model needs exact-length batches or per-length buckets: batch requests of one length together, or plan "
         "one bucket per length (a compile each)")


def side_of(model) -> str | None:
    """The side the model's tokenizer pads on; None where it has no tokenizer with a side (images, audio)."""
    side = getattr(getattr(model, "tokenizer", None), "padding_side", None)
    return side if side in SIDES else None


def other(model) -> str | None:
    """The side the tokenizer does not pad on, to try; None where there is no side to flip."""
    side = side_of(model)
    return None if side is None else flip(side)


def flip(side: str) -> str:
    """The other side."""
    return SIDES[1 - SIDES.index(side)]


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


def _padded(model, texts: list) -> dict:
    """`texts` built by the model's declaration past their longest, so that every row holds padding."""
    longest = model.declaration.size_of(model.encode(list(texts)), model.seq_dim)
    return model.encode(list(texts), pad_to=longest + 2)


def pads_on(model, texts: list | None = None) -> str:
    """The side the model's own batches hold their padding on: "left" where the declaration builds `texts` padded on
    the left (read from its mask, lands_on), else "right"; without texts, the tokenizer's side (else "right")."""
    if not texts or model.seq_dim is None or not getattr(model, "takes_text", True):
        return side_of(model) or "right"
    batch = _padded(model, texts)
    if model.declaration.real_mask(batch, model.seq_dim) is None:     # no mask to read the side from
        return side_of(model) or "right"
    return "left" if lands_on(model, batch, "left") else "right"


def flippable(model, texts: list) -> str | None:
    """The side to try: the one the tokenizer does not pad on, where flipping it moves the padding of the
    declaration's batches of `texts` there (lands_on); None where there is no side to flip, or flipping the
    tokenizer's side moves nothing (the declaration builds its batches another way), so a try would try nothing."""
    side = other(model)
    if side is None or not texts:
        return None
    with padding_on(model, side):
        return side if lands_on(model, _padded(model, texts), side) else None


def advice(tried: list[dict], paths: list[str], where: str, exact: str = EXACT) -> str:
    """The padding finding's advice from the other side's tries (entries with "path", "padding_side" and "passed",
    one per failing path): pad on that side where it passed on every path that fails padded; else `exact` (EXACT,
    or the stage's wording of it), saying what was tried. `where` says how the passing try was judged ("at the same
    precision")."""
    sides = [t for t in tried if t.get("padding_side") and t["path"] in paths]
    if not sides:
        return exact
    side = sides[0]["padding_side"]
    failed = [t["path"] for t in sides if not t["passed"]]
    untried = [p for p in paths if p not in {t["path"] for t in sides}]
    if not failed and not untried:
        return (f"pad on the {side} (tokenizer.padding_side = '{side}'; the tokenizer pads on the {flip(side)}): "
                f"tried: {', '.join(paths)} padded on the {side} pass(es) {where}")
    if failed:
        return f"{exact}; tried: padding on the {side} still fails on {', '.join(failed)}"
    return f"{exact}; padding on the {side} passes on the paths tried, not tried on {', '.join(untried)}"
