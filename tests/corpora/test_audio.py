"""Real audio (recordings, espeak-ng speech, a user's folder), the audio networks, the pitch metric and the
streaming step's drift. Tiny clips: the file runs in seconds."""
import math
import shutil

import numpy as np
import pytest
import torch

from portkit.corpora import audio
from portkit.models.audio import StreamStep, gru_step
from portkit.stages.accuracy import comparison
from portkit.models import registry
from portkit.workloads import streaming
from portkit.core.errors import BadParameter
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS

soundfile = pytest.importorskip("soundfile", reason="the audio extra is not installed (pip install 'portkit[audio]')")
needs_alsa = pytest.mark.skipif(not audio.ALSA_FOLDER.is_dir(), reason="Debian's alsa-utils is not installed")
needs_espeak = pytest.mark.skipif(shutil.which(audio.ESPEAK) is None, reason="espeak-ng is not installed")
needs_crepe = pytest.mark.skipif(not __import__("importlib").util.find_spec("torchcrepe"),
                                 reason="torchcrepe is not installed (scripts/bootstrap.sh installs it)")


def _tone(freq: float, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@needs_alsa
def test_alsa_recordings_are_real_speech_read_and_resampled():
    corpus = audio.alsa_recordings()
    assert corpus.label == "recorded" and len(corpus) == 8          # Noise.wav is not speech
    assert all(c.rate == 48000 and 1.0 < c.seconds < 2.0 for c in corpus.clips)
    clip = corpus.clips[0]
    samples = clip.load(16000)
    assert samples.dtype == np.float32 and samples.size == clip.length(16000) == corpus.lengths(16000)[0]
    assert 0.05 < np.abs(samples).max() <= 1.0


def test_a_users_folder_is_mixed_to_mono_and_resampled(tmp_path):
    soundfile.write(tmp_path / "a.wav", np.stack([_tone(440, 0.5, 44100)] * 2, axis=1), 44100)
    (tmp_path / "sub").mkdir()
    soundfile.write(tmp_path / "sub" / "b.flac", _tone(220, 0.25, 16000), 16000)
    (tmp_path / "notes.txt").write_text("not audio")
    corpus = audio.folder_corpus(str(tmp_path))
    assert [c.name for c in corpus.clips] == ["a.wav", "b.flac"] and corpus.label == "recorded"
    assert corpus.lengths(16000).tolist() == [8000, 4000]
    mono = corpus.clips[0].load(16000)
    assert mono.size == 8000
    spectrum = np.abs(np.fft.rfft(mono))
    assert abs(np.argmax(spectrum) * 16000 / mono.size - 440) < 4      # resampled, not re-pitched


def test_bad_audio_folders_are_one_line_errors(tmp_path):
    with pytest.raises(BadParameter, match="invalid audio folder .*no such folder"):
        audio.check_folder(str(tmp_path / "missing"))
    (tmp_path / "file.wav").write_bytes(b"RIFF")
    with pytest.raises(BadParameter, match="not a folder"):
        audio.check_folder(str(tmp_path / "file.wav"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadParameter, match=r"holds no \.wav or \.flac file"):
        audio.check_folder(str(tmp_path / "empty"))
    with pytest.raises(BadParameter, match=r"invalid audio file .*file\.wav.*cannot read it") as err:
        audio.folder_corpus(str(tmp_path))
    assert "\n" not in str(err.value)


@needs_espeak
def test_espeak_speech_is_synthetic_and_cached(tmp_path):
    corpus = audio.synthesize(["Return the sum of a and b.", "x " * 500], tmp_path, "texts")
    assert corpus.label == "synthetic" and "synthetic speech" in corpus.source
    short, long = corpus.clips
    assert 1.0 < short.seconds < 4.0 and short.text == "Return the sum of a and b."
    assert len(long.text) <= audio.MAX_SPOKEN_CHARS < 1000
    stamp = (tmp_path / short.name).stat().st_mtime_ns
    again = audio.synthesize(["Return the sum of a and b."], tmp_path, "texts")
    assert again.clips[0].path == short.path and (tmp_path / short.name).stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no partial file left


@needs_crepe
def test_crepe_finds_the_pitch_of_a_tone_and_padding_keeps_real_frames():
    model = registry.load("crepe")
    assert model.kind == registry.PITCH and "pretrained CREPE" in model.origin
    decl = model.declaration
    assert decl.varying_names == ("frames",) and decl.data == "audio" and decl.primary.metric == registry.PITCH
    tone, short = _tone(440, 0.25, 16000), _tone(220, 0.1, 16000)
    assert decl.lengths([tone, short]) == {"frames": [26, 11]}     # 1 + samples // 160
    with torch.no_grad():
        out = model(decl.batch([tone, short]))["pitch"]
        padded = model(decl.batch([tone, short], sizes={"frames": 40}))["pitch"]
    assert out.shape == (2, 26, 2) and padded.shape == (2, 40, 2)
    cents, confidence = out[0, 5:-5, 0], out[0, 5:-5, 1]
    assert (cents - 1200 * math.log2(440 / 10)).abs().max() < 10 and confidence.min() > 0.5
    torch.testing.assert_close(padded[:, :26], out)         # zero frames change no real frame
    assert out[1, 11:].abs().max() == 0                     # a padding frame reads unvoiced


def test_pitch_metric_measures_cents_on_voiced_frames_and_voicing():
    ref = torch.tensor([[[6000.0, 0.9], [6100.0, 0.8], [5000.0, 0.1], [5900.0, 0.95]]]).double()
    mask = torch.tensor([[1, 1, 1, 0]])

    def metric(actual):
        return comparison.task_metrics(registry.PITCH, actual, ref, mask, DEFAULT_TASK_BOUNDS)
    same = metric(ref.clone())
    assert same["cents_p95"] == 0 and same["voicing_agreement"] == 1 and same["frames"] == 3
    # identical, yet 3 frames cannot decide a 0.99 voicing budget: inconclusive, never a pass
    assert same["decision"] == "inconclusive" and not same["passed"] and "on 3 frames" in same["reason"]
    sharp = ref.clone()
    sharp[0, :2, 0] += 30                      # 30 cents sharp on both voiced frames
    sharp[0, 2, 0] += 900                      # an unvoiced frame's pitch does not count
    found = metric(sharp)
    assert not found["passed"] and found["cents_p95"] == pytest.approx(30) and "pitch error" in found["reason"]
    flipped = ref.clone()
    flipped[0, 2, 1] = 0.5                     # the unvoiced frame turns voiced
    found = metric(flipped)
    assert not found["passed"] and found["voicing_agreement"] == pytest.approx(2 / 3)


def test_wav2vec2_from_config_is_seeded_and_honours_the_mask():
    model = registry.load("wav2vec2")
    decl = model.declaration
    clip, short = _tone(300, 0.5, 16000), _tone(200, 0.2, 16000)
    assert decl.lengths([clip, short]) == {"frames": [25, 10]}       # 20 ms frames, the last one completed
    with torch.no_grad():
        alone = model(decl.batch([clip]))["logits"]
        inside = model(decl.batch([clip, short], sizes={"frames": 40}))["logits"]
    assert alone.shape == (1, 25, 32) and inside.shape == (2, 40, 32)   # one output frame per input frame
    torch.testing.assert_close(inside[:1, :25], alone, rtol=1e-4, atol=1e-4)
    again = registry.load("wav2vec2")
    assert all(torch.equal(a, b) for a, b in zip(model.module.state_dict().values(),
                                                 again.module.state_dict().values()))
    assert "random weights (seed 0)" in model.origin


def test_the_streaming_model_declares_one_chunk_and_its_state():
    model = registry.load("gru-stream")
    assert model.stream is not None and model.declaration.fixed_shape
    batch = model.declaration.batch([_tone(200, 0.3, 16000), _tone(300, 0.05, 16000)])
    assert batch["chunk"].shape == (2, 1600) and batch["state"].shape == (1, 2, 64)
    assert batch["chunk"][1, 800:].abs().max() == 0          # a short item's chunk is padded with silence
    with torch.no_grad():
        out = model(batch)
    assert out["logits"].shape == (2, 8, 32) and out["state"].shape == (1, 2, 64)


def _stream(seconds: float) -> streaming.Stream:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * 16000)) / 16000
    samples = (0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.2 * np.sin(t))) + 0.01 * rng.standard_normal(t.size))
    return streaming.Stream(samples.astype(np.float32), 16000, "a gliding tone", "synthetic")


def test_streaming_step_compiles_once_per_chunk_shape_and_carries_its_state():
    step = gru_step()
    result = streaming.check_stream(step, _stream(2.05), ["tpu"])
    run = result.to_dict()["runs"][0]
    # 2.05 s of 100 ms chunks: the last 50 ms padded with silence to a whole chunk, so one shape compiles
    assert result.chunks == 21 and run["compiled_shapes"] == [(1, 1600)]
    assert len(run["compiles"]) == 1 and run["late_compiles"] == 0
    assert all(c["when"] == "warm-up" for c in run["compiles"])
    assert 1e-6 < run["state_error_last"] < 1e-2      # bf16 matmul operands: a real, bounded error
    assert run["passed"] and "tpu (emulated" in str(result)


class _Rotation(torch.nn.Module):
    """A rotation of the state each chunk (an orthogonal matmul: it neither grows nor forgets): rounded to the
    target's matmul operands, every step turns the state by a slightly different angle, so its error accumulates
    with the stream's length (one step's error stays level, the carried one grows in proportion)."""

    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(8, 8, bias=False)
        q, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
        self.mix.weight.data.copy_(q)

    def forward(self, chunk, state):
        state = self.mix(state) + 1e-3 * chunk.mean()
        return state.unsqueeze(-1), state


def test_drift_that_accumulates_fails_the_growth_budget():
    """Rule: a state whose rounding accumulates over the stream fails the drift check (growth and rank test)."""
    step = StreamStep("rotation", _Rotation(), 1600, (-1, 8), "test recurrence", initial_value=0.3)
    result = streaming.check_stream(step, _stream(4.0), ["tpu"])
    run = result.runs[0]
    assert not run.passed and run.growth > DEFAULT_TASK_BOUNDS["drift_growth"] and run.trend["rising"]
    assert run.state_error[-1] > 2 * max(run.state_error[:len(run.state_error) // 4])


def test_bad_stream_input_is_one_line():
    with pytest.raises(BadParameter, match="invalid stream length"):
        streaming.check_stream(gru_step(), _stream(0.5), ["tpu"])
    with pytest.raises(BadParameter, match="invalid chunk_ms 10"):
        gru_step(10)


def test_corpus_spec_takes_a_folder_of_recordings(tmp_path):
    from portkit.corpora.corpus import audio_corpus, check_corpus
    soundfile.write(tmp_path / "one.wav", _tone(200, 0.3, 8000), 8000)
    assert check_corpus(str(tmp_path)) == str(tmp_path)
    corpus = audio_corpus(str(tmp_path))
    assert corpus.label == "recorded" and corpus.lengths(16000).tolist() == [4800]
    (tmp_path / "texts").mkdir()
    with pytest.raises(BadParameter, match="not a file, nor a folder of .wav/.flac recordings"):
        check_corpus(str(tmp_path / "texts"))


@needs_alsa
@needs_espeak
def test_the_text_corpus_is_spoken_beside_the_recordings(tmp_path):
    from portkit.corpora.corpus import audio_corpus
    texts = tmp_path / "texts.txt"
    texts.write_text("Open a file.\nReturn the sum of a and b, then close it.\n")
    corpus = audio_corpus(str(texts), clips=2)
    assert corpus.label == "recorded and synthetic" and corpus.describe()["synthetic"] == 2
    assert corpus.describe()["recorded"] == 8


def _run_with_errors(errors):
    """A run whose carried state error is `errors` and whose one step's error is level (1 at every chunk)."""
    return streaming.TargetStream("tpu", "emulated", "portkit_tpu", "default", [], 0, list(errors),
                                  [1.0] * len(errors), 1.0)


def test_a_flat_noisy_state_error_is_no_drift():
    """A state error flat at 3.6e-6 with noise, whose last chunk happens to be over 3x the first ten chunks' median
    (what the old end-against-start ratio failed): the halves' medians stay near 1x and the rank test sees noise."""
    errors = 3.6e-6 * np.exp(np.random.default_rng(64).normal(0, 0.4, 120))
    assert errors[-1] / np.median(errors[:10]) > 3                     # the old statistic's false drift
    check = streaming.drift_check(_run_with_errors(errors), DEFAULT_TASK_BOUNDS)
    assert check["passed"] and not check["trend"]["rising"] and check["value"] < DEFAULT_TASK_BOUNDS["drift_growth"]


def test_flat_noise_is_almost_never_drift():
    """Over 200 streams of flat noise the check fails at most at the rank test's stated rate."""
    failed = sum(not streaming.drift_check(_run_with_errors(np.exp(np.random.default_rng(s).normal(0, 1.0, 60))),
                                           DEFAULT_TASK_BOUNDS)["passed"] for s in range(200))
    assert failed <= 2 * streaming.DRIFT_P * 200


def test_a_steadily_rising_state_error_is_drift():
    errors = 1e-6 * np.exp(np.linspace(0, 6, 120)) * np.exp(np.random.default_rng(1).normal(0, 0.3, 120))
    check = streaming.drift_check(_run_with_errors(errors), DEFAULT_TASK_BOUNDS)
    assert not check["passed"] and check["trend"]["rising"]
    assert check["value"] > 10 * DEFAULT_TASK_BOUNDS["drift_growth"]
