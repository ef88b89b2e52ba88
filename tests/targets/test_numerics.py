import pytest
import torch
import torch.nn.functional as F

from portkit.targets import numerics
from portkit.targets import specs

TPU, NEURON = specs.get("tpu"), specs.get("neuron")
# _attention's rounding, as a target's precision gives it: operands kept in float32, or rounded to bfloat16
FP32_OPERANDS = specs.Precision("fp32 operands", "test", "matmul operands in float32", matmul_inputs=torch.float32)
BF16_OPERANDS = specs.Precision("bf16 operands", "test", "matmul operands in bf16", matmul_inputs=torch.bfloat16)


def bf16(x):
    return x.to(torch.bfloat16).float()


def test_tpu_default_is_one_bf16_pass_with_fp32_accumulation():
    torch.manual_seed(0)
    a, b = torch.randn(64, 256), torch.randn(256, 32)
    with numerics.emulate(TPU) as mode:
        got = a @ b
    assert torch.equal(got, bf16(a) @ bf16(b))
    assert not torch.equal(got, a @ b)
    assert mode.stats["matmul operands rounded to bfloat16"] == 1
    with numerics.emulate(TPU, "highest"):
        assert torch.equal(a @ b, a @ b)


def test_linear_rounds_weights_and_input_but_not_bias():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with numerics.emulate(TPU):
        got = lin(x)
    assert torch.allclose(got, F.linear(bf16(x), bf16(lin.weight), lin.bias), atol=0, rtol=1e-6)


def test_neuron_matmult_rounds_results_and_all_rounds_everything():
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with numerics.emulate(NEURON, "matmult"):
        got = a @ b
    assert torch.equal(got, bf16(got))           # representable in bf16
    with numerics.emulate(NEURON, "all"):
        got = torch.exp(a)
    assert torch.equal(got, bf16(torch.exp(bf16(a))))
    with numerics.emulate(NEURON):               # the native backend's default: --auto-cast=none
        assert torch.equal(a @ b, a @ b)


def test_float64_runs_as_float32_and_comes_back_as_float64():
    x = torch.tensor([1.0 + 2 ** -40], dtype=torch.float64)
    with numerics.emulate(TPU, "highest") as mode:
        y = x * 3
    assert y.dtype == torch.float64
    assert y.item() == 3.0                       # the 2**-40 is lost in float32
    assert mode.float64_ops["aten::mul.Tensor"] == 1


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_in_place_and_out_ops_write_into_the_callers_tensor(dtype):
    x, one, out = torch.arange(4, dtype=dtype), torch.ones(4, dtype=dtype), torch.empty(4, dtype=dtype)
    with numerics.emulate(NEURON) as mode:
        returned = x.add_(one)
        torch.mul(x, 2, out=out)
    assert returned is x and x.tolist() == [1, 2, 3, 4] and x.dtype == dtype
    assert out.tolist() == [2, 4, 6, 8] and out.dtype == dtype
    assert sum(mode.stats.values()) == 2


def test_writes_through_views_reach_the_base_tensor():
    base, src = torch.zeros(4, dtype=torch.int64), torch.tensor([7, 8, 9])
    with numerics.emulate(NEURON):
        base[1:] = src                           # slice (a view), then copy_ into it
        base[0] = 5
    assert base.tolist() == [5, 7, 8, 9]


def test_in_place_ops_round_under_auto_cast_all():
    torch.manual_seed(0)
    x = torch.randn(64)
    expect = bf16(bf16(x) * 3)
    with numerics.emulate(NEURON, "all"):
        x.mul_(3)
    assert torch.equal(x, expect)


def test_int64_wraps_on_neuron_only():
    big = torch.tensor([2 ** 31 + 5], dtype=torch.int64)
    with numerics.emulate(NEURON):
        wrapped = big + 0
    assert wrapped.dtype == torch.int64 and wrapped.item() == -(2 ** 31) + 5
    with numerics.emulate(TPU):
        assert (big + 0).item() == 2 ** 31 + 5


@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "causal", "gqa"])
def test_attention_reimplementation_matches_sdpa(case):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 10, 16)
    kv_heads = 2 if case == "gqa" else 4
    k, v = torch.randn(2, kv_heads, 10, 16), torch.randn(2, kv_heads, 10, 16)
    kwargs = {}
    if case == "bool_mask":
        kwargs["attn_mask"] = torch.rand(2, 1, 10, 10) > 0.3
        kwargs["attn_mask"][..., 0] = True
    if case == "float_mask":
        kwargs["attn_mask"] = torch.randn(2, 1, 10, 10)
    if case == "causal":
        kwargs["is_causal"] = True
    expect = F.scaled_dot_product_attention(q, k, v, enable_gqa=case == "gqa", **kwargs)
    got, lse = numerics._attention(q, k, v, precision=FP32_OPERANDS, **kwargs)
    torch.testing.assert_close(got, expect)
    assert lse.shape == (2, 4, 10)


@pytest.mark.parametrize("given", ["bool", "additive", "bool_and_causal"])
def test_a_query_with_every_key_masked_attends_to_nothing_as_the_cpu_kernel_does(given):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))        # (batch, heads, queries, dim)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    mask[..., 0] = False                                          # a left-padded causal LM's padding key
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=additive)[0]
    if given == "bool_and_causal":   # the padding as a key mask, the causal part from is_causal
        got, lse = numerics._attention(q, k, v, attn_mask=torch.tensor([False, True, True]), is_causal=True,
                                       precision=BF16_OPERANDS)
    else:
        got, lse = numerics._attention(q, k, v, attn_mask=mask if given == "bool" else additive,
                                       precision=BF16_OPERANDS)
    assert lse[:, :, 0].isneginf().all() and lse[:, :, 1:].isfinite().all()
    assert got.shape == kernel.shape == (1, 2, 3, 4) and not got.isnan().any()
    assert torch.equal(got[:, :, 0], torch.zeros(1, 2, 4)) and torch.equal(kernel[:, :, 0], torch.zeros(1, 2, 4))
    torch.testing.assert_close(got[:, :, 1:], kernel[:, :, 1:], rtol=2e-2, atol=2e-2)   # other rows: bf16 operands


def test_attention_in_a_model_is_rounded():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with numerics.emulate(TPU) as mode:
        got = F.scaled_dot_product_attention(q, k, v)
    assert mode.stats["attention products rounded to bfloat16"] == 1
    expect = F.scaled_dot_product_attention(bf16(q), bf16(k), v)
    assert (got - expect).abs().max() > 0        # the probabilities and V are rounded too
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), rtol=2e-2, atol=2e-2)


def test_rounding_into_a_contiguous_copy_keeps_the_values():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 4, 16).transpose(1, 2)     # the heads' permuted view
    flat = numerics.round_to(x, torch.bfloat16, torch.contiguous_format)
    assert flat.is_contiguous() and not x.is_contiguous() and flat.dtype == torch.float32
    assert torch.equal(flat, bf16(x))


@pytest.mark.parametrize("case", ["plain", "masked_row"])
def test_attention_logsumexp_matches_torch(case):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    if case == "masked_row":
        mask[..., 2, :] = False                       # a row that attends to nothing: -inf everywhere
    _, lse = numerics._attention(q, k, v, attn_mask=mask, precision=FP32_OPERANDS)
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))
