"""Stage 2's named cause of a recompile storm: a Python loop over the input length.

    >>> from portkit.stages.compile import loops
    >>> loops.source_loops(model.module)[0]["text"]    # loops whose trip count reads an input's size
    '.../chunked.py:14 in forward: for start in range(0, x.shape[-1], 512):'
    >>> storm.loop                                      # set by storm.py where both signals agree, else None

Dynamo traces Python into a linear sequence of tensor operations guarded by the sizes it read (PyTorch docs,
"Dynamo Core Concepts": docs.pytorch.org/docs/stable/compile/programming_model.dynamo_core_concepts.html), so a
`for` over range(x.shape[-1] ...) is unrolled, and under dynamic=False every length is a new graph holding one
copy of the body per chunk. Both signals are read, neither guessed alone: the storm's compiled graphs follow
the length (graph_growth: they change more often than one shape-dependent branch changes them, growing with
the chunks or shrinking and growing again with a remainder loop), and a forward of the model's
modules, or a function it calls (its own module's, or an imported one that is not torch's: transformers'
apply_chunking_to_forward), loops on an input's .shape, .size(), .numel(), len(), .split() or .chunk() pieces
(source_loops). What is the model's code, not machinery, is portkit.core.owners' rule.
"""
from __future__ import annotations

import ast
import functools
import inspect
import math
from pathlib import Path

from torch import nn

from portkit.core import owners

# The cause as findings name it (core.findings.cause_key's subject), and what the model's author can do instead.
CAUSE = "a Python loop over the input length: one graph per length"
ADVICE = ("declare a streaming step instead (portkit.models.audio.StreamStep), or vectorise the loop (reshape "
          "into chunks and run them as a batch), or pad the input to a fixed number of chunks")
# A size read: the attribute or method that gives a tensor's size along a dimension (or all of them).
SIZE_ATTRIBUTES = ("shape",)
SIZE_METHODS = ("size", "numel")
# Pieces of a tensor whose number follows its size: x.split(512, dim=-1) is ceil(length / 512) chunks.
PIECE_METHODS = ("split", "unbind", "tensor_split", "chunk")
# Wrappers whose iteration is their arguments' pieces: zip(*chunks), enumerate(chunks), tuple(...) of pieces.
PIECE_WRAPPERS = ("zip", "enumerate", "tuple", "list", "reversed")
# Loops in libraries' code that a setting switches off, by the function that holds the loop: transformers chunks
# a layer's feed-forward over the sequence where the config's chunk_size_feed_forward > 0
# (transformers/pytorch_utils.py: apply_chunking_to_forward).
LIBRARY_SETTINGS = {"apply_chunking_to_forward": "set the model config's chunk_size_feed_forward to 0 (transformers "
                                                 "then runs the feed-forward over the whole sequence at once)"}
# The loops Dynamo unrolls: for, while, and the comprehensions that stand for a for.
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
FOLLOW_DEPTH = 3     # functions followed from a forward: forward -> helper -> its helper


@functools.lru_cache(maxsize=64)
def _parsed(file: str, modified: int) -> tuple[ast.Module, tuple[str, ...]] | None:
    try:
        text = Path(file).read_text(errors="replace")
        return ast.parse(text, filename=file), tuple(text.splitlines())
    except (OSError, SyntaxError, ValueError):
        return None


def _tree(file: str) -> tuple[ast.Module, tuple[str, ...]] | None:
    """A source file parsed once per version (a notebook's model file may be edited between runs), with its
    lines; None where it cannot be read."""
    try:
        return _parsed(file, Path(file).stat().st_mtime_ns)
    except OSError:
        return None


def _definition(fn) -> tuple[ast.FunctionDef, str, tuple[str, ...]] | None:
    """The `def` of a Python function in its file's syntax tree, with the file and its lines."""
    code = getattr(fn, "__code__", None)
    file = code.co_filename if code is not None else None
    parsed = _tree(file) if file and not file.startswith("<") else None
    if parsed is None:
        return None
    tree, lines = parsed
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if code.co_firstlineno in (first, node.lineno):
                return node, file, lines
    return None


def _names(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _targets(target) -> list[str]:
    """The names an assignment (or a for) binds: a, (a, b), [a, *rest]."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _targets(elt)]
    return []


class _Taint:
    """Which names of one function hold an input (a tensor derived from its arguments) and which hold an
    input's size, propagated through its assignments to a fixed point (order-free: a conservative reading)."""

    def __init__(self, fn_node: ast.FunctionDef):
        args = fn_node.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        self.tensors = {p for p in params if p not in ("self", "cls")}
        self.sizes: set[str] = set()
        self.piece_names: set[str] = set()     # names bound to an input's pieces (x.chunk(n), as many as its size)
        bindings = []
        for node in ast.walk(fn_node):
            if isinstance(node, ast.Assign):
                bindings += [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                bindings.append((node.target, node.value))
            elif isinstance(node, ast.comprehension):     # `for t in inputs` binds t to an input
                bindings.append((node.target, node.iter))
        changed = True
        while changed:
            changed = False
            for target, value in bindings:
                into = self.sizes if self.reads_size(value) else self.piece_names if self.pieces(value) \
                    else self.tensors if _names(value) & self.tensors else None
                new = set(_targets(target)) - (into if into is not None else set())
                if into is not None and new:
                    into |= new
                    changed = True

    def mentions_input(self, node) -> bool:
        return bool(_names(node) & self.tensors)

    def reads_size(self, node) -> bool:
        return self.size_read(node) is not None

    def size_read(self, node) -> ast.AST | None:
        """Where the expression reads an input's size: x.shape[-1], x.size(-1), x.numel(), len(x), or a name
        bound to one of those; None where it reads none."""
        for n in ast.walk(node):     # outer nodes first: x.shape[-1] before x.shape
            if isinstance(n, ast.Name) and n.id in self.sizes:
                return n
            shape = n.value if isinstance(n, ast.Subscript) else n
            if isinstance(shape, ast.Attribute) and shape.attr in SIZE_ATTRIBUTES and self.mentions_input(shape.value):
                return n
            if isinstance(n, ast.Call):
                func = n.func
                if isinstance(func, ast.Attribute) and func.attr in SIZE_METHODS and self.mentions_input(func.value):
                    return n
                if isinstance(func, ast.Name) and func.id == "len" and n.args and self.mentions_input(n.args[0]):
                    return n
        return None

    def pieces(self, node) -> bool:
        """Whether the expression is an input's pieces, as many as its size has: x.split(512), torch.split(x, 512),
        x.chunk(x.shape[1] // 4), a name bound to those, zip(*pieces), a tuple of them."""
        if isinstance(node, ast.Name):
            return node.id in self.piece_names
        if isinstance(node, ast.Starred):
            return self.pieces(node.value)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            return self.pieces(node.elt)
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Name) and func.id in PIECE_WRAPPERS:
            return any(self.pieces(a) for a in node.args)
        if not isinstance(func, ast.Attribute) or func.attr not in PIECE_METHODS:
            return False
        if func.attr == "chunk":     # x.chunk(n): n pieces, a length's only where n reads the size
            return self.mentions_input(func.value) and any(self.reads_size(a) for a in node.args[:1])
        return self.mentions_input(func.value) or any(self.mentions_input(a) for a in node.args[:1])

    def loop_reads(self, node) -> ast.AST | None:
        """The expression by which a loop's trip count follows an input's size, or None: a for, a while, or a
        comprehension (Dynamo unrolls [f(c) for c in x.split(512)] as it does the for it stands for)."""
        if isinstance(node, ast.While):
            return self.size_read(node.test)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            iters = [node.iter]
        else:
            iters = [g.iter for g in getattr(node, "generators", ())]
        for it in iters:
            if found := self.size_read(it) or (it if self.pieces(it) else None):
                return found
        return None


def _callees(fn, fn_node: ast.FunctionDef, owner_cls) -> list:
    """The Python functions `fn` calls: self.method(...) of its class, name(...) of its module, and a function
    it imports that is the model's code or a library's (transformers' apply_chunking_to_forward), not torch's."""
    found = []
    module = getattr(fn, "__module__", None)
    scope = getattr(fn, "__globals__", {})
    for node in ast.walk(fn_node):
        if not isinstance(node, ast.Call):
            continue
        func, callee = node.func, None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            callee = inspect.getattr_static(owner_cls, func.attr, None) if owner_cls is not None else None
            callee = getattr(callee, "__func__", callee)        # a staticmethod or classmethod
        elif isinstance(func, ast.Name):
            callee = scope.get(func.id)
        if inspect.isfunction(callee) and (callee.__module__ == module or _models_code(callee)):
            found.append(callee)
    return found


def _function_loops(fn, owner_cls, seen: set, depth: int = 0) -> list[dict]:
    """The length loops of `fn` and of the functions it calls from its own module (FOLLOW_DEPTH deep)."""
    code = getattr(fn, "__code__", None)
    if code is None or code in seen or depth > FOLLOW_DEPTH:
        return []
    seen.add(code)
    found = _definition(fn)
    if found is None:
        return []
    node, file, lines = found
    taint = _Taint(node)
    out = []
    for loop in ast.walk(node):
        reads = taint.loop_reads(loop) if isinstance(loop, LOOPS) else None
        if reads is not None:
            line = loop.lineno
            where = owners.place(file, line, node.name, lines[line - 1] if 0 < line <= len(lines) else "")
            out.append({**where, "reads": ast.unparse(reads), "setting": LIBRARY_SETTINGS.get(node.name)})
    for callee in _callees(fn, node, owner_cls):
        out += _function_loops(callee, owner_cls, seen, depth + 1)
    return out


def _models_code(fn) -> bool:
    """Whether `fn` is the model's code, not machinery (torch, portkit's own): portkit.core.owners' rule."""
    code = getattr(fn, "__code__", None)
    return code is not None and owners.innermost([owners.place(code.co_filename, code.co_firstlineno,
                                                               code.co_name)]) is not None


def source_loops(module: nn.Module) -> list[dict]:
    """Every for/while loop in the forward of the model's modules (and the functions each calls from its own
    module) whose trip count follows an input's size: each a owners.place with "reads", the expression read;
    ordered by file and line, each once."""
    seen: set = set()
    found: dict[str, dict] = {}
    for cls in dict.fromkeys(type(m) for m in module.modules()):
        forward = inspect.getattr_static(cls, "forward", None)
        # the def itself, under a decorator that wraps it (transformers' gradient-checkpointing layers do)
        forward = inspect.unwrap(forward) if inspect.isfunction(forward) else forward
        if inspect.isfunction(forward) and _models_code(forward):
            for loop in _function_loops(forward, cls, seen):
                found.setdefault(owners.line_key(loop), loop)
    return sorted(found.values(), key=lambda w: (w["file"], w["line"]))


def _length(shape, varying: list[int]) -> int:
    return math.prod(shape[d] for d in varying) if varying else math.prod(shape)


def graph_growth(storm) -> dict | None:
    """The storm's compiled graphs against the length they were compiled for, where they follow it: the node
    counts (every graph a request compiled, together), ordered by length, change more often than one
    shape-dependent branch changes them (once, from one side to the other). Either they take three or more
    distinct values, or they change at two or more steps: a loop over whole chunks and one over the remainder
    gives 7 tokens one chunk and three remainder steps, 8 tokens two chunks, 13 tokens three and one, so the
    graphs shrink and grow again. With two lengths only, the longer one's graph is larger. The length: the
    product of the dimensions that vary across the requests. None: no such change."""
    nodes: dict[int, int] = {}
    for event in storm.compiles:
        if event.request is not None:
            nodes[event.request] = nodes.get(event.request, 0) + event.nodes
    shapes = {r["index"]: r["shape"] for r in storm.requests}
    compiled = [(shapes[i], n) for i, n in nodes.items() if i in shapes]
    if len(compiled) < 2 or len({len(s) for s, _ in compiled}) != 1:
        return None
    varying = [d for d in range(len(compiled[0][0])) if len({s[d] for s, _ in compiled}) > 1]
    by_length = sorted({_length(s, varying): n for s, n in compiled}.items())
    counts = [n for _, n in by_length]
    changes = sum(a != b for a, b in zip(counts, counts[1:]))
    if len(by_length) == 2 and counts[1] <= counts[0]:
        return None
    if len(by_length) > 2 and len(set(counts)) < 3 and changes < 2:
        return None
    return {"lengths": [length for length, _ in by_length], "nodes": counts}


def length_loop(module: nn.Module, storm) -> dict | None:
    """The loop over the input length behind the storm, where both signals agree (the module docstring):
    {"where": the first loop's place, "loops": every one found, "graphs": the storm's compiles (made and
    counted), "requests", "guard": the first guard failure behind a recompile, "lengths", "nodes": the compiled
    graphs' sizes by length}. None otherwise."""
    growth = graph_growth(storm) if storm.compile_count() > 1 else None
    found = source_loops(module) if growth else []
    if not found:
        return None
    guard = next((r["reason"] for r in storm.requests if r.get("reason")), None)   # Dynamo's: the size it guarded
    return {"where": found[0], "loops": found, "graphs": storm.compile_count(), "requests": len(storm.requests),
            "guard": guard, **growth}


def describe(loop: dict) -> str:
    """The loop and what it cost, in one clause: whose code, where, the graphs and how they grew."""
    lengths, nodes, where = loop["lengths"], loop["nodes"], loop["where"]
    if all(b >= a for a, b in zip(nodes, nodes[1:])):
        sizes = f"growing from {nodes[0]} nodes at length {lengths[0]} to {nodes[-1]} at length {lengths[-1]}"
    else:   # whole chunks and a remainder: the sizes go down and up again
        shown = ", ".join(f"{n} at {length}" for length, n in list(zip(lengths, nodes))[:6])
        sizes = f"their nodes by length {shown}{', ...' if len(lengths) > 6 else ''}"
    return (f"{owners.owner(where)['owner']} code at {where['text']}, whose count follows the input's size "
            f"({where['reads']}): Dynamo unrolls it into each graph, {loop['graphs']} graphs for {loop['requests']} "
            f"requests, {sizes}")
