"""An empty Inductor cache of its own for one benchmark run, removed when the run ends.

    from _inductor_cache import own_inductor_cache
    with own_inductor_cache():          # before the first compile
        main()

Inductor keeps compiled graphs across processes in one cache per user (TORCHINDUCTOR_CACHE_DIR,
default <tmp>/torchinductor_<user>; read at every compile, torch/_inductor/runtime/cache_dir_utils.py).
A benchmark that measures cold compiles would, on its second run on the same machine, be served the
first run's graphs: each run compiles into a temporary directory of its own instead. Subprocesses
(Inductor's compile workers, a `portkit run`) inherit the variable.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


@contextlib.contextmanager
def own_inductor_cache():
    """Point Inductor at a new empty directory for the block; restore the variable and delete the
    directory afterwards, whether the block ends normally or not. Yields the directory."""
    path, before = tempfile.mkdtemp(prefix="portkit-bench-inductor-"), os.environ.get(VARIABLE)
    os.environ[VARIABLE] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before
        shutil.rmtree(path, ignore_errors=True)
