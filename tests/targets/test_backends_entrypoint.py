"""How the emulated backends reach Dynamo (entry points, no `import portkit` needed), and that
`import portkit` and `portkit --version` do not import torch."""
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import portkit
from conftest import ROOT
from portkit.targets import backends
from portkit.targets import specs

GROUP = backends.ENTRY_POINTS   # the group portkit reads its own entry points from: pyproject.toml's


def python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with this checkout first on the path; its stdout, stripped."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def declared() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]


def test_the_entry_points_name_each_targets_backend_instance():
    eps = declared()
    assert set(eps) == {specs.get(t).emulated_backend for t in specs.MIGRATION_TARGETS}
    for name, value in eps.items():
        module, _, attr = value.partition(":")
        backend = getattr(importlib.import_module(module), attr)
        assert backend is backends.REGISTERED[backend.target.name] and backend.__name__ == name


def test_dynamo_lists_the_backends_and_resolves_them_to_portkits_instances():
    assert {"portkit_neuron", "portkit_tpu"} <= set(torch._dynamo.list_backends())
    for backend in backends.REGISTERED.values():
        assert lookup_backend(backend.__name__) is backend
    assert backends.register() == []   # idempotent: every name is known by now


def assert_installed() -> None:
    """The installed package metadata declares the entry points. scripts/bootstrap.sh (run by
    scripts/test.sh) installs them; an install older than the entry points lacks them."""
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=GROUP)}
    missing = {name: v for name, v in declared().items() if installed.get(name) != v}
    assert not missing, f"package metadata lacks {missing}: reinstall with `pip install -e .` (scripts/bootstrap.sh)"


# An entry point the way Dynamo sees an installed one, whatever is installed in this environment:
# importlib.metadata.entry_points is patched before Dynamo first reads it (torch's own
# test_backends.py mocks it the same way).
FAKE_ENTRY_POINTS = f"""
import importlib.metadata as md
eps = md.EntryPoints(md.EntryPoint(n, v, {GROUP!r}) for n, v in {declared()!r}.items())
md.entry_points = lambda group=None: eps if group == {GROUP!r} else md.EntryPoints(())
"""
COMPILE_BY_NAME = """
import sys, torch
assert "portkit" not in sys.modules
compiled = torch.compile(lambda x: x + 1, backend="portkit_tpu", dynamic=False)
with torch.no_grad():
    print(compiled(torch.ones(2)).tolist(), "portkit.targets.backends" in sys.modules)
from portkit.targets import backends
print(backends.REGISTERED["tpu"].checks[-1].target, backends.register())
"""


def test_torch_compile_finds_a_backend_by_entry_point_without_import_portkit():
    # Loading the entry point imports portkit.targets.backends, whose import-time register() must leave the
    # name to the entry point (Dynamo's registry asserts on a duplicate name).
    assert python(FAKE_ENTRY_POINTS + COMPILE_BY_NAME).splitlines() == ["[2.0, 2.0] True", "tpu []"]


def test_torch_compile_finds_the_installed_backend_without_import_portkit():
    assert_installed()
    assert python(COMPILE_BY_NAME).splitlines() == ["[2.0, 2.0] True", "tpu []"]


def test_import_portkit_and_version_do_not_import_torch():
    out = python("""
import sys, portkit
from portkit import cli
try:
    cli.main(["--version"])
except SystemExit as exit:
    print(exit.code)
print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
""")
    assert out.splitlines() == [f"portkit {portkit.__version__}", "0", "[]"]


def test_portkit_exposes_one_verb_per_stage_loaded_on_first_use():
    from portkit.stages.accuracy.stage import check_accuracy
    from portkit.stages.buckets.stage import fit_buckets
    from portkit.stages.compile.stage import compile_model
    from portkit.stages.fallbacks.stage import find_fallbacks
    from portkit.stages.report.stage import build_report
    assert portkit.find_fallbacks is find_fallbacks and portkit.compile_model is compile_model
    assert portkit.fit_buckets is fit_buckets and portkit.check_accuracy is check_accuracy
    assert portkit.build_report is build_report
    assert set(portkit.__all__) <= set(dir(portkit))
    with pytest.raises(AttributeError, match="no attribute 'compile'"):
        portkit.compile
