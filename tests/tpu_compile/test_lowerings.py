"""portkit's own lowerings of ATen ops torchax leaves unlowered (portkit.tpu_compile.lowerings): each computes what
PyTorch computes, and a real mixture-of-experts architecture whose experts call PyTorch's grouped GEMM reaches the
XLA TPU compiler instead of stopping in the converter."""
import numpy as np
import pytest
import torch
from torch import nn

from portkit.core import availability
from portkit.models.adapters import LogitsAdapter
from portkit.stages.xla import stage
from portkit.tpu_compile import compiler

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax: pip install 'portkit[xla]'")


class Grouped(nn.Module):
    def forward(self, a, b, offs=None):
        return torch.nn.functional.grouped_mm(a, b, offs=offs)


def _through_torchax(module, *inputs):
    jax, torchax = compiler.require_xla()
    states, fn = torchax.extract_jax(module)
    return np.asarray(fn(states, tuple(None if x is None else jax.numpy.asarray(x.numpy()) for x in inputs)))


@needs_xla
@pytest.mark.parametrize("offs", [[4, 4, 10], [0, 7, 10], [10, 10, 10]], ids=["empty-middle", "empty-first",
                                                                              "one-group"])
def test_grouped_mm_of_rows_against_a_stack_of_experts_computes_what_pytorch_computes(offs):
    """Rule: a lowering portkit adds gives PyTorch's own result (groups of rows by cumulative ends, empty groups
    included), so the compile the TPU verdict rests on is the model's computation."""
    torch.manual_seed(0)
    a, b, offs = torch.randn(10, 8), torch.randn(3, 8, 12), torch.tensor(offs, dtype=torch.int32)
    expected = torch.nn.functional.grouped_mm(a, b, offs=offs).numpy()
    np.testing.assert_allclose(_through_torchax(Grouped(), a, b, offs), expected, rtol=1e-5, atol=1e-5)


class Fallback(nn.Module):
    def forward(self, a, b, offs):
        return torch.ops.transformers.grouped_mm_fallback(a, b, offs)


@needs_xla
def test_transformers_grouped_mm_fallback_op_lowers_as_the_grouped_gemm_it_stands_for():
    """Rule: the library's custom op for the same product (its float32 CPU path, axk1's experts) lowers too."""
    pytest.importorskip("transformers.integrations.moe")
    torch.manual_seed(0)
    a, b, offs = torch.randn(10, 8), torch.randn(3, 8, 12), torch.tensor([4, 4, 10], dtype=torch.int32)
    expected = torch.ops.transformers.grouped_mm_fallback(a, b, offs).numpy()
    np.testing.assert_allclose(_through_torchax(Fallback(), a, b, offs), expected, rtol=1e-5, atol=1e-5)


@needs_xla
def test_grouped_mm_of_two_stacks_is_a_batched_matmul():
    torch.manual_seed(0)
    a, b = torch.randn(3, 8, 8), torch.randn(3, 8, 12)
    np.testing.assert_allclose(_through_torchax(Grouped(), a, b), torch.bmm(a, b).numpy(), rtol=1e-5, atol=1e-5)


@needs_xla
def test_a_mixture_of_experts_from_its_transformers_config_compiles_for_a_tpu():
    """Rule: a converter gap portkit can close is closed, so the verdict is the compiler's. Tiny Mixtral (transformers'
    experts run aten::_grouped_mm) compiles for v5e:1x1, where torchax alone stopped with NO LOWERING."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    report = stage.compile_for_tpu(LogitsAdapter(model), shapes=[{"input_ids": ((1, 16), "int64"),
                                                                  "attention_mask": ((1, 16), "int64")}])
    (shape,) = report.shapes
    assert shape.status == "compiled" and shape.fits_hbm is True, shape.message


@needs_xla
def test_a_weight_normed_convolution_compiles_with_its_weight_baked_and_the_model_untouched(tmp_path):
    """Rule: a converter gap portkit can close is closed. wav2vec2's family (HuBERT, WavLM, Data2VecAudio...) holds
    its positional convolution's weight under weight norm (a parametrization): torchax swaps weights in through the
    parametrization's right_inverse, whose Tensor.set_ it cannot lower, and every shape stopped with NO LOWERING for
    aten::set_.source_Tensor. The conversion traces a copy with the weight computed once (as an inference export
    bakes it), says so in the report's notes, and leaves the user's model as it was."""
    import sys
    from torch.nn.utils import parametrize
    from conftest import ROOT
    from portkit.models import registry
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows(["ctc"]) if r.model_type == "hubert")
    lm = registry.load(str(zoo_build.build(row, tmp_path, {})))
    conv = lm.module.get_submodule("model.hubert.encoder.pos_conv_embed.conv")
    # 400 samples: the feature encoder's receptive field, one frame (its convolutions' compile grows with the length)
    report = stage.compile_for_tpu(lm, shapes=[{"batch": 1, "seq": 400}])
    (shape,) = report.shapes
    assert shape.status == "compiled" and shape.fits_hbm is True, shape.message
    assert any("1 parametrized weight(s) (model.hubert.encoder.pos_conv_embed.conv.weight" in n for n in report.notes)
    assert parametrize.is_parametrized(conv, "weight")
    assert conv.weight.shape == conv.parametrizations.weight.original1.shape
    with torch.no_grad():       # the user's model still runs: its class keeps the parametrized weight
        lm.module(**lm.encode([np.zeros(1600, np.float32)] * 2))
