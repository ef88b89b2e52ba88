"""One Python kernel for a run's stages.

    >>> with kernels.SharedKernel() as kernel:
    ...     papermill.execute_notebook(a, a_out, km=kernel.for_stage())   # starts the kernel
    ...     papermill.execute_notebook(b, b_out, km=kernel.for_stage())   # the same kernel, its namespace cleared

A fresh kernel per stage pays for a new interpreter and for importing torch, transformers and portkit again:
about 4 s a stage on 2 cores, against 0.2 s in a kept kernel (papermill on a notebook that only imports the
stages' modules). The runner keeps one kernel for the whole run and clears it between stages: IPython's
`%reset -f` empties the namespace (no variable of one stage reaches the next), open figures are closed and
Dynamo's compiled code dropped (torch.compiler.reset) and the cells numbered from 1 again, so a stage starts
as it would in a new kernel, with its imports already done. The stages seed what they sample, so a kept kernel gives the same results as fresh
ones. A kernel that died is replaced by a new one for the next stage. Each notebook still runs on its own
in a fresh kernel (JupyterLab, nbval): nothing in a stage may rely on an earlier stage's kernel.
"""
from __future__ import annotations

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

KERNEL = "python3"
# seconds to wait for the kept kernel to answer, and to clear its namespace (a reset takes well under one)
READY_SECONDS = 60
# Run in the kept kernel before each later stage. Nothing here imports a module the stage did not.
CLEAR = """\
%reset -f
import gc as _gc, sys as _sys
if "matplotlib.pyplot" in _sys.modules:
    _sys.modules["matplotlib.pyplot"].close("all")
if "torch" in _sys.modules:
    _sys.modules["torch"].compiler.reset()
get_ipython().execution_count = 1   # the stage's cells are numbered from 1, as in a new kernel
del _gc, _sys
"""


class SharedKernel:
    """The kernel manager papermill gets for each stage (`km=`): unstarted for the first stage (papermill
    starts it with the stage's working folder and arguments), the same running kernel, cleared, after."""

    def __init__(self, kernel_name: str = KERNEL):
        self.kernel_name = kernel_name
        self.km: AsyncKernelManager | None = None

    def for_stage(self) -> AsyncKernelManager:
        if self.km is not None and self.km.has_kernel and run_sync(self.km.is_alive)():
            if run_sync(_clear)(self.km):
                return self.km
        self.close()   # none yet, or a dead kernel, or one that could not be cleared: start a new one
        self.km = AsyncKernelManager(kernel_name=self.kernel_name)
        return self.km

    def close(self) -> None:
        km, self.km = self.km, None
        if km is not None and km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)

    def __enter__(self) -> SharedKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _clear(km: AsyncKernelManager) -> bool:
    """Clear the kernel's namespace (CLEAR); True when it answered ok."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=READY_SECONDS)
        reply = await kc.execute_interactive(CLEAR, store_history=False, allow_stdin=False, timeout=READY_SECONDS,
                                             output_hook=lambda msg: None)
        return reply["content"]["status"] == "ok"
    except (RuntimeError, TimeoutError):   # the kernel did not answer in time: the caller starts a new one
        return False
    finally:
        kc.stop_channels()
