"""A stage that assessed nothing says so: each rule below on a model built for it.

- Stage 3b: a shape portkit's own PyTorch-to-JAX conversion stopped is portkit's finding (one per cause, with its op
  and the model's line), never a compiler blocker or work; the HBM fit it was to establish is "not assessed", and
  the report's verdict names that open question (core.assessed).
- Stage 3: a chosen plan whose warm-up the compiler refused has no compiles after warm-up, no compile time and no
  padding check: each is "not assessed", in the summary, the result and the report.
- Stage 1: the summary counts what cannot run by the findings, never "0" beside a blocker.
- A forward that stores a tensor on its module (a cache set up during the call) does not break the next trace.
- A padded position whose FLOPs cannot be counted is priced from the parameters (2N FLOPs per token), an estimate.
"""
import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import fixture_model
from portkit.core import assessed
from portkit.core import availability
from portkit.core import placement
from portkit.corpora import corpus
from portkit.models import registry
from portkit.planning import economics
from portkit.runfolder import results
from portkit.stages.fallbacks.stage import find_fallbacks
from portkit.stages.report.stage import build_report
from portkit.stages.xla.stage import XlaSkipped, XlaStage, check_lowering, compile_for_tpu
from portkit.targets import capacity

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax: pip install 'portkit[xla]'")
OTHER_STAGES = ("fallbacks", "compile", "buckets", "accuracy")


class AiryHead(nn.Module):
    """A linear layer, then torch.special.airy_ai: torchax 0.0.13 has no JAX lowering for it (portkit's converter)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return {"y": torch.special.airy_ai(self.proj(x))}   # the line the finding names


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return {"y": torch.tanh(self.proj(x))}


class CacheInForward(nn.Module):
    """Sets up a cache on itself during the call, as models with a lazily built KV or rotary cache do."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids)
        self.cache = h.new_zeros(h.shape)        # a tensor stored on the module inside forward
        self.cache = self.cache + self.proj(h)
        return {"out": self.cache * attention_mask.unsqueeze(-1)}


class ReadsValues(nn.Module):
    """A forward that reads a value on the host (.tolist()): fake tensors cannot run it, so no FLOPs are counted."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, input_ids, attention_mask):
        keep = attention_mask.sum(-1).tolist()           # host read: data-dependent under fake tensors
        h = self.mlp(self.embed(input_ids))
        return {"out": h[:, :max(keep)]}


def text_model(module, name):
    return registry.LoadedModel(name, registry.TOKEN_CLASSIFIER, registry.OutputsAdapter(module).eval(), "test model",
                              tokenizer=registry.minilm_tokenizer())


def stage_folder(tmp_path, stage: XlaStage):
    """A run folder holding only stage 3b's result, every other stage skipped: the verdict rests on 3b alone."""
    for name in OTHER_STAGES:
        with contextlib.suppress(results.StageSkipped):
            results.skip_stage(tmp_path, name, {"name": "test"}, ["tpu"], "not part of this test")
    stage.save(tmp_path / "xla.json")
    return build_report(["tpu"], run_dir=tmp_path).to_dict()["targets"]["tpu"]


# ---------------------------------------------------------------- stage 3b
@needs_xla
def test_a_conversion_failure_is_portkits_one_finding_per_cause_and_leaves_the_fit_not_assessed(tmp_path):
    """Rule: a shape portkit's PyTorch-to-JAX conversion stopped is portkit's (owner "portkit"), one finding for the
    cause however many shapes it stopped, with its op and the model's line; it is neither a blocker nor work; the
    HBM fit is "not assessed" in the summary, the result's not_assessed and the report's verdict and unassessed."""
    shapes = [{"x": ((4, 16), "float32")}, {"x": ((8, 16), "float32")}]
    tpu = compile_for_tpu(AiryHead(), shapes)
    stage = XlaStage({"name": "airy"}, {"tpu": tpu}, {"tpu": ["test", "test"]})
    saved = stage.to_dict()["targets"]["tpu"]
    (found,) = saved["findings"]
    assert (found["kind"], found["severity"], found["owner"]["owner"]) == ("xla_conversion", "info", assessed.PORTKIT)
    assert found["ops"] == ["aten::special_airy_ai"] and found["occurrences"]["count"] == 2
    assert found["where"]["file"] == __file__ and "airy_ai(self.proj(x))" in found["where"]["code"]
    assert found["consequence"].startswith("not assessed") and "rejects" not in found["advice"]
    (open_q,) = saved[assessed.KEY]
    assert open_q["question"].startswith("HBM fit on v5e:1x1") and "NO LOWERING for aten::special_airy_ai" in open_q[
        "why"]
    summary = stage.summary_for("tpu")
    assert "NOT ASSESSED" in summary and "compiled and fit" not in summary and "largest" not in summary
    verdict = stage_folder(tmp_path, stage)
    assert verdict["verdict"] == "not assessed" and verdict["unassessed"] == [f"xla: {open_q['question']}"]
    assert "HBM fit on v5e:1x1" in verdict["verdict_reason"] and "not assessed" in verdict["verdict_reason"]
    assert not [f for f in verdict["findings"] if f["severity"] in ("blocker", "work")]
    # the control: the same check where every shape compiles establishes the fit, and the verdict rests on it
    fits = XlaStage({"name": "dense"}, {"tpu": compile_for_tpu(Dense(), shapes)}, {"tpu": ["test"] * 2})
    assert fits.to_dict()["targets"]["tpu"][assessed.KEY] == [] and "2/2 shapes compiled and fit" in fits.summary()
    (tmp_path / "control").mkdir()
    control = stage_folder(tmp_path / "control", fits)
    assert control["verdict"] == "ready" and control["unassessed"] == []


@needs_xla
def test_longformers_boolean_index_is_a_conversion_gap_not_a_compiler_blocker():
    """Rule (a real architecture, transformers' Longformer at a tiny size): its boolean-index write into the
    attention mask stops portkit's converter (jax takes no tensor index there); that is portkit's finding at
    Longformer's own line, the HBM fit not assessed, never "the real XLA TPU compiler rejects this shape"."""
    from transformers import LongformerConfig, LongformerModel

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.longformer = LongformerModel(LongformerConfig(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=256,
                attention_window=4))

        def forward(self, input_ids):
            return {"h": self.longformer(input_ids=input_ids).last_hidden_state}

    torch.manual_seed(0)
    tpu = compile_for_tpu(Encoder().eval(), [{"input_ids": ((1, 16), "int64")}])
    saved = XlaStage({"name": "longformer"}, {"tpu": tpu}, {"tpu": ["test"]}).to_dict()["targets"]["tpu"]
    (found,) = saved["findings"]
    assert (found["kind"], found["severity"], found["owner"]["owner"]) == ("xla_conversion", "info", assessed.PORTKIT)
    assert found["where"]["file"].endswith("modeling_longformer.py") and "attention_mask == 2" in found["where"]["code"]
    assert "conversion failed" in found["message"] and saved[assessed.KEY][0]["question"].startswith("HBM fit")


@needs_xla
def test_the_lowering_check_failing_in_the_converter_is_not_work():
    """Rule: Neuron's StableHLO lowering check stopped by portkit's converter is portkit's finding, the lowering
    "not assessed", never "work: runs, with the cost named in the finding" (no cost is named)."""
    neuron = check_lowering(AiryHead(), [{"x": ((4, 16), "float32")}])
    stage = XlaStage({"name": "airy"}, {"neuron": neuron}, {"neuron": ["test"]})
    saved = stage.to_dict()["targets"]["neuron"]
    assert [(f["kind"], f["severity"]) for f in saved["findings"]] == [("xla_conversion", "info")]
    assert saved[assessed.KEY][0]["question"].startswith("StableHLO lowering")
    assert "NOT ASSESSED" in stage.summary() and "0/1 shapes lowered" not in stage.summary()


def test_a_training_step_the_converter_stopped_leaves_its_fit_open():
    """Rule: workload "train" or "generate" whose graph portkit's converter stopped leaves that graph's HBM fit
    not assessed; a compiled one leaves nothing open."""
    skipped = XlaSkipped("tpu", "not part of this test")
    stopped = {"status": "trace_failed", "summary": "training step (batch 2) on v5e:1x1: trace_failed: View"}
    stage = XlaStage({"name": "t"}, {"tpu": skipped}, {}, training={"tpu": stopped},
                         serving={"tpu": {"status": "compiled", "summary": "decode compiled"}})
    (q,) = stage.to_dict()["targets"]["tpu"][assessed.KEY]
    assert q["question"] == "HBM fit of the training step" and "trace_failed" in q["why"]


@needs_xla
def test_a_cache_set_up_in_forward_survives_the_flop_count_and_the_xla_pricing():
    """Rule: a trace that runs forward on tensors that are not the model's (fake tensors counting FLOPs, the XLA
    converter) puts back what forward stored on the modules; stage 3's pricing crashed with `.numpy() is not
    supported for tensor subclasses` on the fake tensor the FLOP count left behind."""
    m = text_model(CacheInForward(), "cache-in-forward")
    price = economics.padding_prices(m, ["tpu"], 32)["tpu"]
    assert price.kind == economics.ESTIMATE and price.seconds > 0
    assert "cache" not in vars(m.module.model)          # the fake tensor forward stored is gone
    cost = economics.cost_model(m, "tpu", [8, 16, 32])
    assert cost.kind == economics.MEASURED_XLA and "cache" not in vars(m.module.model)
    m.module(**m.encode(["a cache set up during the call"], pad_to=8))    # eager still sets it, as the model does
    assert isinstance(m.module.model.cache, torch.Tensor)


def test_tensors_kept_puts_back_buffers_and_drops_new_tensors():
    """Rule: placement.tensors_kept restores a buffer forward replaced and drops a tensor forward added, also when
    the block raises; a non-tensor attribute forward set is the model's business and stays."""
    module = nn.Linear(2, 2)
    module.register_buffer("steps", torch.zeros(1))
    steps = module.steps
    with pytest.raises(RuntimeError), placement.tensors_kept(module):
        module.steps = torch.ones(1)
        module.scratch = torch.ones(3)
        module.note = "set in forward"
        raise RuntimeError("the trace failed")
    assert module.steps is steps and not hasattr(module, "scratch") and module.note == "set in forward"
    assert "steps" in dict(module.named_buffers())


# ---------------------------------------------------------------- stage 3
def test_a_warm_up_the_compiler_refused_leaves_the_plan_not_assessed(waves):
    """Rule: a chosen plan whose warm-up the target's compiler refused states no compiles after warm-up, no compile
    time with the plan and no padding check: each is "not assessed" (summary, buckets.json, the report's line), and
    the refusal stays the one blocker."""
    from portkit.models import inputs
    from portkit.stages.report import sections
    from tests.stages.buckets.test_bucket_strides import HOP, RefusedWhenLong, declared, stage3
    m = declared(RefusedWhenLong(), inputs.Output("frames", inputs.WAVEFORM, stride=HOP))
    tpu = stage3(m, waves, {"tpu": [64, 256]})["tpu"]
    assert tpu.replay_failure()["kind"] == "refused"
    summary = tpu.summary()
    assert "warm-up not assessed" in summary and "replay of the chosen plan not assessed" in summary
    assert "after warm-up;" not in summary and "with the plan" in summary and " s with the plan" not in summary
    saved = json.loads(json.dumps(tpu.to_dict()))
    assert saved["compiles_after_warmup"] is None
    assert [q["question"] for q in saved[assessed.KEY]] == [
        "compiles after warm-up under the chosen plan", "warm-up compile time of the chosen plan on the target",
        "padding check of the chosen plan"]
    (row,) = [r for r in saved["replay"] if r["plan"]]
    assert row["compiles"] is None and row["compiles_after_warmup"] is None and row["target_compile_seconds"] is None
    from portkit.runfolder import buckets_result, reading     # the report reads the saved part as its type
    typed = buckets_result.Target.from_dict(reading.Node(saved, Path("buckets.json"), "buckets", "targets.tpu"))
    (typed_row,) = [r for r in typed.replay if r.plan]
    assert sections._replay(typed_row, None, "tpu").startswith("not assessed")
    storm = {"stage": "compile", "kind": "recompile_storm", "severity": "work", "message": "a storm"}
    sections.resolve_storm([storm], typed)          # a refused plan resolves no storm
    assert storm["severity"] == "work" and "resolved" not in storm["message"]
    plan = next(f for f in saved["findings"] if f["kind"] == "bucket_plan")
    assert "after warm-up in the replay" not in plan["message"] and "not assessed" in plan["message"]
    assert [f["kind"] for f in saved["findings"] if f["severity"] == "blocker"] == ["compile_refused"]
    # the control: a plan the compiler takes is measured, and nothing is left open
    neuron = stage3(m, waves, {"neuron": [32, 64]})["neuron"]
    assert neuron.open_questions() == [] and "0 after warm-up" in neuron.summary()


@pytest.fixture(scope="module")
def waves():
    """Clips of 9 to 255 samples (as tests/stages/buckets/test_bucket_strides.py's): the refused model pads those above 64."""
    rng = np.random.default_rng(0)
    return corpus.Corpus("waves", "random (seed 0)", tuple((0.5 + 0.1 * rng.standard_normal(n)).astype(np.float32)
                                                        for n in (9, 13, 22, 30, 37, 45, 51, 63, 70, 83, 99, 121)))


# ---------------------------------------------------------------- stage 1
@pytest.mark.parametrize("spec", [fixture_model("cell_model"), "lstm"])
def test_the_summary_counts_what_cannot_run_by_the_findings(spec):
    """Rule: stage 1's summary counts what cannot run once, by the findings: a recurrent cell the CPU decomposes
    (no unsupported op in the recording) is a blocker on Neuron, and the summary never says "0 cannot run" beside
    it (the cell model); an LSTM whose CPU op has no Neuron kernel counts the same way."""
    m = registry.load(spec)
    found = find_fallbacks(m, m.encode(["Sum the values.", "def f(x): return x"], pad_to=6), ["neuron"])
    neuron = found.targets["neuron"]
    blockers = neuron.severity_counts()["blocker"]
    assert blockers >= 1 and f"{blockers} cannot run (blocker)" in neuron.summary()
    assert "0 cannot run" not in neuron.summary()


# ---------------------------------------------------------------- padding price
def test_uncountable_flops_are_estimated_from_the_parameters_not_this_cpus_slope():
    """Rule: where the FLOP counter cannot run the graph, a padded position costs 2 FLOPs per non-embedding
    parameter (Kaplan et al. 2020) at the chip's peak, labelled an estimate with its source; this CPU's eager slope
    (orders of magnitude dearer, which drove a 0.3 M-parameter model to 30 buckets) no longer stands in."""
    m = text_model(ReadsValues(), "reads-values")
    with pytest.raises(Exception):      # the premise: fake tensors cannot run this forward
        capacity.count_flops(m.module, {"input_ids": ((1, 8), "int64"), "attention_mask": ((1, 8), "int64")})
    price = economics.padding_price(m, "tpu", 64)
    weights = economics.non_embedding_parameters(m.module)
    assert weights == 64 * 256 + 256 + 256 * 64 + 64
    peak = capacity.chip("v5e", "tpu")["peak_bf16_flops"]
    assert price.kind == economics.ESTIMATE and price.seconds * peak == pytest.approx(2 * weights)
    assert "could not be counted" in price.source and "Kaplan et al. 2020" in price.source


# ---------------------------------------------------------------- stage 2
class RefusedWhenLonger(nn.Module):
    """A token tagger that, for inputs longer than `longest` tokens, first pads them by an amount held in a tensor
    (as EnCodec's _pad1d does): compiled, that amount is a size read from a tensor, which a static-shape target's
    compiler refuses; eager it pads by nothing. Shorter requests compile, one graph per length."""

    def __init__(self, longest: int):
        super().__init__()
        torch.manual_seed(0)
        self.longest, self.embed, self.head = longest, nn.Embedding(30522, 8), nn.Linear(8, 3)
        self.register_buffer("extra", torch.tensor(0), persistent=False)

    def forward(self, input_ids, attention_mask):
        if input_ids.shape[1] > self.longest:
            input_ids = nn.functional.pad(input_ids, (0, self.extra))
        return {"logits": self.head(self.embed(input_ids))}


def test_a_storm_the_compiler_stopped_is_not_priced_and_its_storm_is_open():
    """Rule (a stage that did nothing says so, stage 2): a storm the target's compiler stopped part-way (two lengths
    compiled, then a refusal) is never priced as "N compiles priced by ..." beside the refusal: its summary says
    where it stopped, the storm's compiles and time are "not assessed" (an open question of the target), no storm
    finding stands for the stream, and the refusal is the blocker."""
    from portkit.stages.compile.stage import Options, StormSettings, compile_model
    from portkit.corpora.requests import Requests
    m = registry.LoadedModel("refused when longer", registry.TOKEN_CLASSIFIER, RefusedWhenLonger(12).eval(),
                             "test module", tokenizer=registry.minilm_tokenizer())
    texts = ["Sum the values.", "Open the file and read it.", "Return the sum of the values of a list of numbers, "
             "then close every file that was opened on the way."]
    requests = Requests([[t] for t in texts], [m.encode([t]) for t in texts], "test", m)
    lengths = [r["input_ids"].shape[1] for r in requests.inputs]
    assert lengths[0] != lengths[1] and max(lengths[:2]) <= 12 < lengths[2]
    cost = economics.neuron_estimate(10**6)
    found = compile_model(m, requests, ["tpu"], Options.of({"seq_len": 8}),
                                    storm=StormSettings(progress=False), costs={"tpu": cost})
    summary = found.target_summary("tpu")
    assert "then cannot compile at request 3" in summary and "not assessed" in summary
    assert "compiles are priced by" not in summary
    saved = json.loads(json.dumps(found.to_dict()))["targets"]["tpu"]
    [question] = saved[assessed.KEY]
    assert question["question"].startswith("recompile storm over the 3 requests") and "request 3" in question["why"]
    kinds = [f["kind"] for f in saved["findings"]]
    assert "recompile_storm" not in kinds and "compile_refused" in kinds
