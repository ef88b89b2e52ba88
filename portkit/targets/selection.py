"""Which torch.compile backend a stage uses for a target: the one rule, for stages 2 and 3 alike.

    >>> from portkit.targets import selection, specs
    >>> detected = specs.detect("tpu")
    >>> selection.check_backend(detected, "auto")            # 'portkit_tpu' here (emulated), 'tpu' natively
    >>> backend, device = selection.backend_for(detected, "auto", precision=None)
    >>> torch.compile(module, backend=backend, dynamic=False)   # checks + target numerics, no codegen

A target accepts "auto" (the detected mode's backend: the vendor's with its device in native mode,
portkit's emulated stand-in otherwise) or one of its own backend names; anything else is one line
naming the valid choices. An emulated backend is built here with `inductor` said explicitly: the
stages check and emulate each graph, then run it eagerly, unless a caller asks for Inductor's code.
"""
from __future__ import annotations

from portkit.targets import specs
from portkit.targets.backends import EmulatedBackend
from portkit.core.errors import BadParameter

AUTO = "auto"


def valid_backends(detected: specs.DetectedTarget) -> list[str]:
    """What a stage accepts as a backend for this target: auto, the detected mode's, the emulated one."""
    return list(dict.fromkeys([AUTO, detected.backend, detected.target.emulated_backend]))


def check_backend(detected: specs.DetectedTarget, backend: str) -> str:
    """The backend name to use for a target; a name the target does not know is one line with the valid
    names (and, for a native backend on a host without it, what it needs)."""
    t = detected.target
    valid = valid_backends(detected)
    if not isinstance(backend, str):
        raise BadParameter("backend", backend, valid, hint="give a backend name, or 'auto'")
    if backend not in valid:
        hint = (f"the native backend {t.backend!r} needs {t.vendor_package} and a {t.device} device; this host "
                f"runs {t.name} {detected.mode}") if backend == t.backend and t.vendor_package else None
        raise BadParameter(f"compile backend for target {t.name}", backend, valid, hint)
    return detected.backend if backend == AUTO else backend


def check_parameter(backend, names) -> None:
    """A notebook's `backend` parameter against every target it will compile for (detected here)."""
    for name in names:
        check_backend(specs.detect(name), backend)


def backend_for(detected: specs.DetectedTarget, backend: str = AUTO, precision=None,
                inductor: bool = False):
    """(what to hand torch.compile, the device to run on). Emulated: a fresh EmulatedBackend with the
    target's precision (its own record of checks), on the CPU, with Inductor only when asked; native:
    the vendor's backend name on its device; a reference target (cpu, cuda): its own backend."""
    name = check_backend(detected, backend)
    if name == detected.target.emulated_backend and not detected.target.reference:
        return EmulatedBackend(detected.target, precision, inductor=inductor), "cpu"
    return name, detected.target.device if detected.native else "cpu"
