"""The numbers of one target's stage results, read once for every reader: report.json's "numbers" beside its text,
and the CI gate's comparisons (portkit.deploy.gate).

    >>> from portkit.runfolder import numbers, results
    >>> stages = {s: results.load("runs/minilm", s) for s in ("compile", "buckets", "xla", "accuracy")}
    >>> numbers.of(stages, "tpu")         # the typed results (results.load), None where a stage has none
    {'compiles': 10, 'compiles_after_warmup': 0, 'hbm_bytes': 105100288, 'cosine_min': 0.99995, ...}

Each value is what its stage recorded, or absent where the stage did not run or did not record it (never a zero
standing in for "unknown").
"""
from __future__ import annotations

from portkit.runfolder import results


def _target(stages: dict, stage: str, name: str):
    """The typed part of target `name` in `stage`'s result; None where the stage or the target has none (or the
    target's part is damaged: the report names that as a gap)."""
    return results.target_part(stages.get(stage), name, damaged_as_none=True)


def compiles(stages: dict, name: str) -> int | None:
    """Graphs stage 2 compiled (or counted from guard failures) for its requests without buckets."""
    compiled = _target(stages, "compile", name)
    return None if compiled is None else compiled.storm.compile_count


def compiles_after_warmup(stages: dict, name: str) -> int | None:
    """Compiles after warm-up: stage 3's replay under the bucket plan plus stage 2's fixed-shape check."""
    bucketed, compiled = _target(stages, "buckets", name), _target(stages, "compile", name)
    found = [v for v in (bucketed and bucketed.compiles_after_warmup, compiled and compiled.fixed_compiles_after)
             if isinstance(v, int)]
    return sum(found) if found else None


def hbm_bytes(stages: dict, name: str) -> int | None:
    """The largest compiled shape's HBM need per device (xla.json's memory analysis)."""
    xla = _target(stages, "xla", name)
    return None if xla is None else xla.hbm_bytes


def task_checks(stages: dict, name: str) -> dict[str, dict]:
    """Stage 4's task checks by label: value, ci95, budget, passed."""
    accuracy = _target(stages, "accuracy", name)
    return {} if accuracy is None else accuracy.task.by_label()


def _compile_seconds(stages: dict, name: str) -> float | None:
    compiled = _target(stages, "compile", name)
    found = None if compiled is None else compiled.compile_seconds.median
    return None if found is None else float(found)


def _xla_compile_seconds(stages: dict, name: str) -> float | None:
    xla = _target(stages, "xla", name)
    found = [s.compile_seconds for s in xla.shapes if s.compile_seconds is not None] if xla else []
    return max(found) if found else None


def _fallbacks(stages: dict, name: str) -> dict:
    found = _target(stages, "fallbacks", name)
    return {} if found is None else {"cpu_fallback_ops": found.counts.get("cpu_fallback"),
                                     "cpu_fallback_time_share": found.time_share.get("cpu_fallback")}


def _accuracy(stages: dict, name: str) -> dict:
    found = _target(stages, "accuracy", name)
    if found is None:
        return {}
    checks = found.task.by_label()
    return {"cosine_min": found.task.cosine_min, "cosine_mean": found.task.cosine_mean, "task_items": found.task.items,
            "task_checks": {label: {k: c.get(k) for k in ("metric", "value", "ci95", "budget", "passed") if k in c}
                            for label, c in checks.items()} or None}


def of(stages: dict, name: str) -> dict:
    """Every number the stages recorded for target `name`, by a stable key; absent where not recorded.
    `stages`: {stage name: its typed result (results.load)}, a stage without a result absent or None."""
    bucketed = _target(stages, "buckets", name)
    chosen = bucketed.chosen if bucketed else None
    found = {
        **_fallbacks(stages, name),
        "compiles": compiles(stages, name),
        "compile_seconds_median": _compile_seconds(stages, name),
        "compiles_after_warmup": compiles_after_warmup(stages, name),
        "buckets": len(chosen.boundaries or []) or None if chosen else None,
        "padding_waste": chosen.padding_waste if chosen else None,
        "hbm_bytes": hbm_bytes(stages, name),
        "xla_compile_seconds_max": _xla_compile_seconds(stages, name),
        **_accuracy(stages, name),
    }
    order = ("cpu_fallback_ops", "cpu_fallback_time_share", "compiles", "compile_seconds_median",
             "compiles_after_warmup", "buckets", "padding_waste", "hbm_bytes", "xla_compile_seconds_max",
             "cosine_min", "cosine_mean", "task_items", "task_checks")
    return {k: found[k] for k in order if found.get(k) is not None}
