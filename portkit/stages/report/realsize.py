"""The report's section on an abstract model's real-size check (stage 3b, portkit/stages/xla/realsize.py): read from
xla.json into a target's metrics and detail tables. Every capacity figure keeps its label, "estimate,
not measured".

report.json keys it adds to a target (stable):
- "metrics"["scale"]: {label: text}: the largest batch per shape that fits HBM (an abstract model's buckets,
  or a loaded model's shapes with -p largest_batch True); for an abstract model also the model and shape
  checked; TPU: the smallest topology that fits
  (or that none does), the largest batch per bucket that fits HBM, the roofline throughput per chip;
  Neuron: the FLOPs counted on the graph, tokens/s per chip and model copies per instance per chip.
- "details"["scale topologies"]: TPU, one row per topology tried: "topology", "devices", "verdict",
  "HBM per device GiB", "HBM of device GiB", "fits", "collectives", "compile s", "tokens/s per chip (estimate)".
- "details"["capacity (estimate, not measured)"]: Neuron, one row per chip: "chip", "instance",
  "tokens/s per chip", "bound", "NeuronCores per copy", "copies per chip", "copies per instance".

    >>> from portkit.stages.report import realsize
    >>> realsize.read(results.load(run_dir, "xla").target("tpu"), target_report)   # no "scale": nothing added
"""
from __future__ import annotations

from portkit.models import meta_device

SECTION = "scale"
CAPACITY = "capacity (estimate, not measured)"


def _gib(value) -> float | None:
    return round(value / 2 ** 30, 2) if isinstance(value, (int, float)) else None


def read(t, out) -> None:
    """Add the real-size check of one target's xla.json entry (xla_result.Target) to its TargetReport `out`
    (nothing when absent)."""
    scale = t.scale
    metrics = {}
    for found in (scale or {}).get("largest_batch") or t.largest_batch:
        at_limit = "+ (the search's limit)" if found["batch"] >= found["limit"] else ""
        where = f"seq {found['seq']}" if found.get("seq") else found.get("shape", "")
        metrics[f"largest batch that fits HBM, {where}"] = (
            f"{found['batch']}{at_limit} on {found['topology']} ({found['compiles']} compiles)")
    if metrics:
        out.metrics[SECTION] = metrics
    if not scale:
        return
    model = scale["model"]
    label = scale["label"]
    size = meta_device.size(model["parameters"])
    metrics = {"real-size check": f"{model['name']} ({size} parameters, no weights), "
                                  f"batch {scale['batch']} x seq {scale['seq']}", **metrics}
    if scale.get("capacity"):
        cap = scale["capacity"]
        flops = f"{cap['flops'] / 1e12:,.1f} TFLOP" if cap["flops"] >= 1e12 else f"{cap['flops'] / 1e9:,.2f} GFLOP"
        metrics["FLOPs counted on the graph"] = f"{flops} per step ({cap['tokens']} tokens)"
        metrics[f"tokens/s per chip ({label})"] = ", ".join(
            f"{name} {c['tokens_per_second_per_chip']:,.0f}" for name, c in cap["chips"].items())
        metrics[f"model copies per instance ({label})"] = ", ".join(
            f"{c['instance']} {c['copies_per_instance']}" for c in cap["chips"].values())
        out.details[CAPACITY] = [
            {"chip": name, "instance": c["instance"], "tokens/s per chip": round(c["tokens_per_second_per_chip"]),
             "bound": c["bound"], "NeuronCores per copy": c["neuron_cores_per_copy"],
             "copies per chip": c["copies_per_chip"], "copies per instance": c["copies_per_instance"]}
            for name, c in cap["chips"].items()]
    rows = scale.get("topologies") or []
    if rows:
        best = next((r for r in rows if r["topology"] == scale["smallest_fitting"]), None)
        metrics["smallest topology that fits"] = (
            f"{best['topology']} ({_gib(best['hbm_per_device'])} of {_gib(best['hbm_of_device'])} GiB HBM per device)"
            if best else "none of " + ", ".join(r["topology"] for r in rows))
        if best and best.get("roofline"):
            roof = best["roofline"]
            metrics[f"tokens/s per chip ({label})"] = (
                f"{roof['tokens_per_second_per_chip']:,.0f} on {best['topology']} ({roof['bound']}-bound roofline)")
        out.details["scale topologies"] = [
            {"topology": r["topology"], "devices": r["devices"], "verdict": r["status"],
             "HBM per device GiB": _gib(r["hbm_per_device"]), "HBM of device GiB": _gib(r["hbm_of_device"]),
             "fits": r["fits"], "collectives": "HLO text unreadable" if r["collectives"] is None
             else ", ".join(f"{k} {v}" for k, v in r["collectives"].items()) or None,
             "compile s": round(r["compile_seconds"], 1) if r.get("compile_seconds") else None,
             "tokens/s per chip (estimate)": round(r["roofline"]["tokens_per_second_per_chip"])
             if r.get("roofline") else None} for r in rows]
    out.metrics[SECTION] = metrics
