"""scripts/installed.py's reading of pip's installation report: the local torch wheel bootstrap.sh hands to uv."""
import importlib.util

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("installed", ROOT / "scripts" / "installed.py")
installed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(installed)


def _report(*urls):
    return {"install": [{"download_info": {"url": url}} for url in urls]}


def test_a_local_wheel_is_its_file_path_unquoted():
    url = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert installed.local_wheel(_report(url)) == "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize("urls", [("https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu.whl",),
                                  ("file:///opt/src/torch-2.13.0.tar.gz",), (),
                                  ("file:///a/torch-2.13.0-py3-none-any.whl", "file:///a/six-1.0-py3-none-any.whl")])
def test_anything_but_one_local_wheel_is_refused(urls):
    with pytest.raises(ValueError, match="not one local wheel"):
        installed.local_wheel(_report(*urls))
