"""The stream's drift statistic: a state's carried error over one step's error at the same chunk, the stream's
second half against its first quarter. It does not depend on the order of the recordings nor on how quiet the stream's
first chunks are (a permutation property, and a step fed silence first), and its worst leaf is never one whose error
is exactly 0. Trailing silence is left out of it; a state wrong from the first chunk is its own check and finding;
a failing stream check is tried at the target's float32 precision before float32 is advised. The noise guarantee (flat
noise passes, a steady rise fails) is pinned in tests/corpora/test_audio.py."""
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from portkit.core.errors import BadParameter
from portkit.models import audio
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS
from portkit.workloads import streaming

BUDGET = DEFAULT_TASK_BOUNDS["drift_growth"]
# Five recordings of 12 chunks each: their error levels span 10^2 (a whisper to a shout), each chunk's noise its own.
LEVELS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4)
NOISE = np.exp(np.random.default_rng(7).normal(0, 0.3, (len(LEVELS), 12)))


def _errors(order, rate: float) -> tuple[list[float], list[float]]:
    """One step's error (the recording's level times its chunks' noise) and the carried error of a state that
    keeps half of its earlier error each chunk (a stable recurrence) and, where `rate` > 0, is amplified more with
    every chunk of the stream, whatever is playing (drift: (1 + rate * chunk)^2)."""
    single = np.concatenate([LEVELS[k] * NOISE[k] for k in order])
    carried, memory = [], 0.0
    for t, s in enumerate(single):
        memory = 0.5 * memory + s
        carried.append(memory * (1 + rate * t) ** 2)
    return carried, list(single)


def _check(carried, single) -> dict:
    run = streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, carried, single, 1.0)
    return streaming.drift_check(run, DEFAULT_TASK_BOUNDS)


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(len(LEVELS))))
def test_the_drift_verdict_does_not_depend_on_the_order_of_the_recordings(order):
    """Rule: the drift statistic is independent of the recordings' order. The same recordings in any order: a
    stable state passes and a drifting one fails, although the carried error alone swings 10^2 with the order."""
    flat, single = _errors(order, 0.0)
    check = _check(flat, single)
    assert check["passed"] and check["value"] < BUDGET
    drifting, single = _errors(order, 0.5)
    check = _check(drifting, single)
    assert not check["passed"] and check["trend"]["rising"] and check["value"] > BUDGET


def test_a_quiet_start_is_no_drift():
    """Rule: how quiet the stream's first chunks are does not decide. Quietest recording first, loudest last: the
    carried error's second half is over 10x its first chunks (what the first-3-chunk yardstick called drift), the
    state is stable, and the check passes."""
    carried, single = _errors(range(len(LEVELS)), 0.0)
    assert np.median(carried[len(carried) // 2:]) / np.median(carried[:3]) > 10
    assert _check(carried, single)["passed"]


class _Leaky(nn.Module):
    """A stable recurrence with no bias: silence into its zero state stays exactly 0, speech gives it an error."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Linear(1600, 16, bias=False)
        self.mix = nn.Linear(16, 16, bias=False)

    def forward(self, chunk, state):
        state = torch.tanh(0.5 * self.mix(state) + self.features(chunk))
        return state.unsqueeze(-1), state


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.2 * np.sin(7 * t)))).astype(np.float32)


def test_a_stream_that_starts_in_silence_or_quiet_does_not_drift_on_a_stable_step():
    """Rule: neither a quiet start nor the recordings' order makes drift, on a step built for it. 1.5 s of digital
    silence (the state equal to float64's, error exactly 0, the old yardstick's zero) then a tone; a quiet tone
    then a loud one, and the other way round: a stable step passes in each."""
    step = audio.StreamStep("leaky", _Leaky().eval(), 1600, (-1, 16), "test recurrence")
    silence, loud, quiet = np.zeros(24000, dtype=np.float32), _tone(2.5), 0.02 * _tone(2.0)
    for parts in ((silence, loud), (quiet, loud), (loud, quiet)):
        stream = streaming.Stream(np.concatenate(parts), 16000, "silence and tones", "synthetic")
        run = streaming.check_stream(step, stream, ["tpu"]).runs[0]
        assert run.passed and run.growth < BUDGET, run.checks[0]
        if parts[0] is silence:
            assert max(run.state_error[:3]) == 0 < run.state_error[-1]


def test_the_worst_leaf_is_never_one_whose_error_is_exactly_0():
    """Rule: the drift's worst leaf has an error. A leaf exact at every chunk (a buffer of raw samples) beside one
    whose error falls: the falling one is named, the exact one is marked exact; all leaves exact names none."""
    errors = list(1e-5 * np.exp(np.linspace(0, -1, 40)))
    run = streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, errors, errors, 1.0,
                                 leaf_errors={"h": errors, "buffer": [0.0] * 40},
                                 leaf_step_errors={"h": [1e-5] * 40, "buffer": [0.0] * 40})
    assert run.drift_leaf == "h" and run.leaf_summary()["buffer"]["exact"]
    exact = streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, [0.0] * 40, [0.0] * 40,
                                   1.0, leaf_errors={"a": [0.0] * 40, "b": [0.0] * 40},
                                   leaf_step_errors={"a": [0.0] * 40, "b": [0.0] * 40})
    check = streaming.drift_check(exact, DEFAULT_TASK_BOUNDS)
    assert exact.drift_leaf is None and check["passed"]
    assert "every state leaf equals float64's exactly" in check["label"]


class _LeakyWithTail(_Leaky):
    """_Leaky beside a buffer of the chunk's last 8 samples: a state part the target carries exactly."""

    def forward(self, chunk, state):
        out, h = super().forward(chunk, state["h"])
        return out, {"h": h, "tail": chunk[:, -8:].clone()}


def test_a_state_part_carried_exactly_is_not_the_worst_leaf_of_a_real_stream():
    """Rule: the worst leaf has an error, on a step built for it: its raw-sample buffer is exact on the target, so
    the drift names the recurrent leaf and the buffer's summary says exact."""
    step = audio.StreamStep("leaky-tail", _LeakyWithTail().eval(), 1600, {"h": (-1, 16), "tail": (-1, 8)},
                                   "test recurrence")
    run = streaming.check_stream(step, streaming.Stream(_tone(2.5), 16000, "a tone", "synthetic"), ["tpu"]).runs[0]
    assert max(run.leaves["state_tail"]) == 0 and run.leaf_summary()["state_tail"]["exact"]
    assert run.drift_leaf == "state_h" and "state leaf state_h" in run.checks[0]["label"]


class _Cancelling(nn.Module):
    """A stable recurrence fed the difference of two near-equal projections of the chunk (weights 1e-3 apart): a
    matmul whose operands are rounded to bf16 (TPU's default precision) loses that difference at the first chunk,
    and the state, forgetting half of itself each chunk, stays as wrong as that without growing. Its one output has
    one entry on its last axis, so the stream's output checks measure nothing."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(1600, 16, bias=False), nn.Linear(1600, 16, bias=False)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight * (1 + 1e-3))

    def forward(self, chunk, state):
        state = 0.5 * state + 1e3 * (self.b(chunk) - self.a(chunk))
        return state.unsqueeze(-1), state


class _Float64Cancelling(_Cancelling):
    """_Cancelling computed in float64, as written: the model's own arithmetic keeps the difference, while a target
    whose dtype rules run float64 as float32 (TPU, Neuron) loses it at every precision it has."""

    def __init__(self):
        super().__init__()
        self.double()

    def forward(self, chunk, state):
        x = chunk.double()
        state = 0.5 * state + (1e3 * (self.b(x) - self.a(x))).float()
        return state.unsqueeze(-1), state


def test_a_state_wrong_from_the_first_chunk_is_its_own_finding_not_drift():
    """Rule (streams: a state wrong at once is told apart from one that drifts): a state whose one step from the
    float64 state is beyond its precision's tolerance, and beyond twice the model's own float32 error, at the first
    chunk fails the state-level check and is the stream_state finding, while the drift check, which sees no growth,
    passes; nothing is left to output checks that here measure nothing. The model computes in float64, which the
    target runs as float32 at every precision: the float32 precision, tried, still fails, so it is a blocker. A
    stable step (_Leaky) passes the same level check at the same precision."""
    from portkit.stages.accuracy.result import AccuracyReport
    step = audio.StreamStep("float64 cancelling", _Float64Cancelling().eval(), 1600, (-1, 16), "test recurrence")
    result = streaming.check_stream(step, streaming.Stream(_tone(3.0), 16000, "a tone", "synthetic"), ["tpu"])
    run = result.runs[0]
    checks = {c["metric"]: c for c in run.checks}
    assert checks["drift_growth"]["passed"] and not checks["state_error"]["passed"]
    assert run.level["first_chunk"] > checks["state_error"]["bound"] and "wrong from the first chunk" in str(run)
    found = {f.kind: f for f in AccuracyReport({}, {}, {}, {}, stream=result).stream_findings("tpu")}
    assert "stream_drift" not in found
    found = found["stream_state"]
    assert found.severity == "blocker" and "does not grow" in found.message
    assert "tried: precision 'highest'" in found.advice and "still fails" in found.advice
    stable = audio.StreamStep("leaky", _Leaky().eval(), 1600, (-1, 16), "test recurrence")
    run = streaming.check_stream(stable, streaming.Stream(_tone(3.0), 16000, "a tone", "synthetic"), ["tpu"]).runs[0]
    assert {c["metric"]: c["passed"] for c in run.checks}["state_error"] and run.level["median"] < run.state_rtol


def test_trailing_silence_is_left_out_of_the_drift():
    """Rule (streams: silence at the end is no drift): 3 s of tone then 3 s of digital silence on a stable step. In
    the silence one step's error is the rounding of a resting state, far below what the state carries from the tone,
    so over the whole stream the statistic reads a rise beyond its budget (the old reading); the check judges the
    chunks up to the last sound, says how many chunks of silence it left out, and passes."""
    step = audio.StreamStep("leaky", _Leaky().eval(), 1600, (-1, 16), "test recurrence")
    stream = streaming.Stream(np.concatenate([_tone(3.0), np.zeros(48000, dtype=np.float32)]), 16000,
                              "a tone, then silence", "synthetic")
    run = streaming.check_stream(step, stream, ["tpu"]).runs[0]
    whole = _check(run.state_error, run.step_error)                 # every chunk, the silence counted
    assert not whole["passed"] and whole["trend"]["rising"] and whole["value"] > BUDGET      # read as drift
    assert run.sound_chunks == 30 and run.trailing_silence == 30
    drift = run.checks[0]
    assert drift["passed"] and not drift["trend"]["rising"] and "last 30 chunks are silence" in drift["label"]
    with pytest.raises(BadParameter, match="chunks with sound"):
        quiet = np.concatenate([_tone(1.0), np.zeros(48000, dtype=np.float32)])
        streaming.check_stream(step, streaming.Stream(quiet, 16000, "mostly silence", "synthetic"), ["tpu"])


class _NearTieStream(nn.Module):
    """Two logits per chunk from weights 1e-3 apart (the same chunk through both): float32 tells them apart, a matmul
    whose operands are rounded to bf16 (TPU's default precision) does not, so its top-1 labels part from float64's.
    Its state halves each chunk from 1, exactly in any precision: nothing drifts and nothing is wrong in it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.near = nn.Linear(1600, 2, bias=False)
        with torch.no_grad():
            self.near.weight[1] = self.near.weight[0] * (1 + 1e-3)

    def forward(self, chunk, state):
        return self.near(chunk), 0.5 * state


def test_a_stream_check_that_float32_fixes_is_work_and_says_it_was_tried():
    """Rule (advice that was tried, one grading policy): a stream check failing at the target's default precision is
    run again at its float32 precision on the same stream; where that passes, the finding is work (the policy's
    FIXED_BY_SETTING) and says "tried: ... passes": a near-tie output, and a state that cancels near-equal terms (at
    float32 as close as the model's own float32 step). Where it still fails, a blocker (the test above). Never advice
    to use float32 that portkit did not run."""
    from portkit.core import grading
    from portkit.models import inputs
    from portkit.stages.accuracy.result import AccuracyReport
    step = audio.StreamStep("near-tie", _NearTieStream().eval(), 1600, (-1, 4), "test head", initial_value=1.0,
                            outputs=(inputs.Output("logits", inputs.CLASSIFIER),))
    result = streaming.check_stream(step, streaming.Stream(_tone(3.0), 16000, "a tone", "synthetic"), ["tpu"])
    run = result.runs[0]
    assert run.tried == {"precision": "highest", "setting": run.tried["setting"], "checks": {"agreement:logits": True}}
    [found] = AccuracyReport({}, {}, {}, {}, stream=result).stream_findings("tpu")
    assert found.kind == "stream_output" and found.severity == grading.severity("stream_output",
                                                                                grading.FIXED_BY_SETTING) == "work"
    assert "tried: precision 'highest' passes" in found.advice
    # a state wrong from the first chunk at bf16 operands, and at float32 as exact as the model's own float32 step
    cancelling = audio.StreamStep("cancelling", _Cancelling().eval(), 1600, (-1, 16), "test recurrence")
    result = streaming.check_stream(cancelling, streaming.Stream(_tone(3.0), 16000, "a tone", "synthetic"), ["tpu"])
    [found] = AccuracyReport({}, {}, {}, {}, stream=result).stream_findings("tpu")
    assert found.kind == "stream_state" and found.severity == "work"
    assert "tried: precision 'highest' passes" in found.advice


def test_the_built_in_gru_stream_ending_in_silence_does_not_drift():
    """Rule (streams: silence at the end is no drift), on the registry's built-in streaming step (gru-stream: STFT
    log-mel front end and GRU): 3 s of tone then 3 s of digital silence. Over every chunk the silence makes its
    carried error hundreds of times one step's (the GRU rests; one step's error there is ~1e-7) and the old
    reading fails it; judged up to the last sound, it passes, with its state within its precision's tolerance from
    the first chunk and nothing to try at float32."""
    step = audio.gru_step()
    stream = streaming.Stream(np.concatenate([_tone(3.0), np.zeros(48000, dtype=np.float32)]), 16000,
                              "a tone, then silence", "synthetic")
    run = streaming.check_stream(step, stream, ["tpu"]).runs[0]
    whole = _check(run.state_error, run.step_error)
    assert not whole["passed"] and whole["value"] > 10 * BUDGET
    assert run.trailing_silence == 30 and run.passed and run.tried is None
    assert {c["metric"] for c in run.checks} >= {"drift_growth", "state_error"}


def test_the_reports_stream_row_says_a_state_wrong_from_the_start_and_the_silence_left_out():
    """Rule (streams, the report): the target's stream cell names one step's error at the start against its
    tolerance (so a FAIL with a flat growth reads as a state wrong from the start) and the trailing silence the
    drift left out."""
    from portkit.stages.report import sections
    errors = [0.1] * 30 + [0.05] * 10
    run = streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, errors, errors, 1.0,
                                 sound_chunks=30, state_rtol=0.016)
    run.checks = [streaming.drift_check(run, DEFAULT_TASK_BOUNDS), streaming.level_check(run)]
    row = sections._stream_row(json.loads(json.dumps(run.to_dict())))
    assert row.startswith("FAIL") and "one step 0.1 at the start (beyond 0.016)" in row
    assert "10 chunks of trailing silence left out" in row and "growth 1.00x" in row
