"""Today's GPU setup run on a real NVIDIA GPU: stage 4's baseline measured, where a GPU is present.

    >>> from portkit.targets import gpu_baseline
    >>> if gpu_baseline.present():
    ...     outputs, measured = gpu_baseline.measure(model.module, inputs, "tf32")   # outputs: CPU float64
    ...     measured                   # 'measured on NVIDIA H200, torch 2.13.0+cu130'
    >>> gpu_baseline.emulated_label()  # elsewhere the caller runs numerics.emulate(cuda, setting) on the CPU
    'emulated on the CPU (no GPU present)'

Each key of numerics.GPU_NUMERICS (which owns the names and their meaning) is run here the way a GPU user
sets it (SETTINGS): the TF32 flags, and torch.autocast for the two autocast settings. The flags are process
globals: `setting` sets them for one block and puts every one it touched back afterwards, also after an error.
The model runs as a float32 copy on the device (the caller's module is never moved).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from portkit.core import availability
from portkit.core import placement
from portkit.core.errors import BadParameter
from portkit.targets import numerics
from portkit.targets import specs

EMULATED = "emulated on the CPU (no GPU present)"


@dataclass(frozen=True)
class GpuSetting:
    """How one GPU_NUMERICS key is set on a real GPU."""
    tf32: bool                        # TF32 tensor cores for float32 matmuls and cuDNN convolutions
    autocast: torch.dtype | None      # torch.autocast's low dtype; None: no autocast


# TF32, per PyTorch's CUDA notes (https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-
# and-later-devices): on, torch.set_float32_matmul_precision("high") and torch.backends.cudnn.allow_tf32 = True;
# off, cudnn.allow_tf32 = False (it defaults to True, so fp32 clears it) and the matmul precision "highest", which
# turns torch.backends.cuda.matmul.allow_tf32 off together with every other backend's matmul: that flag alone, set
# after "medium", leaves the CPU's matmul at bf16, a mixed state torch 2.9+ then refuses to read back.
# Autocast, per https://pytorch.org/docs/stable/amp.html: torch.autocast("cuda", dtype) runs its low-precision op
# list (matmul, linear, conv, attention) in that dtype; the ops it leaves in float32 run with TF32 off, as
# numerics.GPU_NUMERICS' emulation of the autocast settings computes them.
MATMUL_PRECISION = {False: "highest", True: "high"}    # TF32 off, on: torch.set_float32_matmul_precision
SETTINGS: dict[str, GpuSetting] = {
    "fp32": GpuSetting(tf32=False, autocast=None),
    "tf32": GpuSetting(tf32=True, autocast=None),
    "bf16_autocast": GpuSetting(tf32=False, autocast=torch.bfloat16),
    "fp16_autocast": GpuSetting(tf32=False, autocast=torch.float16),
}

# The per-backend fp32_precision settings (torch 2.9 and later) that the legacy TF32 flags write through to, by
# their public names (torch.backends.<...>.fp32_precision): restored last, so that API's state is back exactly.
_FP32_PRECISION = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul")


def present() -> bool:
    """Whether the baseline is measured: an NVIDIA GPU is present (the one probe, core.availability) and
    PORTKIT_MODE does not ask for emulation (which keeps runs on a GPU host comparable with CPU hosts)."""
    return availability.cuda_available() and specs.forced_mode() != "emulated"


def emulated_label() -> str:
    """Why the baseline is emulated here, in words (where present() is False)."""
    if availability.cuda_available():
        return f"emulated on the CPU ({specs.MODE_VARIABLE}=emulated)"
    return EMULATED


def _read(getter):
    """A legacy flag's value, or None where torch refuses to read it: since torch 2.9 reading a legacy flag
    raises RuntimeError once the process has set the newer fp32_precision API to something it cannot express."""
    try:
        return getter()
    except RuntimeError:
        return None


def _snapshot() -> dict:
    # torch.backends.cuda.matmul.allow_tf32 is a view of the matmul precision (True: anything but "highest"),
    # so the precision alone restores both; restoring the flag after it would turn "medium" into "high".
    legacy = {"matmul_precision": _read(torch.get_float32_matmul_precision),
              "cudnn_tf32": _read(lambda: torch.backends.cudnn.allow_tf32)}
    newer = {key: _backend(key).fp32_precision for key in _FP32_PRECISION
             if hasattr(_backend(key), "fp32_precision")}   # absent before torch 2.9
    return {"legacy": legacy, "fp32_precision": newer}


def _backend(key: str):
    """torch.backends.<key> ("cudnn.conv", say), or None where this torch has no such backend."""
    found = torch.backends
    for part in key.split("."):
        found = getattr(found, part, None)
    return found


def _restore(saved: dict) -> None:
    legacy = saved["legacy"]
    if legacy["matmul_precision"] is not None:
        torch.set_float32_matmul_precision(legacy["matmul_precision"])
    if legacy["cudnn_tf32"] is not None:
        torch.backends.cudnn.allow_tf32 = legacy["cudnn_tf32"]
    for key, value in saved["fp32_precision"].items():
        _backend(key).fp32_precision = value


def lookup(name: str) -> GpuSetting:
    """The GPU setting for a GPU_NUMERICS key; BadParameter names the valid ones."""
    if name not in SETTINGS or name not in numerics.GPU_NUMERICS:
        raise BadParameter("gpu_numerics", name, numerics.GPU_NUMERICS)
    return SETTINGS[name]


@contextlib.contextmanager
def setting(name: str, device_type: str = "cuda"):
    """Run the block under GPU setting `name` (TF32 flags, autocast on `device_type`); every global flag it
    sets is put back afterwards, also after an error."""
    chosen = lookup(name)
    saved = _snapshot()
    try:
        torch.set_float32_matmul_precision(MATMUL_PRECISION[chosen.tf32])
        torch.backends.cudnn.allow_tf32 = chosen.tf32
        autocast = (torch.autocast(device_type, dtype=chosen.autocast) if chosen.autocast is not None
                    else contextlib.nullcontext())
        with autocast:
            yield chosen
    finally:
        _restore(saved)


def _floating_to(value, dtype: torch.dtype):
    """Floating tensors in `value` (a tensor, or a dict, list or tuple of them) cast to `dtype`; the rest kept."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _floating_to(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        cast = [_floating_to(v, dtype) for v in value]
        return cast if isinstance(value, list) else getattr(type(value), "_make", tuple)(cast)
    return value


def device_name(device: str) -> str:
    where = torch.device(device)
    return torch.cuda.get_device_name(where) if where.type == "cuda" else str(where)


def measure(module: torch.nn.Module, inputs: dict, name: str, device: str | None = None) -> tuple[dict, str]:
    """Run a float32 copy of `module` on `device` (the cuda target's device when None) under GPU setting `name`;
    (its outputs on the CPU in float64, "measured on <device name>, torch <version>")."""
    device = device or specs.get("cuda").device
    chosen_device = torch.device(device)
    copied = copy.deepcopy(module).to(device=chosen_device, dtype=torch.float32).eval()
    moved = _floating_to(placement.to_device(inputs, chosen_device), torch.float32)
    with torch.no_grad(), setting(name, chosen_device.type):
        out = copied(**moved)
    del copied
    return (_floating_to(placement.to_device(out, "cpu"), torch.float64),
            f"measured on {device_name(device)}, torch {torch.__version__}")
