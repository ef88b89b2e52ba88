"""portkit: a migration workbook that moves a PyTorch model from NVIDIA GPUs to AWS Trainium
(TorchNeuron) and Google TPU (TorchTPU), one stage at a time.

    >>> import portkit, portkit.corpora.corpus, portkit.models
    >>> model = portkit.models.load("minilm")
    >>> inputs = model.encode(portkit.corpora.corpus.load_corpus().sample(8, seed=0), pad_to=128)
    >>> report = portkit.find_fallbacks(model, inputs, targets=["neuron", "tpu"])
    >>> print(report)

One verb per stage; the notebooks in notebooks/ teach each one. Importing portkit imports nothing
else (PEP 562): each verb loads its stage's module, and torch, on first use, so `portkit --version`
stays fast. torch.compile finds the emulated backends by name without `import portkit` (the
`torch_dynamo_backends` entry points, portkit/targets/backends.py).
"""
__version__ = "0.1.0"

# verb -> the stage module that defines it
_VERBS = {
    "find_fallbacks": "stages.fallbacks.stage",   # stage 1
    "compile_model": "stages.compile.stage",      # stage 2
    "fit_buckets": "stages.buckets.stage",        # stage 3
    "check_accuracy": "stages.accuracy.stage",    # stage 4
    "build_report": "stages.report.stage",        # stage 5
}
__all__ = ["__version__", *_VERBS]

# modules a declaration imported from portkit's top level before the packages (docs/changelog.md): old name -> the
# module's one documented path. Each still imports, with a DeprecationWarning naming the path (portkit.inputs,
# a module of its own, does the same for `import portkit.inputs`).
MOVED = {"audio": "corpora.audio", "images": "corpora.images", "data": "corpora.corpus",
         "comparison": "stages.accuracy.comparison"}


def __getattr__(name: str):
    import importlib
    if name in MOVED:
        import warnings
        warnings.warn(f"portkit.{name} moved to portkit.{MOVED[name]}: import it from there (this alias warns; "
                      "see docs/changelog.md)", DeprecationWarning, stacklevel=2)
        module = globals()[name] = importlib.import_module(f"portkit.{MOVED[name]}")   # warned once
        return module
    if name not in _VERBS:
        raise AttributeError(f"module 'portkit' has no attribute {name!r}")
    verb = getattr(importlib.import_module(f"portkit.{_VERBS[name]}"), name)
    globals()[name] = verb   # later lookups skip __getattr__
    return verb


def __dir__() -> list[str]:
    return sorted([*globals(), *_VERBS])
