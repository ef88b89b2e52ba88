"""The zoo's rows, enumerated from the installed transformers' Auto mappings, and each built from its config at a
tiny size with seeded weights and its own processor, saved as a user's Hugging Face directory.

    >>> from benchmarks import zoo_build
    >>> rows = zoo_build.enumerate_rows()            # every (model type, task family) the mappings list
    >>> rows[0].key, rows[0].family, rows[0].cls
    ('afmoe.causal-lm', 'causal-lm', 'AfmoeForCausalLM')
    >>> folder = zoo_build.build(rows[0], cache, tokenizers)   # or zoo_build.NotBuilt with its one line

A row is one model type in one task family (FAMILIES): the class the family's mapping
(transformers.models.auto.modeling_auto.MODEL_FOR_*_MAPPING_NAMES) names for it, unless a family earlier in
portkit's task order (CLAIM_ORDER) holds that class (BART's masked-LM class is its seq2seq row). An encoder's
text heads are one row: masked LM, else sequence, else token classification; a causal LM gets no classifier row.

The tiny size is generic (data/models/zoo.json: every key a config or a sub-config holds takes the zoo's value,
per-layer lists keep one layer of each kind), with per-model-type "overrides", each with its reason. A text model
must also run one eager forward pass (smoke). A row that cannot be built (a missing package, a size the model
refuses, a forward pass that fails outside portkit) is a NotBuilt with the exception's first line and what is
missing.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES_FILE = ROOT / "data" / "models" / "zoo.json"
TOKENIZER_TEXTS = 3000          # corpus texts the tokenizers are trained on
TOKENIZER_VOCAB = 1000
SIZES_IMAGE_PROBE = 48          # the side of the grey image an image model's smoke pass starts from

# family: (the Auto mapping, the processor the zoo saves beside it, what portkit does with it). Ordered: a model
# type's class is a row of the first family that names it.
FAMILIES = {
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "bpe"),
    "seq2seq-lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "bpe"),
    "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "wordpiece"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "wordpiece"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "wordpiece"),
    "speech-seq2seq": ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "audio"),
    "ctc": ("MODEL_FOR_CTC_MAPPING_NAMES", "audio"),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio"),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image"),
    "zero-shot-image": ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image+wordpiece"),
    "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "image"),
    "semantic-segmentation": ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "image"),
}
# the order a class shared by two mappings is claimed in: portkit's own (portkit.models.huggingface.TASKS: an
# architecture is in the first task whose mapping lists it, so Voxtral's class is speech recognition, not text
# seq2seq), the encoder's text heads masked LM first
CLAIM_ORDER = ("speech-seq2seq", "ctc", "audio-classification", "image-classification", "zero-shot-image",
               "causal-lm", "seq2seq-lm", "masked-lm", "text-classification", "token-classification",
               "object-detection", "semantic-segmentation")
# one row per model type across these: the encoder's text heads
TEXT_HEADS = ("masked-lm", "text-classification", "token-classification")
# the families whose mapping a decoder's classifier heads also sit in: a causal LM gets no row there
DECODER_HEADS = ("text-classification", "token-classification")


@dataclasses.dataclass(frozen=True)
class Row:
    model_type: str
    family: str
    cls: str            # the class the family's mapping names

    @property
    def key(self) -> str:
        """The row's name, and its directory's: model type and family."""
        return f"{self.model_type}.{self.family}"


class NotBuilt(Exception):
    """A row the zoo could not build: its message is the one line the table shows."""


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto
    return dict(getattr(modeling_auto, name))


def enumerate_rows(families=None) -> list[Row]:
    """Every row, in FAMILIES order then by model type (see the module docstring); a class two mappings share is
    the row of the first family in CLAIM_ORDER."""
    rows, classes = [], {}
    causal = set(_mapping(FAMILIES["causal-lm"][0]))
    for family in CLAIM_ORDER:
        for model_type, cls in sorted(_mapping(FAMILIES[family][0]).items()):
            cls = cls[0] if isinstance(cls, (tuple, list)) else cls
            used = classes.setdefault(model_type, {})
            if cls in used.values():
                continue
            if family in TEXT_HEADS and any(f in TEXT_HEADS for f in used):
                continue
            if family in DECODER_HEADS and model_type in causal:
                continue
            used[family] = cls
            rows.append(Row(model_type, family, cls))
    order = list(FAMILIES)
    rows.sort(key=lambda r: (order.index(r.family), r.model_type))
    return [r for r in rows if families is None or r.family in families]


# ---------------------------------------------------------------- sizes
def sizes() -> dict:
    return json.loads(SIZES_FILE.read_text(encoding="utf-8"))


def _layer_list(value, layers: int) -> list:
    """A per-layer list shortened to `layers` entries, keeping one layer of each kind it holds (a hybrid's
    attention and recurrent layers both stay)."""
    kinds = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in value))
    picked = [json.loads(k) for k in kinds]
    return (picked + list(value))[:max(layers, len(picked))]


def own_overrides(table: dict, model_type: str | None) -> dict:
    """A model type's overrides, without their reasons: a sub-config is sized as its own model type is at the top
    (Dots3 Note's text config as dots3_note_text's)."""
    return {k: v for k, v in table["overrides"].get(model_type, {}).items() if not k.startswith("_")}


def shrink(defaults: dict, table: dict, overrides: dict) -> dict:
    """The config's keyword arguments at the zoo's size: `table` values for the keys `defaults` holds (a
    sub-config, a dict ending in _config, shrunk the same way), per-layer lists shortened, `overrides` last."""
    out, layers = {}, table["scalars"].get("num_hidden_layers", 2)
    for key, value in defaults.items():
        if isinstance(value, dict) and (key.endswith("_config") or key in table["sub_configs"]):
            sub = shrink(value, table, {**own_overrides(table, value.get("model_type")),
                                        **(overrides.get(key, {}) if isinstance(overrides.get(key), dict) else {})})
            out[key] = {"model_type": value["model_type"], **sub} if "model_type" in value else sub
        elif key in table["of_hidden"] and isinstance(value, int) and isinstance(defaults.get("hidden_size"), int):
            # a width the config derives from hidden_size (RWKV's attention is as wide as the model): kept in ratio
            out[key] = max(1, value * table["scalars"]["hidden_size"] // defaults["hidden_size"])
        elif key in table["experts_per_token"] and isinstance(value, int) and not isinstance(value, bool):
            # the experts a token is routed to, under whichever name the config gives it (ERNIE 4.5's moe_k): within
            # the tiny expert count, as a top-k over more experts than there are fails (torch.topk's "k out of range")
            out[key] = min(value, table["scalars"]["num_experts_per_tok"])
        elif key in table["scalars"] and (value is None or isinstance(value, (int, float))) \
                and not isinstance(value, bool):
            if value is None and key not in table["set_when_none"]:
                continue
            new = table["scalars"][key]
            out[key] = min(new, value) if isinstance(value, int) and key in table["never_grow"] else new
        elif key == "image_size" and isinstance(value, (list, tuple)) and len(value) == 2:
            # a (height, width) pair (Hiera's [224, 224]): the zoo's square side, as its processor makes it
            out[key] = [table["scalars"]["image_size"]] * 2
        elif key in table["per_stage"] and isinstance(value, (list, tuple)) and value:
            out[key] = [table["per_stage"][key]] * len(value)
        elif key in table["per_layer"] and isinstance(value, (list, tuple)) and value:
            out[key] = _layer_list(value, layers)
    for key in table["per_layer"]:
        if key in out and "num_hidden_layers" in defaults:
            out["num_hidden_layers"] = len(out[key])
    shared = defaults.get("num_kv_shared_layers")
    if shared and out.get("layer_types") and shared == defaults.get("num_hidden_layers"):
        # every layer reads another model's keys and values (a draft model sharing its target's cache: Gemma 4
        # Assistant's validator wants all layers shared): all of them still
        out["num_kv_shared_layers"] = out["num_hidden_layers"]
    elif shared and out.get("layer_types"):
        # the last num_kv_shared_layers layers reuse the keys and values of an earlier layer of their type, so the
        # layers before them must hold every type (transformers' Gemma3nTextConfig.kv_sharing_modes): each kind
        # once producing, then once sharing
        kinds = out["layer_types"]
        out["layer_types"], out["num_kv_shared_layers"] = kinds * 2, len(kinds)
        out["num_hidden_layers"] = 2 * len(kinds)
    heads, kv = defaults.get("num_attention_heads"), defaults.get("num_key_value_heads")
    if heads and kv == heads and "num_attention_heads" in out:
        # multi-head attention at its default size (as many key/value heads as query heads) stays multi-head:
        # grouped-query attention is a choice of the architecture the tiny size must not make for it (ESMC refuses it)
        out["num_key_value_heads"] = out["num_attention_heads"]
    if "kv_lora_rank" in defaults:
        # multi-head latent attention (DeepSeek V2/V3): as many key/value heads as query heads, and its rotary
        # part is the head_dim its rotary embedding is built for
        out["num_key_value_heads"] = out.get("num_attention_heads", defaults.get("num_attention_heads"))
        if "head_dim" in defaults and "qk_rope_head_dim" in out:
            out["head_dim"] = out["qk_rope_head_dim"]
    for key, value in overrides.items():
        if not (isinstance(value, dict) and isinstance(out.get(key), dict)):
            out[key] = value
    return out


def _token_ids(defaults: dict, tok) -> dict:
    """The tokenizer's vocabulary size and special ids, for the keys the config (or its text sub-config) has."""
    # vocab_size_per_layer_input: Gemma 3n's per-layer embeddings index the same token ids
    ids = {"vocab_size": len(tok), "vocab_size_per_layer_input": len(tok), "pad_token_id": tok.pad_token_id,
           "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else tok.cls_token_id,
           "eos_token_id": tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id,
           "decoder_start_token_id": tok.pad_token_id, "sep_token_id": tok.sep_token_id,
           "cls_token_id": tok.cls_token_id}
    out = {k: v for k, v in ids.items() if k in defaults and v is not None}
    if defaults.get("is_encoder_decoder"):      # its decoder starts from pad, as T5's and BART's configs say
        out.setdefault("decoder_start_token_id", tok.pad_token_id)
    out.setdefault("vocab_size", len(tok))
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        out.setdefault(key, ids[key])
    return out


def config_for(row: Row, tok) -> object:
    """The row's config at the zoo's size (sizes(): generic values, then the model type's overrides)."""
    from transformers import CONFIG_MAPPING
    table = sizes()
    config_cls = CONFIG_MAPPING[row.model_type]
    try:
        defaults = config_cls().to_dict()
    except Exception:  # noqa: BLE001 - a config whose own defaults fail its validator: built with its overrides
        given = {k: v for k, v in table["overrides"].get(row.model_type, {}).items() if not k.startswith("_")}
        defaults = config_cls(**given).to_dict()
    overrides = {k: v for k, v in {**table["families"].get(row.family, {}),
                                   **table["overrides"].get(row.model_type, {}),
                                   **table["overrides"].get(row.key, {})}.items() if not k.startswith("_")}
    kwargs = shrink(defaults, table, overrides)
    if tok is not None:
        kwargs.update({k: v for k, v in _token_ids(defaults, tok).items() if k not in overrides})
        text = next((k for k in ("text_config", "decoder") if isinstance(kwargs.get(k), dict)), None)
        if text is not None:
            given = overrides.get(text) if isinstance(overrides.get(text), dict) else {}
            kwargs[text].update({k: v for k, v in _token_ids(kwargs[text], tok).items() if k not in given})
    if row.family in ("text-classification", "audio-classification", "image-classification"):
        kwargs.setdefault("num_labels", table["labels"])
    return config_cls(**kwargs)


# ---------------------------------------------------------------- processors
def _texts() -> list[str]:
    from portkit.corpora import corpus
    return list(corpus.load_corpus().texts[:TOKENIZER_TEXTS])


def byte_bpe():
    """A GPT-2-style byte-level BPE: ids 0-4 are <pad>, <s>, </s>, <unk>, <mask>."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_texts(), vocab_size=TOKENIZER_VOCAB, min_frequency=2, show_progress=False,
                            special_tokens=["<pad>", "<s>", "</s>", "<unk>", "<mask>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", mask_token="<mask>")


def wordpiece():
    """A BERT-style lower-cased WordPiece: ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK]."""
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(_texts(), vocab_size=TOKENIZER_VOCAB, show_progress=False,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    # each text as BERT reads it, [CLS] text [SEP] (CLIP pools its text at the end token)
    wp.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def check_tokenizer(tokenizer, name: str) -> None:
    """Real text encodes to known tokens: a tokenizer whose vocabulary was dropped maps every word to unk."""
    ids = tokenizer("Return the sum of two numbers, or raise ValueError.")["input_ids"]
    if not ids or sum(i == tokenizer.unk_token_id for i in ids) > len(ids) // 4:
        raise RuntimeError(f"{name}: the zoo's tokenizer maps real text to {tokenizer.unk_token}: {ids}")


def tokenizer(kind: str, cache: dict):
    if kind not in cache:
        cache[kind] = {"bpe": byte_bpe, "wordpiece": wordpiece}[kind]()
        check_tokenizer(cache[kind], kind)
    return cache[kind]


SIDES = ("height", "width", "shortest_edge", "longest_edge")


def _square(value, side: int):
    """A processor's size (a dict, or transformers' SizeDict) with every side it sets at `side`."""
    keys = [k for k in SIDES if (value.get(k) if isinstance(value, dict) else getattr(value, k, None))]
    return {k: side for k in keys} or {"height": side, "width": side}


def image_processor(model_type: str, side: int):
    """The model type's own image processor (its PIL class: torchvision is not installed), made again with every
    size it sets at side x side."""
    import transformers
    from transformers.models.auto import image_processing_auto
    alias = sizes()["processors"].get(model_type, model_type)
    names = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(alias)
    if not names:
        raise NotBuilt(f"transformers maps no image processor for model type {model_type!r}")
    if isinstance(names, dict):
        backend = "torchvision" if importlib.util.find_spec("torchvision") and "torchvision" in names else "pil"
        name = names.get(backend) or next(iter(names.values()))
    else:
        name = names[0] if isinstance(names, (tuple, list)) else names
    cls = getattr(transformers, name)
    default = cls()
    sized = {a: _square(getattr(default, a), side) for a in ("size", "crop_size")
             if getattr(default, a, None) is not None}
    return cls(**sized)


def feature_extractor(model_type: str):
    import transformers
    from transformers.models.auto import feature_extraction_auto
    alias = sizes()["processors"].get(model_type, model_type)
    name = feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES.get(alias)
    if not name:
        raise NotBuilt(f"transformers maps no feature extractor for model type {model_type!r}")
    return getattr(transformers, name)()


def processors(row: Row, cache: dict) -> tuple[object | None, list]:
    """(the text tokenizer, [every processor saved beside the model])."""
    kind = FAMILIES[row.family][1]
    table = sizes()
    tok = tokenizer(kind.split("+")[-1], cache) if kind in ("bpe", "wordpiece", "image+wordpiece") else None
    made = [tok] if tok is not None else []
    if kind.startswith("image"):
        made.append(image_processor(row.model_type, table["image_sides"].get(row.model_type, table["image_side"])))
    elif kind == "audio":
        made.append(feature_extractor(row.model_type))
    return tok, made


# ---------------------------------------------------------------- building
# image families the zoo's generic size may not fit (a decoder's neck sized for another backbone; a backbone that
# downsamples a 32-pixel image below its own patch); a zero-shot model also needs captions, which portkit adds
SMOKED_IMAGES = ("image-classification", "object-detection", "semantic-segmentation")


def smoke(model, row: Row, tok, saved=()) -> None:
    """A text model runs one eager forward pass on real tokens at the zoo's size, outside portkit, and a detector
    or segmenter one on a grey image its own processor made; NotBuilt where it does not (the zoo's size is wrong
    for it, or the model does not run): a stage crash on such a model would be the zoo's, not portkit's."""
    import numpy as np
    import torch
    if row.family in SMOKED_IMAGES:
        image = np.full((SIZES_IMAGE_PROBE, SIZES_IMAGE_PROBE, 3), 0.5, np.float32)
        made = saved[-1](images=[image, image], do_rescale=False, return_tensors="pt")
        inputs = {"pixel_values": made["pixel_values"]}
    elif tok is None or row.family not in ("causal-lm", "seq2seq-lm", *TEXT_HEADS):
        return
    else:
        batch = tok(["Return the sum of two numbers.", "Raise ValueError"], padding=True, return_tensors="pt")
        extra = {"decoder_input_ids": batch["input_ids"][:, :4]} if row.family == "seq2seq-lm" else {}
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], **extra}
    try:
        with torch.no_grad():
            model(**inputs)
    except Exception as exc:    # noqa: BLE001 (any failure is the row's one line)
        raise NotBuilt(f"an eager forward pass at the zoo's size fails, outside portkit: {one_line(exc)}") from exc


def cache_folder() -> Path:
    """The zoo's directories under portkit's cache root ($PORTKIT_CACHE_DIR), keyed by this file, the sizes and the
    transformers and tokenizers versions: a change to a builder or a size builds every directory again."""
    import hashlib
    import tokenizers
    import transformers
    from portkit.corpora import corpus
    key = hashlib.sha1(Path(__file__).read_bytes() + SIZES_FILE.read_bytes()
                       + f"{transformers.__version__}|{tokenizers.__version__}".encode()).hexdigest()[:12]
    return corpus.cache_root() / "zoo" / key


MISSING = re.compile(r"requires? (?:the )?([\w\-.]+) (?:library|package)|No module named '([\w.]+)'", re.I)


def one_line(exc: BaseException) -> str:
    """The exception's first line, with what is missing where it names a package."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
    first = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]   # a validator names its rule below
    text = f"{type(exc).__name__}: {first}"[:300]
    # transformers lists every backend a class needs and lacks, one sentence each: name them all
    missing = dict.fromkeys(a or b for a, b in MISSING.findall(str(exc)))
    if missing:
        text += f" (missing: {', '.join(missing)})"
    return text


def _model_config(config, model_cls):
    """The config the model class is built from: a composite config's text sub-config where the class is its text
    model's (Emu3ForCausalLM takes Emu3TextConfig), as AutoModelForCausalLM.from_config and from_pretrained give it
    (transformers models/auto/auto_factory.py); else the config itself."""
    text = getattr(config, "sub_configs", {}).get("text_config")
    if text is not None and getattr(model_cls, "config_class", None) is text:
        return config.get_text_config()
    return config


def build(row: Row, folder: Path, cache: dict) -> Path:
    """The row's directory (built and saved once: a folder holding DONE is complete); NotBuilt in one line."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    target = folder / row.key
    if (target / "DONE").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    try:
        tok, saved = processors(row, cache)
        config = config_for(row, tok)
        model_cls = getattr(transformers, row.cls, None)
        if model_cls is None:
            raise NotBuilt(f"transformers {transformers.__version__} exports no class {row.cls}")
        torch.manual_seed(0)
        model = model_cls(_model_config(config, model_cls)).eval()
        smoke(model, row, tok, saved)
        partial = folder / f".{row.key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        if model.config is not config:      # the composite config, naming the class, as a user's directory holds it
            config.architectures = [row.cls]
            config.save_pretrained(partial)
        for processor in saved:
            processor.save_pretrained(partial)
    except NotBuilt:
        raise
    except Exception as exc:    # noqa: BLE001 (any failure to build is the row's one line)
        raise NotBuilt(one_line(exc)) from exc
    (partial / "DONE").write_text(f"{row.cls}\n")
    os.replace(partial, target)
    return target
