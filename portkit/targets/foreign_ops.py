"""An op in a compiled graph that is not an ATen op (a library's or the user's torch.library custom op): what
portkit can check inside it, and what it cannot.

    >>> from portkit.targets import foreign_ops
    >>> foreign_ops.is_foreign(torch.ops.mylib.grouped_mm.default), foreign_ops.is_foreign_name("prims::iota")
    (True, False)
    >>> found = foreign_ops.look_inside(func, args, kwargs, op_table)   # args: the graph's (fake) tensors
    >>> found["host_reads"], found["checked"], found["not_checked"]

A target's compiler meets such an op as one opaque node; portkit's op tables list ATen ops, so whether the
target lowers the op itself is never established here. Where the op was made with torch.library.custom_op, its
Python function is traced once on fake tensors whose value reads become unbacked symbols
(torch_private.symbolic_fake_mode): every ATen op it runs is recorded, with the lines that read tensor values on
the host (.item(), .tolist()), the ops whose sizes follow those values, and the ops the target's op table would
not lower. Tracing stops at the first error, which is named: what follows it is not checked.
"""
from __future__ import annotations

import collections
import inspect

from portkit.core import owners
from portkit.core import torch_private
from portkit.core.findings import HOST_SYNC_OPS

# The dispatcher namespaces of PyTorch's own ops: ATen, its primitives, its collectives and its higher-order ops
# (torch.ops.higher_order: cond, flex_attention). Any other namespace is a library's or the user's (torch.library:
# "mylib::op"). Stage 1's recorder reads the same set.
CORE_NAMESPACES = frozenset({"aten", "prims", "prim", "_c10d_functional", "c10d", "higher_order"})
KEEP = 3   # source lines kept per thing found inside


# Words in a custom op's Python source that mark a kernel of its own (Triton, a CUDA extension) rather than torch ops.
KERNEL_MARKS = ("triton", "wrap_triton", "load_inline", "cpp_extension", ".cuda(", "cupy")


def runs_as_plain_torch(func) -> bool:
    """Whether a foreign op's kernel is a Python function of torch ops (torch.library.custom_op), with no Triton or
    CUDA kernel of its own in its source: it runs wherever PyTorch does, opaque to the target's compiler. An op
    defined otherwise (a C++ kernel, Library.impl) or one whose source launches a kernel is not."""
    fn = torch_private.custom_op_function(func)
    if fn is None:
        return False
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return not any(mark in source for mark in KERNEL_MARKS)


def is_foreign(func) -> bool:
    """Whether a dispatched op is outside PyTorch's own namespaces."""
    return getattr(func, "namespace", "aten") not in CORE_NAMESPACES


def is_foreign_name(op: str) -> bool:
    """Whether an op as results name it ("aten::mm", "transformers::grouped_mm_fallback") is outside PyTorch's own
    namespaces: the same set as is_foreign, for readers of compile.json's ops."""
    return op.split("::", 1)[0] not in CORE_NAMESPACES


class _Inside(torch_private.TorchDispatchMode):
    """Records the ATen ops a custom op's Python function runs on fake tensors, with the lines that read values
    and the ops whose sizes follow them."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.host_reads: dict[str, dict] = {}       # line_key -> where
        self.sized: dict[str, dict] = {}            # line_key and op -> {"op", "where"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "prim":   # prim::device, prim::layout: metadata queries
            return out
        op = func.name()
        self.ops[op] += 1
        where = owners.caller(2)
        line = owners.line_key(where)
        if op in HOST_SYNC_OPS:
            self.host_reads.setdefault(line or op, where)
        elif torch_private.unbacked_sizes(out):
            self.sized.setdefault(f"{line}:{op}", {"op": op, "where": where})
        return out


def _defined(fn) -> dict | None:
    try:
        lines, first = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    hit = next((i for i, text in enumerate(lines) if text.lstrip().startswith("def ")), 0)
    return owners.place(file, first + hit, fn.__name__, lines[hit]) if file else None


def look_inside(func, args, kwargs, table) -> dict:
    """What portkit can tell of one foreign op from its graph's (fake) arguments: {"op", "defined" (its Python
    function's place, or None), "traced", "ops" (ATen op -> calls inside), "host_reads" and "data_dependent" (source
    places), "not_lowered" (inner ops the target's op table would not lower), "stopped" (why tracing stopped), and
    "checked" / "not_checked": each a sentence}."""
    op, fn = func.name(), torch_private.custom_op_function(func)
    found = {"op": op, "defined": _defined(fn) if fn is not None else None, "traced": False, "ops": {},
             "host_reads": [], "data_dependent": [], "not_lowered": [], "stopped": None}
    checked = ["a fake (meta) kernel gives its output shapes, so torch.compile keeps it in the graph as one op"]
    not_checked = ["whether the target's compiler lowers it: portkit's op tables list ATen ops, not "
                   f"{func.namespace}::", "its speed on the target"]
    if fn is None:
        not_checked.insert(0, "what it runs inside: it was not made with torch.library.custom_op, so portkit has "
                              "no Python function of it to trace (a compiled kernel, or Library.impl)")
        return {**found, "checked": checked, "not_checked": not_checked}
    recorder = _Inside()
    with torch_private.no_dispatch_modes(), torch_private.outside_dynamo_tracing():
        mode = torch_private.symbolic_fake_mode()
        try:
            fake_args, fake_kwargs = torch_private.fakes_like(mode, (tuple(args), dict(kwargs or {})))
            with mode, recorder:
                fn(*fake_args, **fake_kwargs)
            found["traced"] = True
        except Exception as exc:   # noqa: BLE001 - the op's own code: named, and what follows it is unchecked
            at = owners.raised_at(exc)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            found["stopped"] = f"{type(exc).__name__}: {text[:200]}" + (f" at {at['text']}" if at else "")
    found["ops"] = dict(recorder.ops)
    found["host_reads"] = list(recorder.host_reads.values())[:KEEP]
    found["data_dependent"] = list(recorder.sized.values())[:KEEP]
    found["not_lowered"] = [{"op": inner, "status": cls.status, "detail": cls.detail}
                            for inner in sorted(recorder.ops)
                            if (cls := table.classify(inner, compiled=True)).status in ("cpu_fallback", "unsupported")]
    checked.append(f"its Python function, traced on fake tensors: {sum(recorder.ops.values())} ATen call(s) of "
                   f"{len(recorder.ops)} op(s), {len(recorder.host_reads)} line(s) reading tensor values on the host, "
                   f"{len(recorder.sized)} op(s) whose size follows those values, {len(found['not_lowered'])} op(s) "
                   "the target would not lower")
    if found["stopped"]:
        not_checked.insert(0, f"its Python function after tracing stopped ({found['stopped']})")
    return {**found, "checked": checked, "not_checked": not_checked}
