"""The one boundary to PyTorch's private APIs: a torch upgrade that renames one breaks this file only.

    >>> from portkit.core import torch_private
    >>> with torch_private.recompile_limit(shapes=12):   # a static-shape target compiles all 12 shapes
    ...     for inputs in requests:
    ...         compiled(**inputs)
    >>> with torch_private.no_dispatch_modes():          # a hook's own arithmetic, not recorded or emulated
    ...     saved = output.detach().clone()

Each name here wraps one private attribute (torch._C, torch._dynamo, torch._inductor, torch._decomp,
torch.utils._pytree, torch.utils._python_dispatch) and says what portkit relies on it for; no other portkit module
names one (tests/architecture/test_architecture.py). Public equivalents are used
where they exist (torch.compiler.reset, torch.compiler.set_stance).
"""
from __future__ import annotations

import contextlib
import os
from unittest import mock

import torch
import torch.utils._pytree
# TorchDispatchMode is the documented way to intercept ATen calls ("__torch_dispatch__" in the
# extending-torch notes) but lives in a private module; stages import it from here.
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["DATA_DEPENDENT_ERRORS", "TorchDispatchMode", "aot_autograd", "backend_by_name", "backend_compiler_failed",
           "compile_with_inductor", "current_autograd_node", "custom_op_function", "decomposed_aten_overloads",
           "default_recompile_limit", "dispatcher_op_names", "dynamo_errors", "dynamo_optimize", "explain",
           "fake_tensor_mode", "fakes_like", "fresh_compile_cache", "graph_input_name", "guard_failures",
           "has_kernel_for", "inductor_cache_hits", "inductor_default_cache_dir", "is_graph_break", "is_op_overload",
           "keystr", "known_backends", "no_dispatch_modes", "op_schema", "operator_schemas",
           "output_size_follows_values", "outside_dynamo_tracing", "recompile_limit", "recompile_limit_for",
           "register_backend", "removed_named_overloads_tolerated", "symbolic_fake_mode", "tensor_version",
           "tree_flatten", "tree_flatten_with_path", "tree_leaves", "tree_map", "tree_unflatten", "unbacked_sizes",
           "uncapturable_errors", "unlimited_recompiles"]


# ---------------------------------------------------------------- pytrees (torch.utils._pytree)
# PyTorch's pytree is the one Dynamo and torch.export flatten example values with; it has no public module, so
# portkit's nested inputs, outputs and states are walked through these names.
def tree_leaves(value) -> list:
    """The leaves of nested lists, tuples and dicts (torch.utils._pytree, which Dynamo's example
    values follow)."""
    return torch.utils._pytree.tree_leaves(value)


def tree_map(fn, value, is_leaf=None):
    """`value` with `fn` applied to every leaf, in the same nesting (torch.utils._pytree.tree_map)."""
    return torch.utils._pytree.tree_map(fn, value, is_leaf=is_leaf)


def tree_flatten(value, is_leaf=None):
    """(leaves, spec) of a nested value (torch.utils._pytree.tree_flatten); tree_unflatten undoes it."""
    return torch.utils._pytree.tree_flatten(value, is_leaf=is_leaf)


def tree_unflatten(leaves, spec):
    """The nested value of `spec` rebuilt from `leaves` (torch.utils._pytree.tree_unflatten)."""
    return torch.utils._pytree.tree_unflatten(leaves, spec)


def tree_flatten_with_path(value, is_leaf=None):
    """([(key path, leaf)], spec) of a nested value (torch.utils._pytree.tree_flatten_with_path)."""
    return torch.utils._pytree.tree_flatten_with_path(value, is_leaf=is_leaf)


def keystr(path) -> str:
    """A key path as text, "['state'][0]" (torch.utils._pytree.keystr)."""
    return torch.utils._pytree.keystr(path)


def no_dispatch_modes():
    """A context in which no TorchDispatchMode is active: code run inside it (a module hook's own
    copies and norms) is neither recorded nor emulated nor counted by the modes of the pass."""
    return _disable_current_modes()


def current_autograd_node():
    """The autograd node being executed during backward, or None in forward. Its `metadata` dict is
    where a forward hook can leave a label that backward ops then read."""
    return torch._C._current_autograd_node()


# ---------------------------------------------------------------- Dynamo's recompile limit
def default_recompile_limit() -> int:
    """How many graphs Dynamo compiles for one function before it gives up and runs it eagerly,
    silently (torch._dynamo.config.recompile_limit, 8 in torch 2.13; pytorch/pytorch#114511)."""
    import torch._dynamo   # imported on first use: importing Dynamo costs about a second
    return int(torch._dynamo.config.recompile_limit)


def recompile_limit_for(shapes: int) -> int:
    """The limit portkit compiles under when it expects `shapes` distinct input shapes.

    A static-shape target (both Neuron and TPU) compiles one graph per shape and never runs a shape
    eagerly, so every expected shape must compile: the limit is the shapes plus Dynamo's own default
    allowance for recompiles that a shape does not cause (a guard on a global, on grad mode), and never
    below Dynamo's default. This is the only place that decides it."""
    default = default_recompile_limit()
    return max(default, int(shapes) + default)


def unlimited_recompiles():
    """No recompile limit for the block: a compile that must be paid is never replaced by an eager run."""
    import sys

    import torch._dynamo
    return torch._dynamo.config.patch(recompile_limit=sys.maxsize, accumulated_recompile_limit=sys.maxsize)


@contextlib.contextmanager
def recompile_limit(shapes: int):
    """Raise Dynamo's recompile limit (and the accumulated limit, which caps it) to
    recompile_limit_for(shapes) for the block; never lowers either."""
    import torch._dynamo
    limit = recompile_limit_for(shapes)
    config = torch._dynamo.config
    with config.patch(recompile_limit=limit,
                      accumulated_recompile_limit=max(limit, config.accumulated_recompile_limit)):
        yield limit


# ---------------------------------------------------------------- Inductor
def fresh_compile_cache():
    """An empty Inductor cache (its directory and in-memory code caches) for the block: compile times
    measured inside are those of a fresh deployment, not of a cache warmed by an earlier run."""
    from torch._inductor.utils import fresh_cache
    return fresh_cache()


# ---------------------------------------------------------------- ATen overload lookup
class RemovedOverload:
    """Stands in for an ATen overload that this torch removed; it can never match a dispatched op."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} removed in torch {torch.__version__}>"


@contextlib.contextmanager
def removed_named_overloads_tolerated():
    """While the block runs, looking up a named-tensor overload this torch no longer has (torch 2.13
    removed aten.prod.dim_Dimname, aten.all.dimname, ...) returns an inert RemovedOverload instead of
    raising AttributeError; any other missing overload still raises. For importing a library built
    against an older torch that names them in tables (torchax 0.0.13): nothing can dispatch to an op
    torch no longer has. Patches torch._ops.OpOverloadPacket.__getattr__ for the block only."""
    packet = torch._ops.OpOverloadPacket
    original = packet.__getattr__

    def tolerant(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if "dimname" in key.lower() or "names" in key:
                return RemovedOverload(f"{self}.{key}")
            raise

    with mock.patch.object(packet, "__getattr__", tolerant):
        yield


def compile_with_inductor(gm: torch.fx.GraphModule, example_inputs):
    """Inductor's compile of an ATen graph (torch._inductor.compile_fx), keeping its casts.

    Inductor drops a cast to bf16 and back inside a fused kernel (the value stays fp32) unless told to
    keep eager's casts (emulate_precision_casts); those casts are an emulated target's rounding."""
    import torch._inductor.config
    from torch._inductor.compile_fx import compile_fx
    with torch._inductor.config.patch(emulate_precision_casts=True):
        return compile_fx(gm, list(example_inputs))


# ---------------------------------------------------------------- Dynamo's backend registry and graphs
def aot_autograd(forward, backward):
    """A Dynamo backend for graphs that need gradients (torch._dynamo.backends.common.aot_autograd):
    AOTAutograd traces the joint forward/backward ATen graph, partitions it, and hands each half to
    forward(gm, example_inputs) / backward(gm, example_inputs), whose compiled callables it calls with
    boxed arguments (functorch.compile.make_boxed_func)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd as aot
    return aot(fw_compiler=lambda gm, example_inputs: make_boxed_func(forward(gm, example_inputs)),
               bw_compiler=lambda gm, example_inputs: make_boxed_func(backward(gm, example_inputs)))


def outside_dynamo_tracing():
    """A context without Dynamo's tracing context (torch._guards.tracing(None)): a retrace inside a
    backend makes its own static-shape fake mode instead of adding symbols and guards to Dynamo's."""
    import torch._guards
    return torch._guards.tracing(None)


def is_op_overload(target) -> bool:
    """Whether an FX node's target is one overload of a dispatcher op (torch.ops.aten.mm.default),
    whose schema and tags say what it does (torch._ops.OpOverload)."""
    return isinstance(target, torch._ops.OpOverload)


def fake_tensor_mode():
    """A static-shape FakeTensorMode (torch._subclasses.fake_tensor): tensors with shapes, dtypes and
    devices but no values; real tensors met as constants are converted on use."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def known_backends() -> set[str]:
    """Every backend name Dynamo knows, entry points included (torch._dynamo.list_backends)."""
    import torch._dynamo
    return set(torch._dynamo.list_backends(exclude_tags=()))


def register_backend(backend, name: str) -> None:
    import torch._dynamo
    torch._dynamo.register_backend(backend, name=name)


def backend_by_name(name: str):
    """The backend callable registered under `name` (an entry point is loaded on first use)."""
    from torch._dynamo.backends.registry import lookup_backend
    return lookup_backend(name)


def inductor_default_cache_dir() -> str:
    """The folder torch sets TORCHINDUCTOR_CACHE_DIR to the first time anything asks for Inductor's cache and the
    variable is unset (cache_dir_utils.cache_dir; importing torch._dynamo asks)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    return os.path.abspath(default_cache_dir())


def inductor_cache_hits() -> int:
    """How many graphs Inductor's FX graph cache has served in this process."""
    from torch._dynamo.utils import counters
    return counters["inductor"]["fxgraph_cache_hit"]


def graph_input_name(node: torch.fx.Node) -> str | None:
    """The user's argument name behind a placeholder of a Dynamo graph, or None for a lifted
    parameter, buffer or other non-local input (node.meta["grapharg"].source)."""
    from torch._dynamo.source import LocalSource
    arg = node.meta.get("grapharg")
    return arg.source.local_name if arg is not None and isinstance(arg.source, LocalSource) else None


def guard_failures(clear: bool = False) -> list[str]:
    """Dynamo's record of the guard failures behind its recompiles (torch._dynamo.utils.guard_failures, by
    code object), as text; clear=True empties it first, so a later call sees only what followed."""
    import torch._dynamo.utils
    record = torch._dynamo.utils.guard_failures
    if clear:
        record.clear()
    return [str(f) for fs in record.values() for f in fs]


# ---------------------------------------------------------------- what PyTorch's fake kernels say about sizes
def _data_dependent_errors() -> tuple[type, ...]:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return DynamicOutputShapeException, DataDependentOutputException, GuardOnDataDependentSymNode


# What a fake kernel raises where its output's size, or a branch, needs a tensor's values
# (torch._subclasses.fake_tensor; symbolic_shapes' guard on an unbacked symbol): PyTorch's own statement that the
# op is data-dependent.
DATA_DEPENDENT_ERRORS = _data_dependent_errors()


def symbolic_fake_mode():
    """A FakeTensorMode with a ShapeEnv: a value read from a tensor (.item(), .tolist(), nonzero's count) becomes an
    unbacked symbol instead of an error, so the sizes that follow from it show as unbacked sizes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)


def fakes_like(mode, value):
    """`value` with every tensor replaced by a tensor of `mode` of the same size, strides, dtype and device (a fake
    tensor of another mode, a meta tensor or a real one alike: their values are never read)."""
    def like(t):
        if not isinstance(t, torch.Tensor):
            return t
        with mode:
            return torch.empty_strided(tuple(int(n) for n in t.shape), tuple(int(n) for n in t.stride()),
                                       dtype=t.dtype, device=t.device if t.device.type != "meta" else "cpu")
    return torch.utils._pytree.tree_map(like, value)


def unbacked_sizes(value) -> bool:
    """Whether a tensor's size or a symbolic number in `value` rests on an unbacked symbol: one read from a tensor's
    values (.item(), .tolist(), nonzero's count)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return any(free_unbacked_symbols(leaf) for leaf in tree_leaves(value)
               if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)))


def output_size_follows_values(func, args, kwargs) -> bool | None:
    """Whether the ATen op's output size depends on its inputs' values, as PyTorch's own fake kernel says: it raises
    DynamicOutputShapeException or DataDependentOutputException, or gives an output an unbacked size (nonzero,
    masked_select, unique, repeat_interleave of a repeats tensor; not histc, whose size is its `bins`). None where
    the fake kernel cannot say (it fails for another reason). Runs on fake copies: no value is read or changed."""
    with no_dispatch_modes():
        mode = symbolic_fake_mode()
        try:
            fake_args, fake_kwargs = fakes_like(mode, (tuple(args), dict(kwargs or {})))
            with mode:
                out = func(*fake_args, **fake_kwargs)
        except DATA_DEPENDENT_ERRORS:
            return True
        except Exception:   # noqa: BLE001 - no fake kernel, a tensor without strides (sparse): PyTorch does not say
            return None
        return unbacked_sizes(out)


def custom_op_function(func):
    """The Python function a torch.library.custom_op was made from (torch._library.custom_ops.OPDEFS), which runs
    as its kernel; None for an op defined otherwise (a C++ kernel, torch.library.Library.impl)."""
    from torch._library.custom_ops import OPDEFS
    opdef = OPDEFS.get(getattr(getattr(func, "_schema", None), "name", None))
    return getattr(opdef, "_init_fn", None) if opdef is not None else None


# ---------------------------------------------------------------- the dispatcher's operator registry (torch._C)
# The dispatcher's tables say which ATen operators exist and which dispatch keys (CPU, PrivateUse1, the composite
# keys) have a kernel for each; torch exposes them only through torch._C. A target's live op table and the op
# classifier read them here.
def dispatcher_op_names() -> list[str]:
    """Every operator the dispatcher knows, as 'aten::name.overload' (torch._C._dispatch_get_all_op_names)."""
    return torch._C._dispatch_get_all_op_names()


def has_kernel_for(op: str, key: str) -> bool:
    """Whether the dispatcher has a kernel for `op` under dispatch key `key`
    (torch._C._dispatch_has_kernel_for_dispatch_key); RuntimeError for an operator this torch does not know."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def operator_schemas(name: str) -> list:
    """The schemas (overload_name, arguments with name, type and is_out) of every overload of the operator
    `name`, 'aten::add' (torch._C._jit_get_schemas_for_operator); RuntimeError for an unknown name."""
    return torch._C._jit_get_schemas_for_operator(name)


def decomposed_aten_overloads() -> frozenset[str]:
    """Every ATen overload with a decomposition in PyTorch's own table (torch._decomp.decomposition_table), as
    'aten::name.overload' (an OpOverload's _opname and _overloadname)."""
    from torch._decomp import decomposition_table
    return frozenset(f"aten::{o._opname}.{o._overloadname}" for o in decomposition_table
                     if isinstance(o, torch._ops.OpOverload) and o.namespace == "aten")


# ---------------------------------------------------------------- Dynamo's entry points and errors (torch._dynamo)
def dynamo_optimize(backend, *, fullgraph: bool, **hooks):
    """Dynamo's frame evaluation with `backend`, static shapes (torch._dynamo.optimize(backend, nopython=fullgraph,
    dynamic=False)): the call torch.compile makes, which also takes the hooks torch.compile does not pass on
    (guard_fail_fn, called with each guard failure behind a recompile). Returns a function to wrap a module."""
    import torch._dynamo
    return torch._dynamo.optimize(backend, nopython=fullgraph, dynamic=False, **hooks)


def explain(module, **inputs):
    """Dynamo's account of `module(**inputs)`: its graphs, graph breaks and their reasons (torch._dynamo.explain,
    which torch.compiler's troubleshooting page documents; it has no public path)."""
    import torch._dynamo
    return torch._dynamo.explain(module)(**inputs)


def dynamo_errors() -> type:
    """The base class of every error Dynamo raises (torch._dynamo.exc.TorchDynamoException); a function, so an
    `except` clause names it without importing Dynamo (about a second) before an error needs matching."""
    import torch._dynamo.exc
    return torch._dynamo.exc.TorchDynamoException


def uncapturable_errors() -> tuple[type, ...]:
    """What Dynamo raises where a model cannot be captured as one graph: a graph break under fullgraph=True
    (torch._dynamo.exc.Unsupported) or a user-facing refusal (torch._dynamo.exc.UserError)."""
    import torch._dynamo.exc
    return torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError


def is_graph_break(exc: BaseException) -> bool:
    """Whether `exc` is Dynamo's graph-break error (torch._dynamo.exc.Unsupported)."""
    import torch._dynamo.exc
    return isinstance(exc, torch._dynamo.exc.Unsupported)


def backend_compiler_failed() -> type:
    """What Dynamo raises when a backend's compile fails (torch._dynamo.exc.BackendCompilerFailed); the backend's
    own error is its inner_exception."""
    import torch._dynamo.exc
    return torch._dynamo.exc.BackendCompilerFailed


# ---------------------------------------------------------------- private attributes of torch's objects
def op_schema(op):
    """An ATen overload's schema: its arguments (name, type, alias_info.is_write, is_out) and is_mutable
    (OpOverload._schema; torch.library's docs read it the same way, it has no public accessor)."""
    return op._schema


def tensor_version(tensor: torch.Tensor) -> int:
    """A tensor's version counter, raised by every in-place write to it or to a view of it (Tensor._version,
    the counter autograd checks saved tensors against)."""
    return tensor._version
