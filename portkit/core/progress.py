"""Progress bars for portkit's long loops: the one place that decides which bar a loop shows.

    >>> from portkit.core import progress
    >>> for chunk in progress.bar(chunks, desc="tokenizing", unit="chunk", total=len(chunks)):
    ...     ...
    >>> with progress.bar(total=12, desc="accuracy", unit="pass") as bar:
    ...     bar.update()
    >>> progress.headless()        # True under `portkit run` and the tests (PORTKIT_HEADLESS=1)
    >>> progress.watched()         # stdout is a terminal (or Jupyter): `portkit run` and `sweep` draw bars

In JupyterLab a loop shows tqdm's widget (tqdm.auto picks it). In a headless run (`portkit run`,
papermill, nbval: PORTKIT_HEADLESS=1, which the runner and the tests set) nobody sees a widget, so the
bar is tqdm's text bar on stderr, redrawn at most every HEADLESS_INTERVAL seconds: the runner passes
the stage kernel's stderr on to the terminal, and the executed notebook keeps only a few lines of it.
In plain Python, tqdm.auto's text bar on stderr. Each bar says what it counts (desc, unit).
"""
from __future__ import annotations

import os
import sys

HEADLESS_VARIABLE = "PORTKIT_HEADLESS"
HEADLESS_INTERVAL = 2.0    # seconds between redraws of a headless bar: a 5-minute loop writes ~150 lines


def headless() -> bool:
    """Whether this process runs a stage nobody watches interactively (PORTKIT_HEADLESS set, not "0")."""
    return os.environ.get(HEADLESS_VARIABLE, "") not in ("", "0")


def watched(stream=None) -> bool:
    """Whether someone watches `stream` (default: stdout) redraw a bar: a terminal, or a Jupyter front end
    (tqdm.auto's widget; not a headless kernel). A file or a pipe gets plain lines, no redraws."""
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):     # no isatty, or a closed stream
        return False
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {}) and not headless()


def bar(iterable=None, *, desc: str, unit: str = "it", total: int | None = None, disable: bool = False,
        leave: bool = True, **options):
    """A tqdm bar for `iterable` (or updated by hand): the widget in JupyterLab, text on stderr headless."""
    if headless():
        from tqdm.std import tqdm
        options = {"file": sys.stderr, "mininterval": HEADLESS_INTERVAL, "ascii": True, **options}
    else:
        from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, unit=unit, total=total, disable=disable, leave=leave, **options)
