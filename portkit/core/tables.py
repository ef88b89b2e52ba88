"""Small tables for results: rendered as HTML in a notebook, as aligned text in a terminal.

    >>> from portkit.core.tables import HtmlTable
    >>> table = HtmlTable(["op", "calls"], [["aten::addmm", 37]], "ops by calls")
    >>> print(table)           # aligned columns under the caption
    >>> table._repr_html_()    # what Jupyter shows; every cell HTML-escaped
"""
from __future__ import annotations

import html
from dataclasses import dataclass


def html_table(header, rows, caption: str = "") -> str:
    """An HTML <table> with every header, cell and the caption escaped."""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in r)
                   + "</tr>" for r in rows)
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class HtmlTable:
    """A small table that renders in a notebook and prints in a terminal."""
    header: list[str]
    rows: list[list]
    caption: str = ""

    def _repr_html_(self) -> str:
        return html_table(self.header, self.rows, self.caption)

    def __str__(self) -> str:
        cells = [self.header] + [[str(c) for c in r] for r in self.rows]
        widths = [min(60, max(len(str(r[i])) for r in cells)) for i in range(len(self.header))]
        lines = [self.caption] if self.caption else []
        lines += ["  ".join(str(c)[:w].ljust(w) for c, w in zip(r, widths)) for r in cells]
        return "\n".join(lines)

    __repr__ = __str__
