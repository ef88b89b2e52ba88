"""Real inputs for the workbook: text corpora, images, tokenized batches, length distributions.

    >>> from portkit import data, models
    >>> corpus = data.load_corpus("stdlib")            # docstrings of this Python's standard library
    >>> model = models.load("minilm")
    >>> dist = data.length_distribution(corpus, model)
    >>> dist.percentiles()                              # {'p50': 25, 'p90': 123, ...}
    >>> batch = model.encode(corpus.sample(8, seed=0))

The default corpus is the docstrings of the standard library found on the machine
(`ast.get_docstring` over its .py files, test folders excluded): a long-tailed distribution of
real text that needs no download. A user's own texts come from a .txt (one text per line),
.jsonl or .csv file, with the text column named by parameter.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import json
import os
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from portkit._io import write_json
from portkit.errors import BadParameter

CORPUS_CHOICES = ("stdlib", "<path>.txt", "<path>.jsonl", "<path>.csv")
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    name: str
    source: str
    texts: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)

    def sample(self, n: int, seed: int = 0) -> list[str]:
        """n texts in a seeded random order (with repeats only when n exceeds the corpus)."""
        if n <= 0:
            raise BadParameter("sample size", n, hint="must be a positive number of texts")
        rng = random.Random(seed)
        if n <= len(self.texts):
            return rng.sample(self.texts, n)
        return [rng.choice(self.texts) for _ in range(n)]

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "texts": len(self.texts)}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "portkit"


def stdlib_docstrings() -> Corpus:
    """Docstrings of the running Python's standard library, cached on disk after the first read."""
    root = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha1(f"{sys.version}|{root}".encode()).hexdigest()[:12]
    cache = _cache_dir() / f"stdlib-docstrings-{key}.json"
    if cache.exists():
        try:
            texts = json.loads(cache.read_text())
            return Corpus("stdlib", f"docstrings of {root} (Python {sys.version.split()[0]})", tuple(texts))
        except (OSError, ValueError):
            pass   # a damaged cache is rebuilt below
    texts = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue   # the stdlib ships a few deliberately broken files (lib2to3 fixtures)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc.strip():
                    texts.append(doc.strip())
    try:
        write_json(cache, texts)
    except OSError:
        pass   # a read-only home only costs the re-read next time
    return Corpus("stdlib", f"docstrings of {root} (Python {sys.version.split()[0]})", tuple(texts))


def check_corpus(spec: str) -> str:
    """Cheap check of a corpus spec (no reading): 'stdlib' or an existing file of a known type."""
    if spec == "stdlib":
        return spec
    path = Path(str(spec))
    if not path.exists():
        raise BadParameter("corpus", spec, CORPUS_CHOICES, hint="no such file")
    if path.suffix.lower() not in (".txt", ".jsonl", ".csv"):
        raise BadParameter("corpus file type", path.suffix or path.name, (".txt", ".jsonl", ".csv"))
    return spec


def load_corpus(spec: str = "stdlib", column: str = "text") -> Corpus:
    """'stdlib', or a .txt (one text per line), .jsonl or .csv file with a text column."""
    if check_corpus(spec) == "stdlib":
        return stdlib_docstrings()
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix == ".txt":
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    elif suffix == ".jsonl":
        texts = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if column not in row:
                raise BadParameter(f"text column in {path.name} line {number}", column, sorted(row))
            texts.append(str(row[column]))
    else:   # .csv
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if column not in (reader.fieldnames or []):
                raise BadParameter(f"text column in {path.name}", column, reader.fieldnames or [])
            texts = [row[column] for row in reader]
    texts = tuple(t for t in texts if t and t.strip())
    if not texts:
        raise BadParameter("corpus", spec, hint="the file holds no non-empty texts")
    return Corpus(path.stem, str(path.resolve()), texts)


def sample_images(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """n real photographs, cropped at seeded random places: float32 HxWx3 arrays in [0, 1].

    The pixels come from the sample images that matplotlib ships (a portrait and a product
    photo), so a vision model sees natural image statistics with no download."""
    import matplotlib.image as mpimg
    from matplotlib import cbook

    sources = []
    for name in ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png"):
        with cbook.get_sample_data(name) as handle:
            img = mpimg.imread(handle, format=name.rsplit(".", 1)[1]).astype(np.float32)
        if img.max() > 1.0:
            img = img / 255.0
        sources.append(img[..., :3])
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = sources[i % len(sources)]
        h, w = img.shape[:2]
        crop = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        top, left = int(rng.integers(0, h - crop + 1)), int(rng.integers(0, w - crop + 1))
        patch = img[top:top + crop, left:left + crop]
        index = (np.arange(size) * crop / size).astype(int)   # nearest-neighbour resize
        out.append(np.ascontiguousarray(patch[index][:, index]))
    return out


@dataclass
class LengthDistribution:
    """Token lengths of a corpus under one tokenizer, before any truncation."""
    lengths: np.ndarray
    tokenizer: str
    corpus: str
    max_length: int          # what the model accepts; longer texts are truncated or rejected

    def percentiles(self) -> dict[str, int]:
        q = np.percentile(self.lengths, [50, 90, 99])
        return {"p50": int(q[0]), "p90": int(q[1]), "p99": int(q[2]),
                "max": int(self.lengths.max()), "min": int(self.lengths.min())}

    def over_limit(self) -> int:
        return int((self.lengths > self.max_length).sum())

    def to_dict(self) -> dict:
        return {"corpus": self.corpus, "tokenizer": self.tokenizer, "count": int(self.lengths.size),
                "max_length": self.max_length, "over_max_length": self.over_limit(),
                **self.percentiles()}

    def __str__(self) -> str:
        p = self.percentiles()
        return (f"{self.lengths.size} texts from {self.corpus}, {self.tokenizer} tokens: p50 {p['p50']}, "
                f"p90 {p['p90']}, p99 {p['p99']}, max {p['max']}; {self.over_limit()} longer than "
                f"the model's {self.max_length}")

    def plot(self, ax=None, bins: int = 60):
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(7, 3))[1]
        ax.hist(self.lengths, bins=bins, color="#4C72B0")
        for name, value in self.percentiles().items():
            if name in ("p50", "p90", "p99"):
                ax.axvline(value, color="#C44E52", ls="--", lw=1)
                ax.text(value, ax.get_ylim()[1] * 0.9, f" {name}={value}", color="#C44E52", fontsize=8)
        ax.set_xlabel("tokens per text")
        ax.set_ylabel("texts")
        ax.set_title(f"Token lengths: {self.corpus}")
        return ax


def length_distribution(corpus: Corpus, model) -> LengthDistribution:
    """Token lengths of every text in the corpus, with the model's own tokenizer."""
    if model.tokenizer is None:
        raise BadParameter("model for a length distribution", model.name,
                           hint="it takes images, not text")
    lengths = model.token_lengths(list(corpus.texts))
    return LengthDistribution(np.asarray(lengths, dtype=np.int64), model.tokenizer_name, corpus.name,
                              model.max_length)


def example_batch(model, corpus: Corpus | None, batch_size: int, seq_len: int, seed: int = 0):
    """One batch of real inputs for `model`: texts from the corpus padded (or truncated) to seq_len
    tokens, or real image crops for an image model. Returns (inputs, description)."""
    if not model.takes_text:
        images = sample_images(batch_size, model.image_size, seed)
        return model.encode(images), f"{batch_size} image crops of {model.image_size}x{model.image_size}"
    if corpus is None:
        raise BadParameter("corpus", None, CORPUS_CHOICES)
    if seq_len > model.max_length:
        raise BadParameter("seq_len", seq_len, hint=f"{model.name} takes at most {model.max_length} tokens")
    texts = corpus.sample(batch_size, seed)
    return model.encode(texts, pad_to=seq_len), (f"{batch_size} texts from {corpus.name}, padded or "
                                                 f"truncated to {seq_len} tokens")
