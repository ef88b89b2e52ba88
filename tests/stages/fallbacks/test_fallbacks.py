import json

import pytest
import torch

from conftest import fixture_model
from portkit.stages.compile.stage import find_graph_breaks
from portkit.corpora.corpus import example_batch
from portkit.stages.fallbacks.stage import GENERATED_TOKENS, Options, RecordSettings, find_fallbacks
from portkit.core import owners
from portkit.models import registry
from portkit.core import availability
from portkit.runfolder import results
from portkit.core.errors import BadParameter


def run(spec, targets=("neuron", "tpu"), seq=12, train=False, corpus=None):
    m = registry.load(spec)
    texts = corpus.sample(2, seed=0) if corpus is not None else ["def f(x): return x", "Sum the values."]
    return find_fallbacks(m, m.encode(texts, pad_to=seq), targets, RecordSettings(train=train))


def kinds(report, target):
    return {(f.kind, f.severity, f.module) for f in report.targets[target].findings}


def test_minilm_records_every_call_with_its_module(minilm, corpus):
    inputs, _ = example_batch(minilm, corpus, 2, 32)
    report = find_fallbacks(minilm, inputs, ["neuron", "tpu"])
    ops = {r.op for r in report.records}
    assert {"aten::addmm", "aten::native_layer_norm", "aten::gelu", "aten::embedding"} <= ops
    addmm = [r for r in report.records if r.op == "aten::addmm"]
    assert {r.module for r in addmm} >= {f"encoder.encoder.layer.{i}.attention.self.query" for i in range(6)}
    assert sum(r.calls for r in addmm) == 6 * 6 + 1      # 6 linears per layer, plus the pooler
    tpu = report.targets["tpu"]
    assert abs(sum(o["time_share"] for o in tpu.ops) - 1.0) < 1e-6
    addmm_tpu = next(o for o in tpu.ops if o["op"] == "aten::addmm")
    assert addmm_tpu["status"] == "composite" and addmm_tpu["via"] == "aten::addmm.out"
    # The padding mask reaches SDPA as an arbitrary mask: work on Neuron, nothing on TPU.
    assert ("attention_mask", "work", "encoder.encoder.layer.*.attention.self (6 modules)") in kinds(report, "neuron")
    assert not any(k == "attention_mask" for k, _, _ in kinds(report, "tpu"))


def test_float64_is_found_in_its_module():
    report = run(fixture_model("float64_model"))
    for target in ("neuron", "tpu"):
        found = {f.module: f for f in report.targets[target].findings if f.kind == "float64"}
        # the casts in the parent's forward, and the float64 matmul in the head
        assert set(found) == {"model", "model.head"}, found
        assert found["model"].ops == ["aten::_to_copy"]
        assert "aten::addmm" in found["model.head"].ops and found["model.head"].severity == "work"
        assert "float32" in found["model.head"].advice


def test_lstm_cannot_run_on_neuron_and_is_experimental_on_tpu():
    report = run("lstm")
    neuron = report.targets["neuron"]
    assert ("recurrent", "blocker", "lstm") in kinds(report, "neuron")
    cell = next(o for o in neuron.ops if o["op"] == "aten::mkldnn_rnn_layer")
    assert cell["status"] == "unsupported" and cell["via"] == "aten::_thnn_fused_lstm_cell"
    assert neuron.counts()["unsupported"] == 1
    assert ("recurrent", "work", "lstm") in kinds(report, "tpu")
    assert report.targets["tpu"].counts()["unsupported"] == 0


def test_gru_is_found_by_module_type():
    report = run(fixture_model("gru_model"))
    assert ("recurrent", "blocker", "model.rnn") in kinds(report, "neuron")
    assert ("recurrent", "work", "model.rnn") in kinds(report, "tpu")


def test_recurrent_cells_and_subclassed_layers_are_found_by_type():
    # on the CPU the cells decompose to matmuls before the dispatcher sees them: only their type tells
    report = run(fixture_model("cell_model"), seq=6)
    for module in ("model.lstm_cell", "model.gru_cell", "model.context"):
        assert ("recurrent", "blocker", module) in kinds(report, "neuron"), module
        assert ("recurrent", "work", module) in kinds(report, "tpu"), module
    found = {f.module: f for f in report.targets["neuron"].findings if f.kind == "recurrent"}
    assert found["model.gru_cell"].ops == ["aten::_thnn_fused_gru_cell"]
    assert found["model.lstm_cell"].ops == ["aten::_thnn_fused_lstm_cell"]
    assert "nn.LSTM:" in found["model.context"].message          # StepLSTM is an nn.LSTM


def test_plain_rnn_layers_and_cells_are_found_by_type_as_info():
    # nn.RNN / nn.RNNCell decompose to matmuls and tanh/relu on every device: no fused cell to miss
    report = run(fixture_model("plain_rnn_model"), seq=5)
    for target in ("neuron", "tpu"):
        found = {f.module: f for f in report.targets[target].findings if f.kind == "recurrent_loop"}
        assert found and all(f.severity == "info" for f in found.values()), found
        assert not any(f.kind == "recurrent" for f in report.targets[target].findings)
    record = {m: (op, d) for k, m, op, d in report_features(fixture_model("plain_rnn_model"))}
    assert record["model.rnn"][0] == "aten::rnn_tanh" and record["model.cell"][0] == "aten::rnn_relu_cell"
    assert "nn.RNNCell: no fused cell on any device" in record["model.cell"][1]


def report_features(spec):
    from portkit.stages.fallbacks import recording
    m = registry.load(spec)
    return recording.record(m.module, m.encode(["one two three"], pad_to=4)).features


def _hf(module, name, inputs):
    """A Hugging Face module built from its public architecture's config (random weights), run on `inputs`."""
    m = registry.LoadedModel(name, registry.TOKEN_CLASSIFIER, module.eval(), "random weights from a small config",
                           input_names=tuple(inputs))
    return find_fallbacks(m, inputs, ["neuron", "tpu"])


def test_recurrent_modules_of_real_public_architectures_are_named_with_their_paths():
    """Encodec (Meta's neural audio codec) has an nn.LSTM in its encoder; SLANet (PaddleOCR's table recognizer)
    steps an nn.GRUCell, which the CPU recording sees only as matmuls."""
    from transformers import EncodecConfig, EncodecModel
    from transformers.models.slanet.configuration_slanet import SLANetConfig
    from transformers.models.slanet.modeling_slanet import SLANetSLAHead
    torch.manual_seed(0)
    codec = EncodecModel(EncodecConfig(num_filters=4, upsampling_ratios=[4, 2], codebook_size=16, hidden_size=16,
                                       num_lstm_layers=1, target_bandwidths=[1.5], sampling_rate=8000))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = codec.encoder

        def forward(self, input_values):
            return {"embeddings": self.encoder(input_values)}
    report = _hf(Encoder(), "encodec-encoder", {"input_values": torch.randn(1, 1, 800)})
    assert ("recurrent", "blocker", "encoder.layers.7.lstm") in kinds(report, "neuron")
    assert ("recurrent", "work", "encoder.layers.7.lstm") in kinds(report, "tpu")

    head = SLANetSLAHead(SLANetConfig(post_conv_out_channels=8, out_channels=6, hidden_size=16, max_text_length=3))

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = head

        def forward(self, hidden_states):
            return {"structure": self.head(hidden_states).last_hidden_state}
    report = _hf(Head(), "slanet-head", {"hidden_states": torch.randn(2, 5, 8)})
    found = {f.module: f for f in report.targets["neuron"].findings if f.kind == "recurrent"}
    assert found["head.structure_attention_cell.rnn"].ops == ["aten::_thnn_fused_gru_cell"]
    assert found["head.structure_attention_cell.rnn"].severity == "blocker"
    assert "modeling_slanet.py" in found["head.structure_attention_cell.rnn"].message   # where the cell is stepped


def test_data_dependent_shapes_and_host_syncs():
    report = run(fixture_model("data_dependent_model"))
    found = {(f.kind, f.module): f for f in report.targets["tpu"].findings}
    assert ("data_dependent", "model.select") in found
    # a finding is a cause, an op at its source line: the mask indexing and the nonzero are two lines, two findings
    data = [f for f in report.targets["tpu"].findings if f.kind == "data_dependent"]
    assert {op for f in data for op in f.ops} >= {"aten::index.Tensor", "aten::nonzero"}
    assert all(f.module == "model.select" for f in data) and len({f.where["line"] for f in data}) == len(data)
    assert ("host_sync", "model.select") in found


def test_sparse_tensors_are_blockers():
    report = run(fixture_model("sparse_model"))
    for target in ("neuron", "tpu"):
        assert ("sparse", "blocker", "model.proj") in kinds(report, target)


def test_custom_ops_need_a_kernel_rewrite():
    report = run(fixture_model("custom_op_model"))
    neuron = [f for f in report.targets["neuron"].findings if f.kind == "custom_op"]
    tpu = [f for f in report.targets["tpu"].findings if f.kind == "custom_op"]
    assert neuron[0].module == "model.act" and neuron[0].ops == ["portkit_test::fused_gelu"]
    assert "NKI" in neuron[0].advice and "Pallas" in tpu[0].advice


def test_backward_ops_are_traced_to_their_module():
    report = run("bert", train=True)
    backward = [r for r in report.records if r.phase == "backward"]
    assert backward, "train=True records the backward pass"
    assert any(r.module.endswith("attention.self.query") and r.op == "aten::mm" for r in backward)
    assert sum(r.module == results.ROOT for r in backward) < len(backward) / 4
    # Dropout's random mask has no Neuron kernel in eager mode.
    assert any(o["op"].startswith("aten::bernoulli") and o["status"] == "cpu_fallback"
               for o in report.targets["neuron"].ops)


def test_report_renders_and_saves(tmp_path):
    report = run("lstm")
    html = report._repr_html_()
    assert "emulated" in html and "blocker" in html
    assert "cannot run" in str(report)
    assert "lstm" in str(report.module_table("neuron"))
    report.save(tmp_path / "fallbacks.json")
    saved = json.loads((tmp_path / "fallbacks.json").read_text())
    assert saved["stage"] == "fallbacks"
    assert saved["targets"]["neuron"]["target"]["mode"] == "emulated"
    assert saved["targets"]["neuron"]["counts"]["unsupported"] == 1
    assert {frozenset(f) for f in saved["targets"]["neuron"]["findings"]} == {
        frozenset({"kind", "severity", "module", "ops", "message", "advice", "source", "where", "owner", "cause",
                   "occurrences"})}   # one finding per cause, its occurrences inside it
    fig = report.plot()
    # one ATen-calls panel per target, and the op time once: one CPU profile, named as such, not per target
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3 and sum("top ops by share of op time" in t for t in titles) == 1, titles
    assert "one CPU profile (this machine), the same for neuron and tpu" in titles[-1]
    assert "one CPU profile" in str(report.op_table("neuron"))


def test_reference_target_classifies_against_its_own_kernels():
    report = run("bert", targets=["cpu"])
    counts = report.targets["cpu"].counts()
    assert counts["cpu_fallback"] == 0 and counts["unsupported"] == 0


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_neuronx", "neuron"),
                    reason="needs torch-neuronx and a Trainium device")
def test_native_neuron_collects_the_vendor_record():
    report = run("bert", targets=["neuron"])
    record = report.targets["neuron"].vendor_record
    assert record and "executed_ops" in record


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_tpu", "tpu"), reason="needs torch-tpu and a TPU")
def test_native_tpu_collects_fallback_messages():
    report = run("bert", targets=["tpu"])
    assert "fallback_messages" in report.targets["tpu"].vendor_record


class _ELUHead(torch.nn.Module):
    """Embeddings through ELU: aten::elu has no Neuron kernel, but TorchNeuron's compiler decomposes it."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(30522, 8)

    def forward(self, input_ids, attention_mask):
        return {"features": torch.nn.functional.elu(self.embed(input_ids))}


def elu_model():
    return _ELUHead()


def test_an_op_the_neuron_compiler_decomposes_falls_back_eagerly_but_lowers_compiled():
    m = registry.load(f"{__file__}:elu_model")
    inputs = m.encode(["def f(x): return x"], pad_to=8)
    eager = next(o for o in find_fallbacks(m, inputs, ["neuron"]).targets["neuron"].ops
                 if o["op"] == "aten::elu")
    assert eager["status"] == "cpu_fallback" and "torch.compile decomposes it" in eager["detail"]
    checks = find_graph_breaks(m, inputs, ["neuron", "tpu"]).checks
    assert not any(o["op"] == "aten::elu" for o in checks["neuron"]["not_lowered"])   # not "would not lower"
    assert checks["neuron"]["decomposed"] == {"aten::elu": 1}
    assert checks["tpu"]["decomposed"] == {} and not checks["tpu"]["not_lowered"]   # TPU runs it as elu.out


def test_workload_generate_records_the_decode_steps_a_forward_pass_never_runs(corpus):
    gpt2 = registry.load("gpt2")
    inputs, described = example_batch(gpt2, corpus, batch_size=2, seq_len=32, seed=0)
    prompts = list(corpus.sample(2, 0))
    served = find_fallbacks(gpt2, inputs, ["neuron", "tpu"], RecordSettings(
        description=described, workload="generate", prompts=prompts))
    forward = find_fallbacks(gpt2, inputs, ["neuron", "tpu"], RecordSettings(description=described))
    only = {r.op for r in served.records} - {r.op for r in forward.records}
    # the static cache's writes and greedy decoding's argmax run only when generating
    assert {"aten::index_copy_", "aten::argmax"} <= only, only
    assert "generation of 4 tokens, static KV cache" in served.inputs["description"]
    writes = sum(r.calls for r in served.records if r.op == "aten::index_copy_")
    layers = gpt2.module.model.config.num_hidden_layers
    assert writes == 2 * layers * GENERATED_TOKENS       # keys and values, each layer, each step
    # greedy decoding's argmax belongs to the serving loop (portkit's stands in for the stack's), not the user
    argmax = next(f for f in served.targets["neuron"].findings if "aten::argmax" in f.message)
    assert argmax.where["file"].endswith("portkit/workloads/generation.py") and "argmax" in argmax.where["code"]
    assert argmax.owner["package"] == owners.SERVING_LOOP and argmax.owner["owner"] == owners.LIBRARY
    with pytest.raises(BadParameter, match="workload 'inference'"):
        Options.of({"workload": "generate"}, model="minilm")
