"""Streaming steps declared as users have them: a state of several tensors (an LSTM cell's (h, c) beside a context
buffer), one speech probability per chunk judged by its decisions at a threshold, logits still judged by argmax,
and state declarations that cannot mean anything refused. Small steps and 1 s streams: the file runs in seconds."""
import numpy as np
import pytest
import torch
from torch import nn

from portkit.core.errors import BadParameter
from portkit.models import audio
from portkit.models import inputs
from portkit.models import registry
from portkit.stages.accuracy.result import AccuracyReport
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS
from portkit.workloads import streaming

CHUNK, CONTEXT, HIDDEN = 512, 64, 16          # silero-vad's framing at 16 kHz: 512 new samples, 64 of context


def _stream(seconds: float = 1.0) -> streaming.Stream:
    """A gliding tone that stops and starts (speech-like on and off) over low noise."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * 16000)) / 16000
    gate = (np.sin(2 * np.pi * 1.5 * t) > 0).astype(np.float64)
    samples = 0.3 * gate * np.sin(2 * np.pi * 180 * t * (1 + 0.2 * np.sin(t))) + 0.01 * rng.standard_normal(t.size)
    return streaming.Stream(samples.astype(np.float32), 16000, "a gated gliding tone", "synthetic")


class _VAD(nn.Module):
    """A voice-activity step as users write one: state {"lstm": (h, c), "context": the last CONTEXT samples};
    per chunk one speech probability (sigmoid), or two-class logits where `logits`."""

    def __init__(self, logits: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Linear(CONTEXT + CHUNK, 32)
        self.cell = nn.LSTMCell(32, HIDDEN)
        self.head = nn.Linear(HIDDEN, 2 if logits else 1)
        self.logits = logits

    def forward(self, chunk, state):
        h, c = state["lstm"]
        x = torch.cat([state["context"], nn.functional.pad(chunk, (0, CHUNK - chunk.shape[-1]))], dim=-1)
        h, c = self.cell(torch.tanh(self.features(10 * x)), (h, c))
        out = self.head(h)
        new = {"lstm": (h, c), "context": x[:, -CONTEXT:]}
        return (out if self.logits else torch.sigmoid(out)[:, 0]), new


STATE = {"lstm": ((-1, HIDDEN), (-1, HIDDEN)), "context": (-1, CONTEXT)}


def _vad_step(logits: bool = False) -> audio.StreamStep:
    output = inputs.Output("logits", inputs.CLASSIFIER) if logits else inputs.Output("speech", inputs.PROBABILITY)
    return audio.StreamStep("vad", _VAD(logits).eval(), CHUNK, STATE, "test LSTM cell VAD", outputs=(output,))


def test_a_state_of_several_tensors_is_carried_and_every_leaf_measured():
    step = _vad_step()
    assert list(step.state_leaves) == ["state_lstm_0", "state_lstm_1", "state_context"]
    result = streaming.check_stream(step, _stream(), ["neuron", "tpu"])
    for run in result.runs:
        d = run.to_dict()
        assert set(d["leaves"]) == {"state_lstm_0", "state_lstm_1", "state_context"}
        assert d["leaves"]["state_context"]["error_max"] == 0.0          # raw samples, copied: exact on any target
        assert d["leaves"]["state_lstm_1"]["error_last"] > 0.0           # the cell state carries rounding
        assert run.state_error == [max(e) for e in zip(*run.leaf_errors.values())]
        speech = d["outputs"]["speech"]
        assert speech["kind"] == inputs.PROBABILITY and speech["threshold"] == 0.5
        assert 0.0 <= speech["mae"] <= speech["max_abs"] < 0.05 and speech["decisions"] == result.chunks
        assert [c["metric"] for c in speech["checks"]] == ["probability_mae", "agreement"] and speech["passed"]
        assert run.agreement == speech["decision_agreement"]
        assert "speech (probability): decisions at 0.5 agree" in str(result)
    tpu = result.runs[1].to_dict()["leaves"]["state_lstm_1"]["error_last"]
    assert tpu > 10 * result.runs[0].to_dict()["leaves"]["state_lstm_1"]["error_last"]   # bf16 operands vs fp32


def test_the_stream_declaration_gives_one_input_per_state_leaf():
    step = _vad_step()
    model = audio.StreamAdapter(step).eval()
    decl = audio.stream_declaration(step)
    batch = decl.batch([np.zeros(8000, np.float32), np.zeros(300, np.float32)])
    assert set(batch) == {"chunk", "state_lstm_0", "state_lstm_1", "state_context"}
    assert batch["state_context"].shape == (2, CONTEXT) and decl.outputs == step.outputs
    with torch.no_grad():
        out = model(**batch)
    assert out["speech"].shape == (2,) and out["state_lstm_1"].shape == (2, HIDDEN)


def test_logits_are_still_judged_by_argmax_agreement():
    run = streaming.check_stream(_vad_step(logits=True), _stream(), ["tpu"]).runs[0]
    logits = run.outputs["logits"]
    assert logits["metric"] == "top-1 agreement" and logits["classes"] == 2
    assert run.agreement == logits["agreement"] and logits["checks"][0]["metric"] == "agreement"
    assert "threshold" not in logits


class _Chaotic(nn.Module):
    """The logistic map at r = 3.9 through a matmul (any rounding grows each step), read out as a probability
    that crosses 0.5 as the map wanders: deliberately unstable, so the target's decisions flip."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(8, 8, bias=False)
        nn.init.eye_(self.mix.weight)

    def forward(self, chunk, state):
        x = self.mix(state[0]) + 1e-3 * chunk.mean()
        x = 3.9 * x * (1 - x)
        return torch.sigmoid(40 * (x - 0.5)), (x, state[1])


def test_a_probability_whose_decisions_flip_fails_its_decision_check():
    step = audio.StreamStep("chaotic", _Chaotic(), 1600, ((-1, 8), (-1, 1)), "test recurrence",
                                   initial_value=0.3, outputs=(inputs.Output("p", inputs.PROBABILITY),))
    result = streaming.check_stream(step, _stream(4.0), ["tpu"])
    run = result.runs[0]
    (decisions,) = [c for c in run.checks if c["output"] == "p" and c["metric"] == "agreement"]
    assert not decisions["passed"] and decisions["value"] < DEFAULT_TASK_BOUNDS["agreement"]
    assert run.outputs["p"]["flips"] > 0 and not run.passed
    report = AccuracyReport({"name": "chaotic"}, {}, {}, {}, stream=result)
    kinds = {f.kind for f in report.stream_findings("tpu")}
    assert "stream_output" in kinds
    message = next(f.message for f in report.stream_findings("tpu") if f.kind == "stream_output")
    assert "streamed output 'p'" in message
    assert any("decisions (p >= 0.5)" in f.message and "budget >= 0.99" in f.message
               for f in report.stream_findings("tpu"))


def test_a_declared_threshold_moves_the_decisions():
    step = _vad_step()
    out = audio.StreamOutput("speech", inputs.PROBABILITY, threshold=0.9)
    step = audio.StreamStep("vad", step.module, CHUNK, STATE, "test", outputs=(out,))
    found = streaming.output_metrics(step, [{"speech": torch.tensor([0.85, 0.95])}],
                                     [{"speech": torch.tensor([0.95, 0.95], dtype=torch.float64)}], DEFAULT_TASK_BOUNDS)
    assert found["speech"]["threshold"] == 0.9 and found["speech"]["flips"] == 1 and not found["speech"]["passed"]
    with pytest.raises(BadParameter, match="invalid threshold of stream output 'speech' 1.5"):
        audio.StreamOutput("speech", inputs.PROBABILITY, threshold=1.5)


def test_one_probability_declared_as_a_classifier_is_not_judged_by_argmax():
    step = audio.StreamStep("vad", _VAD().eval(), CHUNK, STATE, "test",
                                   outputs=(inputs.Output("speech", inputs.CLASSIFIER),))
    found = streaming.output_metrics(step, [{"speech": torch.tensor([[0.1]])}],
                                     [{"speech": torch.tensor([[0.9]], dtype=torch.float64)}], DEFAULT_TASK_BOUNDS)
    assert found["speech"]["checks"] == [] and "inputs.PROBABILITY" in found["speech"]["note"]


@pytest.mark.parametrize("shape, leaf, found", [((4, 16), "state", "none"), ({"h": (-1, -1)}, "state_h", "2"),
                                                ({"h": (-1, 4), "c": (4,)}, "state_c", "none")])
def test_a_state_without_one_batch_axis_is_refused_naming_it(shape, leaf, found):
    with pytest.raises(BadParameter, match=rf"invalid state shape {leaf} \(.*\): .*\(found {found}\)"):
        audio.StreamStep("bad", _VAD(), CHUNK, shape, "test")


def test_other_bad_stream_declarations_are_one_line():
    with pytest.raises(BadParameter, match="invalid state shape state_h"):
        audio.StreamStep("bad", _VAD(), CHUNK, {"h": "wide"}, "test")
    with pytest.raises(BadParameter, match="invalid outputs of step 'bad'"):
        audio.StreamStep("bad", _VAD(), CHUNK, STATE, "test", outputs=(inputs.Output("state_context", "x"),))
    step = audio.StreamStep("bad", _VAD(), CHUNK, STATE, "test", outputs=(inputs.Output("speech", "pitch"),))
    with pytest.raises(BadParameter, match="unknown metric of stream output 'speech' 'pitch'; choose one of: .*proba"):
        streaming.check_stream(step, _stream(), ["tpu"])


def test_a_state_returned_with_its_keys_reordered_is_matched_by_path():
    step = _vad_step()
    h, c, context = torch.zeros(1, HIDDEN), torch.ones(1, HIDDEN), torch.full((1, CONTEXT), 2.0)
    flat = step.flat_state({"context": context, "lstm": [h, c]})          # dict order swapped, a list for the tuple
    assert list(flat) == ["state_lstm_0", "state_lstm_1", "state_context"]
    assert flat["state_lstm_1"] is c and flat["state_context"] is context
    with pytest.raises(BadParameter, match=r"invalid state returned by step 'vad' .*declared structure"):
        step.flat_state({"lstm": (h,)})


def test_stage_four_compiled_keeps_a_state_whose_batch_axis_is_not_the_first():
    """gru-stream's state is (layers, batch, hidden): split into calls of a few rows along axis 0 it reached the GRU
    as (29, 4, 64) and stage 4 crashed; a batch whose inputs do not all lead with the batch goes in one call."""
    from portkit.corpora import corpus
    from portkit.stages.accuracy import stage
    m = registry.load("gru-stream")
    items = corpus.corpus_for(m)
    batch, described = corpus.example_batch(m, items, batch_size=4, seq_len=32, seed=0)
    found = stage.check_accuracy(m, batch, ["tpu"], stage.Options.of({"batch_size": 4, "seed": 0}),
                                    corpus=items, description=described,
                                    scope=stage.Scope(compiled=True, progress=False, task_items=8,
                                                         all_precisions=False, layers=False))
    assert "compiled with portkit_tpu" in str(found)


def test_a_stream_that_does_not_divide_into_chunks_ends_in_a_padded_whole_chunk():
    """gru-stream's STFT reads 400 samples: a remainder shorter than that raised inside the step; padded with
    silence to the chunk size, the last chunk has the warm-up's shape and the stream runs to its end."""
    from portkit.workloads import streaming
    stream = streaming.Stream(np.arange(1000, dtype=np.float32) / 1000, 16000, "test", "test")
    chunks = stream.chunks(300)
    assert [tuple(c.shape) for c in chunks] == [(1, 300)] * 4
    assert float(chunks[-1][0, 99]) == pytest.approx(0.999) and float(chunks[-1][0, 100:].abs().sum()) == 0


def test_a_state_returned_as_a_view_recompiles_mid_stream_and_the_finding_says_how_to_copy_it():
    """_VAD hands its context back as x[:, -CONTEXT:], a view with x's strides: Dynamo guards on strides, so the
    second chunk compiles again. That compile is a finding naming the guard and the copy that keeps the layout;
    the same step returning a fresh buffer compiles nothing during the stream."""
    from portkit.stages.accuracy import stream_findings

    class Copied(_VAD):
        def forward(self, chunk, state):
            out, new = super().forward(chunk, state)
            return out, {**new, "context": new["context"].clone(memory_format=torch.contiguous_format)}

    viewed = streaming.check_stream(_vad_step(), _stream(), ["tpu"]).runs[0]
    assert viewed.late_compiles >= 1
    found = stream_findings.stream_recompile(viewed)
    assert found.severity == "work" and "stride" in found.message and "contiguous_format" in found.advice
    step = audio.StreamStep("vad", Copied().eval(), CHUNK, STATE, "test LSTM cell VAD",
                                   outputs=(inputs.Output("speech", inputs.PROBABILITY),))
    assert streaming.check_stream(step, _stream(), ["tpu"]).runs[0].late_compiles == 0


class _Float64VAD(_VAD):
    """_VAD computing in float64 as some users write a step for accuracy: the chunk and the state are cast up and
    the state handed back in float64 (its context a fresh buffer, so no stride guard is in play)."""

    def __init__(self):
        super().__init__()
        self.double()

    def forward(self, chunk, state):
        state = {"lstm": tuple(t.double() for t in state["lstm"]), "context": state["context"].double()}
        out, new = super().forward(chunk.double(), state)
        return out, {**new, "context": new["context"].clone(memory_format=torch.contiguous_format)}


def test_a_step_that_carries_its_state_in_float64_starts_from_a_float64_state_and_compiles_nothing_mid_stream():
    """Rule (a stream's first state is the step's own): a step that hands its state back in float64 got portkit's
    float32 initial state on the first chunk and its own float64 state from the second, a dtype guard failure and
    one compile mid-stream under every backend (the CPU's Inductor too), an artefact of the harness, not of the
    target's float64 rule (which casts results back to float64). The stream now starts from the state in the dtype
    the step carries (StreamStep.carried_dtypes), says so, and compiles only in its warm-up."""
    step = audio.StreamStep("vad64", _Float64VAD().eval(), CHUNK, STATE, "test float64 VAD",
                            outputs=(inputs.Output("speech", inputs.PROBABILITY),))
    assert set(step.carried_dtypes().values()) == {torch.float64}
    assert all(t.dtype == torch.float64 for t in step.flat_state(step.carried_state()).values())
    found = streaming.check_stream(step, _stream(), ["tpu"])
    run = found.runs[0]
    assert run.late_compiles == 0 and all(c["when"] == "warm-up" for c in run.compiles), run.compiles
    assert found.step["state_dtypes"] == {name: "float64" for name in step.state_leaves}
    # a step carrying float32 keeps its float32 state: nothing changes for it
    assert set(_vad_step().carried_dtypes().values()) == {torch.float32}
