"""What a stage could not assess for a target: each question it was to answer and left open, and why.

    >>> from portkit.core import assessed
    >>> assessed.open_question("HBM fit on v5e:1x1", "no shape reached the XLA compiler")
    {'question': 'HBM fit on v5e:1x1', 'why': 'no shape reached the XLA compiler'}
    >>> assessed.read({"not_assessed": [{"question": "HBM fit", "why": "..."}]})    # from a stage's JSON
    [{'question': 'HBM fit', 'why': '...'}]

A stage result that assessed nothing for a question (every shape failed before the compiler, a warm-up the
compiler refused) says "not assessed" for it, never "ok", "fits" or a count that can only be zero. Each stage's
per-target result lists those questions under KEY; the report (portkit/stages/report/stage.py) reads them with
`read`: with no blocker found, an open question makes the target "not assessed", named in `unassessed` and in
the verdict's reason. A failure of portkit's own machinery (the PyTorch-to-JAX conversion) is owned by PORTKIT.
A foundation: it reads the owner word from core.owners and the verdict word from core.grading.
"""
from __future__ import annotations

from portkit.core.owners import PORTKIT   # noqa: F401 (re-exported: the owner of portkit's own machinery)
from portkit.core.grading import NOT_ASSESSED

KEY = "not_assessed"            # a stage's per-target result: [{"question", "why"}]


def open_question(question: str, why: str) -> dict:
    """One question a stage left open for a target, and why (one line each)."""
    if not question or not why:
        raise ValueError(f"an open question needs its question and why, got {question!r}, {why!r}")
    return {"question": " ".join(str(question).split()), "why": " ".join(str(why).split())}


def read(target: dict) -> list[dict]:
    """The open questions of a stage's per-target result (KEY), each {"question", "why"}; raises TypeError or
    ValueError on an entry of another shape (the report turns that into a gap)."""
    found = target.get(KEY) or []
    if not isinstance(found, list):
        raise TypeError(f"{KEY} is a JSON {type(found).__name__}, not a list")
    return [open_question(q["question"], q["why"]) for q in found]


def consequence(question: str) -> str:
    """A finding's consequence where the stage could not answer `question`: neither a blocker nor a cost."""
    return f"{NOT_ASSESSED}: {question} is open (no blocker and no cost established)"


def portkit_owner(part: str) -> dict:
    """A finding's owner (as portkit.core.owners.owner words it) where `part` of portkit's machinery failed."""
    return {"owner": PORTKIT, "package": f"portkit ({part})", "setting": None, "setting_help": None}
