"""Real audio for the workbook: recordings a distribution package installs, speech synthesized from the
workbook's text corpus, or the user's own folder of WAV/FLAC files, each resampled to a model's rate.

    >>> from portkit.corpora import audio
    >>> real = audio.alsa_recordings()                     # Debian alsa-utils' spoken channel names
    >>> real.lengths(16000)                                # samples per clip at 16 kHz
    array([22848, 23681, ...])
    >>> spoken = audio.synthesize(["Return the sum of a and b."], folder, "stdlib")   # espeak-ng, synthetic
    >>> mine = audio.folder_corpus("path/to/recordings")   # every .wav/.flac below the folder

Three sources, each labelled in what it returns:
- **recorded**: Debian `alsa-utils`' spoken test files (`/usr/share/sounds/alsa`, 48 kHz; `Noise.wav`, not
  speech, is left out), or the user's folder.
- **synthetic**: each text's first paragraph spoken by `espeak-ng`: a realistic, long-tailed distribution of
  durations, like the utterances of public speech corpora, but never a recording. Clips are cached as FLAC
  under the caller's folder (keyed by the text and espeak-ng's version), so a text is spoken once.
Files are read with `soundfile` and resampled with `scipy.signal.resample_poly` (anti-aliased); multi-channel
files are mixed down to mono. A corpus holds each file's rate and length (its durations cost no decoding);
a declaration's build and measure take waveforms (`waveform(item, rate)`), kept once decoded, by path and rate
(WAVEFORM_CACHE_BYTES), so the batches built from measured clips decode nothing again.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import shutil
import subprocess
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from portkit.core.errors import BadParameter, MissingPackage

ALSA_FOLDER = Path("/usr/share/sounds/alsa")      # Debian package alsa-utils
ALSA_NOT_SPEECH = ("Noise.wav",)                   # the folder's one recording that is not a spoken word
AUDIO_TYPES = (".wav", ".flac")
# A first paragraph longer than this is cut at the last word before it before it is spoken: about 40 s of
# espeak-ng speech at its default 175 words a minute, above any bucket an audio model here takes, so the cut
# changes no bucket and keeps the cache small.
MAX_SPOKEN_CHARS = 600
ESPEAK = "espeak-ng"
# Decoded waveforms kept for reuse (least recently used dropped first): a declaration's measure() reads every
# clip of the corpus (stage 3 measures them all) and its build() reads clips of the same corpus again. 256 MiB
# holds about 70 minutes of float32 audio at 16 kHz (64,000 bytes a second), above the default corpus (the
# alsa-utils words and 256 spoken docstrings, each at most MAX_SPOKEN_CHARS), while a larger folder stays
# bounded: its oldest clips are decoded again when needed.
WAVEFORM_CACHE_BYTES = 256 * 2**20
_INSTALL_HINT = "apt-get install alsa-utils espeak-ng (scripts/bootstrap.sh does it where apt is available)"


def _soundfile():
    try:
        import soundfile
    except (ImportError, OSError) as exc:   # OSError: the wheel's libsndfile failed to load
        raise MissingPackage(f"reading audio needs the soundfile package ({exc}); install it with "
                             "pip install 'portkit[audio]'") from None
    return soundfile


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """`samples` (1-D) from rate_in to rate_out Hz with scipy's polyphase filter; float32 out."""
    if rate_in == rate_out:
        return np.asarray(samples, dtype=np.float32)
    from scipy.signal import resample_poly
    g = math.gcd(int(rate_in), int(rate_out))
    return resample_poly(samples, rate_out // g, rate_in // g).astype(np.float32)


def resampled_length(frames: int, rate_in: int, rate_out: int) -> int:
    """How many samples `resample` returns for `frames` samples (resample_poly's ceil(n * up / down))."""
    if rate_in == rate_out:
        return int(frames)
    g = math.gcd(int(rate_in), int(rate_out))
    up, down = rate_out // g, rate_in // g
    return -(-int(frames) * up // down)


@dataclass(frozen=True)
class Clip:
    """One audio file: where it is, its own rate and length, and whether it is a recording."""
    path: str
    rate: int
    frames: int
    synthetic: bool
    text: str | None = None          # what was spoken, for a synthetic clip

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def length(self, rate: int) -> int:
        """Samples at `rate` Hz (what `load(rate)` returns), without reading the file."""
        return resampled_length(self.frames, self.rate, rate)

    def load(self, rate: int) -> np.ndarray:
        """The clip as float32 mono samples in [-1, 1] at `rate` Hz: decoded once, then from the cache of
        decoded waveforms while it holds them (a copy: the caller may change it)."""
        key = (self.path, self.rate, self.frames, int(rate))   # the header's rate and length: the same file
        return _DECODED.get(key, lambda: _decode(self.path, rate)).copy()


def _decode(path: str, rate: int) -> np.ndarray:
    """A file's samples mixed down to mono, as float32 at `rate` Hz."""
    try:
        data, native = _soundfile().read(path, dtype="float32", always_2d=True)
    except RuntimeError as exc:   # soundfile's LibsndfileError: a file that is not audio
        raise BadParameter("audio file", path, hint=f"cannot read it ({exc})") from None
    return resample(data.mean(axis=1), native, rate)


class _WaveformCache:
    """Decoded waveforms by key, at most `limit` bytes in all, the least recently used dropped first."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0
        self._waves: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, decode) -> np.ndarray:
        with self._lock:
            if key in self._waves:
                self._waves.move_to_end(key)
                return self._waves[key]
        wave = decode()
        wave.setflags(write=False)          # handed out as copies only
        with self._lock:
            if key not in self._waves and wave.nbytes <= self.limit:
                self._waves[key] = wave
                self.held += wave.nbytes
                while self.held > self.limit:
                    self.held -= self._waves.popitem(last=False)[1].nbytes
        return wave

    def clear(self) -> None:
        with self._lock:
            self._waves.clear()
            self.held = 0


_DECODED = _WaveformCache(WAVEFORM_CACHE_BYTES)


def waveform(item, rate: int) -> np.ndarray:
    """A data item as an audio declaration's build and measure take it: a Clip as its 1-D float32 waveform at
    `rate` Hz (Clip.load, cached); any other item (a waveform a declaration's own_items gives) as it is."""
    return item.load(rate) if isinstance(item, Clip) else item


@dataclass(frozen=True)
class AudioCorpus:
    """Clips of one source (or several joined), with their label: recorded, synthetic or both."""
    name: str
    source: str
    clips: tuple[Clip, ...]

    def __len__(self) -> int:
        return len(self.clips)

    def __add__(self, other: AudioCorpus) -> AudioCorpus:
        return AudioCorpus(f"{self.name}+{other.name}", f"{self.source}; {other.source}", self.clips + other.clips)

    @property
    def label(self) -> str:
        kinds = {c.synthetic for c in self.clips}
        return "synthetic" if kinds == {True} else "recorded" if kinds == {False} else "recorded and synthetic"

    def lengths(self, rate: int) -> np.ndarray:
        """Samples per clip at `rate` Hz, in the corpus' order."""
        return np.asarray([c.length(rate) for c in self.clips], dtype=np.int64)

    def seconds(self) -> np.ndarray:
        return np.asarray([c.seconds for c in self.clips], dtype=np.float64)

    def recorded(self) -> AudioCorpus:
        """Only the recordings (no synthetic clip)."""
        return AudioCorpus(self.name, self.source, tuple(c for c in self.clips if not c.synthetic))

    def sample(self, n: int, seed: int = 0) -> list[Clip]:
        """n clips in a seeded random order (with repeats only when n exceeds the corpus)."""
        if n <= 0:
            raise BadParameter("sample size", n, hint="must be a positive number of clips")
        rng = random.Random(seed)
        if n <= len(self.clips):
            return rng.sample(self.clips, n)
        return [rng.choice(self.clips) for _ in range(n)]

    def describe(self) -> dict:
        secs = self.seconds()
        return {"name": self.name, "source": self.source, "label": self.label, "clips": len(self.clips),
                "recorded": sum(not c.synthetic for c in self.clips),
                "synthetic": sum(c.synthetic for c in self.clips),
                "seconds_p50": float(np.percentile(secs, 50)), "seconds_max": float(secs.max()),
                "seconds_total": float(secs.sum())}

    def __str__(self) -> str:
        d = self.describe()
        return (f"{d['clips']} clips ({d['label']}: {d['recorded']} recorded, {d['synthetic']} synthetic) from "
                f"{self.source}: median {d['seconds_p50']:.2f} s, longest {d['seconds_max']:.2f} s, "
                f"{d['seconds_total']:.0f} s in all")


def _clip(path: Path, synthetic: bool = False, text: str | None = None) -> Clip:
    try:
        info = _soundfile().info(str(path))
    except RuntimeError as exc:
        raise BadParameter("audio file", str(path), hint=f"cannot read it ({exc})") from None
    if info.frames <= 0:
        raise BadParameter("audio file", str(path), hint="it holds no samples")
    return Clip(str(path), int(info.samplerate), int(info.frames), synthetic, text)


def alsa_recordings(folder: Path = ALSA_FOLDER) -> AudioCorpus:
    """The spoken channel-test recordings of Debian's alsa-utils (real speech, 48 kHz)."""
    files = sorted(p for p in Path(folder).glob("*.wav") if p.name not in ALSA_NOT_SPEECH)
    if not files:
        raise MissingPackage(f"the spoken test recordings of Debian's alsa-utils are not in {folder}; "
                             f"install them: {_INSTALL_HINT}")
    return AudioCorpus("alsa", f"alsa-utils recordings in {folder}", tuple(_clip(p) for p in files))


def check_folder(spec: str) -> Path:
    """A user's folder of recordings, checked without decoding: it exists and holds .wav/.flac files."""
    if not isinstance(spec, str) or not spec.strip():
        raise BadParameter("audio folder", spec, hint="give a folder of .wav or .flac files")
    path = Path(spec).expanduser()
    if not path.exists():
        raise BadParameter("audio folder", spec, hint="no such folder")
    if not path.is_dir():
        raise BadParameter("audio folder", spec, hint="not a folder (give a folder of .wav or .flac files)")
    if not holds_audio(path):
        raise BadParameter("audio folder", spec, hint=f"it holds no {' or '.join(AUDIO_TYPES)} file")
    return path


def _walk(folder: Path):
    return (p for p in Path(folder).rglob("*") if p.suffix.lower() in AUDIO_TYPES and p.is_file())


def audio_files(folder: Path) -> list[Path]:
    """Every .wav/.flac file below `folder`, sorted."""
    return sorted(_walk(folder))


def holds_audio(folder: Path) -> bool:
    """Whether any .wav/.flac file lies below `folder` (stops at the first)."""
    return next(_walk(folder), None) is not None


def folder_corpus(spec: str) -> AudioCorpus:
    """Every .wav/.flac file below a user's folder, as recordings; an unreadable file fails naming it."""
    path = check_folder(spec)
    clips = tuple(_clip(p) for p in audio_files(path))
    return AudioCorpus(path.name, f"recordings in {path.resolve()}", clips)


@functools.cache
def espeak_version() -> str | None:
    """espeak-ng's version line, or None where it is not installed."""
    exe = shutil.which(ESPEAK)
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    # "eSpeak NG text-to-speech: 1.51  Data at: /usr/lib/...": the name and version, not the data path
    return done.stdout.split("Data at:")[0].strip() or None


def spoken_text(text: str) -> str:
    """What is spoken of a text: its first paragraph (one utterance: a docstring's summary), whitespace
    joined, cut at the last word before MAX_SPOKEN_CHARS."""
    words = " ".join(text.strip().split("\n\n")[0].split())
    if len(words) <= MAX_SPOKEN_CHARS:
        return words
    return words[:MAX_SPOKEN_CHARS].rsplit(" ", 1)[0]


def synthesize(texts, folder: str | os.PathLike, corpus_name: str) -> AudioCorpus:
    """Each text spoken by espeak-ng into `folder` (one FLAC per text, reused when already there)."""
    version = espeak_version()
    if version is None:
        raise MissingPackage(f"speech synthesis needs {ESPEAK}, which is not installed; {_INSTALL_HINT}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    clips = []
    for text in texts:
        spoken = spoken_text(text)
        if not spoken:
            continue
        key = hashlib.sha1(f"{version}|{spoken}".encode()).hexdigest()[:16]
        path = folder / f"{key}.flac"
        if not path.exists():
            _speak(spoken, path)
        clips.append(_clip(path, synthetic=True, text=spoken))
    if not clips:
        raise BadParameter("corpus", corpus_name, hint="it holds no text to speak")
    return AudioCorpus(f"{corpus_name}-spoken", f"{len(clips)} texts of {corpus_name} spoken by {version} "
                       "(synthetic speech)", tuple(clips))


def _speak(text: str, path: Path) -> None:
    """espeak-ng writes a WAV; it is stored as FLAC (lossless, half the size) under a temporary name, then
    renamed, so a killed run leaves no half-written clip in the cache."""
    sf = _soundfile()
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        done = subprocess.run([shutil.which(ESPEAK), "-w", str(wav), "--stdin"], input=text, text=True,
                              capture_output=True, timeout=120)
        if done.returncode != 0 or not wav.exists():
            raise MissingPackage(f"{ESPEAK} failed ({done.returncode}): {done.stderr.strip()[:200]}")
        data, rate = sf.read(str(wav), dtype="int16")
        fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".flac", dir=path.parent)
        os.close(fd)
        try:
            sf.write(partial, data, rate, format="FLAC")
            os.replace(partial, path)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
