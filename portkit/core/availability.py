"""Availability probes, all in one place: small, cached, and False rather than raising.

    >>> from portkit.core import availability
    >>> availability.module_available("torch")
    True
    >>> availability.device_available("torch_tpu", "tpu")   # False on a host without a TPU
    False

Vendor bridges are probed in a child process: importing torch_tpu on a host without a TPU
can abort the whole process when the device initialises (checked with torch-tpu 0.2.0), and a probe
must never take the notebook kernel down with it.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

_DEVICE_PROBE = """
import sys, torch, importlib
importlib.import_module(sys.argv[1])
acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
ok = acc is not None and acc.type == sys.argv[2] and torch.accelerator.device_count() > 0
print("PORTKIT_DEVICE_OK" if ok else "PORTKIT_DEVICE_ABSENT")
"""


@functools.cache
def module_available(name: str) -> bool:
    """True when `import name` would find the module (it is not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def device_available(vendor_module: str, device: str, timeout: float = 120.0) -> bool:
    """True when the vendor bridge imports and PyTorch's accelerator API reports its device.

    Runs in a child process (see module docstring); any failure, crash or timeout is False.
    """
    if not module_available(vendor_module):
        return False
    try:
        done = subprocess.run([sys.executable, "-c", _DEVICE_PROBE, vendor_module, device],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "TPU_WORKER_HOSTNAMES": "localhost"})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "PORTKIT_DEVICE_OK" in done.stdout


@functools.cache
def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


@functools.cache
def xla_tpu_compile_available() -> bool:
    """JAX, libtpu and torchax present: real XLA compiles for TPU topologies, no chip needed."""
    return all(module_available(m) for m in ("jax", "jaxlib", "libtpu", "torchax"))


def missing_for_xla_tpu_compile() -> list[str]:
    return [m for m in ("jax", "jaxlib", "libtpu", "torchax") if not module_available(m)]


@functools.cache
def tpu_chip_count() -> int | None:
    """TPU chips attached to this host, by JAX's own PCI scan (Google's vendor id and the TPU device
    ids, jax/_src/hardware_utils.py); None when that scan is unavailable. Reads /sys only: nothing
    opens a chip or loads libtpu."""
    try:
        from jax._src import hardware_utils
        return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
    except Exception:  # noqa: BLE001 - a probe answers "unknown" rather than raising
        return None


@functools.cache
def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None
