"""portkit's emulated compile backends, and a counter of compiles around any backend.

    >>> compiled = torch.compile(module, backend="portkit_tpu", dynamic=False)   # no `import portkit` needed
    >>> compiled = torch.compile(module, backend="portkit_neuron", options={"precision": "matmult"})
    >>> compiled = torch.compile(module, backend="portkit_tpu", options={"inductor": True})  # CPU codegen
    >>> counter = backends.CompileCounter("portkit_tpu")   # every compile, timed, with what it found
    >>> compiled = torch.compile(module, backend=counter, dynamic=False)
    >>> with torch.compiler.set_stance("fail_on_recompile"):    # a refused recompile is paid, and listed
    ...     backends.call_counting_recompiles(lambda x: compiled(**x), inputs, late := [])

Each emulated backend stands in for its target's compiler where a migration feels it: (1) a graph with a
symbolic shape is refused with the vendor's own message (both targets need dynamic=False); (2) the graph is
retraced to ATen while numerics.emulate(target, precision) is active, so the target's dtype rules and matmul
rounding become graph nodes; (3) every ATen op is classified with the target's op table: ops that would not
lower are reported with the user's source line, ops the target's compiler decomposes are counted apart;
(4) the retraced graph runs eagerly op by op, no code generation, unless inductor=True compiles it for this
CPU (real CPU compile times, never the vendor's). A training graph is split by AOTAutograd into forward and
backward, each checked as its own graph. Dynamo finds portkit_neuron and portkit_tpu through the installed
package's `torch_dynamo_backends` entry points (pyproject.toml); from a bare source tree, importing this
module registers them (register()).
"""
from __future__ import annotations

import collections
import functools
import operator
import re
import time
from dataclasses import dataclass, field

import torch
import torch.fx.traceback as fx_traceback

from portkit.core import torch_private
from portkit.targets import allocator
from portkit.targets import foreign_ops
from portkit.core import owners
from portkit.targets import numerics
from portkit.targets import graph_shapes
from portkit.targets import specs
from portkit.core.errors import BadParameter, CompileRefused
from portkit.core.findings import cause_key
from portkit.targets.specs import CPU_FALLBACK, DECOMPOSED, UNSUPPORTED, Target

NOT_LOWERED = (CPU_FALLBACK, UNSUPPORTED)
_CAST = torch.ops.aten._to_copy.default


def _from_trace(stack_trace: str | None) -> dict | None:
    """The innermost frame of an FX node's meta["stack_trace"]."""
    found = owners.from_trace(stack_trace)
    return found[-1] if found else None


def where_text(where: dict | None) -> str:
    return where["text"] if where else "(no source line)"


# ---------------------------------------------------------------- the emulated backends
@dataclass
class GraphCheck:
    """What an emulated backend found in one Dynamo graph before compiling it."""
    target: str
    precision: str
    nodes: int                                   # operations in Dynamo's graph
    aten_calls: int = 0                          # ATen calls it makes (before the target's casts)
    not_lowered: list[dict] = field(default_factory=list)   # op, status, detail, via, calls, where
    decomposed: dict[str, int] = field(default_factory=dict)  # op the target's compiler decomposes -> calls
    numerics: dict[str, int] = field(default_factory=dict)  # what the target's rules changed
    refused: str | None = None
    check_seconds: float = 0.0                   # refusal checks, retrace, op table
    inductor_seconds: float = 0.0                # Inductor's compile (inductor=True only)
    runs: str = "eager"                          # how the retraced graph runs: "eager" or "inductor"
    part: str = "inference"                      # or a training graph's "joint" (Dynamo's), "forward", "backward"
    ops: dict[str, int] = field(default_factory=dict)   # every ATen op of the retraced graph -> calls
    # every op outside PyTorch's namespaces (a torch.library custom op), with what portkit checked inside it
    # (foreign_ops.look_inside) and its calls and call sites in this graph
    foreign_ops: list[dict] = field(default_factory=list)


class _OpLog(torch_private.TorchDispatchMode):
    """Counts each ATen call with the stack trace of the Dynamo node that made it."""

    def __init__(self, dtypes: bool = False):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.dtypes: dict[str, set] | None = collections.defaultdict(set) if dtypes else None
        self.foreign: dict[str, tuple] = {}   # an op outside PyTorch's namespaces -> (op, args, kwargs), first call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim":   # prim::device, prim::layout: metadata queries of fake tensors
            self.calls[(func.name(), fx_traceback.get_current_meta().get("stack_trace"))] += 1
            if foreign_ops.is_foreign(func):
                self.foreign.setdefault(func.name(), (func, args, kwargs or {}))
            if self.dtypes is not None:   # the inputs' dtypes: tensors, or lists of them (cat, stack)
                seen = self.dtypes[func.name()]
                for a in args:
                    for t in (a if isinstance(a, (list, tuple)) else (a,)):
                        if isinstance(t, torch.Tensor):
                            seen.add(t.dtype)
        return func(*args, **(kwargs or {}))


def _not_lowered(calls: collections.Counter, table: specs.OpTable) -> list[dict]:
    found: dict[str, dict] = {}
    for (op, trace), count in calls.items():
        cls = table.classify(op, compiled=True)
        if cls.status in NOT_LOWERED:
            entry = found.setdefault(op, {"op": op, "status": cls.status, "detail": cls.detail, "via": cls.via,
                                          "calls": 0, "where": []})
            entry["calls"] += count
            if (where := _from_trace(trace)) and where not in entry["where"]:
                entry["where"].append(where)
    return sorted(found.values(), key=lambda e: (e["status"] != UNSUPPORTED, e["op"]))


def _decomposed(calls: collections.Counter, table: specs.OpTable) -> dict[str, int]:
    found: collections.Counter = collections.Counter()
    for (op, _), count in calls.items():
        if table.classify(op, compiled=True).status == DECOMPOSED:
            found[op] += count
    return dict(sorted(found.items()))


def _foreign(log: _OpLog, table: specs.OpTable) -> list[dict]:
    """Each op of the graph outside PyTorch's namespaces: what portkit checked inside it, its calls, and the lines
    of the model that call it (the innermost frame outside torch)."""
    out = []
    for name, (func, args, kwargs) in sorted(log.foreign.items()):
        traces = [(trace, count) for (op, trace), count in log.calls.items() if op == name]
        where = []
        for trace, _ in traces:
            if (found := owners.innermost(owners.from_trace(trace))) and found not in where:
                where.append({k: v for k, v in found.items() if k != "line_key"})
        out.append({**foreign_ops.look_inside(func, args, kwargs, table),
                    "calls": sum(count for _, count in traces), "where": where})
    return out


def _inductor_flag(target: Target, value) -> bool:
    if not isinstance(value, bool):
        raise BadParameter(f"inductor option of backend {target.emulated_backend}", value, [True, False])
    return value


class EmulatedBackend:
    """A torch.compile backend for one target on the CPU, under the target's rules (module docstring).

    torch.compile(m, backend="portkit_neuron", options={"precision": "matmult"}) picks another of the
    target's precisions; options={"inductor": True} (or inductor=True here) compiles the checked graph
    with Inductor instead of running it eagerly."""
    OPTIONS = ("precision", "inductor")

    def __init__(self, target: Target, precision=None, inductor: bool = False):
        self.target, self.inductor = target, _inductor_flag(target, inductor)
        self.precision = numerics.emulate(target, precision).precision
        self.__name__ = target.emulated_backend      # how Dynamo's messages name a backend
        self.checks: collections.deque[GraphCheck] = collections.deque(maxlen=1000)
        self._rounded: collections.OrderedDict = collections.OrderedDict()   # see _Hoisted
        # owners.graph_contents of each graph, recorded where a list (stage 2's capture check), not in storms
        self.contents: list[dict] | None = None

    def __repr__(self) -> str:
        return f"EmulatedBackend({self.target.name}, precision={self.precision.name}, inductor={self.inductor})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
        allocator.tune()   # once a process: the retraced graphs' many fresh tensors, without page faults
        options = dict(options or {})
        precision = numerics.emulate(self.target, options.pop("precision", self.precision)).precision
        inductor = _inductor_flag(self.target, options.pop("inductor", self.inductor))
        if options:
            raise BadParameter(f"option of backend {self.__name__}", next(iter(options)), self.OPTIONS)
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
            self._refuse(gm, self._check(gm, precision, inductor, "joint"))   # Dynamo's graph, whole
            part = functools.partial(self._compile, precision=precision, inductor=inductor)
            return torch_private.aot_autograd(functools.partial(part, part="forward"),
                                       functools.partial(part, part="backward"))(gm, example_inputs)
        return self._compile(gm, example_inputs, precision, inductor)

    def _check(self, gm, precision, inductor: bool, part: str) -> GraphCheck:
        check = GraphCheck(self.target.name, precision.name, sum(n.op == "call_function" for n in gm.graph.nodes),
                           runs="inductor" if inductor else "eager", part=part)
        self.checks.append(check)
        return check

    def _compile(self, gm, example_inputs, precision, inductor: bool, part: str = "inference"):
        start = time.perf_counter()
        check = self._check(gm, precision, inductor, part)
        self._refuse(gm, check)
        traced = self._retrace(gm, example_inputs, precision, check)
        traced, hoisted = _Hoisted.split(traced, example_inputs, self._rounded)
        check.check_seconds = time.perf_counter() - start
        if not inductor:   # the retraced graph itself: the target's casts and rounding are its nodes
            return hoisted.wrap(traced) if hoisted else traced
        start = time.perf_counter()
        compiled = torch_private.compile_with_inductor(
            traced, [*example_inputs, *(hoisted.values(example_inputs) if hoisted else ())])
        check.inductor_seconds = time.perf_counter() - start
        return hoisted.wrap(compiled) if hoisted else compiled

    def _refuse(self, gm, check: GraphCheck) -> None:
        t = self.target
        graph_shapes.without_asserted_reads(gm)
        node = next((n for n in gm.graph.nodes if graph_shapes.symbolic(n.meta.get("example_value"))), None)
        if t.static_shapes and node is not None:
            trace = node.meta.get("stack_trace")
            # the first frame outside torch names the user's or the library's line, not torch's own (F.pad's)
            found = owners.innermost(owners.from_trace(trace))
            where = {k: v for k, v in found.items() if k != "line_key"} if found else _from_trace(trace)
            at = where_text(where) if where else "input " + node.name
            if graph_shapes.data_dependent(node.meta.get("example_value")):
                size = graph_shapes.DATA_DEPENDENT_SIZE.format(at)
                check.refused = f"{t.dynamic_shape_error} ({self.__name__}, emulated: {size}"
            else:
                # portkit compiles with dynamic=False at fixed input shapes: a symbolic size left is not the inputs'
                check.refused = (f"{t.dynamic_shape_error} ({self.__name__}, emulated: symbolic shape in {at}). "
                                 f"{t.title} compiles static shapes only; tried: torch.compile(..., dynamic=False) at "
                                 "fixed input shapes, still symbolic, so padding the inputs does not help: the size "
                                 "follows something other than the input shapes there")
            raise CompileRefused(check.refused, where)

    def _retrace(self, gm, example_inputs, precision, check: GraphCheck) -> torch.fx.GraphModule:
        log, mode = _OpLog(dtypes=self.contents is not None), numerics.emulate(self.target, precision)
        # Mode order: the op log (entered last) sees the model's own ops first; the numerics mode turns
        # each into the target's form (casts, rounding); the recorder, below both, writes that form
        # into the new graph. preserve_node_meta carries each Dynamo node's stack trace along. Outside
        # Dynamo's tracing context, so the fake mode is a static-shape one of its own.
        with torch_private.outside_dynamo_tracing():
            fake = torch_private.fake_tensor_mode()
            recorder = _AtenRecorder(fake, example_inputs)
            with fx_traceback.preserve_node_meta(), torch.no_grad(), fake, recorder, mode, log:
                out = torch.fx.Interpreter(gm).run(*recorder.inputs)
        check.aten_calls = sum(log.calls.values())
        for (op, _), count in log.calls.items():
            check.ops[op] = check.ops.get(op, 0) + count
        table = specs.detect(self.target.name).op_table
        check.not_lowered = _not_lowered(log.calls, table)
        check.decomposed = _decomposed(log.calls, table)
        check.numerics = dict(mode.stats)
        check.foreign_ops = _foreign(log, table)
        if self.contents is not None:
            self.contents.append(owners.graph_contents(log.calls, log.dtypes))
        return recorder.graph_module(out)


class _AtenRecorder(torch_private.TorchDispatchMode):
    """Writes every ATen call that reaches it into an FX graph, on fake tensors: the retrace.

    What make_fx(tracing_mode="fake") records for an inference graph of static shapes, without its
    proxies, decompositions and symbolic machinery (several times slower on a MiniLM graph, measured):
    each fake tensor is known by identity and maps to the node that made it; a tensor that no node
    made is a constant of the graph (a real tensor held by Dynamo's graph module)."""

    def __init__(self, fake, example_inputs):
        super().__init__()
        self.graph, self.constants = torch.fx.Graph(), {}
        self.nodes: dict[int, tuple[torch.fx.Node, torch.Tensor]] = {}   # id -> (node, tensor kept alive)
        self.inputs = []
        for i, x in enumerate(example_inputs):
            node = self.graph.placeholder(f"arg{i}")
            if isinstance(x, torch.Tensor):
                x = fake.from_tensor(x, static_shapes=True)
                node.meta["val"] = x
                self.nodes[id(x)] = (node, x)
            self.inputs.append(x)

    def _arg(self, value):
        if isinstance(value, torch.Tensor):
            if id(value) not in self.nodes:   # a constant: kept with the graph, as make_fx does
                name = f"_tensor_constant{len(self.constants)}"
                self.constants[name] = value
                self.nodes[id(value)] = (self.graph.get_attr(name), value)
            return self.nodes[id(value)][0]
        if isinstance(value, (list, tuple)):
            return type(value)(self._arg(v) for v in value)
        return value

    def _track(self, value, node):
        if isinstance(value, torch.Tensor):
            node.meta["val"] = value
            self.nodes[id(value)] = (node, value)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim":   # prim::device, prim::layout: metadata queries, nothing to record
            return func(*args, **kwargs)
        # A composite op (aten::to, aten::matmul) is recorded as the ops it runs, as make_fx does:
        # they are what a compiler sees (the parameters' casts are aten::_to_copy, see _Hoisted).
        with self:
            decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            return decomposed
        node = self.graph.call_function(func, self._arg(tuple(args)), {k: self._arg(v) for k, v in kwargs.items()})
        out = func(*args, **kwargs)
        if isinstance(out, (list, tuple)):
            for i, value in enumerate(out):
                if isinstance(value, torch.Tensor):
                    self._track(value, self.graph.call_function(operator.getitem, (node, i)))
        else:
            self._track(out, node)
        return out

    def graph_module(self, out) -> torch.fx.GraphModule:
        self.graph.output(self._arg(out) if isinstance(out, (list, tuple)) else (self._arg(out),))
        self.graph.eliminate_dead_code()   # results nothing reads (fused attention's logsumexp)
        _merge_repeats(self.graph)
        root = torch.nn.Module()
        for name, value in self.constants.items():
            root.register_buffer(name, value)
        return torch.fx.GraphModule(root, self.graph)


def _merge_repeats(graph: torch.fx.Graph) -> None:
    """One node for an op repeated on the same inputs, e.g. the target's rounding of one activation
    that feeds the query, key and value projections: the eager graph pays each cast once. Only in a
    graph that writes into no tensor (where sharing a result cannot change what a later op reads) and
    only for deterministic ATen ops."""
    ops = [n for n in graph.nodes if n.op == "call_function"]
    if any(torch_private.is_op_overload(n.target) and torch_private.op_schema(n.target).is_mutable for n in ops):
        return
    seen: dict = {}
    for node in ops:
        if not torch_private.is_op_overload(node.target) or torch.Tag.nondeterministic_seeded in node.target.tags:
            continue
        key = (node.target, _hashable(node.args), _hashable(node.kwargs))
        try:
            first = seen.setdefault(key, node)
        except TypeError:   # an argument that cannot be compared by value
            continue
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_hashable(v) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (bool, int, float, complex)):   # 1, 1.0 and True promote differently
        return (type(value).__name__, repr(value))      # repr: nan equals nan, -0.0 is not 0.0
    return value


class _Hoisted:
    """The target's casts of parameters, computed outside the compiled graph: an inference graph's
    weights are rounded once and reused while they stay the same tensors at the same version, instead
    of on every call (the target's matmul unit converts them for free). The rounded copies are
    shared by every graph of one backend (a storm of shapes holds one copy)."""
    KEEP = 4   # parameter sets whose rounded copies a backend keeps

    def __init__(self, pre: torch.fx.GraphModule, positions: list[int], cache: collections.OrderedDict):
        self.pre, self.positions, self.cache, self.code = pre, positions, cache, pre.code

    @classmethod
    def split(cls, traced: torch.fx.GraphModule, example_inputs, cache) -> tuple:
        graph = traced.graph
        placeholders = list(graph.find_nodes(op="placeholder"))
        params = [p for p, x in zip(placeholders, example_inputs) if isinstance(x, torch.nn.Parameter)]
        fixed = set(params)   # nodes computed from parameters alone
        for node in graph.nodes:
            if node.op == "call_function" and node.all_input_nodes and all(a in fixed for a in node.all_input_nodes):
                fixed.add(node)
        frontier = [n for n in graph.nodes if n in fixed and n.target is _CAST and any(u not in fixed for u in n.users)]
        if not frontier:
            return traced, None
        needed, todo = set(), list(frontier)
        while todo:
            node = todo.pop()
            if node not in needed and node.op == "call_function":
                needed.add(node)
                todo.extend(node.all_input_nodes)
        pre = torch.fx.Graph()
        env = {p: pre.placeholder(p.name) for p in params}
        for node in graph.nodes:
            if node in needed:
                env[node] = pre.node_copy(node, lambda a: env[a])
        pre.output(tuple(env[n] for n in frontier))
        last = placeholders[-1]
        for i, node in enumerate(frontier):   # each rounded parameter becomes an input after the others
            with graph.inserting_after(last):
                last = graph.placeholder(f"portkit_rounded_{i}")
            node.replace_all_uses_with(last)
        graph.eliminate_dead_code()
        traced.recompile()
        return traced, cls(torch.fx.GraphModule(traced, pre), [placeholders.index(p) for p in params], cache)

    def values(self, args) -> list[torch.Tensor]:
        params = [args[i] for i in self.positions]
        key = (self.code, tuple(id(p) for p in params))
        entry = self.cache.get(key)
        if entry is None or any(a is not b or torch_private.tensor_version(a) != v
                                for a, (b, v) in zip(params, entry[0])):
            with torch.no_grad():
                entry = self.cache[key] = ([(p, torch_private.tensor_version(p)) for p in params],
                                           list(self.pre(*params)))
            while len(self.cache) > self.KEEP:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return entry[1]

    def wrap(self, compiled):
        return lambda *args: compiled(*args, *self.values(args))


def emulated_backend(target: str, precision=None, inductor: bool = False) -> EmulatedBackend:
    """A fresh emulated backend for `target` (its own record of checks), e.g. with another precision."""
    return EmulatedBackend(specs.get(target), precision, inductor)


# One instance per target, module-level so that the entry points (pyproject.toml) can name them;
# tests/targets/test_backends_entrypoint.py checks the two lists agree.
portkit_neuron = EmulatedBackend(specs.get("neuron"))
portkit_tpu = EmulatedBackend(specs.get("tpu"))
REGISTERED: dict[str, EmulatedBackend] = {"neuron": portkit_neuron, "tpu": portkit_tpu}


ENTRY_POINTS = "torch_dynamo_backends"   # the group Dynamo reads backend names from (pyproject.toml)


def register() -> list[str]:
    """Register with Dynamo the backend names it does not already know, and return them. Idempotent:
    names from the entry points (installed package), or from an earlier call, are left alone, so the
    registry's "duplicate name" assertion cannot fire when an entry point loads this module. Where the
    entry points name every backend, Dynamo (whose import takes seconds) is not imported here."""
    import importlib.metadata
    points = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}
    missing = [b for b in REGISTERED.values() if b.__name__ not in points]
    known = torch_private.known_backends() if missing else points   # Dynamo's own list includes the entry points
    added = [b for b in missing if b.__name__ not in known]
    for backend in added:
        torch_private.register_backend(backend, name=backend.__name__)
    return [b.__name__ for b in added]


register()   # a no-op where the package is installed (the entry points own the names)


# ---------------------------------------------------------------- counting compiles
@dataclass
class CompileEvent:
    index: int
    request: int | None          # the request that caused it (None outside a stream)
    seconds: float               # time inside the backend
    shapes: dict[str, list]      # the graph's user inputs
    nodes: int
    cache_hit: bool              # Inductor served it from its FX graph cache
    check: GraphCheck | None = None


class CompileCounter:
    """Wraps a backend and records every graph it compiles: the ground truth for compiles, since
    torch 2.13 never increments counters["recompiles"] (checked)."""

    def __init__(self, backend):
        self.backend = torch_private.backend_by_name(backend) if isinstance(backend, str) else backend
        self.__name__ = getattr(self.backend, "__name__", type(self.backend).__name__)
        self.events: list[CompileEvent] = []
        self.request: int | None = None

    def __call__(self, gm, example_inputs, **kwargs):
        hits, start = torch_private.inductor_cache_hits(), time.perf_counter()
        compiled = self.backend(gm, example_inputs, **kwargs)
        seconds = time.perf_counter() - start
        shapes = {}
        for node in gm.graph.find_nodes(op="placeholder"):
            name, value = torch_private.graph_input_name(node), node.meta.get("example_value")
            if name is not None and isinstance(value, torch.Tensor):
                shapes[name] = [s if isinstance(s, int) else str(s) for s in value.shape]
        checks = getattr(self.backend, "checks", None)
        self.events.append(CompileEvent(len(self.events), self.request, seconds, shapes,
                                        sum(n.op == "call_function" for n in gm.graph.nodes),
                                        torch_private.inductor_cache_hits() > hits, checks[-1] if checks else None))
        return compiled


def compile_failure(exc: BaseException, request: int | None = None) -> dict:
    """Why and where a compile failed, from Dynamo's or portkit's exception (not a traceback): kind ("refused":
    the target's CompileRefused; "graph break"; else the exception's type), its first line, Dynamo's explanation and
    hint, the source frame. The one reading of a compile's exception: stage 2 records it, stage 3 reports it."""
    inner = getattr(exc, "inner_exception", None) or exc
    where, stack = getattr(inner, "where", None), getattr(exc, "real_stack", None)
    if where is None and stack:
        where = owners.place(stack[-1].filename, stack[-1].lineno, stack[-1].name, stack[-1].line or "")
    lines = [ln.strip() for ln in str(inner).strip().splitlines() if ln.strip()]
    field_of = lambda label: next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(label)), "")  # noqa: E731
    kind = ("refused" if isinstance(inner, CompileRefused) else
            "graph break" if torch_private.is_graph_break(exc) else type(inner).__name__)
    return {"kind": kind, "message": lines[0] if lines else type(inner).__name__,
            "explanation": field_of("Explanation:"), "hint": field_of("Hint:"), "where": where, "request": request}


def failure_text(f: dict) -> str:
    """A compile_failure in one line: kind, message, explanation, where."""
    return f"{f['kind']}: {f['message']}" + (f" ({f['explanation']})" if f.get("explanation") else "") + \
        f" at {where_text(f['where'])}"


# A size read from tensor values (an unbacked SymInt): no compile option or padding to fixed shapes removes it.
DATA_DEPENDENT_ADVICE = (
    "compute the size from static metadata (.shape or a config value) or pass it as a Python int argument; or "
    "mark the region with torch._check / torch._check_is_size and torch.compiler guards (PyTorch docs, Backed vs "
    "Unbacked Symints: docs.pytorch.org/docs/main/compile/dynamic_shapes_backed_unbacked.html)")


def refusal_advice(text: str, where: dict | None, compiled: str) -> str:
    """The advice on a refusal of the target's compiler that portkit met compiling `compiled` with dynamic=False at
    fixed shapes (e.g. "one fixed input shape"): a size read from values is DATA_DEPENDENT_ADVICE; anything else
    was refused at fixed shapes already, so the advice says that was tried, never to make the shapes static. The one
    wording of this advice for every stage that meets a refusal."""
    if "data-dependent size at" in text:
        return DATA_DEPENDENT_ADVICE
    return (f"tried: torch.compile(dynamic=False) at {compiled}, still refused, so padding to fixed shapes does not "
            "help; change the code the compiler names" + (f" at {where_text(where)}" if where else ""))


def compile_cause(what: str, where: dict | None, text: str) -> str:
    """A compile failure's cause (core.findings.cause_key): "refused" or the failure's kind, at its source line;
    without a line, the start of its message. Stages 2 and 3 give the one refusal this one cause."""
    return cause_key("compile", what, where) + ("" if where else f": {text[:120]}")


# What torch 2.13 raises when set_stance("fail_on_recompile") refuses a compile: a plain RuntimeError
# with this text, then the guard failures one per line as "- 0/1: <guard>" (torch/_dynamo/eval_frame.py,
# _callback_from_stance). No exception class marks it, so the text is the only way to tell it apart.
RECOMPILE_REFUSED = "Detected recompile when torch.compile stance is 'fail_on_recompile'"


def refused_recompile(exc: BaseException) -> list[str] | None:
    """The guard failures behind a compile that fail_on_recompile refused, in Dynamo's words (one per
    compiled graph of the function), or None when exc is any other error."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not text.startswith(RECOMPILE_REFUSED):
        return None
    return [re.sub(r"^-\s+(\d+/\d+: )?", "", line.strip()) for line in text.splitlines()
            if line.strip().startswith("- ")]


def call_counting_recompiles(call, inputs: dict, late: list[dict], request: int | None = None):
    """call(inputs) under the caller's set_stance("fail_on_recompile"). Where the stance refuses a
    compile, the refusal is appended to `late` (request, input shapes, the guard failures behind it)
    and the call is made again with the stance lifted, so the compile is paid, counted by the
    backend's CompileCounter, and the run goes on instead of stopping at the first one."""
    try:
        return call(inputs)
    except RuntimeError as exc:
        guards = refused_recompile(exc)
        if guards is None:
            raise
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    late.append({"request": request, "shapes": shapes, "shape": next(iter(shapes.values()), None),
                 "guard_failures": guards, "reason": guards[0] if guards else RECOMPILE_REFUSED})
    # Past Dynamo's recompile limit the call would run eagerly and nothing would be counted: this
    # compile is to be paid, whatever the number of shapes warmed up before it.
    with torch.compiler.set_stance("default"), torch_private.unlimited_recompiles():
        return call(inputs)


@functools.cache
def warm_inductor() -> float:
    """Compile a one-op function once per process, so that Inductor's C++ toolchain start-up
    (precompiled header, compile workers: a cold start far longer than a small graph's compile) is not charged to a real
    compile. Only for paths that compile with Inductor (backend="inductor", an emulated backend with
    inductor=True): the emulated backends' default runs no code generation."""
    start = time.perf_counter()
    torch.compile(lambda x: x * 2 + 1, backend="inductor", dynamic=False)(torch.ones(8))
    torch.compiler.reset()
    return time.perf_counter() - start
