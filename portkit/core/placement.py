"""Run a module on a device and put it back: the one "move, run, restore" of portkit.

    >>> from portkit.core import placement
    >>> with placement.on_device(model.module, "tpu", inputs) as moved:   # module and inputs on the TPU
    ...     out = model.module(**moved)
    >>> out = placement.to_device(out, "cpu")                             # back for comparison
    # here model.module is where it was before (the CPU, where portkit loads models)

Stages run on the CPU in emulated mode and on the target's device in native mode; a stage that moves
the model must leave it where it found it, also when the run raises, or the next stage (or the next
cell) would run on the wrong device.
"""
from __future__ import annotations

import contextlib
import itertools

import torch
from torch import nn


def to_device(value, device):
    """Tensors in `value` (a tensor, or a dict, list or tuple of them) moved to `device`; the rest kept."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        moved = [to_device(v, device) for v in value]
        return moved if isinstance(value, list) else getattr(type(value), "_make", tuple)(moved)  # namedtuples too
    return value


def home_device(module: nn.Module) -> torch.device:
    """Where `module` is: the device of its first parameter or buffer; the CPU when it has neither."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def on_device(module: nn.Module, device, inputs=None):
    """Move `module` to `device` for the block and yield `inputs` moved there too (None if not given);
    afterwards, also after an error, move the module back to the device it was on."""
    home = home_device(module)
    module.to(device)
    try:
        yield to_device(inputs, device) if inputs is not None else None
    finally:
        module.to(home)
