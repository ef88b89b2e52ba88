"""portkit: a migration workbook that moves a PyTorch model from NVIDIA GPUs to AWS Trainium
(TorchNeuron) and Google TPU (TorchTPU), one stage at a time.

    >>> import portkit
    >>> report = portkit.find_fallbacks("minilm", targets=["neuron", "tpu"])
    >>> print(report)

One verb per stage; the notebooks in notebooks/ teach each one.
"""
__version__ = "0.1.0"

# Importing stage 2 registers the emulated compile backends (portkit_neuron, portkit_tpu; portkit/backends.py)
# with Dynamo, once, here: never in a notebook cell.
from portkit import compiling  # noqa: E402,F401
from portkit.compiling import compile_model  # noqa: E402,F401
