"""What a declaration's build and measure receive (portkit/models/inputs.py): an audio model's recordings as
1-D float32 waveforms at its sample rate, each file decoded once for measuring and building; an image model's
items with its own channels (1: ITU-R BT.601 luminance, 3: RGB) and its own normalisation."""
import math
import wave

import numpy as np
import pytest
import torch
from torch import nn

from portkit.core.errors import BadParameter
from portkit.corpora import audio, images
from portkit.corpora.corpus import corpus_for, example_batch
from portkit.models.audio import W2V_STRIDE, wav2vec2_declaration, waveform
from portkit.models import inputs
from portkit.models import registry

pytest.importorskip("soundfile", reason="the audio extra is not installed (pip install 'portkit[audio]')")

RATE = 16_000
FILE_RATE = 8_000                     # the files' own rate: every clip is resampled to RATE
SECONDS = (0.25, 0.5, 0.75)


def _write_wavs(folder, rate=FILE_RATE):
    """A few 16-bit mono WAVs written with the stdlib, tones of different lengths; their paths."""
    folder.mkdir()
    paths = []
    for i, seconds in enumerate(SECONDS):
        t = np.arange(int(seconds * rate)) / rate
        pcm = (0.5 * np.sin(2 * math.pi * (220 + 110 * i) * t) * 32767).astype("<i2")
        path = folder / f"tone{i}.wav"
        with wave.open(str(path), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(rate)
            f.writeframes(pcm.tobytes())
        paths.append(str(path))
    return paths


class _Pooled(nn.Module):
    def forward(self, waveform, mask):
        return {"logits": torch.stack([(waveform * mask).sum(1), mask.sum(1).float()], 1)}


def _checked_waveform_model(seen):
    """A waveform model whose build and measure fail unless every item is a 1-D float32 numpy array; each
    item they receive is recorded in `seen` (by the function that received it)."""
    def check(where, items):
        for item in items:
            assert isinstance(item, np.ndarray), f"{where} received {type(item).__name__}"
            assert item.ndim == 1 and item.dtype == np.float32, f"{where} received {item.dtype} {item.shape}"
        seen.setdefault(where, []).extend(items)

    def build(waves, sizes):
        check("build", waves)
        n = sizes["samples"]
        out, mask = torch.zeros(len(waves), n), torch.zeros(len(waves), n, dtype=torch.long)
        for row, w in enumerate(waves):
            out[row, :len(w[:n])], mask[row, :len(w[:n])] = torch.from_numpy(w[:n]), 1
        return {"waveform": out, "mask": mask}

    def measure(waves):
        check("measure", waves)
        return {"samples": [len(w) for w in waves]}

    decl = inputs.Declaration(
        inputs=(inputs.TensorSpec("waveform", torch.float32, ("batch", "samples")),
                inputs.TensorSpec("mask", torch.long, ("batch", "samples"))),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim("samples", varies=True, max=RATE, min=16)),
        build=build, measure=measure, outputs=(inputs.Output("logits", inputs.CLASSIFIER),),
        data=inputs.AUDIO, masks={"samples": "mask"}, sample_rate=RATE)
    return registry.LoadedModel("checked-waves", inputs.CLASSIFIER, _Pooled(), "test", declaration=decl)


@pytest.fixture
def decodes(monkeypatch):
    """A fresh cache of decoded waveforms, and a count of the files decoded, by path."""
    counted = {}
    real = audio._decode

    def counting(path, rate):
        counted[path] = counted.get(path, 0) + 1
        return real(path, rate)
    monkeypatch.setattr(audio, "_DECODED", audio._WaveformCache(audio.WAVEFORM_CACHE_BYTES))
    monkeypatch.setattr(audio, "_decode", counting)
    return counted


def test_an_audio_models_build_and_measure_receive_waveforms_at_its_rate(tmp_path, decodes):
    paths = _write_wavs(tmp_path / "tones")
    seen = {}
    m = _checked_waveform_model(seen)
    corpus = corpus_for(m, str(tmp_path / "tones"))
    clips = list(corpus.texts)
    assert all(isinstance(c, audio.Clip) for c in clips) and len(clips) == len(SECONDS)   # the run's items
    expected = [int(s * RATE) for s in SECONDS]               # 8 kHz files at 16 kHz: twice the samples
    assert m.declaration.lengths(clips) == {"samples": expected}
    built = m.declaration.batch(clips)
    assert built["waveform"].shape == (3, max(expected)) and m.declaration.real_lengths(built)["samples"] == expected
    for row, clip in enumerate(clips):                        # the real samples are the clip's, resampled
        real = audio.resample(audio._decode(clip.path, FILE_RATE), FILE_RATE, RATE)
        assert torch.allclose(built["waveform"][row, :expected[row]], torch.from_numpy(real), atol=1e-5)
    batch, described = example_batch(m, corpus, batch_size=2, seq_len=64)
    assert batch["waveform"].shape[0] == 2 and "padded to the longest" in described
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, 2)
    assert {"build", "measure"} <= set(seen) and sorted(decodes) == sorted(paths)


def test_measuring_then_building_decodes_each_file_once(tmp_path, decodes):
    paths = _write_wavs(tmp_path / "tones")
    m = _checked_waveform_model({})
    clips = list(corpus_for(m, str(tmp_path / "tones")).texts)
    m.declaration.lengths(clips)
    assert decodes == {p: 1 for p in paths}
    m.declaration.batch(clips)                       # measures (to the longest) and builds: from the cache
    m.declaration.batch(clips[:2], sizes={"samples": 4000})
    m.token_lengths(clips)
    assert decodes == {p: 1 for p in paths}
    first = clips[0].load(RATE)
    first[:] = 0                                     # a caller's change never reaches the cache
    assert np.abs(clips[0].load(RATE)).max() > 0.1 and decodes == {p: 1 for p in paths}
    assert len(clips[0].load(FILE_RATE)) == int(SECONDS[0] * FILE_RATE) and decodes[paths[0]] == 2   # another rate


def test_the_cache_of_decoded_waveforms_is_bounded(tmp_path, decodes, monkeypatch):
    paths = _write_wavs(tmp_path / "tones")
    clips = list(audio.folder_corpus(str(tmp_path / "tones")).clips)
    longest = max(c.length(RATE) for c in clips) * 4              # bytes of the longest float32 waveform
    monkeypatch.setattr(audio, "_DECODED", audio._WaveformCache(longest))
    for clip in clips + clips:
        clip.load(RATE)
    assert audio._DECODED.held <= longest and decodes == {p: 2 for p in paths}    # each dropped, read again


def test_an_item_that_is_already_a_waveform_passes_through_and_a_rate_is_required():
    seen = {}
    m = _checked_waveform_model(seen)
    waves = [np.linspace(-1, 1, 100, dtype=np.float32), np.ones(40, np.float32)]
    assert m.declaration.lengths(waves) == {"samples": [100, 40]}
    m.declaration.batch(waves)
    assert seen["build"][0] is waves[0] and audio.waveform(waves[1], RATE) is waves[1]
    spec = inputs.TensorSpec("x", torch.float32, ("batch",))
    with pytest.raises(BadParameter, match="invalid sample_rate of an audio declaration None: give sample_rate="):
        inputs.Declaration((spec,), (inputs.Dim("batch", batch=True),), lambda i, s: {}, lambda i: {},
                           (inputs.Output("y", inputs.CLASSIFIER),), inputs.AUDIO)


def test_built_in_framed_declarations_take_recordings_through_the_same_path(tmp_path, decodes):
    paths = _write_wavs(tmp_path / "tones")
    clips = list(audio.folder_corpus(str(tmp_path / "tones")).clips)
    decl = wav2vec2_declaration()
    frames = [-(-int(s * RATE) // W2V_STRIDE) for s in SECONDS]
    assert decl.lengths(clips) == {"frames": frames}
    built = decl.batch(clips)
    assert built["frames"].shape == (3, max(frames), W2V_STRIDE)
    assert built["frame_mask"].sum(1).tolist() == frames
    first = torch.from_numpy(clips[0].load(RATE))
    assert torch.equal(built["frames"][0].reshape(-1)[:len(first)], first)
    assert torch.equal(waveform(clips[0]), first)     # a Clip given directly is decoded the same way
    assert decodes == {p: 1 for p in paths}


# ---------------------------------------------------------------- images
SIZE = 8
GREY, RGB = 153, (200, 100, 50)


class _Convolved(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3)

    def forward(self, pixel_values):
        return {"logits": self.conv(pixel_values).mean((2, 3))}


def _image_model(channels, **normalised):
    decl = inputs.image_declaration(SIZE, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),), channels=channels,
                                    **normalised)
    return registry.LoadedModel(f"conv{channels}", inputs.IMAGE_CLASSIFIER, _Convolved(channels).eval(), "test",
                              image_size=SIZE, declaration=decl)


def _png_folder(folder, colour, mode):
    """Three uniform PNGs of one colour in `mode` ("L" grey, "RGB"), at sizes that need a centre crop."""
    from PIL import Image
    folder.mkdir()
    for i, (w, h) in enumerate(((20, 12), (12, 16), (9, 9))):
        Image.new(mode, (w, h), colour).save(folder / f"img{i}.png")
    return str(folder)


def test_a_one_channel_model_reads_grey_and_colour_folders_as_luminance(tmp_path):
    grey, colour = _png_folder(tmp_path / "grey", GREY, "L"), _png_folder(tmp_path / "rgb", RGB, "RGB")
    m = _image_model(1)
    corpus = corpus_for(m, grey)
    assert all(item.shape == (SIZE, SIZE, 1) and item.dtype == np.float32 for item in corpus.texts)
    batch, _ = example_batch(m, corpus, batch_size=2, seq_len=SIZE)
    assert batch["pixel_values"].shape == (2, 1, SIZE, SIZE)
    assert torch.allclose(batch["pixel_values"], torch.full_like(batch["pixel_values"], GREY / 255))
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, 4)
    luma = (0.299 * RGB[0] + 0.587 * RGB[1] + 0.114 * RGB[2]) / 255        # ITU-R BT.601 luminance
    batch, _ = example_batch(m, corpus_for(m, colour), batch_size=3, seq_len=SIZE)
    assert batch["pixel_values"].shape == (3, 1, SIZE, SIZE)
    assert torch.allclose(batch["pixel_values"], torch.full_like(batch["pixel_values"], luma), atol=1e-6)
    photos, _ = example_batch(m, None, batch_size=2, seq_len=SIZE)      # matplotlib's photographs
    assert photos["pixel_values"].shape == (2, 1, SIZE, SIZE)
    rgb_crops = images.sample_images(2, SIZE, seed=0)                        # as stage 4 draws them: RGB
    assert torch.allclose(m.encode(rgb_crops)["pixel_values"], photos["pixel_values"], atol=1e-6)
    with torch.no_grad():
        assert m(photos)["logits"].shape == (2, 4)


def test_a_three_channel_model_reads_a_grey_folder_as_three_equal_channels(tmp_path):
    grey = _png_folder(tmp_path / "grey", GREY, "L")
    m = _image_model(3)
    corpus = corpus_for(m, grey)
    assert all(item.shape == (SIZE, SIZE, 3) for item in corpus.texts)
    batch, _ = example_batch(m, corpus, batch_size=3, seq_len=SIZE)
    assert batch["pixel_values"].shape == (3, 3, SIZE, SIZE)
    assert torch.allclose(batch["pixel_values"], torch.full_like(batch["pixel_values"], GREY / 255))
    with torch.no_grad():
        assert m(batch)["logits"].shape == (3, 4)
    assert m.encode([np.full((SIZE, SIZE, 1), 0.25, np.float32)])["pixel_values"].shape == (1, 3, SIZE, SIZE)


def test_the_models_own_normalisation_is_applied_per_channel(tmp_path):
    m = _image_model(3, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    item = np.broadcast_to(np.asarray([0.75, 0.5, 1.0], np.float32), (SIZE, SIZE, 3)).copy()
    pixels = m.encode([item])["pixel_values"]
    assert pixels.shape == (1, 3, SIZE, SIZE)
    assert [float(pixels[0, c].unique()) for c in range(3)] == [0.5, 1.0, 0.5]     # (x - mean) / std
    grey = _image_model(1, mean=(0.5,), std=(0.25,))
    batch, _ = example_batch(grey, corpus_for(grey, _png_folder(tmp_path / "g", GREY, "L")), 1, SIZE)
    assert torch.allclose(batch["pixel_values"], torch.full((1, 1, SIZE, SIZE), (GREY / 255 - 0.5) / 0.25))
    only_mean = _image_model(3, mean=(0.5, 0.5, 0.5))
    assert float(only_mean.encode([item])["pixel_values"][0, 0, 0, 0]) == 0.25


def test_channels_and_normalisation_that_cannot_mean_anything_are_refused(tmp_path):
    out = (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),)
    with pytest.raises(BadParameter, match=r"unknown image channels 2; choose one of: 1, 3"):
        inputs.image_declaration(SIZE, out, channels=2)
    with pytest.raises(BadParameter, match=r"invalid image mean \[0.5, 0.5\]: give one value per channel \(3\)"):
        inputs.image_declaration(SIZE, out, mean=(0.5, 0.5))
    with pytest.raises(BadParameter, match=r"invalid image std \[0.2, 0.2\]: give one value per channel \(1\)"):
        inputs.image_declaration(SIZE, out, channels=1, std=(0.2, 0.2))
    with pytest.raises(BadParameter, match=r"invalid image std \[0.5, 0.0, 0.5\]: every value must be positive"):
        inputs.image_declaration(SIZE, out, std=(0.5, 0.0, 0.5))
    with pytest.raises(BadParameter, match=r"invalid image mean 0.5: give one number per channel \(3\)"):
        inputs.image_declaration(SIZE, out, mean=0.5)
    with pytest.raises(BadParameter, match=r"unknown image channels 4; choose one of: 1, 3"):
        images.folder_images(_png_folder(tmp_path / "grey", GREY, "L"), SIZE, channels=4)
