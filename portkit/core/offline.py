"""portkit never downloads: the Hugging Face libraries' offline switches, set where the user set none, so that an
accidental Hub access fails at once instead of hanging (huggingface_hub reads HF_HUB_OFFLINE, transformers
TRANSFORMERS_OFFLINE).

    >>> from portkit.core import offline
    >>> offline.set_offline()

Light to import: `portkit run` sets them before it starts the kernels' fork server, whose environment must be the
one the kernels get (run/kernel_forks.py forks a kernel only from a server started with its environment).
"""
from __future__ import annotations

import os

VARIABLES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def set_offline() -> None:
    """Set VARIABLES in this process's environment where the user has not."""
    for key, value in VARIABLES.items():
        os.environ.setdefault(key, value)
