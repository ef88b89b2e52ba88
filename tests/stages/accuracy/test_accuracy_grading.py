"""Stage 4's grading follows the grading policy (portkit/core/grading.py) whatever the model: a task metric outside
its budget at the target's default precision is work where a precision portkit ran on that same failing path passes
("tried: passes"), a blocker otherwise ("tried: still fails", naming what was tried); a secondary declared output
outside its budget fails the verdict as the declaration guide says."""
import pytest
import torch
from torch import nn

from portkit.core import grading
from portkit.models import inputs
from portkit.models import registry
from portkit.stages.accuracy import result
from portkit.stages.accuracy import stage

ROWS = 400          # enough decisions for a 95% interval to clear a 0.99 budget (381 from)
SCOPE = {"compiled": False, "progress": False, "all_precisions": True, "layers": False}


class NearTie(nn.Module):
    """Two classes whose logits differ by 1e-3 of their size: float32 tells them apart, a matmul whose operands are
    rounded to bf16 (TPU's default precision) ties them. `tie` names the output that holds the near tie; the other
    declared output, if any, is well separated. `dtype`: float64 makes the tie 1e-12, below float32 too."""

    def __init__(self, tie: str = "logits", others: tuple = (), dtype=torch.float32, gap: float = 1e-3):
        super().__init__()
        self.tie, self.others, self.dtype = tie, others, dtype
        self.near = nn.Linear(3, 2, bias=False).to(dtype)
        self.far = nn.Linear(3, 2, bias=False)
        with torch.no_grad():
            self.near.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0 + gap]], dtype=dtype))
            self.far.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]))

    def forward(self, pixel_values):
        near = self.near(pixel_values.to(self.dtype)).float()
        far = self.far(pixel_values)
        return {name: near if name == self.tie else far for name in (self.tie, *self.others)}


def _model(name: str, module: NearTie, outputs: tuple[str, ...]) -> registry.LoadedModel:
    declaration = inputs.undeclared(("pixel_values",), tuple(inputs.Output(o, inputs.CLASSIFIER) for o in outputs))
    return registry.LoadedModel(name, inputs.IMAGE_CLASSIFIER, module.eval(), "test model", declaration=declaration)


def _tpu(model: registry.LoadedModel) -> result.TargetAccuracy:
    x = 0.5 + torch.rand(ROWS, 3, generator=torch.Generator().manual_seed(0))
    report = stage.check_accuracy(model, {"pixel_values": x}, ["tpu"], scope=stage.Scope(**SCOPE))
    return report.targets["tpu"]


CASES = {   # the same case (a near tie that the default precision breaks and 'highest' keeps) in three models
    "primary": lambda: _model("primary", NearTie("logits"), ("logits",)),
    "primary, a second output": lambda: _model("two", NearTie("logits", ("scores",), gap=2e-3), ("logits", "scores")),
    "secondary": lambda: _model("secondary", NearTie("scores", ("logits",)), ("logits", "scores")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_metric_a_tried_precision_brings_back_is_work_in_every_model(case):
    """Rule: accuracy FIXED_BY_SETTING (work) where 'highest', run on the same failing path (the main batch, the
    same target side), passes there; the advice says it was tried."""
    tpu = _tpu(CASES[case]())
    assert tpu.chosen.name == "default" and tpu.verdict == "fail"
    [found] = [f for f in tpu.findings() if f.kind == "accuracy"]
    assert found.severity == grading.severity("accuracy", grading.FIXED_BY_SETTING)
    assert "tried: precision 'highest' passes on the main batch" in found.advice
    assert tpu.tried_on(tpu.others[0]) == {result.MAIN_BATCH: True}


def test_a_secondary_output_outside_its_budget_at_every_precision_is_a_blocker():
    """Rule: a declared output beside the judged one that lies wholly outside its budget fails the verdict
    (docs/guides/declaring-a-model.md), and where no precision tried passes it is accuracy NOT_FIXED (a blocker)
    whose advice says what was tried and still fails."""
    tpu = _tpu(_model("float64 tie", NearTie("scores", ("logits",), dtype=torch.float64, gap=1e-12),
                      ("logits", "scores")))
    assert tpu.chosen.main_decision == "pass" and tpu.chosen.output_tasks["scores"]["decision"] == "fail"
    assert tpu.verdict == "fail"
    [found] = [f for f in tpu.findings() if f.kind == "accuracy"]
    assert found.severity == grading.severity("accuracy", grading.NOT_FIXED) == "blocker"
    assert "output 'scores'" in found.message
    assert found.advice.startswith("tried: still fails: precision 'highest' on the main batch")


def _result(name: str, side: str, passed: bool, sample: str = "the main batch") -> result.PrecisionResult:
    decision = "pass" if passed else "fail"
    return result.PrecisionResult(
        {"name": name, "setting": f"set {name}"}, side, {}, {"decision": decision, "passed": passed,
                                                            "reason": None if passed else "agreement 0.9 outside",
                                                            "sample": {"source": sample}},
        None, None, {}, {})


def _failing_bucket(tried: list[dict]) -> result.TargetAccuracy:
    """The main batch passes at the default precision; bucket 64 fails there; 'highest' passes the main batch."""
    bucket = {"boundary": 64, "reasons": ["task: agreement 0.9 outside"], "shape_reasons": [], "outputs": {}}
    return result.TargetAccuracy({"name": "tpu"}, _result("default", "emulated", True),
                                          [_result("highest", "emulated", True)], {}, [bucket], tried=tried)


@pytest.mark.parametrize("tried, graded, advice", [
    ([], grading.NOT_FIXED, "not tried on every failing path: precision 'highest' on bucket 64"),
    ([{"precision": "highest", "path": "bucket 64", "passed": False, "reason": "agreement 0.9 outside"}],
     grading.NOT_FIXED, "tried: still fails: precision 'highest' on bucket 64"),
    ([{"precision": "highest", "path": "bucket 64", "passed": True, "reason": None}],
     grading.FIXED_BY_SETTING, "tried: precision 'highest' passes on bucket 64"),
])
def test_a_precision_that_passed_on_another_path_is_no_fix(tried, graded, advice):
    """Rule: a precision that passes the main batch while a bucket fails is a fix only once it was run on that
    bucket and passed; otherwise the grade is NOT_FIXED and the advice says what was not tried."""
    found = [f for f in _failing_bucket(tried).findings() if f.kind == "accuracy"]
    assert [f.severity for f in found] == [grading.severity("accuracy", graded)]
    assert advice in found[0].advice


def test_a_precision_on_another_target_side_is_not_the_failing_path():
    """Rule: the chosen precision judged compiled and another measured eager are two paths: no fix is claimed."""
    t = result.TargetAccuracy({"name": "tpu"}, _result("default", "compiled", False),
                                       [_result("highest", "eager", True)], {}, [])
    [found] = [f for f in t.findings() if f.kind == "accuracy"]
    assert found.severity == "blocker" and "may help" in found.advice and "tried: precision" not in found.advice


class SequenceNormTagger(nn.Module):
    """A token tagger that normalises over the sequence axis (an InstanceNorm over time) and takes no mask into
    it: padded positions change every real one, so a bucket fails padded and passes at its texts' own length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.norm, self.head = nn.Embedding(30522, 16), nn.InstanceNorm1d(16), nn.Linear(16, 5)

    def forward(self, input_ids, attention_mask):
        h = self.norm(self.embed(input_ids).transpose(1, 2)).transpose(1, 2)
        return {"logits": self.head(h)}


def test_a_bucket_that_fails_only_padded_is_the_padding_cause_not_an_accuracy_blocker(corpus):
    """Rule (grading policy "padding", one cause per target): stage 4 runs a failing bucket's texts unpadded at the
    same precision; where they pass, the bucket's failure is padding's (work, findings.PADDING_CAUSE, the cause
    stage 3's padding check names), never an accuracy blocker."""
    from portkit.core.findings import PADDING_CAUSE
    from portkit.corpora.corpus import example_batch
    m = registry.LoadedModel("norm tagger", registry.TOKEN_CLASSIFIER, SequenceNormTagger().eval(), "test model",
                           tokenizer=registry.minilm_tokenizer())
    inputs, _ = example_batch(m, corpus, batch_size=2, seq_len=32)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                     corpus=corpus, buckets=[16, 128], scope=stage.Scope(
                                         task_items=8, all_precisions=False, layers=False, float64_reference=False,
                                         compiled=False, progress=False))
    tpu = report.targets["tpu"]
    assert any(p.startswith("bucket ") for p in tpu.failing_paths()), tpu.reasons
    found = {f.kind: f for f in tpu.findings()}
    assert "accuracy" not in found and found["padding"].severity == grading.severity("padding") == "work"
    assert found["padding"].cause == PADDING_CAUSE and "tried" in found["padding"].message


def test_a_precision_measured_eager_is_tried_compiled_where_the_chosen_one_failed_compiled():
    """Rule: where the chosen precision was judged compiled, the others (measured eager, another path) are compiled
    on the main batch before one is called a fix: "tried: passes" there, and the grade is FIXED_BY_SETTING."""
    scope = stage.Scope(**{**SCOPE, "compiled": True})
    x = 0.5 + torch.rand(ROWS, 3, generator=torch.Generator().manual_seed(0))
    tpu = stage.check_accuracy(CASES["primary"](), {"pixel_values": x}, ["tpu"], scope=scope).targets["tpu"]
    assert tpu.chosen.target_side != tpu.others[0].target_side          # compiled against eager
    assert [(t["precision"], t["path"], t["passed"]) for t in tpu.tried] == [("highest", "the main batch", True)]
    [found] = [f for f in tpu.findings() if f.kind == "accuracy"]
    assert found.severity == "work" and "tried: precision 'highest' passes on the main batch" in found.advice


def _layered(name: str, passed: bool) -> result.PrecisionResult:
    """A precision measured with the per-layer hooks: the task metric passes or fails; where it fails, the error
    first leaves the tolerance in one Conv1d that the target rounded."""
    r = _result(name, "emulated", passed)
    r.outputs = {"logits": {"max_abs": 0.5 if not passed else 1e-4, "passed": passed}}
    module = {"module": "feature_extractor.conv_layers.0.conv", "type": "Conv1d", "changes": {"matmul bf16": 1}}
    r.layers = {"tolerance": {"dtype": "bfloat16"}, "modules": [module],
                "first_failing": None if passed else {"index": 0, "module": module["module"], "type": "Conv1d"}}
    return r


@pytest.mark.parametrize("highest, advised, said", [
    (None, True, "run it at precision 'highest'"),
    (True, True, "the whole model at 'highest' passes"),
    (False, False, "a higher precision is not the fix: the whole model at 'highest'"),
])
def test_one_module_at_a_higher_precision_is_advised_only_where_the_whole_model_at_it_was_not_seen_failing(
        highest, advised, said):
    """Rule: the module where the error enters is advised at the float32 precision unless the whole model at that
    precision was measured and still fails: one module at it rounds a subset of what the whole model at it did, so
    that advice could not pass where the tried one failed."""
    from portkit.stages.accuracy import advice
    from portkit.targets import specs
    others = [] if highest is None else [_layered("highest", highest)]
    t = result.TargetAccuracy({"name": "tpu", "mode": "emulated"}, _layered("default", False), others, {}, [])
    [text] = advice._where_error_enters(specs.get("tpu"), t, "logits")
    assert said in text and "feature_extractor.conv_layers.0.conv" in text
    assert ("run it at precision" in text) is advised


def test_a_precision_is_judged_on_the_paths_padding_does_not_explain():
    """Rule (as on the seeded wav2vec2 CTC row): the task sample fails at the default precision and 'highest' passes
    there (tried); bucket 64 fails padded at both and passes at its texts' own length. Bucket 64 is the padding
    finding's; the accuracy finding is graded on the task sample alone: FIXED_BY_SETTING, "tried: passes", its
    message without the bucket's reason, never "still fails" for a path padding explains."""
    bucket = {"boundary": 64, "reasons": ["task: agreement 0.88 outside"], "shape_reasons": [], "outputs": {}}
    tried = [{"precision": "default", "path": "bucket 64", "unpadded": True, "passed": True, "reason": None},
             {"precision": "highest", "path": "bucket 64", "passed": False, "reason": "agreement 0.88 outside"},
             {"precision": "highest", "path": result.TASK_SAMPLE, "passed": True, "reason": None}]
    t = result.TargetAccuracy({"name": "tpu", "mode": "emulated"},
                              _result("default", "emulated", False, sample="the corpus"),
                              [_result("highest", "emulated", True)], {}, [bucket], tried=tried)
    assert t.failing_paths() == [result.TASK_SAMPLE, "bucket 64"] and t.padded_only() == ["bucket 64"]
    found = {f.kind: f for f in t.findings()}
    assert found["padding"].severity == grading.severity("padding")
    accuracy = found["accuracy"]
    assert accuracy.severity == grading.severity("accuracy", grading.FIXED_BY_SETTING)
    assert accuracy.advice == "set set highest: tried: precision 'highest' passes on the task sample"
    assert "bucket 64" not in accuracy.message and "still fails" not in accuracy.advice


@pytest.mark.parametrize("own_length_passes", [True, False])
def test_a_bucket_with_two_causes_is_judged_for_precision_at_its_texts_own_length(own_length_passes):
    """Rule (as on the seeded SEW CTC row): bucket 1000's texts fail at their own length at 'default' too, so padding
    is not its only cause; 'highest' is run on them padded and unpadded. Where 'highest' passes unpadded, it fixes
    the precision's part (FIXED_BY_SETTING, said "at its texts' own length") and the bucket's padded failure at
    'highest' is the padding finding's; where it fails unpadded too, it still fails there (NOT_FIXED, said so)."""
    bucket = {"boundary": 1000, "reasons": ["task: agreement 0.89 outside"], "shape_reasons": [], "outputs": {}}
    tried = [{"precision": "default", "path": "bucket 1000", "unpadded": True, "passed": False, "reason": "0.984"},
             {"precision": "highest", "path": "bucket 1000", "passed": False, "reason": "agreement 0.895 outside"},
             {"precision": "highest", "path": "bucket 1000", "unpadded": True, "passed": own_length_passes,
              "reason": None},
             {"precision": "highest", "path": result.TASK_SAMPLE, "passed": True, "reason": None}]
    t = result.TargetAccuracy({"name": "tpu", "mode": "emulated"},
                              _result("default", "emulated", False, sample="the corpus"),
                              [_result("highest", "emulated", True)], {}, [bucket], tried=tried)
    assert t.padded_only() == []
    found = {f.kind: f for f in t.findings()}
    if own_length_passes:
        assert found["accuracy"].severity == grading.severity("accuracy", grading.FIXED_BY_SETTING)
        assert found["accuracy"].advice.endswith(
            "passes on the task sample, bucket 1000 (at its texts' own length)")
        assert found["padding"].message.startswith("precision 'highest' (emulated): bucket 1000 fail(s) padded")
    else:
        assert found["accuracy"].severity == grading.severity("accuracy", grading.NOT_FIXED)
        assert "tried: still fails: precision 'highest' on bucket 1000 (at its texts' own length)" \
            in found["accuracy"].advice
        assert "padding" not in found


def test_one_padding_finding_holds_both_causes_and_says_where_the_other_side_was_not_tried():
    """Rule: bucket 64 fails only padded (padding on the left, tried, passes there); bucket 1000 fails at its texts'
    own length too and 'highest' fixes that, padded it still fails: one padding finding names both, each at its
    precision, and its advice says the left side was not tried on bucket 1000."""
    buckets = [{"boundary": b, "reasons": ["task: agreement 0.89 outside"], "shape_reasons": [], "outputs": {}}
               for b in (64, 1000)]
    tried = [{"precision": "default", "path": "bucket 64", "unpadded": True, "passed": True, "reason": None},
             {"precision": "default", "path": "bucket 1000", "unpadded": True, "passed": False, "reason": "0.984"},
             {"precision": "default", "path": "bucket 64", "padding_side": "left", "passed": True, "reason": None},
             {"precision": "highest", "path": "bucket 1000", "passed": False, "reason": "0.895"},
             {"precision": "highest", "path": "bucket 1000", "unpadded": True, "passed": True, "reason": None},
             {"precision": "highest", "path": result.TASK_SAMPLE, "passed": True, "reason": None}]
    t = result.TargetAccuracy({"name": "tpu", "mode": "emulated"},
                              _result("default", "emulated", False, sample="the corpus"),
                              [_result("highest", "emulated", True)], {}, buckets, tried=tried)
    [padding] = [f for f in t.findings() if f.kind == "padding"]
    assert padding.occurrences == {"paths": ["bucket 64", "bucket 1000"], "count": 2}
    assert "precision 'default' (emulated): bucket 64 fail(s)" in padding.message
    assert "precision 'highest' (emulated): bucket 1000 fail(s)" in padding.message
    assert padding.advice.startswith("pad on the left") and padding.advice.endswith(
        "; the other padding side not tried on bucket 1000 (at precision 'highest')")
