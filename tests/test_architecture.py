"""The architecture, enforced: the import-linter contracts in pyproject.toml ([tool.importlinter]) and the
size limit on a module. The layers themselves are described in README.md, "How the code is laid out".
"""
import os
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT

# `lint-imports` is import-linter's console script for this entry point; calling it through
# sys.executable runs the import-linter of the Python running the tests, whatever its bin folder.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c["name"] for c in CONFIG["contracts"]}
MAX_LINES = 500


def lint_imports(source=ROOT, *args: str) -> subprocess.CompletedProcess:
    """Run import-linter with pyproject.toml's contracts on the portkit package in `source` (this checkout's,
    not an installed copy elsewhere), without a cache."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-c", LINT_IMPORTS, "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo",
               *args]
    return subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def linted() -> subprocess.CompletedProcess:
    return lint_imports()


def test_the_contracts_cover_the_architecture():
    assert CONFIG["root_package"] == "portkit"
    assert {"layers", "stages", "acyclic"} <= set(CONTRACTS)
    assert {c["type"] for c in CONFIG["contracts"]} >= {"layers", "independence", "acyclic_siblings"}
    layers = next(c for c in CONFIG["contracts"] if c["id"] == "layers")
    assert layers["containers"] == ["portkit"] and layers["exhaustive"]      # every module has its place


@pytest.mark.parametrize("contract", CONTRACTS, ids=list(CONTRACTS))
def test_import_contract_is_kept(linted, contract):
    """Each contract's own line: "<name> KEPT (n ignored imports)" or "<name> BROKEN ..."."""
    line = next((line for line in linted.stdout.splitlines() if line.startswith(CONTRACTS[contract])), "")
    if "KEPT" not in line.removeprefix(CONTRACTS[contract]):
        pytest.fail(f"contract {contract!r} is not kept:\n" + linted.stdout + linted.stderr, pytrace=False)


def test_lint_imports_passes(linted):
    if linted.returncode != 0:
        pytest.fail("lint-imports failed:\n" + linted.stdout + linted.stderr, pytrace=False)
    assert f"{len(CONTRACTS)} kept, 0 broken" in linted.stdout, linted.stdout


def test_a_broken_layer_is_reported(tmp_path):
    """The linter does fail: a foundation importing a stage breaks the layers contract, named by module."""
    package = tmp_path / "portkit"
    for module in sorted((ROOT / "portkit").rglob("*.py")):
        copy = package / module.relative_to(ROOT / "portkit")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(module.read_text())
    with (package / "core" / "errors.py").open("a") as errors:
        errors.write("\n\ndef _upwards():\n    from portkit.stages.report import stage  # noqa: F401\n")
    result = lint_imports(tmp_path, "--contract", "layers")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "portkit.core is not allowed to import portkit.stages" in result.stdout, result.stdout
    assert "portkit.core.errors -> portkit.stages.report.stage" in result.stdout, result.stdout


def test_no_module_over_the_line_limit():
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "portkit").glob("*.py"))}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by what they own): {over}"


def test_readme_maps_every_module():
    """README.md's "How the code is laid out" names every module of portkit/ (what it owns, by layer)."""
    readme = (ROOT / "README.md").read_text()
    assert "\n## How the code is laid out\n" in readme
    section = readme.split("\n## How the code is laid out\n", 1)[1].split("\n## ", 1)[0]
    unnamed = [p.name for p in sorted((ROOT / "portkit").glob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in section]
    assert not unnamed, f"README.md, \"How the code is laid out\", does not say what these own: {unnamed}"
