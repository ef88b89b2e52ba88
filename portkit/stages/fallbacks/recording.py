"""Record one eager pass: every ATen call, its count, dtypes and time, and the nn.Module that made it.

    >>> from portkit.stages.fallbacks import recording
    >>> found = recording.record(model, inputs, train=True)     # forward and backward
    >>> [(r.op, r.module, r.phase, r.calls) for r in found.records.values()][:3]
    >>> found.features          # (kind, module, op, detail): float64, int64, sparse, data-dependent, ...

The recorder is a TorchDispatchMode, below autograd, so it sees the ops the device would run. Forward
ops are attributed to the innermost running module (portkit.core.module_stack); backward ops to the module whose
forward created their autograd node (each module labels the nodes it creates). The features scanned
for are those the vendors name as unsupported or slow; how each target treats them is the target's
data (targets.Target.features), applied by the fallbacks stage.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from portkit.targets import privateuse1_ops
from portkit.targets import foreign_ops
from portkit.core import owners
from portkit.core.torch_private import TorchDispatchMode, current_autograd_node, output_size_follows_values
from portkit.core.findings import ROOT
from portkit.core.module_stack import ModuleTracker

HOST_SYNC = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero", "aten::item"})
INDEX_OPS = frozenset({"aten::index.Tensor", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})
SDPA_OPS = frozenset({"aten::_scaled_dot_product_flash_attention_for_cpu",
                      "aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_efficient_attention",
                      "aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_fused_attention_overrideable"})
_MODULE_KEY = "portkit_module"   # autograd node metadata: the module that created it


@dataclass
class OpRecord:
    """Calls of one ATen op from one module in one phase."""
    op: str
    module: str
    phase: str
    calls: int = 0
    seconds: float = 0.0
    dtypes: set = field(default_factory=set)
    where: dict | None = None      # the source frame of its first call (portkit.core.owners.caller)

    def to_dict(self) -> dict:
        return {"op": self.op, "module": self.module, "phase": self.phase, "calls": self.calls,
                "seconds": self.seconds, "dtypes": sorted(self.dtypes), "where": self.where}


@dataclass
class Recording:
    records: dict[tuple[str, str, str], OpRecord] = field(default_factory=dict)
    features: list[tuple[str, str, str, str]] = field(default_factory=list)   # (kind, module, op, detail)
    # (kind, module, op) -> the source frame where the feature was first seen (portkit.core.owners.place)
    frames: dict[tuple[str, str, str], dict | None] = field(default_factory=dict)
    # (kind, module, op) -> the calls that showed the feature: a finding's occurrences, not findings of their own
    feature_calls: dict[tuple[str, str, str], int] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)   # module -> its class, for the module-class features
    plain_ops: set = field(default_factory=set)   # foreign ops of plain torch (foreign_ops.runs_as_plain_torch)
    seconds: float = 0.0       # wall time of the recorded pass


class _OpRecorder(TorchDispatchMode):
    """Counts and times every ATen call, attributing it to the innermost running nn.Module."""

    def __init__(self, recording: Recording, tracker: ModuleTracker):
        super().__init__()
        self.recording, self.tracker = recording, tracker
        self._seen_features: set = set()
        self._this_call: set = set()
        self._sizes_follow_values: dict[tuple, bool] = {}   # (op, its arguments' form) -> data-dependent

    def _module(self) -> tuple[str, str]:
        node = current_autograd_node()
        if node is not None:   # backward: the autograd node carries the module that created it
            return node.metadata.get(_MODULE_KEY, ROOT), "backward"
        return self.tracker.current, "forward"

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
            rec = self.recording.records[key] = OpRecord(
                op, module, phase, where=owners.caller(2) if phase == "forward" else None)
        rec.calls += 1
        rec.seconds += elapsed
        tensors = _tensors(args, kwargs, out)
        for t in tensors:
            rec.dtypes.add(str(t.dtype).replace("torch.", ""))
        self._this_call = set()
        self._scan(op, func, module, args, kwargs, tensors)
        return out

    def _feature(self, kind: str, module: str, op: str, detail: str) -> None:
        key = (kind, module, op)
        if key not in self._this_call:   # a call counts once, however many of its tensors show the feature
            self._this_call.add(key)
            self.recording.feature_calls[key] = self.recording.feature_calls.get(key, 0) + 1
        if key not in self._seen_features:
            self._seen_features.add(key)
            self.recording.features.append((kind, module, op, detail))
            self.recording.frames[key] = owners.caller(3)

    def _scan(self, op, func, module, args, kwargs, tensors) -> None:
        """Every feature this call shows: in its tensors, then in the op itself."""
        self._scan_tensors(op, module, tensors)
        self._scan_op(op, func, module, args, kwargs)

    def _scan_tensors(self, op, module, tensors) -> None:
        """Dtypes, layouts and nested tensors a target handles apart (float64, int64 ranges, sparse, nested)."""
        for t in tensors:
            if t.dtype == torch.float64:
                self._feature("float64", module, op, "float64 tensors")
            elif t.dtype == torch.int64 and t.numel() and t.device.type != "meta":
                self._feature("int64", module, op, "int64 tensors")
                # value check is cheap for the index-sized tensors it is for; an allocation's values are
                # whatever the memory held (torch.empty: "uninitialized data"), never the model's
                if t.numel() <= 1 << 20 and op.split(".")[0] not in UNINITIALIZED:
                    self._int64_range(t, module, op)
            if t.layout != torch.strided:
                self._feature("sparse", module, op, f"layout {str(t.layout).replace('torch.', '')}")
            if t.is_nested:
                self._feature("nested", module, op, "NestedTensor")

    def _scan_op(self, op, func, module, args, kwargs) -> None:
        """What the op itself is: outside aten, data-dependent in its output size or indexing, a host read, or an
        attention with a mask."""
        if foreign_ops.is_foreign(func):
            plain = foreign_ops.runs_as_plain_torch(func)
            if plain:
                self.recording.plain_ops.add(op)
            self._feature("custom_op", module, op, f"operator outside aten ({func.namespace}::)" + (
                ", a torch.library.custom_op whose kernel is a Python function of torch ops" if plain else ""))
        if op in HOST_SYNC:   # a scalar read on the host, not an output size: its own kind
            self._feature("host_sync", module, op, "tensor value read on the host (.item() or a branch)")
        elif self._data_dependent(op, func, args, kwargs):
            indices = args[1] if op in INDEX_OPS and len(args) > 1 else ()
            masked = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
            self._feature("data_dependent", module, op, "boolean-mask indexing" if masked else
                          "output size depends on tensor values (PyTorch's fake kernel gives it a size read "
                          "from the values)")
        if op in SDPA_OPS:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) else None)
            if isinstance(mask, torch.Tensor):
                self._feature("attention_mask", module, op,
                              f"attn_mask of shape {tuple(mask.shape)} ({str(mask.dtype).replace('torch.', '')})")


    def _data_dependent(self, op, func, args, kwargs) -> bool:
        """Whether this call's output size follows its inputs' values, as PyTorch's fake kernel says
        (torch_private.output_size_follows_values), asked once per op and form of its arguments (a
        repeat_interleave given output_size is static; one given none is not)."""
        key = (op, _form(args), _form(kwargs))
        if key not in self._sizes_follow_values:
            self._sizes_follow_values[key] = bool(output_size_follows_values(func, args, kwargs))
        return self._sizes_follow_values[key]

    def _int64_range(self, t: torch.Tensor, module: str, op: str) -> None:
        low, high = (int(v) for v in torch.aminmax(t))
        if low >= -(1 << 31) and high < 1 << 31:
            return
        outside = (t < -(1 << 31)) | (t >= 1 << 31)
        if not (outside & (t > -_NEAR_SENTINEL) & (t < _NEAR_SENTINEL)).any():
            # only the sentinels a float->int cast of +-inf or NaN gives, or values a few steps from them
            # (T5's log(0) relative positions, then + max_exact): int32 saturates at +-2**31 instead, which
            # matters only where they are not masked out afterwards
            self._feature("int64_saturated", module, op, "int64 values at or next to +-2**63, what a "
                          "float->int cast of +-inf or NaN gives")
        else:
            self._feature("int64_overflow", module, op, f"values from {low} to {high}")


# Ops whose output holds uninitialized memory (https://pytorch.org/docs/stable/generated/torch.empty.html):
# Mixtral's grouped experts allocate an index permutation with torch.empty_like and fill it after
# (transformers/integrations/moe.py)
UNINITIALIZED = frozenset({"aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
                           "aten::new_empty_strided", "aten::empty_permuted"})
_NEAR_SENTINEL = 1 << 62   # no index or count gets this far; a cast of +-inf lands at +-2**63


def _form(value):
    """What decides an op's output size besides values: which arguments are tensors (and their dtypes: a boolean
    index selects by values), lists, None or Python scalars."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_form(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _form(v)) for k, v in value.items()))
    return None if value is None else type(value).__name__


def _tensors(args, kwargs, out) -> list[torch.Tensor]:
    found = []
    for value in (*args, *kwargs.values(), out):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


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


def record(model, inputs: dict[str, torch.Tensor], train: bool = False, run=None) -> Recording:
    """Run one eager pass under the op recorder and return what it saw. run: a function that runs the
    workload instead of one forward pass on `inputs` (a generation: prefill and decode steps), no_grad."""
    module = model.module if hasattr(model, "module") else model
    recording = Recording()
    # Training: each module labels the autograd nodes it creates, so backward ops find their module.
    tracker = ModuleTracker(module, on_leave=(lambda path, m, output: _label_graph(output, path)) if train else None)
    was_training = module.training
    module.train(train)
    try:
        start = time.perf_counter()
        with tracker, torch.set_grad_enabled(train), _OpRecorder(recording, tracker):
            out = module(**inputs) if run is None else run()
            if train:
                floats = [v for v in (out.values() if isinstance(out, dict) else [out])
                          if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]
                sum(v.float().mean() for v in floats).backward()
        recording.seconds = time.perf_counter() - start
    finally:
        module.train(was_training)
        module.zero_grad(set_to_none=True)
    for m_name, sub in module.named_modules():   # device dispatch the CPU recording cannot show
        if fused := privateuse1_ops.fused_cell_ops(sub):
            kind, op = fused[:2]
            recording.classes[m_name or ROOT] = _class_name(sub)
            recording.features.append(("recurrent", m_name or ROOT, op,
                                       f"nn.{kind}: runs {op} on PrivateUse1 devices (ATen RNN.cpp)"))
            recording.frames[("recurrent", m_name or ROOT, op)] = _defined_in(module, m_name)
        elif plain := privateuse1_ops.plain_recurrent_op(sub):
            kind, op = plain
            recording.classes[m_name or ROOT] = _class_name(sub)
            recording.features.append(("recurrent_loop", m_name or ROOT, op,
                                       f"nn.{kind}: no fused cell on any device: each step runs as a matmul and "
                                       f"{sub.nonlinearity} (ATen RNN.cpp)"))
            recording.frames[("recurrent_loop", m_name or ROOT, op)] = _defined_in(module, m_name)
    return recording


def _class_name(module: torch.nn.Module) -> str:
    """A module's class as its finding names it: nn.LSTM for torch's own, the module path for a user's."""
    cls = type(module)
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn") else f"{cls.__module__}.{cls.__qualname__}"


def _defined_in(root: torch.nn.Module, name: str) -> dict | None:
    """Where the module `name` is used: its parent's forward, the code that chose it."""
    import inspect
    parent = root.get_submodule(name.rpartition(".")[0]) if "." in name else root
    try:
        lines, first = inspect.getsourcelines(type(parent).forward)
        file = inspect.getsourcefile(type(parent).forward)
    except (OSError, TypeError):
        return None
    attr = name.rpartition(".")[2]
    hit = next((i for i, text in enumerate(lines) if f"self.{attr}" in text), 0)
    return owners.place(file, first + hit, type(parent).forward.__name__, lines[hit]) if file else None
