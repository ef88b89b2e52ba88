import dataclasses
import json

import pytest
import torch

from conftest import fixture_model
from portkit.stages.accuracy import stage
from portkit.stages.accuracy import reference
from portkit.stages.accuracy import settings
from portkit.stages.accuracy import comparison
from portkit.corpora.corpus import example_batch
from portkit.models import registry
from portkit.targets import numerics
from portkit.core import availability
from portkit.runfolder import results
from portkit.run import runner
from portkit.run import preflight
from portkit.stages.accuracy import target_runs
from portkit.targets import specs
from portkit.core.errors import BadParameter, CompileRefused
from portkit.stages.report.stage import build_report
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS, tolerance_for

TPU, NEURON = specs.get("tpu"), specs.get("neuron")


@pytest.fixture(scope="module")
def minilm_batch(minilm, corpus):
    inputs, described = example_batch(minilm, corpus, 2, 32, seed=0)
    return inputs, described


@pytest.fixture(scope="module")
def minilm_report(minilm, minilm_batch, corpus):
    inputs, described = minilm_batch
    return stage.check_accuracy(minilm, inputs, ["neuron", "tpu"],
                                   stage.Options.of({"batch_size": 2}),
                                   corpus=corpus, buckets=[16, 32], description=described,
                                   scope=stage.Scope(task_items=16, compiled=False, progress=False))


# ---------------------------------------------------------------- comparisons
def test_the_reason_is_assert_closes_message():
    tol = tolerance_for(TPU.precision("highest"))
    expected = torch.ones(100)
    assert tol.check(expected.clone(), expected) is None
    actual = expected.clone()
    actual[7] += 1e-3
    reason = tol.check(actual, expected)
    assert reason.startswith("not within float32 tolerance (rtol 1.3e-06, atol 1e-05)")
    assert "Mismatched elements: 1 / 100 (1.0%)" in reason and "at index (7,)" in reason
    found = comparison.compare(actual, expected, tol)
    assert not found["passed"] and found["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert found["atol_to_pass"] == pytest.approx(1e-3 - 1.3e-6, rel=1e-2)


def test_only_real_positions_count():
    torch.manual_seed(0)
    expected = torch.randn(2, 5, 8)
    actual = expected.clone()
    actual[1, 3:] += 100.0                     # garbage at padded positions
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    tol = tolerance_for(TPU.precision("highest"))
    assert comparison.compare(actual, expected, tol, mask)["passed"]
    assert not comparison.compare(actual, expected, tol)["passed"]
    logits = torch.randn(2, 5, 11)
    wrong = logits.clone()
    wrong[1, 3:] = -logits[1, 3:]               # other next tokens, but only at padded positions
    task = comparison.task_metrics(registry.CAUSAL_LM, wrong, logits, mask, DEFAULT_TASK_BOUNDS)
    assert task["positions"] == 8 and task["top1_agreement"] == 1.0
    assert task["decision"] == "inconclusive"       # eight agreeing positions cannot decide a 0.99 budget
    unmasked = comparison.task_metrics(registry.CAUSAL_LM, wrong, logits, None, DEFAULT_TASK_BOUNDS)
    assert unmasked["top1_agreement"] == 0.8


def test_a_pooled_output_as_wide_as_the_sequence_is_not_masked():
    # (batch, hidden) with hidden == seq_len once matched the mask's shape and lost its "padded" columns
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    pooled = torch.arange(8.0).reshape(2, 4)
    assert torch.equal(comparison.real_positions(pooled, mask), pooled)
    moved = pooled.clone()
    moved[1, 3] += 1.0                          # a real feature, in a column the mask would have dropped
    assert comparison.compare(moved, pooled, None, mask)["max_abs"] == 1.0
    assert comparison.real_positions(torch.ones(2, 4, 3), mask).shape == (5, 3)


def test_task_metrics_by_model_kind():
    bounds = DEFAULT_TASK_BOUNDS
    ref = torch.tensor([[[5.0, 4.0, 0.0, -1.0, -2.0, -3.0]] * 4])        # 1 x 4 positions x 6 tokens
    swapped = ref.clone()
    swapped[0, 0, :2] = torch.tensor([4.0, 5.0])                          # the top two change places once
    lm = comparison.task_metrics(registry.CAUSAL_LM, swapped, ref, None, bounds)
    assert lm["top1_agreement"] == 0.75 and lm["top5_agreement"] == 1.0
    assert lm["kl_max"] > 0 and not lm["passed"]
    assert "greedy-token agreement 0.750 [0.301, 0.954] on 4 token positions outside its budget >= 0.99" in lm["reason"]
    # perplexity of the batch's own next tokens: changes when the target's logits move them
    ids = torch.tensor([[0, 1, 0, 1]])
    ppl = comparison.task_metrics(registry.CAUSAL_LM, swapped, ref, None, bounds, {"input_ids": ids})
    assert ppl["perplexity_change"] > bounds["perplexity"] and "perplexity change" in ppl["reason"]
    same = comparison.task_metrics(registry.CAUSAL_LM, ref, ref, None, bounds, {"input_ids": ids})
    assert same["perplexity_change"] == 0 and not any(c["decision"] == "fail" for c in same["checks"])
    assert same["decision"] == "inconclusive"       # four agreeing positions cannot decide a 0.99 budget
    cls = comparison.task_metrics(registry.IMAGE_CLASSIFIER, swapped[0], ref[0], None, bounds)
    assert cls["argmax_agreement"] == 0.75 and not cls["passed"]
    emb = comparison.task_metrics(registry.EMBEDDING, ref[0] * 3, ref[0], None, bounds)
    assert emb["cosine_min"] == pytest.approx(1.0) and emb["passed"]


def test_bad_parameters_name_the_value():
    cases = [({"precision": {"tpu": "fast"}},
              "unknown precision for target tpu 'fast'; choose one of: default, highest"),
             ({"precision": {"trn": "none"}}, "unknown target 'trn'"),
             ({"tolerances": {"float8": [0, 0]}}, "unknown tolerance dtype 'float8'"),
             ({"tolerances": {"bfloat16": [0.1]}}, "give [rtol, atol]"),
             ({"task_bounds": {"cosine": 2}}, "cosine and agreement lie in [0, 1]"),
             ({"task_bounds": {"baseline_factor": 0.5}}, "baseline_factor is >= 1"),
             ({"gpu_numerics": "int8"},
              "unknown gpu_numerics 'int8'; choose one of: fp32, tf32, bf16_autocast, fp16_autocast"),
             ({"default_buckets": [64, 32]}, "ascending"),
             ({"batch_size": 0}, "must be a positive whole number")]
    for kwargs, message in cases:
        with pytest.raises(BadParameter) as info:
            stage.Options.of(kwargs)
        assert message in str(info.value)
    stage.Options.of({"tolerances": {}, "task_bounds": {}, "default_buckets": None})   # the notebook's defaults


def test_runner_runs_the_stage_checks_before_writing(tmp_path):
    assert runner.Stage("accuracy", "04_accuracy.ipynb", "portkit.stages.accuracy.stage", reads=("buckets",),
                        reads_early=("buckets",)) in runner.STAGES
    with pytest.raises(BadParameter, match="precision for target tpu"):
        preflight.plan("minilm", ["tpu"], str(tmp_path / "run"), {"precision": {"tpu": "fast"}}, stages=["accuracy"])
    with pytest.raises(BadParameter, match="default_buckets"):
        preflight.plan("minilm", ["tpu"], str(tmp_path / "run"), {"default_buckets": [64, 32]}, stages=["accuracy"])
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- minilm under each target's numerics
def test_bf16_matmuls_change_minilm_a_little_and_the_task_passes_against_the_gpu_baseline(minilm_report):
    tpu = minilm_report.targets["tpu"]
    assert tpu.chosen.name == "default" and tpu.chosen.target_side == "eager emulation"
    emb = tpu.chosen.outputs["embedding"]
    assert 1e-5 < emb["max_abs"] < 5e-3                 # small, and not zero
    assert not emb["passed"]                            # beyond assert_close's bf16 atol, element-wise ...
    assert tpu.chosen.task["cosine_min"] > 0.9999       # ... while the task sees nothing
    checks = {c["metric"]: c for c in tpu.chosen.task["checks"]}
    assert checks["cosine"]["budget"] == "budget >= 0.999" and checks["cosine"]["passed"]
    assert checks["neighbours"]["value"] >= 0.9 and checks["neighbours"]["n"] == 16   # over the task sample
    assert tpu.chosen.task["sample"]["items"] == 16 and checks["cosine"]["unit"] == "texts"
    assert tpu.chosen.numerics["matmul operands rounded to bfloat16"] == 37
    highest = next(r for r in tpu.others if r.name == "highest")
    assert highest.outputs["embedding"]["max_abs"] == 0 and highest.passed
    assert tpu.chosen.layers["first_failing"]["module"] == "encoder.encoder.layer.0.attention.self.query"
    assert highest.layers["first_failing"] is None and highest.layers["modules_compared"] > 100
    # PASS with its reasons, against which baseline; the element-wise miss is detail, not work
    assert tpu.verdict == "pass" and tpu.findings() == [] and tpu.reasons == []
    assert tpu.details and all("bfloat16 tolerance" in d for d in tpu.details)
    basis = tpu.chosen.basis()
    assert basis.startswith("PASS: lowest cosine to the reference") and "(budget >= 0.999)" in basis
    assert "that of the GPU baseline 'fp32'" in basis and "so the task metrics decide" in basis
    assert any("no change needed for the verdict" in s for s in tpu.suggestions)
    # precision advice: what 'highest' buys (measured) and costs (the vendor's figure, with its source)
    advice = {a["precision"]: a for a in tpu.advice()}
    assert advice["highest"]["relative_matmul_cost"] == 6 and "jax.lax.Precision" in advice["highest"]["cost_source"]
    assert advice["default"]["relative_matmul_cost"] == 1 and "lowest cosine" in advice["default"]["task"]
    assert minilm_report.targets["neuron"].findings() == []


def test_the_gpu_baseline_is_emulated_and_a_target_within_its_factor_is_no_regression(minilm, minilm_batch):
    inputs, _ = minilm_batch
    x = torch.tensor([1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, float("inf")])
    assert numerics.round_to(x, numerics.TF32).tolist() == [1.0, 1.0 + 2 ** -9, float("inf")]   # ties to even
    # today's GPU runs bf16 autocast: the TPU's bf16 operands are within 2x of that error, a PASS against it
    # even under a cosine budget neither meets
    opts = stage.Options.of({"gpu_numerics": "bf16_autocast", "task_bounds": {"cosine": 0.9999999}})
    report = stage.check_accuracy(minilm, inputs, ["tpu"], opts, scope=stage.Scope(
        all_precisions=False, layers=False, progress=False, compiled=False))
    tpu = report.targets["tpu"]
    b = tpu.chosen.baseline
    assert b["gpu_numerics"] == "bf16_autocast" and b["truth"] == "the float64 reference"
    assert 0 < b["ratio"] <= 2 and b["within"] and not tpu.chosen.task["passed"]
    assert tpu.verdict == "pass" and tpu.chosen.basis().startswith("PASS against the GPU baseline 'bf16_autocast'")
    assert report.reference["gpu_baseline"]["gpu_error"] > 1e-4


def test_neuron_settings_and_the_float64_reference(minilm_report):
    neuron = minilm_report.targets["neuron"]
    assert neuron.chosen.name == "none" and neuron.verdict == "pass"
    # 'none' rounds nothing and MiniLM has no float64: emulated, it is the CPU's float32, and its ratio to the GPU
    # baseline says so; the TPU's default precision rounds matmuls, so its ratio is a measurement of the emulation
    assert neuron.chosen.baseline["float32_on_cpu"] and "nothing about the target's hardware" in neuron.chosen.basis()
    assert not minilm_report.targets["tpu"].chosen.baseline["float32_on_cpu"]
    by_name = {r.name: r for r in neuron.others}
    assert set(by_name) == {"matmult", "all"}
    assert 0 < by_name["matmult"].outputs["embedding"]["max_abs"] < by_name["all"].outputs["embedding"]["max_abs"]
    assert by_name["all"].layers["first_failing"]["type"] == "LayerNorm"   # every op rounded: before any matmul
    assert any("keep LayerNorm in float32" in s and "'all'" in s for s in neuron.suggestions)
    ref = minilm_report.reference
    assert ref["float64"] == "float64 eager on the CPU"
    assert 0 < ref["float32_vs_float64"]["embedding"]["max_abs"] < 1e-5


def test_buckets_compare_unpadded_reference_with_the_padded_target(minilm_report):
    for name, t in minilm_report.targets.items():
        assert t.bucket_plan == {"boundaries": [16, 32], "source": "parameter"}
        assert [b["boundary"] for b in t.buckets] == [16, 32]
        for b in t.buckets:
            assert b["texts"] == 2 and 0 <= b["padding"] < 1 and "padded to" in b["target"]
    # fp32 numerics: padding to the bucket must not change real positions beyond float32 tolerance
    assert all(b["passed"] for b in minilm_report.targets["neuron"].buckets)


def test_report_json_contract_and_rendering(minilm_report, tmp_path):
    minilm_report.save(tmp_path / "accuracy.json")
    saved = json.loads((tmp_path / "accuracy.json").read_text())
    assert saved["stage"] == "accuracy" and saved["verdict"] == "pass" and saved["reasons"] == []
    tpu = saved["targets"]["tpu"]
    for key in ("outputs", "buckets", "layers", "precision", "verdict", "reasons", "suggestions", "target_side",
                "details", "basis", "baseline", "advice"):
        assert key in tpu
    assert tpu["precision"]["setting"] == "torch.tpu.Precision.DEFAULT"
    assert tpu["findings"] == []          # an element-wise miss the task does not see is no work
    assert tpu["target"]["mode"] == "emulated" and tpu["target_side"] == "eager emulation"
    assert [p["precision"]["name"] for p in tpu["precisions"]] == ["default", "highest"]
    assert "emulated" in saved["summary"] and "eager emulation" in saved["summary"]
    assert "PASS" in str(minilm_report) and "eager emulation" in minilm_report._repr_html_()
    assert "detail (element-wise assert_close, does not decide)" in str(minilm_report)
    assert "layer.0.attention.self.query" in str(minilm_report.layer_table("tpu"))
    table = " ".join(str(c) for row in minilm_report.precision_table().rows for c in row)
    assert "NEURON_CC_FLAGS" in table and "trainium.html" in table and "budget >= 0.999" in table
    assert len(minilm_report.plot().axes) == 4


def test_compiled_target_side_uses_stage_2s_backend_for_outputs_and_buckets(corpus):
    m = registry.load(fixture_model("tiny_encoder"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"batch_size": 2}),
                                     corpus=corpus, buckets=[16],
                                     scope=stage.Scope(task_items=8, float64_reference=False, progress=False))
    tpu = report.targets["tpu"]      # compiled: auto
    assert stage.compiled_available()
    assert tpu.chosen.target_side == "compiled with portkit_tpu (retraced ATen graph, eager on the CPU)"
    assert tpu.chosen.numerics["matmul operands rounded to bfloat16"] >= 1        # counted in the graph
    assert 0 < tpu.chosen.outputs["pooled"]["max_abs"] < 1e-2
    # Inductor's kernels round at the same points as eager emulation, but sum in their own order
    assert tpu.chosen.compiled_vs_eager["pooled"]["max_abs"] < tpu.chosen.outputs["pooled"]["max_abs"] * 2
    assert tpu.chosen.layers["target_side"] == "eager emulation"                  # hooks need eager modules
    assert all(r.target_side == "eager emulation" for r in tpu.others)
    # buckets run in eager emulation by default (stage 3 compiled and padding-checked them), compiled on request
    assert tpu.buckets[0]["target"] == "eager emulation, padded to 16 tokens; compiled and padding-checked in stage 3"
    assert tpu.buckets[0]["texts"] == 2
    assert "compiled with portkit_tpu" in report.to_dict()["summary"]
    again = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"batch_size": 2}),
                                    corpus=corpus, buckets=[16],
                                    scope=stage.Scope(progress=False, float64_reference=False, task_items=8,
                                                         all_precisions=False, layers=False, compiled_buckets=True))
    bucket = again.targets["tpu"].buckets[0]
    assert bucket["target"] == "compiled with portkit_tpu (retraced ATen graph, eager on the CPU), padded to 16 tokens"
    for name, found in tpu.buckets[0]["outputs"].items():    # the same numerics rules, compiled or eager
        assert found["max_abs"] == pytest.approx(bucket["outputs"][name]["max_abs"], rel=0.5, abs=1e-6)
    with pytest.raises(BadParameter, match="runs eagerly only"):
        stage.check_accuracy(m, inputs, ["tpu"], scope=stage.Scope(
            compiled=True, emulation=numerics.wrong_op_TESTING_ONLY(), progress=False))


def test_compiled_calls_take_the_plans_batch_and_keep_every_row(corpus, tmp_path):
    inputs = {"input_ids": torch.arange(12).reshape(3, 4), "attention_mask": torch.ones(3, 4, dtype=torch.long)}
    chunks = list(target_runs.chunks(inputs, 2))
    assert [tuple(c["input_ids"].shape) for c in chunks] == [(2, 4), (2, 4)]
    assert torch.equal(chunks[1]["input_ids"], inputs["input_ids"][[2, 2]])     # filled with a real row
    assert next(target_runs.chunks(inputs, None)) is inputs
    (tmp_path / "buckets.json").write_text(json.dumps({"targets": {"tpu": {"chosen": {
        "planner": "auto", "boundaries": [64, 16], "batch_sizes": [1, 2, 4]}}}}))
    plan = stage.bucket_plan(tmp_path, ["tpu"])["tpu"]
    assert plan.boundaries == [16, 64] and plan.batch == 4
    m = registry.load(fixture_model("tiny_encoder"))
    batch, _ = example_batch(m, corpus, 3, 16, seed=0)
    side = target_runs.TargetSide(specs.detect("tpu"), m.module.eval(), numerics.emulate, True)
    whole = side.run(batch, TPU.default_precision, compiled=True)[0]
    ones = side.run(batch, TPU.default_precision, compiled=True, batch=1)[0]
    pairs = side.run(batch, TPU.default_precision, compiled=True, batch=2)[0]
    for name in whole:
        assert ones[name].shape == whole[name].shape == pairs[name].shape
        torch.testing.assert_close(ones[name], whole[name], rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(pairs[name], ones[name], rtol=1e-2, atol=1e-3)


def test_the_targets_compiled_in_one_dynamo_pass_give_what_each_gives_alone(corpus):
    m = registry.load(fixture_model("tiny_encoder"))
    module, names = m.module.eval(), ["neuron", "tpu"]
    batch, _ = example_batch(m, corpus, 3, 16, seed=0)
    shared = target_runs.SharedCompile.for_targets(module, names, {"neuron": "matmult"}, compiled=True)
    together = {n: target_runs.TargetSide(specs.detect(n), module, numerics.emulate, True, shared) for n in names}
    chosen = {n: shared.precisions[n] for n in names}
    got = {n: together[n].run(batch, chosen[n], compiled=True, batch=1) for n in names}
    assert all(len(b.checks) == 1 for b in shared.backends.values())     # one shape, one compile a target
    assert target_runs.SharedCompile.for_targets(module, ["tpu"], None, compiled=True) is None
    for n in names:
        alone = target_runs.TargetSide(specs.detect(n), module, numerics.emulate, True)
        out, _, _, changed, _ = alone.run(batch, chosen[n], compiled=True, batch=1)
        assert got[n][3] == changed and changed                          # each target's own rules, recorded
        for key in out:
            torch.testing.assert_close(got[n][0][key], out[key], rtol=0, atol=0)
    assert got["neuron"][3] != got["tpu"][3]
    # a target whose compiler refuses the graph is refused alone, in its own turn; the other runs compiled
    shared = target_runs.SharedCompile.for_targets(module, names, None, compiled=True)

    class Refusing:
        checks = []

        def __call__(self, gm, example_inputs):
            raise CompileRefused("refused on purpose", None)
    shared.counters["neuron"].backend = Refusing()
    sides = {n: target_runs.TargetSide(specs.detect(n), module, numerics.emulate, True, shared) for n in names}
    runs = {n: sides[n].run(batch, shared.precisions[n], compiled=True, batch=1) for n in names}
    assert "refused on purpose" in sides["neuron"].refused.message and sides["tpu"].refused is None
    assert runs["tpu"][3] == got["tpu"][3] and "int64 ops run as int32" in runs["neuron"][3]   # eager emulation
    assert sides["neuron"].label(True).startswith("eager emulation (compiled path refused: refused on purpose")


# ---------------------------------------------------------------- a deliberately wrong target
@pytest.mark.parametrize("op,call,module", [
    ("aten::gelu", 3, "encoder.encoder.layer.2.intermediate.intermediate_act_fn"),
    ("aten::addmm", 8, "encoder.encoder.layer.1.attention.self.key"),
])
def test_a_wrong_op_fails_the_stage_and_is_named(minilm, minilm_batch, op, call, module):
    inputs, _ = minilm_batch
    wrong = numerics.wrong_op_TESTING_ONLY(op, call=call, error=5.0)
    report = stage.check_accuracy(minilm, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                     scope=stage.Scope(all_precisions=False, float64_reference=False,
                                                          emulation=wrong, progress=False))
    tpu = report.targets["tpu"]
    assert tpu.verdict == "fail" and report.verdict == "fail"
    assert tpu.chosen.layers["first_failing"]["module"] == module
    assert "TESTING_ONLY" in tpu.chosen.target_side
    (reason,) = tpu.chosen.reasons
    assert reason.startswith("task: lowest cosine to the reference") and "outside its budget >= 0.999" in reason
    assert f"the error enters at `{module}`" in tpu.reasons[0]            # the metric, its budget, the module
    assert "where the GPU baseline 'fp32' has none" in reason             # no float64 run: against float32
    (finding,) = tpu.findings()
    assert finding.severity == "blocker" and module in finding.message
    assert any(module in s for s in tpu.suggestions)
    assert not any("tolerances=" in s for s in tpu.suggestions)   # a float32 miss is never "loosen the tolerance"


def test_a_float64_classifier_whose_cast_to_float32_changes_a_decision():
    m = registry.load(fixture_model("near_tie_model"))    # two logits 1e-12 apart: a tie in float32
    inputs = {"pixel_values": torch.ones(4, 3, dtype=torch.float64)}
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                     scope=stage.Scope(all_precisions=False, compiled=False, progress=False))
    tpu = report.targets["tpu"]
    assert report.reference["description"].startswith("float64 eager")
    assert tpu.chosen.float64_ops and tpu.chosen.task["argmax_agreement"] == 0.0
    assert tpu.verdict == "fail"
    assert "top-1 agreement 0.000 [0.000, 0.490] on 4 inputs built by the caller outside its budget >= 0.99" \
        in tpu.reasons[0]
    assert "where the GPU baseline 'fp32' has none" in tpu.reasons[0]    # the GPU runs float64 as written
    assert not tpu.chosen.baseline["float32_on_cpu"]       # 'highest' rounds nothing, but float64 ran as float32


# ---------------------------------------------------------------- other model kinds
def test_float64_running_as_float32_is_found_in_its_module(corpus):
    m = registry.load(fixture_model("float64_model"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                     scope=stage.Scope(all_precisions=False, compiled=False, progress=False))
    tpu = report.targets["tpu"].chosen
    rows = {r["module"]: r for r in tpu.layers["modules"]}
    assert rows["model.head"]["float64_ops"]["aten::addmm"] == 1 and not rows["model.body"]["float64_ops"]
    assert rows["model.head"]["max_abs"] > 0 and tpu.outputs["scores"]["max_abs"] > 0
    assert tpu.float64_ops["aten::addmm"] == 1
    assert any(s.startswith("avoid float64 in `model.head`") for s in report.targets["tpu"].suggestions)
    assert tpu.task["argmax_agreement"] == 1.0


def test_a_float64_models_error_is_split_into_the_cast_and_the_bf16_rounding(corpus, tmp_path):
    m = registry.load(fixture_model("float64_encoder_model"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(m, inputs, ["tpu"], scope=stage.Scope(all_precisions=False, compiled=False,
                                                                              progress=False))
    # the reference is the float64 model: no float32-against-float64 comparison that can only read 0
    assert report.reference["description"].startswith("float64 eager")
    assert report.reference["float32_vs_float64"] is None
    tpu = report.targets["tpu"]
    cast, bf16 = tpu.chosen.error_by_cause
    assert cast["cause"] == "float64 run as float32" and bf16["cause"].startswith("precision 'default' rounding")
    cast_err, bf16_err = cast["outputs"]["pooled"]["max_abs"], bf16["outputs"]["pooled"]["max_abs"]
    total = tpu.chosen.outputs["pooled"]["max_abs"]
    assert 0 < cast_err < 1e-6 < bf16_err and bf16_err > 100 * cast_err     # bf16 operands dominate
    assert abs(total - bf16_err) <= cast_err * 2                              # the two add up to the whole
    advice = [s for s in tpu.suggestions if s.startswith("avoid float64")]
    assert advice and all(f"alone on `pooled`: max abs error {cast_err:.2g} " in s for s in advice)
    assert not any(f"max abs error {total:.2g}" in s for s in advice)
    report.save(tmp_path / "accuracy.json")                   # the migration report shows both, each by cause
    metrics = build_report(run_dir=tmp_path).to_dict()["targets"]["tpu"]["metrics"]["accuracy"]
    assert metrics["max abs error from float64 run as float32"] == f"{cast_err:.2g}"
    assert metrics["max abs error from precision 'default' rounding"] == f"{bf16_err:.2g}"


def test_a_compile_the_target_refuses_is_a_blocker_and_judged_eagerly(corpus, tmp_path):
    m = registry.load(fixture_model("dynamic_after_break_model"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"batch_size": 2}),
                                     corpus=corpus, buckets=[16],
                                     scope=stage.Scope(task_items=8, all_precisions=False, float64_reference=False,
                                                          progress=False))  # compiled: auto
    tpu = report.targets["tpu"]
    refused = tpu.compile_refused
    assert refused["backend"] == "portkit_tpu" and refused["message"].startswith(TPU.dynamic_shape_error)
    assert "fixtures/models.py:" in refused["where"] and "in torch_dynamo_resume_in_forward" in refused["where"]
    label = f"eager emulation (compiled path refused: {TPU.dynamic_shape_error})"
    assert tpu.chosen.target_side == label and tpu.chosen.compiled_vs_eager is None
    assert tpu.buckets[0]["target"].startswith(label) and tpu.buckets[0]["texts"] == 2
    assert tpu.chosen.numerics["matmul operands rounded to bfloat16"] >= 1      # the target's numerics, eagerly
    blocker = tpu.findings()[0]
    assert (blocker.kind, blocker.severity) == ("compile_refused", specs.BLOCKER)
    assert TPU.dynamic_shape_error in blocker.message and refused["where"] in blocker.message
    report.save(tmp_path / "accuracy.json")
    saved = json.loads((tmp_path / "accuracy.json").read_text())["targets"]["tpu"]
    assert saved["compile_refused"] == refused and saved["findings"][0]["kind"] == "compile_refused"
    assert "BLOCKER" in saved["summary"]


def test_only_a_refusal_is_caught_on_the_compiled_path():
    refused = CompileRefused("TPU backend: does not support dynamic shape (detail). More.",
                             {"text": "model.py:3 in forward: x"})
    wrapped = RuntimeError("backend raised")
    wrapped.__cause__ = refused
    found = target_runs.refusal(wrapped, "portkit_tpu", native=False)
    assert found.where == "model.py:3 in forward: x" and found.short == "TPU backend: does not support dynamic shape"
    assert target_runs.refusal(RuntimeError("an Inductor bug"), "portkit_tpu", native=False) is None


def test_language_model_metrics_and_image_classifier_without_buckets(corpus):
    gpt2 = registry.load("gpt2")
    inputs, _ = example_batch(gpt2, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(gpt2, inputs, ["tpu"], scope=stage.Scope(
        all_precisions=False, float64_reference=False, compiled=False, progress=False))
    task = report.targets["tpu"].chosen.task
    assert task["positions"] == int(inputs["attention_mask"].sum())
    assert task["top1_agreement"] > 0.9 and task["top5_agreement"] >= task["top1_agreement"] and task["kl_mean"] > 0
    vit = registry.load("vit")
    inputs, _ = example_batch(vit, None, 2, 0, seed=0)
    opts = stage.Options.of({"precision": {"neuron": "matmult"}})
    report = stage.check_accuracy(vit, inputs, ["neuron"], opts, corpus=corpus, scope=stage.Scope(
        task_items=4, all_precisions=False, layers=False, compiled=False, progress=False))
    t = report.targets["neuron"]
    assert t.chosen.task["decisions"] == 4 and t.chosen.layers is None     # decided on the crops of the task sample
    assert t.chosen.task["sample"]["source"].startswith("real image crops")
    assert t.buckets[0]["skipped"].startswith("no buckets: the model takes one input shape")


def test_float32_emulation_keeps_in_place_and_view_semantics(corpus):
    # T5 builds its decoder inputs and position buckets with int64 views and in-place ops; a mode that
    # casts int64 to int32 must still write through them (it once lost them: top-1 agreement 0.07).
    t5 = registry.load("t5")
    inputs, _ = example_batch(t5, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(t5, inputs, ["neuron"], scope=stage.Scope(
        all_precisions=False, layers=False, float64_reference=False, compiled=False, progress=False))
    neuron = report.targets["neuron"].chosen
    assert neuron.numerics["int64 ops run as int32"] > 0
    assert neuron.passed and neuron.outputs["logits"]["max_abs"] == 0 and neuron.task["top1_agreement"] == 1.0


def test_bucket_plan_reads_stage_3(tmp_path, capsys):
    (tmp_path / "buckets.json").write_text(json.dumps(
        {"stage": "buckets", "targets": {"tpu": {"chosen": {"planner": "quantile", "boundaries": [48, 16],
                                                              "batch_sizes": None, "why": "test"}}}}))
    plans = stage.bucket_plan(tmp_path, ["tpu", "neuron"])
    assert plans["tpu"].boundaries == [16, 48] and "stage 3" in plans["tpu"].source
    assert plans["neuron"].boundaries == list(stage.DEFAULT_BUCKETS) and "parameter" in plans["neuron"].source
    assert "target tpu: buckets [16, 48]" in capsys.readouterr().out
    (tmp_path / "buckets.json").write_text('{"targets": {"tpu": {"chosen": {"boundaries": [16, "48"]}}}}')
    with pytest.raises(results.UnreadableResult, match=r"targets.tpu.chosen.boundaries is \[16, '48'\]"):
        stage.bucket_plan(tmp_path, ["tpu"])


# ---------------------------------------------------------------- native mode
def _detect_native(monkeypatch, name, **changes):
    """targets.detect() answers native for `name` (its Target with `changes`), as on a host with the device."""
    detect, target = specs.detect, dataclasses.replace(specs.get(name), **changes)
    native = specs.DetectedTarget(target, "native", "forced native for a test", detect(name).op_table)
    monkeypatch.setattr(specs, "detect", lambda n: native if n == name else detect(n))
    return native


@pytest.mark.parametrize("name,eager,compiled", [
    ("tpu", "native on tpu, eager", "compiled with tpu (on tpu)"),
    ("neuron", "native on neuron, eager", "compiled with neuron (on neuron)"),
])
def test_native_labels_name_the_device_and_the_vendor_backend(monkeypatch, capsys, name, eager, compiled):
    # The strings native mode writes, checked without the device: nothing here runs on it.
    native = _detect_native(monkeypatch, name)
    side = target_runs.TargetSide(native, torch.nn.Identity(), numerics.emulate, True)
    assert (side.label(False), side.label(True)) == (eager, compiled)
    assert stage.target_side([name], compiled=True) is True
    assert capsys.readouterr().out == (f"target {name}: outputs and buckets {compiled}; per-layer hooks and other "
                                       "precisions: eager on the device\n")


def test_native_mode_measures_the_precision_in_effect_on_the_device(monkeypatch, corpus):
    # The whole native path on this CPU: the TPU entry with its device and vendor backend swapped for
    # ones this host has ("cpu", Dynamo's "eager"), so every step but the device itself runs.
    _detect_native(monkeypatch, "tpu", device="cpu", backend="eager")
    m = registry.load(fixture_model("tiny_encoder"))
    inputs, _ = example_batch(m, corpus, 2, 16, seed=0)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"batch_size": 2}),
                                     corpus=corpus, buckets=[16],
                                     scope=stage.Scope(task_items=8, float64_reference=False, progress=False))
    tpu = report.targets["tpu"]      # compiled: auto
    assert tpu.target["mode"] == "native" and tpu.others == []     # a precision is a flag set before start
    assert tpu.chosen.target_side == "compiled with eager (on cpu)"
    assert tpu.chosen.layers["target_side"] == "native on cpu, eager"
    assert tpu.chosen.numerics == {} and tpu.chosen.float64_ops == {}     # nothing emulated
    assert tpu.buckets[0]["target"] == "compiled with eager (on cpu), padded to 16 tokens"
    assert tpu.summary().startswith("tpu (native, compiled with eager (on cpu), precision default): PASS")
    assert tpu.suggestions == ["no change needed at precision 'default': task metrics hold on the batch and "
                               "every bucket"]


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_tpu", "tpu"), reason="needs torch-tpu and a TPU")
def test_native_tpu_compares_the_device(minilm, minilm_batch):
    report = stage.check_accuracy(minilm, minilm_batch[0], ["tpu"], scope=stage.Scope(progress=False))
    tpu = report.targets["tpu"]
    assert tpu.target["mode"] == "native" and tpu.others == []
    assert tpu.chosen.target_side == "compiled with tpu (on tpu)"
    assert tpu.chosen.layers["target_side"] == "native on tpu, eager"


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_neuronx", "neuron"),
                    reason="needs torch-neuronx and a Trainium device")
def test_native_neuron_compares_the_device(minilm, minilm_batch):
    report = stage.check_accuracy(minilm, minilm_batch[0], ["neuron"], scope=stage.Scope(progress=False))
    neuron = report.targets["neuron"]
    assert neuron.target["mode"] == "native" and neuron.others == []
    assert neuron.chosen.target_side == "compiled with neuron (on neuron)"
    assert neuron.chosen.layers["target_side"] == "native on neuron, eager"


def test_a_plan_of_many_buckets_is_checked_on_a_spread_sample_the_largest_included(corpus):
    from portkit.corpora.corpus import example_batch
    from portkit.models import registry
    m = registry.load(fixture_model("tiny_encoder"))        # which buckets are checked does not depend on the model
    boundaries = list(range(16, 16 * 21, 16))            # 20 buckets: more than the checked sample
    inputs, _ = example_batch(m, corpus, batch_size=2, seq_len=32)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"batch_size": 2}),
                                     corpus=corpus, buckets=boundaries, scope=stage.Scope(
                                         task_items=8, all_precisions=False, layers=False, float64_reference=False,
                                         progress=False))
    rows = report.targets["tpu"].buckets
    checked = [r for r in rows if "skipped" not in r or not r["skipped"].startswith("not checked")]
    assert len(rows) == 20 and len(checked) == settings.MAX_CHECKED_BUCKETS
    assert checked[0]["boundary"] == 16 and checked[-1]["boundary"] == boundaries[-1]
    assert "8 of the plan's 20 buckets" in next(r["skipped"] for r in rows if r not in checked)


class _Named(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return {"y": self.linear(x)}


def test_the_float64_reference_copies_the_model_once_for_every_batch_it_runs(monkeypatch):
    torch.manual_seed(0)
    module = _Named()
    copies = []
    real = target_runs.copy.deepcopy
    monkeypatch.setattr(target_runs.copy, "deepcopy", lambda m: copies.append(m) or real(m))
    reference = target_runs.Float64Reference(module)
    for rows in (2, 5):
        x = torch.randn(rows, 4)
        out, note = reference({"x": x})
        assert note == "float64 eager on the CPU" and out["y"].dtype == torch.float64
        torch.testing.assert_close(out["y"], x.double() @ module.linear.weight.double().T + module.linear.bias.double())
    assert len(copies) == 1 and module.linear.weight.dtype == torch.float32     # the model itself is not touched


@pytest.mark.parametrize("gpu_numerics", ["fp32", "tf32"])
def test_the_gpu_baseline_is_the_model_run_under_the_gpu_setting(gpu_numerics):
    torch.manual_seed(0)
    module, x = _Named(), torch.randn(3, 4)
    plain = target_runs.forward(module, {"x": x})
    with torch.no_grad(), numerics.emulate(specs.get("cuda"), numerics.GPU_NUMERICS[gpu_numerics]):
        expect = module(x=x)
    opts = stage.Options.of({"gpu_numerics": gpu_numerics, "task_bounds": {"baseline_factor": 2.0}})
    got = reference.measure_baseline(module, {"x": x}, plain, None, "y", None, opts)["outputs"]   # no float64 run
    assert torch.equal(got["y"], expect["y"])
    assert torch.equal(got["y"], plain["y"]) == (gpu_numerics == "fp32")   # fp32: the model's own outputs


def test_an_element_wise_difference_names_its_output():
    """Outputs beyond assert_close's tolerance while the task holds: the reason names the output its max abs error
    is on (each output has its own error: the report's embedding figure is not the hidden state's)."""
    import types
    from portkit.stages.accuracy import advice
    tol = {"dtype": "bfloat16"}
    chosen = types.SimpleNamespace(task={"passed": True}, outputs={
        "embedding": {"passed": False, "max_abs": 8.6e-4, "tolerance": tol},
        "last_hidden_state": {"passed": False, "max_abs": 0.011, "tolerance": tol}})
    (line,) = advice._element_wise_only(chosen)
    assert "(max abs 0.011, on output 'last_hidden_state')" in line
