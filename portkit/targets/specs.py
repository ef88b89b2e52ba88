"""The targets portkit moves models to, as data: one frozen entry per target, one `detect()`.

    >>> from portkit.targets import specs
    >>> t = specs.detect("tpu")
    >>> t.mode, t.target.static_shapes, t.target.default_precision.name
    ('emulated', True, 'default')
    >>> t.op_table.classify("aten::addmm").status
    'composite'

A stage never branches on a target's name: it asks the entry (device string, compile backend,
static-shape rule, dtype rules, precisions, op table) and the detected mode (native or emulated).

On a host with the vendor's device, `PORTKIT_MODE=emulated` makes every target emulated all the same
(to compare the emulation with the hardware, or to run the test suite's emulated checks there).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field

import torch

from portkit.core import availability
from portkit.core import locations
from portkit.core import torch_private
from portkit.targets.privateuse1_ops import FUNCTIONAL_FORMS, PRIVATEUSE1_PATH
from portkit.core.errors import BadParameter
from portkit.core.findings import BLOCKER, INFO, SEVERITIES, WORK  # noqa: F401 (re-exported: targets.BLOCKER, ...)

DATA = locations.DATA / "targets"

NATIVE, COMPOSITE, CPU_FALLBACK, UNSUPPORTED = "native", "composite", "cpu_fallback", "unsupported"
STATUSES = (NATIVE, COMPOSITE, CPU_FALLBACK, UNSUPPORTED)   # how an op runs eagerly on the target
# Under torch.compile only: the target's compiler rewrites the op into other ops before lowering
# (OpTable.compile_decomposed), so it lowers even without a kernel of its own.
DECOMPOSED = "decomposed"


@dataclass(frozen=True)
class Precision:
    """One numerics setting of a target, as its compiler applies it to float32 programs."""
    name: str
    setting: str                          # how a user selects it on the real target
    description: str
    matmul_inputs: torch.dtype | None = None   # operands of every matmul rounded to this dtype
    matmul_output: torch.dtype | None = None   # matmul results rounded to this dtype
    all_ops: torch.dtype | None = None         # every floating result rounded to this dtype

    def to_dict(self) -> dict:
        return {"name": self.name, "setting": self.setting, "description": self.description,
                **{k: str(v).replace("torch.", "") if v is not None else None
                   for k, v in (("matmul_inputs", self.matmul_inputs),
                                ("matmul_output", self.matmul_output), ("all_ops", self.all_ops))}}


@dataclass(frozen=True)
class DtypeRule:
    source: torch.dtype
    result: torch.dtype
    why: str




@dataclass(frozen=True)
class FeatureRule:
    """How one target treats a model feature that the vendors name as unsupported or slow."""
    severity: str     # blocker: cannot run as is; work: runs, but needs a change or a check; info
    advice: str
    source: str       # the document or issue that says so


# A plain RNN (nn.RNN, nn.RNNCell) on either target: no fused cell to miss, but a loop the compiler sees step by step.
_PLAIN_RNN_ADVICE = ("a plain RNN needs no fused cell: each step runs as a matmul and its nonlinearity on the target; "
                     "torch.compile does not trace nn.RNN layers (a graph break, stage 2): write the loop over "
                     "nn.Linear in the forward for one graph")
_PLAIN_RNN_SOURCE = "ATen RNN.cpp (rnn_tanh/rnn_relu: SimpleCell); torch._dynamo.config.allow_rnn (False)"


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    device: str                      # the torch device string on the real target
    backend: str                     # torch.compile backend on the real target
    emulated_backend: str            # portkit's registered stand-in, used in emulated mode
    vendor_package: str | None       # pip distribution
    vendor_module: str | None        # import name
    static_shapes: bool              # every new input shape compiles a new graph
    dtype_rules: tuple[DtypeRule, ...]
    precisions: tuple[Precision, ...]  # the first is the target's default
    op_table: str | None             # file in data/targets, or None for a live dispatcher key
    live_key: str                    # dispatcher key that holds the target's kernels
    kernel_language: str             # what custom kernels are rewritten in
    dynamic_shape_error: str         # the vendor's wording when a graph has a SymInt
    features: dict[str, FeatureRule] = field(default_factory=dict)   # feature kind -> rule
    docs: tuple[str, ...] = ()
    reference: bool = False          # a platform to compare against, not a migration target
    # What portkit.stages.xla.stage can check on a CPU host: "compile" (a real XLA compile for a TPU topology),
    # "lowering" (StableHLO export only: the vendor compiler is not installable here), or None.
    xla_check: str | None = None
    # The vendor's compile counters, read after compiling in native mode: "module:attr.path" names a
    # callable (called) or a mapping (copied); path parts index mappings or name attributes.
    compile_metrics: tuple[str, ...] = ()

    @property
    def default_precision(self) -> Precision:
        return self.precisions[0]

    def precision(self, name: str) -> Precision:
        for p in self.precisions:
            if p.name == name:
                return p
        raise BadParameter(f"precision for target {self.name}", name, [p.name for p in self.precisions])


_BF16 = torch.bfloat16
_F64_TO_F32 = DtypeRule(torch.float64, torch.float32, "float64 is not native: cast to float32 and back")
_FP32 = Precision("fp32", "default", "float32 throughout")

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target(
        name="neuron", title="AWS Trainium (TorchNeuron, torch-neuronx)", device="neuron",
        backend="neuron", emulated_backend="portkit_neuron",
        vendor_package="torch-neuronx", vendor_module="torch_neuronx", static_shapes=True,
        dtype_rules=(_F64_TO_F32,
                     DtypeRule(torch.int64, torch.int32, "int64 is not native: cast to int32 and back")),
        precisions=(
            # The native backend compiles with --auto-cast=none (torch_neuronx csrc/core/KernelExecution.cpp);
            # standalone neuronx-cc casts FP32 matmuls to BF16 unless told otherwise (awsdocs-neuron
            # compiler/neuronx-cc/api-reference-guide, --auto-cast).
            Precision("none", "native backend default (--auto-cast=none)", "float32 throughout"),
            Precision("matmult", "NEURON_CC_FLAGS='--auto-cast=matmult --auto-cast-type=bf16'",
                      "matmul operands and results in bf16, fp32 accumulation",
                      matmul_inputs=_BF16, matmul_output=_BF16),
            Precision("all", "NEURON_CC_FLAGS='--auto-cast=all --auto-cast-type=bf16'",
                      "every float32 operation in bf16", matmul_inputs=_BF16, matmul_output=_BF16,
                      all_ops=_BF16),
        ),
        op_table="neuron.json", live_key="PrivateUse1", kernel_language="NKI",
        dynamic_shape_error="Dynamic shapes detected in the model, but torch-neuronx requires static "
                            "shapes",
        features={
            "float64": FeatureRule(WORK, "float64 runs as float32 on Neuron: keep this module in float32 "
                                   "(.float()) and check stage 4's accuracy",
                                   "torch_neuronx python_ops/base.py (float64 cast to float32); pytorch/xla#8719"),
            "int64": FeatureRule(INFO, "int64 runs as int32 on Neuron: fine for token ids and indices below 2**31",
                                 "torch_neuronx dtype_autocast.py"),
            "int64_saturated": FeatureRule(WORK, "these int64 values are the +-2**63 a float->int cast gives for "
                                           "+-inf or NaN (log(0)); Neuron's int32 gives +-2**31 instead: harmless "
                                           "where they are masked out afterwards (torch.where), so check the outputs "
                                           "in stage 4 rather than rewrite", "torch_neuronx dtype_autocast.py"),
            "int64_overflow": FeatureRule(BLOCKER, "values exceed int32 but Neuron runs int64 as int32: "
                                          "rescale, or split the value", "torch_neuronx dtype_autocast.py"),
            "recurrent_loop": FeatureRule(INFO, _PLAIN_RNN_ADVICE, _PLAIN_RNN_SOURCE),
            "recurrent": FeatureRule(BLOCKER, "fused LSTM/GRU cells do not run on Neuron, not even as a CPU "
                                     "fallback: rewrite the recurrence with nn.Linear and elementwise ops in "
                                     "a loop, or as an NKI kernel",
                                     "torch-neuronx tests/pytorch_tests/specs/ddp_spec.json "
                                     "(aten::_thnn_fused_lstm_cell cannot run, not even on the CPU fallback)"),
            "sparse": FeatureRule(BLOCKER, "TorchNeuron has no sparse-tensor kernels: use dense tensors "
                                  "(to_dense) or an NKI kernel",
                                  "torch_neuronx NeuronBindings.cpp (no SparsePrivateUse1 registration)"),
            "nested": FeatureRule(BLOCKER, "TorchNeuron has no NestedTensor kernels: pad to a bucket (stage 3) "
                                  "instead",
                                  "torch_neuronx NeuronBindings.cpp (no NestedTensorPrivateUse1 registration)"),
            "data_dependent": FeatureRule(WORK, "output size depends on the data: a graph break and a dynamic "
                                          "shape under torch.compile, which Neuron rejects; use a static-size "
                                          "form (nonzero_static, torch.where on a mask)",
                                          "torch_neuronx decompositions.py; "
                                          "awsdocs-neuron torch/compile/reference-torch-compile.html"),
            "host_sync": FeatureRule(WORK, ".item() or a Python branch on a tensor value copies to the host "
                                     "and breaks the graph: keep the value as a tensor",
                                     "PyTorch docs torch.compiler_troubleshooting (graph breaks)"),
            "custom_op": FeatureRule(BLOCKER, "custom CUDA/Triton kernels do not carry over: rewrite as an NKI "
                                     "kernel (@nki.jit, registered with torch_neuronx.nki_op) or use an NKI "
                                     "Library kernel",
                                     "torch_neuronx nki_hop.py (nki_op); awsdocs-neuron NKI documentation"),
            "attention_mask": FeatureRule(WORK, "arbitrary attention masks keep SDPA off the NKI flash kernel "
                                          "(it takes no attn_bias) and native multi-head attention rejects "
                                          "them: prefer is_causal or no mask with bucketed, unpadded batches",
                                          "torch_neuronx decompositions.py (NKI SDPA takes no attn_bias); "
                                          "python_ops/native_multi_head_attention.py"),
            "cpu_fallback": FeatureRule(WORK, "runs on the host CPU and copies back each call: write an NKI "
                                        "kernel or replace the op", "torch_neuronx NeuronBindings.cpp"),
            "unsupported": FeatureRule(BLOCKER, "no kernel on Neuron and no CPU kernel to fall back to: "
                                       "replace the op", "torch_neuronx NeuronBindings.cpp"),
        },
        docs=("awsdocs-neuron torch/about-pytorch-neuron.html",
              "awsdocs-neuron torch/compile/reference-torch-compile.html"),
        xla_check="lowering",
        compile_metrics=("torch_neuronx:get_dynamo_metrics", "torch._dynamo.utils:counters.neuron"),
    ),
    Target(
        name="tpu", title="Google TPU (TorchTPU, torch-tpu)", device="tpu",
        backend="tpu", emulated_backend="portkit_tpu",
        vendor_package="torch-tpu", vendor_module="torch_tpu", static_shapes=True,
        dtype_rules=(_F64_TO_F32,),
        precisions=(
            # fp32 matmuls default to one bf16 pass on the MXU with fp32 accumulation
            # (torch_tpu docs/gpu_to_tpu.md, precision_management.py).
            Precision("default", "torch.tpu.Precision.DEFAULT",
                      "matmul operands rounded to bf16, one MXU pass, fp32 accumulation",
                      matmul_inputs=_BF16),
            Precision("highest", "with torch.tpu.precision(torch.tpu.Precision.HIGHEST)",
                      "float32 matmuls (6 bf16 passes)"),
        ),
        op_table="tpu.json", live_key="PrivateUse1", kernel_language="Pallas",
        dynamic_shape_error="TPU backend: does not support dynamic shape",
        features={
            "float64": FeatureRule(WORK, "TPUs have no float64: it runs as float32; keep this module in float32 "
                                   "and check stage 4's accuracy", "pytorch/xla#1369, pytorch/xla#8719"),
            "recurrent_loop": FeatureRule(INFO, _PLAIN_RNN_ADVICE, _PLAIN_RNN_SOURCE),
            "recurrent": FeatureRule(WORK, "LSTM/GRU are experimental on TorchTPU: measure them, or rewrite the "
                                     "recurrence (lax.scan-style loop) if they are slow", "torch_tpu README"),
            "sparse": FeatureRule(BLOCKER, "no sparse tensors on TPU: use dense tensors or a Pallas kernel",
                                  "pytorch/xla#1369, pytorch/xla#7142"),
            "nested": FeatureRule(WORK, "ragged tensors are experimental on TorchTPU: pad to a bucket (stage 3)",
                                  "torch_tpu README"),
            "data_dependent": FeatureRule(WORK, "output size depends on the data: a SymInt in the graph, which "
                                          "the TPU backend rejects, and dynamic ops recompile; use a static-size "
                                          "form (nonzero_static, torch.where on a mask)", "torch_tpu _backend.py"),
            "host_sync": FeatureRule(WORK, ".item() or a Python branch on a tensor value copies to the host and "
                                     "breaks the graph: keep the value as a tensor",
                                     "PyTorch docs torch.compiler_troubleshooting (graph breaks)"),
            "custom_op": FeatureRule(BLOCKER, "custom CUDA/Triton kernels do not carry over: rewrite in Pallas "
                                     "(or Tokamax/Helion, experimental)", "torch_tpu README"),
            "cpu_fallback": FeatureRule(WORK, "no TPU kernel: runs on the host CPU and copies back each call "
                                        "('... is not implemented for TPU. Falling back to CPU'); write a Pallas "
                                        "kernel or replace the op", "torch_tpu missing-op fallback"),
            "unsupported": FeatureRule(BLOCKER, "no kernel on TPU and no CPU kernel to fall back to: replace the op",
                                       "torch_tpu dispatcher"),
        },
        docs=("torch_tpu docs/gpu_to_tpu.md", "torch_tpu docs/notebooks/advanced_compile.py"),
        xla_check="compile",
        compile_metrics=("torch.tpu:_get_cache_stats",),
    ),
    Target(
        name="cpu", title="CPU (reference)", device="cpu", backend="inductor",
        emulated_backend="inductor", vendor_package=None, vendor_module=None, static_shapes=False,
        dtype_rules=(), precisions=(_FP32,), op_table=None, live_key="CPU", kernel_language="C++",
        dynamic_shape_error="", reference=True,
    ),
    Target(
        name="cuda", title="NVIDIA GPU (reference, the platform being migrated from)", device="cuda",
        backend="inductor", emulated_backend="inductor", vendor_package=None, vendor_module=None,
        static_shapes=False, dtype_rules=(), precisions=(_FP32,), op_table=None, live_key="CUDA",
        kernel_language="CUDA/Triton", dynamic_shape_error="", reference=True,
    ),
)}

MIGRATION_TARGETS = tuple(name for name, t in TARGETS.items() if not t.reference)

@dataclass(frozen=True)
class OpClass:
    status: str
    detail: str
    via: str | None = None      # the op that actually runs, when it is not the recorded one


@dataclass
class OpTable:
    """Which ATen overloads a target runs natively, and how every other op reaches the CPU."""
    target: str
    native: frozenset[str]
    cpu_fallback: frozenset[str] = frozenset()
    compile_decomposed: frozenset[str] = frozenset()
    provenance: dict = field(default_factory=dict)
    device_paths: bool = True   # translate CPU-specific ops to the PrivateUse1 path
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def load(cls, filename: str) -> "OpTable":
        raw = json.loads((DATA / filename).read_text())
        return cls(target=raw["target"], native=frozenset(raw["native"]),
                   cpu_fallback=frozenset(raw.get("cpu_fallback", ())),
                   compile_decomposed=frozenset(raw.get("compile_decomposed", ())),
                   provenance=raw["provenance"])

    @classmethod
    def live(cls, target: str, key: str, device_paths: bool) -> "OpTable":
        names = torch_private.dispatcher_op_names()
        native = frozenset(o for o in names if torch_private.has_kernel_for(o, key))
        return cls(target=target, native=native, device_paths=device_paths,
                   provenance={"source": f"live dispatcher, key {key}", "version": torch.__version__,
                               "method": "torch._C._dispatch_has_kernel_for_dispatch_key(op, "
                                         f"{key!r}) over torch._C._dispatch_get_all_op_names()"})

    def is_native(self, op: str) -> bool:
        return op in self.native

    def is_compile_decomposed(self, op: str) -> bool:
        """Whether the target's compiler decomposes `op`. An entry with an overload names that overload;
        an entry without one names the default overload and, as torch._decomp.get_decompositions reads
        a whole operator (aten.logsumexp), every overload PyTorch has a decomposition for."""
        if op in self.compile_decomposed:
            return True
        name, _, overload = op.partition(".")
        return bool(overload) and name in self.compile_decomposed and op in _upstream_decompositions()

    def classify(self, op: str, compiled: bool = False) -> OpClass:
        """How `op` runs on the target: eagerly, or under torch.compile (compiled=True), where an op the
        target's compiler decomposes is DECOMPOSED instead of a CPU fallback or unsupported."""
        key = (op, compiled)
        if key not in self._cache:
            self._cache[key] = self._classify(op, compiled)
        return self._cache[key]

    def _classify(self, op: str, compiled: bool) -> OpClass:
        if op in self.native:
            return OpClass(NATIVE, "kernel on the target")
        if compiled and op in FUNCTIONAL_FORMS:   # judged as the in-place update it stands for
            inner = self.classify(FUNCTIONAL_FORMS[op], compiled)
            return dataclasses.replace(inner, via=FUNCTIONAL_FORMS[op], detail=f"AOTAutograd's functional form of "
                                       f"{FUNCTIONAL_FORMS[op]} into a view; {FUNCTIONAL_FORMS[op]}: {inner.detail}")
        decomposed = self.is_compile_decomposed(op)
        if compiled and decomposed:
            return OpClass(DECOMPOSED, "the target's compiler decomposes it into other ops")
        eager = self._classify_eager(op, compiled)
        if decomposed and eager.status in (CPU_FALLBACK, UNSUPPORTED):
            return dataclasses.replace(eager, detail=eager.detail + " (eagerly; torch.compile decomposes it)")
        return eager

    def _classify_eager(self, op: str, compiled: bool) -> OpClass:
        if op in self.cpu_fallback:
            return OpClass(CPU_FALLBACK, "the target's own kernel runs it on the host CPU")
        if self.device_paths and op in PRIVATEUSE1_PATH:
            device_op, why = PRIVATEUSE1_PATH[op]
            inner = self.classify(device_op, compiled)
            return dataclasses.replace(inner, via=device_op, detail=f"{why}; {device_op}: {inner.detail}")
        has = functools.partial(_has_kernel, op)
        if not self.device_paths:   # a reference platform: its own kernels or composites
            if has("CompositeExplicitAutograd") or has("CompositeImplicitAutograd") or \
                    has("CompositeExplicitAutogradNonFunctional"):
                return OpClass(COMPOSITE, "composite kernel: runs as other ATen ops")
            return OpClass(UNSUPPORTED, "no kernel on this platform")
        if has("CompositeExplicitAutogradNonFunctional"):
            # A structured op: its functional/in-place form allocates and calls the out= overload. An op with
            # no out= overload in ATen at all is not structured: its kernel is written once for every backend
            # (as_strided_ sets a view's sizes and strides) and runs as it is.
            outs = _out_overloads(op)
            out = next((o for o in outs if o in self.native), None)
            if out:
                return OpClass(COMPOSITE, f"runs as {out}", via=out)
            if not outs:
                return OpClass(COMPOSITE, "composite kernel for every backend (not a structured op: ATen has no "
                                          "out= overload of it)")
            return OpClass(CPU_FALLBACK if has("CPU") else UNSUPPORTED,
                           "structured op whose out= overload has no kernel on the target")
        if has("CompositeExplicitAutograd") or has("CompositeImplicitAutograd"):
            return OpClass(COMPOSITE, "composite kernel: runs as other ATen ops")
        if has("CPU"):
            return OpClass(CPU_FALLBACK, "no kernel on the target; the CPU kernel runs it")
        return OpClass(UNSUPPORTED, "no kernel on the target, no composite, and no CPU kernel to "
                                    "fall back to")


@functools.cache
def _upstream_decompositions() -> frozenset[str]:
    """Every ATen overload with a decomposition in PyTorch's own table, as 'aten::name.overload'."""
    return torch_private.decomposed_aten_overloads()


def _has_kernel(op: str, key: str) -> bool:
    try:
        return torch_private.has_kernel_for(op, key)
    except RuntimeError:   # not an operator this torch knows
        return False


def _out_overloads(op: str) -> list[str]:
    """The out= overloads ATen has for `op`, found by matching schemas: same base name (in-place ops drop their
    trailing '_'), same arguments, plus the out tensors; [] for an op that has none (not a structured op)."""
    name, _, overload = op.partition(".")
    try:
        schemas = torch_private.operator_schemas(name)
        mine = next(s for s in schemas if s.overload_name == overload)
    except (RuntimeError, StopIteration):
        return []
    signature = [(a.name, str(a.type)) for a in mine.arguments]
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    return [f"{base}.{schema.overload_name}" if schema.overload_name else base
            for schema in torch_private.operator_schemas(base)
            if any(a.is_out for a in schema.arguments)
            and [(a.name, str(a.type)) for a in schema.arguments if not a.is_out] == signature]


@dataclass(frozen=True)
class DetectedTarget:
    """A target together with how portkit will treat it on this host."""
    target: Target
    mode: str          # "native" or "emulated"
    reason: str
    op_table: OpTable

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def native(self) -> bool:
        return self.mode == "native"

    @property
    def backend(self) -> str:
        """The torch.compile backend to use in this mode."""
        return self.target.backend if self.native else self.target.emulated_backend

    def to_dict(self) -> dict:
        t = self.target
        return {"name": t.name, "title": t.title, "mode": self.mode, "reason": self.reason,
                "device": t.device, "backend": self.backend, "static_shapes": t.static_shapes,
                "dtype_rules": [f"{r.source} -> {r.result}".replace("torch.", "") for r in t.dtype_rules],
                "default_precision": t.default_precision.to_dict(),
                "op_table": self.op_table.provenance}

    def __str__(self) -> str:
        return f"target {self.name}: {self.mode}, {self.reason}"


def get(name: str) -> Target:
    if name not in TARGETS:
        raise BadParameter("target", name, TARGETS)
    return TARGETS[name]


MODE_VARIABLE = "PORTKIT_MODE"
MODES = ("auto", "emulated")   # auto: native where the vendor's device is present


def forced_mode() -> str:
    """The mode PORTKIT_MODE asks for ("auto" when unset)."""
    mode = os.environ.get(MODE_VARIABLE, "") or "auto"
    if mode not in MODES:
        raise BadParameter(MODE_VARIABLE, mode, MODES)
    return mode


def detect(name: str) -> DetectedTarget:
    """Decide native or emulated for one target and load its op table."""
    return _detect(name, forced_mode())


@functools.cache
def _detect(name: str, mode: str) -> DetectedTarget:
    t = get(name)
    if mode == "emulated" and not t.reference:
        return DetectedTarget(t, "emulated", f"{MODE_VARIABLE}=emulated; running on the CPU under the "
                              "target's rules", OpTable.load(t.op_table))
    if t.reference:
        if t.device == "cpu" or availability.cuda_available():
            return DetectedTarget(t, "native", f"{t.device} is present",
                                  OpTable.live(t.name, t.live_key, device_paths=False))
        return DetectedTarget(t, "emulated", "no CUDA device: run on the CPU",
                              OpTable.live(t.name, "CPU", device_paths=False))
    if availability.device_available(t.vendor_module, t.device):
        version = availability.package_version(t.vendor_package)
        return DetectedTarget(t, "native", f"{t.vendor_package} {version} with a {t.device} device",
                              OpTable.live(t.name, t.live_key, device_paths=True))
    if availability.module_available(t.vendor_module):
        reason = f"{t.vendor_package} is installed but no {t.device} device was found"
    else:
        reason = f"{t.vendor_package} is not installed"
    return DetectedTarget(t, "emulated", reason + "; running on the CPU under the target's rules",
                          OpTable.load(t.op_table))


def parse_targets(names) -> list[str]:
    """Accept a list or a comma-separated string; validate every name; keep order, drop repeats."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(dict.fromkeys(names))
    if not names:
        raise BadParameter("target list", "", TARGETS, hint="give at least one target")
    for n in names:
        get(n)
    return names


# ---------------------------------------------------------------- the vendors' lists and version requirements
VENDOR_LISTS = "vendor_lists.json"   # each list and requirement with its source and the date it was read


@functools.cache
def _vendor_data() -> dict:
    return json.loads((DATA / VENDOR_LISTS).read_text())


def vendor_lists() -> dict[str, dict]:
    """Target name -> what its vendor lists as experimental, private beta or unsupported: {"vendor", "source",
    "document", "read", "entries": [{"feature", "status", "note", "detect", "severity"}]}. The severity follows
    the status (data/targets/vendor_lists.json "statuses": unsupported is a blocker, the others work)."""
    raw = _vendor_data()
    return {name: {**lst, "entries": [{**e, "severity": raw["statuses"][e["status"]]} for e in lst["entries"]]}
            for name, lst in raw["lists"].items()}


def requirements() -> dict[str, dict]:
    """Target name -> the torch, Python and transformers versions its vendor states (None: states none),
    with "vendor", "source", "document", "read" and an optional "note"."""
    return dict(_vendor_data()["requirements"])
