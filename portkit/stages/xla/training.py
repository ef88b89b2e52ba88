"""Stage 3b with workload "train": the real XLA compile of a whole training step for a TPU topology.

    >>> from portkit.corpora import corpus
    >>> from portkit.models import registry
    >>> from portkit.stages.xla import training
    >>> m = registry.load("gpt2")
    >>> spec = training.step_inputs(m, corpus.load_corpus(), batch_size=8, seq_len=128)
    >>> step = training.compile_step(m, spec, topology="v5e:1x1")
    >>> step.breakdown          # HBM per device: weights, optimizer state, batch, temporaries ...
    >>> training.largest_micro_batch(m, spec, "v5e:1x1", first=step)    # (n, {n tried: fits})

The step is the model's own loss (training.loss_for) converted by torchax, its gradients by jax.value_and_grad,
and AdamW in float32 (torch.optim.AdamW's update), weights and moments donated so the compiler updates them in
place; compiled for the topology with JAX + libtpu, compile-only (nothing runs on a TPU), the verdict cached
(portkit.tpu_compile.cache). The compiler's memory per device is broken down into weights, optimizer state and batch
(the step's arguments, counted from their shapes), temporaries (gradients, saved activations, workspace) and
outputs. On several devices the weights and moments are sharded FSDP-style and the batch split data-parallel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from portkit.core import placement
from portkit.workloads import training
from portkit.tpu_compile import cache
from portkit.tpu_compile import compiler
from portkit.tpu_compile import sharded
from portkit.core.errors import BadParameter
from portkit.tpu_compile.results import MemoryVerdict, format_bytes

ADAMW = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}   # torch.optim.AdamW's defaults


@dataclass
class StepCompile(MemoryVerdict):
    """One training step's XLA verdict for a topology, with its memory broken down."""
    model: str
    loss: str
    topology: str
    inputs: dict                 # {name: [shape, dtype]} as compiled
    status: str                  # compiled, out_of_hbm, compile_failed, trace_failed, no_lowering
    compile_seconds: float | None = None
    cached: bool = False
    hbm_bytes_per_device: int = 0
    memory: dict = field(default_factory=dict)        # the compiler's memory_analysis (bytes)
    breakdown: dict = field(default_factory=dict)     # {part: bytes}, adds up to memory["total"]
    flops: float | None = None
    message: str = ""
    counted: dict = field(default_factory=dict)       # what the arguments are, counted from their shapes
    sharding: str = "one device"

    @property
    def batch(self) -> int:
        return int(next(iter(self.inputs.values()))[0][0])

    def summary(self) -> str:
        if self.status != "compiled":
            return f"training step (batch {self.batch}) on {self.topology}: {self.status}: {self.message[:300]}"
        return (f"training step ({self.loss}, AdamW; batch {self.batch}; {self.sharding}) compiled for "
                f"{self.topology} in "
                f"{self.compile_seconds:.1f} s: "
                f"{format_bytes(self.memory['total'])} per device of {format_bytes(self.hbm_bytes_per_device)} "
                f"{self.memory_line()}")

    def to_dict(self) -> dict:
        return {"model": self.model, "loss": self.loss, "topology": self.topology, "inputs": self.inputs,
                "batch": self.batch,
                "status": self.status, "compile_seconds": self.compile_seconds, "cached": self.cached,
                "hbm_bytes_per_device": self.hbm_bytes_per_device, "memory": self.memory,
                "breakdown": self.breakdown, "counted": self.counted, "flops": self.flops, "fits": self.fits,
                "sharding": self.sharding,
                "message": self.message, "summary": self.summary()}


def step_inputs(model, corpus, batch_size: int, seq_len: int) -> dict:
    """{input name: (shape, dtype)} of one real training batch of the model (training.batches: the keys its
    loss reads; an embedding model's are anchor_ and positive_ pairs)."""
    batch = training.batches(model, corpus, 1, batch_size, seq_len)[0]
    return {k: (tuple(v.shape), v.dtype) for k, v in batch.items()}


def with_batch(spec: dict, n: int) -> dict:
    """The same step inputs with n rows."""
    return {k: ((n, *shape[1:]), dtype) for k, (shape, dtype) in spec.items()}


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _adamw_step(jax, fn):
    """One training step as a JAX function of (trainable weights, frozen weights, first and second moments,
    step count, batch): the loss `fn` computes and its gradients (jax.value_and_grad), then torch.optim.AdamW's
    update (bias-corrected moments, decoupled weight decay). Returns (loss, weights, moments, count)."""
    import jax.numpy as jnp
    b1, b2 = ADAMW["betas"]

    def step(weights, others, first, second, n, data):
        value, grads = jax.value_and_grad(lambda w: fn({**others, **w}, (), data))(weights)
        n = n + 1
        first = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, first, grads)
        second = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, second, grads)
        c1, c2 = 1 - b1 ** n, 1 - b2 ** n

        def update(w, m, v):
            new = w - ADAMW["lr"] * (m / c1 / (jnp.sqrt(v / c2) + ADAMW["eps"]) + ADAMW["weight_decay"] * w)
            return new.astype(w.dtype)
        return value, jax.tree.map(update, weights, first, second), first, second, n
    return step


def compile_step(model, spec: dict, topology: str, dtype: str | None = None) -> StepCompile:
    """The model's training step compiled by XLA for `topology` at the batch `spec` ({name: (shape, dtype)},
    step_inputs), compile-only; its memory per device broken down (module docstring)."""
    compiler.check_topology(topology)
    if dtype is not None and dtype not in compiler.DTYPES:
        raise BadParameter("dtype", dtype, compiler.DTYPES)
    description, loss = training.loss_for(model)
    jax, topo, devices, mesh, replicated = sharded.compile_only(topology, "fsdp")
    from jax.sharding import NamedSharding, PartitionSpec

    module = training.WithLoss(model.module, loss)
    program = compiler.Program(module, compiler.DTYPES.get(dtype))
    states, fn = program.states, program.fn
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    mappings = program.torchax.ops.mappings
    rows = {s[0] for s, _ in spec.values()}
    split = devices > 1 and len(rows) == 1 and next(iter(rows)) % devices == 0

    def struct(shape, torch_dtype, fsdp: bool = False, batch: bool = False):
        """FSDP over several devices: a weight or moment split along its first dimension that divides (else
        whole on each device, sharded.fsdp_weight_spec), the batch split data-parallel when its rows divide."""
        sharding = replicated
        if fsdp and devices > 1:
            sharding = NamedSharding(mesh, sharded.fsdp_weight_spec(tuple(shape), devices, PartitionSpec))
        elif batch and split:
            sharding = NamedSharding(mesh, PartitionSpec("fsdp"))
        return jax.ShapeDtypeStruct(tuple(shape), mappings.t2j_dtype(torch_dtype), sharding=sharding)

    def per_device(shape, torch_dtype, fsdp: bool) -> int:
        whole = _nbytes(shape, torch_dtype)
        return whole // devices if fsdp and devices > 1 and any(d % devices == 0 for d in shape) else whole

    narrowed = {k: program.narrow(mappings.j2t_dtype(a.dtype)) for k, a in states.items()}
    params = {k: struct(a.shape, narrowed[k], fsdp=True) for k, a in states.items() if k in trainable}
    frozen = {k: struct(a.shape, narrowed[k], fsdp=True) for k, a in states.items() if k not in trainable}
    moments = {k: struct(a.shape, torch.float32, fsdp=True) for k, a in params.items()}
    count = struct((), torch.float32)
    inputs = {k: (tuple(s), program.narrow(d)) for k, (s, d) in spec.items()}
    batch = {k: struct(s, d, batch=True) for k, (s, d) in inputs.items()}
    step = _adamw_step(jax, fn)
    found = StepCompile(model.name, description, topology, {k: [list(s), str(d).replace("torch.", "")]
                                                            for k, (s, d) in inputs.items()}, "compiled",
                        hbm_bytes_per_device=compiler.hbm_per_device(topology, devices))
    found.sharding = (f"weights and AdamW moments FSDP over {devices} devices, batch "
                      + ("split" if split else "replicated (its rows do not divide)")) if devices > 1 else "one device"
    found.counted = {     # per device
        "weights": sum(per_device(a.shape, narrowed[k], True) for k, a in states.items()),
        "optimizer state": sum(per_device(a.shape, torch.float32, True) for a in params.values()) * 2 + 4,
        "batch": sum(_nbytes(s, d) // (devices if split else 1) for s, d in inputs.values()),
        "gradients": sum(per_device(a.shape, narrowed[k], True) for k, a in params.items()),
    }
    shardings = lambda tree: jax.tree.map(lambda a: a.sharding, tree)     # noqa: E731
    try:     # the updated weights and moments keep their shardings and are written in place (donated)
        with placement.tensors_kept(program.module):      # forward leaves no converted tensor on the model
            lowered = jax.jit(step, donate_argnums=(0, 2, 3), out_shardings=(
                replicated, shardings(params), shardings(moments), shardings(moments), replicated)).trace(
                params, frozen, moments, moments, count, batch).lower()
    except Exception as exc:  # noqa: BLE001 - a step that does not trace is the finding
        found.status, found.message = "trace_failed", compiler.error_message(exc)
        if isinstance(exc, program.torchax.tensor.OperatorNotFound):
            found.status = "no_lowering"
        return found
    context = sharded.check_context(topology, topo, "training step", sharding=found.sharding,
                                        code=cache.source_digest(compile_step))
    verdict, found.cached, _ = compiler.compiler_verdict(jax, lowered, topology, context)
    found.status, found.compile_seconds, found.message = verdict.status, verdict.compile_seconds, verdict.message
    found.memory, found.flops = dict(verdict.memory or {}), verdict.flops
    if verdict.status == "compiled":
        found.breakdown = breakdown(found.memory, found.counted)
    return found


def breakdown(memory: dict, counted: dict) -> dict:
    """The compiler's total per device in parts that add up to it: the arguments as counted (weights,
    optimizer state, batch) and whatever else the compiler holds among them; the temporaries (gradients,
    activations kept for the backward pass, workspace: XLA fuses AdamW's update into the backward pass, so
    it need not hold every gradient at once, and memory_analysis does not split them); outputs not written
    in place; generated code."""
    args = counted["weights"] + counted["optimizer state"] + counted["batch"]
    parts = {"weights": counted["weights"], "optimizer state": counted["optimizer state"], "batch": counted["batch"],
             "other arguments": memory["argument"] - args,
             "gradients, activations and workspace": memory["temporary"],
             "outputs not in place": memory["output"] - memory["alias"], "generated code": memory["generated_code"]}
    return {k: int(v) for k, v in parts.items() if v or k not in ("other arguments", "outputs not in place")}


def largest_micro_batch(model, spec: dict, topology: str, dtype: str | None = None,
                        first: StepCompile | None = None, limit: int | None = None,
                        second: StepCompile | None = None) -> tuple[int, dict[int, bool]]:
    """The largest micro-batch whose training step fits one device's HBM (a compile per try, at most `limit`,
    sharded.BATCH_LIMIT by default), galloping from a guess: the memory of `first` and of twice its batch,
    extended in a line to the device's HBM (what a row adds is its batch and activations; weights,
    optimizer state and gradients do not grow). second: the step at twice first's batch, when compiled already."""
    first = first or compile_step(model, spec, topology, dtype)
    known, guess = {first.batch: first.fits}, None
    if first.fits and 2 * first.batch <= (limit or sharded.BATCH_LIMIT):
        second = second or compile_step(model, with_batch(spec, 2 * first.batch), topology, dtype)
        known[second.batch] = second.fits
        if second.status == "compiled":
            per_row = (second.memory["total"] - first.memory["total"]) / first.batch
            room = second.hbm_bytes_per_device - first.memory["total"]
            guess = first.batch + int(room // per_row) if per_row > 0 else limit or sharded.BATCH_LIMIT
    return sharded.search_compiles(lambda n: compile_step(model, with_batch(spec, n), topology, dtype).fits,
                                       known, guess, "largest micro-batch (an XLA compile a try)", limit)


def split_temporaries(first: StepCompile, second: StepCompile) -> dict | None:
    """The compiler's temporaries at two batches, in a line: what does not grow with the batch (gradients,
    the all-gathered weights of a sharded step, workspace) and what one more row adds (its activations).
    None unless both compiled at different batches and the line has no negative part (XLA may keep
    different temporaries at different batches; then the two figures stand as they are)."""
    if first.status != "compiled" or second.status != "compiled" or first.batch == second.batch:
        return None
    key = "gradients, activations and workspace"
    per_row = (second.breakdown[key] - first.breakdown[key]) / (second.batch - first.batch)
    fixed = first.breakdown[key] - per_row * first.batch
    if per_row < 0 or fixed < 0:      # not a line (the compiler rematerialises differently): no split to sign
        return None
    return {"fixed": int(fixed), "per_row": int(per_row), "gradients_counted": first.counted["gradients"],
            "batches": [first.batch, second.batch]}
