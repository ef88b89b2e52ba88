"""What stage 1's static scan looks for, as data: each GPU-only rule with its kind, grading case and portable
replacement (RULES), the GPU-only packages (PACKAGES), the vendor lists' advice (LIST_ADVICE), and the scan's result
types (Hit, Scan). The AST visitor that applies them is scan_visitor.py; which files are read is source_scan.py's.

    >>> from portkit.stages.fallbacks import scan_rules
    >>> scan_rules.RULES["triton_kernel"][0]
    'gpu_kernel'
"""
from __future__ import annotations

from dataclasses import dataclass, field


from portkit.core import grading
from portkit.stages import reconcile


KERNEL, PACKAGE, DEVICE, VENDOR_LIST = reconcile.SCANNED_KINDS
MAX_FILES = 400   # a scan follows imports within one package; this bounds a runaway one

# The portable replacements are PyTorch's own APIs, each checked in the torch installed here (2.13.0):
# torch.accelerator (https://docs.pytorch.org/docs/stable/accelerator.html), torch.amp
# (https://docs.pytorch.org/docs/stable/amp.html), SDPA
# (https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html),
# torch.distributed.get_default_backend_for_device.
_DEVICE_FIX = ("the device selected instead of named: device = torch.accelerator.current_accelerator() "
               "(or a device argument), then .to(device)")
_SDPA = "torch.nn.functional.scaled_dot_product_attention (SDPA)"
PYTORCH_DOCS = "PyTorch docs: torch.accelerator, torch.amp, scaled_dot_product_attention (docs.pytorch.org)"

# The cases the grading policy grades a scanned rule in (portkit.core.grading.POLICY: the severity is decided there).
_ANY, _CUDA, _OFF, _NONE = grading.ANY, grading.NEEDS_CUDA, grading.OFF_CUDA_BRANCH, grading.NO_EFFECT

# rule -> (kind, its grading case, what it is, the portable replacement); {kernel} is the target's custom-kernel advice.
RULES = {
    "triton_kernel": (KERNEL, _ANY, "Triton kernel", "{kernel}"),
    "cuda_extension": (KERNEL, _ANY, "CUDA extension compiled at run time", "{kernel}"),
    "cuda_source": (KERNEL, _ANY, "CUDA source file", "{kernel}"),
    "extension_op": (KERNEL, _ANY, "op registered by a CUDA extension", "{kernel}"),
    "gpu_package": (PACKAGE, _ANY, "GPU-only package", "{package}"),
    "flash_attention_setting": (PACKAGE, _ANY, "flash-attn selected as the attention kernel",
                                f"attn_implementation='sdpa' ({_SDPA}) instead of flash_attention_2/3"),
    "cuda_call": (DEVICE, _CUDA, ".cuda() call", _DEVICE_FIX),
    "cuda_device": (DEVICE, _CUDA, "hard-coded CUDA device", _DEVICE_FIX),
    "cuda_query": (DEVICE, _OFF, "CUDA availability query (off NVIDIA it says no device: the code takes its "
                                 "CPU branch)", "torch.accelerator.is_available() / device_count()"),
    "cuda_api": (DEVICE, _OFF, "torch.cuda call (CUDA-only)",
                 "torch.accelerator's counterpart (synchronize, current_device_index, memory_allocated, ...)"),
    "cuda_amp": (DEVICE, _OFF, "torch.cuda.amp (disabled off CUDA: the block runs in float32)",
                 "torch.amp.autocast(device_type, ...) / torch.amp.GradScaler(device) with the target's device"),
    "cuda_autocast": (DEVICE, _OFF, "autocast for device_type 'cuda' (off CUDA it is disabled with a warning: the "
                                    "block runs in float32)",
                      "torch.autocast(device_type, dtype=torch.bfloat16) with the target's device"),
    # read statically by `portkit scan` alone (STATIC_ONLY): stage 1 records them when the model runs (a host sync
    # as aten::_local_scalar_dense; the dtypes its ops run in), where it is known whether forward reaches them
    # bfloat16 on TPU: https://cloud.google.com/tpu/docs/bfloat16 (the MXU's format; float16's range is narrower)
    "half_cast": (DEVICE, _OFF, "float16 cast (.half(): float16's range is narrower than bfloat16's, the 16-bit "
                                "format TPUs compute in)",
                  ".to(torch.bfloat16), or torch.autocast(device_type, dtype=torch.bfloat16); stage 4 measures it"),
    "item_call": (DEVICE, _OFF, "tensor value read on the host (.item(): in forward, a device-to-host copy on every "
                                "call and a graph break under torch.compile)",
                  "keep the value a tensor (torch.where, masks), or read it outside forward"),
    "cudnn": (DEVICE, _NONE, "torch.backends.cudnn setting (no effect off NVIDIA)",
              "torch.use_deterministic_algorithms(True) for determinism; nothing to port for cudnn.benchmark"),
    "nccl": (DEVICE, _CUDA, "NCCL-only collectives (backend='nccl')",
             "init_process_group() without a backend, or torch.distributed.get_default_backend_for_device(device)"),
}

# GPU-only packages -> the portable replacement. Their kernels are CUDA (and Triton) kernels; deepspeed counts
# through its fused ops only (deepspeed.ops).
PACKAGES = {
    "flash_attn": f"{_SDPA}; in transformers attn_implementation='sdpa'",
    "xformers": f"{_SDPA} for memory-efficient attention",
    "bitsandbytes": "load the weights unquantized (bf16/fp32) for the port; bitsandbytes' quantized matmuls are "
                    "GPU kernels",
    "apex": "torch.nn.LayerNorm / RMSNorm for apex's fused norms, torch.optim's AdamW for FusedAdam, torch.amp "
            "for apex.amp",
    "deepspeed.ops": "torch.optim's optimizers and plain PyTorch layers for deepspeed's fused ops",
    "causal_conv1d": "nn.Conv1d(groups=channels) with kernel_size-1 left padding (the causal depthwise "
                     "convolution it fuses)",
    "mamba_ssm": "the selective scan in plain PyTorch (transformers' Mamba models take such a path when "
                 "mamba_ssm is not installed), or a kernel in the target's kernel language",
}

# The vendor-list detectors (data/targets/vendor_lists.json "detect") -> what to do when a model has it.
LIST_ADVICE = {
    "symbolic": "keep shapes static: bucket the varying dimensions (stage 3) instead of marking them dynamic",
    "nested": "pad to a bucket (stage 3) instead of ragged or nested tensors",
    "lstm": "measure it on the target (stage 4) before budgeting, or write the recurrence as nn.Linear steps",
    "gru": "measure it on the target (stage 4) before budgeting, or write the recurrence as nn.Linear steps",
    "mamba": "measure it on the target before budgeting the migration",
    "fsdp2": "measure sharded training on the target before budgeting it",
    "torchao_fp8": "keep these layers in bf16 for the port, or ask the vendor for the beta",
    "sparse": "use dense tensors (to_dense)",
    "attention_mask": "prefer is_causal=True or no mask, with bucketed unpadded batches",
    "per_channel_quant": "use the unquantized (bf16) weights for the port",
}


STATIC_ONLY = ("half_cast", "item_call")   # RULES that `portkit scan` reports and stage 1 records instead


@dataclass
class Hit:
    """One thing the scan found: a RULES key (GPU-only code) or a vendor-list detector, where, and what."""
    rule: str
    where: dict | None
    detail: str
    key: str = ""                 # groups hits into one finding (a kernel's name, a package, a module class)
    guarded: bool = False         # an import inside try/except ImportError (or an availability check)
    owner: dict | None = None     # None: owners.owner(where)
    module: str | None = None     # the module path, for a hit on the instantiated model


@dataclass
class Scan:
    """The scan's result: the files read, the GPU-only code, and the vendor-list features found."""
    files: list[str] = field(default_factory=list)
    gpu: list[Hit] = field(default_factory=list)
    features: list[Hit] = field(default_factory=list)
    instantiated: bool = False
    errors: list[str] = field(default_factory=list)   # files that could not be parsed
