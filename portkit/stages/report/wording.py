"""A finding as the report shows it: a plain headline first, its technical detail (the ops, the file and line,
what torch.compile made of it) behind a disclosure. Rendering only: the finding's record is unchanged.

    >>> from portkit.stages.report import wording
    >>> wording.headline(finding)   # 'attention mask in encoder.layer.*.attention.self (6 modules): ...; 6 calls'
    >>> wording.detail(finding)     # [('where', 'transformers/.../sdpa_attention.py:182 in ...'), ('source', ...)]
"""
from __future__ import annotations

import re

_OPS = re.compile(r"\s*\((?:aten|prims|torch)::[^()]*\)")   # "(aten::addmm, aten::mm, ...)": internals
_OPENERS, _CLOSERS = "([{", ")]}"


def headline(f: dict) -> str:
    """The finding's message without its internals: the " at FILE:LINE in FUNC: SOURCE" place (shown in the
    detail, where the source line can be read whole) and the ATen op names in parentheses."""
    message, where = str(f.get("message", "")), str(f.get("where", ""))
    if where:
        message = message.replace(f" at {where}", "")
    return " ".join(_OPS.sub("", message).split())


def _continues(source: str) -> bool:
    """Whether a source line opens a bracket it does not close: the statement goes on past the recorded line."""
    depth = 0
    for char in source:
        depth += (char in _OPENERS) - (char in _CLOSERS)
    return depth > 0


def detail(f: dict) -> list[tuple[str, str]]:
    """The finding's technical detail as (label, text) rows: the ops, the place and its source line (marked where
    the statement continues past the one line the recording keeps), torch.compile's reading, eager severity."""
    rows = []
    ops = [m.group(0).strip()[1:-1] for m in _OPS.finditer(str(f.get("message", "")))]
    if ops:
        rows.append(("ops", "; ".join(ops)))
    where = str(f.get("where", ""))
    if where:
        place, _, source = where.partition(": ")
        rows.append(("where", place))
        if source:
            rows.append(("source line", source + (" … (the statement continues on the next lines)"
                                                   if _continues(source) else "")))
    if f.get("compiled"):
        rows.append(("under torch.compile", ": ".join(filter(None, [f["compiled"], f.get("compiled_detail")]))))
    if f.get("eager") and f.get("eager") != f.get("severity"):
        rows.append(("severity in eager mode", f["eager"]))
    rows.append(("found by", f"stage {f.get('stage', '?')} ({f.get('notebook', '?')})"))
    return rows
