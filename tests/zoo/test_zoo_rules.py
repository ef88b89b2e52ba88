"""The zoo's rule checks (benchmarks/zoo_rules.py), each on a hand-written run folder that keeps every rule and
on one that breaks it: a rule that cannot fire would count nothing."""
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import zoo_rules  # noqa: E402

TARGETS = ("neuron", "tpu")
STAGES = ("fallbacks", "compile", "buckets", "xla", "accuracy")
WORK_FINDING = {"stage": "fallbacks", "severity": "work", "kind": "attention_mask", "message": "attention mask",
                "owner": "configurable library", "where": "transformers/integrations/sdpa_attention.py:182 in f",
                "cause": "attention_mask: aten::sdpa at sdpa_attention.py:182"}


def _good() -> dict:
    """A run folder's files where every rule holds: two targets, every stage ok, one work item each."""
    per = {t: {"counts": {"native": 3, "composite": 1}, "findings": []} for t in TARGETS}
    files = {
        "run": {"stages": {s: {"status": "ok"} for s in (*STAGES, "report")}},
        "fallbacks": {"targets": per},
        "compile": {"targets": {t: {"checks": {"graphs": 1, "ops": {"aten::mm": {}}}, "findings": []}
                                for t in TARGETS}},
        "buckets": {"plans": [{"planner": "auto"}], "targets": {t: {"findings": []} for t in TARGETS}},
        "xla": {"targets": {t: {"shapes": [{"status": "compiled"}], "findings": []} for t in TARGETS}},
        "accuracy": {"targets": {t: {"verdict": "pass", "basis": "PASS: agreement 1.0", "findings": []}
                                 for t in TARGETS}},
        "report": {"stages": {s: {"status": "ok"} for s in STAGES},
                   "verdicts": {t: "ready with work" for t in TARGETS},
                   "targets": {t: {"verdict": "ready with work", "based_on": list(STAGES), "unassessed": [],
                                   "findings": [dict(WORK_FINDING)]} for t in TARGETS}},
    }
    return files


def _run(tmp_path, files, config=None) -> zoo_rules.Run:
    for name, data in files.items():
        (tmp_path / ("run.json" if name == "run" else f"{name}.json")).write_text(json.dumps(data))
    return zoo_rules.Run.read(tmp_path, config=config)


def _rules(run) -> set[str]:
    return {v.rule for v in zoo_rules.check(run)}


def test_a_run_that_keeps_every_rule_has_no_violation(tmp_path):
    """The rules' baseline: the hand-written good run folder passes all six."""
    assert zoo_rules.check(_run(tmp_path, _good(), config={"max_position_embeddings": 128})) == []


def test_a_stage_ok_that_assessed_nothing_is_a_violation(tmp_path):
    """Rule: no stage ends "ok" having assessed nothing (stage 1 recorded no op for the TPU)."""
    files = _good()
    files["fallbacks"]["targets"]["tpu"]["counts"] = {"native": 0, "composite": 0}
    files["xla"]["targets"]["neuron"]["shapes"] = []
    found = zoo_rules.assessed_something(_run(tmp_path, files))
    assert {(v.target, v.detail.split()[1]) for v in found} == {("tpu", "fallbacks"), ("neuron", "xla")}


def test_a_3b_whose_shapes_never_reached_the_compiler_must_leave_the_fit_open(tmp_path):
    """Rule (a stage that did nothing says so, stage 3b): every shape stopped in portkit's conversion ("0/2 shapes
    compiled") with nothing marked not assessed is a violation; the same shapes with the fit open are none."""
    files = _good()
    files["xla"]["targets"]["tpu"]["shapes"] = [{"status": "no_lowering"}, {"status": "trace_failed"}]
    (tmp_path / "bad").mkdir()
    [found] = zoo_rules.assessed_something(_run(tmp_path / "bad", files))
    assert found.target == "tpu" and "no shape reached the compiler" in found.detail
    files["xla"]["targets"]["tpu"]["not_assessed"] = [{"question": "HBM fit on v5e:1x1", "why": "NO LOWERING"}]
    (tmp_path / "open").mkdir()
    assert zoo_rules.assessed_something(_run(tmp_path / "open", files)) == []


def test_a_non_aten_op_without_a_finding_is_a_violation(tmp_path):
    """Rule: every op outside PyTorch's own namespaces in a compiled graph has a finding; a finding naming it
    clears it. PyTorch's namespaces are portkit's one list (foreign_ops.CORE_NAMESPACES): a prims op needs none,
    Mixtral's transformers::grouped_mm_fallback does."""
    files = _good()
    for target in TARGETS:
        files["compile"]["targets"][target]["checks"]["ops"].update(
            {"mylib::fused_rope": {"calls": 2}, "prims::iota": {"calls": 1}, "_c10d_functional::all_reduce": {}})
    files["compile"]["targets"]["neuron"]["checks"]["ops"]["transformers::grouped_mm_fallback"] = {"calls": 1}
    files["compile"]["targets"]["tpu"]["findings"] = [{"kind": "custom_op", "message": "mylib::fused_rope ..."}]
    found = zoo_rules.non_aten_ops_have_findings(_run(tmp_path, files))
    rule = "op outside PyTorch's namespaces without a finding"
    assert sorted((v.target, v.rule, v.detail.split()[0]) for v in found) == [
        ("neuron", rule, "mylib::fused_rope"), ("neuron", rule, "transformers::grouped_mm_fallback")]


def test_a_cause_counted_twice_is_a_violation(tmp_path):
    """Rule: no cause is counted twice (the same cause as work from stage 1 and again from stage 2)."""
    files = _good()
    files["report"]["targets"]["neuron"]["findings"].append({**WORK_FINDING, "stage": "compile"})
    found = zoo_rules.causes_counted_once(_run(tmp_path, files))
    assert [v.target for v in found] == ["neuron"] and "fallbacks and compile" in found[0].detail


@pytest.mark.parametrize("config, cap, fires", [
    ({"model_type": "mamba"}, 512, True),                              # no limit in the config: portkit's own
    ({"model_type": "gpt2", "n_positions": 128}, 128, False),
    ({"model_type": "roberta", "max_position_embeddings": 130, "pad_token_id": 1}, 128, False),  # 2 reserved
    ({"model_type": "llama", "max_position_embeddings": 4096}, 512, True),
    # T5's published configs carry n_positions, but its attention is relative: no position table, no limit
    ({"model_type": "t5", "n_positions": 512, "relative_attention_num_buckets": 32}, 512, True),
])
def test_a_portkit_cap_called_the_models_maximum_is_a_violation(tmp_path, config, cap, fires):
    """Rule: no portkit cap is called the model's maximum (Mamba has no position limit; 512 was portkit's)."""
    files = _good()
    files["buckets"]["targets"]["tpu"]["findings"] = [
        {"kind": "truncation", "message": f"10 of 100 texts are longer than {cap} tokens (the model's maximum)"}]
    found = zoo_rules.caps_named_as_portkits(_run(tmp_path, files, config=config))
    assert bool(found) == fires


def test_a_verdict_off_the_grading_policy_is_a_violation(tmp_path):
    """Rule: every verdict follows the written grading policy: a blocker is "blocked"; a failed stage not in
    unassessed cannot leave a target "ready with work"."""
    files = _good()
    files["report"]["targets"]["neuron"]["findings"].append({**WORK_FINDING, "severity": "blocker", "cause": "b"})
    files["run"]["stages"]["xla"]["status"] = "failed"
    files["report"]["stages"]["xla"]["status"] = "failed"
    found = zoo_rules.verdicts_follow_policy(_run(tmp_path, files))
    assert any(v.target == "neuron" and "give 'blocked'" in v.detail for v in found)
    assert any(v.target == "tpu" and "xla" in v.detail for v in found)


def test_a_users_finding_in_portkits_own_file_is_a_violation(tmp_path):
    """Rule: no finding is attributed to the user from portkit's own files (an adapter's int64 cast)."""
    files = _good()
    files["fallbacks"]["targets"]["neuron"]["findings"] = [
        {"kind": "int64", "severity": "work", "owner": {"owner": "user"},
         "where": {"file": "/srv/tree/portkit/models/adapters.py", "line": 108}},
        {"kind": "int64", "severity": "work", "owner": {"owner": "user"}, "where": {"file": "/home/me/model.py"}}]
    found = zoo_rules.user_findings_not_in_portkit(_run(tmp_path, files))
    assert [(v.target, "adapters.py" in v.detail) for v in found] == [("neuron", True)]
