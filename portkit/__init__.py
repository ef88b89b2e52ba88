"""portkit: a migration workbook that moves a PyTorch model from NVIDIA GPUs to AWS Trainium
(TorchNeuron) and Google TPU (TorchTPU), one stage at a time.

    >>> import portkit
    >>> report = portkit.find_fallbacks("minilm", targets=["neuron", "tpu"])
    >>> print(report)

One verb per stage; the notebooks in notebooks/ teach each one.
"""
__version__ = "0.1.0"
