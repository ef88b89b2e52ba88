"""portkit.targets.allocator: malloc's settings, applied in a running process where the environment sets none."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from portkit.targets import allocator
from portkit.run import jupyter_kernels



def _python(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in allocator.ENVIRONMENT}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})
    return done.stdout.strip().splitlines()[-1]


def test_the_kernels_start_with_the_same_settings():
    assert {k: jupyter_kernels.ENVIRONMENT[k] for k in allocator.ENVIRONMENT} == allocator.ENVIRONMENT


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="mallopt's settings are glibc's")
def test_an_emulated_backend_applies_them_at_its_first_compile_unless_the_environment_sets_them():
    compile_once = ("import torch\nfrom portkit.targets import allocator, backends\n"
                    "f = torch.compile(torch.nn.Linear(4, 4), backend=backends.emulated_backend('tpu'))\n"
                    "before = allocator.tune.cache_info().misses\nf(torch.ones(2, 4))\n"
                    "print(before, allocator.tune.cache_info().misses, allocator.tune())")
    assert _python(compile_once) == "0 1 True"            # applied by the first compile, once
    assert _python(compile_once, MALLOC_TRIM_THRESHOLD_="1") == "0 1 False"   # the user's own setting stands
