"""The emulated backends' default path (checks + the target's numerics, run eagerly, no codegen) and
their Inductor option. Stage 2's reports are tested in test_compiling.py."""
import pytest
import torch
import torch.nn.functional as F

from conftest import FIXTURES, fixture_model
from fixtures import models as fixture_models
from portkit.targets import backends
from portkit.models import registry
from portkit.targets import numerics
from portkit.targets import specs
from portkit.core.errors import BadParameter

TPU = specs.get("tpu")


class MatmulStack(torch.nn.Module):
    """Matmul-heavy: three linears, a batched product and attention, in float32."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)

    def forward(self, x):
        h = F.gelu(self.a(x))
        q = k = v = self.b(h).view(x.shape[0], 2, x.shape[1], 32)
        h = F.scaled_dot_product_attention(q, k, v).reshape(x.shape) + h @ h.transpose(-1, -2) @ h * 1e-2
        return self.c(h)


class InPlaceAndConstant(torch.nn.Module):
    """An in-place op, a tensor constant, a two-result op: what the retrace must keep as eager has it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        h.add_(1.0)
        top, where = h.max(dim=-1)
        return h * torch.tensor([2.0]) + top.unsqueeze(-1), where


def _compile(module, x, backend, **options):
    torch.compiler.reset()
    try:
        with torch.no_grad():
            return torch.compile(module, backend=backend, dynamic=False, options=options or None)(x)
    finally:
        torch.compiler.reset()


def _emulated(module, x, precision=None):
    with torch.no_grad(), numerics.emulate(TPU, precision):
        return module(x)


def test_default_runs_the_retraced_graph_with_the_targets_numerics():
    module, x = MatmulStack().eval(), torch.randn(2, 12, 64)
    with torch.no_grad():
        plain = module(x)
    backend = backends.emulated_backend("tpu")
    got = _compile(module, x, backend)
    check = backend.checks[-1]
    assert check.runs == "eager" and check.inductor_seconds == 0.0
    assert check.numerics["matmul operands rounded to bfloat16"] >= 5
    torch.testing.assert_close(got, _emulated(module, x), rtol=1e-6, atol=1e-6)   # the rounding ran
    rounded = (got - plain).abs().max()
    assert rounded > 1e-3                        # bf16 operands: far from float32
    highest = _compile(module, x, backends.emulated_backend("tpu", "highest"))
    assert (highest - plain).abs().max() < rounded / 100
    # The registered name takes the precision as an option, and rounds again after a weight changes.
    module.c.weight.data.mul_(2)
    torch.testing.assert_close(_compile(module, x, "portkit_tpu"), _emulated(module, x), rtol=1e-6, atol=1e-6)


def test_in_place_ops_constants_and_tuples_survive_the_retrace():
    module, x = InPlaceAndConstant().eval(), torch.randn(3, 16)
    got = _compile(module, x, backends.emulated_backend("tpu"))
    expect = _emulated(module, x)
    torch.testing.assert_close(got[0], expect[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], expect[1])


def test_symbolic_shapes_are_refused_with_the_vendors_words():
    torch.compiler.reset()
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as caught:
        torch.compile(torch.nn.Linear(4, 4), backend="portkit_tpu", dynamic=True)(torch.randn(3, 4))
    torch.compiler.reset()
    assert TPU.dynamic_shape_error in str(caught.value) and "dynamic=False" in str(caught.value)


def test_ops_that_do_not_lower_are_reported_with_their_line():
    m = registry.load(fixture_model("svd_model"))
    inputs = m.encode(["Return the sum of a and b."], pad_to=8)
    line = next(i for i, t in enumerate(FIXTURES.read_text().splitlines(), 1) if "torch.linalg.svd" in t)
    counter = backends.CompileCounter(backends.emulated_backend("neuron"))
    torch.compiler.reset()
    with torch.no_grad():
        out = torch.compile(m.module, backend=counter, dynamic=False)(**inputs)["singular_values"]
    torch.compiler.reset()
    torch.testing.assert_close(out, m.module(**inputs)["singular_values"])   # and the graph still runs
    (svd,) = counter.events[0].check.not_lowered
    assert svd["op"] == "aten::_linalg_svd" and svd["status"] == "cpu_fallback"
    assert svd["where"][0]["file"] == str(FIXTURES) and svd["where"][0]["line"] == line


def test_the_inductor_option_compiles_the_same_numerics():
    module, x = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval(), \
        torch.randn(4, 32)
    backends.warm_inductor()
    got = _compile(module, x, "portkit_tpu", inductor=True)
    check = backends.REGISTERED["tpu"].checks[-1]
    assert check.runs == "inductor" and check.inductor_seconds > 0
    torch.testing.assert_close(got, _emulated(module, x), rtol=1e-5, atol=1e-5)
    assert backends.emulated_backend("tpu", inductor=True).inductor


def test_bad_options_are_one_line_with_the_choices():
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    with pytest.raises(BadParameter, match=r"unknown option of backend portkit_tpu 'mode'; choose one of: "
                                           r"precision, inductor"):
        backends.emulated_backend("tpu")(gm, [], options={"mode": "x"})
    with pytest.raises(BadParameter, match=r"unknown inductor option of backend portkit_tpu 'yes'; "
                                           r"choose one of: True, False"):
        backends.emulated_backend("tpu")(gm, [], options={"inductor": "yes"})


class _SizesByARead(torch.nn.Module):
    def forward(self, input_ids):
        return torch.zeros(int((input_ids != 0).sum().item())) + 1


def test_an_asserted_read_is_no_dynamic_shape_but_a_read_that_sizes_a_tensor_is():
    """Rule: a static-shape target refuses a tensor whose shape rests on a value read from a tensor; a read that only
    a runtime assert compares (Dynamo captures `assert t.item() <= n` whole) sizes nothing and compiles: tiny
    Flaubert was 'blocked' on both targets by its input-length assert."""
    ids = torch.tensor([[3, 4, 0, 0], [5, 0, 0, 0]])
    for backend in (backends.portkit_neuron, backends.portkit_tpu):
        torch.compiler.reset()
        out = torch.compile(fixture_models.AssertsOnARead(), backend=backend, fullgraph=True, dynamic=False)(ids)
        torch.testing.assert_close(out, ids.float() * 2)
    torch.compiler.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True), pytest.raises(Exception, match="data-dependent size"):
        torch.compile(_SizesByARead(), backend=backends.portkit_tpu, fullgraph=True, dynamic=False)(ids)
    torch.compiler.reset()
