"""Stage 3b (notebook 03b_xla): the real XLA compiler's verdict, per target, over the shapes the workbook uses.

For TPU every shape stage 2 fixed and stage 3 bucketed is compiled for a real TPU topology on this CPU
host (JAX + libtpu, compile-only: nothing executes on a TPU); for Neuron it is lowered to StableHLO (a
lowering check, not a Neuron compile). The machinery is portkit.tpu_compile.compiler; a verdict compiled once
comes back from portkit's verdict cache (portkit.tpu_compile.cache) on a rerun; xla.json's cached_shapes says how many.

    >>> from portkit import models
    >>> from portkit.stages.xla import stage
    >>> m = models.load("minilm")
    >>> opts = stage.Options.of({"topology": "v5e:1x1"}, model="minilm")   # the notebook's defaults, checked
    >>> stage.shape_table("runs/minilm", ["neuron", "tpu"], m, opts)     # what will be checked
    >>> result = stage.run_stage(m, ["neuron", "tpu"], opts, run_dir="runs/minilm")
    >>> result.save("runs/minilm/xla.json"); print(result.summary())
    >>> stage.xla_section(m, "tpu", [{"batch": 8, "seq": 128}])   # one target, one line in a notebook cell

`xla.compile_for_tpu`, `xla.check_lowering`, `xla.compile_seconds` and the result classes are
portkit.tpu_compile.compiler's and portkit.tpu_compile.results', reachable from here for notebooks and scripts.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core import assessed, checks, grading
from portkit.core.findings import cause_key
from portkit.runfolder import results
from portkit.stages import options
from portkit.targets import specs
from portkit.core.errors import BadParameter, MissingPackage
from portkit.runfolder.results import save_result
from portkit.core.tables import HtmlTable
from portkit.tpu_compile.compiler import (COMPILE_ONLY_ENV, DTYPES, HBM_GIB_PER_CHIP, INSTALL, TOPOLOGIES,  # noqa: F401
                                         require_installed, require_xla, check_topology, check_lowering,
                                         compile_for_tpu, compile_seconds, input_specs, is_abstract)
from portkit.tpu_compile.results import ShapeResult, XlaCompileReport, XlaSkipped, format_bytes, plot_hbm  # noqa: F401

STAGE = "xla"


def _topology(name: str, value) -> str:
    return check_topology(value)


def _topologies(name: str, value) -> list:
    """scale_topologies: a non-empty list of TPU topologies, tried fewest chips first."""
    if not isinstance(value, (list, tuple)) or not value:
        raise BadParameter(name, value, TOPOLOGIES)
    for topology in value:
        check_topology(topology)
    return value


def _buckets(name: str, value) -> list:
    """scale_buckets: a list of sequence lengths ([]: scale_seq alone)."""
    if not isinstance(value, (list, tuple)):
        raise BadParameter(name, value, hint="a list of sequence lengths, e.g. [512, 2048]")
    for bucket in value:
        checks.positive_int(f"{name} entry", bucket, maximum=checks.MAX_SEQ)
    return value


class Options(options.StageOptions):
    """Stage 3b's options: the parameters cell of notebooks/03b_xla.py, each field checked. The scale_*
    fields are an abstract model's (a real-size config without weights, `--model llama3-8b`): its sequence
    lengths are checked against the config's limit, and it is checked for inference only."""
    NOTEBOOK = "03b_xla.ipynb"
    CHECKS = {"topology": _topology, "dtype": checks.one_of(DTYPES), "batch_size": checks.up_to(checks.MAX_BATCH),
              "seq_len": checks.up_to(checks.MAX_SEQ), "max_shapes": checks.up_to(checks.MAX_STEPS),
              "largest_batch": checks.boolean, "workload": checks.one_of(checks.WORKLOADS),
              "scale_topologies": checks.list_of(lambda name, value: check_topology(value), "['v5e:1x1']"),
              "scale_batch": checks.up_to(checks.MAX_BATCH), "scale_seq": checks.up_to(checks.MAX_SEQ),
              "scale_buckets": _buckets}

    def check(self, model: str | None) -> None:
        from portkit.models import meta_device
        from portkit.workloads.generation import check_workload
        if meta_device.is_name(model):          # its sequence lengths against the config's limit
            module = meta_device.build(model)
            for seq in [self.scale_seq, *self.scale_buckets]:
                meta_device.text_shape(module, self.scale_batch, seq)
        if check_workload(self.workload, model) == "train" and meta_device.is_name(model):
            raise BadParameter("workload for a real-size model without weights", self.workload, ["inference"],
                               hint=f"{model} is checked sharded for inference; train a model with weights")


def xla_section(model, target_name: str, shapes, opts: Options | None = None) -> XlaCompileReport | XlaSkipped:
    """One notebook line: the target's XLA check (TPU compile or Neuron lowering) at the options' topology
    and dtype (None: the notebook's defaults), or why it was skipped.

    model: a LoadedModel, an nn.Module, or a name for portkit.models.registry.load."""
    opts = Options.defaults() if opts is None else opts
    check = specs.get(target_name).xla_check
    if check is None:
        return XlaSkipped(target_name, f"XLA check skipped: {target_name} is a reference platform, not an XLA target")
    if isinstance(model, str):
        from portkit.models import registry
        model = registry.load(model)
    try:        # jax and torchax load only when a shape is not in the cache
        if check == "compile":
            return compile_for_tpu(model, shapes, topology=opts.topology, dtype=opts.dtype)
        return check_lowering(model, shapes, dtype=opts.dtype)
    except MissingPackage as exc:
        return XlaSkipped(target_name, str(exc))


def load(spec: str):
    """The model of stage 3b: a portkit.models.registry spec (a LoadedModel), or an abstract model's name (its
    architecture on the meta device, no weights: portkit.models.meta_device)."""
    from portkit.models import meta_device
    from portkit.models import registry
    return meta_device.build(spec) if meta_device.is_name(spec) else registry.load(spec)


def describe(model) -> str:
    from portkit.models import meta_device
    return meta_device.summary(model) if is_abstract(model) else model.summary()


def stage_shapes(out_dir, target: str, model, opts: Options | None = None) -> tuple[list[dict], list[str]]:
    """The shapes the workbook uses for `target`: stage 2's fixed shape and stage 3's buckets (read from
    the run folder through portkit.runfolder.results), else the options' batch_size and seq_len, at most
    max_shapes of them (None: the notebook's defaults). Returns (shapes, where each came from).
    An abstract model's shapes are its scale_batch x scale_seq, sharded (run_stage)."""
    opts = Options.defaults() if opts is None else opts
    if is_abstract(model):
        return ([{"batch": opts.scale_batch, "seq": opts.scale_seq}],
                ["parameters scale_batch/scale_seq (abstract model, sharded)"])
    batch_size, seq_len, max_shapes = opts.batch_size, opts.seq_len, opts.max_shapes
    dim = getattr(model, "seq_dim", "tokens")     # the varying dimension; None: the model takes one shape
    text = dim is not None
    found: list[tuple[dict, str]] = []
    recorded = [(results.fixed_shape(out_dir, target), "stage 2's fixed shape")]
    planner, buckets = results.bucket_shapes(out_dir, target) or ("", [])
    recorded += [(shape, f"stage 3's {planner} bucket".replace("  ", " ")) for shape in buckets]
    for shape, source in recorded:
        if shape is not None and (shape["seq"] or not text):      # a text model needs a sequence length
            found.append((shape if text else {"batch": shape["batch"]}, source))
    if not found and dim not in (None, "tokens"):    # seq_len counts tokens: another dimension at its largest
        found = [({"batch": batch_size, "seq": model.max_length},
                  f"parameter batch_size and the largest {dim} the model takes (no compile.json or buckets.json)")]
    if not found:
        found = [({"batch": batch_size, "seq": seq_len} if text else {"batch": batch_size},
                  "parameters batch_size/seq_len (no compile.json or buckets.json)")]
    unique: dict[tuple, tuple[dict, str]] = {}
    for shape, source in found:
        unique.setdefault(tuple(sorted(shape.items())), (shape, source))
    ordered = sorted(unique.values(), key=lambda s: (s[0].get("seq", 0), s[0].get("batch", 0)))
    if len(ordered) > max_shapes:   # keep the largest: HBM fit is decided by them
        ordered = ordered[-max_shapes:]
    return [s for s, _ in ordered], [src for _, src in ordered]


def shape_table(out_dir, target_names, model, opts: Options | None = None) -> HtmlTable:
    """The shapes run_stage will check for each target, and where each came from (stage_shapes)."""
    rows = []
    for name in specs.parse_targets(target_names):
        shapes, sources = stage_shapes(out_dir, name, model, opts)
        rows += [[name, " ".join(f"{k}={v}" for k, v in shape.items()), source]
                 for shape, source in zip(shapes, sources)]
    return HtmlTable(["target", "shape", "from"], rows, "shapes to check")


CONVERSION = "PyTorch-to-JAX conversion (torchax)"     # portkit's own machinery in front of the XLA compiler
CONVERTED = ("no_lowering", "trace_failed")              # statuses of a shape the conversion stopped


def question(report: XlaCompileReport) -> str:
    """What the target's XLA check is to establish: the HBM fit (a TPU compile), or the StableHLO lowering."""
    if report.check == "lowering":
        return "StableHLO lowering (lowering check only, not a Neuron compile)"
    return f"HBM fit on {report.topology}"


def _stopped_by(s: ShapeResult) -> str:
    """What stopped a shape in the conversion, in one line: the op with no lowering, or the converter's message."""
    if s.status == "no_lowering":
        return f"NO LOWERING for {s.op}"
    first = (s.message or "").strip().splitlines()
    return f"conversion failed: {first[0] if first else '?'}"


def _conversion_cause(s: ShapeResult) -> str:
    return cause_key("xla_conversion", _stopped_by(s)[:200], s.where)


def _conversion_failures(report) -> dict[str, tuple[ShapeResult, list[str]]]:
    """The shapes portkit's conversion stopped, by cause ({cause: (its first shape, every shape's label)}): one
    cause is one finding however many shapes it stopped."""
    found: dict[str, tuple[ShapeResult, list[str]]] = {}
    for s in report.shapes:
        if s.status in CONVERTED:
            found.setdefault(_conversion_cause(s), (s, []))[1].append(s.label)
    return found


def _conversion_finding(report, cause: str, s: ShapeResult, labels: list[str]) -> dict:
    """A shape portkit's conversion could not hand to the compiler: portkit's failure, not the model's and not the
    compiler's, so the question it was to answer is not assessed (never a blocker, never a cost)."""
    where = f" at {s.where['text']}" if s.where else ""
    module = f" in module {s.module_path or '<top level>'} ({s.module_type})" if s.module_path is not None else ""
    check = "the lowering check" if report.check == "lowering" else f"the XLA compile for {report.topology}"
    on_device = ("check the model with neuronx-cc on a Trainium host" if report.check == "lowering" else
                 "check the model on a TPU (TorchTPU lowers through its own path, not torchax)")
    return {"kind": "xla_conversion", "severity": grading.severity("xla_conversion"),
            "message": f"portkit's {CONVERSION} stopped {check}, so the compiler never saw the graph: "
                       f"{_stopped_by(s)}{module}{where} ({len(labels)} shape(s): {', '.join(labels)})",
            "advice": f"a gap in portkit's converter, not a verdict on the model: {on_device}; rewriting the model's "
                      "line would only work around portkit's converter",
            "where": s.where, "owner": assessed.portkit_owner(CONVERSION), "ops": [s.op] if s.op else None,
            "cause": cause, "occurrences": {"shapes": labels, "count": len(labels)},
            "consequence": assessed.consequence(question(report))}


def _findings(report) -> list[dict]:
    if isinstance(report, XlaSkipped):
        return []
    out = [_conversion_finding(report, cause, s, labels)
           for cause, (s, labels) in _conversion_failures(report).items()]
    causes: dict[str, list] = {}     # one finding per cause, its shapes the occurrences
    for s in report.shapes:
        if s.ok or s.status in CONVERTED:
            continue
        hbm = s.status == "out_of_hbm" or s.fits_hbm is False
        # the compiler's own words without the numbers that follow the shape name one rejection
        said = re.sub(r"\d+", "N", (s.message or s.status).splitlines()[0])[:160]
        key = cause_key("hbm", report.topology) if hbm else cause_key("xla_compile", s.op or said, s.where)
        causes.setdefault(key, []).append(s)
    for key, shapes in causes.items():
        labels = [s.label for s in shapes]
        text = "; ".join(f"{s.label}: {s.describe(report.hbm_bytes_per_device)}" for s in shapes[:3]) + (
            f"; and {len(shapes) - 3} more" if len(shapes) > 3 else "")
        found = {"cause": key, "occurrences": {"shapes": labels, "count": len(labels)}}
        if key.startswith("hbm"):
            out.append({"kind": "hbm", "severity": grading.severity("hbm"), "message": f"{report.topology}: {text}",
                        "advice": "does not fit this topology's HBM: choose a larger topology (parameter "
                                  "topology), shard the model, or use smaller buckets/batches", **found})
        else:
            out.append({"kind": "xla_compile", "severity": grading.severity("xla_compile"),
                        "message": f"XLA compile for {report.topology}: {text}",
                        "advice": "the real XLA TPU compiler rejects these shapes; read its message above", **found})
    return out


def open_questions(report) -> list[dict]:
    """What the target's check left open (core.assessed): its question, where portkit's conversion stopped a shape
    before the compiler (the shapes the compiler refused are blockers, not open)."""
    if isinstance(report, XlaSkipped):
        return []
    stopped = _conversion_failures(report)
    if not stopped:
        return []
    labels = [label for _, shapes in stopped.values() for label in shapes]
    causes = "; ".join(_stopped_by(s) + (f" at {s.where['text']}" if s.where else "") for s, _ in stopped.values())
    return [assessed.open_question(f"{question(report)} at {', '.join(labels)}",
                                   f"portkit's {CONVERSION} stopped {len(labels)} of {len(report.shapes)} shape(s) "
                                   f"before the compiler: {causes}")]


@dataclass
class XlaStage:
    """Stage 3b: the XLA check of every target over the workbook's shapes."""
    model: dict
    reports: dict                   # target -> XlaCompileReport | XlaSkipped
    sources: dict                   # target -> where each shape came from
    scale: dict = field(default_factory=dict)   # target -> scale.ScaleCheck (an abstract model's real-size check)
    largest: dict = field(default_factory=dict)  # target -> the largest batch per shape (largest_batch=True)
    measured: dict = field(default_factory=dict)  # native targets: capacity.measure_native's throughput per shape
    training: dict = field(default_factory=dict)  # workload "train": target -> training_step's result
    serving: dict = field(default_factory=dict)   # workload "generate": target -> serving_graphs' result

    def summary_for(self, name: str) -> str:
        if name in self.scale:
            return self.scale[name].summary()
        r = self.reports[name]
        largest = "".join(f"; largest batch that fits, {b['shape'].split()[-1]}: {b['batch']}"
                          + ("+" if b["batch"] >= b["limit"] else "") for b in self.largest.get(name, []))
        largest += "".join(f"; {m['per_second']:,.0f} {m['unit']}/s per chip at {m['shape']} ({m['label']})"
                           for m in self.measured.get(name, []))
        if isinstance(r, XlaSkipped):
            return f"{name}: skipped ({r.reason})"
        done = sum(s.ok for s in r.shapes)
        left = "".join(f"; {q['question']} NOT ASSESSED: {q['why']}" for q in open_questions(r))
        reached = [s for s in r.shapes if s.status not in CONVERTED]
        if r.check == "lowering":
            if not reached:
                return f"{name} (lowering check only, not a Neuron compile): {left.removeprefix('; ')}"
            return (f"{name} (lowering check only, not a Neuron compile): {done}/{len(r.shapes)} shapes lowered to "
                    "StableHLO" + left)
        headline = f"{name} {r.topology} (real XLA compile for a TPU topology, compile-only on this CPU host): "
        if not reached:     # nothing reached the compiler: no fit, no size, no count to state
            return headline + left.removeprefix("; ")
        peak = max((s.memory["total"] for s in r.shapes if s.memory), default=0)
        counted = (f"{done}/{len(r.shapes)} shapes" if len(reached) == len(r.shapes)
                   else f"{done} of the {len(reached)} shapes that reached the compiler")
        # the verdict cache's count is in its own key (cached_shapes): the summary reads the same cold and warm
        return (headline + f"{counted} compiled and fit "
                f"{format_bytes(r.hbm_bytes_per_device)} HBM per device; largest {format_bytes(peak)}" + left + largest
                + (f"; {self.training[name]['summary']}" if name in self.training else "")
                + (f"; {self.serving[name]['summary']}" if name in self.serving else ""))

    def summary(self) -> str:
        return " | ".join(self.summary_for(n) for n in self.reports)

    def workload_questions(self, name: str) -> list[dict]:
        """The training step's or serving graphs' HBM fit, open where portkit's conversion stopped them before the
        compiler (core.assessed), or where the model's cache is not the key/value cache the serving graph carries."""
        from portkit.stages.xla import generation
        found = []
        for what, graph in (("training step", self.training.get(name)), ("serving graphs", self.serving.get(name))):
            if isinstance(graph, dict) and graph.get("status") in CONVERTED:
                found.append(assessed.open_question(
                    f"HBM fit of the {what}", f"portkit's {CONVERSION} stopped it before the compiler: "
                                              f"{str(graph.get('summary', ''))[:300]}"))
            elif isinstance(graph, dict) and graph.get("status") == generation.NOT_KV:
                found.append(assessed.open_question(f"HBM fit of the {what}", str(graph["summary"])[:300]))
        return found

    def to_dict(self) -> dict:
        targets_out = {}
        for name, r in self.reports.items():
            detected = specs.detect(name)
            # The XLA check runs the real compiler (TPU) or exporter (Neuron) on this CPU host whatever
            # the target's mode; "target" is the detected target, as in every stage's JSON.
            scale = self.scale.get(name)
            targets_out[name] = {**r.to_dict(), "target": detected.to_dict(), "summary": self.summary_for(name),
                                 "shape_sources": self.sources.get(name, []),
                                 "findings": _findings(r) + (scale.findings() if scale else []),
                                 assessed.KEY: open_questions(r) + self.workload_questions(name),
                                 **({"scale": scale.to_dict()} if scale else {}),
                                 **({"largest_batch": self.largest[name]} if name in self.largest else {}),
                                 **({"measured_throughput": self.measured[name]} if name in self.measured else {}),
                                 **({"training_step": self.training[name]} if name in self.training else {}),
                                 **({"serving": self.serving[name]} if name in self.serving else {})}
        return {"stage": STAGE, "model": self.model, "summary": self.summary(), "targets": targets_out}

    def save(self, path) -> Path:
        return save_result(path, self.to_dict())

    def __str__(self) -> str:
        return "\n\n".join(str(self.scale.get(n, r)) for n, r in self.reports.items())

    def _repr_html_(self) -> str:
        return "".join(self.scale.get(n, r)._repr_html_() for n, r in self.reports.items())


def run_stage(model, target_names, opts: Options | None = None, *, run_dir) -> XlaStage:
    """Run each target's XLA check over the shapes the earlier stages chose in the run folder `run_dir` (opts None:
    the notebook's defaults). An abstract model (no weights) gets the real-size check instead
    (portkit.stages.xla.realsize): sharded over scale_topologies until one fits, the largest batch per bucket
    (scale_buckets, default [scale_seq]), capacity per chip. largest_batch: also search each TPU shape's largest
    batch that fits HBM (portkit.stages.xla.realsize.largest_per_shape; a few compiles each). workload "train":
    also the whole training step compiled for the TPU topology at batch_size x seq_len, its memory broken down,
    and the largest micro-batch that fits (training_step); workload "generate": the prefill and decode graphs
    with their KV cache and the largest batch at the context (serving_graphs)."""
    from portkit.core.progress import bar as progress_bar
    opts, out_dir = Options.defaults() if opts is None else opts, run_dir
    if is_abstract(model):
        return _real_size(model, target_names, out_dir, opts)
    reports, sources, largest, measured = {}, {}, {}, {}
    for name in progress_bar(list(target_names), desc="XLA checks", unit="target"):
        shapes, sources[name] = stage_shapes(out_dir, name, model, opts)
        reports[name] = xla_section(model, name, shapes, opts)
        if opts.largest_batch and isinstance(reports[name], XlaCompileReport) and reports[name].check == "compile":
            from portkit.stages.xla import realsize
            largest[name] = realsize.largest_per_shape(model, shapes, reports[name], opts.dtype)
        if specs.detect(name).native and not specs.get(name).reference:   # a measurement, not an estimate
            from portkit.targets import capacity
            measured[name] = capacity.measure_native(model, name, shapes)
    trained = training_step(model, target_names, opts) if opts.workload == "train" else {}
    served = serving_graphs(model, target_names, out_dir, opts) if opts.workload == "generate" else {}
    return XlaStage(model.describe() if hasattr(model, "describe") else {"name": str(model)}, reports, sources,
                    largest=largest, measured=measured, training=trained, serving=served)


def _real_size(model, target_names, out_dir, opts: Options) -> XlaStage:
    """An abstract model's stage: each target's real-size check (portkit.stages.xla.realsize)."""
    from portkit.models import meta_device
    from portkit.stages.xla import realsize
    checks = realsize.run(model, target_names, opts)
    names = specs.parse_targets(target_names)
    reports = {n: checks[n].main if n in checks else XlaSkipped(
        n, f"XLA check skipped: {n} is a reference platform, not an XLA target") for n in names}
    sources = {n: stage_shapes(out_dir, n, model, opts)[1] for n in names}
    return XlaStage(meta_device.describe(model), reports, sources, checks)


def serving_graphs(model, target_names, out_dir, opts: Options | None = None) -> dict:
    """Workload "generate", per TPU target: the prefill graph of the largest prompt bucket and the decode step
    of the largest context bucket of stage 3's serving plan (else a seq_len prompt in a cache twice as long,
    within the model's length), at batch_size, compiled by XLA with the KV cache in HBM, and the largest batch
    whose decode step fits one device at that context (portkit.stages.xla.generation). opts None: the
    notebook's defaults."""
    opts = Options.defaults() if opts is None else opts
    return _per_compiler(target_names, "serving graphs", "stage 2 compiled generation with its emulated backend",
                         lambda name: _serving(model, *_serving_plan(out_dir, name), opts))


def _serving_plan(out_dir, name: str) -> tuple[tuple[list[int], list[int]] | None, str]:
    """(the serving plan's (prompt or source buckets, context buckets), where it comes from): stage 3's; else, for
    an encoder-decoder, what stage 2's static caches compiled (an encoder taking one source shape, whose window
    stage 3 does not bucket); else (None, "")."""
    if planned := results.serving_buckets(out_dir, name):
        return planned, "stage 3's serving plan, largest buckets"
    found = results.target_part(results.load(out_dir, "compile"), name)
    decoded = found.encoder_decoder_plan if found is not None else None
    if decoded:
        return decoded[:2], "the source buckets and decoder context stage 2 compiled"
    return None, ""


def _per_compiler(target_names, what: str, instead: str, check) -> dict:
    """{target: check(target)} for each target with an XLA compiler here; the others say `what` was not compiled
    and what stage 2 did `instead`."""
    return {name: check(name) if specs.get(name).xla_check == "compile" else
            {"status": "skipped", "summary": f"{what} not compiled: {name} has no XLA compiler here ({instead})"}
            for name in specs.parse_targets(target_names)}


def _serving(model, plan, basis: str, opts: Options) -> dict:
    """One TPU target's prefill and decode graphs at the plan's largest buckets (plan: stage 3's serving
    plan, (prompt buckets, context buckets), or None; basis: where it comes from), and the largest batch whose
    decode step fits."""
    from portkit.stages.xla import generation, seq2seq_serving
    from portkit.tpu_compile import sharded
    from portkit.workloads import encoder_decoder
    if encoder_decoder.is_encoder_decoder(model):
        return seq2seq_serving.serve(model, plan, basis, opts.batch_size, opts.topology, opts.dtype)
    if (why := generation.not_kv_cache(model)) is not None:
        return {"status": generation.NOT_KV,
                "summary": f"serving graphs not compiled: {why}; so their HBM fit and largest batch are not "
                           "assessed"}
    if plan:
        prompt, context, source = max(plan[0]), max(plan[1]), basis
    else:
        context = min(model.max_length, 2 * opts.seq_len)
        prompt, source = min(opts.seq_len, context - 1), "parameter seq_len (no serving plan in buckets.json)"
    graphs = generation.compile_serving(model, opts.batch_size, prompt, context, opts.topology, opts.dtype)
    found = {g: c.to_dict() for g, c in graphs.items()}
    found.update(prompt=prompt, context=context, source=source, status=graphs["decode"].status)
    found["summary"] = "; ".join(c.summary() for c in graphs.values())
    if graphs["decode"].status == "compiled":
        n, tried = generation.largest_batch(model, context, opts.topology, opts.dtype, first=graphs["decode"])
        found["largest_batch"], found["tried"] = n, {str(k): v for k, v in sorted(tried.items())}
        found["summary"] += (f"; largest batch whose decode fits at context {context}: "
                             f"{n}{sharded.bound_text(n, tried)} ({source})")
    return found


def training_step(model, target_names, opts: Options | None = None) -> dict:
    """Workload "train", per TPU target: the model's training step (its loss, AdamW) compiled by XLA for the
    topology at batch_size x seq_len of real text (portkit.stages.xla.training), its memory broken down, and the
    largest micro-batch that fits one device. Neuron has no compiler here: its entry says so. opts None: the
    notebook's defaults."""
    from portkit.corpora.corpus import load_corpus
    opts = Options.defaults() if opts is None else opts
    corpus = functools.cache(load_corpus)      # read once, and only where a target compiles
    return _per_compiler(target_names, "training step", "stage 2 classified the step's ops, forward and backward",
                         lambda name: _training(model, corpus(), opts))


def _training(model, corpus, opts: Options) -> dict:
    """One TPU target's training step, the largest micro-batch that fits, and its temporaries split into what
    grows with the batch and what does not."""
    from portkit.tpu_compile import sharded
    from portkit.stages.xla import training
    topology, dtype = opts.topology, opts.dtype
    spec = training.step_inputs(model, corpus, opts.batch_size, opts.seq_len)
    step = training.compile_step(model, spec, topology, dtype)
    found = step.to_dict()
    if step.status != "compiled":
        return found
    # twice the batch: the search's guess and the temporaries' split both read it, compiled once
    second = training.compile_step(model, training.with_batch(spec, 2 * step.batch), topology, dtype)
    n, tried = training.largest_micro_batch(model, spec, topology, dtype, first=step, second=second)
    found["largest_micro_batch"], found["tried"] = n, {str(k): v for k, v in sorted(tried.items())}
    found["summary"] += (f"; largest micro-batch that fits: {n}{sharded.bound_text(n, tried)} x {opts.seq_len} "
                         f"({len(tried)} compile(s))")
    split = training.split_temporaries(step, second)
    if split:
        found["temporaries"] = split
    found["summary"] += _temporaries(step, second, split)
    return found


def _temporaries(step, second, split: dict | None) -> str:
    """The summary's words on the compiler's temporaries at the two batches (training.split_temporaries)."""
    if split:
        return (f"; temporaries from batches {split['batches']}: {format_bytes(split['fixed'])} "
                f"that do not grow with the batch (gradients and workspace; every gradient "
                f"at once would be {format_bytes(split['gradients_counted'])}: XLA fuses "
                f"the update) + {format_bytes(split['per_row'])} a row (activations)")
    if second.status == "compiled":
        key = "gradients, activations and workspace"
        return (f"; temporaries {format_bytes(step.breakdown[key])} at batch {step.batch}, "
                f"{format_bytes(second.breakdown[key])} at {second.batch}: not a line, no split")
    return ""
