"""Real XLA compiles for TPU topologies on a CPU host, and a StableHLO lowering check for Neuron.

TorchTPU compiles through OpenXLA. JAX with libtpu compiles for a real TPU topology with no chip
present (compile-only devices) and torchax runs a PyTorch module as a JAX function, so a user
without a TPU still gets the real compiler's verdict per input shape: compiled or failed, HBM per
device, FLOPs, and whether it fits. Nothing is executed on a TPU. For Neuron (neuronx-cc is not
installable here) the same conversion stops at StableHLO: a lowering check, not a Neuron compile.

    >>> from portkit import models
    >>> from portkit.tpu_compile import compiler
    >>> m = models.load("minilm")
    >>> report = compiler.compile_for_tpu(m, shapes=[{"batch": 8, "seq": 128}], topology="v5e:1x1")
    >>> print(report)                 # per shape: compiled?, seconds, HBM per device, FLOPs, fits
    >>> compiler.check_lowering(m, [{"batch": 8, "seq": 128}])         # Neuron: StableHLO only

Every TPU compile verdict is kept in portkit's verdict cache (portkit.tpu_compile.cache), keyed by the lowered module
and the compile context: a shape is never compiled twice, by a rerun or another stage (its ShapeResult says
`cached`); a program key names the verdict before any lowering, so a rerun does not even import jax.
Shapes are {"batch": B, "seq": S} (text), {"batch": B} (images), or {input_name: (shape, dtype)}.
Needs `pip install 'portkit[xla]'`; without it these raise MissingPackage with the one line to run.
"""
from __future__ import annotations

import copy

import functools
import os
import re
import time
import warnings

import torch
from torch import nn

from portkit.core import torch_private
from portkit.core import availability
from portkit.core import owners
from portkit.core import placement
from portkit.tpu_compile import cache
from portkit.tpu_compile import lowerings
from portkit.models.meta_device import extract_abstract as _extract_abstract, is_abstract  # noqa: F401 (re-exported)
from portkit.core.errors import BadParameter, MissingPackage, PortkitError
from portkit.models.registry import LoadedModel
from portkit.core.module_stack import ModuleTracker
from portkit.tpu_compile.results import (GIB, HBM_GIB_PER_CHIP, ShapeResult, XlaCompileReport,  # noqa: F401
                                         collectives, compiled_collectives, hbm_per_device)
# Names jax.experimental.topologies.get_topology_desc accepts with libtpu for compile-only devices
# (checked on a CPU-only host, jax 0.10); v4 needs megacore.
TOPOLOGIES = {"v5e:1x1": {}, "v5e:2x2": {}, "v5e:2x4": {}, "v6e:1x1": {}, "v6e:2x2": {}, "v6e:2x4": {},
              "v5p:2x2x1": {}, "v5p:2x2x2": {},
              "v4:2x2x1": {"chip_config_name": "megacore"}, "tpu7x:2x2x1": {}}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INSTALL = "pip install 'portkit[xla]' (or: pip install jax jaxlib libtpu torchax==0.0.13)"
# Environment variables XLA and libtpu read compiler flags from: part of every verdict's cache key.
FLAG_VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
# JAX's default (jax_enable_x64 off) has no 64-bit types: int64 and float64 compile as 32-bit.
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


# ---------------------------------------------------------------- imports (the torch 2.13 shim)
def _import_torchax():
    """Import torchax 0.0.13 on torch 2.13 without letting it change torch for the other stages.

    1. torchax names named-tensor overloads (aten.prod.dim_Dimname, aten.all.dimname, ...) in tables
       it builds at import and when its environment is first made; torch 2.13 removed them, so the
       import fails with "aten.prod has no overload name 'dim_Dimname'". While torchax loads, such a
       missing overload resolves to an inert placeholder (portkit.core.torch_private owns that patch); any other
       missing overload still raises.
    2. torchax renames PrivateUse1 to "jax" (its tensors report device "jax:0") and registers
       torch.jax, whose is_available() says True. torch.accelerator.is_available() asks torch.jax,
       so Dynamo then takes "jax" for a usable accelerator, asks it for its current stream, and
       every later torch.compile in the process fails ("PyTorch is not linked with support for jax
       devices"). No torch accelerator exists here: torch.jax answers False from now on. The rename
       is one-way: where torch_tpu or torch_neuronx already claimed PrivateUse1, torchax cannot
       load, and the section is skipped with that reason.
    3. torchax turns PyTorch's MHA fast path off process-wide; the setting is restored.
    4. portkit's lowerings of ATen ops torchax 0.0.13 leaves unlowered (portkit.tpu_compile.lowerings) join its
       op registry before its environment first reads it.
    """
    fast_path = torch.backends.mha.get_fastpath_enabled()
    try:
        with torch_private.removed_named_overloads_tolerated():
            import torchax
            lowerings.register()
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
    if availability.tpu_chip_count() != 0:       # chips attached, or the scan unavailable: leave them alone
        return {}
    added = {k: v for k, v in COMPILE_ONLY_ENV.items() if k not in os.environ}
    os.environ.update(added)
    return added


@functools.cache
def _load():
    _compile_only_environment()
    import jax
    return jax, _import_torchax()


def require_installed() -> None:
    """MissingPackage with the one line that says what to install, unless jax, jaxlib, libtpu and torchax
    are installed (nothing is imported: a check served from the cache needs none of them loaded)."""
    missing = availability.missing_for_xla_tpu_compile()
    if missing:
        raise MissingPackage(f"XLA check skipped: {', '.join(missing)} not installed; {INSTALL}")


def require_xla():
    """jax and torchax, or MissingPackage with the one line that says what to install."""
    require_installed()
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
        batch, decl, dim = _positive(shape, "batch"), model.declaration, model.seq_dim   # the model's declaration
        if dim is None and "seq" in shape:
            raise BadParameter("input shape", shape, hint=f"{model.name} takes one input shape: give only the batch")
        seq = _positive(shape, "seq") if dim is not None else None
        if dim is not None and seq > model.max_length:
            raise BadParameter("seq", seq, hint=f"{model.name} takes at most {model.max_length} {dim}")
        sizes = {d.name: d.max for d in decl.varying} | {dim: seq}      # any other varying dimension: its largest
        return {s.name: (decl.shape_of(s.name, batch, sizes), s.dtype) for s in decl.inputs}
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


# ---------------------------------------------------------------- conversion and compile
def baked(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """The module the conversion traces: `module` itself, or where it holds parametrizations (weight norm: wav2vec2's
    positional convolution), a copy with each parametrized tensor computed once and kept as a plain parameter
    (what torch.nn.utils.parametrize.remove_parametrizations(leave_parametrized=True) leaves), as an inference export
    bakes them: torchax swaps weights in through the parametrization's right_inverse, whose Tensor.set_ has no lowering.
    Returns (module, the baked tensors' names)."""
    from torch.nn.utils import parametrize
    names = [f"{n}.{t}" if n else t for n, m in module.named_modules() if parametrize.is_parametrized(m)
             for t in m.parametrizations]
    if not names:
        return module, []
    copied = copy.deepcopy(module)
    for _, m in list(copied.named_modules()):
        if parametrize.is_parametrized(m):
            values = {t: getattr(m, t).detach() for t in m.parametrizations}
            # parametrize made the module a subclass holding a property per tensor, a class the copy shares with the
            # original: the copy goes back to its own class (remove_parametrizations would delete the property from
            # the shared class, and the user's model would lose its weight)
            m.__class__ = type(m).__bases__[0]
            del m._modules["parametrizations"]
            for t, value in values.items():
                m.register_parameter(t, nn.Parameter(value, requires_grad=False))
    return copied, names


class Program:
    """A module converted by torchax when first lowered (never, when every shape comes from the cache);
    lowered (and compiled) once per input shape."""

    def __init__(self, module: nn.Module, dtype: torch.dtype | None):
        self.module, self.baked = baked(module)
        float_dtype = dtype or next((p.dtype for p in module.parameters() if p.is_floating_point()),
                                    torch.float32)
        self.float_dtype = _NARROW.get(float_dtype, float_dtype)
        self._converted = None

    def _convert(self) -> tuple:
        if self._converted is None:
            jax, torchax = require_xla()
            with warnings.catch_warnings():
                # torchax finds weights by reading every attribute of every submodule, which trips
                # deprecated Hugging Face properties (is_gradient_checkpointing); the user's code did not.
                warnings.simplefilter("ignore", FutureWarning)
                if is_abstract(self.module):   # meta weights: shapes and dtypes only (a real-size model)
                    states, fn = _extract_abstract(jax, torchax, self.module)
                else:
                    states, fn = torchax.extract_jax(self.module)
            self._converted = (jax, torchax, states, fn)
        return self._converted

    jax = property(lambda self: self._convert()[0])
    torchax = property(lambda self: self._convert()[1])
    states = property(lambda self: self._convert()[2])
    fn = property(lambda self: self._convert()[3])

    def key(self, result: ShapeResult, check: str, context: dict) -> str | None:
        """The program key of one shape's check (portkit.tpu_compile.cache.program_key), the digests of this code
        and of portkit's own lowerings included."""
        return cache.program_key(self.module, result.inputs, check,
                                 {**context, "code": cache.source_digest(Program),
                                  "lowerings": cache.source_digest(lowerings.register)})

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
        # unwind_on_error=False: when tracing raises, the post-hooks of the modules it passes through
        # do not run, so the tracker still names the module that called the failing op.
        tracker = ModuleTracker(self.module, root="", unwind_on_error=False)
        # placement.tensors_kept: a forward that stores a tensor on its module leaves no converted tensor there
        with tracker, warnings.catch_warnings(), placement.tensors_kept(self.module):
            # jax_enable_x64 is off: int64 narrows to int32 (noted once in the report, not per op).
            warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")
            try:
                traced = self.jax.jit(lambda s, x: fn(s, (), x)).trace(states, inputs)
                return traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
            except Exception as exc:  # noqa: BLE001 - any tracing failure is a finding, reported with its module
                result.status, result.message = "trace_failed", error_message(exc)
                if isinstance(exc, self.torchax.tensor.OperatorNotFound):
                    found = re.search(r"name (\S+) has no lowering", str(exc))
                    result.status, result.op = "no_lowering", found.group(1) if found else str(exc)
                result.module_path = tracker.current      # "" is the model's own forward
                result.where = model_frame(exc)
                result.module_type = type(self.module.get_submodule(result.module_path)).__name__
                return None
            finally:
                result.lower_seconds = time.perf_counter() - start


# The conversion's own packages: a frame in them is portkit's machinery at work, not the model's line.
CONVERSION_PACKAGES = ("torchax", "jax", "jaxlib")


def model_frame(exc: BaseException) -> dict | None:
    """The innermost frame of the model's code (the user's or a library's, not torch, portkit, the stdlib or the
    conversion's packages) in the traceback of a failed trace: the line that called the op."""
    found = owners.innermost([f for f in owners.frames_of(exc) if owners.package(f["file"]) not in CONVERSION_PACKAGES])
    return {k: v for k, v in found.items() if k != "line_key"} if found else None


def error_message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 4000 else text[:4000] + " [...]"


def prepare(model, shapes, dtype: str | None):
    """Validate everything before any work, then convert the module once."""
    if dtype is not None and dtype not in DTYPES:
        raise BadParameter("dtype", dtype, DTYPES)
    if not isinstance(model, (LoadedModel, nn.Module)):
        raise BadParameter("model", type(model).__name__, ("portkit.models.registry.LoadedModel", "torch.nn.Module"))
    shapes = [shapes] if isinstance(shapes, dict) else list(shapes or ())
    if not shapes:
        raise BadParameter("shape list", shapes, hint='give at least one shape, e.g. [{"batch": 8, "seq": 128}]')
    specs = [input_specs(model, s) for s in shapes]
    program = Program(model.module if isinstance(model, LoadedModel) else model, DTYPES.get(dtype))
    return shapes, specs, program


def new_report(model, target: str, check: str, program: Program) -> XlaCompileReport:
    params = list(program.module.parameters())       # unique: tied weights count once, as XLA holds them
    itemsize = {p: torch.empty((), dtype=program.narrow(p.dtype)).element_size() for p in params}
    return XlaCompileReport(
        model=model.name if isinstance(model, LoadedModel) else type(model).__name__, target=target,
        check=check, dtype=str(program.float_dtype).replace("torch.", ""),
        parameters=sum(p.numel() for p in params), parameter_bytes=sum(p.numel() * itemsize[p] for p in params),
        versions={"torch": torch.__version__, "jax": availability.package_version("jax"),
                  "jaxlib": availability.package_version("jaxlib"), "libtpu": availability.package_version("libtpu"),
                  "torchax": availability.package_version("torchax")},
        notes=["JAX runs with 32-bit types (jax_enable_x64 off): int64 inputs and buffers compile as int32, "
               "float64 as float32"] + ([f"{len(program.baked)} parametrized weight(s) ({program.baked[0]}, weight "
                                          "norm or another parametrization) computed once and compiled as plain "
                                          "weights, as an inference export bakes them"] if program.baked else []))


def new_result(shape: dict, spec: dict, program: Program, status: str, **extra) -> ShapeResult:
    inputs = {n: [list(s), str(program.narrow(d)).replace("torch.", "")] for n, (s, d) in spec.items()}
    return ShapeResult(label=_label(shape, spec), inputs=inputs, status=status, lower_seconds=0.0, **extra)


def check_topology(name: str) -> str:
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
    check_topology(topology)
    shapes, specs, program = prepare(model, shapes, dtype)
    require_installed()
    report = new_report(model, "tpu", "compile", program)
    results = [new_result(shape, spec, program, "compiled") for shape, spec in zip(shapes, specs)]
    keys = [program.key(r, "compile", {"topology": topology, "topology_options": TOPOLOGIES[topology],
                                       "dtype": report.dtype, "flags": {k: os.environ.get(k) for k in FLAG_VARIABLES}})
            for r in results]
    hits = [_compile_hit(key) for key in keys]
    if all(hits):       # every verdict is in the cache: no jax, no libtpu, no conversion, no lowering
        topo, devices, device_kind = None, hits[0][0]["devices"], hits[0][0]["device_kind"]
    else:
        require_xla()       # first: it sets the compile-only environment libtpu reads when it loads
        from jax.experimental import topologies
        from jax.sharding import NamedSharding, PartitionSpec
        topo = topologies.get_topology_desc(platform="tpu", topology_name=topology, **TOPOLOGIES[topology])
        devices, device_kind = len(topo.devices), topo.devices[0].device_kind
    report.topology, report.devices, report.device_kind = topology, devices, device_kind
    report.hbm_bytes_per_device = hbm_per_device(topology, devices)
    report.notes += ["memory per device from compiled.memory_analysis(); FLOPs and bytes accessed per device "
                     "from compiled.cost_analysis()",
                     f"sanity ratio near 1: the program holds the weights once, in {report.dtype}; buffers and "
                     "TPU tile padding raise it, parameters XLA prunes as unused (a dropped pooler) lower it"]
    report.verdict_cache = str(cache.cache_dir())
    if topo is not None:
        # Every argument carries a sharding on the topology's devices: without one, JAX silently
        # compiles for the host CPU instead (checked, jax 0.10 compile-only). _compiled_platform checks the result.
        mesh = topologies.make_mesh(topo, (devices,), ("batch",))
        replicated, by_batch = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))
        context = compile_context(topology, topo, report)
    for spec, result, key, hit in zip(specs, results, keys, hits):
        report.shapes.append(result)
        if hit:
            entry, verdict = hit
            result.input_sharding, result.lower_seconds = entry["input_sharding"], entry["lower_seconds"]
            result.cached = True
            apply_verdict(verdict, result, report.hbm_bytes_per_device)
            continue
        batches = {s[0] if s else None for s, _ in spec.values()}
        split = devices > 1 and len(batches) == 1 and (batches.pop() or 1) % devices == 0
        result.input_sharding = f"batch split over {devices} devices" if split else f"replicated on {devices} device(s)"
        lowered = program.lower(*program.abstract(spec, replicated, by_batch if split else replicated), result)
        if lowered is not None:
            verdict, result.cached, verdict_key = compiler_verdict(program.jax, lowered, topology, context)
            apply_verdict(verdict, result, report.hbm_bytes_per_device)
            if verdict_key is not None:
                cache.store_program(key, {"verdict_key": verdict_key, "input_sharding": result.input_sharding,
                                              "lower_seconds": result.lower_seconds, "devices": devices,
                                              "device_kind": device_kind})
    return report


def _compile_hit(key: str | None) -> tuple[dict, cache.Verdict] | None:
    """The program entry and cached verdict of a shape's compile, when both are in the cache and sound."""
    entry = cache.load_program(key)
    if entry is None or not isinstance(entry.get("verdict_key"), str):
        return None
    fields = {"input_sharding": str, "lower_seconds": (int, float), "devices": int, "device_kind": str}
    if not all(isinstance(entry.get(k), t) for k, t in fields.items()) or entry["devices"] < 1:
        return None
    verdict = cache.load(entry["verdict_key"])
    return (entry, verdict) if verdict is not None else None


def compile_context(topology: str, topo, report: XlaCompileReport) -> dict:
    """Everything beside the lowered module that decides the compiler's verdict: the verdict cache's key."""
    return {"topology": topology, "topology_options": TOPOLOGIES[topology], "devices": report.devices,
            "device_kind": topo.devices[0].device_kind, "dtype": report.dtype,
            "versions": {k: report.versions.get(k) for k in ("jax", "jaxlib", "libtpu")},
            "flags": {k: os.environ.get(k) for k in FLAG_VARIABLES},
            "compile_options": {}}      # lowered.compile() is called with none


def compiler_verdict(jax, lowered, topology: str, context: dict) -> tuple[cache.Verdict, bool, str | None]:
    """The compiler's verdict on a lowered program, whether it came from the verdict cache (else it was
    compiled now, and cached when repeatable), and its key when it is in the cache now (else None)."""
    key = cache.verdict_key(lowered.as_text(), context)
    cached = cache.load(key)
    if cached is not None:
        return cached, True, key
    measured_at, start = cache.now(), time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the finding
        message = error_message(exc)
        oom = "RESOURCE_EXHAUSTED" in message or "HbmOom" in message
        verdict = cache.Verdict("out_of_hbm" if oom else "compile_failed", time.perf_counter() - start,
                                    measured_at, message=message)
    else:
        seconds = time.perf_counter() - start
        verdict = cache.Verdict("compiled", seconds, measured_at, _compiled_platform(jax, compiled, topology),
                                    **_measure(compiled))
    return verdict, False, key if cache.store(key, verdict, context) is not None else None


def apply_verdict(verdict: cache.Verdict, result: ShapeResult, hbm: int) -> None:
    """Fill `result` from a verdict; whether it fits is decided here, against this topology's HBM."""
    for name in ("status", "compile_seconds", "measured_at", "platform", "memory", "message", "flops",
                 "bytes_accessed", "collectives"):
        setattr(result, name, getattr(verdict, name))
    if verdict.status == "compiled":
        result.fits_hbm = verdict.memory["total"] <= hbm
    elif verdict.status == "out_of_hbm":
        result.fits_hbm = False


def _compiled_platform(jax, compiled, topology: str) -> str:
    """The platform of the executable's devices; anything but TPU is a bug, never a result."""
    shardings = jax.tree.leaves(compiled.input_shardings) + jax.tree.leaves(compiled.output_shardings)
    platforms = {d.platform for s in shardings for d in s.device_set}
    if platforms != {"tpu"}:
        raise PortkitError(f"the XLA compile for {topology} targeted {sorted(platforms) or 'no device'}, not TPU: "
                           "an argument lost its sharding on the topology's devices")
    return "tpu"


def _measure(compiled) -> dict:
    """Memory per device (bytes), FLOPs and bytes accessed of a compiled executable."""
    stats = compiled.memory_analysis()
    m = {"argument": stats.argument_size_in_bytes, "output": stats.output_size_in_bytes,
         "alias": stats.alias_size_in_bytes, "temporary": stats.temp_size_in_bytes,
         "generated_code": stats.generated_code_size_in_bytes}
    m["total"] = m["argument"] + m["output"] - m["alias"] + m["temporary"] + m["generated_code"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost     # older jax returned one dict per program
    # cost_analysis()["optimal_seconds"] is left out on purpose: it came out negative for compile-only
    # TPU topologies (checked, jax 0.10 with libtpu).
    return {"memory": m, "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)), "collectives": compiled_collectives(compiled)}


def check_lowering(model, shapes, dtype: str | None = None) -> XlaCompileReport:
    """The Neuron check: convert with torchax and lower to StableHLO per shape; no Neuron compile."""
    shapes, specs, program = prepare(model, shapes, dtype)
    report = new_report(model, "neuron", "lowering", program)
    report.notes.append("StableHLO from JAX's generic accelerator lowering (platform 'tpu'; a CPU lowering would "
                        "call LAPACK); custom calls are platform-specific and neuronx-cc must accept them")
    report.verdict_cache = str(cache.programs_dir())
    for shape, spec in zip(shapes, specs):
        result = new_result(shape, spec, program, "lowered")
        report.shapes.append(result)
        key = program.key(result, "lowering", {"platform": "tpu", "dtype": report.dtype})
        entry = cache.load_program(key) or {}
        figures = {"stablehlo_ops": int, "custom_calls": list, "lower_seconds": (int, float), "measured_at": str}
        if all(isinstance(entry.get(k), t) for k, t in figures.items()):     # lowered before: read back
            for name in figures:
                setattr(result, name, entry[name])
            result.cached = True
            continue
        result.measured_at = cache.now()
        lowered = program.lower(*program.abstract(spec, None, None), result, platform="tpu")
        if lowered is not None:
            text = lowered.as_text(dialect="stablehlo")
            # Operations of the stablehlo and chlo dialects; '#stablehlo.' attributes and '!' types excluded.
            result.stablehlo_ops = len(re.findall(r"(?<![#!\w])(?:stablehlo|chlo)\.[a-z_]+", text))
            result.custom_calls = sorted(set(re.findall(r"custom_call @([\w.$-]+)", text)))
            cache.store_program(key, {name: getattr(result, name) for name in figures})
    return report


def compile_seconds(model, shape: dict, topology: str = "v5e:1x1",
                    dtype: str | None = None) -> tuple[float | None, str]:
    """What one input shape's XLA compile for a TPU topology costs, in seconds, and where the figure came from.

    The figure is the real XLA TPU compiler's time for that shape (compile-only, as in compile_for_tpu):
    read from portkit's verdict cache when this shape was compiled before, else measured now (and
    cached, so the xla stage and every later caller reuse it). Returns (seconds, source); seconds is
    None when the shape never reached the compiler (it did not convert or lower; source says why).
    A refused compile (out of HBM) still has its seconds: the time the compiler took to refuse.
    Raises like compile_for_tpu (BadParameter, MissingPackage). The source reads the same whether the figure was
    measured now or read from the cache (a rerun's texts do not change); compile_for_tpu's results say which
    (ShapeResult.cached, measured_at), as stage 3b's xla.json records them.

        >>> seconds, source = compile_seconds(models.load("minilm"), {"batch": 1, "seq": 128})
        >>> source                    # 'XLA compile for v5e:1x1, measured on this host (compile-only)'
    """
    report = compile_for_tpu(model, [shape], topology=topology, dtype=dtype)
    result = report.shapes[0]
    if result.compile_seconds is None:
        return None, f"no XLA compile for {topology}: {result.describe(report.hbm_bytes_per_device)}"
    refused = "" if result.status == "compiled" else f" ({result.status})"
    return result.compile_seconds, f"XLA compile for {topology}{refused}, measured on this host (compile-only)"
