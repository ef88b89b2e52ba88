"""A streaming voice-activity step declared to portkit: 32 ms chunks in, a speech probability out, an LSTM
cell's (h, c) and a buffer of the last samples carried from chunk to chunk.

    portkit run --model examples/vad_stream.py:build --target neuron --target tpu

The step is `forward(chunk, state) -> (speech, new_state)` with the state a tuple `((h, c), context)`, framed
as silero-vad frames 16 kHz audio (github.com/snakers4/silero-vad, src/silero_vad/utils_vad.py): 512 new
samples per call, read together with the last 64 samples of the call before. Its `StreamStep` declares the
state's layout (each tensor's shape, -1 its batch axis) and the one output, a PROBABILITY, so stage 4 judges
the speech decisions at 0.5 and each state tensor's drift, carried across the run's recordings end to end.
The weights are random (seeded); the data are real: the recordings Debian's alsa-utils installs
(/usr/share/sounds/alsa), or another folder of WAV or FLAC files named by PORTKIT_EXAMPLE_WAVS.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from portkit import models
from portkit.corpora import audio
from portkit.models.audio import StreamAdapter, StreamOutput, StreamStep, stream_declaration
from portkit.models import inputs

RATE, CHUNK, CONTEXT, HIDDEN = 16_000, 512, 64, 64
WAVS = os.environ.get("PORTKIT_EXAMPLE_WAVS", "/usr/share/sounds/alsa")


class VADStep(nn.Module):
    """Context + chunk -> strided Conv1d frames, averaged -> LSTM cell -> sigmoid: one speech probability."""

    def __init__(self):
        super().__init__()
        self.frames = nn.Conv1d(1, 32, 64, stride=32)
        self.cell = nn.LSTMCell(32, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, chunk, state):
        (h, c), context = state
        chunk = nn.functional.pad(chunk, (0, CHUNK - chunk.shape[-1]))   # a stream's last chunk may be short
        x = torch.cat([context, chunk], dim=-1)                          # (batch, CONTEXT + CHUNK)
        features = torch.relu(self.frames(x.unsqueeze(1))).mean(-1)
        h, c = self.cell(features, (h, c))
        # The new context is a copy in its own contiguous buffer: a slice of x keeps x's strides (so does clone()'s
        # default preserve_format), and the compiled step guards on its inputs' strides, so a view would
        # recompile it once the stream feeds it back (https://pytorch.org/docs/stable/tensor_attributes.html,
        # torch.memory_format).
        context = x[:, -CONTEXT:].clone(memory_format=torch.contiguous_format)
        return torch.sigmoid(self.head(h))[:, 0], ((h, c), context)


def step() -> StreamStep:
    torch.manual_seed(0)
    return StreamStep(
        "vad-stream", VADStep().eval(), CHUNK, state_shape=(((-1, HIDDEN), (-1, HIDDEN)), (-1, CONTEXT)),
        origin="random weights (seed 0), examples/vad_stream.py", rate=RATE,
        outputs=(StreamOutput("speech", inputs.PROBABILITY, threshold=0.5),))


def build() -> models.LoadedModel:
    vad = step()
    # One call of the step on each recording's first chunk, from the recordings themselves (not the run's corpus).
    declared = dataclasses.replace(stream_declaration(vad),
                                   own_items=lambda: audio.folder_corpus(WAVS).clips)
    return models.LoadedModel("vad-stream", inputs.PROBABILITY, StreamAdapter(vad).eval(),
                              vad.origin, declaration=declared, stream=vad)
