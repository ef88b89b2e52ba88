"""A Hugging Face model's length limit, read from its config: the position table's size, less the positions before the
first token, or portkit's own cap where the model states none (named as portkit's).

    >>> from portkit.models import limits
    >>> limits.text_limit({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1})["max_length"]
    512
"""
from __future__ import annotations

import functools
from pathlib import Path


# Models whose position ids start after the padding id (RoBERTa and its descendants, MPNet, ESM, ...): a sequence
# fits max_position_embeddings - (padding index + 1) tokens, 512 for roberta-base's 514 positions. Which models
# those are is read from transformers' own modeling files: the ones that number positions with
# create_position_ids_from_input_ids (transformers/models/roberta/modeling_roberta.py), not from a list of names.
OFFSET_CALL = "create_position_ids_from_input_ids("


# MPNet's embeddings fix their padding index at 1 whatever the config's pad_token_id (transformers,
# models/mpnet/modeling_mpnet.py: MPNetEmbeddings sets self.padding_idx = 1), so its offset is 2.
FIXED_PADDING_IDX = {"mpnet": 1}


@functools.cache
def positions_after_padding(model_type: str | None) -> bool:
    """Whether the model type's modeling files in the installed transformers number positions after the padding
    index (OFFSET_CALL)."""
    if not model_type:
        return False
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    folder = Path(transformers.__file__).parent / "models" / model_type_to_module_name(model_type)
    return any(OFFSET_CALL in f.read_text(errors="replace") for f in sorted(folder.glob("modeling_*.py")))


def position_offset(config: dict) -> int:
    """The positions a sequence cannot use: the padding index + 1 where the model numbers positions after it
    (positions_after_padding; the index its embeddings fix, FIXED_PADDING_IDX, else the config's pad_token_id),
    else 0."""
    kind = config.get("model_type")
    if not positions_after_padding(kind):
        return 0
    return FIXED_PADDING_IDX.get(kind, int(config.get("pad_token_id") or 0)) + 1


# The config keys that size a model's position table (transformers: BERT, Llama, ... and GPT-2's n_positions); a
# model with neither gets portkit's own cap, named as portkit's (portkit.corpora.corpus.limit_text).
POSITION_KEYS = ("max_position_embeddings", "n_positions")
PORTKIT_CAP = 512
# T5's attention is relative (position buckets, relative_attention_num_buckets) with no position table: the
# n_positions its published configs carry is no limit of the model (transformers T5 docs: "T5 uses relative
# scalar embeddings"; inputs of any length), so it is not read as one.
RELATIVE_ONLY = "relative_attention_num_buckets"


def position_key(config: dict) -> str | None:
    """The config key that sizes the model's position table (POSITION_KEYS), or None where it has none: a
    relative-position model (RELATIVE_ONLY) without max_position_embeddings states no length limit."""
    keys = POSITION_KEYS[:1] if RELATIVE_ONLY in config else POSITION_KEYS
    return next((k for k in keys if config.get(k)), None)


# The sub-configs a composite config keeps its text models' sizes in: an encoder-decoder's two halves (transformers'
# EncoderDecoderConfig: encoder, decoder), a multimodal model's text model (text_config).
TEXT_SUB_CONFIGS = ("encoder", "decoder", "text_config")


def text_limit(config: dict) -> dict:
    """{"max_length", "max_length_from"}: the tokens the model's position table takes, less the positions before the
    first token (position_offset), read from its config, else from the sub-configs its text runs through (the
    smallest: a BERT-to-BERT encoder-decoder's encoder and decoder each have their own table); a model without one
    (state-space, recurrent, relative positions) states no limit, and portkit caps it (PORTKIT_CAP, named as
    portkit's by max_length_from None)."""
    found = []
    for where, part in ((None, config), *((k, config.get(k)) for k in TEXT_SUB_CONFIGS)):
        key = position_key(part) if isinstance(part, dict) else None
        if key is None:
            continue
        offset = position_offset(part)
        name = f"{where}.{key}" if where else key
        found.append((int(part[key]) - offset,
                      f"its config's {name}" + (f", less the {offset} positions before its first token" if offset
                                                else "")))
        if where is None:       # the model's own table: its sub-configs' do not override it
            break
    if not found:
        return {"max_length": PORTKIT_CAP, "max_length_from": None}
    length, source = min(found, key=lambda item: item[0])      # the first of equal ones: the encoder
    return {"max_length": length, "max_length_from": source}
