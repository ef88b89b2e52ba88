"""Which module is running: one tracker of the module stack, kept by forward pre- and post-hooks.

    >>> from portkit.core.module_stack import ModuleTracker
    >>> with ModuleTracker(model) as tracker:
    ...     model(**inputs)        # inside any op or hook: tracker.current, e.g. "encoder.layer.0.attention"
    >>> def leave(path, module, output):     # called as each module returns (innermost first)
    ...     print(path, type(module).__name__)
    >>> with ModuleTracker(model, on_leave=leave):
    ...     model(**inputs)

Paths are `named_modules()` names; the model itself is `root` (findings.ROOT, "<model>", unless told).
The callbacks run outside every TorchDispatchMode (portkit.core.torch_private.no_dispatch_modes), so what a
callback computes is never recorded, emulated or counted as the model's work.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from portkit.core.torch_private import no_dispatch_modes
from portkit.core.findings import ROOT


class ModuleTracker:
    """Forward hooks on every submodule of `module` that keep `stack`, the paths of the modules running.

    on_enter(path, module) runs as a module starts, on_leave(path, module, output) as it returns.
    unwind_on_error: when a module raises, its post-hook still runs (always_call), so a caller that
    catches the error keeps a consistent stack. False: post-hooks are skipped on an error, so after it
    the stack still ends with the module that called the failing op (what a failure report names)."""

    def __init__(self, module: nn.Module, *, on_enter: Callable | None = None, on_leave: Callable | None = None,
                 root: str = ROOT, unwind_on_error: bool = True):
        self.module, self.root = module, root
        self.on_enter, self.on_leave, self.unwind_on_error = on_enter, on_leave, unwind_on_error
        self.stack: list[str] = []
        self._handles: list = []

    @property
    def current(self) -> str:
        """The innermost running module's path; `root` outside the model."""
        return self.stack[-1] if self.stack else self.root

    def __enter__(self) -> ModuleTracker:
        for name, sub in self.module.named_modules():
            path = name or self.root
            self._handles += [sub.register_forward_pre_hook(self._enter(path)),
                              sub.register_forward_hook(self._leave(path), always_call=self.unwind_on_error)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, path: str):
        def hook(module, args):           # returns None: a pre-hook's return value would replace the inputs
            self.stack.append(path)
            if self.on_enter is not None:
                with no_dispatch_modes():
                    self.on_enter(path, module)
        return hook

    def _leave(self, path: str):
        def hook(module, args, output):   # returns None: a hook's return value would replace the output
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
            if self.on_leave is not None:
                with no_dispatch_modes():
                    self.on_leave(path, module, output)
        return hook
