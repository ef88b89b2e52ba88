"""What a CPU recording cannot show about a PrivateUse1 device's path, and AOTAutograd's functional forms.

The workbook records ops on the CPU; PyTorch's dispatch picks other kernels for the same call on a PrivateUse1
device (the vendors' "neuron" and "tpu"). These tables translate the CPU's choice into the device's, each with
the ATen source that makes it; portkit.targets.specs classifies the translated op with the target's table.
"""
from __future__ import annotations


# CPU-specific ATen ops that PyTorch's CPU dispatch chooses, and what the same call runs as on a
# PrivateUse1 device. Recording happens on the CPU, so these are translated before classifying.
PRIVATEUSE1_PATH: dict[str, tuple[str, str]] = {
    # SDPA: _fused_sdp_choice on a PrivateUse1 tensor selects the "overrideable" fused kernel
    # (aten/src/ATen/native/transformers/attention.cpp; torch-neuronx SdpBackendSelection.cpp).
    "aten::_scaled_dot_product_flash_attention_for_cpu":
        ("aten::_scaled_dot_product_fused_attention_overrideable",
         "SDPA selects the overrideable fused kernel on PrivateUse1 devices"),
    # LSTM: on cuda/xpu/privateuseone inputs, LSTMCell calls _thnn_fused_lstm_cell
    # (aten/src/ATen/native/RNN.cpp); the CPU runs oneDNN's mkldnn_rnn_layer instead.
    "aten::mkldnn_rnn_layer": ("aten::_thnn_fused_lstm_cell",
                               "LSTMCell calls _thnn_fused_lstm_cell on PrivateUse1 devices (RNN.cpp)"),
    # Their backward passes: each forward's derivative formula (tools/autograd/derivatives.yaml).
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        ("aten::_scaled_dot_product_fused_attention_overrideable_backward",
         "the overrideable fused attention's backward (derivatives.yaml) on PrivateUse1 devices"),
    "aten::mkldnn_rnn_layer_backward": ("aten::_thnn_fused_lstm_cell_backward_impl",
                                        "_thnn_fused_lstm_cell's backward (derivatives.yaml) on PrivateUse1 devices"),
}
# Module types whose device path differs from the CPU path in a way the recorded ops cannot show: on
# PrivateUse1 inputs the LSTM/GRU layers and cells (nn.LSTMCell/GRUCell call the same at::lstm_cell/gru_cell)
# run the fused cells (RNN.cpp), while the CPU decomposes cells to matmuls; then their backward kernels
# (derivatives.yaml). Matched by type, subclasses included (fused_cell_ops).
PRIVATEUSE1_MODULE_OPS = {**dict.fromkeys(("LSTM", "LSTMCell"), ("aten::_thnn_fused_lstm_cell",
                                                                 "aten::_thnn_fused_lstm_cell_backward_impl")),
                          **dict.fromkeys(("GRU", "GRUCell"), ("aten::_thnn_fused_gru_cell",
                                                               "aten::_thnn_fused_gru_cell_backward"))}


def fused_cell_ops(module) -> tuple[str, str, str] | None:
    """(torch.nn class name, fused forward op, its backward op) for an LSTM/GRU layer or cell, else None."""
    found = next((c for c in type(module).__mro__ if c.__module__.startswith("torch.nn.modules")
                  and c.__name__ in PRIVATEUSE1_MODULE_OPS), None)
    return (found.__name__, *PRIVATEUSE1_MODULE_OPS[found.__name__]) if found else None


# Plain RNN layers and cells (tanh or relu) have no fused cell on any device: at::rnn_tanh/rnn_relu and their
# cells run SimpleCell, a linear and the nonlinearity per step (RNN.cpp), so the recording shows only matmuls.
PLAIN_RECURRENT_MODULES = ("RNN", "RNNCell")


def plain_recurrent_op(module) -> tuple[str, str] | None:
    """(torch.nn class name, the ATen op it calls) for a plain RNN layer or cell, subclasses included, else None."""
    found = next((c for c in type(module).__mro__ if c.__module__.startswith("torch.nn.modules")
                  and c.__name__ in PLAIN_RECURRENT_MODULES), None)
    if found is None:
        return None
    return found.__name__, f"aten::rnn_{module.nonlinearity}" + ("_cell" if found.__name__ == "RNNCell" else "")


# A training graph is functionalized by AOTAutograd (both targets' compile pipelines run it): an in-place
# write into a view becomes one of these functional ops, judged under torch.compile as the write itself.
FUNCTIONAL_FORMS = {"aten::lift_fresh_copy": "aten::clone", **dict.fromkeys(("aten::copy", "aten::slice_scatter",
                    "aten::select_scatter", "aten::diagonal_scatter", "aten::as_strided_scatter"), "aten::copy_")}
