"""The modules that each own one decision: tolerance, tracking, placement, _torch, tables, results."""
import collections
import json

import pytest
import torch
from torch import nn
from torch.testing._comparison import default_tolerances

from portkit.core.torch_private import default_recompile_limit, recompile_limit, recompile_limit_for
from portkit.core import placement
from portkit.runfolder import results
from portkit.targets import specs
from portkit.targets import tolerance
from portkit.core.tables import HtmlTable
from portkit.core.module_stack import ModuleTracker

TPU, NEURON = specs.get("tpu"), specs.get("neuron")


# ---------------------------------------------------------------- tolerance
def test_default_tolerances_are_assert_closes_own():
    for name, pair in tolerance.DEFAULT_TOLERANCES.items():
        assert pair == default_tolerances(getattr(torch, name))


@pytest.mark.parametrize("target,precision,dtype", [
    (TPU, "default", "bfloat16"), (TPU, "highest", "float32"),
    (NEURON, "none", "float32"), (NEURON, "matmult", "bfloat16"), (NEURON, "all", "bfloat16")])
def test_tolerance_follows_the_dtype_the_precision_computes_in(target, precision, dtype):
    tol = tolerance.tolerance_for(target.precision(precision))
    assert tol.dtype == dtype and (tol.rtol, tol.atol) == tolerance.DEFAULT_TOLERANCES[dtype]
    # configurable per dtype; an output that is already bf16 is held to bf16
    assert tolerance.tolerance_for(target.precision(precision), {dtype: [0.5, 0.25]}).atol == 0.25
    assert tolerance.tolerance_for(target.precision(precision), output_dtype=torch.bfloat16).dtype == "bfloat16"
    assert tolerance.effective({dtype: [0.5, 0.25]})[dtype] == (0.5, 0.25)


def test_describe_prints_the_policy_and_marks_overrides():
    text = tolerance.describe({"bfloat16": [3e-2, 1e-3]}, {"kl": 0.1})
    assert "bfloat16 (0.03, 0.001) (changed)" in text and "float32 (1.3e-06, 1e-05)," in text
    assert "kl <= 0.1 (changed)" in text and "cosine >= 0.999," in text and len(text.splitlines()) == 2
    assert text.startswith("task budgets (they decide the verdict)")
    assert "baseline_factor <= 2" in text and "perplexity <= 0.01" in text


@pytest.mark.parametrize("precision,wide", [
    (TPU.precision("default"), True), (TPU.precision("highest"), False), (NEURON.precision("none"), False),
    (NEURON.precision("matmult"), True), (NEURON.precision("all"), True), (None, False)])
def test_padding_tolerance_is_bf16_wide_only_where_the_precision_rounds(precision, wide):
    tol = tolerance.padding_tolerance(precision)
    assert (tol.rtol, tol.atol) == (tolerance.PADDING_TOLERANCE_BF16 if wide else tolerance.PADDING_TOLERANCE)
    # compiled kernels sum in their own order: the padding check is looser than assert_close's default
    assert tol.atol > tolerance.DEFAULT_TOLERANCES[tol.dtype][1]


# ---------------------------------------------------------------- tracking
class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu()


class _Outer(nn.Module):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.inner, self.head, self.fail = _Inner(), nn.Linear(3, 2), fail

    def forward(self, x):
        x = self.inner(x)
        if self.fail:
            raise RuntimeError("boom")
        return self.head(x)


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.name()] += 1
        return func(*args, **(kwargs or {}))


def test_tracker_names_the_running_module_innermost_first():
    model, seen, left = _Outer(), [], []
    with ModuleTracker(model, on_enter=lambda path, m: seen.append(list(tracker.stack)),
                       on_leave=lambda path, m, out: left.append(path)) as tracker:
        model(torch.ones(1, 3))
        assert tracker.stack == [] and tracker.current == results.ROOT
    assert seen[-1] == [results.ROOT, "head"] and [results.ROOT, "inner", "inner.lin"] in seen
    assert left == ["inner.lin", "inner", "head", results.ROOT]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())   # hooks removed


def test_tracker_callbacks_are_not_the_models_work():
    model, x = _Outer(), torch.ones(1, 3)
    with _CountOps() as plain:
        model(x)
    with ModuleTracker(model, on_leave=lambda path, m, out: out.sum()), _CountOps() as tracked:
        model(x)
    assert tracked.ops == plain.ops and plain.ops["aten::addmm"] == 2


@pytest.mark.parametrize("unwind,stack", [(True, []), (False, [results.ROOT])])
def test_tracker_on_an_error(unwind, stack):
    model = _Outer(fail=True)
    with ModuleTracker(model, unwind_on_error=unwind) as tracker:
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.ones(1, 3))
        assert tracker.stack == stack     # kept: the stack still names where the error was raised
    with ModuleTracker(model.inner, root="", unwind_on_error=False) as tracker:
        model.inner(torch.ones(1, 3))
        assert tracker.current == ""


# ---------------------------------------------------------------- placement
class _Moves(nn.Linear):
    """Records where it is moved; stays on the CPU (this machine has no second device)."""

    def __init__(self):
        super().__init__(2, 2)
        self.moves = []

    def to(self, device):
        self.moves.append(str(device))
        return self


def test_on_device_moves_and_puts_back_also_after_an_error():
    module = _Moves()
    with pytest.raises(ValueError, match="failed run"):
        with placement.on_device(module, "meta", {"x": torch.ones(2), "n": 3}) as moved:
            assert moved["x"].device.type == "meta" and moved["n"] == 3
            raise ValueError("failed run")
    assert module.moves == ["meta", "cpu"]
    assert placement.home_device(nn.ReLU()) == torch.device("cpu")


def test_to_device_walks_containers():
    point = collections.namedtuple("point", "a b")
    value = {"t": torch.ones(1), "list": [torch.ones(1), "text"], "tuple": point(torch.ones(1), None)}
    moved = placement.to_device(value, "meta")
    assert moved["t"].is_meta and moved["list"][0].is_meta and moved["list"][1] == "text"
    assert isinstance(moved["tuple"], point) and moved["tuple"].a.is_meta and moved["tuple"].b is None


# ---------------------------------------------------------------- _torch
def test_recompile_limit_raises_both_limits_and_never_lowers():
    import torch._dynamo
    config = torch._dynamo.config
    default = default_recompile_limit()
    assert recompile_limit_for(1) == 1 + default and recompile_limit_for(100) == 100 + default
    with recompile_limit(100) as limit:
        assert config.recompile_limit == limit == 100 + default
        assert config.accumulated_recompile_limit >= limit
    assert config.recompile_limit == default
    with config.patch(recompile_limit=1000), recompile_limit(3):
        assert config.recompile_limit >= 1000


def test_every_shape_compiles_under_the_limit():
    from torch._dynamo.testing import CompileCounter
    shapes = default_recompile_limit() + 4

    def run(limit):
        torch.compiler.reset()
        counter = CompileCounter()
        fn = torch.compile(lambda x: x + 1, backend=counter, dynamic=False)
        with limit:
            for n in range(1, shapes + 1):
                fn(torch.ones(n))
        torch.compiler.reset()
        return counter.frame_count
    assert run(recompile_limit(shapes)) == shapes
    # what the limit prevents: Dynamo silently runs the shapes past its default eagerly
    import contextlib
    assert run(contextlib.nullcontext()) == default_recompile_limit()


# ---------------------------------------------------------------- tables and results
def test_html_table_escapes_and_prints():
    table = HtmlTable(["op", "why"], [["aten::add", "<script>"]], "caption & more")
    assert "&lt;script&gt;" in table._repr_html_() and "caption &amp; more" in table._repr_html_()
    assert str(table).splitlines() == ["caption & more", "op         why     ", "aten::add  <script>"]


def test_finding_keeps_the_report_keys():
    plain = results.Finding("accuracy", "work", "out of tolerance", "set HIGHEST").to_dict()
    assert plain == {"kind": "accuracy", "severity": "work", "message": "out of tolerance", "advice": "set HIGHEST"}
    placed = results.Finding("float64", "blocker", "m", "a", module="head", ops=["aten::addmm"], source="").to_dict()
    assert list(placed) == ["kind", "severity", "module", "ops", "message", "advice", "source"]
    with pytest.raises(ValueError, match="'fatal' is not one of blocker, work, info"):
        results.Finding("x", "fatal", "m", "a")


def test_read_buckets(tmp_path):
    from portkit.run import runner
    assert all(s.result == results.result_file(s.name) for s in runner.STAGES)   # one naming rule
    assert results.read_buckets(tmp_path) is None
    path = tmp_path / "buckets.json"
    path.write_text(json.dumps({"targets": {"tpu": {"chosen": {"planner": "auto", "boundaries": [64, 16],
                                                                "batch_sizes": [1, 4]}},
                                            "neuron": {"chosen": {"boundaries": []}}}}))
    found = results.read_buckets(tmp_path)
    assert found.path == path and list(found.chosen) == ["tpu"]
    assert found.chosen["tpu"] == results.ChosenBuckets("auto", (16, 64), (1, 4))
    for text, problem in (("{not json", "cannot be read (JSONDecodeError"), ("[1, 2]", "holds a list, not a stage result"), ("{}", "no per-target results"),
                          ('{"targets": {"tpu": {"chosen": {"boundaries": [0]}}}}', "not a list of positive")):
        path.write_text(text)
        with pytest.raises(results.UnreadableResult) as info:
            results.read_buckets(tmp_path)
        assert str(info.value).startswith(str(path)) and problem in str(info.value)
        assert "\n" not in str(info.value) and "rerun stage buckets" in str(info.value)


def test_stage_3s_plans_are_read_before_its_result_exists_and_its_result_wins_after(tmp_path):
    from portkit.stages.buckets import stage
    from portkit.planning import planner
    from portkit.runfolder import results
    plan = planner.plan_buckets([5, 9, 30, 31, 60], "pow2", k=2)

    class Served:      # a generation workload's serving plans (stage.serving_plans), as buckets.json holds them
        def to_dict(self):
            return {"targets": {"tpu": {"auto": {"prompt": {"boundaries": [16, 48]},
                                                 "context": {"boundaries": [32, 80]}}}}}
    early = stage.save_plans({"tpu": plan}, tmp_path, Served())
    assert early.name == results.layout.stage("buckets").early
    found = results.read_buckets(tmp_path)
    assert found.path == early and found.chosen["tpu"].boundaries == tuple(plan.boundaries)
    # what stage 3b reads, from the same file while stage 3 replays: the chosen shapes and the serving plans
    assert results.bucket_shapes(tmp_path, "tpu") == ("pow2", [{"batch": 1, "seq": 32}, {"batch": 1, "seq": 60}])
    assert results.serving_buckets(tmp_path, "tpu") == ([16, 48], [32, 80])
    assert results.serving_buckets(tmp_path, "neuron") is None
    (tmp_path / "buckets.json").write_text(json.dumps({"targets": {"tpu": {"chosen": {"boundaries": [7]}}}}))
    assert results.read_buckets(tmp_path).chosen["tpu"].boundaries == (7,)    # the finished result
    assert results.serving_buckets(tmp_path, "tpu") is None                   # ... for every reader
    with pytest.raises(results.StageSkipped):
        results.skip_stage(tmp_path, "buckets", {"name": "m"}, ["tpu"], "one input shape")
    assert results.read_buckets(tmp_path) is None                              # skipped: no plans either
