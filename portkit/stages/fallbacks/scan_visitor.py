"""Stage 1's static scan of one file: stdlib ast, nothing imported or run. The visitor finds Triton kernels, CUDA
extensions and the torch.ops namespaces they register, GPU-only imports (optional where guarded by try/except
ImportError), hard-coded CUDA devices, torch.cuda calls, cudnn settings, torch.cuda.amp and NCCL-only collectives,
each a Hit on a rule of scan_rules.py with its file:line.

    >>> from portkit.stages.fallbacks import scan_visitor, scan_rules
    >>> found = scan_visitor.read_file(Path("my_model/model.py"), scan_rules.Scan())
    >>> found.gpu, found.kernels             # the GPU-only code found, the Triton kernels by name
"""
from __future__ import annotations

import ast
import re
from pathlib import Path


from portkit.core import owners
from portkit.stages.fallbacks.scan_rules import PACKAGES, Hit, Scan


_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
TORCH_LIBRARY = re.compile(r"TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)")
STOCK_NAMESPACES = {"aten", "prims", "quantized", "_c10d_functional", "c10d", "profiler", "higher_order",
                     "_quantized", "quantized_decomposed", "torchvision", "torchaudio"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_TRITON_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics")
_CUDA_QUERIES = ("torch.cuda.is_available", "torch.cuda.device_count")
_AUTOCASTS = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")


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
        return owners.place(str(self.path), line, function or self._function(), code)

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
            self.namespaces |= set(TORCH_LIBRARY.findall(node.value))

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
                         owner=TRANSFORMERS_SETTING)
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


TRANSFORMERS_SETTING = {"owner": owners.CONFIGURABLE, "package": "transformers", "setting": "attn_implementation",
                         "setting_help": "from_pretrained(..., attn_implementation='sdpa' | 'eager') picks the "
                                         "attention kernel; flash_attention_2/3 need the flash-attn CUDA package"}


def read_file(path: Path, scan: Scan) -> _FileScan | None:
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
