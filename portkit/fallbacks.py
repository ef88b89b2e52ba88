"""Stage 1, fallback discovery: which ATen ops a model calls, from which module, and which of
them would fall back to the CPU or not run at all on each target.

    >>> from portkit import fallbacks, models, data
    >>> model = models.load("minilm")
    >>> inputs = model.encode(data.load_corpus().sample(8, seed=0), pad_to=128)
    >>> report = fallbacks.find_fallbacks(model, inputs, targets=["neuron", "tpu"])
    >>> print(report)                      # per target: op counts by status, findings
    >>> report.plot()                      # per-module bars, coloured by status
    >>> report.save("runs/minilm/fallbacks.json")

One eager pass (forward, or forward and backward with train=True) is recorded below autograd with
a `TorchDispatchMode`: every ATen call, its count, dtypes, time, and the `nn.Module` that made it
(backward calls are traced to their module through the autograd graph). Each op is then classified
against the target's op table (targets.OpTable.classify), and the model is scanned for the features
the vendors name as unsupported or slow. The recording runs on the CPU in emulated mode; in native
mode it runs on the device and the vendor's own fallback record is collected beside it.
"""
from __future__ import annotations

import collections
import dataclasses
import html
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from portkit import targets as targets_mod
from portkit.results import save_result
from portkit.targets import BLOCKER, COMPOSITE, CPU_FALLBACK, INFO, NATIVE, STATUSES, UNSUPPORTED, WORK

STAGE = "fallbacks"
ROOT = "<model>"
# Ops whose output size or control flow depends on tensor values (both targets compile static shapes
# only: awsdocs-neuron torch/compile/reference-torch-compile.html, torch_tpu _backend.py).
DATA_DEPENDENT = frozenset({
    "aten::nonzero", "aten::masked_select", "aten::unique_dim", "aten::_unique2", "aten::_unique",
    "aten::unique_consecutive", "aten::argwhere", "aten::bincount", "aten::repeat_interleave.Tensor",
    "aten::masked_scatter", "aten::histc",
})
HOST_SYNC = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero", "aten::item"})
INDEX_OPS = frozenset({"aten::index.Tensor", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})
SDPA_OPS = frozenset({"aten::_scaled_dot_product_flash_attention_for_cpu",
                      "aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_efficient_attention",
                      "aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_fused_attention_overrideable"})
CORE_NAMESPACES = frozenset({"aten", "prims", "prim", "_c10d_functional", "c10d"})
STATUS_COLORS = {NATIVE: "#55A868", COMPOSITE: "#8CC084", CPU_FALLBACK: "#DD8452", UNSUPPORTED: "#C44E52"}
_MODULE_KEY = "portkit_module"


# ---------------------------------------------------------------- recording
@dataclass
class OpRecord:
    """Calls of one ATen op from one module in one phase."""
    op: str
    module: str
    phase: str
    calls: int = 0
    seconds: float = 0.0
    dtypes: set = field(default_factory=set)

    def to_dict(self) -> dict:
        return {"op": self.op, "module": self.module, "phase": self.phase, "calls": self.calls,
                "seconds": self.seconds, "dtypes": sorted(self.dtypes)}


@dataclass
class Recording:
    records: dict[tuple[str, str, str], OpRecord] = field(default_factory=dict)
    features: list[tuple[str, str, str, str]] = field(default_factory=list)   # (kind, module, op, detail)
    seconds: float = 0.0       # wall time of the recorded pass


class _OpRecorder(TorchDispatchMode):
    """Counts and times every ATen call, attributing it to the innermost running nn.Module."""

    def __init__(self, recording: Recording, stack: list[str]):
        super().__init__()
        self.recording, self.stack = recording, stack
        self._seen_features: set = set()

    def _module(self) -> tuple[str, str]:
        node = torch._C._current_autograd_node()
        if node is not None:   # backward: the autograd node carries the module that created it
            return node.metadata.get(_MODULE_KEY, ROOT), "backward"
        return (self.stack[-1] if self.stack else ROOT), "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter() - start
        op = func.name()
        module, phase = self._module()
        key = (op, module, phase)
        rec = self.recording.records.get(key)
        if rec is None:
            rec = self.recording.records[key] = OpRecord(op, module, phase)
        rec.calls += 1
        rec.seconds += elapsed
        tensors = _tensors(args, kwargs, out)
        for t in tensors:
            rec.dtypes.add(str(t.dtype).replace("torch.", ""))
        self._scan(op, func, module, args, kwargs, tensors)
        return out

    def _feature(self, kind: str, module: str, op: str, detail: str) -> None:
        key = (kind, module, op)
        if key not in self._seen_features:
            self._seen_features.add(key)
            self.recording.features.append((kind, module, op, detail))

    def _scan(self, op, func, module, args, kwargs, tensors) -> None:
        for t in tensors:
            if t.dtype == torch.float64:
                self._feature("float64", module, op, "float64 tensors")
            elif t.dtype == torch.int64 and t.numel() and t.device.type != "meta":
                self._feature("int64", module, op, "int64 tensors")
                if t.numel() <= 1 << 20:   # value check is cheap for the index-sized tensors it is for
                    low, high = torch.aminmax(t)
                    if int(low) < -(1 << 31) or int(high) >= 1 << 31:
                        self._feature("int64_overflow", module, op, f"values up to {int(high)}")
            if t.layout != torch.strided:
                self._feature("sparse", module, op, f"layout {str(t.layout).replace('torch.', '')}")
            if t.is_nested:
                self._feature("nested", module, op, "NestedTensor")
        if func.namespace not in CORE_NAMESPACES:
            self._feature("custom_op", module, op, f"operator outside aten ({func.namespace}::)")
        base = op.split(".")[0]
        if op in DATA_DEPENDENT or base in DATA_DEPENDENT:
            self._feature("data_dependent", module, op, "output size depends on tensor values")
        if op in HOST_SYNC:
            self._feature("host_sync", module, op, "tensor value read on the host (.item() or a branch)")
        if op in INDEX_OPS:
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
                self._feature("data_dependent", module, op, "boolean-mask indexing")
        if op in SDPA_OPS:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) else None)
            if isinstance(mask, torch.Tensor):
                self._feature("attention_mask", module, op,
                              f"attn_mask of shape {tuple(mask.shape)} ({str(mask.dtype).replace('torch.', '')})")


def _tensors(args, kwargs, out) -> list[torch.Tensor]:
    found = []
    for value in (*args, *kwargs.values(), out):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


class _ModuleTracker:
    """Keeps the stack of running module paths, and labels the autograd nodes each module creates
    so that backward ops can be traced to the module whose forward made them."""

    def __init__(self, model: nn.Module, label_autograd: bool):
        self.stack: list[str] = []
        self.label_autograd = label_autograd
        self.handles = []
        for name, module in model.named_modules():
            path = name or ROOT
            self.handles.append(module.register_forward_pre_hook(self._enter(path)))
            self.handles.append(module.register_forward_hook(self._leave(path), always_call=True))

    def _enter(self, path):
        def hook(module, args):
            self.stack.append(path)
        return hook

    def _leave(self, path):
        def hook(module, args, output):
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
            if self.label_autograd:
                _label_graph(output, path)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def _label_graph(output, path: str) -> None:
    # Inner modules finish first and label their nodes; an outer module labels only what is left.
    todo = [t.grad_fn for t in _tensors((output,) if not isinstance(output, dict) else tuple(output.values()),
                                        {}, None) if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or _MODULE_KEY in node.metadata:
            continue
        node.metadata[_MODULE_KEY] = path
        todo.extend(fn for fn, _ in node.next_functions if fn is not None)


def record(model, inputs: dict[str, torch.Tensor], train: bool = False) -> Recording:
    """Run one eager pass under the op recorder and return what it saw."""
    module = model.module if hasattr(model, "module") else model
    recording = Recording()
    tracker = _ModuleTracker(module, label_autograd=train)
    was_training = module.training
    module.train(train)
    try:
        start = time.perf_counter()
        with torch.set_grad_enabled(train), _OpRecorder(recording, tracker.stack):
            out = module(**inputs)
            if train:
                floats = [v for v in (out.values() if isinstance(out, dict) else [out])
                          if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]
                sum(v.float().mean() for v in floats).backward()
        recording.seconds = time.perf_counter() - start
    finally:
        tracker.remove()
        module.train(was_training)
        module.zero_grad(set_to_none=True)
    for m_name, sub in module.named_modules():   # device dispatch the CPU recording cannot show
        kind = type(sub).__name__
        if kind in targets_mod.PRIVATEUSE1_MODULE_OPS:
            recording.features.append(("recurrent", m_name or ROOT, targets_mod.PRIVATEUSE1_MODULE_OPS[kind],
                                       f"nn.{kind}: runs {targets_mod.PRIVATEUSE1_MODULE_OPS[kind]} on "
                                       "PrivateUse1 devices (ATen RNN.cpp)"))
    return recording


# ---------------------------------------------------------------- classification and report
@dataclass
class Finding:
    kind: str
    severity: str
    module: str
    ops: list[str]
    message: str
    advice: str
    source: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class TargetFallbacks:
    """One target's view of the recording."""
    target: dict               # DetectedTarget.to_dict(): name, mode, reason, op table provenance
    ops: list[dict]            # per op: status, detail, via, calls, seconds, share, modules
    modules: list[dict]        # per module: calls and time by status
    findings: list[Finding]
    vendor_record: dict | None = None

    @property
    def name(self) -> str:
        return self.target["name"]

    def counts(self) -> dict[str, int]:
        c = collections.Counter(o["status"] for o in self.ops)
        return {s: c.get(s, 0) for s in STATUSES}

    def calls(self) -> dict[str, int]:
        c = collections.Counter()
        for o in self.ops:
            c[o["status"]] += o["calls"]
        return {s: c.get(s, 0) for s in STATUSES}

    def time_share(self) -> dict[str, float]:
        c = collections.Counter()
        for o in self.ops:
            c[o["status"]] += o["share"]
        return {s: round(c.get(s, 0.0), 4) for s in STATUSES}

    def severity_counts(self) -> dict[str, int]:
        c = collections.Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in targets_mod.SEVERITIES}

    def summary(self) -> str:
        n, s = self.counts(), self.severity_counts()
        return (f"{self.name} ({self.target['mode']}): {sum(n.values())} distinct ops, {n[NATIVE]} native, "
                f"{n[COMPOSITE]} composite, {n[CPU_FALLBACK]} CPU fallback, {n[UNSUPPORTED]} cannot run; "
                f"findings: {s[BLOCKER]} blocker, {s[WORK]} work, {s[INFO]} info")

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "counts": self.counts(),
                "calls": self.calls(), "time_share": self.time_share(),
                "severity_counts": self.severity_counts(), "ops": self.ops, "modules": self.modules,
                "findings": [f.to_dict() for f in self.findings], "vendor_record": self.vendor_record}


def classify(recording: Recording, detected: targets_mod.DetectedTarget) -> TargetFallbacks:
    table, rules = detected.op_table, detected.target.features
    total = sum(r.seconds for r in recording.records.values()) or 1.0
    by_op: dict[str, dict] = {}
    by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rec in recording.records.values():
        cls = table.classify(rec.op)
        entry = by_op.setdefault(rec.op, {"op": rec.op, "status": cls.status, "detail": cls.detail,
                                          "via": cls.via, "calls": 0, "seconds": 0.0, "modules": set(),
                                          "phases": set(), "dtypes": set()})
        entry["calls"] += rec.calls
        entry["seconds"] += rec.seconds
        entry["modules"].add(rec.module)
        entry["phases"].add(rec.phase)
        entry["dtypes"] |= rec.dtypes
        counter = by_module[rec.module]
        counter["calls"] += rec.calls
        counter[cls.status] += rec.calls
        counter["seconds"] += rec.seconds
        counter[f"{cls.status}_seconds"] += rec.seconds
    ops = []
    for entry in sorted(by_op.values(), key=lambda e: -e["seconds"]):
        entry["share"] = entry["seconds"] / total
        for key in ("modules", "phases", "dtypes"):
            entry[key] = sorted(entry[key])
        ops.append(entry)
    modules = [{"module": m, "calls": c["calls"], "seconds": c["seconds"], "share": c["seconds"] / total,
                **{s: c.get(s, 0) for s in STATUSES},
                "fallback_share": (c.get(f"{CPU_FALLBACK}_seconds", 0.0)
                                   + c.get(f"{UNSUPPORTED}_seconds", 0.0)) / total}
               for m, c in sorted(by_module.items())]
    return TargetFallbacks(detected.to_dict(), ops, modules, _findings(recording, ops, table, rules))


def _pattern(module: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in module.split("."))


def _findings(recording: Recording, ops: list[dict], table, rules) -> list[Finding]:
    findings: list[Finding] = []
    # Repeated blocks (layer.0 ... layer.11) make one finding each, and info findings one per kind.
    grouped: dict[tuple[str, str], list] = collections.defaultdict(list)
    for kind, module, op, detail in recording.features:
        rule = rules.get(kind)
        if rule is None:
            continue
        pattern = "" if rule.severity == INFO else _pattern(module)
        grouped[(kind, pattern)].append((module, op, detail))
    for (kind, pattern), items in grouped.items():
        rule = rules[kind]
        severity = rule.severity
        if kind == "recurrent" and table.classify(items[0][1]).status == UNSUPPORTED:
            severity = BLOCKER   # the device's cell op has no kernel anywhere
        modules = sorted({m for m, _, _ in items})
        where = modules[0] if len(modules) == 1 else f"{pattern} ({len(modules)} modules)".strip()
        op_names = sorted({op for _, op, _ in items})
        details = "; ".join(sorted({d for _, _, d in items})[:3])
        findings.append(Finding(kind, severity, where, op_names,
                                f"{kind.replace('_', ' ')} in {where}: {details} ({', '.join(op_names[:4])}"
                                f"{', ...' if len(op_names) > 4 else ''})", rule.advice, rule.source))
    for entry in ops:
        if entry["status"] in (CPU_FALLBACK, UNSUPPORTED) and entry["status"] in rules:
            rule = rules[entry["status"]]
            verb = "falls back to the CPU" if entry["status"] == CPU_FALLBACK else "cannot run"
            where = ", ".join(sorted({_pattern(m) for m in entry["modules"]})[:3])
            findings.append(Finding(entry["status"], rule.severity, where, [entry["op"]],
                                    f"{entry['op']} {verb} ({entry['detail']}); {entry['calls']} calls, "
                                    f"{entry['share']:.1%} of op time, from {where}", rule.advice, rule.source))
    order = {s: i for i, s in enumerate(targets_mod.SEVERITIES)}
    return sorted(findings, key=lambda f: (order[f.severity], f.kind, f.module))


@dataclass
class FallbackReport:
    """Stage 1's result: the recording, and each target's classification of it."""
    model: dict
    inputs: dict
    train: bool
    recorded: dict
    records: list[OpRecord]
    targets: dict[str, TargetFallbacks]

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def to_dict(self) -> dict:
        return {"stage": STAGE, "model": self.model, "inputs": self.inputs, "train": self.train,
                "recorded": self.recorded, "summary": self.summary(),
                "targets": {n: t.to_dict() for n, t in self.targets.items()},
                "records": [r.to_dict() for r in self.records]}

    def save(self, path) -> None:
        save_result(path, self.to_dict())

    def __str__(self) -> str:
        lines = [f"Fallback discovery for {self.model['name']} ({self.inputs['description']}, "
                 f"{'forward+backward' if self.train else 'forward'}): {self.recorded['calls']} ATen calls, "
                 f"{self.recorded['distinct_ops']} distinct ops"]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            for f in t.findings:
                lines.append(f"    [{f.severity}] {f.message}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [f"<p><b>Fallback discovery</b> for <code>{html.escape(self.model['name'])}</code> "
                 f"({html.escape(self.inputs['description'])}): {self.recorded['calls']} ATen calls, "
                 f"{self.recorded['distinct_ops']} distinct ops.</p>"]
        for t in self.targets.values():
            mode = t.target["mode"]
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{mode}</i></h4>"
                         f"<p>{html.escape(t.summary())}</p>")
            if t.findings:
                parts.append(_html_table(["severity", "finding", "what to do"],
                                         [[f.severity, f.message, f.advice] for f in t.findings]))
        return "\n".join(parts)

    def op_table(self, target: str, limit: int = 25) -> "HtmlTable":
        t = self.targets[target]
        rows = [[o["op"], o["status"], o["calls"], f"{o['share']:.1%}", ", ".join(o["modules"][:2])
                 + (" ..." if len(o["modules"]) > 2 else ""), o["detail"]] for o in t.ops[:limit]]
        return HtmlTable(["op", "status", "calls", "time", "modules", "why"], rows,
                         f"{target}: top {min(limit, len(t.ops))} of {len(t.ops)} ops by time")

    def module_table(self, target: str, depth: int = 4) -> "HtmlTable":
        rows = _modules_at_depth(self.targets[target].modules, depth)
        return HtmlTable(["module", "calls", *STATUSES, "time"],
                         [[m, c["calls"], *[c[s] for s in STATUSES], f"{c['share']:.1%}"] for m, c in rows],
                         f"{target}: calls per module (depth {depth})")

    def plot(self, depth: int = 4, top: int = 12):
        """Per target: calls per module by status (left) and the ops that take the most time (right)."""
        import matplotlib.pyplot as plt
        names = list(self.targets)
        fig, axes = plt.subplots(len(names), 2, figsize=(13, 3.2 * len(names)), squeeze=False)
        for row, name in enumerate(names):
            t = self.targets[name]
            mods = _modules_at_depth(t.modules, depth)[-top:]
            left = [0] * len(mods)
            for status in STATUSES:
                vals = [c[status] for _, c in mods]
                axes[row][0].barh([m for m, _ in mods], vals, left=left, color=STATUS_COLORS[status],
                                  label=status)
                left = [a + b for a, b in zip(left, vals)]
            axes[row][0].set_title(f"{name} ({t.target['mode']}): ATen calls per module")
            axes[row][0].tick_params(axis="y", labelsize=7)
            ops = t.ops[:top][::-1]
            axes[row][1].barh([o["op"].replace("aten::", "") for o in ops], [100 * o["share"] for o in ops],
                              color=[STATUS_COLORS[o["status"]] for o in ops])
            axes[row][1].set_title(f"{name}: top ops by share of op time (%)")
            axes[row][1].tick_params(axis="y", labelsize=7)
        axes[0][0].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig


def _modules_at_depth(modules: list[dict], depth: int) -> list[tuple[str, collections.Counter]]:
    merged: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for m in modules:
        key = ".".join(m["module"].split(".")[:depth])
        for k in ("calls", *STATUSES):
            merged[key][k] += m[k]
        merged[key]["share"] += m["share"]
    return sorted(merged.items(), key=lambda kv: kv[1]["calls"])


@dataclass
class HtmlTable:
    """A small table that renders in a notebook and prints in a terminal."""
    header: list[str]
    rows: list[list]
    caption: str = ""

    def _repr_html_(self) -> str:
        return _html_table(self.header, self.rows, self.caption)

    def __str__(self) -> str:
        cells = [self.header] + [[str(c) for c in r] for r in self.rows]
        widths = [min(60, max(len(str(r[i])) for r in cells)) for i in range(len(self.header))]
        lines = [self.caption] if self.caption else []
        lines += ["  ".join(str(c)[:w].ljust(w) for c, w in zip(r, widths)) for r in cells]
        return "\n".join(lines)

    __repr__ = __str__


def _html_table(header, rows, caption: str = "") -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in r)
                   + "</tr>" for r in rows)
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------- native mode: the vendor's own record
def _neuron_vendor_record(run) -> dict:
    import torch_neuronx
    torch_neuronx.clear_op_tracking()
    run()
    return {"source": "torch_neuronx.get_fallback_ops() / get_executed_ops()",
            "fallback_ops": sorted(torch_neuronx.get_fallback_ops()),
            "executed_ops": sorted(torch_neuronx.get_executed_ops())}


def _tpu_vendor_record(run) -> dict:
    # TorchTPU has no fallback API; its missing-op fallback warns "'<op>' is not implemented for TPU.
    # Falling back to CPU" (torch_tpu missing-op fallback; data/sources/torch_tpu_0.2.0_dispatcher_ops.json).
    import logging
    messages: list[str] = []

    class Catch(logging.Handler):
        def emit(self, rec):
            messages.append(rec.getMessage())
    handler = Catch()
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        logging.getLogger().removeHandler(handler)
    messages += [str(w.message) for w in caught]
    hits = sorted({m for m in messages if "is not implemented for TPU" in m})
    return {"source": "TorchTPU missing-op fallback messages", "fallback_messages": hits}


VENDOR_RECORDERS = {"torch_neuronx": _neuron_vendor_record, "torch_tpu": _tpu_vendor_record}


def _to_device(inputs: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


# ---------------------------------------------------------------- the stage's verb
def check_parameters(batch_size: int = 8, seq_len: int = 128, train: bool = False, seed: int = 0,
                     corpus: str = "stdlib") -> None:
    """The notebook's validation cell, also run by the runner before anything is written."""
    from portkit import data, params
    params.positive_int("batch_size", batch_size)
    params.positive_int("seq_len", seq_len)
    params.boolean("train", train)
    params.non_negative_int("seed", seed)
    data.check_corpus(corpus)

def find_fallbacks(model, inputs: dict[str, torch.Tensor], targets=("neuron", "tpu"),
                   train: bool = False, description: str | None = None) -> FallbackReport:
    """Record one eager pass of `model` on `inputs` and classify it for every target.

    model: a portkit.models.LoadedModel. inputs: the dict its encode() returns.
    In native mode for a target, its pass is recorded on the device with the live dispatcher table,
    and the vendor's own fallback record is added.
    """
    names = targets_mod.parse_targets(targets)
    detected = [targets_mod.detect(n) for n in names]
    cpu_recording = None
    per_target: dict[str, TargetFallbacks] = {}
    records: list[OpRecord] = []
    for d in detected:
        if d.native and d.target.vendor_module:
            module = model.module.to(d.target.device)
            dev_inputs = _to_device(inputs, d.target.device)
            recording = record(model, dev_inputs, train)
            run = lambda: module(**dev_inputs)   # noqa: E731
            with torch.no_grad():
                vendor = VENDOR_RECORDERS[d.target.vendor_module](run)
            model.module.to("cpu")
        else:
            if cpu_recording is None:
                cpu_recording = record(model, inputs, train)
            recording, vendor = cpu_recording, None
        result = classify(recording, d)
        result.vendor_record = vendor
        per_target[d.name] = result
        if not records:
            records = sorted(recording.records.values(), key=lambda r: -r.seconds)
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    first = next(iter(shapes.values()), [])
    desc = description or ("batch " + " x ".join(str(s) for s in first) if first else "no tensor inputs")
    calls = sum(r.calls for r in records)
    return FallbackReport(
        model=model.describe(), inputs={"description": desc, "shapes": shapes}, train=train,
        recorded={"calls": calls, "distinct_ops": len({r.op for r in records}),
                  "seconds": cpu_recording.seconds if cpu_recording else None},
        records=records, targets=per_target)
