"""Stage 1's static scan: GPU-only code in the model's source, and the vendors' lists applied to the model.

    >>> from portkit.stages.fallbacks import source_scan
    >>> scan = source_scan.scan_paths(["my_model/"])     # nothing imported or run: stdlib ast over the files
    >>> scan = source_scan.scan_model(model)            # a LoadedModel or nn.Module: its files and its modules
    >>> for f in source_scan.findings(scan, "neuron"):
    ...     print(f.severity, f.message)

What it finds, each with its file:line, whose code it is (portkit.core.owners.owner) and the portable
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

import collections
import importlib.util
import inspect
from pathlib import Path

from torch import nn

from portkit.core import owners, grading, locations
from portkit.core.findings import BLOCKER, ROOT, SEVERITIES, Finding, cause_key
from portkit.targets import specs
from portkit.stages.fallbacks import scan_visitor
from portkit.stages.fallbacks.scan_rules import (KERNEL, LIST_ADVICE, MAX_FILES, PACKAGES, PYTORCH_DOCS, RULES,
                                                 STATIC_ONLY, VENDOR_LIST, Hit, Scan)


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
    return owners.owner({"file": str(path)})["owner"] == owners.USER


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
            namespaces |= set(scan_visitor.TORCH_LIBRARY.findall(text))
            if path.suffix != ".cpp":
                scan.gpu.append(Hit("cuda_source", owners.place(str(path), 1, "<file>"), f"CUDA source {path.name}",
                                    key=path.name, owner=owners.owner({"file": str(path)})))
            continue
        found = scan_visitor.read_file(path, scan)
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
        if ns in namespaces and ns not in scan_visitor.STOCK_NAMESPACES:
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
    return owners.place(file, line, cls.__name__, f"class {cls.__name__}")


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
                           f"{impl!r}", key=impl, owner=scan_visitor.TRANSFORMERS_SETTING, module=path))
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
        owner = first.owner or owners.owner(first.where)
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
                           owner=first.owner or owners.owner(first.where),
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
