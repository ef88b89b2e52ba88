"""Lowerings portkit adds to torchax for ATen ops its release does not lower, each to the JAX primitive
XLA itself compiles for that computation, so the compiler judges the model rather than the converter.

    >>> from portkit.tpu_compile import lowerings
    >>> lowerings.register()      # once, before torchax's environment loads its op table

- aten::_grouped_mm (PyTorch's grouped GEMM; transformers' mixture-of-experts layers call it through
  torch.nn.functional.grouped_mm, transformers/integrations/moe.py): a 2-D input against a 3-D stack of
  expert weights, rows grouped by the cumulative ends in `offs`, is jax.lax.ragged_dot with group sizes
  diff(offs) (https://docs.jax.dev/en/latest/_autosummary/jax.lax.ragged_dot.html); a 3-D input against
  a 3-D stack without `offs` is a batched matmul. The other layouts (ragged K, used by weight gradients)
  stay unlowered, so torchax's "NO LOWERING" still names them.
- transformers::grouped_mm_fallback (the custom op transformers registers for the same product where PyTorch's
  grouped GEMM does not apply, e.g. float32 weights on the CPU; a loop over the experts with a host read of
  `offs`): the same lowering, so a graph traced on the CPU lowers as the grouped GEMM it stands for.
- aten::copy_ from a view (a state-space cache layer keeps the last positions of its conv states:
  `conv_states.copy_(full[..., -k:])`, transformers' LinearAttentionLayer): torchax's copy_ reads the source's
  array, which a view of its keeps lazily; the view is materialized first, then torchax's own copy_ runs.
"""
from __future__ import annotations

import torch

LOWERED = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")     # aten::copy_ is torchax's, extended


def _grouped_mm(jnp, lax):
    def lower(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if bias is not None:
            raise NotImplementedError("aten::_grouped_mm with a bias has no lowering in portkit")
        if mat_a.ndim == 2 and mat_b.ndim == 3 and offs is not None:
            sizes = jnp.diff(offs.astype(jnp.int32), prepend=jnp.zeros((1,), jnp.int32))
            result = lax.ragged_dot(mat_a, mat_b, sizes)
        elif mat_a.ndim == 3 and mat_b.ndim == 3 and offs is None:
            result = jnp.matmul(mat_a, mat_b)
        else:
            raise NotImplementedError(f"aten::_grouped_mm of a {mat_a.ndim}-D by a {mat_b.ndim}-D input"
                                      f"{' with' if offs is not None else ' without'} offs has no lowering in portkit")
        return result if out_dtype is None else result.astype(_jax_dtype(out_dtype))
    return lower


def _copy_from_view(ops_registry) -> None:
    """torchax's aten::copy_ entry, its function wrapped to materialize a view source first (replaced in place: a
    second registration would log a duplicate)."""
    import dataclasses
    from torchax.ops import jaten  # noqa: F401 (its table first: the entry replaced below is the one it registers)
    from torchax.view import View
    entry = ops_registry.all_aten_ops[torch.ops.aten.copy_]
    torchax_copy = entry.func
    if getattr(torchax_copy, "portkit_view_source", False):
        return

    def copy(x, y, memory_format=None, env=None):
        return torchax_copy(x, y.torch() if isinstance(y, View) else y, memory_format, env=env)
    copy.portkit_view_source = True
    ops_registry.all_aten_ops[torch.ops.aten.copy_] = dataclasses.replace(entry, func=copy)


def _jax_dtype(dtype):
    from torchax.ops import mappings
    return mappings.t2j_dtype(dtype)


def register() -> None:
    """Add portkit's lowerings to torchax's op registry (read when its environment is first made)."""
    import jax.numpy as jnp
    from jax import lax
    from torchax.ops import ops_registry
    ops_registry.register_torch_dispatch_op(torch.ops.aten._grouped_mm.default, _grouped_mm(jnp, lax))
    _copy_from_view(ops_registry)
    try:
        import transformers.integrations.moe  # noqa: F401 (registers transformers::grouped_mm_fallback)
        fallback = torch.ops.transformers.grouped_mm_fallback.default
    except (ImportError, AttributeError, RuntimeError):     # no transformers, or a release without the op
        return
    ops_registry.register_torch_dispatch_op(fallback, _grouped_mm(jnp, lax))
