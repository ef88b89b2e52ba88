"""The docs: README.md stays short and holds the set-up commands, the generated pages of docs/ are current
(tools/build_docs.py, regenerated into a temporary folder and compared), and the MkDocs site builds with
`--strict` (a broken link, a missing page or a page left out of the nav fails it).
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

README = ROOT / "README.md"
SETUP = ("```bash\nscripts/run.sh\n```", "```bash\nscripts/test.sh\n```")


def _build_docs():
    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "tools" / "build_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def mkdocs_build(config, site) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300, env=env)


needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or
                                  importlib.util.find_spec("material") is None,
                                  reason="mkdocs and mkdocs-material are not installed (pip install -e '.[test]')")


def test_readme_is_short_and_holds_the_setup_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: move detail into docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    for block in SETUP:
        assert block in text, f"README.md lost its set-up command {block.splitlines()[1]!r}"
    assert "never a hardware measurement" in text


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_generated_pages_are_current(tmp_path):
    build_docs = _build_docs()
    build_docs.build(tmp_path)
    stale = [relative for relative in build_docs.PAGES
             if not (ROOT / "docs" / relative).exists()
             or (ROOT / "docs" / relative).read_text() != (tmp_path / relative).read_text()]
    assert not stale, f"generated pages not current: {stale}; run: python tools/build_docs.py"


def test_parameters_page_names_every_stage_parameter():
    """Each stage's parameters, whether read from its Options or from its notebook, appear on the page."""
    build_docs = _build_docs()
    from portkit.runfolder.layout import STAGES
    page = (ROOT / "docs" / "reference" / "parameters.md").read_text()
    for stage in STAGES:
        section = page.split(f"\n## {stage.name}\n", 1)[1].split("\n## ", 1)[0]
        missing = [p.name for p in build_docs.stage_parameters(stage) if f"| `{p.name}` |" not in section]
        assert not missing, f"docs/reference/parameters.md, {stage.name}: {missing}"


def test_commands_page_names_every_command_and_option():
    from portkit import cli
    page = (ROOT / "docs" / "reference" / "commands.md").read_text()
    parser = cli._parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        assert f"## `portkit {name}`" in page
        flags = [f for a in command._actions for f in a.option_strings if f not in ("-h", "--help")]
        missing = [f for f in flags if f"`{f}" not in page and f", {f}" not in page]
        assert not missing, f"docs/reference/commands.md, portkit {name}: {missing}"


@needs_mkdocs
def test_site_builds_strict(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


@needs_mkdocs
def test_a_broken_link_fails_the_build(tmp_path):
    """strict + validation: a link to a page that does not exist is an error, not a silent 404."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a") as index:
        index.write("\n[gone](guides/no-such-page.md)\n")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


def test_the_layout_page_quotes_the_tests_small_requests():
    """docs/reference/layout.md's count of requests a storm under test is tools/prepare_notebooks.py's, the one
    place the tests' small parameters are set."""
    spec = importlib.util.spec_from_file_location("prepare_notebooks", ROOT / "tools" / "prepare_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    layout = (ROOT / "docs" / "reference" / "layout.md").read_text()
    stated = re.findall(r"(\d+) requests a storm instead of 100", layout)
    assert stated == [str(module.QUICK["02_compile"]["requests"])], stated


def test_the_declaration_api_has_one_documented_path_and_old_ones_warn():
    """One documented import path for the declaration API (portkit.models.inputs), the one every example on the
    guide imports; the old paths (portkit.inputs, `from portkit import audio`, ...) still import the same module,
    raising a DeprecationWarning that names the new path; the changelog is in the site's nav."""
    guide = (ROOT / "docs" / "guides" / "declaring-a-model.md").read_text()
    imports = set(re.findall(r"^from portkit[\w.]* import inputs\b.*$", guide, re.M))
    assert imports == {"from portkit.models import inputs"}, imports
    assert "one\ndocumented import path" in guide or "one documented import path" in " ".join(guide.split())
    assert "never renamed" not in guide
    code = ("import warnings, importlib\n"
            "warnings.simplefilter('error')\n"
            "for old, new in [('inputs', 'portkit.models.inputs'), *[(k, 'portkit.' + v) for k, v in "
            "__import__('portkit').MOVED.items()]]:\n"
            "    try:\n"
            "        importlib.import_module('portkit.' + old) if old == 'inputs' else getattr("
            "__import__('portkit'), old)\n"
            "    except DeprecationWarning as w:\n"
            "        assert new in str(w), (old, str(w))\n"
            "    else:\n"
            "        raise SystemExit(f'{old}: no warning')\n"
            "warnings.simplefilter('ignore')\n"
            "import portkit, portkit.inputs, portkit.corpora.audio, portkit.models.inputs\n"
            "assert portkit.inputs is portkit.models.inputs and portkit.audio is portkit.corpora.audio\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "changelog.md" in (ROOT / "mkdocs.yml").read_text()


# ---------------------------------------------------------------- the examples' imports
FENCE = re.compile(r"^\s*```")
PORTKIT_IMPORT = re.compile(r"^(from|import)\s+portkit\b")


def example_imports(text: str) -> list[str]:
    """Each import of portkit in `text`'s examples: a `>>>` line, or a line of a fenced code block."""
    found, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        statement = line.strip().removeprefix(">>> ") if line.strip().startswith(">>> ") or fenced else ""
        if PORTKIT_IMPORT.match(statement):
            found.append(statement.split("#")[0].strip())
    return found


def import_problems(statement: str) -> list[str]:
    """What is wrong with one example's import: a portkit module imported under another name, or a name that
    does not exist (an example left behind by a rename)."""
    import importlib
    import warnings

    def is_module(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False
    problems = []
    for node in ast.walk(ast.parse(statement)):
        if isinstance(node, ast.Import):
            problems += [f"{a.name} as {a.asname}" for a in node.names if a.asname]
            problems += [f"no module {a.name}" for a in node.names if not is_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if not is_module(node.module):
                problems.append(f"no module {node.module}")
                continue
            module = importlib.import_module(node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                with warnings.catch_warnings():       # an old path that still imports, with its warning
                    warnings.simplefilter("ignore")
                    exists = is_module(full) or hasattr(module, a.name)
                problems += [f"{full} does not exist"] if not exists else []
                problems += [f"{full} as {a.asname}"] if a.asname and a.asname != a.name and is_module(full) else []
    return problems


def test_examples_import_each_portkit_module_under_its_own_name():
    """Rule: the docstrings' `>>>` examples and the docs' code (docs/**/*.md, README.md) import each portkit module
    under its own name, as the code does (tests/architecture/test_architecture.py), and only modules and names that exist. The
    changelog is history: it names the old paths on purpose."""
    sources = {path: "\n".join(ast.get_docstring(node) or "" for node in ast.walk(ast.parse(path.read_text()))
                               if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
               for path in sorted((ROOT / "portkit").rglob("*.py"))}
    sources |= {path: path.read_text() for path in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
                if path.name != "changelog.md"}
    found = [f"{path.relative_to(ROOT)}: {statement}: {problem}" for path, text in sources.items()
             for statement in example_imports(text) for problem in import_problems(statement)]
    assert sum(len(example_imports(text)) for text in sources.values()) > 50
    assert not found, "examples that rename a portkit module or import what does not exist:\n" + "\n".join(found)


def test_an_example_that_renames_a_module_is_found():
    text = "Use:\n\n    >>> from portkit.targets import specs as targets\n\n```python\nimport portkit.cli as c\n```\n"
    assert example_imports(text) == ["from portkit.targets import specs as targets", "import portkit.cli as c"]
    assert import_problems("from portkit.targets import specs as targets") == ["portkit.targets.specs as targets"]
    assert import_problems("import portkit.cli as c") == ["portkit.cli as c"]
    assert import_problems("from portkit import accuracy") == ["portkit.accuracy does not exist"]
    assert import_problems("from portkit.targets.specs import get as lookup, Target") == []
