"""Stage 1's static scan: GPU-only code in the model's source, and the vendors' lists applied to the model.

    >>> from portkit.stages.fallbacks import source_scan
    >>> scan = source_scan.scan_paths(["my_model/"])     # nothing imported or run: stdlib ast over the files
    >>> scan = source_scan.scan_model(model)            # a LoadedModel or nn.Module: its files and its modules
    >>> for f in source_scan.findings(scan, "neuron"):
    ...     print(f.severity, f.message)

What it finds, each with its file:line, whose code it is (portkit.core.frames.owner) and the portable
replacement: Triton kernels, CUDA extensions and the torch.ops they register, GPU-only packages (an import
guarded by try/except ImportError is optional: info), hard-coded CUDA devices, torch.cuda calls, cudnn
settings, torch.cuda.amp and NCCL-only collectives. The user's code is scanned: the factory's file, a local
directory's *.py, the files that define the model's classes outside installed packages (a Hugging Face
model's remote code), and the modules they import from the same package. An instantiated model is also
checked against the vendors' lists of experimental and unsupported features (data/targets/vendor_lists.json,
read by portkit.targets.specs), by its modules and tensors; source that cannot be instantiated is checked
against them statically. Stage 1 calls scan_model before recording, so a model that cannot run on the CPU
(a Triton kernel in its forward) still gets these findings (noted on the recording's error).
"""
from __future__ import annotations

import ast
import collections
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from portkit.core import frames, grading, locations, reconcile
from portkit.core.findings import BLOCKER, ROOT, SEVERITIES, Finding, cause_key
from portkit.targets import specs

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

_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_TORCH_LIBRARY = re.compile(r"TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)")
_STOCK_NAMESPACES = {"aten", "prims", "quantized", "_c10d_functional", "c10d", "profiler", "higher_order",
                     "_quantized", "quantized_decomposed", "torchvision", "torchaudio"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_TRITON_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics")
_CUDA_QUERIES = ("torch.cuda.is_available", "torch.cuda.device_count")
_AUTOCASTS = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
STATIC_ONLY = ("half_cast", "item_call")   # RULES that `portkit scan` reports and stage 1 records instead


@dataclass
class Hit:
    """One thing the scan found: a RULES key (GPU-only code) or a vendor-list detector, where, and what."""
    rule: str
    where: dict | None
    detail: str
    key: str = ""                 # groups hits into one finding (a kernel's name, a package, a module class)
    guarded: bool = False         # an import inside try/except ImportError (or an availability check)
    owner: dict | None = None     # None: frames.owner(where)
    module: str | None = None     # the module path, for a hit on the instantiated model


@dataclass
class Scan:
    """The scan's result: the files read, the GPU-only code, and the vendor-list features found."""
    files: list[str] = field(default_factory=list)
    gpu: list[Hit] = field(default_factory=list)
    features: list[Hit] = field(default_factory=list)
    instantiated: bool = False
    errors: list[str] = field(default_factory=list)   # files that could not be parsed


# ---------------------------------------------------------------- reading one file
def _dotted(node, aliases: dict[str, str]) -> str | None:
    """`tl.load` -> 'triton.language.load' through the file's imports; None for anything but a name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _guarded(parents: list) -> bool:
    for p in parents:
        if isinstance(p, ast.Try):
            for h in p.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
                if h.type is None or any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names):
                    return True
        if isinstance(p, ast.If) and "available" in ast.unparse(p.test):
            return True
    return False


class _FileScan(ast.NodeVisitor):
    """One file's hits, the imports it makes (to follow) and the op namespaces its extensions register."""

    def __init__(self, path: Path, lines: list[str]):
        self.path, self.lines = path, lines
        self.aliases: dict[str, str] = {}
        self.imports: list[tuple[str, int, list[str]]] = []    # (module, level, names)
        self.gpu: list[Hit] = []
        self.features: list[Hit] = []
        self.namespaces: set[str] = set()
        self.op_uses: list[tuple[str, dict, str]] = []         # (namespace, where, op name)
        self.kernels: dict[str, Hit] = {}
        self.launches: list[tuple[str, dict]] = []              # kernel[grid](...) calls: (kernel, where)
        self.cu_files: list[Path] = []                          # .cu sources an extension compiles
        self._stack: list = []
        self._seen: set = set()

    def place(self, node, function: str | None = None) -> dict:
        line = getattr(node, "lineno", 1)
        code = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return frames.place(str(self.path), line, function or self._function(), code)

    def _function(self) -> str:
        return next((p.name for p in reversed(self._stack)
                     if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), "<module>")

    def hit(self, rule: str, node, detail: str, key: str = "", feature: bool = False, **kw) -> None:
        line = getattr(node, "lineno", 1)
        if (rule, line, key) in self._seen:
            return
        self._seen.add((rule, line, key))
        (self.features if feature else self.gpu).append(Hit(rule, self.place(node), detail, key, **kw))

    def generic_visit(self, node):
        self._stack.append(node)
        super().generic_visit(node)
        self._stack.pop()

    # imports: aliases, packages, what to follow
    def visit_Import(self, node):
        for a in node.names:
            if a.asname:       # import a.b as c: c is a.b
                self.aliases[a.asname] = a.name
            else:              # import a.b: a is a
                self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
            self._package(a.name, node)
            self.imports.append((a.name, 0, []))
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        module = node.module or ""
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{module}.{a.name}" if module else a.name
            self._package(f"{module}.{a.name}" if module else a.name, node)
            self._names(f"{module}.{a.name}", node)
        self.imports.append((module, node.level, [a.name for a in node.names]))
        self.generic_visit(node)

    def _package(self, name: str, node) -> None:
        if not name or name.startswith("."):
            return
        for package in PACKAGES:
            if name == package or name.startswith(package + "."):
                guarded = _guarded(self._stack)
                self.hit("gpu_package", node, ast.unparse(node), key=package, guarded=guarded)
                if package == "mamba_ssm":
                    self.hit("mamba", node, ast.unparse(node), key="mamba_ssm", feature=True)

    def _names(self, name: str, node) -> None:
        """Vendor-list features a name alone shows (torchao FP8, per-channel quantization, FSDPv2)."""
        low = name.lower()
        if low.startswith("torchao.") and ("float8" in low or "fp8" in low):
            self.hit("torchao_fp8", node, name, key=name, feature=True)
        if name in ("torch.per_channel_affine", "torch.per_channel_symmetric", "torch.quantize_per_channel",
                    "torch.per_channel_affine_float_qparams") or name.endswith((".Linear8bitLt", ".Linear4bit",
                                                                                ".QuantLinear")):
            self.hit("per_channel_quant", node, name, key=name, feature=True)
        if name.startswith("torch.distributed") and name.endswith(".fully_shard"):
            self.hit("fsdp2", node, name, key="fully_shard", feature=True)
        if name.startswith("torch.nested."):
            self.hit("nested", node, name, key="torch.nested", feature=True)
        if name.startswith("torch.sparse"):
            self.hit("sparse", node, name, key="torch.sparse", feature=True)

    def visit_Attribute(self, node):
        name = _dotted(node, self.aliases)
        if name:   # read or set: torch.backends.cudnn.benchmark = True counts
            if name.startswith("torch.cuda.amp."):
                self.hit("cuda_amp", node, name)
            elif name.startswith("torch.backends.cudnn."):
                self.hit("cudnn", node, name)
            self._names(name, node)
        self.generic_visit(node)

    def visit_Name(self, node):
        name = self.aliases.get(node.id)
        if name and isinstance(node.ctx, ast.Load):
            if name.startswith("torch.cuda.amp."):
                self.hit("cuda_amp", node, name)
            self._names(name, node)

    def visit_ClassDef(self, node):
        if "Mamba" in node.name:
            self.hit("mamba", node, f"class {node.name}", key=node.name, feature=True)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        names = [_dotted(d.func if isinstance(d, ast.Call) else d, self.aliases) or "" for d in node.decorator_list]
        triton = [n for n in names if n.startswith(_TRITON_DECORATORS)]
        if triton:
            self.kernels[node.name] = Hit("triton_kernel", self.place(node, node.name),
                                          f"{node.name} (@{', @'.join(triton)})", key=node.name)
            self.gpu.append(self.kernels[node.name])
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "TORCH_LIBRARY" in node.value:   # load_inline's sources
            self.namespaces |= set(_TORCH_LIBRARY.findall(node.value))

    def visit_Assign(self, node):
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and _CUDA_STRING.match(value.value):
            if any("device" in ast.unparse(t).lower() for t in node.targets):
                self.hit("cuda_device", node, f"{ast.unparse(node.targets[0])} = {value.value!r}")
        self.generic_visit(node)

    def visit_Call(self, node):
        name = _dotted(node.func, self.aliases) or ""
        self._call_gpu(node, name)
        self._call_features(node, name)
        self.generic_visit(node)

    def _call_gpu(self, node, name: str) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and name != "torch.cuda":
            self.hit("cuda_call", node, ast.unparse(node.func) + "()")
        if name in ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
                    "torch.utils.cpp_extension.CUDAExtension"):
            kw = {k.arg: k.value for k in node.keywords}
            ext = kw.get("name") or (node.args[0] if node.args else None)
            label = ext.value if isinstance(ext, ast.Constant) else "?"
            self.hit("cuda_extension", node, f"{name.rsplit('.', 1)[-1]}(name={label!r})", key=str(label))
            self._cu_sources(node)
        if name.startswith("torch.ops.") and name.count(".") >= 3:
            self.op_uses.append((name.split(".")[2], self.place(node), name))
        if name.startswith("torch.cuda.") and not name.startswith("torch.cuda.amp."):
            self.hit("cuda_query" if name in _CUDA_QUERIES else "cuda_api", node, name + "()")
        self._call_precision(node, name)
        to = isinstance(node.func, ast.Attribute) and node.func.attr == "to"
        strings = [a for a in node.args[:1] if name == "torch.device" or to]
        strings += [k.value for k in node.keywords if k.arg in ("device", "map_location")]
        for s in strings:
            if isinstance(s, ast.Constant) and isinstance(s.value, str) and _CUDA_STRING.match(s.value):
                self.hit("cuda_device", node, f"{ast.unparse(node.func)}(... {s.value!r})")
        for k in node.keywords:
            value = k.value.value if isinstance(k.value, ast.Constant) else None
            if k.arg == "backend" and value == "nccl" or (name.endswith(("init_process_group", "new_group"))
                                                         and node.args and getattr(node.args[0], "value", 0) == "nccl"):
                self.hit("nccl", node, f"{ast.unparse(node.func)}(backend='nccl')")
            if k.arg == "attn_implementation" and isinstance(value, str) and value.startswith("flash_attention"):
                self.hit("flash_attention_setting", node, f"attn_implementation={value!r}", key=value,
                         owner=_TRANSFORMERS_SETTING)
        if isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name):
            self.launches.append((node.func.value.id, self.place(node)))

    def _call_precision(self, node, name: str) -> None:
        """torch.autocast("cuda", ...) (device_type as the first argument or by keyword), .half() and .item()."""
        if name in _AUTOCASTS:
            device = node.args[0] if node.args else {k.arg: k.value for k in node.keywords}.get("device_type")
            if isinstance(device, ast.Constant) and isinstance(device.value, str) and _CUDA_STRING.match(device.value):
                self.hit("cuda_autocast", node, f"{name}({device.value!r}, ...)")
        if isinstance(node.func, ast.Attribute) and not node.args and node.func.attr in ("half", "item"):
            rule = "half_cast" if node.func.attr == "half" else "item_call"
            self.hit(rule, node, ast.unparse(node.func) + "()")

    def _cu_sources(self, node) -> None:
        for s in ast.walk(node):
            if isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value.endswith((".cu", ".cuh")):
                self.cu_files.append(self.path.parent / s.value)

    def _call_features(self, node, name: str) -> None:
        kw = {k.arg: k.value for k in node.keywords}
        if name.endswith(("mark_dynamic", "maybe_mark_dynamic")) or name.startswith("torch.export.Dim") or (
                name == "torch.compile" and getattr(kw.get("dynamic"), "value", None) is True):
            self.hit("symbolic", node, ast.unparse(node)[:80], key=name, feature=True)
        for rule, classes in (("lstm", ("torch.nn.LSTM", "torch.nn.LSTMCell")),
                              ("gru", ("torch.nn.GRU", "torch.nn.GRUCell"))):
            if name in classes:
                self.hit(rule, node, name, key=name, feature=True)
        if isinstance(node.func, ast.Attribute) and node.func.attr.startswith("to_sparse"):
            self.hit("sparse", node, f".{node.func.attr}()", key="to_sparse", feature=True)
        if name.endswith("scaled_dot_product_attention"):
            mask = kw.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            if mask is not None and not (isinstance(mask, ast.Constant) and mask.value is None):
                self.hit("attention_mask", node, f"attn_mask={ast.unparse(mask)}", key="sdpa", feature=True)
        if "layout" in kw and (_dotted(kw["layout"], self.aliases) or "") == "torch.jagged":
            self.hit("nested", node, "layout=torch.jagged", key="torch.nested", feature=True)


_TRANSFORMERS_SETTING = {"owner": frames.CONFIGURABLE, "package": "transformers", "setting": "attn_implementation",
                         "setting_help": "from_pretrained(..., attn_implementation='sdpa' | 'eager') picks the "
                                         "attention kernel; flash_attention_2/3 need the flash-attn CUDA package"}


def _read(path: Path, scan: Scan) -> _FileScan | None:
    try:
        text = path.read_text(errors="replace")
        tree = ast.parse(text, filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        scan.errors.append(f"{path}: {exc}")
        return None
    found = _FileScan(path, text.splitlines())
    found.visit(tree)
    for name, where in found.launches:   # kernel[grid](...): where the Triton kernel runs
        if name in found.kernels:
            found.kernels[name].detail += f", launched at line {where['line']} in {where['function']}"
    return found


# ---------------------------------------------------------------- which files: the user's code and its imports
def _package_root(path: Path) -> Path | None:
    """The top package folder of `path` (the highest folder with an __init__.py above it), or None."""
    root, folder = None, path.parent
    while (folder / "__init__.py").exists():
        root, folder = folder, folder.parent
    return root


def _module_file(base: Path, parts: list[str]) -> Path | None:
    target = base.joinpath(*parts) if parts else base
    for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _imported_files(path: Path, imports) -> list[Path]:
    """The files of the modules `path` imports from its own package (or, for a file in no package, its folder)."""
    root = _package_root(path)
    found = []
    for module, level, names in imports:
        parts = module.split(".") if module else []
        if level:
            base = path.parent
            for _ in range(level - 1):
                base = base.parent
        elif root is not None and parts and parts[0] == root.name:
            base, parts = root, parts[1:]
        elif root is None and parts:
            base = path.parent
        else:
            continue
        for extra in ([[]] + [[n] for n in names]):
            if hit := _module_file(base, parts + extra):
                found.append(hit)
    return found


def _users(file: str | None) -> bool:
    """Whether `file` is the user's code: outside installed packages (or claimed), and not portkit's own."""
    if not file or file.startswith("<"):
        return False
    path = Path(file).resolve()
    if path.is_relative_to(locations.PACKAGE):
        return False
    return frames.owner({"file": str(path)})["owner"] == frames.USER


def scan_paths(paths, follow: bool = True) -> Scan:
    """Scan files and folders (a folder: its *.py and *.cu, recursively) and, with follow, the modules they import
    from their own package. Nothing is imported or run."""
    scan = Scan()
    queue: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            queue += sorted(p.rglob("*.py"))
            queue += sorted(p.rglob("*.cu")) + sorted(p.rglob("*.cuh"))
        elif p.exists():
            queue.append(p)
    seen: set[Path] = set()
    namespaces: set[str] = set()
    uses: list = []
    while queue and len(seen) < MAX_FILES:
        path = queue.pop(0).resolve()
        if path in seen:
            continue
        seen.add(path)
        scan.files.append(str(path))
        if path.suffix in (".cu", ".cuh", ".cpp"):
            text = path.read_text(errors="replace")
            namespaces |= set(_TORCH_LIBRARY.findall(text))
            if path.suffix != ".cpp":
                scan.gpu.append(Hit("cuda_source", frames.place(str(path), 1, "<file>"), f"CUDA source {path.name}",
                                    key=path.name, owner=frames.owner({"file": str(path)})))
            continue
        found = _read(path, scan)
        if found is None:
            continue
        scan.gpu += found.gpu
        scan.features += found.features
        namespaces |= found.namespaces | {h.key for h in found.gpu if h.rule == "cuda_extension"}
        uses += found.op_uses
        queue += [f for f in found.cu_files if f.is_file()]
        if follow:
            queue += _imported_files(path, found.imports)
    for ns, where, name in uses:   # torch.ops.<ns>.<op> where <ns> is registered by a CUDA extension here
        if ns in namespaces and ns not in _STOCK_NAMESPACES:
            scan.gpu.append(Hit("extension_op", where, f"{name}()", key=ns))
    return scan


# ---------------------------------------------------------------- a model: its files and its modules
def model_files(model) -> list[Path]:
    """The user's files behind a LoadedModel (its factory's file or module, its local directory) or an nn.Module
    (the files that define its classes, outside installed packages and portkit)."""
    module = getattr(model, "module", model)
    origin = str(getattr(model, "origin", "") or "")
    files: list[Path] = []
    if origin.startswith("local directory "):
        files.append(Path(origin[len("local directory "):]))
    elif origin.startswith("factory "):
        where = origin[len("factory "):].rpartition(":")[0]
        if where.endswith(".py"):
            files.append(Path(where))
        else:
            spec = _find_spec(where)
            if spec is not None and spec.origin:
                files.append(Path(spec.origin))
    for cls in {type(m) for m in module.modules()}:
        file = _class_file(cls)
        if _users(file):
            files.append(Path(file))
    return list(dict.fromkeys(files))


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _class_file(cls) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


def _class_place(cls) -> dict | None:
    file = _class_file(cls)
    if not file:
        return None
    try:
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        line = 1
    return frames.place(file, line, cls.__name__, f"class {cls.__name__}")


def _tensors(m: nn.Module):
    yield from m.named_parameters(recurse=False)
    yield from m.named_buffers(recurse=False)
    weight = getattr(m, "weight", None)
    if callable(weight) and not isinstance(weight, nn.Module):   # torch.ao quantized layers: weight() unpacks
        try:
            yield "weight()", weight()
        except Exception:   # noqa: BLE001 (a method of another meaning: nothing to read)
            return


def _instance_rules(m: nn.Module) -> list[tuple[str, str]]:
    """(detector, detail) for one module: its class, and its own tensors."""
    cls, found = type(m), []
    name, where = cls.__name__, cls.__module__
    if isinstance(m, (nn.LSTM, nn.LSTMCell)):
        found.append(("lstm", name))
    if isinstance(m, (nn.GRU, nn.GRUCell)):
        found.append(("gru", name))
    if "Mamba" in name:
        found.append(("mamba", name))
    if "FSDP" in name and where.startswith("torch.distributed"):
        found.append(("fsdp2", name))
    if "Float8" in name and "torchao" in where:
        found.append(("torchao_fp8", f"{where}.{name}"))
    if name in ("Linear8bitLt", "Linear4bit") and "bitsandbytes" in where or "QuantLinear" in name:
        found.append(("per_channel_quant", f"{where}.{name} (per-channel or finer scales)"))
    for tname, t in _tensors(m):
        if getattr(t, "is_quantized", False) and "per_channel" in str(t.qscheme()):
            found.append(("per_channel_quant", f"{tname}: quantized {t.qscheme()}"))
        if getattr(t, "is_nested", False):
            found.append(("nested", f"{tname}: NestedTensor"))
        elif getattr(t, "layout", None) is not None and str(t.layout) != "torch.strided":
            found.append(("sparse", f"{tname}: {t.layout}"))
    return found


def scan_modules(module: nn.Module) -> tuple[list[Hit], list[Hit]]:
    """(GPU-only settings, vendor-list features) found on an instantiated model's modules and tensors."""
    gpu, features = [], []
    places: dict[type, dict | None] = {}
    for path, m in module.named_modules():
        path = path or ROOT
        for rule, detail in _instance_rules(m):
            where = places.setdefault(type(m), _class_place(type(m)))
            features.append(Hit(rule, where, detail, key=type(m).__name__, module=path))
        config = getattr(m, "config", None)
        impl = str(getattr(config, "_attn_implementation", "") or "")
        if impl.startswith("flash_attention") and not any(h.key == impl for h in gpu):
            gpu.append(Hit("flash_attention_setting", None, f"{type(m).__name__}.config._attn_implementation="
                           f"{impl!r}", key=impl, owner=_TRANSFORMERS_SETTING, module=path))
    return gpu, features


def scan_model(model) -> Scan:
    """Scan a LoadedModel or an nn.Module: the user's files statically (GPU-only code), its modules and tensors
    against the vendors' lists (the files' own vendor-list hits are kept only where nothing was instantiated)."""
    module = getattr(model, "module", model)
    scan = scan_paths(model_files(model))
    if isinstance(module, nn.Module):
        gpu, features = scan_modules(module)
        scan.gpu += gpu
        scan.features = features
        scan.instantiated = True
    return scan


# ---------------------------------------------------------------- findings, per target
def _lines(hits: list[Hit]) -> str:
    first = hits[0].where
    if not first:
        return ""
    lines = sorted({h.where["line"] for h in hits if h.where})
    more = f" (and lines {', '.join(map(str, lines[1:6]))}{', ...' if len(lines) > 6 else ''})" if lines[1:] else ""
    return f" at {first['text']}{more}"


def _gpu_findings(hits: list[Hit], target: specs.Target) -> list[Finding]:
    kernel_rule = target.features.get("custom_op")
    kernel = kernel_rule.advice if kernel_rule else f"rewrite it in {target.kernel_language}"
    groups: dict[tuple, list[Hit]] = collections.defaultdict(list)
    for h in hits:
        groups[(h.rule, (h.where or {}).get("file"), h.key, h.guarded)].append(h)
    out = []
    for (rule, _, key, guarded), items in groups.items():
        kind, case, what, fix = RULES[rule]
        fix = fix.format(kernel=kernel, package=PACKAGES.get(key, ""))
        if guarded:   # an optional import: the code runs without the package
            case, what = grading.GUARDED, f"optional {what} (import guarded: the model runs without it)"
        severity = grading.severity(kind, case)
        first = items[0]
        owner = first.owner or frames.owner(first.where)
        source = kernel_rule.source if kind == KERNEL and kernel_rule else PYTORCH_DOCS
        where = first.module or (Path(first.where["file"]).name if first.where else "")
        advice = fix if kind == KERNEL else f"portable replacement: {fix}"
        if guarded:
            advice = f"nothing to do for {target.title}; the portable path when it matters: {fix}"
        out.append(Finding(kind, severity, f"{what}: {first.detail}{_lines(items)}", advice,
                           module=where, ops=[], source=source, where=first.where or {}, owner=owner,
                           cause=cause_key(kind, f"{rule} {key or first.detail}", first.where)))
    return out


def _list_findings(hits: list[Hit], target: str) -> list[Finding]:
    lst = specs.vendor_lists().get(target)
    if not lst:
        return []
    by_rule: dict[str, list[Hit]] = collections.defaultdict(list)
    for h in hits:
        by_rule[h.rule].append(h)
    out = []
    for entry in lst["entries"]:
        items = by_rule.get(entry["detect"])
        if not items:
            continue
        modules = sorted({h.module for h in items if h.module})
        found = (", ".join(modules[:3]) + (f" ({len(modules)} modules)" if len(modules) > 3 else "")) if modules \
            else "the source"
        details = "; ".join(sorted({h.detail for h in items})[:3])
        note = f" ({entry['note']})" if entry["note"] else ""
        first = items[0]
        out.append(Finding(VENDOR_LIST, entry["severity"],
                           f"{entry['feature']} in {found}: {details}{_lines(items) if not modules else ''}; "
                           f"{lst['vendor']} lists {entry['feature']} as {entry['status']}{note} "
                           f"({lst['document']}, read {lst['read']})",
                           LIST_ADVICE[entry["detect"]], module=found, ops=[],
                           source=f"{lst['source']}: {lst['document']}", where=first.where or {},
                           owner=first.owner or frames.owner(first.where),
                           cause=cause_key(VENDOR_LIST, entry["feature"]),
                           occurrences={"modules": modules, "count": len(items)} if modules else None))
    return out


def findings(scan: Scan, target: str, static: bool = False) -> list[Finding]:
    """The scan's findings for one target: its GPU-only code (the replacement names the target's kernel
    language) and the entries of the target's vendor list the model has, most severe first. static=True (`portkit
    scan`, nothing run) adds the STATIC_ONLY rules, which stage 1 records when the model runs instead."""
    t = specs.get(target)
    gpu = [h for h in scan.gpu if static or h.rule not in STATIC_ONLY]
    found = _gpu_findings(gpu, t) + _list_findings(scan.features, target)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(found, key=lambda f: (order[f.severity], f.kind, f.module or ""))


def merge(recorded: list[Finding], scan: Scan, target: str) -> list[Finding]:
    """Stage 1's findings for `target`: the recorded ones and the scan's, ordered by severity."""
    order = {s: i for i, s in enumerate(SEVERITIES)}
    listed = [f for f in findings(scan, target) if not _folded(f, recorded, order)]
    return sorted(recorded + listed, key=lambda f: order[f.severity])


def _folded(listed: Finding, recorded: list[Finding], order: dict) -> bool:
    """A vendor-list entry about the very modules a recorded finding already names (TorchTPU's "LSTM:
    experimental" beside the nn.LSTM the recording found) is one cause: its sentence joins that finding, the
    more severe of the two severities stands, and it is not counted again."""
    if listed.kind != VENDOR_LIST:
        return False
    modules = set((listed.occurrences or {}).get("modules") or [])
    same = next((f for f in recorded if f.module and (f.module == listed.module or modules & set(
                     (f.occurrences or {}).get("modules") or []))
                 and (f.cause or "").endswith(f".{listed.cause.split(': ', 1)[-1]}")), None)
    if same is None:
        return False
    same.message += "; " + listed.message.split(": ", 1)[-1]
    same.severity = min(same.severity, listed.severity, key=order.get)
    same.source = "; ".join(s for s in (same.source, listed.source) if s)
    return True


def noted(scan: Scan, run, *args):
    """run(*args); an error leaving it carries the scan's blockers as a note (a model that cannot run on the CPU,
    a Triton kernel in its forward, still names what to port)."""
    try:
        return run(*args)
    except Exception as exc:
        blockers = [f for name in specs.MIGRATION_TARGETS for f in findings(scan, name)
                    if f.severity == BLOCKER]
        if blockers:
            exc.add_note("portkit's source scan found GPU-only code before recording:\n" + "\n".join(
                sorted({f"  [{f.severity}] {f.message}" for f in blockers})))
        raise
