"""The numbers of one target's stage results, read once for every reader: report.json's "numbers" beside its text,
and the CI gate's comparisons (portkit.deploy.gate).

    >>> from portkit.runfolder import numbers
    >>> numbers.of({"compile": compile_json, "buckets": buckets_json, ...}, "tpu")
    {'compiles': 10, 'compiles_after_warmup': 0, 'hbm_bytes': 105100288, 'cosine_min': 0.99995, ...}

Each value is what its stage recorded, or absent where the stage did not run or did not record it (never a zero
standing in for "unknown").
"""
from __future__ import annotations


def _target(stages: dict, stage: str, name: str) -> dict:
    found = ((stages.get(stage) or {}).get("targets") or {}).get(name)
    return found if isinstance(found, dict) else {}


def compiles(stages: dict, name: str) -> int | None:
    """Graphs stage 2 compiled (or counted from guard failures) for its requests without buckets."""
    storm = _target(stages, "compile", name).get("storm") or {}
    value = storm.get("compile_count", storm.get("compiles"))
    return value if isinstance(value, int) else None


def compiles_after_warmup(stages: dict, name: str) -> int | None:
    """Compiles after warm-up: stage 3's replay under the bucket plan plus stage 2's fixed-shape check."""
    found = [v for v in (_target(stages, "buckets", name).get("compiles_after_warmup"),
                         (_target(stages, "compile", name).get("fixed") or {}).get("compiles_after"))
             if isinstance(v, int)]
    return sum(found) if found else None


def hbm_bytes(stages: dict, name: str) -> int | None:
    """The largest compiled shape's HBM need per device (xla.json's memory analysis)."""
    totals = [(s.get("memory") or {}).get("total") for s in _target(stages, "xla", name).get("shapes") or []]
    totals = [t for t in totals if isinstance(t, (int, float))]
    return int(max(totals)) if totals else None


def task_checks(stages: dict, name: str) -> dict[str, dict]:
    """Stage 4's task checks by label: value, ci95, budget, passed."""
    task = _target(stages, "accuracy", name).get("task") or {}
    return {c.get("label") or c.get("metric"): c for c in task.get("checks") or [] if isinstance(c, dict)}


def _compile_seconds(stages: dict, name: str) -> float | None:
    found = (_target(stages, "compile", name).get("compile_seconds") or {}).get("median")
    return float(found) if isinstance(found, (int, float)) else None


def _xla_compile_seconds(stages: dict, name: str) -> float | None:
    found = [s.get("compile_seconds") for s in _target(stages, "xla", name).get("shapes") or []]
    found = [s for s in found if isinstance(s, (int, float))]
    return max(found) if found else None


def of(stages: dict, name: str) -> dict:
    """Every number the stages recorded for target `name`, by a stable key; absent where not recorded."""
    fallbacks = _target(stages, "fallbacks", name)
    checks = task_checks(stages, name)
    accuracy = _target(stages, "accuracy", name).get("task") or {}
    buckets = (_target(stages, "buckets", name).get("chosen") or {})
    found = {
        "cpu_fallback_ops": (fallbacks.get("counts") or {}).get("cpu_fallback"),
        "cpu_fallback_time_share": (fallbacks.get("time_share") or {}).get("cpu_fallback"),
        "compiles": compiles(stages, name),
        "compile_seconds_median": _compile_seconds(stages, name),
        "compiles_after_warmup": compiles_after_warmup(stages, name),
        "buckets": len(buckets.get("boundaries") or []) or None,
        "padding_waste": buckets.get("padding_waste"),
        "hbm_bytes": hbm_bytes(stages, name),
        "xla_compile_seconds_max": _xla_compile_seconds(stages, name),
        "cosine_min": accuracy.get("cosine_min"),
        "cosine_mean": accuracy.get("cosine_mean"),
        "task_items": accuracy.get("items"),
        "task_checks": {label: {k: c.get(k) for k in ("metric", "value", "ci95", "budget", "passed") if k in c}
                        for label, c in checks.items()} or None,
    }
    return {k: v for k, v in found.items() if v is not None}
