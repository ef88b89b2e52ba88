"""A waveform model declared to portkit: a small convolutional front end and a GRU over 16 kHz audio.

    portkit run --model examples/audio_classifier.py:build --target neuron --target tpu

The factory returns a `portkit.models.LoadedModel` carrying a declaration (`portkit.models.inputs`): two inputs,
the waveform and a mask of its real samples, both (batch, samples); `samples` varies with the recording,
so stage 3 fits buckets to the recordings' real durations. The weights are random (seeded); the data are
real: the spoken words of the recordings Debian's alsa-utils installs (/usr/share/sounds/alsa), cut at
their silences and resampled to 16 kHz, so their durations vary as speech does. Another folder of WAV or
FLAC files: set PORTKIT_EXAMPLE_WAVS. `build_batch` and the measure receive 1-D float32 waveforms at the
declaration's sample_rate, as portkit.models.inputs documents.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from portkit import models
from portkit.corpora import audio
from portkit.models import inputs

RATE = 16_000
WINDOW, HOP = 400, 160          # 25 ms windows every 10 ms
LONGEST = 4 * RATE              # the model takes clips of up to 4 s
WAVS = os.environ.get("PORTKIT_EXAMPLE_WAVS", "/usr/share/sounds/alsa")


class AudioClassifier(nn.Module):
    """Conv1d frames -> GRU -> mean over real frames -> logits. Padding never reaches a real frame's output:
    the convolution's real frames read real samples only, the GRU runs forward, the mean counts real frames."""

    def __init__(self, classes: int = 8, channels: int = 32, hidden: int = 48):
        super().__init__()
        self.frames = nn.Conv1d(1, channels, WINDOW, stride=HOP)
        self.mix = nn.Conv1d(channels, channels, 3, padding=1)
        self.gru = nn.GRU(channels, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, waveform, mask):
        x = torch.relu(self.frames(waveform.unsqueeze(1)))
        real = ((mask.sum(1) - WINDOW) // HOP + 1).clamp(min=1)          # frames inside the real samples
        keep = (torch.arange(x.shape[-1], device=x.device) < real[:, None]).to(x.dtype)
        x = torch.relu(self.mix(x * keep[:, None])) * keep[:, None]      # padded frames are zeros again
        hidden, _ = self.gru(x.transpose(1, 2))
        pooled = (hidden * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        return {"logits": self.head(pooled)}


def build_batch(waves, sizes):
    """Waveforms padded with zeros (or cut) to sizes["samples"], and the mask of their real samples."""
    n = sizes["samples"]
    wave = torch.zeros(len(waves), n)
    mask = torch.zeros(len(waves), n, dtype=torch.long)
    for row, samples in enumerate(waves):
        cut = torch.from_numpy(samples[:n])
        wave[row, :len(cut)], mask[row, :len(cut)] = cut, 1
    return {"waveform": wave, "mask": mask}


def spoken_words(folder: str = WAVS, quiet: float = 0.02, gap: float = 0.12) -> list[np.ndarray]:
    """Each recording, mono at 16 kHz, cut at its silences (10 ms frames below `quiet` RMS for `gap` seconds):
    the words, then the whole recording."""
    words = []
    for clip in audio.folder_corpus(folder).clips:   # an empty or missing folder is refused, naming it
        sound = clip.load(RATE)
        frames = sound[: len(sound) // HOP * HOP].reshape(-1, HOP)
        loud = np.sqrt((frames ** 2).mean(1)) >= quiet
        start, silent = None, 0
        for i, on in enumerate(np.append(loud, [False] * int(gap * RATE / HOP + 1))):
            if on:
                start, silent = (i if start is None else start), 0
            elif start is not None:
                silent += 1
                if silent * HOP >= gap * RATE:
                    word = sound[start * HOP:(i - silent + 1) * HOP]
                    if len(word) >= WINDOW:
                        words.append(np.ascontiguousarray(word, dtype=np.float32))
                    start, silent = None, 0
        words.append(np.ascontiguousarray(sound, dtype=np.float32))     # and the whole recording
    return words


DECLARATION = inputs.Declaration(
    inputs=(inputs.TensorSpec("waveform", torch.float32, ("batch", "samples")),
            inputs.TensorSpec("mask", torch.long, ("batch", "samples"))),
    dims=(inputs.Dim("batch", batch=True), inputs.Dim("samples", varies=True, max=LONGEST, min=WINDOW)),
    build=build_batch,
    measure=lambda waves: {"samples": [len(wave) for wave in waves]},
    outputs=(inputs.Output("logits", inputs.CLASSIFIER),),
    data=inputs.AUDIO, masks={"samples": "mask"}, sample_rate=RATE,
    own_items=spoken_words, item_label="spoken words")


def build() -> models.LoadedModel:
    torch.manual_seed(0)
    return models.LoadedModel("audio-classifier", inputs.CLASSIFIER, AudioClassifier().eval(),
                              "random weights (seed 0), examples/audio_classifier.py", declaration=DECLARATION)
