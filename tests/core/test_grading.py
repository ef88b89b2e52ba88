"""The grading policy (portkit/core/grading.py): one table, one verdict rule, applied by every stage."""
import ast

import pytest

from conftest import ROOT
from portkit.core import grading
from portkit.core.findings import BLOCKER, INFO, SEVERITIES, WORK


def test_every_grade_is_a_severity_and_each_case_is_graded_once():
    """One owner per decision: a (kind, case) pair has exactly one grade, and it is a known severity."""
    pairs = [(g.kind, g.case) for g in grading.POLICY]
    assert len(pairs) == len(set(pairs))
    assert {g.severity for g in grading.POLICY} <= set(SEVERITIES)
    assert all(g.rule and g.stage for g in grading.POLICY)


def test_a_kind_outside_the_policy_cannot_be_graded():
    with pytest.raises(KeyError, match="no grade for 'made_up'"):
        grading.severity("made_up")
    with pytest.raises(KeyError, match="its cases"):
        grading.severity("accuracy")          # accuracy is graded only by case


def test_a_precision_that_passes_on_the_failing_case_makes_accuracy_work_not_a_blocker():
    assert grading.severity("accuracy", grading.FIXED_BY_SETTING) == WORK
    assert grading.severity("accuracy", grading.NOT_FIXED) == BLOCKER


def test_padding_that_changes_real_positions_is_work_the_model_still_runs():
    """A padding check that fails is a cost (exact-length batches), never 'cannot run or compile'."""
    assert grading.severity("padding") == WORK


@pytest.mark.parametrize("severities, open_questions, expected", [
    ({BLOCKER, WORK}, ["HBM fit"], grading.BLOCKED),          # a blocker found is a blocker
    ({WORK}, ["HBM fit"], grading.NOT_ASSESSED),              # an open question is never ready
    ({INFO}, ["decoding"], grading.NOT_ASSESSED),
    ({WORK, INFO}, [], grading.READY_WITH_WORK),
    ({INFO}, [], grading.READY),
    (set(), [], grading.READY),
])
def test_the_verdict_rule(severities, open_questions, expected):
    assert grading.verdict(severities, open_questions) == expected


# ---------------------------------------------------------------- the policy is the only place a severity is set
ALLOWED = {"portkit/core/grading.py", "portkit/core/findings.py", "portkit/targets/specs.py"}
SEVERITY_NAMES = {"BLOCKER", "WORK", "INFO"}


def _literal_severity(node) -> bool:
    """A severity written as a literal: "blocker"/"work"/"info", or the name BLOCKER/WORK/INFO (either branch of
    a conditional)."""
    if isinstance(node, ast.IfExp):
        return _literal_severity(node.body) or _literal_severity(node.orelse)
    return (isinstance(node, ast.Constant) and node.value in SEVERITIES) or (
        isinstance(node, ast.Name) and node.id in SEVERITY_NAMES)


def _given_severities(tree) -> list[int]:
    """Lines where a finding is given a literal severity: Finding(kind, SEVERITY, ...) or severity=SEVERITY, a dict
    {"severity": SEVERITY}, an assignment to a name, attribute or key called severity, or a table row (a tuple)
    holding one."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            given = [k.value for k in node.keywords if k.arg == "severity"]
            if name in ("Finding", "_finding") and len(node.args) > 1:
                given.append(node.args[1])
            lines += [node.lineno for v in given if _literal_severity(v)]
        elif isinstance(node, ast.Dict):
            lines += [node.lineno for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "severity" and _literal_severity(v)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = [t for t in targets if "severity" in ast.unparse(t)]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if named and any(_literal_severity(v) for v in values):
                lines.append(node.lineno)
        elif isinstance(node, ast.Tuple) and len(node.elts) > 2 and _literal_severity(node.elts[1]):
            lines.append(node.lineno)      # a rule table's row: (kind, severity, what, fix)
    return lines


def test_no_finding_in_portkit_is_given_a_severity_outside_the_grading_policy():
    """Rule: a stage names the kind and case of what it found and asks grading.severity; only the policy (and the
    targets' feature rules it draws beside it) writes a severity. The checker itself is checked on a bad line."""
    assert _given_severities(ast.parse('Finding("padding", "blocker", "m", "a")'))
    assert _given_severities(ast.parse('{"kind": "x", "severity": WORK}'))
    assert _given_severities(ast.parse('RULES = {"r": (KIND, BLOCKER, "what", "fix")}'))
    assert _given_severities(ast.parse('Finding("accuracy", WORK if fixable else BLOCKER, "m", "a")'))
    assert not _given_severities(ast.parse('[f for f in found if f["severity"] == BLOCKER]'))
    root = ROOT
    found = {}
    for path in sorted((root / "portkit").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel not in ALLOWED:
            lines = _given_severities(ast.parse(path.read_text()))
            if lines:
                found[rel] = lines
    assert not found, f"severities written outside portkit/core/grading.py: {found}"


def test_every_kind_a_stage_grades_is_in_the_policy():
    """Rule: grading.severity(kind, case) for every kind and case the stages name resolves (a KeyError otherwise)."""
    root = ROOT
    asked = set()
    for path in (root / "portkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "grading.severity" and \
                    isinstance(node.args[0], ast.Constant):
                case = node.args[1] if len(node.args) > 1 else None
                if case is None or isinstance(case, ast.Attribute):   # a case in a variable is checked where set
                    asked.add((node.args[0].value, getattr(grading, case.attr) if case is not None else grading.ANY))
    assert len(asked) > 15
    for kind, case in asked:
        grading.severity(kind, case)


@pytest.mark.parametrize("fixture, severity, advice", [
    ("plain_op_model", WORK, "stage 2 looks inside it"),      # torch.library.custom_op of plain torch ops
    ("custom_op_model", BLOCKER, "NKI"),                       # an op registered as a compiled kernel
])
def test_a_plain_torch_library_op_is_work_and_a_compiled_kernel_a_blocker(fixture, severity, advice):
    """Rule: stage 1's custom_op rule (a CUDA/Triton kernel: the target's FeatureRule, a blocker) is for ops with a
    kernel of their own; a torch.library op whose kernel is a Python function of torch ops runs on the target,
    opaque to its compiler (grading case PLAIN_TORCH: work), as stage 2's foreign_op grades it."""
    from conftest import fixture_model
    from portkit.models import registry
    from portkit.stages.fallbacks import stage
    m = registry.load(fixture_model(fixture))
    report = stage.find_fallbacks(m, m.encode(["def f(x): return x", "Sum."], pad_to=8), ["neuron"])
    [found] = [f for f in report.targets["neuron"].findings if f.kind == "custom_op"]
    assert found.severity == severity and advice in found.advice
