"""Stage 3 on models whose outputs follow the input at a stride (a frame per hop of samples), and on models the
target's compiler refuses: the padding check compares a strided output's real frames only, says so where it
cannot tell them, still catches a model that mixes padding into real frames; a refusal is a finding, not a crash."""
import json
import re

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from portkit.core.errors import BadParameter
from portkit.core.findings import cause_key
from portkit.corpora.corpus import Corpus, make_trace
from portkit.models import inputs
from portkit.models import registry
from portkit.planning import economics
from portkit.stages.buckets import output_probe
from portkit.stages.buckets import stage

HOP, LONGEST, SHORTEST = 4, 256, 8


class Framed(nn.Module):
    """One output position per HOP samples, each the mean of its own `window` samples (torch.unfold: a frame
    is made of real samples only, so padding after the last one never reaches a real frame)."""

    def __init__(self, window: int = HOP):
        super().__init__()
        self.window = window

    def forward(self, waveform):
        return {"frames": waveform.unfold(-1, self.window, HOP).mean(-1) * 2.0}


class Mixing(Framed):
    """The same frames, each plus the mean over all frames: padded frames change the real ones."""

    def forward(self, waveform):
        frames = super().forward(waveform)["frames"]
        return {"frames": frames + frames.mean(-1, keepdim=True)}


class RefusedWhenLong(Framed):
    """Framed, but an input longer than 64 samples is first padded by an amount held in a tensor, as EnCodec pads
    (transformers' modeling_encodec.py, _pad1d): compiled, the amount is a size read from a tensor, which a
    static-shape target's compiler refuses. Eager, it pads by nothing."""

    def __init__(self):
        super().__init__()
        self.register_buffer("extra", torch.tensor(0), persistent=False)

    def forward(self, waveform):
        if waveform.shape[-1] > 64:
            waveform = F.pad(waveform, (0, self.extra))
        return super().forward(waveform)


def build(items, sizes):
    n = sizes["samples"]
    wave = torch.zeros(len(items), n)
    for row, clip in enumerate(items):
        cut = torch.as_tensor(np.asarray(clip[:n], dtype=np.float32))
        wave[row, :len(cut)] = cut
    return {"waveform": wave}


def declared(module, output: inputs.Output, name: str = "framed", shortest: int = SHORTEST, longest: int = LONGEST):
    decl = inputs.Declaration(
        inputs=(inputs.TensorSpec("waveform", torch.float32, ("batch", "samples")),),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim("samples", varies=True, max=longest, min=shortest)),
        build=build, measure=lambda items: {"samples": [len(c) for c in items]}, outputs=(output,),
        data=inputs.AUDIO, sample_rate=16_000)
    return registry.LoadedModel(name, inputs.WAVEFORM, module.eval(), "test model", declaration=decl)


@pytest.fixture(scope="module")
def waves():
    """Clips of 8 to 256 samples around 0.5 (a mean over padded frames moves it), lengths not multiples of HOP."""
    rng = np.random.default_rng(0)
    lengths = [9, 13, 22, 30, 37, 45, 51, 63, 70, 83, 99, 121, 150, 177, 201, 230, 255]
    return Corpus("waves", "random (seed 0)", tuple(
        (0.5 + 0.1 * rng.standard_normal(n)).astype(np.float32) for n in lengths))


def stage3(m, corpus, chosen: dict[str, list[int]]):
    """Stage 3's replay for each target's chosen buckets, as fit_buckets runs it: {target: TargetBuckets}."""
    trace = make_trace(corpus, m, 6, seed=1, dist=stage.distribution(corpus, m))
    plans = {t: stage.plan_buckets(b, "optimal", k=len(b)) for t, b in chosen.items()}   # exactly these buckets
    costs = {t: economics.neuron_estimate(1_000_000) for t in chosen}
    return stage.replay_targets(m, trace, [], plans, costs, replay=stage.Replay(progress=False))


def kinds(t) -> dict[str, str]:
    return {f["kind"]: f["severity"] for f in t.findings()}


# ---------------------------------------------------------------- how an output follows the input
def test_an_output_declares_its_stride_and_bad_declarations_name_the_value():
    frames = inputs.Output("frames", inputs.WAVEFORM, stride=4)
    assert [frames.positions(n) for n in (3, 4, 7, 8, 9)] == [0, 1, 1, 2, 2]
    assert [inputs.Output("f", inputs.WAVEFORM, stride=8, ceil=True).positions(n) for n in (1, 8, 9, 64, 66)] == [
        1, 1, 2, 8, 9]                                                      # EnCodec: ceil(n / 8)
    conv = nn.Conv1d(1, 1, kernel_size=7, stride=3, padding=2)              # window = kernel - 2 * padding
    for n in (7, 10, 31, 100):
        assert inputs.Output("f", "x", stride=3, window=3).strided
        assert conv(torch.zeros(1, 1, n)).shape[-1] == inputs.Output("f", "x", stride=3, window=3).positions(n)
    assert not inputs.Output("logits", inputs.CLASSIFIER).strided
    declared = inputs.Declaration((inputs.TensorSpec("wave", torch.float32, ("batch", "samples")),),
                                  (inputs.Dim("batch", batch=True), inputs.Dim("samples", varies=True, max=64)),
                                  lambda items, sizes: {}, lambda items: {"samples": []}, (frames,), inputs.AUDIO,
                                  sample_rate=8000)
    assert declared.to_dict()["outputs"] == [{"name": "frames", "metric": inputs.WAVEFORM, "stride": 4,
                                              "window": None, "ceil": False}]        # the run records it
    for bad in ({"stride": 0}, {"stride": 2.5}, {"window": "8"}, {"ceil": "yes"}):
        with pytest.raises(BadParameter, match=f"{next(iter(bad))} of output 'f' {bad[next(iter(bad))]!r}"):
            inputs.Output("f", "x", **bad)


def test_the_probe_finds_a_declared_or_a_plain_stride_and_says_when_none_explains_the_output():
    found = output_probe.output_dims(declared(Framed(), inputs.Output("frames", inputs.WAVEFORM, stride=HOP)))
    assert found["frames"] == output_probe.OutputDims((0,), (1,), HOP, HOP, False, "declared")
    found = output_probe.output_dims(declared(Framed(), inputs.Output("frames", inputs.WAVEFORM)))
    assert found["frames"] == output_probe.OutputDims((0,), (1,), HOP, HOP, False, "probed stride")
    # window 8 at hop 4: (n - 8) // 4 + 1, which no stride with window = stride gives at both probe lengths
    found = output_probe.output_dims(declared(Framed(window=8), inputs.Output("frames", inputs.WAVEFORM)))
    assert found["frames"].seq == () and "no one stride explains" in found["frames"].unchecked
    found = output_probe.output_dims(declared(Framed(window=8), inputs.Output("frames", inputs.WAVEFORM, stride=HOP,
                                                                          window=8)))
    assert found["frames"].seq == (1,) and found["frames"].unchecked is None
    # a declaration the outputs contradict is not used to slice them
    found = output_probe.output_dims(declared(Framed(), inputs.Output("frames", inputs.WAVEFORM, stride=3)))
    assert found["frames"].seq == () and "declares stride 3" in found["frames"].unchecked


# ---------------------------------------------------------------- the padding check on strided outputs
@pytest.mark.parametrize("output", [inputs.Output("frames", inputs.WAVEFORM, stride=HOP),
                                    inputs.Output("frames", inputs.WAVEFORM)], ids=["declared", "probed"])
def test_a_strided_output_is_checked_at_its_real_frames_and_passes(waves, output):
    t = stage3(declared(Framed(), output), waves, {"tpu": [64, 256]})["tpu"]
    (run,) = [r for r in t.runs if r.plan]
    assert run.padding_checks and run.padding_ok is True, run.padding_checks
    assert all(c["unchecked"] == {} for c in run.padding_checks)
    assert "padding" not in kinds(t) and "padding_unchecked" not in kinds(t)
    assert "padding check passed" in t.summary()


def test_an_output_no_stride_explains_could_not_be_checked_and_is_no_blocker(waves):
    t = stage3(declared(Framed(window=8), inputs.Output("frames", inputs.WAVEFORM)), waves, {"tpu": [64, 256]})["tpu"]
    (run,) = [r for r in t.runs if r.plan]
    assert run.padding_checks and run.padding_ok is None and all(c["ok"] is None for c in run.padding_checks)
    found = {f["kind"]: f for f in t.findings()}
    assert "padding" not in found and found["padding_unchecked"]["severity"] == "work"
    assert "'frames'" in found["padding_unchecked"]["message"] and "stride=" in found["padding_unchecked"]["advice"]
    assert "could not check padding of output(s) frames" in t.summary()
    saved = json.loads(json.dumps(t.to_dict()))
    assert saved["padding_ok"] is None and "frames" in saved["padding_unchecked"]
    report = stage.BucketReport({"name": "framed"}, {}, None, 2, [], {}, 1e-7, {"requests": 6}, {"tpu": t})
    assert "could not check" in report.table("tpu").rows[-1][-1]
    assert all(row[-1].startswith("could not check: frames") for row in report.padding_table().rows)


class SequenceNorm(Framed):
    """The same frames normalised over the sequence axis (an InstanceNorm over time, as a BatchNorm-style layer
    computes its statistics): padded frames enter the mean and variance, so every real frame changes."""

    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(1)

    def forward(self, waveform):
        frames = super().forward(waveform)["frames"]
        return {"frames": self.norm(frames.unsqueeze(1)).squeeze(1)}


@pytest.mark.parametrize("module", [Mixing, SequenceNorm])
def test_a_model_whose_own_layers_read_padded_positions_needs_exact_lengths_and_is_work(waves, module):
    """Rule (grading policy "padding"): a padding check that fails because the model's own layers read padded
    positions (a mean, a normalisation over the sequence axis) is work: the model runs at exact-length batches or
    per-length buckets. It is never "cannot run or compile", never advice to fix a mask the model does not take,
    and one finding per target however many bucket shapes and runs failed."""
    t = stage3(declared(module(), inputs.Output("frames", inputs.WAVEFORM, stride=HOP)), waves,
               {"tpu": [64, 256]})["tpu"]
    (run,) = [r for r in t.runs if r.plan]
    assert run.padding_ok is False and any(c["failures"] for c in run.padding_checks)
    [padding] = [f for f in t.findings() if f["kind"] == "padding"]
    assert padding["severity"] == "work" and "padding check FAILED" in t.summary()
    assert "exact-length batches or per-length buckets" in padding["advice"]
    assert "mask" not in padding["advice"] and "takes no mask input" in padding["message"]
    assert padding["occurrences"]["count"] >= 1 and padding["cause"] == cause_key(
        "padding", "padded positions change the real outputs")


# ---------------------------------------------------------------- refusals as findings
def test_a_refusal_in_warm_up_is_a_finding_and_the_other_target_is_measured(waves):
    m = declared(RefusedWhenLong(), inputs.Output("frames", inputs.WAVEFORM, stride=HOP))
    per_target = stage3(m, waves, {"neuron": [32, 64], "tpu": [64, 256]})
    neuron, tpu = per_target["neuron"], per_target["tpu"]
    mine = neuron.run_for(neuron.chosen)
    assert mine.failure is None and mine.compiles == 2 and mine.padding_ok is True     # buckets up to 64: compiled
    refused = tpu.run_for(tpu.chosen)
    assert refused.failure["kind"] == "refused" and refused.failure["step"] == "warm-up"
    found = {f["kind"]: f for f in tpu.findings()}["compile_refused"]
    assert found["severity"] == "blocker" and "optimal (warm-up) could not be measured on tpu" in found["message"]
    assert found["where"]["file"] == __file__ and "F.pad(waveform, (0, self.extra))" in found["where"]["code"]
    assert found["cause"] == cause_key("compile", "refused", found["where"])       # stage 2's cause for it
    assert "not measured" in tpu.summary() and "compile_refused" not in kinds(neuron)
    saved = json.loads(json.dumps(tpu.to_dict()))
    assert saved["not_measured"][0]["step"] == "warm-up" and saved["padding_ok"] is None


def test_a_forward_that_raises_is_a_finding_with_the_models_line(waves):
    class Raises(Framed):
        def forward(self, waveform):
            if waveform.shape[-1] > 64:
                raise ValueError("clips longer than 64 samples are not supported")
            return super().forward(waveform)

    m = declared(Raises(), inputs.Output("frames", inputs.WAVEFORM, stride=HOP))
    t = stage3(m, waves, {"tpu": [64, 256]})["tpu"]
    # it raises eagerly too, without the target: the model's limit in practice (work), not the target's blocker
    found = {f["kind"]: f for f in t.findings()}["model_raises"]
    assert "ValueError: clips longer than 64 samples" in found["message"] and found["severity"] == "work"
    assert re.search(r"the model itself raises at length (255|256)", found["message"])      # the longest, a bucket
    assert found["where"]["file"] == __file__ and "raise ValueError" in found["where"]["code"]


def test_encodec_refused_in_warm_up_is_a_finding_not_a_crash():
    """Meta's neural audio codec (transformers' EncodecModel, a small random config) on a waveform: the emulated
    TPU refuses its padding (a size held in a tensor), which stopped stage 3 in warm-up."""
    from transformers import EncodecConfig, EncodecModel
    torch.manual_seed(0)
    codec = EncodecModel(EncodecConfig(num_filters=4, upsampling_ratios=[4, 2], codebook_size=16, hidden_size=16,
                                       num_lstm_layers=1, target_bandwidths=[8.0], sampling_rate=8000))

    class Codec(nn.Module):
        def __init__(self):
            super().__init__()
            self.codec = codec

        def forward(self, waveform):
            out = self.codec(waveform.unsqueeze(1))
            return {"audio": out.audio_values[:, 0], "codes": out.audio_codes}

    m = declared(Codec(), inputs.Output("audio", inputs.WAVEFORM), "encodec", shortest=64, longest=1024)
    found = output_probe.output_dims(m)    # codes: (1, batch, codebooks, ceil(samples / 8)), the hop its strides give
    assert found["audio"].seq == (1,) and (found["codes"].batch, found["codes"].seq) == ((1,), (3,))
    assert (found["codes"].stride, found["codes"].ceil) == (8, True)
    rng = np.random.default_rng(0)
    clips = Corpus("clips", "random", tuple(0.1 * rng.standard_normal(n).astype(np.float32)
                                                 for n in (100, 300, 500, 700, 900, 1000)))
    t = stage3(m, clips, {"tpu": [512, 1024]})["tpu"]
    found = {f["kind"]: f for f in t.findings()}["compile_refused"]
    assert "modeling_encodec.py" in found["where"]["file"] and "warm-up" in found["message"]
    assert t.run_for(t.chosen).failure["step"] == "warm-up"


class _RefusesShort(nn.Module):
    """Frames of `hop` samples (one per sample at hop 1), but like Funnel's pooling blocks (transformers'
    modeling_funnel.py, no fewer than 5 tokens) no fewer than `shortest` samples taken: shorter, its shapes do not
    broadcast."""

    def __init__(self, shortest: int, hop: int):
        super().__init__()
        self.shortest, self.hop = shortest, hop

    def forward(self, waveform):
        if waveform.shape[-1] < self.shortest:
            raise RuntimeError("output with shape [2, 2, 2, 1] doesn't match the broadcast shape [2, 2, 2, 2]")
        return {"frames": waveform.unfold(-1, self.hop, self.hop).mean(-1) * 2.0}


def test_a_probe_length_the_model_refuses_is_portkits_choice_and_a_longer_one_is_tried():
    """Rule: the probe's first length is portkit's (3 positions), not the model's input: where the model refuses it,
    a longer one is tried, and the output is found to follow the input one position per sample (tiny Funnel was
    'blocked' on both targets by a probe at 3 tokens, while every bucket of its plan runs)."""
    frames = inputs.Output("frames", inputs.WAVEFORM)
    found = output_probe.output_dims(declared(_RefusesShort(5, 1), frames, shortest=1))
    assert found["frames"].seq == (1,) and found["frames"].stride == 1 and found["frames"].unchecked is None
    with pytest.raises(RuntimeError):      # a model that refuses every length still fails, with its own error
        output_probe.output_dims(declared(_RefusesShort(5, 1), frames, shortest=1, longest=4))


def test_an_item_the_model_refuses_at_its_own_length_is_left_out_of_the_padding_check(waves):
    """Rule: the padding check's unpadded reference runs eagerly, outside any target: an item the model itself does
    not take at its own length (on every device) cannot be compared; it is unchecked, with the model's words, and
    the check goes on (tiny Funnel's shortest texts stopped the check, read as 'could not be measured on neuron')."""
    from portkit.stages.buckets import trace_replay
    from portkit.targets import backends
    m = declared(_RefusesShort(16, HOP), inputs.Output("frames", inputs.WAVEFORM, stride=HOP))
    trace = make_trace(waves, m, 6, seed=1, dist=stage.distribution(waves, m))
    (run,) = trace_replay.replay(m, trace, [stage.plan_buckets([64, 256], "optimal", k=2)], backends.portkit_tpu,
                                 trace_replay.ReplaySettings(baseline=False, progress=False))
    assert run.failure is None and run.padding_checks, run.failure
    left_out = [why for c in run.padding_checks for why in c["unchecked"].values()]
    assert any("does not run it at its own length" in why and "broadcast shape" in why for why in left_out), left_out
    assert any(c["ok"] is True for c in run.padding_checks)     # the shape whose items it takes is compared
