"""Stage 3b with workload "train" (portkit.stages.xla.training): the whole training step (the model's loss, its
gradients, AdamW) compiled by XLA for a TPU topology on this CPU host, its memory broken down, and the
largest micro-batch that fits. Compiles need the xla extra and skip without it."""
import pytest

from portkit.corpora import corpus
from portkit.models import registry
from portkit.core import availability
from portkit.stages.report.stage import build_report
from portkit.stages.xla.stage import Options, run_stage
from portkit.tpu_compile import compiler
from portkit.tpu_compile import sharded
from portkit.stages.xla import training
from portkit.core.errors import BadParameter

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax: pip install 'portkit[xla]'")


@pytest.fixture(scope="module")
def bert():
    return registry.load("bert")      # 2 layers, hidden 128, random weights: a step compiles in a few seconds


@pytest.fixture(scope="module")
def spec(bert):
    return training.step_inputs(bert, corpus.load_corpus(), batch_size=2, seq_len=32)


@pytest.fixture(scope="module")
def one_chip(bert, spec):
    """The step compiled for one v5e chip, read by the tests that compare against it (one compile, not one each)."""
    return training.compile_step(bert, spec, "v5e:1x1")


@needs_xla
def test_the_step_compiles_and_its_memory_parts_add_up_to_the_compilers_total(bert, spec, one_chip):
    step = one_chip
    assert step.status == "compiled" and step.fits and step.batch == 2
    assert sum(step.breakdown.values()) == step.memory["total"]
    # the arguments as counted from their shapes are what the compiler holds, up to TPU layout padding
    counted = step.breakdown["weights"] + step.breakdown["optimizer state"] + step.breakdown["batch"]
    assert 0 <= step.memory["argument"] - counted <= 0.01 * step.memory["argument"]
    params = sum(p.numel() for p in bert.module.parameters())
    buffers = sum(b.numel() for b in bert.module.buffers())             # position ids: int64 compiles as int32
    assert step.breakdown["weights"] == 4 * (params + buffers)          # float32, each weight once
    assert step.breakdown["optimizer state"] == 2 * 4 * params + 4      # AdamW's two moments and its step
    assert step.memory["alias"] >= step.breakdown["weights"] + step.breakdown["optimizer state"]   # in place
    assert step.flops and step.flops > 0
    # bfloat16 weights halve the weights, not AdamW's float32 moments
    half = training.compile_step(bert, spec, "v5e:1x1", dtype="bfloat16")
    assert half.breakdown["weights"] == 2 * params + 4 * buffers
    assert half.breakdown["optimizer state"] == step.breakdown["optimizer state"]


@needs_xla
def test_on_several_devices_weights_and_moments_are_sharded_fsdp_style(bert, spec, one_chip):
    one = one_chip
    four = training.compile_step(bert, spec, "v5e:2x2")           # 4 devices, the batch of 2 does not divide
    assert four.status == "compiled" and "FSDP over 4 devices" in four.sharding and "replicated" in four.sharding
    assert sum(four.breakdown.values()) == four.memory["total"]
    # every bert weight has a dimension that divides by 4: each device holds a quarter, moments too
    assert four.breakdown["weights"] == one.breakdown["weights"] // 4
    assert four.breakdown["optimizer state"] - 4 == (one.breakdown["optimizer state"] - 4) // 4
    assert 0 <= four.breakdown.get("other arguments", 0) <= 0.01 * four.memory["argument"]


@needs_xla
def test_the_largest_micro_batch_is_the_compilers_boundary(bert, spec, one_chip, monkeypatch):
    first = one_chip
    # a device whose HBM holds the step at 2 rows and not a byte more: the compiler must refuse 3 rows
    monkeypatch.setitem(compiler.HBM_GIB_PER_CHIP, "v5e", (first.memory["total"] + 1) / 2 ** 30)
    # the fixture's step (batch 2) is the first try, not compiled again: it fits this HBM too (its total and a byte)
    n, tried = training.largest_micro_batch(bert, spec, "v5e:1x1", first=first, limit=64)
    assert n == 2 and tried[2] is True and tried[3] is False


@needs_xla
def test_stage_3b_with_workload_train_saves_the_step_and_the_report_shows_it(bert, tmp_path, monkeypatch):
    monkeypatch.setattr(sharded, "BATCH_LIMIT", 2)
    stage = run_stage(bert, ["neuron", "tpu"],
                          Options.of({"batch_size": 2, "seq_len": 32, "workload": "train"}), run_dir=tmp_path)
    stage.save(tmp_path / "xla.json")
    tpu = stage.to_dict()["targets"]["tpu"]["training_step"]
    assert tpu["status"] == "compiled" and tpu["largest_micro_batch"] == 2 and tpu["breakdown"]["optimizer state"]
    split = tpu["temporaries"]        # batches 2 and 4: what grows with the batch, and what does not
    assert split["batches"] == [2, 4] and split["per_row"] > 0 and split["fixed"] > 0
    assert "a row (activations)" in tpu["summary"]
    assert stage.training["neuron"]["status"] == "skipped"
    shown = build_report(["tpu"], run_dir=tmp_path).to_dict()["targets"]["tpu"]["metrics"]["xla"]
    assert shown["training step (XLA)"].startswith("training step (in-batch contrastive")
    assert "optimizer state" in shown["training step (XLA)"]
    assert "training_step" not in run_stage(bert, ["tpu"], Options.of(
        {"batch_size": 2, "seq_len": 32}), run_dir=tmp_path).to_dict()["targets"]["tpu"]   # inference: none


def test_bad_workload_and_a_weightless_model_are_refused():
    with pytest.raises(BadParameter, match="workload"):
        Options.of({"workload": "serve"})
    with pytest.raises(BadParameter, match="llama3-8b"):
        Options.of({"workload": "train"}, model="llama3-8b")
