"""A target's numerics on the CPU: its dtype rules and matmul precision, applied op by op.

    >>> from portkit.targets import numerics, specs
    >>> tpu = specs.get("tpu")
    >>> with numerics.emulate(tpu, "default") as mode:   # matmul operands rounded to bf16, fp32 accumulate
    ...     out = model(**inputs)
    >>> mode.stats                                       # what was changed, per kind
    Counter({'matmul operands rounded to bfloat16': 37, ...})

One `TorchDispatchMode` holds the whole emulation, so eager runs (stage 4) and the emulated compile
backends (stage 2, which trace a graph under it) apply the same rules from the same code:

- dtype rules, e.g. float64 -> float32: float64 inputs are cast down, the op runs, and its floating
  results are cast back up, as TorchNeuron's eager ops do; int64 -> int32 wraps values as a 32-bit
  device would.
- matmul precision: the operands of every matmul-like op (mm, bmm, addmm, baddbmm, convolution, and
  the two products inside fused attention) are rounded to bf16 before an fp32 matmul. A product of two
  bf16 values is exact in fp32, so this equals one bf16 MXU pass with fp32 accumulation (TorchTPU's
  default). `matmul_output` also rounds the result (Neuron --auto-cast=matmult); `all_ops` rounds every
  floating result (--auto-cast=all).
"""
from __future__ import annotations

import collections
import json
import math

import torch

from portkit.core.torch_private import TorchDispatchMode, op_schema
from portkit.targets.specs import DATA, Precision, Target

aten = torch.ops.aten
# op -> positions of the operands that enter the multiplier (bias and scalars stay fp32)
MATMUL_OPERANDS = {
    aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.matmul.default: (0, 1),
    aten.addmm.default: (1, 2), aten.baddbmm.default: (1, 2), aten.addbmm.default: (1, 2),
    aten.addmv.default: (1, 2), aten.mv.default: (0, 1), aten.dot.default: (0, 1),
    aten.convolution.default: (0, 1), aten._convolution.default: (0, 1),
    aten.mkldnn_convolution.default: (0, 1),
}
FUSED_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default
# Ops whose CPU kernel takes int64 indices only: their int64 arguments keep int64 with values wrapped to
# 32 bits (a 32-bit device's nll_loss reads int32 labels, its index_copy_ int32 positions -- transformers'
# StaticCache writes with it -- and its gather/scatter int32 indices; the CPU's kernels cannot).
LONG_INDICES = frozenset({aten.nll_loss_forward.default, aten.nll_loss_backward.default,
                          aten.nll_loss2d_forward.default, aten.nll_loss2d_backward.default,
                          aten.index_copy.default, aten.index_copy_.default, aten.gather.default,
                          aten.scatter.src, aten.scatter.value, aten.scatter_.src, aten.scatter_.value,
                          aten.scatter_add.default, aten.scatter_add_.default})

# How a model runs on the GPU today: the baseline stage 4 holds a target's error against (both measured
# against float64), emulated here like a target's precision. Sources: PyTorch docs,
# notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices (TF32 keeps 10 mantissa bits of the matmul
# operands, fp32 accumulation; torch.backends.cuda.matmul.allow_tf32, off by default since 1.12) and
# amp.html#cuda-ops-that-can-autocast-to-float16 (autocast runs matmul, linear, conv, baddbmm and attention
# in the low dtype and returns it; norms, softmax and reductions stay float32).
TF32 = "tfloat32"      # not a torch dtype: round_to keeps 10 mantissa bits of a float32
GPU_NUMERICS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "default (allow_tf32 off)", "float32 throughout"),
    Precision("tf32", "torch.backends.cuda.matmul.allow_tf32 = True (or set_float32_matmul_precision('high'))",
              "matmul operands rounded to TF32 (10 mantissa bits), fp32 accumulation", matmul_inputs=TF32),
    Precision("bf16_autocast", "with torch.autocast('cuda', dtype=torch.bfloat16)",
              "matmul operands and results in bf16 (autocast's low-precision op list), the rest float32",
              matmul_inputs=torch.bfloat16, matmul_output=torch.bfloat16),
    Precision("fp16_autocast", "with torch.autocast('cuda', dtype=torch.float16)",
              "matmul operands and results in fp16 (autocast's low-precision op list), the rest float32",
              matmul_inputs=torch.float16, matmul_output=torch.float16),
)}


def precision_cost(target: str, precision: str) -> dict | None:
    """A precision setting's matmul cost relative to the target's fastest, as the vendor documents it
    (data/targets/precision_costs.json: relative_matmul_cost, stated, source URL); None where not stated."""
    costs = json.loads((DATA / "precision_costs.json").read_text())["targets"]
    return costs.get(target, {}).get(precision)


def round_to(x: torch.Tensor, dtype: torch.dtype, layout=torch.preserve_format) -> torch.Tensor:
    """Round a floating tensor's values to `dtype` (round to nearest even) and keep its own dtype.
    layout=torch.contiguous_format also makes the copy contiguous (the same copies), which a batched
    matmul then reads without another copy. The narrowing keeps the tensor's own layout and the widening
    copy reorders: ATen's float32 -> bfloat16 conversion is several times slower through a permuted
    view (an attention head's query, say) than on contiguous memory."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == dtype:
        return x
    if dtype == TF32:
        return _round_tf32(x, layout) if x.dtype == torch.float32 else x
    return x.to(dtype).to(x.dtype, memory_format=layout)


def _round_tf32(x: torch.Tensor, layout) -> torch.Tensor:
    """A float32 tensor's values rounded to TF32 (10 of float32's 23 mantissa bits, to nearest even), as
    the tensor cores read matmul operands under allow_tf32; inf and nan are kept."""
    bits = x.clone(memory_format=layout).view(torch.int32)
    rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)
    return torch.where(x.isfinite(), rounded, x)


class NumericsMode(TorchDispatchMode):
    """Apply a target's dtype rules and one of its precisions to every ATen op."""

    def __init__(self, target: Target, precision: Precision):
        super().__init__()
        self.target, self.precision = target, precision
        self.casts = {rule.source: rule.result for rule in target.dtype_rules}
        self.stats: collections.Counter = collections.Counter()
        self.float64_ops: collections.Counter = collections.Counter()

    # -- dtype rules
    def _down(self, value, keep_int: bool = False):
        if isinstance(value, torch.Tensor) and value.dtype in self.casts:
            result = self.casts[value.dtype]
            if value.dtype.is_floating_point:
                return value.to(result)
            wrapped = value.to(result).to(value.dtype)   # wrap as a 32-bit device would
            return wrapped if keep_int else wrapped.to(result)
        if isinstance(value, torch.dtype) and value in self.casts:
            return self.casts[value]
        if isinstance(value, (list, tuple)):
            return type(value)(self._down(v, keep_int) for v in value)
        return value

    def _has_cast(self, args, kwargs) -> torch.dtype | None:
        for value in (*args, *kwargs.values()):
            items = value if isinstance(value, (list, tuple)) else (value,)
            for v in items:
                if isinstance(v, torch.Tensor) and v.dtype in self.casts:
                    return v.dtype
                if isinstance(v, torch.dtype) and v in self.casts:
                    return v
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view:
            # A view computes nothing, and must stay a view of the caller's tensor: in-place writes
            # through it (shifted[..., 1:] = ids[..., :-1] in T5's _shift_right) reach the base.
            return func(*args, **kwargs)
        wide = self._has_cast(args, kwargs)
        run_args, run_kwargs = args, kwargs
        if wide is not None:
            if wide == torch.float64:
                self.float64_ops[func.name()] += 1
            self.stats[f"{_name(wide)} ops run as {_name(self.casts[wide])}"] += 1
            keep = func in LONG_INDICES
            run_args, run_kwargs = self._down(args, keep), {k: self._down(v, keep) for k, v in kwargs.items()}
        if self.precision.all_ops is not None:
            run_args = tuple(_round_all(a, self.precision.all_ops) for a in run_args)
        out = self._compute(func, run_args, run_kwargs)
        written = _write_back(func, args, kwargs, run_args, run_kwargs, self.precision.all_ops)
        if written:   # in-place and out= ops return the caller's own tensors, now holding the result
            return written[0] if len(written) == 1 else tuple(written)
        return _restore(out, wide, self.casts[wide]) if wide is not None else out

    # -- precision
    def _compute(self, func, args, kwargs):
        p = self.precision
        if func is FUSED_ATTENTION and p.matmul_inputs is not None:
            self.stats[f"attention products rounded to {_name(p.matmul_inputs)}"] += 1
            out = _attention(*args, **kwargs, precision=p)
        elif func in MATMUL_OPERANDS and p.matmul_inputs is not None:
            positions = MATMUL_OPERANDS[func]
            args = tuple(round_to(a, p.matmul_inputs) if i in positions else a for i, a in enumerate(args))
            self.stats[f"matmul operands rounded to {_name(p.matmul_inputs)}"] += 1
            out = func(*args, **kwargs)
            if p.matmul_output is not None:
                out = round_to(out, p.matmul_output)
        else:
            out = func(*args, **kwargs)
        if p.all_ops is not None:
            out = _round_all(out, p.all_ops)
        return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _round_all(value, dtype):
    if isinstance(value, torch.Tensor):
        return round_to(value, dtype) if value.dtype == torch.float32 else value
    if isinstance(value, (list, tuple)):
        return type(value)(_round_all(v, dtype) for v in value)
    return value


def _write_back(func, args, kwargs, run_args, run_kwargs, round_all) -> list[torch.Tensor]:
    """An in-place or out= op wrote into cast or rounded copies of its arguments; put the values into
    the caller's tensors (T5's relative position buckets are summed with an in-place int64 add_)."""
    written = []
    for i, arg in enumerate(op_schema(func).arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        original, copy = (args[i], run_args[i]) if i < len(args) else (kwargs.get(arg.name), run_kwargs.get(arg.name))
        if isinstance(original, torch.Tensor) and isinstance(copy, torch.Tensor):
            if round_all is not None:
                copy = _round_all(copy, round_all)
            if copy is not original:
                if original.shape != copy.shape:   # out= tensors the op resized
                    original.resize_(copy.shape)
                original.copy_(copy)
            written.append(original)
    return written


def _restore(value, wide: torch.dtype, narrow: torch.dtype):
    if isinstance(value, torch.Tensor):
        return value.to(wide) if value.dtype == narrow else value
    if isinstance(value, (list, tuple)):
        return type(value)(_restore(v, wide, narrow) for v in value)
    return value


def _attention(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None,
               precision: Precision):
    """The CPU's fused attention as its two matmuls, with the target's rounding on each product: operands
    to precision.matmul_inputs, products to precision.matmul_output (when set).

    Returns (output, logsumexp) like aten::_scaled_dot_product_flash_attention_for_cpu.
    Inference only: dropout must be 0, as in the workbook's eval-mode passes."""
    operand, result = precision.matmul_inputs, precision.matmul_output
    if dropout_p:
        raise NotImplementedError("precision emulation of attention dropout; run the model in eval mode")
    if key.shape[-3] != query.shape[-3]:   # grouped-query attention: share each key/value head
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    flat = torch.contiguous_format   # the heads' permuted views would be copied again by matmul
    # The scale multiplies the rounded query (its fp32 products are the same up to fp32 rounding): a
    # pass over (query, head dim) rather than over the (query, key) scores.
    scores = torch.matmul(round_to(query, operand, flat) * scale, round_to(key, operand, flat).transpose(-2, -1))
    if result is not None:
        scores = round_to(scores, result)
    # The masks become one additive bias on their own small shape (no heads): a boolean or causal mask
    # as 0 or -inf. One broadcast add over the scores costs several times less than masked_fill's.
    bias = None
    if is_causal:
        bias = _additive(torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril(), scores.dtype)
    if attn_mask is not None:
        mask = _additive(attn_mask, scores.dtype) if attn_mask.dtype == torch.bool else attn_mask
        bias = mask if bias is None else bias + mask
    seen = None   # whether a query sees any key, on the mask's shape
    if bias is not None:
        # A query whose every key is masked (a left-padded causal LM's padding rows) attends to nothing,
        # as in the CPU kernel: zeros, not softmax's NaN (which would reach every later position through
        # the keys and values of the padding). Found from the bias, not by a pass over the scores: such
        # a row's bias becomes 0 (finite probabilities) and its output is multiplied by 0.
        seen = ~bias.isneginf().all(dim=-1, keepdim=True)
        scores = scores + bias.masked_fill(~seen, 0.0)
    # logsumexp out of place (torch.logsumexp runs an in-place exp_): a retraced graph that does not
    # use it drops it as dead code, which an in-place op would prevent.
    peak = scores.amax(dim=-1, keepdim=True)
    peak = peak.masked_fill(peak.isinf(), 0.0)
    lse = (scores - peak).exp().sum(dim=-1).log() + peak.squeeze(-1)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(round_to(probs, operand, flat), round_to(value, operand, flat))
    if seen is not None:
        lse = lse.masked_fill(~seen.squeeze(-1), float("-inf"))
        out = out * seen.to(out.dtype)
    if result is not None:
        out = round_to(out, result)
    # The CPU kernel's layouts (batch, query, heads, ...) transposed to heads first: a graph traced
    # through the real kernel (AOTAutograd's forward) views its outputs with these strides.
    return _heads_second(out), _heads_second(lse.unsqueeze(-1)).squeeze(-1)


def _heads_second(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-3, -2).contiguous().transpose(-3, -2) if x.dim() >= 3 else x


def _additive(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


def emulate(target: Target, precision: str | Precision | None = None) -> NumericsMode:
    """A mode applying `target`'s dtype rules and precision (its default when None)."""
    if precision is None:
        chosen = target.default_precision
    elif isinstance(precision, Precision):
        chosen = precision
    else:
        chosen = target.precision(precision)
    return NumericsMode(target, chosen)


# ---------------------------------------------------------------- FOR TESTING ONLY
class WrongOpMode_TESTING_ONLY(NumericsMode):
    """FOR TESTING ONLY: deliberately wrong numerics. Never use it for a result.

    The target's rules, except that the `call`-th call (counting from 1) of the ATen op named `op`
    (as `func.name()` spells it, e.g. "aten::gelu") has its result scaled by (1 + error). Like
    `relu_accuracy_error_TESTING_ONLY` in torch/_dynamo/backends/debugging.py, it stands in for a
    compiler that gets one op wrong, so tests can prove that stage 4 fails and names the module that
    op ran in."""

    def __init__(self, target: Target, precision: Precision, op: str, call: int, error: float):
        super().__init__(target, precision)
        self.op, self.call, self.error, self.seen = op, call, error, 0

    def _compute(self, func, args, kwargs):
        out = super()._compute(func, args, kwargs)
        if func.name() == self.op:
            self.seen += 1
            if self.seen == self.call:
                self.stats[f"TESTING ONLY: {self.op} call {self.call} scaled by 1{self.error:+g}"] += 1
                out = out * (1 + self.error)
        return out


def wrong_op_TESTING_ONLY(op: str = "aten::gelu", call: int = 1, error: float = 1e-2):
    """FOR TESTING ONLY: a factory with emulate()'s signature that returns WrongOpMode_TESTING_ONLY."""
    def make(target: Target, precision: str | Precision | None = None) -> NumericsMode:
        base = emulate(target, precision)
        return WrongOpMode_TESTING_ONLY(base.target, base.precision, op, call, error)
    make.__qualname__ = make.__name__ = f"wrong_op_TESTING_ONLY({op!r}, call={call}, error={error:g})"
    return make
