"""The architecture, enforced: the import-linter contracts in pyproject.toml ([tool.importlinter]). The layers
themselves are described in docs/design.md, generated from those contracts by tools/build_docs.py.
"""
import os
import re
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


def test_design_names_every_package():
    """docs/design.md (generated from the contracts and the package docstrings) names every package of portkit."""
    design = (ROOT / "docs" / "design.md").read_text()
    packages = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "portkit").rglob("__init__.py"))
    unnamed = [name for name in packages if f"`{name}`" not in design]
    assert not unnamed, f"docs/design.md does not name these packages (run: python tools/build_docs.py): {unnamed}"


# An issue number in a comment ("#13", "(issue 17)") says where a rule came from in this project's tracker, which a
# reader of the code cannot open; a comment states the rule and cites the public source ("pytorch/xla#2422" is one).
ISSUE_NUMBER = re.compile(r"(?<![\w/.-])#\d{1,4}\b|\bissues? #?\d{1,4}\b", re.IGNORECASE)


def test_no_module_holds_an_issue_number():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted([*(ROOT / "portkit").rglob("*.py"), *(ROOT / "notebooks").glob("*.py")])
             for n, line in enumerate(path.read_text().splitlines(), 1) if ISSUE_NUMBER.search(line)]
    assert not found, "issue numbers in code (state the rule, cite the public source):\n" + "\n".join(found)


def test_an_issue_number_is_found():
    assert ISSUE_NUMBER.search("    # padded here (#13)") and ISSUE_NUMBER.search("the report (issue 17) says")
    assert not ISSUE_NUMBER.search("pytorch/xla#2422 and aws-neuron-sdk#1210, color #c62828")


def test_size_is_ruled_by_complexity():
    """ruff sizes functions by McCabe complexity, branches, arguments and statements (not modules by lines);
    tests/test_notebooks.py runs ruff on portkit/ and the notebooks with these settings."""
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C901", "PLR0912", "PLR0913", "PLR0915"} <= set(ruff["select"])
    assert ruff["mccabe"]["max-complexity"] <= 12 and ruff["pylint"]["max-args"] <= 8
    exempt = [path for path, rules in ruff["per-file-ignores"].items() if path.startswith("portkit")]
    assert not exempt, f"portkit modules exempted from ruff: {exempt}"


def test_module_docstrings_are_short():
    """A module's docstring says its purpose and usage in a few lines; the detail lives in docs/."""
    import ast
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "portkit").rglob("*.py"))
            if (n := len((ast.get_docstring(ast.parse(p.read_text())) or "").splitlines())) > 20}
    assert not long, f"module docstrings over 20 lines: {long}"
