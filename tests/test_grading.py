"""The grading policy (portkit/core/grading.py): one table, one verdict rule."""
import pytest

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
