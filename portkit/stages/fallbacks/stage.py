"""Stage 1, fallback discovery: which ATen ops a model calls, from which module, and which of
them would fall back to the CPU or not run at all on each target.

    >>> from portkit import models
    >>> from portkit.corpora import corpus
    >>> from portkit.stages.fallbacks import stage
    >>> model = models.load("minilm")
    >>> inputs = model.encode(corpus.load_corpus().sample(8, seed=0), pad_to=128)
    >>> report = stage.find_fallbacks(model, inputs, targets=["neuron", "tpu"])
    >>> print(report)                      # per target: op counts by status, findings
    >>> report.plot()                      # per-module bars, coloured by status
    >>> report.save("runs/minilm/fallbacks.json")

One eager pass (forward, or forward and backward with train=True) is recorded below autograd with
a `TorchDispatchMode`: every ATen call, its count, dtypes, time, and the `nn.Module` that made it
(backward calls are traced to their module through the autograd graph). Each op is then classified
against the target's op table (targets.OpTable.classify), and the model is scanned for the features
the vendors name as unsupported or slow. The recording runs on the CPU in emulated mode; in native
mode it runs on the device and the vendor's own fallback record is collected beside it.
The recording itself is portkit/stages/fallbacks/recording.py; this module classifies it and reports.
"""
from __future__ import annotations

import collections
import html
import warnings
from dataclasses import dataclass

import torch

from portkit.core import owners
from portkit.core import placement
from portkit.core import checks, grading
from portkit.stages import reconcile
from portkit.stages import options
from portkit.targets import specs
from portkit.core.errors import BadParameter
from portkit.core.findings import BLOCKER, INFO, SEVERITIES, WORK, Finding, cause_key, merge_occurrences
from portkit.stages.fallbacks import source_scan
from portkit.stages.fallbacks.recording import OpRecord, Recording, record
from portkit.runfolder.results import save_result
from portkit.core.tables import HtmlTable, html_table
from portkit.targets.specs import COMPOSITE, CPU_FALLBACK, NATIVE, STATUSES, UNSUPPORTED

STAGE = "fallbacks"
STATUS_COLORS = {NATIVE: "#55A868", COMPOSITE: "#8CC084", CPU_FALLBACK: "#DD8452", UNSUPPORTED: "#C44E52"}


# ---------------------------------------------------------------- classification and report
@dataclass
class TargetFallbacks:
    """One target's view of the recording."""
    target: dict               # DetectedTarget.to_dict(): name, mode, reason, op table provenance
    ops: list[dict]            # per op: status, detail, via, calls, seconds, time_share, modules
    modules: list[dict]        # per module: calls and time by status
    findings: list[Finding]
    vendor_record: dict | None = None

    @property
    def name(self) -> str:
        return self.target["name"]

    def counts(self) -> dict[str, int]:
        c = collections.Counter(o["status"] for o in self.ops)
        return {s: c.get(s, 0) for s in STATUSES}

    def calls(self) -> dict[str, int]:
        c = collections.Counter()
        for o in self.ops:
            c[o["status"]] += o["calls"]
        return {s: c.get(s, 0) for s in STATUSES}

    def time_share(self) -> dict[str, float]:
        c = collections.Counter()
        for o in self.ops:
            c[o["status"]] += o["time_share"]
        return {s: round(c.get(s, 0.0), 4) for s in STATUSES}

    def severity_counts(self) -> dict[str, int]:
        c = collections.Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in SEVERITIES}

    def summary(self) -> str:
        """The ops by the op table's status, then the causes by consequence: what cannot run is counted once, by
        the findings (severity_counts), so the summary never says fewer than the blockers it sits beside (a
        recurrent cell the CPU decomposes is no unsupported op in the recording, yet cannot run)."""
        n, s = self.counts(), self.severity_counts()
        return (f"{self.name} ({self.target['mode']}): {sum(n.values())} distinct ops ({n[NATIVE]} native, "
                f"{n[COMPOSITE]} composite, {n[CPU_FALLBACK]} CPU fallback, {n[UNSUPPORTED]} with no kernel in the "
                f"op table); findings by cause: {s[BLOCKER]} cannot run (blocker), {s[WORK]} run with a cost (work), "
                f"{s[INFO]} info")

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "counts": self.counts(),
                "calls": self.calls(), "time_share": self.time_share(),
                "severity_counts": self.severity_counts(), "ops": self.ops, "modules": self.modules,
                "findings": [f.to_dict() for f in self.findings], "vendor_record": self.vendor_record}


def classify(recording: Recording, detected: specs.DetectedTarget) -> TargetFallbacks:
    table, rules = detected.op_table, detected.target.features
    total = sum(r.seconds for r in recording.records.values()) or 1.0
    by_op: dict[str, dict] = {}
    by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rec in recording.records.values():
        cls = table.classify(rec.op)
        entry = by_op.setdefault(rec.op, {"op": rec.op, "status": cls.status, "detail": cls.detail,
                                          "via": cls.via, "calls": 0, "seconds": 0.0, "modules": set(),
                                          "phases": set(), "dtypes": set(), "where": rec.where})
        entry["calls"] += rec.calls
        entry["seconds"] += rec.seconds
        entry["modules"].add(rec.module)
        entry["phases"].add(rec.phase)
        entry["dtypes"] |= rec.dtypes
        entry["where"] = entry["where"] or rec.where
        counter = by_module[rec.module]
        counter["calls"] += rec.calls
        counter[cls.status] += rec.calls
        counter["seconds"] += rec.seconds
        counter[f"{cls.status}_seconds"] += rec.seconds
    ops = []
    # ordered by the op, not by its measured time: the same input gives the same result, run after run
    for entry in sorted(by_op.values(), key=lambda e: e["op"]):
        entry["time_share"] = entry["seconds"] / total
        for key in ("modules", "phases", "dtypes"):
            entry[key] = sorted(entry[key])
        ops.append(entry)
    modules = [{"module": m, "calls": c["calls"], "seconds": c["seconds"], "time_share": c["seconds"] / total,
                **{s: c.get(s, 0) for s in STATUSES},
                "fallback_time_share": (c.get(f"{CPU_FALLBACK}_seconds", 0.0)
                                   + c.get(f"{UNSUPPORTED}_seconds", 0.0)) / total}
               for m, c in sorted(by_module.items())]
    return TargetFallbacks(detected.to_dict(), ops, modules, _findings(recording, ops, table, rules))


def _pattern(module: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in module.split("."))


MODULE_CLASS_KINDS = ("recurrent", "recurrent_loop")   # found by a module's type: its class is the cause
# found by what a module computes in: the module (its repeated blocks as one pattern) is the cause, however many
# of its lines show it (a module computing in float64 at three lines is one float64 cause, one module to keep in
# float32)
MODULE_KINDS = ("float64",)


def _label(modules: list[str]) -> str:
    """The modules a finding's cause shows in: one by name, repeated blocks (layer.0 ... layer.11) as a pattern."""
    if len(modules) == 1:
        return modules[0]
    patterns = sorted({_pattern(m) for m in modules})
    return f"{', '.join(patterns[:3])}{', ...' if len(patterns) > 3 else ''} ({len(modules)} modules)"


def _causes(recording: Recording, rules) -> dict[tuple, list]:
    """The recorded features grouped by cause (core.findings.cause_key): a module class for the recurrent kinds,
    the module (its pattern) for MODULE_KINDS, the kind alone for info, else the kind at one source line, split
    where its ops come from disjoint modules (a parent's float64 casts and its child's float64 matmul on one line
    are two causes)."""
    by_line: dict[tuple, list] = collections.defaultdict(list)
    for kind, module, op, detail in recording.features:
        rule = rules.get(kind)
        if rule is None:
            continue
        if kind in MODULE_CLASS_KINDS:
            key = (kind, recording.classes.get(module, module), None)
        elif kind in MODULE_KINDS:
            key = (kind, _pattern(module), None)
        else:
            where = recording.frames.get((kind, module, op))
            key = (kind, "", None if rule.severity == INFO else owners.line_key(where))
        by_line[key].append((module, op, detail))
    groups: dict[tuple, list] = {}
    for (kind, subject, line), items in by_line.items():
        if subject or line is None:   # a module class, or an info kind: one cause
            groups[(kind, subject or kind, line)] = items
            continue
        clusters: list[tuple[set, list]] = []   # ops joined where they share a module
        for item in items:
            hit = [c for c in clusters if item[1] in {op for _, op, _ in c[1]} or item[0] in c[0]]
            merged = (set().union({item[0]}, *(c[0] for c in hit)), [x for c in hit for x in c[1]] + [item])
            clusters = [c for c in clusters if c not in hit] + [merged]
        for _, members in clusters:
            ops = sorted({op for _, op, _ in members})
            groups[(kind, subject or ", ".join(ops), line)] = members
    return groups


def _feature_finding(recording: Recording, kind: str, subject: str, items: list, table, rules) -> Finding:
    rule = rules[kind]
    severity = rule.severity
    if kind == "recurrent" and table.classify(items[0][1]).status == UNSUPPORTED:
        severity = grading.severity(kind, grading.NO_KERNEL)   # the device's cell op has no kernel anywhere
    advice = rule.advice
    if kind == "custom_op" and {op for _, op, _ in items} <= recording.plain_ops:   # no kernel of its own
        severity = grading.severity(kind, grading.PLAIN_TORCH)
        advice = ("its kernel is plain torch, which runs on the target; the target's compiler meets it as one opaque "
                  "op: stage 2 looks inside it (its foreign_op finding)")
    modules = sorted({m for m, _, _ in items})
    where = _label(modules) if rule.severity != INFO or len(modules) == 1 else f"{len(modules)} modules"
    op_names = sorted({op for _, op, _ in items})
    details = "; ".join(sorted({d for _, _, d in items})[:3])
    frame = next((recording.frames.get((kind, m, op)) for m, op, _ in sorted(items)
                  if recording.frames.get((kind, m, op))), None)
    at = f" at {frame['text']}" if frame else ""
    calls = sum(recording.feature_calls.get((kind, m, op), 0) for m, op, _ in items)
    occurrences = {"modules": modules, "count": len(items), **({"calls": calls} if calls else {})}
    lines = sorted({f["text"] for m, op, _ in items if (f := recording.frames.get((kind, m, op)))})
    if kind in MODULE_KINDS and len(lines) > 1:   # one cause at several lines: each is an occurrence
        occurrences["lines"] = lines
    line_of = None if rule.severity == INFO or kind in MODULE_CLASS_KINDS else frame   # a class, a kind: no line
    cause = cause_key(kind, subject, line_of)
    return Finding(kind, severity, f"{kind.replace('_', ' ')} in {where}: {details} "
                   f"({', '.join(op_names[:4])}{', ...' if len(op_names) > 4 else ''}){at}"
                   + (f"; {calls} calls" if calls > 1 else ""), advice, module=where, ops=op_names,
                   source=rule.source, where=frame, owner=owners.owner(frame), cause=cause, occurrences=occurrences)


def _device_path_host(entry: dict, found: list[Finding]) -> Finding | None:
    """The module finding an op finding belongs to: the op is the CPU form of the fused cell a recurrent
    module runs on the device (its `via`), recorded at that module's line or in that module."""
    for f in found:
        if f.kind in MODULE_CLASS_KINDS and entry.get("via") in (f.ops or []) and (
                owners.line_key(f.where) == owners.line_key(entry["where"])
                or set(entry["modules"]) & set((f.occurrences or {}).get("modules", []))):
            return f
    return None


def _findings(recording: Recording, ops: list[dict], table, rules) -> list[Finding]:
    """One finding per cause (core.findings.cause_key), each with its occurrences."""
    findings = [_feature_finding(recording, kind, subject, items, table, rules)
                for (kind, subject, _), items in _causes(recording, rules).items()]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    for entry in ops:
        if entry["status"] in (CPU_FALLBACK, UNSUPPORTED) and entry["status"] in rules:
            rule = rules[entry["status"]]
            occurrence = {"modules": list(entry["modules"]), "count": len(entry["modules"]), "calls": entry["calls"],
                          "ops": {entry["op"]: entry["calls"]}}
            if host := _device_path_host(entry, findings):   # the module's own cause, seen on the CPU
                host.occurrences = merge_occurrences(host.occurrences, {"ops": occurrence["ops"]})
                host.message += f"; recorded on the CPU as {entry['op']} ({entry['calls']} calls)"
                host.severity = min(host.severity, rule.severity, key=order.get)
                continue
            verb = "falls back to the CPU" if entry["status"] == CPU_FALLBACK else "cannot run"
            where = ", ".join(sorted({_pattern(m) for m in entry["modules"]})[:3])
            # the share of op time is a measured figure: it stays in the op's numeric "time_share", not in the text
            findings.append(Finding(entry["status"], rule.severity,
                                    f"{entry['op']} {verb} ({entry['detail']}); {entry['calls']} calls from {where}"
                                    + (f" at {entry['where']['text']}" if entry["where"] else ""), rule.advice,
                                    module=where, ops=[entry["op"]], source=rule.source, where=entry["where"],
                                    owner=owners.owner(entry["where"]), occurrences=occurrence,
                                    cause=cause_key(entry["status"], entry["op"], entry["where"])))
    for f in findings:   # a library's line is changed through its setting, an upgrade or a wrapper, never a rewrite
        f.advice = reconcile.advice_for(f.to_dict(), f.owner)
    return sorted(findings, key=lambda f: (order[f.severity], f.kind, f.module or "", f.cause or ""))


@dataclass
class FallbackReport:
    """Stage 1's result: the recording, and each target's classification of it."""
    model: dict
    inputs: dict
    train: bool
    recorded: dict
    records: list[OpRecord]
    targets: dict[str, TargetFallbacks]

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def to_dict(self) -> dict:
        return {"stage": STAGE, "model": self.model, "inputs": self.inputs, "train": self.train,
                "recorded": self.recorded, "summary": self.summary(),
                "targets": {n: t.to_dict() for n, t in self.targets.items()},
                "records": [r.to_dict() for r in self.records]}

    def save(self, path) -> None:
        save_result(path, self.to_dict())

    def __str__(self) -> str:
        lines = [f"Fallback discovery for {self.model['name']} ({self.inputs['description']}, "
                 f"{'forward+backward' if self.train else 'forward'}): {self.recorded['calls']} ATen calls, "
                 f"{self.recorded['distinct_ops']} distinct ops"]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            for f in t.findings:
                lines.append(f"    [{f.severity}] {f.message}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [f"<p><b>Fallback discovery</b> for <code>{html.escape(self.model['name'])}</code> "
                 f"({html.escape(self.inputs['description'])}): {self.recorded['calls']} ATen calls, "
                 f"{self.recorded['distinct_ops']} distinct ops.</p>"]
        for t in self.targets.values():
            mode = t.target["mode"]
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{mode}</i></h4>"
                         f"<p>{html.escape(t.summary())}</p>")
            if t.findings:
                parts.append(html_table(["severity", "finding", "whose code", "what to do"],
                                         [[f.severity, f.message, (f.owner or {}).get("owner", ""), f.advice]
                                          for f in t.findings]))
        return "\n".join(parts)

    def op_table(self, target: str, limit: int = 25) -> HtmlTable:
        t = self.targets[target]
        rows = [[o["op"], o["status"], o["calls"], f"{o['time_share']:.1%}", ", ".join(o["modules"][:2])
                 + (" ..." if len(o["modules"]) > 2 else ""), o["detail"]] for o in _by_time(t.ops)[:limit]]
        return HtmlTable(["op", "status", "calls", "time", "modules", "why"], rows,
                         f"{target}: top {min(limit, len(t.ops))} of {len(t.ops)} ops by time (time: "
                         f"{self.profile_label()}; the status is {target}'s)")

    def module_table(self, target: str, depth: int = 4) -> HtmlTable:
        rows = _modules_at_depth(self.targets[target].modules, depth)
        return HtmlTable(["module", "calls", *STATUSES, "time"],
                         [[m, c["calls"], *[c[s] for s in STATUSES], f"{c['time_share']:.1%}"] for m, c in rows],
                         f"{target}: calls per module (depth {depth})")

    def plot(self, depth: int = 4, top: int = 12):
        """Per target: calls per module by status (left); and once, the ops that take the most time (right). The
        op time is one CPU profile of the one recording every target is classified from, so it is drawn once, as
        that profile, never as a per-target figure."""
        import matplotlib.pyplot as plt
        names = list(self.targets)
        fig = plt.figure(figsize=(13, 3.2 * max(len(names), 1)))
        grid = fig.add_gridspec(max(len(names), 1), 2)
        for row, name in enumerate(names):
            t = self.targets[name]
            ax = fig.add_subplot(grid[row, 0])
            mods = _modules_at_depth(t.modules, depth)[-top:]
            left = [0] * len(mods)
            for status in STATUSES:
                vals = [c[status] for _, c in mods]
                ax.barh([m for m, _ in mods], vals, left=left, color=STATUS_COLORS[status], label=status)
                left = [a + b for a, b in zip(left, vals)]
            ax.set_title(f"{name} ({t.target['mode']}): ATen calls per module")
            ax.tick_params(axis="y", labelsize=7)
            if row == 0:
                ax.legend(fontsize=7, loc="lower right")
        if names:
            ops = _by_time(self.targets[names[0]].ops)[:top][::-1]
            ax = fig.add_subplot(grid[:, 1])
            ax.barh([o["op"].replace("aten::", "") for o in ops], [100 * o["time_share"] for o in ops], color="#8C8C8C")
            ax.set_title(f"{self.profile_label()}: top ops by share of op time (%)", fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        return fig

    def profile_label(self) -> str:
        """What the op times are: one profile of the model on this machine's CPU, shared by every target."""
        return (f"one CPU profile (this machine), the same for {' and '.join(self.targets)}"
                if len(self.targets) > 1 else "CPU profile (this machine)")


def _by_time(ops: list[dict]) -> list[dict]:
    """Ops by their share of the measured time, for the tables and plots (results keep them by name)."""
    return sorted(ops, key=lambda o: (-o["time_share"], o["op"]))


def _modules_at_depth(modules: list[dict], depth: int) -> list[tuple[str, collections.Counter]]:
    merged: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for m in modules:
        key = ".".join(m["module"].split(".")[:depth])
        for k in ("calls", *STATUSES):
            merged[key][k] += m[k]
        merged[key]["time_share"] += m["time_share"]
    return sorted(merged.items(), key=lambda kv: kv[1]["calls"])


# ---------------------------------------------------------------- native mode: the vendor's own record
def _neuron_vendor_record(run) -> dict:
    import torch_neuronx
    torch_neuronx.clear_op_tracking()
    run()
    return {"source": "torch_neuronx.get_fallback_ops() / get_executed_ops()",
            "fallback_ops": sorted(torch_neuronx.get_fallback_ops()),
            "executed_ops": sorted(torch_neuronx.get_executed_ops())}


def _tpu_vendor_record(run) -> dict:
    # TorchTPU has no fallback API; its missing-op fallback warns "'<op>' is not implemented for TPU.
    # Falling back to CPU" (torch_tpu missing-op fallback; data/sources/torch_tpu_0.2.0_dispatcher_ops.json).
    import logging
    messages: list[str] = []

    class Catch(logging.Handler):
        def emit(self, rec):
            messages.append(rec.getMessage())
    handler = Catch()
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        logging.getLogger().removeHandler(handler)
    messages += [str(w.message) for w in caught]
    hits = sorted({m for m in messages if "is not implemented for TPU" in m})
    return {"source": "TorchTPU missing-op fallback messages", "fallback_messages": hits}


VENDOR_RECORDERS = {"torch_neuronx": _neuron_vendor_record, "torch_tpu": _tpu_vendor_record}


# ---------------------------------------------------------------- workload "generate"
GENERATED_TOKENS = 4       # prefill, then three decode steps: every op a decode step runs, recorded


class _Generation:
    """Stage 1's recorded run for workload "generate": GENERATED_TOKENS for the batch's prompts, eagerly, with the
    bucketed static cache, or where the model raises with it the dynamic one (generation.generate_eager); where it
    raises with both, the batch's forward pass instead, so the ops are still recorded. `what` says which ran."""

    def __init__(self, model, prompts: list[str], inputs: dict):
        from portkit.workloads import generation
        generation.check_generates(model)
        self.lines = list(prompts)[:max(1, len(next(iter(inputs.values()))))]
        if not self.lines:
            raise BadParameter("prompts for workload 'generate'", prompts, hint="give the batch's texts")
        self.model, self.inputs = model, inputs
        self.plan = generation.plan_of(model, self.lines, GENERATED_TOKENS)
        self.what = f"generation of {GENERATED_TOKENS} tokens, static KV cache"

    def __call__(self):
        from portkit.workloads import generation
        try:
            run = generation.generate_eager(self.model, self.lines, GENERATED_TOKENS, self.plan)
        except generation.GenerationRefused as refused:
            self.what = f"the forward pass (generation not recorded: {refused})"
            with torch.no_grad():
                return self.model.module(**self.inputs)
        if run.refused:
            self.what = (f"generation of {GENERATED_TOKENS} tokens, dynamic KV cache (the static one raises: "
                         f"{run.refused['static'].message})")
        return run


# ---------------------------------------------------------------- the stage's verb
class Options(options.StageOptions):
    """Stage 1's options: the parameters cell of notebooks/01_fallbacks.py, each field checked. With workload
    "generate" a built-in model is loaded to check it is a causal LM (other models: when the stage loads them)."""
    NOTEBOOK = "01_fallbacks.ipynb"
    CHECKS = {"corpus": options.check_corpus, "text_column": checks.text, "batch_size": checks.up_to(checks.MAX_BATCH),
              "seq_len": checks.up_to(checks.MAX_SEQ), "train": checks.boolean,
              "workload": checks.one_of(checks.WORKLOADS), "seed": checks.seed}

    def check(self, model: str | None) -> None:
        from portkit.workloads import generation
        generation.check_workload(self.workload, model)


def _tokenizer_findings(model, texts) -> list[Finding]:
    """A tokenizer that does not give the corpus back (portkit.models.huggingface.tokenizer_roundtrip): one finding."""
    from portkit.models import huggingface
    found = huggingface.tokenizer_roundtrip(model, texts) if texts and model.takes_text else None
    if found is None:
        return []
    return [Finding(found["kind"], found["severity"], found["message"], found["advice"],
                    cause=cause_key(found["kind"], "tokenizer"),
                    occurrences={"texts": found["texts"], "lost": found["lost"]})]


@dataclass(frozen=True)
class RecordSettings:
    """How stage 1 records its pass, beyond the batch: a training step or a forward (train), the batch's words in the
    report (description), the workload ("generate": greedy generation from `prompts`) and the corpus texts the batch
    came from (texts, checked to round-trip through the model's tokenizer)."""
    train: bool = False
    description: str | None = None
    workload: str = "inference"
    prompts: list[str] | None = None
    texts: list[str] | None = None


def find_fallbacks(model, inputs: dict[str, torch.Tensor], targets=("neuron", "tpu"),
                   settings: RecordSettings | None = None) -> FallbackReport:
    """Record one eager pass of `model` on `inputs` and classify it for every target.

    model: a portkit.models.registry.LoadedModel. inputs: the dict its encode() returns. settings: RecordSettings
    (None: a forward pass, inference).
    In native mode for a target, its pass is recorded on the device with the live dispatcher table,
    and the vendor's own fallback record is added. workload "generate" (a causal LM): greedy generation of
    GENERATED_TOKENS from `prompts` with a static KV cache is recorded instead (prefill, then decode steps
    writing the cache: _Generation says which cache, or the forward pass where the model refuses both), on the
    CPU in both modes. texts: the corpus the batch came
    from, checked to round-trip through the model's tokenizer (a tokenizer that loses the text is a finding).
    """
    settings = settings or RecordSettings()
    train, description, texts = settings.train, settings.description, settings.texts
    run = _Generation(model, settings.prompts or [], inputs) if settings.workload == "generate" else None
    names = specs.parse_targets(targets)
    detected = [specs.detect(n) for n in names]
    scan = source_scan.scan_model(model)   # before recording: a model that cannot run here still gets its findings
    cpu_recording = None
    per_target: dict[str, TargetFallbacks] = {}
    records: list[OpRecord] = []
    for d in detected:
        if d.native and d.target.vendor_module and run is None:
            with placement.on_device(model.module, d.target.device, inputs) as dev_inputs:
                recording = source_scan.noted(scan, record, model, dev_inputs, train)
                with torch.no_grad():
                    vendor = VENDOR_RECORDERS[d.target.vendor_module](lambda: model.module(**dev_inputs))
        else:
            if cpu_recording is None:
                cpu_recording = source_scan.noted(scan, record, model, inputs, train, run)
            recording, vendor = cpu_recording, None
        result = classify(recording, d)
        result.findings = source_scan.merge(result.findings, scan, d.name) + _tokenizer_findings(model, texts)
        result.vendor_record = vendor
        per_target[d.name] = result
        if not records:
            records = sorted(recording.records.values(),
                             key=lambda r: (r.op, r.module, r.phase, owners.line_key(r.where) or ""))
    if run is not None:       # what the recorded run was is known once it ran
        description = f"{description or 'prompts'}; {run.what}"
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    first = next(iter(shapes.values()), [])
    desc = description or ("batch " + " x ".join(str(s) for s in first) if first else "no tensor inputs")
    calls = sum(r.calls for r in records)
    return FallbackReport(
        model=model.describe(), inputs={"description": desc, "shapes": shapes}, train=train,
        recorded={"calls": calls, "distinct_ops": len({r.op for r in records}),
                  "seconds": cpu_recording.seconds if cpu_recording else None},
        records=records, targets=per_target)
