"""Models and their inputs: the named sources and loaders (registry), the declaration API (inputs), the
adapters, real-size models without weights (abstract), the audio networks and the seq2seq pairs, and the side a
text model's batches are padded on (padding_side: stages 3 and 4 pad on it and try the other).

`portkit.models` is also the documented import path of the registry's API (PEP 562: loaded on first use):

    >>> from portkit import models
    >>> model = models.load("minilm")          # a models.LoadedModel
"""
_REGISTRY = ("LoadedModel", "SOURCES", "DEFAULT", "CHOICES", "load", "validate", "size_hint", "minilm_tokenizer",
             "BUILTIN_MAX_PARAMETERS", "WEIGHT_FILES")


def __getattr__(name: str):
    if name in _REGISTRY:
        from portkit.models import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'portkit.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_REGISTRY])
