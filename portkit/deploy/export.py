"""`portkit export RUN --to STACK`: a run's bucket plan, warm-up list, static-shape settings and stage 4's
numerics, written as a serving stack's own configuration, in the form that stack reads.

    >>> from portkit.deploy import export
    >>> written, skipped = export.export("runs/minilm", "vllm")   # or "pytorch", "nxdi"
    >>> [str(p) for p in written[0].files]   # vllm_tpu.sh, vllm_tpu.py, vllm_tpu.env, vllm_tpu.portkit.json

pytorch: serve_TARGET.py (torch.compile with the target's backend, mark_static, padding to the bucket, warm-up over
every bucket). vllm: a `vllm serve` line (vllm_TARGET.sh), the `LLM(...)` form (vllm_TARGET.py) and an env file
(vllm_TARGET.env). nxdi: the `NeuronConfig(...)` call (nxdi_neuron.py). Every key is checked against DOCUMENTED;
portkit's provenance (run, plan, what is lost) is a separate TARGET.portkit.json, never mixed into what a stack reads.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from string import Template

from portkit.runfolder import reading, results
from portkit.targets import specs
from portkit.core import atomic_io
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


# The model types each stack documents serving. NxD Inference's model reference lists decoder LLM architectures
# (Llama, Qwen, Mixtral, DBRX, ...), and vLLM routes an encoder or embedding model to its pooling runner.
NXDI_MODELS = Documented("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/"
                         "developer_guides/model-reference.html", ("causal-lm",))
VLLM_POOLING = "https://docs.vllm.ai/en/stable/models/pooling_models/"


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
    outputs: dict              # output name -> [stride, window, ceil] (the declaration's; reading.Declared)
    origin: str                # where the model came from, as the run recorded it
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
    spec = specs.TARGETS.get(name)
    return Plan(str(run), str(declared.name or "?"), str(declared.kind or "?"), name, str(info.mode or "emulated"),
                str(info.backend or ""), spec.backend if spec else "", chosen.planner, chosen.boundaries,
                chosen.batch_sizes, str((entry.chosen.overflow if entry else None) or "truncate"), declared.inputs,
                declared.roles.get("varies"), declared.roles.get("batch"), declared.masks, declared.outputs,
                str(declared.origin or ""), precision,
                (tuple(serving[0]), tuple(serving[1])) if serving else None)


@dataclass(frozen=True)
class Exported:
    target: str
    stack: str
    files: tuple[Path, ...]    # what the stack reads first, then portkit's provenance
    lost: tuple[str, ...]

    @property
    def path(self) -> Path:
        """The file a user opens first (the serving wrapper, the `vllm serve` line, the NeuronConfig)."""
        return self.files[0]


def export(run_dir, stack: str, out_dir=None, targets=None) -> tuple[list[Exported], list[str]]:
    """Write `stack`'s configuration for each target's plan under out_dir (default RUN/deploy/STACK); returns
    what was written and a line for each target left out (with why)."""
    if stack not in STACKS:
        raise BadParameter("stack", stack, STACKS)
    plans, skipped = read_plans(run_dir, targets)
    out = Path(out_dir) if out_dir else Path(run_dir) / "deploy" / stack
    written = []
    for name, plan in plans.items():
        refused = _refused(stack, plan)
        if refused:
            skipped.append(f"{name}: {refused}; nothing exported")
            continue
        files, lost = WRITERS[stack](plan)
        written.append(Exported(name, stack, tuple(atomic_io.write_text(out / f, text) for f, text in files.items()),
                                tuple(lost)))
    return written, skipped


def _refused(stack: str, plan: Plan) -> str | None:
    """Why `stack` cannot serve this target's plan (None where it can): NxD Inference serves on AWS Neuron alone,
    and the decoder LLMs its model reference lists (NXDI_MODELS)."""
    if stack != "nxdi":
        return None
    if plan.target != "neuron":
        return "NxD Inference serves on AWS Neuron only"
    if plan.kind not in NXDI_MODELS.keys:
        return (f"NxD Inference serves decoder LLMs (the architectures its model reference lists: "
                f"{NXDI_MODELS.url}); this model is of kind {plan.kind}: serve it with --to pytorch, or --to vllm")
    return None


def provenance(plan: Plan, stack: str, lost: list[str], sections: list[str]) -> str:
    """portkit's record of where an exported configuration came from (TARGET.portkit.json): the run, the plan,
    the warm-up, stage 4's precision, what the stack cannot express and the pages documenting each key used."""
    return json.dumps({"stack": stack, "run_dir": plan.run_dir, "model": plan.model, "origin": plan.origin,
                       "target": plan.target,
                       "plan": {"planner": plan.planner, "boundaries": list(plan.boundaries),
                                "batch_sizes": list(plan.batch_sizes) if plan.batch_sizes else None,
                                "overflow": plan.overflow},
                       "warmup": plan.warmup, "precision": plan.precision, "lost": lost,
                       "documented_keys": {s: DOCUMENTED[s].url for s in sections}}, indent=1) + "\n"


# ---------------------------------------------------------------- pytorch: a generated serving wrapper
WRAPPER = Template('''"""Serving wrapper for $model on $target, written by `portkit export --to pytorch` from $run_dir.

Plain PyTorch: torch.compile with the target's backend and static shapes, each request padded to its bucket,
and a warm-up over every bucket, after which a compile raises (set_stance("fail_on_recompile")).

Server wants the model as portkit loads it: the module of portkit.models.registry.load($model_repr) (or of your
own declaration), whose forward takes the declared inputs (INPUTS) by name and returns its declared outputs.

    server = Server(model)     # portkit.models.registry.load(...).module: the model the run assessed
    server.warm_up()           # finds each output's batch and length axes, then compiles every bucket in WARMUP once
    outputs = server(**inputs) # padded to its bucket; each output cut back along its own axes only
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
# the declared outputs: name -> [stride, window, ceil], input positions per output position along VARYING
# (portkit.models.inputs.Output); an output not named here has one position per input position
OUTPUTS = $outputs
PROBE_LENGTHS = $probe        # two lengths the warm-up runs the model at (eagerly) to find each output's axes


def positions(n, stride=1, window=1, ceil=False):
    """An output's real positions for n real input positions (portkit.models.inputs.Output.count)."""
    span = n - window
    return max(0, (-(-span // stride) if ceil else span // stride) + 1)


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


def _leaves(output, path=()):
    """{path: tensor} of a model's output (a tensor, or a dict, list or tuple of them; a path is its keys)."""
    if isinstance(output, torch.Tensor):
        return {path: output}
    items = (output.items() if isinstance(output, dict)
             else enumerate(output) if isinstance(output, (list, tuple)) else ())
    found = {}
    for key, value in items:
        found.update(_leaves(value, path + (key,)))
    return found


def _rebuild(output, cut, path=()):
    """`output` with each tensor replaced by cut(path, tensor)."""
    if isinstance(output, torch.Tensor):
        return cut(path, output)
    if isinstance(output, dict):
        return {k: _rebuild(v, cut, path + (k,)) for k, v in output.items()}
    if isinstance(output, (list, tuple)):
        return type(output)(_rebuild(v, cut, path + (i,)) for i, v in enumerate(output))
    return output


def _declared(path):
    return OUTPUTS.get(path[0] if path else None, [1, 1, False])


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

    def probe_axes(self):
        """{output path: (batch axes, length axes)}: two eager runs of the model, 2 rows at PROBE_LENGTHS[0] and 3
        at PROBE_LENGTHS[1]. An axis that reads the output's declared positions at both lengths follows the
        length; one that reads 2 then 3 follows the batch. A pooled output (one vector a request, whatever its
        width) has no such axis and is never cut, even where its width equals a bucket."""
        shapes = []
        with torch.no_grad():
            for rows, length in zip((2, 3), PROBE_LENGTHS):
                found = _leaves(self.model(**self._example(rows, length)))
                shapes.append({p: tuple(t.shape) for p, t in found.items()})
        axes = {}
        for path, first in shapes[0].items():
            second = shapes[1].get(path, ())
            want = [positions(n, *_declared(path)) for n in PROBE_LENGTHS]
            ranks = range(len(first)) if len(first) == len(second) else ()
            seq = tuple(a for a in ranks if [first[a], second[a]] == want and want[0] != want[1])
            rows = tuple(a for a in ranks if (first[a], second[a]) == (2, 3) and a not in seq and BATCH_DIM)
            axes[path] = (rows, seq)
        return axes

    def warm_up(self):
        """Find each output's axes (probe_axes), then compile every (batch, length) of WARMUP; Dynamo keeps that
        many graphs of the one function."""
        self.axes = self.probe_axes()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(WARMUP))
        with torch.no_grad():
            for batch, length in WARMUP:
                self.compiled(**pad(self._example(batch, length))[0])
        self.warm = True

    def __call__(self, **inputs):
        if not hasattr(self, "axes"):
            self.axes = self.probe_axes()
        padded, length, batch, _, _ = pad(inputs)
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile" if self.warm else "default"):
            output = self.compiled(**padded)

        def cut(path, tensor):   # along the output's own batch and length axes, to the request's real size
            rows, seq = self.axes.get(path, ((), ()))
            for axis in rows:
                tensor = tensor.narrow(axis, 0, batch)
            for axis in seq:
                tensor = tensor.narrow(axis, 0, positions(length, *_declared(path)))
            return tensor
        return _rebuild(output, cut)
''')


def _probe_lengths(boundaries) -> tuple[int, int]:
    """Two different lengths within the plan for the wrapper's probe of its outputs' axes."""
    top = boundaries[-1]
    low = boundaries[0] if len(boundaries) > 1 else max(1, top // 2)
    return (low, top) if low != top else (max(1, top - 1), top)


def _pytorch(plan: Plan) -> tuple[dict[str, str], list[str]]:
    lost = []
    if plan.varying is None or not any(plan.varying in dims for _, dims in plan.inputs.values()):
        raise PortkitError(f"{plan.target}: the model declares no varying input dimension; no bucket to pad to")
    if plan.precision.get("setting"):
        lost.append(f"precision {plan.precision.get('name')!r} ({plan.precision['setting']}) is a setting of the "
                    "target's runtime: the wrapper records it in PRECISION, apply it on the target")
    text = WRAPPER.substitute(
        model=plan.model, model_repr=repr(plan.model), target=plan.target, run_dir=plan.run_dir,
        target_repr=repr(plan.target), backend=repr(plan.backend), native=repr(plan.native_backend),
        planner=plan.planner, boundaries=repr(list(plan.boundaries)),
        batch_sizes=repr(list(plan.batch_sizes) if plan.batch_sizes else None), warmup=repr(plan.warmup),
        inputs=repr(plan.inputs), varying=repr(plan.varying), batch_dim=repr(plan.batch_dim), masks=repr(plan.masks),
        overflow=repr(plan.overflow), precision=repr(plan.precision), outputs=repr(plan.outputs),
        probe=repr(_probe_lengths(plan.boundaries)))
    return {f"serve_{plan.target}.py": text,
            f"serve_{plan.target}.portkit.json": provenance(plan, "pytorch", lost, [])}, lost


# ---------------------------------------------------------------- vLLM and NxD Inference: what each stack reads
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


def _vllm(plan: Plan) -> tuple[dict[str, str], list[str]]:
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
        lost.append(f"vLLM serves this {plan.kind} model as a pooling model ({VLLM_POOLING}): it picks the pooling "
                    "runner from the model's config (--runner auto); check that vLLM lists its architecture")
    engine = checked_keys("vllm.engine_args", engine)
    env = {k: str(v) for k, v in env.items()}   # an environment holds strings
    files = {f"vllm_{plan.target}.sh": _vllm_shell(plan, engine),
             f"vllm_{plan.target}.py": _vllm_python(plan, engine, env),
             f"vllm_{plan.target}.env": _env_file(plan, env),
             f"vllm_{plan.target}.portkit.json": provenance(plan, "vllm", lost, sections)}
    return files, lost


def serve_argv(model: str, engine: dict) -> list[str]:
    """`vllm serve MODEL --flag value ...`: each engine argument as vLLM's command line spells it (max_model_len:
    --max-model-len), additional_config as the JSON the flag takes."""
    argv = ["vllm", "serve", model]
    for key, value in engine.items():
        argv += [f"--{key.replace('_', '-')}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def _header(plan: Plan, what: str, stack: str = "vllm") -> list[str]:
    """The lines that open an exported file: what it is, the model's name, where portkit's provenance is."""
    title = {"vllm": "vLLM", "nxdi": "NxD Inference"}[stack]
    return [f"{what} for {plan.model} on {plan.target}, written by `portkit export` from {plan.run_dir}.",
            f"portkit ran the model as {plan.model!r} ({plan.origin or 'origin not recorded'}): where that is not "
            "its Hugging Face id or folder, put that in its place.",
            f"What {title} cannot express of the plan, and where each key is documented: "
            f"{stack}_{plan.target}.portkit.json."]


def _vllm_shell(plan: Plan, engine: dict) -> str:
    lines = ["#!/bin/sh", *(f"# {line}" for line in _header(plan, "vLLM's server")),
             f"# The environment first (vllm_{plan.target}.env), then the server:",
             f'set -a; . "$(dirname "$0")/vllm_{plan.target}.env"; set +a',
             shlex.join(serve_argv(plan.model, engine))]
    return "\n".join(lines) + "\n"


def _vllm_python(plan: Plan, engine: dict, env: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in {"model": plan.model, **engine}.items())
    doc = "\n".join(_header(plan, "vLLM's offline API (LLM)"))
    return (f'"""{doc}\n"""\nimport os\n\n'
            f"os.environ.update({env!r})   # before vLLM reads its environment\n\n"
            f"from vllm import LLM  # noqa: E402\n\nllm = LLM({args})\n")


def _env_file(plan: Plan, env: dict) -> str:
    """KEY=value lines (docker's --env-file and `set -a; . FILE` read them), every value a string."""
    lines = [f"# vLLM's environment for {plan.model} on {plan.target} (portkit export)"
             + ("" if env else ": the plan needs no variable here")]
    return "\n".join(lines + [f"{k}={shlex.quote(v)}" for k, v in env.items()]) + "\n"


def _nxdi(plan: Plan) -> tuple[dict[str, str], list[str]]:
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
    config = checked_keys("nxdi.neuron_config", {
        "batch_size": batches[-1], "seq_len": max(context[-1], prompt[-1]), "max_context_length": prompt[-1],
        "padding_side": "right", "torch_dtype": dtype, "enable_bucketing": True,
        "context_encoding_buckets": list(prompt), "token_generation_buckets": list(context)})
    args = "".join(f"    {k}={f'torch.{v}' if k == 'torch_dtype' else repr(v)},\n" for k, v in config.items())
    header = "\n".join(_header(plan, "NxD Inference's NeuronConfig", "nxdi"))
    text = (f'"""{header}\n"""\nimport torch\n'
            "from neuronx_distributed_inference.models.config import NeuronConfig\n\n"
            f"neuron_config = NeuronConfig(\n{args})\n")
    return {f"nxdi_{plan.target}.py": text,
            f"nxdi_{plan.target}.portkit.json": provenance(plan, "nxdi", lost, ["nxdi.neuron_config"])}, lost


WRITERS = {"pytorch": _pytorch, "vllm": _vllm, "nxdi": _nxdi}
