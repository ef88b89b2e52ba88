"""Real XLA compiles for TPU topologies on a CPU host, and a StableHLO lowering check for Neuron.

TorchTPU compiles through OpenXLA. JAX with libtpu compiles for a real TPU topology with no chip
present (compile-only devices) and torchax runs a PyTorch module as a JAX function, so a user
without a TPU still gets the real compiler's verdict per input shape: compiled or failed, HBM per
device, FLOPs, and whether it fits. Nothing is executed on a TPU. For Neuron (neuronx-cc is not
installable here) the same conversion stops at StableHLO: a lowering check, not a Neuron compile.

    >>> from portkit import models, xla
    >>> m = models.load("minilm")
    >>> report = xla.compile_for_tpu(m, shapes=[{"batch": 8, "seq": 128}], topology="v5e:1x1")
    >>> print(report)                 # per shape: compiled?, seconds, HBM per device, FLOPs, fits
    >>> report.save("results/xla_tpu.json")
    >>> xla.xla_section(m, "neuron", [{"batch": 8, "seq": 128}])    # one line in a notebook cell

Shapes are {"batch": B, "seq": S} (text), {"batch": B} (images), or {input_name: (shape, dtype)}.
Needs `pip install 'portkit[xla]'`; without it `xla_section` returns an `XlaSkipped` saying so.
"""
from __future__ import annotations

import contextlib
import functools
import html
import math
import os
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch import nn

from portkit import probes, targets
from portkit.results import save_result
from portkit.errors import BadParameter, MissingPackage, PortkitError
from portkit.models import LoadedModel

GIB = 2 ** 30
# HBM per chip, Google Cloud's public TPU pages: v4 "HBM2 capacity 32 GiB" (tpu/docs/v4); v5e "HBM
# capacity per chip 16 GiB" (tpu/docs/v5e); v5p 95, v6e 32, TPU7x 192 GiB ("HBM capacity per chip
# (GiB)", tpu/docs/tpu7x, which tabulates all three). TPU7x shows each chip as two JAX devices
# (its two TensorCores, "dual-chiplet"); we give each device an even half of the chip's HBM.
HBM_GIB_PER_CHIP = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "tpu7x": 192}
# Names jax.experimental.topologies.get_topology_desc accepts with libtpu for compile-only devices
# (checked on a CPU-only host, jax 0.10); v4 needs megacore.
TOPOLOGIES = {"v5e:1x1": {}, "v5e:2x2": {}, "v6e:1x1": {}, "v6e:2x2": {}, "v5p:2x2x1": {},
              "v4:2x2x1": {"chip_config_name": "megacore"}, "tpu7x:2x2x1": {}}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INSTALL = "pip install 'portkit[xla]' (or: pip install jax jaxlib libtpu torchax==0.0.13)"
HEADLINES = {
    "compile": "real XLA compile for a TPU topology on a CPU host (compile-only, nothing executed on a TPU)",
    "lowering": "lowering check only (StableHLO export), not a Neuron compile",
}
# JAX's default (jax_enable_x64 off) has no 64-bit types: int64 and float64 compile as 32-bit.
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


# ---------------------------------------------------------------- imports (the torch 2.13 shim)
class _RemovedOverload:
    """Stands in for an ATen overload that torch 2.13 removed; it can never match a dispatched op."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} removed in torch {torch.__version__}>"


def _import_torchax():
    """Import torchax 0.0.13 on torch 2.13 without letting it change torch for the other stages.

    1. torchax names named-tensor overloads (aten.prod.dim_Dimname, aten.all.dimname, ...) in tables
       it builds at import and when its environment is first made; torch 2.13 removed them, so the
       import fails with "aten.prod has no overload name 'dim_Dimname'". While torchax loads, such a
       missing overload resolves to an inert placeholder: nothing can dispatch to an op torch no
       longer has. Any other missing overload still raises.
    2. torchax renames PrivateUse1 to "jax" (its tensors report device "jax:0") and registers
       torch.jax, whose is_available() says True. torch.accelerator.is_available() asks torch.jax,
       so Dynamo then takes "jax" for a usable accelerator, asks it for its current stream, and
       every later torch.compile in the process fails ("PyTorch is not linked with support for jax
       devices"). No torch accelerator exists here: torch.jax answers False from now on. The rename
       is one-way: where torch_tpu or torch_neuronx already claimed PrivateUse1, torchax cannot
       load, and the section is skipped with that reason.
    3. torchax turns PyTorch's MHA fast path off process-wide; the setting is restored.
    """
    original = torch._ops.OpOverloadPacket.__getattr__

    def tolerant(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if "dimname" in key.lower() or "names" in key:
                return _RemovedOverload(f"{self}.{key}")
            raise

    fast_path = torch.backends.mha.get_fastpath_enabled()
    try:
        with mock.patch.object(torch._ops.OpOverloadPacket, "__getattr__", tolerant):
            import torchax
            torchax.default_env()      # loads torchax.decompositions and the op registry
        torchax.device_module.is_available = lambda: False
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    return torchax


# Set for compile-only use, before JAX first loads libtpu (it reads them once, when it loads).
# TPU_WORKER_HOSTNAMES: libtpu asks a cloud metadata server for its workers unless told there are
# none. ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu refuses to load while another process holds
# /tmp/libtpu_lockfile ("Internal error when accessing libtpu multi-process lockfile"); the lock
# guards the chips, and compile-only devices open none (JAX's own multi-process tests set it,
# jax/_src/test_multiprocess.py). On a host with TPU chips neither is set: the lock then protects
# a real device, and the TPU runtime's own settings apply.
COMPILE_ONLY_ENV = {"TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def _compile_only_environment() -> dict[str, str]:
    """Set COMPILE_ONLY_ENV where the user has not (only when this host has no TPU chip); return what
    was set."""
    if probes.tpu_chip_count() != 0:       # chips attached, or the scan unavailable: leave them alone
        return {}
    added = {k: v for k, v in COMPILE_ONLY_ENV.items() if k not in os.environ}
    os.environ.update(added)
    return added


@functools.cache
def _load():
    _compile_only_environment()
    import jax
    return jax, _import_torchax()


def _require_xla():
    """jax and torchax, or MissingPackage with the one line that says what to install."""
    missing = probes.missing_for_xla_tpu_compile()
    if missing:
        raise MissingPackage(f"XLA check skipped: {', '.join(missing)} not installed; {INSTALL}")
    try:
        return _load()
    except (ImportError, AttributeError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = f"; {INSTALL}" if isinstance(exc, ImportError) else ""
        raise MissingPackage(f"XLA check skipped: jax/torchax did not load ({first}){hint}") from exc


# ---------------------------------------------------------------- inputs
def input_specs(model, shape: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{"batch": B, "seq": S} / {"batch": B} / {name: (shape, dtype)} -> {name: (shape, dtype)}."""
    hint = 'give {"batch": B, "seq": S}, {"batch": B} for images, or {input_name: (shape, dtype)}'
    if not isinstance(shape, dict) or not shape:
        raise BadParameter("input shape", shape, hint=hint)
    if set(shape) <= {"batch", "seq"}:
        if not isinstance(model, LoadedModel):
            raise BadParameter("input shape", shape, hint="a bare nn.Module needs {input_name: (shape, dtype)}")
        batch = _positive(shape, "batch")
        if model.takes_text:
            seq = _positive(shape, "seq")
            if seq > model.max_length:
                raise BadParameter("seq", seq, hint=f"{model.name} takes at most {model.max_length} tokens")
            return {name: ((batch, seq), torch.int64) for name in model.input_names}
        if "seq" in shape:
            raise BadParameter("input shape", shape, hint=f"{model.name} takes images: give only the batch")
        size = model.image_size
        return {model.input_names[0]: ((batch, 3, size, size), torch.float32)}
    names = model.input_names if isinstance(model, LoadedModel) else None
    specs = {}
    for name, value in shape.items():
        if names is not None and name not in names:
            raise BadParameter("input name", name, names)
        try:
            dims, dtype = value
            specs[name] = (tuple(int(d) for d in dims), _torch_dtype(dtype))
        except (TypeError, ValueError, AttributeError):
            raise BadParameter(f"shape of input {name!r}", value,
                               hint="give (shape, dtype), e.g. ((8, 128), 'int64')") from None
    return specs


def _positive(shape: dict, key: str) -> int:
    value = shape.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadParameter(key, value, hint=f"{key} must be a positive integer")
    return value


def _torch_dtype(dtype) -> torch.dtype:
    result = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).replace("torch.", ""))
    if not isinstance(result, torch.dtype):
        raise ValueError(dtype)
    return result


def _label(shape: dict, specs: dict) -> str:
    if set(shape) <= {"batch", "seq"}:
        return " ".join(f"{k}={shape[k]}" for k in ("batch", "seq") if k in shape)
    return " ".join(f"{n}={'x'.join(map(str, s))}:{str(d).replace('torch.', '')}" for n, (s, d) in specs.items())


# ---------------------------------------------------------------- results
@dataclass
class ShapeResult:
    """One input shape through the XLA pipeline. Bytes and FLOPs are per device."""
    label: str
    inputs: dict                    # name -> [shape, dtype] as compiled
    status: str                     # compiled | lowered | no_lowering | trace_failed | out_of_hbm | compile_failed
    lower_seconds: float            # torchax trace + lowering to StableHLO
    compile_seconds: float | None = None   # the XLA TPU compiler alone
    message: str | None = None      # the compiler's (or tracer's) own words on failure
    op: str | None = None           # ATen op with no JAX lowering
    module_path: str | None = None  # the nn.Module that was running when it failed
    module_type: str | None = None
    input_sharding: str | None = None
    platform: str | None = None     # platform of the compiled executable's devices (checked: tpu)
    memory: dict | None = None      # argument, output, alias, temporary, generated_code, total bytes
    flops: float | None = None
    bytes_accessed: float | None = None
    fits_hbm: bool | None = None
    stablehlo_ops: int | None = None
    custom_calls: list | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("compiled", "lowered") and self.fits_hbm is not False

    def describe(self, hbm: int | None) -> str:
        if self.status == "lowered":
            calls = f"; custom calls: {', '.join(self.custom_calls)}" if self.custom_calls else ""
            return f"lowered to StableHLO in {self.lower_seconds:.1f} s: {self.stablehlo_ops} ops{calls}"
        if self.status == "compiled":
            m = self.memory
            fit = (f"fits ({m['total'] / hbm:.1%} of {_size(hbm)})" if self.fits_hbm
                   else f"DOES NOT FIT {_size(hbm)}")
            return (f"compiled in {self.compile_seconds:.1f} s (+{self.lower_seconds:.1f} s lowering), "
                    f"{self.input_sharding}; HBM {_size(m['total'])} per device = args {_size(m['argument'])} "
                    f"+ out {_size(m['output'])} + temp {_size(m['temporary'])} + code "
                    f"{_size(m['generated_code'])}, {fit}; {self.flops / 1e9:.2f} GFLOP, "
                    f"{_size(self.bytes_accessed)} accessed")
        where = ""
        if self.module_path is not None:
            where = f" in module {self.module_path or '<top level>'} ({self.module_type})"
        if self.status == "no_lowering":
            return f"NO LOWERING for {self.op}{where}"
        first = (self.message or "").strip().splitlines()[0] if self.message else ""
        verdict = {"out_of_hbm": "DOES NOT FIT HBM, compiler says", "trace_failed": "conversion failed"}
        return f"{verdict.get(self.status, 'compile failed')}{where}: {first}"


@dataclass
class XlaCompileReport:
    """Every shape of one model through XLA for one target: a TPU compile or a Neuron lowering check."""
    model: str
    target: str
    check: str                      # "compile" or "lowering"
    dtype: str
    parameters: int
    parameter_bytes: int            # unique parameters in the compiled dtype
    shapes: list = field(default_factory=list)
    topology: str | None = None
    devices: int | None = None
    device_kind: str | None = None
    hbm_bytes_per_device: int | None = None
    versions: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def headline(self) -> str:
        return HEADLINES[self.check]

    @property
    def ok(self) -> bool:
        return bool(self.shapes) and all(s.ok for s in self.shapes)

    def sanity(self, shape: ShapeResult) -> str | None:
        """Argument bytes the compiler placed on a device vs the parameters plus that device's inputs."""
        if not shape.memory:
            return None
        inputs = sum(math.prod(s) * _itemsize(d) for s, d in shape.inputs.values())
        if shape.input_sharding and shape.input_sharding.startswith("batch"):
            inputs //= self.devices
        expected = self.parameter_bytes + inputs
        return (f"argument bytes {_size(shape.memory['argument'])} vs parameters {_size(self.parameter_bytes)} "
                f"({self.dtype}) + inputs {_size(inputs)}: ratio {shape.memory['argument'] / expected:.3f}")

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "shapes"}
        out["headline"] = self.headline
        out["ok"] = self.ok
        out["shapes"] = [{**asdict(s), "ok": s.ok, "sanity": self.sanity(s)} for s in self.shapes]
        return out

    def save(self, path) -> Path:
        """Write to_dict() as JSON, atomically (a reader never sees half a file)."""
        return save_result(path, self.to_dict())

    def _title(self) -> str:
        if self.check == "lowering":
            return f"{self.target}: {self.headline}"
        return (f"{self.target} {self.topology} ({self.devices} x {self.device_kind}, "
                f"{_size(self.hbm_bytes_per_device)} HBM per device): {self.headline}")

    def __str__(self) -> str:
        lines = [self._title(),
                 f"model {self.model}: {self.parameters / 1e6:.1f} M parameters, {_size(self.parameter_bytes)} "
                 f"in {self.dtype}"]
        for s in self.shapes:
            lines.append(f"  {s.label}: {s.describe(self.hbm_bytes_per_device)}")
            if self.sanity(s):
                lines.append(f"    sanity: {self.sanity(s)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(s.label)}</td><td>{'ok' if s.ok else '<b>FAIL</b>'}</td>"
                       f"<td>{html.escape(s.describe(self.hbm_bytes_per_device))}</td></tr>" for s in self.shapes)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>{html.escape(self._title())}</b><br>model {html.escape(self.model)}, "
                f"{self.parameters / 1e6:.1f} M parameters in {self.dtype}<table><tr><th>shape</th><th></th>"
                f"<th>verdict</th></tr>{rows}</table><ul>{notes}</ul></div>")


@dataclass
class XlaSkipped:
    """The XLA section did not run; `reason` is one line saying why and what to install."""
    target: str
    reason: str

    def to_dict(self) -> dict:
        return {"target": self.target, "skipped": True, "reason": self.reason}

    def save(self, path) -> Path:
        """Write to_dict() as JSON, atomically (a reader never sees half a file)."""
        return save_result(path, self.to_dict())

    def __str__(self) -> str:
        return self.reason

    def _repr_html_(self) -> str:
        return f"<div><b>{html.escape(self.target)}</b>: {html.escape(self.reason)}</div>"


def _size(n) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


# ---------------------------------------------------------------- conversion and compile
@contextlib.contextmanager
def _module_stack(module: nn.Module):
    """Track which submodule is running: forward pre-hooks push its name, forward hooks pop it.

    When tracing raises, the post-hooks of the modules it passes through do not run, so the
    stack still ends with the module that called the failing op."""
    stack, handles = [], []

    def enter(name):
        def hook(_module, _args):
            stack.append(name)      # returns None: a pre-hook's return value would replace the inputs
        return hook

    def leave(_module, _args, _output):
        stack.pop()                 # returns None: a hook's return value would replace the output

    for name, sub in module.named_modules():
        if name:
            handles += [sub.register_forward_pre_hook(enter(name)), sub.register_forward_hook(leave)]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


class _Program:
    """A module converted once by torchax; lowered (and compiled) once per input shape."""

    def __init__(self, module: nn.Module, dtype: torch.dtype | None):
        self.jax, self.torchax = _require_xla()
        self.module = module
        float_dtype = dtype or next((p.dtype for p in module.parameters() if p.is_floating_point()),
                                    torch.float32)
        self.float_dtype = _NARROW.get(float_dtype, float_dtype)
        with warnings.catch_warnings():
            # torchax finds weights by reading every attribute of every submodule, which trips
            # deprecated Hugging Face properties (is_gradient_checkpointing); the user's code did not.
            warnings.simplefilter("ignore", FutureWarning)
            self.states, self.fn = self.torchax.extract_jax(module)

    def narrow(self, dtype: torch.dtype) -> torch.dtype:
        if dtype.is_floating_point:
            return self.float_dtype
        return _NARROW.get(dtype, dtype)

    def abstract(self, specs: dict, states_sharding, input_sharding):
        """ShapeDtypeStructs for weights and inputs, in the compiled dtypes, with the given shardings."""
        struct, mappings = self.jax.ShapeDtypeStruct, self.torchax.ops.mappings
        states = {k: struct(a.shape, mappings.t2j_dtype(self.narrow(mappings.j2t_dtype(a.dtype))),
                            sharding=states_sharding) for k, a in self.states.items()}
        inputs = {n: struct(s, mappings.t2j_dtype(self.narrow(d)), sharding=input_sharding)
                  for n, (s, d) in specs.items()}
        return states, inputs

    def lower(self, states, inputs, result: ShapeResult, platform: str | None = None):
        """Trace and lower; on failure fill `result` with the op, the module path and the message.

        platform: lower for this platform instead of the one the arguments' shardings name."""
        fn = self.fn
        start = time.perf_counter()
        with _module_stack(self.module) as stack, warnings.catch_warnings():
            # jax_enable_x64 is off: int64 narrows to int32 (noted once in the report, not per op).
            warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")
            try:
                traced = self.jax.jit(lambda s, x: fn(s, (), x)).trace(states, inputs)
                return traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
            except Exception as exc:  # noqa: BLE001 - any tracing failure is a finding, reported with its module
                result.status, result.message = "trace_failed", _message(exc)
                if isinstance(exc, self.torchax.tensor.OperatorNotFound):
                    found = re.search(r"name (\S+) has no lowering", str(exc))
                    result.status, result.op = "no_lowering", found.group(1) if found else str(exc)
                result.module_path = stack[-1] if stack else ""      # "" is the model's own forward
                result.module_type = type(self.module.get_submodule(result.module_path)).__name__
                return None
            finally:
                result.lower_seconds = time.perf_counter() - start


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 4000 else text[:4000] + " [...]"


def _prepare(model, shapes, dtype: str | None):
    """Validate everything before any work, then convert the module once."""
    if dtype is not None and dtype not in DTYPES:
        raise BadParameter("dtype", dtype, DTYPES)
    if not isinstance(model, (LoadedModel, nn.Module)):
        raise BadParameter("model", type(model).__name__, ("portkit.models.LoadedModel", "torch.nn.Module"))
    shapes = [shapes] if isinstance(shapes, dict) else list(shapes or ())
    if not shapes:
        raise BadParameter("shape list", shapes, hint='give at least one shape, e.g. [{"batch": 8, "seq": 128}]')
    specs = [input_specs(model, s) for s in shapes]
    program = _Program(model.module if isinstance(model, LoadedModel) else model, DTYPES.get(dtype))
    return shapes, specs, program


def _new_report(model, target: str, check: str, program: _Program) -> XlaCompileReport:
    params = list(program.module.parameters())       # unique: tied weights count once, as XLA holds them
    itemsize = {p: torch.empty((), dtype=program.narrow(p.dtype)).element_size() for p in params}
    return XlaCompileReport(
        model=model.name if isinstance(model, LoadedModel) else type(model).__name__, target=target,
        check=check, dtype=str(program.float_dtype).replace("torch.", ""),
        parameters=sum(p.numel() for p in params), parameter_bytes=sum(p.numel() * itemsize[p] for p in params),
        versions={"torch": torch.__version__, "jax": program.jax.__version__,
                  "jaxlib": probes.package_version("jaxlib"), "libtpu": probes.package_version("libtpu"),
                  "torchax": program.torchax.__version__},
        notes=["JAX runs with 32-bit types (jax_enable_x64 off): int64 inputs and buffers compile as int32, "
               "float64 as float32"])


def _new_result(shape: dict, spec: dict, program: _Program, status: str, **extra) -> ShapeResult:
    inputs = {n: [list(s), str(program.narrow(d)).replace("torch.", "")] for n, (s, d) in spec.items()}
    return ShapeResult(label=_label(shape, spec), inputs=inputs, status=status, lower_seconds=0.0, **extra)


def _topology(name: str) -> str:
    if name not in TOPOLOGIES:
        raise BadParameter("TPU topology", name, TOPOLOGIES)
    return name


def compile_for_tpu(model, shapes, topology: str = "v5e:1x1", dtype: str | None = None) -> XlaCompileReport:
    """Compile `model` with XLA for a TPU topology, once per input shape (compile-only, no TPU needed).

    model: a LoadedModel, or an nn.Module whose forward takes named tensors; shapes: a list of shape
    dicts (module docstring); dtype: "float32" or "bfloat16" for floating weights and inputs, None
    keeps the model's own. A batch that divides over the topology's devices is split over them;
    otherwise every device gets the whole batch (the report says which).
    """
    _topology(topology)
    shapes, specs, program = _prepare(model, shapes, dtype)
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology, **TOPOLOGIES[topology])
    devices = len(topo.devices)
    chips = math.prod(int(d) for d in topology.split(":")[1].split("x"))
    report = _new_report(model, "tpu", "compile", program)
    report.topology, report.devices, report.device_kind = topology, devices, topo.devices[0].device_kind
    report.hbm_bytes_per_device = HBM_GIB_PER_CHIP[topology.split(":")[0]] * GIB * chips // devices
    report.notes += ["memory per device from compiled.memory_analysis(); FLOPs and bytes accessed per device "
                     "from compiled.cost_analysis()",
                     f"sanity ratio near 1: the program holds the weights once, in {report.dtype}; buffers and "
                     "TPU tile padding raise it, parameters XLA prunes as unused (a dropped pooler) lower it"]
    # Every argument carries a sharding on the topology's devices: without one, JAX silently
    # compiles for the host CPU instead (checked, jax 0.10 compile-only). _compiled_platform checks the result.
    mesh = topologies.make_mesh(topo, (devices,), ("batch",))
    replicated, by_batch = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))
    for shape, spec in zip(shapes, specs):
        batches = {s[0] if s else None for s, _ in spec.values()}
        split = devices > 1 and len(batches) == 1 and (batches.pop() or 1) % devices == 0
        result = _new_result(shape, spec, program, "compiled", input_sharding=(
            f"batch split over {devices} devices" if split else f"replicated on {devices} device(s)"))
        report.shapes.append(result)
        lowered = program.lower(*program.abstract(spec, replicated, by_batch if split else replicated), result)
        if lowered is None:
            continue
        start = time.perf_counter()
        try:
            compiled = lowered.compile()
        except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the finding
            result.message = _message(exc)
            oom = "RESOURCE_EXHAUSTED" in result.message or "HbmOom" in result.message
            result.status, result.fits_hbm = ("out_of_hbm", False) if oom else ("compile_failed", None)
            continue
        finally:
            result.compile_seconds = time.perf_counter() - start
        result.platform = _compiled_platform(program.jax, compiled, topology)
        _measure(compiled, result, report.hbm_bytes_per_device)
    return report


def _compiled_platform(jax, compiled, topology: str) -> str:
    """The platform of the executable's devices; anything but TPU is a bug, never a result."""
    shardings = jax.tree.leaves(compiled.input_shardings) + jax.tree.leaves(compiled.output_shardings)
    platforms = {d.platform for s in shardings for d in s.device_set}
    if platforms != {"tpu"}:
        raise PortkitError(f"the XLA compile for {topology} targeted {sorted(platforms) or 'no device'}, not TPU: "
                           "an argument lost its sharding on the topology's devices")
    return "tpu"


def _measure(compiled, result: ShapeResult, hbm: int) -> None:
    stats = compiled.memory_analysis()
    m = {"argument": stats.argument_size_in_bytes, "output": stats.output_size_in_bytes,
         "alias": stats.alias_size_in_bytes, "temporary": stats.temp_size_in_bytes,
         "generated_code": stats.generated_code_size_in_bytes}
    m["total"] = m["argument"] + m["output"] - m["alias"] + m["temporary"] + m["generated_code"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost     # older jax returned one dict per program
    # cost_analysis()["optimal_seconds"] is left out on purpose: it came out negative for compile-only
    # TPU topologies (checked, jax 0.10 with libtpu).
    result.memory, result.fits_hbm = m, m["total"] <= hbm
    result.flops, result.bytes_accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def check_lowering(model, shapes, dtype: str | None = None) -> XlaCompileReport:
    """The Neuron check: convert with torchax and lower to StableHLO per shape; no Neuron compile."""
    shapes, specs, program = _prepare(model, shapes, dtype)
    report = _new_report(model, "neuron", "lowering", program)
    report.notes.append("StableHLO from JAX's generic accelerator lowering (platform 'tpu'; a CPU lowering would "
                        "call LAPACK); custom calls are platform-specific and neuronx-cc must accept them")
    for shape, spec in zip(shapes, specs):
        result = _new_result(shape, spec, program, "lowered")
        report.shapes.append(result)
        lowered = program.lower(*program.abstract(spec, None, None), result, platform="tpu")
        if lowered is not None:
            text = lowered.as_text(dialect="stablehlo")
            # Operations of the stablehlo and chlo dialects; '#stablehlo.' attributes and '!' types excluded.
            result.stablehlo_ops = len(re.findall(r"(?<![#!\w])(?:stablehlo|chlo)\.[a-z_]+", text))
            result.custom_calls = sorted(set(re.findall(r"custom_call @([\w.$-]+)", text)))
    return report


def xla_section(model, target_name: str, shapes, topology: str = "v5e:1x1",
                dtype: str | None = None) -> XlaCompileReport | XlaSkipped:
    """One notebook line: the target's XLA check (TPU compile or Neuron lowering), or why it was skipped.

    model: a LoadedModel, an nn.Module, or a name for portkit.models.load."""
    check = targets.get(target_name).xla_check
    _topology(topology)
    if check is None:
        return XlaSkipped(target_name, f"XLA check skipped: {target_name} is a reference platform, not an XLA target")
    try:
        _require_xla()
    except MissingPackage as exc:
        return XlaSkipped(target_name, str(exc))
    if isinstance(model, str):
        from portkit import models
        model = models.load(model)
    if check == "compile":
        return compile_for_tpu(model, shapes, topology=topology, dtype=dtype)
    return check_lowering(model, shapes, dtype=dtype)


# ---------------------------------------------------------------- the workbook stage (notebook 03b)
STAGE = "xla"


def check_parameters(topology: str = "v5e:1x1", dtype: str = "float32", batch_size: int = 1,
                     seq_len: int = 128, max_shapes: int = 4) -> None:
    """The notebook's validation cell, also run by the runner before anything is written."""
    from portkit import params
    _topology(topology)
    params.choice("dtype", dtype, DTYPES)
    params.positive_int("batch_size", batch_size)
    params.positive_int("seq_len", seq_len)
    params.positive_int("max_shapes", max_shapes)


def _read(path: Path) -> dict:
    import json
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def stage_shapes(out_dir, target: str, model, batch_size: int = 1, seq_len: int = 128,
                 max_shapes: int = 4) -> tuple[list[dict], list[str]]:
    """The shapes the workbook uses for `target`: stage 2's fixed shape and stage 3's buckets (from the
    run folder), else the parameters. Returns (shapes, where each came from)."""
    out_dir = Path(out_dir)
    found: list[tuple[dict, str]] = []
    fixed = _read(out_dir / "compile.json").get("targets", {}).get(target, {}).get("fixed_shape")
    if isinstance(fixed, dict) and fixed.get("seq"):
        found.append(({"batch": int(fixed.get("batch", 1)), "seq": int(fixed["seq"])}, "stage 2's fixed shape"))
    chosen = _read(out_dir / "buckets.json").get("targets", {}).get(target, {}).get("chosen", {})
    for shape in chosen.get("shapes") or []:
        if isinstance(shape, dict) and shape.get("seq"):
            found.append(({"batch": int(shape.get("batch", 1)), "seq": int(shape["seq"])},
                          f"stage 3's {chosen.get('planner', '')} bucket".replace("  ", " ")))
    if not getattr(model, "takes_text", True):
        found = [({"batch": b}, src) for b, src in dict.fromkeys((s.get("batch", batch_size), src)
                                                                  for s, src in found)] or []
    if not found:
        found = [({"batch": batch_size, "seq": seq_len} if getattr(model, "takes_text", True)
                  else {"batch": batch_size}, "parameters batch_size/seq_len (no compile.json or buckets.json)")]
    unique: dict[tuple, tuple[dict, str]] = {}
    for shape, source in found:
        unique.setdefault(tuple(sorted(shape.items())), (shape, source))
    ordered = sorted(unique.values(), key=lambda s: (s[0].get("seq", 0), s[0].get("batch", 0)))
    if len(ordered) > max_shapes:   # keep the largest: HBM fit is decided by them
        ordered = ordered[-max_shapes:]
    return [s for s, _ in ordered], [src for _, src in ordered]


def _findings(report) -> list[dict]:
    if isinstance(report, XlaSkipped):
        return []
    out = []
    for s in report.shapes:
        if s.ok:
            continue
        text = f"{s.label}: {s.describe(report.hbm_bytes_per_device)}"
        if report.check == "lowering":
            out.append({"kind": "xla_lowering", "severity": "work", "message": f"StableHLO lowering check: {text}",
                        "advice": "the op or module has no StableHLO form through torchax; check it with "
                                  "neuronx-cc on a Trainium host, or rewrite it"})
        elif s.status == "no_lowering":
            out.append({"kind": "xla_lowering", "severity": "work", "message": f"XLA compile for {report.topology}: {text}",
                        "advice": "torchax has no JAX lowering for this op; TorchTPU's own lowering may differ, so "
                                  "check it on a TPU, or replace the op"})
        elif s.status == "out_of_hbm" or s.fits_hbm is False:
            out.append({"kind": "hbm", "severity": "blocker", "message": f"{report.topology}: {text}",
                        "advice": "does not fit this topology's HBM: choose a larger topology (parameter "
                                  "topology), shard the model, or use smaller buckets/batches"})
        else:
            out.append({"kind": "xla_compile", "severity": "blocker", "message": f"XLA compile for {report.topology}: {text}",
                        "advice": "the real XLA TPU compiler rejects this shape; read its message above"})
    return out


@dataclass
class XlaStage:
    """Stage 3b: the XLA check of every target over the workbook's shapes."""
    model: dict
    reports: dict                   # target -> XlaCompileReport | XlaSkipped
    sources: dict                   # target -> where each shape came from

    def summary_for(self, name: str) -> str:
        r = self.reports[name]
        if isinstance(r, XlaSkipped):
            return f"{name}: skipped ({r.reason})"
        done = sum(s.ok for s in r.shapes)
        if r.check == "lowering":
            return f"{name} (lowering check only, not a Neuron compile): {done}/{len(r.shapes)} shapes lowered to StableHLO"
        peak = max((s.memory["total"] for s in r.shapes if s.memory), default=0)
        return (f"{name} {r.topology} (real XLA compile for a TPU topology, compile-only on this CPU host): "
                f"{done}/{len(r.shapes)} shapes compiled and fit {_size(r.hbm_bytes_per_device)} HBM per device; "
                f"largest {_size(peak)}")

    def summary(self) -> str:
        return " | ".join(self.summary_for(n) for n in self.reports)

    def to_dict(self) -> dict:
        targets_out = {}
        for name, r in self.reports.items():
            detected = targets.detect(name)
            # The XLA check runs the real compiler (TPU) or exporter (Neuron) on this CPU host whatever
            # the target's mode; "target" is the detected target, as in every stage's JSON.
            targets_out[name] = {**r.to_dict(), "target": detected.to_dict(), "summary": self.summary_for(name),
                                 "shape_sources": self.sources.get(name, []), "findings": _findings(r)}
        return {"stage": STAGE, "model": self.model, "summary": self.summary(), "targets": targets_out}

    def save(self, path) -> Path:
        return save_result(path, self.to_dict())

    def __str__(self) -> str:
        return "\n\n".join(str(r) for r in self.reports.values())

    def _repr_html_(self) -> str:
        return "".join(r._repr_html_() for r in self.reports.values())


def run_stage(model, target_names, out_dir, topology: str = "v5e:1x1", dtype: str = "float32",
              batch_size: int = 1, seq_len: int = 128, max_shapes: int = 4) -> XlaStage:
    """Run each target's XLA check over the shapes the earlier stages chose."""
    from tqdm.auto import tqdm
    reports, sources = {}, {}
    for name in tqdm(list(target_names), desc="XLA checks", unit="target"):
        shapes, sources[name] = stage_shapes(out_dir, name, model, batch_size, seq_len, max_shapes)
        reports[name] = xla_section(model, name, shapes, topology=topology, dtype=dtype)
    return XlaStage(model.describe() if hasattr(model, "describe") else {"name": str(model)}, reports, sources)
