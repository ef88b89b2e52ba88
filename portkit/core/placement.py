"""Run a module on a device and put it back: the one "move, run, restore" of portkit.

    >>> from portkit.core import placement
    >>> with placement.on_device(model.module, "tpu", inputs) as moved:   # module and inputs on the TPU
    ...     out = model.module(**moved)
    >>> out = placement.to_device(out, "cpu")                             # back for comparison
    # here model.module is where it was before (the CPU, where portkit loads models)
    >>> with placement.tensors_kept(model.module):    # forward on fake (or converted) tensors
    ...     model.module(**fake_inputs)               # a tensor forward stores on a module is put back after

Stages run on the CPU in emulated mode and on the target's device in native mode; a stage that moves
the model must leave it where it found it, also when the run raises, or the next stage (or the next
cell) would run on the wrong device. Likewise a trace that runs the model's forward on tensors that are not
the model's own (fake tensors counting FLOPs, the XLA converter's): a forward that stores a tensor on its module
(a cache set up during the call) must not leave a fake or converted tensor there for the next trace or stage.
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


def _held(module: nn.Module) -> dict[tuple, tuple]:
    """What each module of the tree holds by name where forward can assign a tensor (its plain attributes, buffers
    and parameters): {(id(submodule), name): (submodule, value)}."""
    found = {}
    for sub in module.modules():
        named = [*((n, v) for n, v in vars(sub).items() if not n.startswith("_")),
                 *sub.named_buffers(recurse=False), *sub.named_parameters(recurse=False)]
        found.update({(id(sub), name): (sub, value) for name, value in named})
    return found


@contextlib.contextmanager
def tensors_kept(module: nn.Module):
    """Run a block that calls `module`'s forward on tensors that are not the model's own (fake or converted), and
    afterwards, also after an error, put back what its modules held where forward stored a tensor, and drop a
    tensor stored under a name that was not there before."""
    before = _held(module)
    try:
        yield
    finally:
        for key, (sub, value) in _held(module).items():
            if not isinstance(value, torch.Tensor):
                continue
            if key not in before:
                delattr(sub, key[1])
            elif before[key][1] is not value:
                setattr(sub, key[1], before[key][1])
