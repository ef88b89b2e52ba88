"""What a static-shape target refuses in a captured graph: a symbolic shape, and among those the sizes read from a
tensor's values; and the runtime asserts that read values without sizing anything, which it does not refuse.

    >>> from portkit.targets import graph_shapes
    >>> graph_shapes.without_asserted_reads(gm)       # the asserts removed, with what only they used
    >>> any(graph_shapes.symbolic(n.meta.get("example_value")) for n in gm.graph.nodes)
"""
from __future__ import annotations

import torch

from portkit.core import torch_private


# A runtime assert Dynamo writes into the graph for an `assert` on a value read from a tensor (flaubert's
# `assert lengths.max().item() <= slen`: item -> le -> aten._assert_scalar). The read sizes nothing: it is a host read,
# stage 1's finding, not a dynamic shape.
ASSERTS = (torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.default,
           torch.ops.aten._assert_async.msg)


def without_asserted_reads(gm: torch.fx.GraphModule) -> int:
    """Remove the graph's runtime asserts (ASSERTS) and what only they used (the read and the comparison), in place;
    the number removed. The target's checks then see what the graph computes: a value read from a tensor that
    sizes or feeds anything else stays, and is refused as before."""
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in ASSERTS]
    for node in found:
        gm.graph.erase_node(node)
    if found:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return len(found)


def symbolic(value) -> bool:
    """Whether a graph value is symbolic: a symbolic number, or a tensor with a symbolic size."""
    for leaf in torch_private.tree_leaves(value):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                isinstance(leaf, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in leaf.shape)):
            return True
    return False


# A size read from a tensor's values (.item(), .tolist(), int(tensor)) is an unbacked symbol: no compile option
# or padding of the inputs makes it static. The fixes, from PyTorch's "Backed vs Unbacked Symints" and
# "Troubleshooting GuardOnDataDependentSymNode Errors" (docs.pytorch.org/docs/main/compile/
# dynamic_shapes_backed_unbacked.html): compute the size from static metadata, or bound it with torch._check.
DATA_DEPENDENT_SIZE = (
    "data-dependent size at {}; a value read from a tensor with .item(), .tolist() or int(tensor) is used as a "
    "size, so the graph's shape is known only at run time; torch.compile(dynamic=False), which portkit already "
    "uses, and padding the inputs to buckets cannot make it static). Compute the size from static metadata "
    "(.shape or a config value) or pass it as a Python int argument; or mark the region with torch._check / "
    "torch._check_is_size and torch.compiler guards (PyTorch docs, Backed vs Unbacked Symints: "
    "docs.pytorch.org/docs/main/compile/dynamic_shapes_backed_unbacked.html)")


def data_dependent(value) -> bool:
    """Whether a symbolic value's shape rests on an unbacked symbol: a size read from a tensor's values."""
    return torch_private.unbacked_sizes(value)
