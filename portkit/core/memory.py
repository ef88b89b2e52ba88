"""The machine's memory and a process's peak resident memory, from the operating system's own accounting.

    >>> from portkit.core import memory
    >>> memory.available(), memory.total()          # bytes; 0 where the system does not say
    >>> memory.reset_peak(pid)                      # True where the peak could be reset (Linux)
    >>> memory.peak(pid)                            # the process's peak resident bytes since then, or None

Linux keeps each process's peak resident set size (VmHWM in /proc/PID/status) and resets it when "5" is written
to /proc/PID/clear_refs (proc(5), since Linux 4.0): a stage's peak is read without sampling, whatever its
duration. Elsewhere the peak is not known (None), and a result says "not measured".
"""
from __future__ import annotations

import os
from pathlib import Path

GIB = 2 ** 30


def available() -> int:
    """Bytes of memory available to new processes (Linux's MemAvailable; elsewhere the free pages); 0 unknown."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def total() -> int:
    """The machine's physical memory in bytes; 0 unknown."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def reset_peak(pid: int | None = None) -> bool:
    """Reset the peak resident memory of process `pid` (None: this one) to its current resident memory; False
    where the system does not allow it (not Linux, another user's process, a process that ended)."""
    try:
        Path(f"/proc/{pid or 'self'}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_bytes(pid: int | None, field: str) -> int | None:
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS) in bytes; None where the system does not say."""
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak(pid: int | None = None) -> int | None:
    """The peak resident memory of process `pid` (None: this one) in bytes, since it started or since
    reset_peak(); None where the system does not say."""
    return _status_bytes(pid, "VmHWM")


def resident(pid: int | None = None) -> int | None:
    """The resident memory of process `pid` (None: this one) now, in bytes; None where the system does not say."""
    return _status_bytes(pid, "VmRSS")


def gib(n: int | float | None) -> str:
    """Bytes in GiB for a reader, e.g. "3.21 GiB"; "not measured" for None."""
    return "not measured" if n is None else f"{n / GIB:.2f} GiB"


class Sampled:
    """The largest resident memory of this process seen while the block runs, read every `every` seconds on a
    thread (/proc/self/statm): what a block adds at its peak, workspaces inside an op included, without resetting
    the process's own peak (a stage's recorded peak stays whole). `added` is None where the system does not say.

        >>> with memory.Sampled() as seen:
        ...     module(**row)
        >>> seen.added
    """

    def __init__(self, every: float = 0.002):
        import threading
        self.every, self.start, self.high = every, resident(), None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="portkit-memory-sample", daemon=True)

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        path = Path("/proc/self/statm")
        while True:
            try:
                now = int(path.read_text().split()[1]) * page
            except (OSError, ValueError, IndexError):
                return
            self.high = now if self.high is None else max(self.high, now)
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> Sampled:
        if self.start is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def added(self) -> int | None:
        return None if self.start is None or self.high is None else max(0, self.high - self.start)
