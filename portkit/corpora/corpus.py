"""Real inputs for the workbook: text corpora, images, tokenized batches, length distributions.

    >>> from portkit import models
    >>> from portkit.corpora import corpus
    >>> texts = corpus.load_corpus("stdlib")             # docstrings of this Python's standard library
    >>> model = models.load("minilm")
    >>> dist = corpus.length_distribution(texts, model)
    >>> dist.percentiles()                              # {'p50': 25, 'p90': 123, ...}
    >>> batch = model.encode(texts.sample(8, seed=0))

The default corpus is the docstrings of the standard library found on the machine
(`ast.get_docstring` over its .py files, test folders excluded): a long-tailed distribution of
real text that needs no download. A user's own texts come from a .txt (one text per line),
.jsonl or .csv file, with the text column named by parameter.
"""
from __future__ import annotations

import ast
import codecs
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

from portkit.corpora import audio
from portkit.corpora import images
from portkit.core import checks
from portkit.core import progress
from portkit.core.atomic_io import write_json
from portkit.core.errors import BadParameter, MissingPackage

CORPUS_CHOICES = ("stdlib", "<path>.txt", "<path>.jsonl", "<path>.csv", "<folder of .wav/.flac>",
                  "<folder of .jpg/.png>")
CORPUS_TYPES = (".txt", ".jsonl", ".csv")
# A larger file is refused before it is read: stage 3 tokenizes every text of the corpus, and a
# sample of this size already gives its length distribution.
MAX_CORPUS_BYTES = 256 * 2**20
# A longer text is cut to this many characters when the corpus is read (the plan step says so), before any
# tokenizer sees it: at about 4 characters a token (OpenAI's tokenizer rule of thumb) it is some 50,000 tokens,
# beyond the maximum of the models portkit loads, so every cut text still reads as over the limit; a tokenizer
# otherwise tokenizes a whole multi-megabyte line before truncating it.
MAX_TEXT_CHARS = 200_000
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


CACHE_VARIABLE = "PORTKIT_CACHE_DIR"
_TOKENIZE_CHUNK = 1024     # texts per tokenizer call in length_distribution: one progress step each
SPOKEN_CLIPS = 256         # texts of the corpus an audio model hears spoken (seeded sample; synthesis cached)


# The corpora's own caches under cache_root(): what reading the standard library and synthesizing speech leave (each
# keyed by what it depends on), safe to copy into another cache root.
CORPUS_CACHES = ("stdlib-docstrings-*.json", "speech")


def cache_root() -> Path:
    """The folder every portkit on-disk cache lives under: $PORTKIT_CACHE_DIR when set, else
    $XDG_CACHE_HOME/portkit, else ~/.cache/portkit (the XDG base-directory convention)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "portkit"


def stdlib_docstrings() -> Corpus:
    """Docstrings of the running Python's standard library, cached on disk after the first read."""
    root = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha1(f"{sys.version}|{root}".encode()).hexdigest()[:12]
    cache = cache_root() / f"stdlib-docstrings-{key}.json"
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


def resolve_corpus(spec: str) -> str:
    """The corpus spec with a file path made absolute against this process's folder. The runner calls it
    where the user typed the path: the notebooks run in notebooks/, where a relative path means another file."""
    if spec == "stdlib" or not isinstance(spec, str) or not spec.strip():
        return spec
    return os.path.abspath(os.path.expanduser(spec))


def check_corpus(spec: str) -> str:
    """Cheap check of a corpus spec (no reading): 'stdlib' or an existing file of a known type and size."""
    if spec == "stdlib":
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise BadParameter("corpus", spec, CORPUS_CHOICES)
    path = Path(spec).expanduser()
    if not path.exists():
        if path.is_symlink():    # a loop or a broken link: say which, not "no such file"
            raise BadParameter("corpus", spec, hint=checks.missing_path(path))
        raise BadParameter("corpus", spec, CORPUS_CHOICES, hint="no such file")
    if path.is_dir():
        if audio.holds_audio(path) or images.holds_images(path):
            return spec          # a folder of recordings or of images: an audio or image model's corpus
        raise BadParameter("corpus", spec, hint="not a file, nor a folder of .wav/.flac recordings or of "
                                                 f"{'/'.join(images.IMAGE_TYPES)} images")
    if not path.is_file():
        raise BadParameter("corpus", spec, hint="not a file")
    if path.suffix.lower() not in CORPUS_TYPES:
        raise BadParameter("corpus file type", path.suffix or path.name, CORPUS_TYPES)
    size = path.stat().st_size
    if size > MAX_CORPUS_BYTES:
        raise BadParameter("corpus", spec, hint=f"{size:,} bytes, over portkit's limit of {MAX_CORPUS_BYTES:,} "
                                                f"({MAX_CORPUS_BYTES / 2**20:g} MiB); give a sample of it")
    return spec


def load_corpus(spec: str = "stdlib", column: str = "text") -> Corpus:
    """'stdlib', or a .txt (one text per line), .jsonl or .csv file with a text column.

    Every problem in the file is one BadParameter naming the file, the line and what is wrong."""
    if check_corpus(spec) == "stdlib":
        return stdlib_docstrings()
    path = Path(spec).expanduser()
    suffix = path.suffix.lower()
    lines = _lines(path, spec)
    if suffix == ".txt":
        texts = [line.strip() for _, line in lines]
    elif suffix == ".jsonl":
        texts = _jsonl_texts(lines, path, spec, column)
    else:
        texts = _csv_texts(lines, path, spec, column)
    texts = tuple(t for t in texts if t and t.strip())
    if not texts:
        raise BadParameter("corpus", spec, hint="the file holds no non-empty texts")
    return Corpus(path.stem, str(path.resolve()), _cut_long(texts, path))


def _cut_long(texts: tuple[str, ...], path: Path) -> tuple[str, ...]:
    """`texts` with each one longer than MAX_TEXT_CHARS cut to it, and a line saying how many were cut."""
    long = [len(t) for t in texts if len(t) > MAX_TEXT_CHARS]
    if not long:
        return texts
    print(f"corpus {path.name}: {len(long)} text(s) longer than {MAX_TEXT_CHARS:,} characters (the longest "
          f"{max(long):,}) cut to {MAX_TEXT_CHARS:,} before tokenizing; the model reads at most its maximum anyway")
    return tuple(t[:MAX_TEXT_CHARS] for t in texts)


def is_folder(spec) -> bool:
    """Whether a corpus spec names a folder (of recordings or images: check_corpus refuses any other)."""
    return isinstance(spec, str) and spec != "stdlib" and Path(spec).expanduser().is_dir()


def check_folder_for(model, spec: str) -> None:
    """A folder corpus holds the model's kind of data (recordings for an audio model, images for an image
    model; a text model takes a file), without reading it."""
    kind = model.declaration.data
    path = Path(spec).expanduser()
    holds = {"audio": audio.holds_audio(path), "image": images.holds_images(path)}
    if not holds.get(kind, False):
        wanted = {"audio": "a folder of .wav/.flac recordings", "image": "a folder of images"}.get(
            kind, "a .txt/.jsonl/.csv file")
        raise BadParameter("corpus", spec, hint=f"{model.name} takes {kind}: give {wanted}")


def audio_corpus(spec: str = "stdlib", column: str = "text", clips: int = SPOKEN_CLIPS, seed: int = 0):
    """An audio model's corpus (an audio.AudioCorpus): the user's folder of recordings; or, for 'stdlib' or a
    text file, the alsa-utils recordings with `clips` texts of it spoken by espeak-ng (labelled synthetic,
    cached under cache_root()/speech), for a realistic, long-tailed distribution of durations."""
    if check_corpus(spec) != "stdlib" and is_folder(spec):
        return audio.folder_corpus(spec)      # a folder without recordings fails here, naming it
    texts = load_corpus(spec, column)
    spoken = audio.synthesize(texts.sample(min(clips, len(texts)), seed), cache_root() / "speech", texts.name)
    try:
        return audio.alsa_recordings() + spoken
    except MissingPackage as exc:
        print(f"no recordings: {exc}; the corpus is synthetic speech only")
        return spoken


def _lines(path: Path, spec: str):
    """(line number, text) of each line, read as strict UTF-8 one line at a time."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise BadParameter("corpus", spec, hint=f"cannot read it ({exc.strerror})") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]   # spreadsheet exports start with a byte-order mark
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadParameter("corpus", spec, hint=f"line {number} is not UTF-8 text (byte "
                                                        f"0x{raw[exc.start]:02x} at column {exc.start + 1})") from None


def _kind(value) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _jsonl_texts(lines, path: Path, spec: str, column: str) -> list[str]:
    texts = []
    for number, line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line.rstrip("\r\n"))
        except (ValueError, RecursionError) as exc:
            # json's messages end in "at" where its str() goes on with the position
            why = (f"{exc.msg.removesuffix(' at')} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError)
                   else "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
            raise BadParameter("corpus", spec, hint=f"line {number} is not JSON ({why})") from None
        if not isinstance(row, dict):
            raise BadParameter("corpus", spec, hint=f"line {number} is {_kind(row)}, not an object with a "
                                                    f"{column!r} field")
        if column not in row:
            raise BadParameter(f"text column in {path.name} line {number}", column, sorted(row))
        value = row[column]
        if not isinstance(value, str):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise BadParameter("corpus", spec, hint=f"line {number}: column {column!r} holds {_kind(value)} "
                                                    f"({shown}), not text")
        texts.append(value)
    return texts


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_texts(lines, path: Path, spec: str, column: str) -> list[str]:
    # a long document is one field; the file size limit bounds it, not csv's default of 128 KiB
    csv.field_size_limit(max(csv.field_size_limit(), MAX_CORPUS_BYTES))
    reader = csv.DictReader(line for _, line in lines)
    try:
        if not reader.fieldnames:
            raise BadParameter("corpus", spec, hint="the file holds no non-empty texts")
        if column not in reader.fieldnames:
            raise BadParameter(f"text column in {path.name}", column, reader.fieldnames)
        texts = []
        for row in reader:
            if row[column] is None:
                raise BadParameter("corpus", spec, hint=f"line {reader.line_num} has fewer fields than the header")
            texts.append(row[column])
    except csv.Error as exc:
        raise BadParameter("corpus", spec, hint=f"line {reader.line_num} is not valid CSV ({exc})") from None
    filled = [t for t in texts if t.strip()]
    if filled and all(_is_number(t) for t in filled):
        # a numeric column (an id, a label) is a wrong text_column, not a corpus of texts
        raise BadParameter("corpus", spec, hint=f"column {column!r} holds only numbers (first: {filled[0]!r}); "
                                                "name the column that holds the text with text_column")
    return texts


def percentiles(lengths) -> dict[str, int]:
    """p50, p90, p99 and max of a set of lengths, whole numbers."""
    q = np.percentile(lengths, [50, 90, 99])
    return {"p50": int(q[0]), "p90": int(q[1]), "p99": int(q[2]), "max": int(np.max(lengths))}


# How a length limit is named: "the model's maximum" only for one read from the model (its config, its position
# table, its factory's declaration); any other is portkit's own cap, named as portkit's with what raises it.
RAISE_CAP = ("a factory of your own raises it: return LoadedModel(..., max_length=N), or declare the dimension with "
             "Dim(..., max=N) (docs/guides/declaring-a-model.md)")


def limit_text(max_length: int, unit: str, source: str | None) -> str:
    """The limit `max_length` in words, with whose it is: the model's (source: where the model states it) or
    portkit's cap (source None); limit_note says where it comes from."""
    return f"{max_length} {unit} " + ("(the model's maximum)" if source else "(portkit's cap, not the model's)")


def limit_note(source: str | None) -> str:
    """Where a limit comes from: the model's own statement, or, for portkit's cap, what raises it."""
    return f"the limit is {source}" if source else f"the model states no length limit; {RAISE_CAP}"


@dataclass
class LengthDistribution:
    """Lengths of a corpus's items along the model's varying dimension (tokens under one tokenizer for
    text), before any truncation."""
    lengths: np.ndarray
    tokenizer: str
    corpus: str
    max_length: int          # what the model accepts; longer texts are truncated or rejected
    unit: str = "tokens"     # the varying dimension's name (tokens, samples, frames)
    max_length_from: str | None = None   # where the model states max_length; None: portkit's cap (limit_text)

    def percentiles(self) -> dict[str, int]:
        return {**percentiles(self.lengths), "min": int(self.lengths.min())}

    def over_limit(self) -> int:
        return int((self.lengths > self.max_length).sum())

    def to_dict(self) -> dict:
        return {"corpus": self.corpus, "tokenizer": self.tokenizer, "count": int(self.lengths.size),
                "max_length": self.max_length, "max_length_from": self.max_length_from,
                "over_max_length": self.over_limit(), "unit": self.unit,
                **self.percentiles()}

    def __str__(self) -> str:
        p = self.percentiles()
        what, noun = (f"{self.tokenizer} tokens", "texts") if self.unit == "tokens" else (self.unit, "items")
        return (f"{self.lengths.size} {noun} from {self.corpus}, {what}: p50 {p['p50']}, "
                f"p90 {p['p90']}, p99 {p['p99']}, max {p['max']}; {self.over_limit()} longer than "
                + limit_text(self.max_length, self.unit, self.max_length_from)
                + f" ({limit_note(self.max_length_from)})")

    def plot(self, ax=None, bins: int = 60):
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(7, 3))[1]
        ax.hist(self.lengths, bins=bins, color="#4C72B0")
        top = ax.get_ylim()[1]
        # each label one line lower than the last: close percentiles (p50 and p90 of short texts) never overprint
        for row, name in enumerate(("p50", "p90", "p99")):
            value = self.percentiles()[name]
            ax.axvline(value, color="#C44E52", ls="--", lw=1)
            ax.text(value, top * (0.92 - 0.1 * row), f" {name}={value}", color="#C44E52", fontsize=8,
                    va="top", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
        ax.set_xlabel(f"{self.unit} per item")
        ax.set_ylabel("items")
        ax.set_title(f"Lengths in {self.unit}: {self.corpus}")
        return ax


def length_distribution(corpus: Corpus, model) -> LengthDistribution:
    """Each item's length along the model's varying dimension (its declaration's lengths: tokens under the
    model's own tokenizer for text), for every item of the corpus."""
    if model.seq_dim is None:
        raise BadParameter("model for a length distribution", model.name,
                           hint="no dimension of its inputs varies with the data")
    texts = list(corpus.texts)
    chunks = range(0, len(texts), _TOKENIZE_CHUNK)
    verb = "tokenizing" if model.seq_dim == "tokens" else "measuring"
    lengths = [n for start in progress.bar(chunks, desc=f"{verb} {corpus.name}", unit="chunk", leave=False)
               for n in model.token_lengths(texts[start:start + _TOKENIZE_CHUNK])]
    return LengthDistribution(np.asarray(lengths, dtype=np.int64), model.tokenizer_name, corpus.name,
                              model.max_length, model.seq_dim, getattr(model, "max_length_from", None))


def corpus_for(model, spec: str = "stdlib", column: str = "text") -> Corpus | None:
    """The items `model`'s batches are drawn from: the declaration's own items when it brings them
    (Declaration.own_items), texts from the corpus for a text model (load_corpus); None for an image
    model without a folder of images, whose batches are crops of matplotlib's photographs (sample_images)."""
    declared = model.declaration
    if declared.own_items is not None:
        items = tuple(declared.own_items())
        if not items:
            raise BadParameter(f"data of {model.name}", "no items", hint="its declaration's own_items() is empty")
        return Corpus(f"{model.name}'s own data", f"{declared.items}, from its declaration's own_items()", items)
    if model.takes_text:
        if is_folder(spec):
            raise BadParameter("corpus", spec, hint=f"a folder; {model.name} takes text (a .txt/.jsonl/.csv file)")
        return load_corpus(spec, column)
    if declared.data == "audio":   # the clips are the items: the declaration decodes them for build and measure
        clips = audio_corpus(spec, column)
        return Corpus(clips.name, f"{clips} ({clips.label})", clips.clips)
    if declared.data == "image":
        if not is_folder(spec):
            return None
        name, source, pictures = images.folder_images(spec, model.image_size, channels=image_channels(model))
        return Corpus(name, source, pictures)
    raise BadParameter(f"data for {model.name}", declared.data,
                       hint="give its declaration own_items() (portkit.models.inputs), or a corpus of its kind")


def image_channels(model) -> int:
    """The channels an image model's items carry: its declaration's `channels` dimension where that is one
    images.to_channels makes (image_declaration's), else 3 (RGB, what any other image declaration reads)."""
    size = next((d.size for d in model.declaration.dims if d.name == "channels"), None)
    return size if size in images.CHANNELS else 3


def example_batch(model, corpus: Corpus | None, batch_size: int, seq_len: int, seed: int = 0):
    """One batch of real inputs for `model`, built by its declaration: texts from the corpus padded (or
    truncated) to seq_len tokens, real image crops for an image model, any other items padded to the
    longest of them (seq_len counts tokens). Returns (inputs, description)."""
    if corpus is None and not model.takes_text:
        crops = images.sample_images(batch_size, model.image_size, seed, channels=image_channels(model))
        return model.encode(crops), f"{batch_size} image crops of {model.image_size}x{model.image_size}"
    if corpus is None:
        raise BadParameter("corpus", None, CORPUS_CHOICES)
    items = corpus.sample(batch_size, seed)
    if model.declaration.data == "image":
        size = model.image_size
        return model.encode(items), f"{batch_size} images from {corpus.name}, centred squares at {size}x{size}"
    if model.seq_dim != "tokens":
        batch = model.encode(items)
        return batch, (f"{batch_size} {model.declaration.items} from {corpus.name}, padded to the longest: "
                       f"{model.declaration.shape_label(batch)}")
    if seq_len > model.max_length:
        raise BadParameter("seq_len", seq_len, hint=f"{model.name} takes at most {model.max_length} tokens")
    return model.encode(items, pad_to=seq_len), (f"{batch_size} texts from {corpus.name}, padded or "
                                                 f"truncated to {seq_len} tokens")


# ---------------------------------------------------------------- traces of real requests
@dataclass
class Trace:
    """Requests from a corpus in a seeded random order: each request is one batch of texts."""
    requests: list[list[str]]
    lengths: list[list[int]]
    pool_texts: tuple[str, ...]       # the corpus and its token lengths: source of check inputs
    pool_lengths: np.ndarray
    source: str
    seed: int
    unit: str = "tokens"              # the varying dimension the lengths are in

    @property
    def texts(self) -> int:
        return sum(len(r) for r in self.requests)

    def describe(self) -> dict:
        flat = np.concatenate([np.asarray(x) for x in self.lengths])
        return {"requests": len(self.requests), "texts": self.texts, "source": self.source, "seed": self.seed,
                "batch_sizes": sorted({len(r) for r in self.requests}),
                "distinct_lengths": int(np.unique(flat).size), "max_length": int(flat.max())}

    def __str__(self) -> str:
        d = self.describe()
        noun = "texts" if self.unit == "tokens" else "items"
        return (f"{d['requests']} requests ({d['texts']} {noun}) from {d['source']} in random order (seed "
                f"{d['seed']}): {d['distinct_lengths']} distinct lengths, longest {d['max_length']} {self.unit}")


def make_trace(corpus, model, n: int, seed: int = 0, max_batch: int = 1, dist=None) -> Trace:
    """n requests of 1..max_batch texts (seeded sizes), texts drawn from the corpus in random order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_batch + 1, size=n).tolist() if max_batch > 1 else [1] * n
    texts = corpus.sample(sum(sizes), seed)
    lengths = model.token_lengths(texts)
    requests, lens, at = [], [], 0
    for size in sizes:
        requests.append(texts[at:at + size])
        lens.append(lengths[at:at + size])
        at += size
    pool = dist.lengths if dist is not None else np.asarray(model.token_lengths(list(corpus.texts)))
    return Trace(requests, lens, tuple(corpus.texts), np.asarray(pool), corpus.name, seed, model.seq_dim)
