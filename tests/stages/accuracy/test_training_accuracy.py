"""Stage 4 for training: where a target precision's loss and gradients part from fp32, and the advice."""
import pytest

from portkit.stages.accuracy.stage import Options, check_training, training_precisions
from portkit.stages.report.stage import TargetReport
from portkit.run import preflight
from portkit.workloads import training
from portkit.core.errors import BadParameter
from portkit.stages.accuracy.training import TrainingComparison, diverge, measured_master_weights
from tests.fixtures.sections import read_section


def _run(target, precision, losses, norms):
    return training.TrainingRun("m", "loss", target, precision, "emulated", "eager", 1e-4, {}, list(losses),
                                [dict(n) for n in norms])


REFERENCE = _run("fp32", "fp32", [2.0, 1.5, 1.0], [{"a": 1.0, "b": 1.0}] * 3)


def test_the_step_and_layer_where_they_part_and_the_higher_precision_advice():
    # bf16 tolerance: rtol 1.6e-2, atol 1e-5. Layer b's gradient norm is 5% off at step 1; the loss never parts.
    tpu = diverge(REFERENCE, _run("tpu", "default", [2.0, 1.501, 1.001], [{"a": 1.0, "b": 1.0},
                                                                          {"a": 1.01, "b": 1.05}, {"a": 1, "b": 1}]))
    assert (tpu.loss_parts_at, tpu.grads_part_at, tpu.layer) == (None, 1, "b")
    assert abs(tpu.layer_gap - 0.05) < 1e-9 and tpu.tolerance["dtype"] == "bfloat16"
    assert tpu.advice == ["run the matmuls of b (where the gradients part, step 1) at a higher precision: "
                          "with torch.tpu.precision(torch.tpu.Precision.HIGHEST) (float32 matmuls (6 bf16 passes))"]
    close = diverge(REFERENCE, _run("tpu", "default", [2.0, 1.51, 1.01], [{"a": 1.01, "b": 0.99}] * 3))
    assert close.grads_part_at is None and close.loss_parts_at is None and "no change needed" in close.advice[0]


def test_bf16_updates_call_for_fp32_master_weights_with_the_measured_gap():
    fp32_updates = diverge(REFERENCE, _run("neuron", "matmult", [2.0, 1.5, 1.001], [{"a": 1, "b": 1}] * 3))
    bf16_updates = diverge(REFERENCE, _run("neuron", "all", [2.0, 1.6, 1.4], [{"a": 1, "b": 1}, {"a": 1.3, "b": 1}, {}]
                                           [:2] + [{"a": 2, "b": 1}]))
    assert bf16_updates.loss_parts_at == 1 and bf16_updates.layer == "a"
    measured_master_weights([fp32_updates, bf16_updates])
    assert bf16_updates.advice[0].startswith("keep fp32 master weights: under NEURON_CC_FLAGS='--auto-cast=all")
    assert bf16_updates.advice[-1] == "measured: with fp32 updates (matmult) the last loss is 0.10% from fp32, " \
                                      "against 40.00% here"
    assert not any("measured" in a for a in fp32_updates.advice)


def test_check_training_runs_each_rounding_precision_on_real_batches(gpt2, corpus):
    assert training_precisions(["neuron", "tpu", "cpu"]) == [("neuron", "matmult"), ("neuron", "all"),
                                                                      ("tpu", "default")]
    opts = Options.of({"train_steps": 3, "batch_size": 2, "seq_len": 16})
    found = check_training(gpt2, corpus, ["tpu"], opts, lr=1e-3, layout="packed", ops=False)
    assert [(r.target, r.precision) for r in found.runs] == [("tpu", "default")]
    assert len(found.reference.losses) == 3 and found.reference.losses[-1] < found.reference.losses[0]
    assert len(found.runs[0].max_grad_gap) == 3 and found.to_dict()["runs"][0]["run"]["target"] == "tpu"
    assert "tpu default (torch.tpu.Precision.DEFAULT)" in str(found)


def test_training_verdicts_per_target_beside_the_inference_one():
    tpu = diverge(REFERENCE, _run("tpu", "default", [2.0, 1.7, 1.2], [{"a": 1, "b": 1}] * 3))
    ops = training.StepOps("neuron", "m", "fused", 1, [
        {"phase": "backward", "op": "aten::_thnn_fused_lstm_cell_backward_impl", "calls": 1, "status": "unsupported",
         "detail": "no kernel", "via": None, "callout": "fused RNN cell backward"}])
    found = TrainingComparison("m", "loss", {}, 3, REFERENCE, [tpu], {"neuron": "none", "tpu": "default"},
                               {"neuron": ops})
    verdicts = found.verdicts()
    assert verdicts["neuron"]["verdict"] == "blocked"
    assert verdicts["neuron"]["blockers"] == ["aten::_thnn_fused_lstm_cell_backward_impl (backward): unsupported, "
                                              "no kernel"]
    assert verdicts["tpu"]["verdict"] == "ready with work" and "loss parts at step 1" in verdicts["tpu"]["work"][0]
    assert "training verdict neuron: BLOCKED" in str(found)
    # the report reads them from accuracy.json, beside the inference verdict
    target = TargetReport("tpu", "Google TPU", "emulated")
    read_section("accuracy", target, data={"training": found.to_dict()})
    assert target.training["verdict"] == "ready with work" and target.training_reason().startswith("tpu default")


def test_workload_is_checked_before_anything_runs(tmp_path):
    with pytest.raises(BadParameter, match="unknown workload 'training'; choose one of: inference, generate, train"):
        preflight.plan("gpt2", ["tpu"], str(tmp_path / "run"), {"workload": "training"}, stages=["accuracy"])
    with pytest.raises(BadParameter, match="invalid train_steps 0"):
        preflight.plan("gpt2", ["tpu"], str(tmp_path / "run"), {"train_steps": 0}, stages=["accuracy"])
    assert not (tmp_path / "run").exists()
