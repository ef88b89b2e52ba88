"""glibc malloc's settings for portkit's emulated graphs: one owner for the values, applied two ways.

The emulated targets' graphs make many fresh activation-sized tensors (the TPU's bf16 rounding, attention as
two matmuls). By default glibc's malloc serves a block above an adaptive threshold (128 KiB, rising up to
32 MiB) with mmap, and hands the top of its heap back to the system once twice the largest freed block lies
free there: thousands of page faults a forward, which slow the emulated forward against eager's; serving
blocks under 32 MiB from the heap and keeping up to 64 MiB of freed memory removes most of that overhead
(benchmarks/bench_compile.py --allocator default|kernels measures both).

- ENVIRONMENT: the settings as the variables malloc reads when a process starts (the stage kernels:
  kernels.ENVIRONMENT);
- tune(): the same settings in a running process, with mallopt(3), at an emulated backend's first compile (a
  user's own notebook or script), unless the environment sets either variable (the user's choice, or a kernel
  started with them).
Another C library: nothing changes (no mallopt to call, or one that takes neither setting; the variables are
ignored).
"""
from __future__ import annotations

import ctypes
import functools
import os

MMAP_THRESHOLD = 32 << 20   # blocks below it come from the heap
TRIM_THRESHOLD = 64 << 20   # freed memory kept at the top of the heap
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h


@functools.cache
def tune() -> bool:
    """Apply the settings to this process, once; True where malloc took both."""
    if any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
