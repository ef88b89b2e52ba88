"""Each eager finding (stage 1) against the compiled graphs (stage 2): persists, vanishes or not checked.

    >>> from portkit.stages import reconcile
    >>> from portkit.runfolder import results
    >>> eager = results.load("runs/minilm", "fallbacks").target("tpu")    # stage 1's typed part for a target
    >>> compiled = results.load("runs/minilm", "compile").reconcilable    # stage 2's graph breaks, checked
    >>> for f in reconcile.reconcile(eager.findings, compiled, "tpu"):
    ...     print(f["severity"], f["compiled"], f["message"])              # info vanishes host sync in ...

Stage 1 records one eager pass; both vendors run models under torch.compile, where an eager path may be
traced away (transformers skips its mask shortcut when traced) or become a graph break. A finding
persists when one of its ops is in a graph the compiled model runs (with the finding's dtype, for dtype
findings), or when its source line is where Dynamo breaks the graph (the code then runs eagerly between
graphs); it vanishes when neither holds; it is not checked when stage 2 did not run for the target,
failed, ran natively, or the target refused the graph. Severity follows what persists and states its
consequence: a vanished finding is info (no cost under compile), a persisting or unchecked one keeps the
target's severity with its cost named. Whose code it is (portkit.core.owners.owner) decides the advice: the
user's code is fixed in place, a library's through its setting, an upgrade or a wrapper, portkit's own wrapper
through a factory of the user's own.
Pure functions over the stage results' dicts: the report and the notebooks call them.
"""
from __future__ import annotations

from portkit.core import owners, grading
from portkit.core.tables import HtmlTable
from portkit.core.findings import BLOCKER, HOST_SYNC_OPS, INFO, NOT_CHECKED, PERSISTS, SEVERITIES, VANISHES, WORK

# Findings whose op is a dtype's use, not the op itself: they persist only with that dtype in the graph.
DTYPE_KINDS = {"float64": "float64", "int64": "int64", "int64_overflow": "int64", "int64_saturated": "int64"}
# The recurrence itself: the CPU graph holds the CPU form of the cell, the device runs its own.
RECURRENT_OPS = ("aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu", "aten::_thnn_fused")
DEVICE_PATH = ("not checked: the device takes another path (the CPU trace decomposes the recurrent cell; on the "
               "device the same call runs the fused cell)")
OP_KINDS = ("cpu_fallback", "unsupported")   # about the op wherever it runs: any line of the graph counts
LINE_EDITS = ("host_sync", "data_dependent")   # kinds whose target advice is an edit of the line itself
# Found by stage 1's source scan (portkit/stages/fallbacks/source_scan.py) in the source or the model's modules, not
# in the recording: torch.compile does not change them, so they are not checked against the graphs.
SCANNED_KINDS = ("gpu_kernel", "gpu_package", "gpu_device", "vendor_list")
SCANNED = "not checked: found in the source or the model's modules, which torch.compile does not change"
# About the inputs every stage builds (the tokenizer's text), not about the model's ops: compiling does not change it.
INPUT_KINDS = ("tokenizer_roundtrip",)
INPUTS = "not checked: about the model's inputs, which torch.compile does not change"

# What each kind costs on the target when it persists, by severity: the consequence behind it.
COSTS = {
    "host_sync": "a device-to-host copy on every call, and Python code between two compiled graphs",
    "cpu_fallback": "a CPU round trip on every call: inputs copied to the host and the result back",
    "unsupported": "cannot run on the target: no kernel and no CPU fallback",
    "data_dependent": "an output size known only at run time: a graph break and a dynamic shape the "
                      "target's static-shape compiler refuses, or a recompile per distinct size",
    "float64": "runs as float32 on the target: a precision loss; stage 4 measures whether the task sees it",
    "int64": "runs as int32: no cost while values stay below 2**31",
    "int64_overflow": "values beyond int32 are wrong on the target",
    "int64_saturated": "the sentinels differ on the target (int32's +-2**31): outputs differ only where they are "
                       "not masked out, unmeasured here",
    "recurrent": {BLOCKER: "cannot run on the target: the device's fused recurrent cell op has no kernel "
                           "and no CPU fallback",
                  WORK: "the device's fused recurrent cell is experimental there: its speed is unmeasured"},
    "recurrent_loop": "runs as a matmul and a nonlinearity per step on the target: no fused cell needed",
    "attention_mask": "an explicit attention mask keeps attention off the target's fused flash kernel",
    "sparse": "sparse tensors have no kernels on the target", "nested": "NestedTensor has no kernels on the target",
    "custom_op": "a custom kernel does not carry over to the target",
    "tokenizer_roundtrip": "the inputs every stage measured are not the text the model was trained on",
    "gpu_kernel": "a GPU-only kernel (Triton or CUDA) does not run on the target",
    "gpu_package": "a GPU-only package's kernels do not run on the target",
    "gpu_device": "code written for CUDA devices fails or takes another path off NVIDIA",
    "vendor_list": "on the vendor's list of experimental or unsupported features",
}


def _same_line(a: dict | None, b: dict | None) -> bool:
    return bool(a and b) and a.get("file") == b.get("file") and a.get("line") == b.get("line")


def _member(record: dict, key: str) -> dict:
    """The object `record` holds under `key`, {} where it holds none."""
    found = record.get(key)
    return found if isinstance(found, dict) else {}


def compiled_view(compiled: dict | None, target: str) -> tuple[dict | None, str]:
    """What stage 2 recorded for `target`: (its graph breaks and graph contents, or None; why not). `compiled` holds
    stage 2's "graph_breaks": its own result in memory, or compile.json's as portkit.runfolder.compile_result read
    and checked it."""
    if not isinstance(compiled, dict):
        return None, "no stage 2 (compile) result: not run, failed or unreadable"
    breaks = _member(compiled, "graph_breaks")
    check = _member(breaks, "checks").get(target)
    if not check:
        return None, f"stage 2 recorded no compiled graph for {target} (native or reference target)"
    if "ops" not in check:
        return None, "the compile result predates the record of graph contents: rerun stage 2"
    stops = list(breaks.get("breaks") or [])
    full = _member(breaks, "fullgraph")
    if not full.get("ok", True) and full.get("where"):   # what stops fullgraph=True is a break too
        stops.append({"reason": full.get("explanation") or full.get("message", ""), "where": full["where"]})
    refused = f"{target}'s compiler refused a graph, so the graphs' contents were not all checked"
    return {"breaks": stops, "ops": check["ops"], "graphs": check.get("graphs", 0), "fullgraph": full,
            "refused": refused if check.get("refused") else None}, ""


def status_of(finding: dict, view: dict) -> tuple[str, str]:
    """(persists, vanishes or not checked; why) for one eager finding against the compiled graphs."""
    where, kind = finding.get("where"), finding.get("kind")
    if kind in SCANNED_KINDS:
        return NOT_CHECKED, SCANNED
    if kind in INPUT_KINDS:
        return NOT_CHECKED, INPUTS
    if not view["graphs"] and not view.get("refused"):
        full = view["fullgraph"]
        return PERSISTS, ("Dynamo captured no graph: under torch.compile the whole model runs eagerly"
                          + (f" ({full.get('message')} at {full['where']['text']})" if full.get("where") else ""))
    brk = next((b for b in view["breaks"] if _same_line(b.get("frame") or b.get("where"), where)), None)
    if brk is not None:
        return PERSISTS, f"a graph break at this line under torch.compile ({brk.get('reason', '')})"
    if view.get("refused"):   # its graph breaks are known, its graphs' contents not
        return NOT_CHECKED, view["refused"]
    ops = finding.get("ops") or []
    if kind in ("recurrent", "recurrent_loop"):
        ops = [op for op in view["ops"] if op.startswith(RECURRENT_OPS)]
        broken = [b for b in view["breaks"] if any(w in (b.get("reason") or "") for w in ("RNN", "LSTM", "GRU"))]
        if broken:
            return PERSISTS, f"a graph break: {broken[0]['reason']}; the cell runs eagerly on the device"
        if kind == "recurrent" and not any(op in view["ops"] for op in ops):
            # The graphs were traced on the CPU, where at::lstm_cell and at::gru_cell decompose into matmuls and
            # nonlinearities; on a PrivateUse1 tensor the same call dispatches to the fused cell
            # (aten/src/ATen/native/RNN.cpp), so a CPU trace without the cell proves nothing about the device.
            return NOT_CHECKED, DEVICE_PATH
    elif kind == "host_sync":
        ops = [op for op in ops if op in HOST_SYNC_OPS]
    dtype = DTYPE_KINDS.get(kind)
    hits = [op for op in ops if op in view["ops"] and (dtype is None or dtype in view["ops"][op]["dtypes"])]
    if kind not in OP_KINDS and where:   # a feature of one line: its op must be made there in the graph
        key = owners.line_key(where)
        hits = [op for op in hits if key in view["ops"][op].get("lines", [key])]
    if hits:
        at = where if kind not in OP_KINDS and where else next(iter(view["ops"][hits[0]]["where"]), None)
        return PERSISTS, (f"{hits[0]} is in the compiled graph{' with ' + dtype if dtype else ''}"
                          + (f" at {at['text']}" if at else ""))
    return VANISHES, (f"traced away: not in the {view['graphs']} compiled graph(s) and no graph break at its line"
                      + (" (torch.compile takes another path there)" if where else ""))


def advice_for(finding: dict, owner: dict) -> str:
    """The finding's advice in terms of who can change the code: never "rewrite this line" of a library.
    The target's own advice is kept where it is no edit of the line (a kernel, an input layout, a dtype)."""
    advice, where = finding.get("advice", ""), _member(finding, "where")
    if finding.get("severity") == INFO or owner["owner"] not in (owners.CONFIGURABLE, owners.LIBRARY, owners.PORTKIT):
        return advice   # the user's code, or nothing to change: the target's advice stands
    note = "" if finding.get("kind") in LINE_EDITS else f"; the target's note: {advice}"
    head = f"not your code ({owner['package']}, {where.get('text', '')})"
    if owner["owner"] == owners.PORTKIT:   # the wrapper portkit put around the model, not the model itself
        return (f"{head}: portkit's own wrapper around the model makes this; load the model through a factory of "
                f"your own (`--model file.py:factory`) to choose how it is called, or report it to portkit{note}")
    if owner["owner"] == owners.CONFIGURABLE:
        return (f"{head}: the setting that changes this path is {owner['setting']} ({owner['setting_help']}); "
                f"or upgrade {owner['package']}{note}")
    # portkit knows no setting of this library that changes the path (owners.SETTINGS): leads, not a tried fix
    return (f"{head}: may help (not tried by portkit, which knows no setting of {owner['package']} for this path): "
            f"a newer {owner['package']}, or wrapping the module that calls it in one of your own{note}")


def reconcile(findings: list[dict], compiled: dict | None, target: str) -> list[dict]:
    """Stage 1's findings for `target` (their dicts), each with its compiled status, owner, advice,
    consequence and the severity that follows, ordered by consequence."""
    view, why_not = compiled_view(compiled, target)
    out = []
    for f in findings:
        f = dict(f.items())   # a finding that is no object fails here, as a reader expects
        owner = f.get("owner") or owners.owner(f.get("where"))
        eager = f.get("eager_severity") or f.get("severity", INFO)
        status, detail = status_of(f, view) if view else (NOT_CHECKED, why_not)
        cost = COSTS.get(f.get("kind"), "")
        cost = cost.get(eager, "") if isinstance(cost, dict) else cost
        if status == VANISHES:
            severity = grading.severity("eager_feature", grading.VANISHED)
            consequence = ("eager only: no cost under torch.compile, the way both vendors run models; "
                           f"in eager mode: {cost}" if cost else "eager only: no cost under torch.compile")
        else:
            severity = eager
            consequence = {BLOCKER: f"blocker: {cost or 'cannot run or compile on the target'}",
                           WORK: f"work: {cost or 'runs, with a cost'}",
                           INFO: f"info: {cost or 'no cost found'}"}[severity]
            if status == NOT_CHECKED:
                consequence += f" (eager; under torch.compile not checked: {detail})"
        if "owner" not in f:   # stage 1 already phrased the advice for its owner
            f["advice"] = advice_for(f, owner)
        if status == VANISHES:
            f["advice"] = f"nothing to do when compiled; only eager runs pay it ({f['advice']})"
        f.update(eager_severity=eager, severity=severity, compiled=status, compiled_detail=detail,
                 owner=owner, consequence=consequence)
        out.append(f)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda f: (order.get(f["severity"], 9), f["compiled"] == VANISHES))


def vanished_line(findings: list[dict]) -> str | None:
    """One line for the eager findings that vanish under compile, or None when none do."""
    gone = [f for f in findings if f.get("compiled") == VANISHES]
    if not gone:
        return None
    kinds = sorted({f.get("kind", "?").replace("_", " ") for f in gone})
    one = len(gone) == 1
    return (f"{len(gone)} {'thing' if one else 'things'} found when the model runs eagerly "
            f"{'is' if one else 'are'} gone once torch.compile traces it, so {'it costs' if one else 'they cost'} "
            f"nothing compiled: " + ", ".join(kinds))


def table(findings: list[dict], caption: str = "") -> HtmlTable:
    """Reconciled findings side by side: eager severity, under compile, whose code, the consequence."""
    return HtmlTable(["severity", "eager", "under torch.compile", "whose code", "finding", "consequence"],
                     [[f["severity"], f["eager_severity"], f"{f['compiled']}: {f['compiled_detail']}",
                       f["owner"]["owner"] + (f" ({f['owner']['package']})" if f["owner"].get("package") else ""),
                       f.get("message", ""), f["consequence"]] for f in findings], caption)
