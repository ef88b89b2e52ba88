"""nbval's notebook kernels start as a run's do (conftest._fork_nbval_kernels): through portkit's forking provisioner,
forked from the fork server where kernel_forks.forkable allows, launched with the reason where it does not; either
way a kernel of its own that runs the notebook's cells. In the notebook half of scripts/test.sh, whose nbval kernels
have started the fork server already."""
import os
import sys

import nbval.kernel

from portkit.run import kernel_forks


def test_nbval_starts_its_kernels_through_the_forking_provisioner():
    kernel = nbval.kernel.RunningKernel(nbval.kernel.CURRENT_ENV_KERNEL_NAME, cwd=os.getcwd())
    try:
        provisioner = kernel.km.provisioner
        assert isinstance(provisioner, kernel_forks.ForkingProvisioner)
        why = kernel_forks.forkable([sys.executable, "-m", "ipykernel_launcher", "-f", "x"],
                                    {"stderr": open(os.devnull, "w")})
        if why:
            assert provisioner.started == f"a new interpreter (not forked: {why})"
        else:
            assert provisioner.started == f"process {provisioner.pid}, forked from the fork server"
        reply = kernel.kc.execute_interactive("import os; os.getpid()", timeout=60)
        assert reply["content"]["status"] == "ok"
    finally:
        kernel.stop()
