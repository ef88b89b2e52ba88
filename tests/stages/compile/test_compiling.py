import dataclasses
import json
import re

import pytest
import torch

from conftest import FIXTURES, fixture_model
from portkit.targets import backends
from portkit.stages.compile.stage import (COMPILE_SHAPES, Options, Requests, StormSettings, check_fixed_shape,
    check_fixed_shapes, compile_model, find_graph_breaks, make_requests, recompile_storm, recompile_storms)
from portkit.planning import economics
from portkit.models import registry
from portkit.targets import numerics
from portkit.core import availability
from portkit.run import runner
from portkit.run import notebook_parameters
from portkit.run import preflight
from portkit.targets import specs
from portkit.core.errors import BadParameter

MIGRATION = ("neuron", "tpu")


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(FIXTURES.read_text().splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def small():
    return registry.load(fixture_model("small_encoder_model"))


@pytest.fixture(scope="module")
def stream(small, corpus):
    # Real texts at their own lengths, truncated at 24 tokens: lengths 21, 17, 24, 10, 24 (one repeat).
    return make_requests(small, corpus, n=5, max_tokens=24, seed=2, horizon=200)


def fake_xla(model, shape, topology, dtype):
    """A stand-in for xla_compile.compile_seconds: 1 s + 0.1 s per token (these tests are not about XLA)."""
    return 1.0 + shape["seq"] / 10, "XLA compile for v5e:1x1, measured now (test stand-in)"


def costs_for(m, lengths=(8, 16, 24)):
    return {"tpu": economics.xla_model(m, list(lengths), measure=fake_xla),
            "neuron": economics.neuron_estimate(m.parameters)}


@pytest.fixture(scope="module")
def report(small, stream):
    # A default recompile limit of 2 stands in for Dynamo's 8: the storm must still pay every compile.
    with torch._dynamo.config.patch(recompile_limit=2):
        return compile_model(small, stream, MIGRATION, Options.of({"seq_len": 24}),
                                       storm=StormSettings(progress=False), costs=costs_for(small))


def test_compiles_equal_distinct_shapes_without_bucketing(report, stream):
    shapes = [tuple(s) for s in stream.shapes()]
    assert len(set(shapes)) < len(shapes), "the stream needs a repeated shape for this test to bite"
    for name in MIGRATION:
        storm = report.storms[name]
        assert storm.target["mode"] == "emulated" and storm.backend == f"portkit_{name}"
        assert len(storm.compiles) == storm.distinct_shapes() == len(set(shapes))
        seen = set()
        for row, shape in zip(storm.requests, shapes):
            assert row["new_compiles"] == (0 if shape in seen else 1), row
            seen.add(shape)
        # Each recompile names the guard that failed, in Dynamo's own words.
        second = storm.requests[1]
        assert re.fullmatch(rf"tensor '\w+' size mismatch at index 1\. expected {shapes[0][1]}, actual {shapes[1][1]}",
                            second["reason"]), second["reason"]
        assert storm.requests[0]["reason"] is None
        s = storm.seconds()
        assert s["compiling"] > s["running"] > 0


def test_the_raised_limit_pays_every_compile_and_reports_the_eager_fallback(report, stream):
    storm = report.storms["tpu"]
    assert storm.default_limit == 2 and storm.recompile_limit > len(stream.inputs)
    assert len(storm.compiles) == 4                     # all paid, past the default limit of 2
    assert storm.eager_from() == 2                      # the third distinct length (24) is the first eager one
    assert "request 3 and every later new shape would silently run eagerly" in storm.summary()
    projection = report.projection("tpu")
    assert projection["requests"] == 200 and projection["distinct_shapes"] >= 4
    cost = report.costs["tpu"]
    distinct = {tuple(s) for s in stream.to_dict()["stream_shapes"]}
    assert projection["compile_seconds"] == pytest.approx(sum(cost.seconds(s[1]) for s in distinct))
    # the measured storm is priced with the target's cost, shape by shape, and says where it came from
    priced = report.priced("tpu")
    assert priced["seconds"] == pytest.approx(sum(1.0 + r["shape"][1] / 10 for r in storm.requests
                                                  if r["new_compiles"]), rel=0.05)
    assert priced["kind"] == "measured XLA" and "interpolated" in priced["source"]
    assert "estimate, not measured" in report.priced("neuron")["source"]


def test_fixed_shape_compiles_once_and_fail_on_recompile_proves_it(report, stream):
    for name in MIGRATION:
        fixed = report.fixed[name]
        assert fixed.shape == {"batch": 1, "seq": 24, "dims": [1, 24]}
        assert fixed.warmup_compiles == 1 and fixed.compiles_after == 0
        assert fixed.requests == len(stream.inputs)
        assert "fail_on_recompile" in fixed.armed     # a new shape raised instead of compiling


def test_a_request_outside_the_fixed_shape_is_counted_with_its_guard(report, small, stream):
    # The last request batches two texts: padded to the same length, it is still a new shape.
    uneven = Requests([*stream.texts[:2], stream.texts[2] + stream.texts[3]], [], "test", small)
    fixed = check_fixed_shape(small, uneven, "tpu", Options.of({"seq_len": 24}))
    assert fixed.warmup_compiles == 1 and fixed.compiles_after == 1 and fixed.requests == 3
    (late,) = fixed.late
    assert late["request"] == 2 and late["shape"] == [2, 24] and fixed.compiles[-1].request == 2
    assert re.fullmatch(r"tensor '\w+' size mismatch at index 0\. expected 1, actual 2", late["reason"]), late
    assert "fail_on_recompile" in fixed.armed            # still armed after the late compile was paid
    saved = json.loads(json.dumps(dataclasses.replace(report, fixed={**report.fixed, "tpu": fixed}).to_dict()))
    (finding,) = [f for f in saved["targets"]["tpu"]["findings"] if f["kind"] == "recompile_after_warmup"]
    assert "request 3 (shape 2x24)" in finding["message"] and late["reason"] in finding["message"]
    assert saved["targets"]["tpu"]["fixed"]["compiles_after"] == 1
    assert not [f for f in report.findings("tpu") if f["kind"] == "recompile_after_warmup"]   # one shape: none


def test_the_targets_share_one_dynamo_pass_and_find_what_each_alone_finds(small, stream, monkeypatch):
    uneven = Requests([*stream.texts[:2], stream.texts[2] + stream.texts[3]], [], "test", small)
    opts = Options.of({"seq_len": 24})
    both = check_fixed_shapes(small, uneven, MIGRATION, opts)
    for name in MIGRATION:
        alone, shared = check_fixed_shape(small, uneven, name, opts), both[name]
        assert shared.backend == alone.backend and shared.target["name"] == name
        assert (shared.warmup_compiles, shared.compiles_after, shared.requests) == (1, 1, 3)
        assert [(e.request, e.shapes) for e in shared.compiles] == [(e.request, e.shapes) for e in alone.compiles]
        assert [(x["request"], x["reason"]) for x in shared.late] == [(x["request"], x["reason"]) for x in alone.late]
        assert "fail_on_recompile" in shared.armed
        assert shared.compiles[0].check.numerics == alone.compiles[0].check.numerics   # each target's own rules
    assert both["tpu"].compiles[0].check.numerics != both["neuron"].compiles[0].check.numerics
    # a target that refuses the graph fails alone; the other is checked as before
    from portkit.stages.compile import fixed_shape
    from portkit.core.errors import CompileRefused
    real = fixed_shape.selection.backend_for

    class Refusing(backends.EmulatedBackend):
        def __call__(self, gm, example_inputs, options=None):
            raise CompileRefused("refused on purpose", None)

    def backend_for(detected, backend, precision=None, **kwargs):
        chosen, device = real(detected, backend, precision, **kwargs)
        return (Refusing(chosen.target) if detected.name == "neuron" else chosen), device
    monkeypatch.setattr(fixed_shape.selection, "backend_for", backend_for)
    both = check_fixed_shapes(small, uneven, MIGRATION, opts)
    assert both["neuron"].failure["kind"] == "refused" and both["neuron"].requests == 0
    assert both["tpu"].failure is None and both["tpu"].requests == 3 and "fail_on_recompile" in both["tpu"].armed


def test_report_json_keeps_the_contract(report, tmp_path):
    report.save(tmp_path / "compile.json")
    saved = json.loads((tmp_path / "compile.json").read_text())
    assert saved["stage"] == "compile"
    for name in MIGRATION:
        t = saved["targets"][name]
        assert t["target"]["mode"] == "emulated"
        assert set(t["compile_seconds"]) >= {"first", "median", "count", "kind", "source"}
        assert t["compile_seconds"]["count"] == len(report.storms[name].compiles)
        assert t["compile_seconds"]["first"] > 0 and t["compile_seconds"]["median"] > 0
        assert t["compile_cost"]["kind"] == {"tpu": "measured XLA", "neuron": "estimate"}[name]
        assert t["priced_storm"]["compiles"] == len(report.storms[name].compiles)
        assert t["fixed_shape"] == {"batch": 1, "seq": 24, "dims": [1, 24]}
        assert f"{name} (emulated, portkit_{name})" in t["summary"]
    assert saved["summary"].count("emulated") == 2


def test_report_renders(report):
    html = report._repr_html_()
    assert "emulated" in html and "portkit_tpu" in html
    text = str(report)
    assert "compiles" in text and "fail_on_recompile" in text
    assert "size mismatch" in str(report.storms["neuron"].table())
    fig = report.plot()
    assert len(fig.axes) == 3


def test_precision_rules_are_applied_in_the_compiled_graph(small):
    inputs = small.encode(["Return the sum of a and b.", "Open the file."], pad_to=12)
    module = small.module
    with torch.no_grad():
        plain = module(**inputs)["out"]
        with numerics.emulate(specs.get("tpu")):
            emulated = module(**inputs)["out"]
        torch._dynamo.reset()
        compiled = torch.compile(module, backend="portkit_tpu", dynamic=False)(**inputs)["out"]
        check = backends.REGISTERED["tpu"].checks[-1]
        assert check.numerics == {"matmul operands rounded to bfloat16": 2, "attention products rounded to bfloat16": 1}
        torch.testing.assert_close(compiled, emulated, rtol=1e-5, atol=1e-5)
        assert (compiled - plain).abs().max() > 20 * (compiled - emulated).abs().max()
        # The rounded weights are computed outside the graph: a weight changed in place is rounded again.
        weight = module.model.out.weight
        weight.mul_(2)
        with numerics.emulate(specs.get("tpu")):
            emulated_after = module(**inputs)["out"]
        compiled_after = torch.compile(module, backend="portkit_tpu", dynamic=False)(**inputs)["out"]
        weight.mul_(0.5)
        torch.testing.assert_close(compiled_after, emulated_after, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(compiled_after, compiled)
        # Neuron's --auto-cast=matmult rounds matmul results: the head's output is exactly bf16.
        torch._dynamo.reset()
        matmult = torch.compile(module, backend="portkit_neuron", dynamic=False,
                                options={"precision": "matmult"})(**inputs)["out"]
        assert torch.equal(matmult, matmult.bfloat16().float()) and not torch.equal(plain, plain.bfloat16().float())
        torch._dynamo.reset()


@pytest.mark.parametrize("name", MIGRATION)
def test_dynamic_shapes_are_refused_with_the_vendors_words(small, name):
    t = specs.get(name)
    inputs = small.encode(["Return the sum of a and b."], pad_to=10)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as caught:
        torch.compile(small.module, backend=t.emulated_backend, dynamic=True)(**inputs)
    torch._dynamo.reset()
    assert t.dynamic_shape_error in str(caught.value) and "dynamic=False" in str(caught.value)


def test_data_dependent_sizes_are_refused_where_they_happen():
    m = registry.load(fixture_model("data_dependent_model"))
    found = find_graph_breaks(m, m.encode(["def f(x): return x", "Sum."], pad_to=12), MIGRATION)
    assert found.fullgraph["ok"]                       # fullgraph=True captures it with unbacked sizes ...
    for name in MIGRATION:                             # ... which both targets refuse, at the user's line
        check = found.checks[name]
        assert check["refused"].startswith(specs.get(name).dynamic_shape_error)
        assert f"models.py:{line_of('kept = h[mask.bool()]')}" in check["refused"]
    assert "neuron and tpu refuse" in found.summary()


def test_training_graphs_compile_forward_and_backward_and_dynamic_ones_are_refused(small):
    inputs = small.encode(["Return the sum of a and b."], pad_to=8)
    backend = backends.emulated_backend("neuron")
    torch._dynamo.reset()
    out = torch.compile(small.module, backend=backend, dynamic=False)(**inputs)
    next(iter(out.values())).float().mean().backward()
    assert [c.part for c in backend.checks] == ["joint", "forward", "backward"]
    assert all(p.grad is not None for p in small.module.parameters() if p.requires_grad)
    small.module.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=specs.get("neuron").dynamic_shape_error):
        torch.compile(small.module, backend="portkit_neuron", dynamic=True)(**inputs)
    torch._dynamo.reset()


def test_graph_break_is_found_at_its_line():
    m = registry.load(fixture_model("branch_model"))
    found = find_graph_breaks(m, m.encode(["Return x."], pad_to=6), MIGRATION)
    branch = line_of("if h.mean() > 0:")
    assert len(found.breaks) == 1
    where = found.breaks[0]["where"]
    assert where["file"] == str(FIXTURES) and where["line"] == branch
    assert not found.fullgraph["ok"]
    assert found.fullgraph["message"] == "Data-dependent branching" and found.fullgraph["where"]["line"] == branch
    assert f"models.py:{branch}" in str(found)


def test_a_model_that_cannot_compile_gives_a_report(corpus):
    m = registry.load(fixture_model("branch_model"))
    stream = make_requests(m, corpus, n=2, max_tokens=16, seed=0, horizon=10)
    report = compile_model(m, stream, ["tpu"], Options.of({"seq_len": 8, "fullgraph": True}),
                                     storm=StormSettings(progress=False), costs=costs_for(m))
    storm, fixed = report.storms["tpu"], report.fixed["tpu"]
    assert storm.failure["kind"] == "graph break" and storm.failure["where"]["line"] == line_of("if h.mean() > 0:")
    assert not storm.compiles and not storm.requests
    assert "cannot compile: graph break: Data-dependent branching" in storm.summary()
    assert fixed.failure["message"] == "Data-dependent branching"
    assert json.loads(json.dumps(report.to_dict(), default=str))["targets"]["tpu"]["compile_seconds"]["count"] == 0


def test_an_op_missing_from_the_table_is_reported_with_its_line():
    m = registry.load(fixture_model("svd_model"))
    inputs = m.encode(["Return the sum of a and b."], pad_to=8)
    found = find_graph_breaks(m, inputs, MIGRATION)
    svd = next(o for o in found.checks["neuron"]["not_lowered"] if o["op"] == "aten::_linalg_svd")
    assert svd["status"] == "cpu_fallback" and svd["where"][0]["line"] == line_of("torch.linalg.svd")
    assert not any(o["op"] == "aten::_linalg_svd" for o in found.checks["tpu"]["not_lowered"])
    # The compiling backend reports the same, and still runs the checked graph.
    counter = backends.CompileCounter(backends.emulated_backend("neuron"))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(m.module, backend=counter, dynamic=False)(**inputs)["singular_values"]
    torch._dynamo.reset()
    assert out.shape == (1, 8)
    assert [o["op"] for o in counter.events[0].check.not_lowered] == ["aten::_linalg_svd"]


def test_unknown_backend_names_fail_with_the_valid_names():
    with pytest.raises(BadParameter) as caught:
        Options.of({"backend": "portkit_trn"}).check_targets(["neuron", "tpu"])
    assert str(caught.value) == ("unknown compile backend for target neuron 'portkit_trn'; "
                                 "choose one of: auto, portkit_neuron")
    with pytest.raises(BadParameter, match="needs torch-tpu and a tpu device"):
        Options.of({"backend": "tpu"}).check_targets(["tpu"])
    with pytest.raises(BadParameter, match="choose one of: default, highest"):
        Options.of({"precision": {"tpu": "fp8"}}).check_targets(["tpu"])
    with pytest.raises(BadParameter, match="unknown target in precision 'cuda'"):
        Options.of({"precision": {"cuda": "fp32"}}).check_targets(["tpu"])
    with pytest.raises(BadParameter, match="unknown option of backend portkit_tpu 'mode'"):
        backends.emulated_backend("tpu")(torch.fx.symbolic_trace(torch.nn.ReLU()), [], options={"mode": "x"})


def test_the_runner_runs_the_stage_after_fallbacks():
    assert [s.name for s in runner.STAGES][:2] == ["fallbacks", "compile"]
    with pytest.raises(BadParameter, match="unknown compile backend for target tpu"):
        preflight.plan("minilm", ["tpu"], "/tmp/portkit-never-written", {"backend": "xla"}, stages=["compile"])


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_neuronx", "neuron"),
                    reason="needs torch-neuronx and a Trainium device")
def test_native_neuron_reads_the_vendor_compile_metrics(small, stream):
    storm = recompile_storm(small, stream, "neuron", Options.defaults(), progress=False)
    assert storm.backend == "neuron" and "torch_neuronx:get_dynamo_metrics" in storm.vendor_metrics


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_tpu", "tpu"), reason="needs torch-tpu and a TPU")
def test_native_tpu_reads_the_compile_cache_stats(small, stream):
    storm = recompile_storm(small, stream, "tpu", Options.defaults(), progress=False)
    assert storm.backend == "tpu" and "torch.tpu:_get_cache_stats" in storm.vendor_metrics


def test_a_storm_of_100_real_requests_compiles_once_per_distinct_shape(small, corpus):
    stream = make_requests(small, corpus, n=100, max_tokens=24, seed=3, horizon=100)
    storm = recompile_storm(small, stream, "tpu", Options.defaults(), progress=False)
    distinct = {tuple(s) for s in stream.shapes()}
    assert len(storm.requests) == 100 and len(distinct) > 8          # more than Dynamo's default limit
    assert storm.compile_count() == len(distinct) == storm.distinct_shapes()
    assert len(storm.compiles) == COMPILE_SHAPES   # the rest counted from Dynamo's refusals
    assert storm.counted() == len(distinct) - len(storm.compiles)
    assert all(r["reason"] and "size mismatch" in r["reason"] for r in storm.requests if r.get("counted"))
    assert storm.eager_from() is not None and storm.recompile_limit >= 100


def test_the_neuron_estimate_is_labelled_cited_and_overridable(small):
    estimate = economics.neuron_estimate(small.parameters)
    assert estimate.kind == "estimate" and estimate.label().startswith("estimate, not measured")
    assert "aws-neuron-sdk#1210" in estimate.source and estimate.seconds(16) == estimate.seconds(512) >= 20
    big = economics.neuron_estimate(70_000_000_000)
    assert big.seconds(128) > estimate.seconds(128)                  # grows with the parameter count
    given = economics.cost_model(small, "neuron", neuron_compile_seconds=45.0)
    assert given.seconds(64) == 45.0 and "neuron_compile_seconds = 45 s" in given.label()
    with pytest.raises(BadParameter, match="neuron_compile_seconds"):
        economics.neuron_estimate(small.parameters, override=-1)
    with pytest.raises(BadParameter, match="invalid neuron_compile_seconds 0"):
        Options.of({"neuron_compile_seconds": 0}).check_targets(["neuron"])


def test_the_xla_cost_model_interpolates_a_few_measured_shapes(small):
    asked = []

    def measure(model, shape, topology, dtype):
        asked.append(shape["seq"])
        return 2.0 + shape["seq"] / 100, "XLA compile for v5e:1x1, measured now"
    model = economics.xla_model(small, [5, 9, 12, 30, 64, 64, 100], measure=measure)
    assert asked == [5, 12, 100]                                      # shortest, middle, longest distinct
    assert model.kind == "measured XLA" and "measured XLA at 3 shape(s)" in model.label()
    assert model.seconds(50) == pytest.approx(2.5)                    # interpolated, linear in tokens


def test_the_notebook_parameters_are_the_stage_defaults():
    stage = next(s for s in runner.STAGES if s.name == "compile")
    declared = notebook_parameters.declared_parameters(stage)
    defaults = Options.defaults()
    for name in (f.name for f in dataclasses.fields(defaults)):
        assert eval(declared[name]["default"]) == getattr(defaults, name), name   # noqa: S307 (the notebook's literal)


def test_past_compile_shapes_each_new_shape_is_counted_from_dynamos_own_refusal(report, small, stream):
    # lengths 21, 17, 24, 10, 24: two shapes compiled, then 24 and 10 refused by Dynamo and counted, 24 again free
    shared = recompile_storms(small, stream, MIGRATION, Options.defaults(), progress=False,
                                         compile_shapes=2)
    alone = recompile_storm(small, stream, "neuron", Options.defaults(), progress=False,
                                      compile_shapes=2)
    for storm in (shared["neuron"], shared["tpu"], alone):
        full = report.storms[storm.target["name"]]
        assert len(storm.compiles) == 2 and storm.counted() == 2
        assert storm.compile_count() == full.compile_count() == storm.distinct_shapes() == 4
        assert [r["compiles"] for r in storm.requests] == [r["compiles"] for r in full.requests] == [1, 2, 3, 4, 4]
        assert [bool(r.get("counted")) for r in storm.requests] == [False, False, True, True, False]
        third = storm.requests[2]
        assert re.fullmatch(r"tensor '\w+' size mismatch at index 1\. expected 17, actual 24", third["reason"]), third
        assert third["guard_failures"] == 2          # Dynamo checked both compiled entries' guards
        # a counted shape costs nothing compiling here (a timing comparison with the full storm would flake)
        assert storm.seconds()["compiling"] == sum(r["wall"] - r["run"] for r in storm.requests[:2])
        assert "2 counted from Dynamo's guard failures past the first 2 shapes" in storm.summary()
    assert COMPILE_SHAPES == torch._dynamo.config.recompile_limit


def test_the_emulated_targets_share_one_trace_and_count_alike(report, small, stream):
    alone = recompile_storm(small, stream, "neuron", Options.defaults(), progress=False)
    shared = report.storms["neuron"]
    assert [r["compiles"] for r in shared.requests] == [r["compiles"] for r in alone.requests]
    assert [r["shape"] for r in shared.requests] == [r["shape"] for r in alone.requests]
    assert shared.backend == alone.backend == "portkit_neuron" and report.storms["tpu"].backend == "portkit_tpu"
    assert all(e.check is not None and e.check.target == n for n in MIGRATION for e in report.storms[n].compiles)


def test_an_image_model_has_one_fixed_shape_named_in_full_and_no_sequence_to_price():
    vit = registry.load("vit")
    requests = make_requests(vit, None, 3)
    fixed = check_fixed_shape(vit, requests, "tpu", Options.defaults())
    dims = list(next(iter(requests.inputs[0].values())).shape)
    assert len(dims) == 4 and fixed.label == "x".join(map(str, dims))         # 1x3xHxW, not "1x3"
    assert fixed.shape == {"batch": 1, "seq": None, "dims": dims} and not fixed.probed and fixed.armed is None
    assert "no other shape tried: the model takes one input shape" in fixed.summary()
    assert "did NOT raise" not in fixed.summary()
    asked = []

    def measure(model, shape, topology, dtype):
        asked.append(shape)
        return 1.5, "XLA compile for v5e:1x1, measured now"
    cost = economics.xla_model(vit, [], measure=measure)
    assert asked == [{"batch": 1}] and cost.seconds(None) == 1.5
    assert "measured XLA at the model's one input shape (v5e:1x1, batch 1)" in cost.label()


def test_a_model_xla_cannot_lower_is_priced_with_a_labelled_stand_in_not_a_failure(small):
    def refuses(model, shape, topology, dtype):
        return None, "no XLA compile for v5e:1x1: NO LOWERING for aten::set_.source_Tensor (test stand-in)"
    cost = economics.cost_model(small, "tpu", [5, 12, 30], measure=refuses)
    assert cost.target == "tpu" and cost.kind == economics.ESTIMATE and cost.seconds(12) >= 20
    assert cost.label().startswith("estimate, not measured: no XLA compile time (")
    assert "aten::set_.source_Tensor" in cost.label() and "Neuron rule as a stand-in" in cost.label()
    assert "aten::set_" in cost.details["xla_problem"]


@pytest.mark.parametrize("field, value", [("progress", "yes"), ("compile_shapes", -1), ("compile_shapes", 2.5)])
def test_storm_settings_refuse_a_bad_value_by_name(field, value):
    """Rule: compile_model's storm settings are checked where they are made, naming the bad value (0 shapes
    compiled then counted is valid: every shape compiled)."""
    assert StormSettings(compile_shapes=0).compile_shapes == 0
    with pytest.raises(BadParameter, match=field):
        StormSettings(**{field: value})
