"""`portkit export RUN --to STACK`: a run's bucket plan, warm-up list, static-shape settings and stage 4's
numerics, written as a serving stack's own configuration.

    >>> from portkit.deploy import export
    >>> for e in export.export("runs/minilm", "pytorch"):       # or "vllm", "nxdi"
    ...     print(e.target, e.path, e.lost)

pytorch: a Python file (torch.compile with the target's backend, mark_static, padding to the bucket, warm-up over
every bucket); vllm and nxdi: JSON whose keys are checked against DOCUMENTED (each stack's documented keys and
their page). What a stack cannot express is listed as "lost", in the file and on the command line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from string import Template

from portkit.runfolder import reading, results
from portkit.targets import specs as targets_mod
from portkit.core import atomic_io as _io
from portkit.core.errors import BadParameter, PortkitError

STACKS = ("pytorch", "vllm", "nxdi")


@dataclass(frozen=True)
class Documented:
    """The keys a stack documents for one section of its configuration, and where."""
    url: str
    keys: tuple[str, ...]


# The one owner of each stack's documented keys: an exported file uses no other key (checked_keys).
DOCUMENTED = {
    # vLLM engine arguments (`vllm serve --max-model-len ...`, `LLM(max_model_len=...)`)
    "vllm.engine_args": Documented("https://docs.vllm.ai/en/stable/configuration/engine_args/",
                                   ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "dtype",
                                    "additional_config")),
    # vLLM on TPU pads each step's tokens to a ladder: powers of two, or with a gap, linear steps of the gap
    # ("Gap between padding buckets for the forward pass. So we have 8, we will run forward pass with
    # [16, 24, 32, ...]": vllm/envs.py, moved to vllm-project/tpu-inference's envs when vLLM's TPU backend moved)
    "vllm.env.tpu": Documented("https://github.com/vllm-project/vllm/blob/main/vllm/envs.py",
                               ("VLLM_TPU_BUCKET_PADDING_GAP",)),
    # vLLM on Neuron (vllm-neuron): additional_config={"neuron_config": {...}}; the largest token bucket must equal
    # max_num_batched_tokens, the largest sequence bucket max_num_seqs
    "vllm.additional_config.neuron_config": Documented(
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/additional-config.html",
        ("num_batched_tokens_buckets", "num_seqs_buckets")),
    # NxD Inference's NeuronConfig (neuronx_distributed_inference/models/config.py reads the same names)
    "nxdi.neuron_config": Documented(
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/api-guides/api-guide.html",
        ("batch_size", "seq_len", "max_context_length", "padding_side", "torch_dtype", "enable_bucketing",
         "context_encoding_buckets", "token_generation_buckets")),
}


def checked_keys(section: str, config: dict) -> dict:
    """`config` unchanged, or PortkitError naming a key that DOCUMENTED[section] does not list."""
    documented = DOCUMENTED[section]
    unknown = [k for k in config if k not in documented.keys]
    if unknown:
        raise PortkitError(f"{section}: {', '.join(unknown)} not documented at {documented.url}")
    return config


@dataclass(frozen=True)
class Plan:
    """What a run decided for one target, as a serving stack needs it."""
    run_dir: str
    model: str
    kind: str
    target: str
    mode: str
    backend: str               # the backend the run compiled with (portkit_<target> when emulated)
    native_backend: str        # the backend on the target with its vendor package
    planner: str
    boundaries: tuple[int, ...]
    batch_sizes: tuple[int, ...] | None
    overflow: str
    inputs: dict               # name -> [dtype, [dim names]]
    varying: str | None
    batch_dim: str | None
    masks: tuple[str, ...]
    precision: dict            # stage 4's chosen precision: name, setting, matmul_inputs, all_ops, verdict
    generation: tuple[tuple[int, ...], tuple[int, ...]] | None   # (prompt, context) buckets of a serving plan

    @property
    def warmup(self) -> list[tuple[int, int]]:
        """Every (batch, length) the plan compiles: the warm-up list."""
        return [(b, s) for b in (self.batch_sizes or (1,)) for s in self.boundaries]


def read_plans(run_dir, targets=None) -> tuple[dict[str, Plan], list[str]]:
    """The plan of each target with one in `run_dir`, and a line for each asked target without one."""
    run = Path(run_dir)
    if not run.is_dir():
        raise BadParameter("run folder", str(run_dir), hint="no such folder; give one written by `portkit run`")
    chosen = results.read_buckets(run)
    if chosen is None:
        raise BadParameter("run folder", str(run_dir), hint="no bucket plan (buckets.json); run stage buckets")
    buckets, accuracy = results.load(run, "buckets"), results.load(run, "accuracy")
    held = list(dict.fromkeys([*buckets.targets, *buckets.damaged])) if buckets else []
    names = list(targets) if targets else held or list(chosen.chosen)
    plans, missing = {}, []
    for name in names:
        if name not in chosen.chosen:
            missing.append(f"{name}: no bucket plan in {chosen.path}; nothing exported")
            continue
        plans[name] = _plan(run, buckets, accuracy, name, chosen.chosen[name])
    return plans, missing


def _plan(run: Path, buckets, accuracy, name: str, chosen) -> Plan:
    """One target's Plan from stage 3's typed result (None where only its early plan file is there) and stage 4's
    (None where it has none)."""
    declared = buckets.declared() if buckets else reading.Declared(None, None, {}, {}, ())
    entry = buckets.target(name) if buckets else None
    info = entry.info if entry else reading.TargetInfo(None, None, None)
    found = accuracy.target(name) if accuracy else None
    precision = dict((found.precision if found else None) or info.default_precision or {})
    precision["verdict"] = (found.verdict if found else None) or "not assessed"
    serving = results.serving_buckets(run, name)
    spec = targets_mod.TARGETS.get(name)
    return Plan(str(run), str(declared.name or "?"), str(declared.kind or "?"), name, str(info.mode or "emulated"),
                str(info.backend or ""), spec.backend if spec else "", chosen.planner, chosen.boundaries,
                chosen.batch_sizes, str((entry.chosen.overflow if entry else None) or "truncate"), declared.inputs,
                declared.roles.get("varies"), declared.roles.get("batch"), declared.masks, precision,
                (tuple(serving[0]), tuple(serving[1])) if serving else None)


@dataclass(frozen=True)
class Exported:
    target: str
    stack: str
    path: Path
    lost: tuple[str, ...]


def export(run_dir, stack: str, out_dir=None, targets=None) -> tuple[list[Exported], list[str]]:
    """Write `stack`'s configuration for each target's plan under out_dir (default RUN/deploy/STACK); returns
    what was written and a line for each target left out."""
    if stack not in STACKS:
        raise BadParameter("stack", stack, STACKS)
    plans, skipped = read_plans(run_dir, targets)
    out = Path(out_dir) if out_dir else Path(run_dir) / "deploy" / stack
    written = []
    for name, plan in plans.items():
        if stack == "nxdi" and name != "neuron":
            skipped.append(f"{name}: NxD Inference serves on AWS Neuron only; nothing exported")
            continue
        filename, text, lost = WRITERS[stack](plan)
        written.append(Exported(name, stack, _io.write_text(out / filename, text), tuple(lost)))
    return written, skipped


# ---------------------------------------------------------------- pytorch: a generated serving wrapper
WRAPPER = Template('''"""Serving wrapper for $model on $target, written by `portkit export --to pytorch` from $run_dir.

Plain PyTorch: torch.compile with the target's backend and static shapes, each request padded to its bucket,
and a warm-up over every bucket, after which a compile raises (set_stance("fail_on_recompile")).

    server = Server(model)     # the model the run assessed
    server.warm_up()           # compiles every bucket in WARMUP once
    outputs = server(**inputs) # padded to its bucket, outputs cut back to the request's length and batch
"""
import torch

TARGET = $target_repr
BACKEND = $backend            # the backend the run used; on the target with its vendor package: NATIVE_BACKEND
NATIVE_BACKEND = $native
BUCKETS = $boundaries         # stage 3's $planner plan: sequence lengths, ascending
BATCH_SIZES = $batch_sizes    # batch buckets; None: every call takes the whole batch
WARMUP = $warmup              # every (batch, length) compiled before serving
INPUTS = $inputs              # name -> [dtype, dims]
VARYING = $varying
BATCH_DIM = $batch_dim
MASKS = $masks                # padded with 0 (padding masked out); other inputs are padded with PAD_VALUE
PAD_VALUE = 0
OVERFLOW = $overflow          # "truncate": a request longer than the largest bucket is cut to it
PRECISION = $precision        # stage 4's choice: on the target, apply its setting


def bucket_for(length):
    for bucket in BUCKETS:
        if length <= bucket:
            return bucket
    if OVERFLOW == "truncate":
        return BUCKETS[-1]
    raise ValueError(f"length {length} is over the largest bucket {BUCKETS[-1]}")


def batch_bucket(batch):
    if BATCH_SIZES is None:
        return batch
    for bucket in BATCH_SIZES:
        if batch <= bucket:
            return bucket
    raise ValueError(f"batch {batch} is over the largest batch bucket {BATCH_SIZES[-1]}; split the request")


def _fit(tensor, axis, size, value):
    if tensor.shape[axis] > size:   # a truncated view keeps its strides, and Dynamo guards on strides: copy it
        tensor = tensor.narrow(axis, 0, size).clone(memory_format=torch.contiguous_format)
    if tensor.shape[axis] < size:
        shape = list(tensor.shape)
        shape[axis] = size - tensor.shape[axis]
        tensor = torch.cat([tensor, torch.full(shape, value, dtype=tensor.dtype)], dim=axis)
    return tensor


def pad(inputs):
    """(inputs padded to their bucket and marked static, real length, real batch, bucket, batch bucket)."""
    name, dims = next((n, INPUTS[n][1]) for n in INPUTS if n in inputs and VARYING in INPUTS[n][1])
    length = inputs[name].shape[dims.index(VARYING)]
    batch = inputs[name].shape[dims.index(BATCH_DIM)] if BATCH_DIM in dims else 1
    bucket, batches = bucket_for(length), batch_bucket(batch)
    padded = {}
    for key, tensor in inputs.items():
        dims = INPUTS.get(key, [None, []])[1]
        for dim, size in ((VARYING, bucket), (BATCH_DIM, batches)):
            if dim in dims:
                tensor = _fit(tensor, dims.index(dim), size, 0 if key in MASKS else PAD_VALUE)
        torch._dynamo.mark_static(tensor)
        padded[key] = tensor
    return padded, min(length, bucket), batch, bucket, batches


def _unpad(output, length, batch, bucket, batches):
    if isinstance(output, torch.Tensor):
        if BATCH_DIM and output.dim() >= 1 and output.shape[0] == batches:
            output = output[:batch]
        if output.dim() >= 2 and output.shape[1] == bucket:
            output = output[:, :length]
        return output
    if isinstance(output, (list, tuple)):
        return type(output)(_unpad(o, length, batch, bucket, batches) for o in output)
    if isinstance(output, dict):
        return {k: _unpad(v, length, batch, bucket, batches) for k, v in output.items()}
    return output


class Server:
    def __init__(self, model, backend=BACKEND):
        self.model = model.eval()
        self.compiled = torch.compile(self.model, backend=backend, dynamic=False)
        self.warm = False

    def _example(self, batch, length):
        example = {}
        for name, (dtype, dims) in INPUTS.items():
            shape = [length if d == VARYING else batch if d == BATCH_DIM else 1 for d in dims]
            fill = torch.ones if name in MASKS else torch.zeros
            example[name] = fill(shape, dtype=getattr(torch, dtype))
        return example

    def warm_up(self):
        """Compile every (batch, length) of WARMUP; Dynamo keeps that many graphs of the one function."""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(WARMUP))
        with torch.no_grad():
            for batch, length in WARMUP:
                self.compiled(**pad(self._example(batch, length))[0])
        self.warm = True

    def __call__(self, **inputs):
        padded, length, batch, bucket, batches = pad(inputs)
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile" if self.warm else "default"):
            output = self.compiled(**padded)
        return _unpad(output, length, batch, bucket, batches)
''')


def _pytorch(plan: Plan) -> tuple[str, str, list[str]]:
    lost = []
    if plan.varying is None or not any(plan.varying in dims for _, dims in plan.inputs.values()):
        raise PortkitError(f"{plan.target}: the model declares no varying input dimension; no bucket to pad to")
    if plan.precision.get("setting"):
        lost.append(f"precision {plan.precision.get('name')!r} ({plan.precision['setting']}) is a setting of the "
                    "target's runtime: the wrapper records it in PRECISION, apply it on the target")
    text = WRAPPER.substitute(
        model=plan.model, target=plan.target, run_dir=plan.run_dir, target_repr=repr(plan.target),
        backend=repr(plan.backend), native=repr(plan.native_backend), planner=plan.planner,
        boundaries=repr(list(plan.boundaries)), batch_sizes=repr(list(plan.batch_sizes) if plan.batch_sizes else None),
        warmup=repr(plan.warmup), inputs=repr(plan.inputs), varying=repr(plan.varying), batch_dim=repr(plan.batch_dim),
        masks=repr(plan.masks), overflow=repr(plan.overflow), precision=repr(plan.precision))
    return f"serve_{plan.target}.py", text, lost


# ---------------------------------------------------------------- vLLM and NxD Inference: JSON
def _meta(plan: Plan, stack: str, lost: list[str], sections: list[str]) -> dict:
    return {"stack": stack, "run_dir": plan.run_dir, "model": plan.model, "target": plan.target,
            "plan": {"planner": plan.planner, "boundaries": list(plan.boundaries),
                     "batch_sizes": list(plan.batch_sizes) if plan.batch_sizes else None, "overflow": plan.overflow},
            "warmup": plan.warmup, "precision": plan.precision, "lost": lost,
            "documented_keys": {s: DOCUMENTED[s].url for s in sections}}


def tpu_ladder(gap: int, top: int) -> list[int]:
    """vLLM's TPU token paddings up to `top`, from 16: with gap 0 powers of two up to the first at or past `top`;
    otherwise powers of two up to the gap, then steps of the gap (the rule vllm/envs.py states for
    VLLM_TPU_BUCKET_PADDING_GAP, as the TPU model runner's _get_token_paddings applies it; unverified for other
    versions: check your version's TPU model runner)."""
    ladder, size = [], 16
    if gap == 0:
        while True:
            ladder.append(size)
            if size >= top:
                return ladder
            size *= 2
    while size <= gap:
        ladder.append(size)
        size *= 2
    size //= 2
    while size < top:
        size += gap
        ladder.append(size)
    return ladder


def _vllm(plan: Plan) -> tuple[str, str, list[str]]:
    batches = list(plan.batch_sizes or (1,))
    tokens = sorted({b * s for b in batches for s in plan.boundaries})
    engine = {"max_model_len": plan.boundaries[-1], "max_num_seqs": batches[-1], "max_num_batched_tokens": tokens[-1]}
    lost, env, sections = [], {}, ["vllm.engine_args"]
    if plan.precision.get("all_ops"):
        engine["dtype"] = plan.precision["all_ops"]
    elif plan.precision.get("setting"):
        lost.append(f"precision {plan.precision.get('name')!r} ({plan.precision['setting']}) has no vLLM key: "
                    "vLLM sets the model's dtype only")
    if plan.target == "neuron":
        neuron = checked_keys("vllm.additional_config.neuron_config",
                              {"num_batched_tokens_buckets": tokens, "num_seqs_buckets": batches})
        engine["additional_config"] = {"neuron_config": neuron}
        sections.append("vllm.additional_config.neuron_config")
        lost.append("vLLM pads a step's total tokens (batch x length) to a token bucket, not each sequence to its "
                    f"length bucket: the plan's shapes {plan.warmup} become token buckets {tokens}")
    else:
        steps = [b - a for a, b in zip(plan.boundaries, plan.boundaries[1:])]
        pow2 = all(s & (s - 1) == 0 for s in plan.boundaries)
        gap = 0 if pow2 or not steps else max(16, -(-min(steps) // 16) * 16)
        env = checked_keys("vllm.env.tpu", {"VLLM_TPU_BUCKET_PADDING_GAP": gap})
        sections.append("vllm.env.tpu")
        ladder = tpu_ladder(gap, tokens[-1])
        if ladder != tokens:
            lost.append(f"vLLM on TPU cannot list buckets: it pads to its own ladder {ladder} ({len(ladder)} compiles) "
                        f"with VLLM_TPU_BUCKET_PADDING_GAP={gap}, not the plan's {tokens}")
    if plan.kind not in ("causal-lm", "generate", "seq2seq"):
        lost.append(f"vLLM serves generative and pooling models: check that it supports this {plan.kind} model")
    config = {"portkit": _meta(plan, "vllm", lost, sections), "engine_args": checked_keys("vllm.engine_args", engine),
              "env": env}
    return f"vllm_{plan.target}.json", json.dumps(config, indent=1) + "\n", lost


def _nxdi(plan: Plan) -> tuple[str, str, list[str]]:
    batches = list(plan.batch_sizes or (1,))
    lost = []
    if len(batches) > 1:
        lost.append(f"NxD Inference compiles one batch size: batch buckets {batches} become batch_size {batches[-1]}")
    prompt, context = plan.generation or (plan.boundaries, plan.boundaries)
    if plan.generation is None:
        lost.append("no serving plan for generation in this run (not a generate workload): token_generation_buckets "
                    "repeat the length buckets")
    dtype = plan.precision.get("all_ops") or "float32"
    if plan.precision.get("matmul_inputs") and not plan.precision.get("all_ops"):
        lost.append(f"precision {plan.precision.get('name')!r} ({plan.precision.get('setting')}) rounds matmul inputs "
                    "only: not a NeuronConfig key; pass it as the compiler setting it names")
    config = {"batch_size": batches[-1], "seq_len": max(context[-1], prompt[-1]), "max_context_length": prompt[-1],
              "padding_side": "right", "torch_dtype": dtype, "enable_bucketing": True,
              "context_encoding_buckets": list(prompt), "token_generation_buckets": list(context)}
    out = {"portkit": _meta(plan, "nxdi", lost, ["nxdi.neuron_config"]),
           "neuron_config": checked_keys("nxdi.neuron_config", config)}
    return f"nxdi_{plan.target}.json", json.dumps(out, indent=1) + "\n", lost


WRITERS = {"pytorch": _pytorch, "vllm": _vllm, "nxdi": _nxdi}
