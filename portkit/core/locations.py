"""Where portkit's own files are: the package, and the checkout's data/ and notebooks/ beside it.

    >>> from portkit.core.locations import DATA
    >>> (DATA / "targets").is_dir()
    True
"""
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]   # portkit/
ROOT = PACKAGE.parent                            # the checkout (an editable install)
DATA = ROOT / "data"
NOTEBOOKS = ROOT / "notebooks"
