"""Stage 2 with workload "train" (portkit/stages/compile/training.py): the training step compiled per target."""
import json

import pytest

from conftest import fixture_model
from portkit.core import grading
from portkit.stages.compile import training
from portkit.stages.compile import stage
from portkit.models import registry
from portkit.core.errors import BadParameter


def _own_loss(module, batch):
    """mean of the squared outputs"""
    return next(iter(module(**batch).values())).square().mean()


@pytest.fixture(scope="module")
def gpt2():
    return registry.load("gpt2")


def _fixture(name, gpt2):
    model = registry.load(fixture_model(name))
    model.loss = _own_loss      # the loss a user's factory would declare
    return model


def test_a_causal_lm_step_compiles_once_and_matches_eager_under_the_same_numerics(gpt2, corpus):
    found = training.check(gpt2, corpus, ["neuron", "tpu"], steps=3, batch_size=2, seq_len=16)
    for name, t in found.items():
        assert t.backend == f"portkit_{name}" and t.loss == "next-token cross-entropy"
        assert t.joint_graphs == 1 and t.graphs == {"forward": 1, "backward": 1}, t.summary()
        assert t.late == [] and len(t.losses) == len(t.eager_losses) == 3
        assert t.loss_difference == pytest.approx(0.0, abs=1e-4)     # the same numerics, compiled or not
        assert t.findings() == [] and t.refused is None
        assert json.loads(json.dumps(t.to_dict()))["summary"] == t.summary()
    assert found["tpu"].precision != found["neuron"].precision or found["tpu"].precision == "default"


def test_a_graph_break_and_an_op_without_a_kernel_become_training_findings(gpt2, corpus):
    broken = training.check(_fixture("branch_model", gpt2), corpus, ["neuron"], steps=2, batch_size=2,
                                    seq_len=8)["neuron"]
    assert broken.joint_graphs >= 2
    kinds = {f[0]: f for f in broken.findings()}
    assert grading.severity("train_graph_break", kinds["train_graph_break"][1]) == "work"
    assert f"{broken.joint_graphs} graphs" in kinds["train_graph_break"][2]
    svd = training.check(_fixture("svd_model", gpt2), corpus, ["neuron"], steps=2, batch_size=2,
                                 seq_len=8)["neuron"]
    ops = {(o["op"], o["part"]) for o in svd.not_lowered}
    assert ("aten::_linalg_svd", "forward") in ops, ops
    found = next(f for f in svd.findings() if f[0] == "train_not_lowered")
    assert "in the forward pass would not lower (cpu_fallback" in found[2] and found[1] == grading.RUNS_ON_HOST
    assert found[4] is not None and found[4]["text"]            # the user's source line


def test_the_stage_checks_a_training_step_with_one_compiling_step_then_the_proof(gpt2, corpus):
    assert training.STEPS >= 2                 # one compiling step, then at least one under the proof
    with pytest.raises(BadParameter, match="steps"):
        stage.check_training(gpt2, corpus, ["tpu"], steps=0)


def test_a_refused_training_step_is_told_what_was_tried_not_to_make_its_shapes_static(gpt2, corpus):
    """Rule (advice that was tried): the training step is compiled with dynamic=False at one fixed batch shape, so a
    refusal there is advice saying that was tried and naming the code to change, never "make the step's graph
    static (dynamic=False, fixed batch shapes)"; stage 2's refusal advice is the same wording (one owner,
    backends.refusal_advice). A model whose graph turns symbolic after a graph break is refused either way."""
    refused = training.check(_fixture("dynamic_after_break_model", gpt2), corpus, ["tpu"], steps=2, batch_size=2,
                             seq_len=8)["tpu"]
    assert refused.refused is not None, refused.summary()
    [(kind, case, message, advice, where)] = refused.findings()
    assert kind == "train_refused" and grading.severity(kind, case) == "blocker"
    assert advice.startswith("tried: torch.compile(dynamic=False) at the batch's fixed shape (input_ids 2x8")
    assert "still refused" in advice and "make the step's graph static" not in advice
