"""Stage 4's result (accuracy.json) as types: per target, the verdict and its basis, the chosen precision, the
task metrics with their checks, the errors per output, bucket and layer; for the run, the generation, stream and
training comparisons.

    >>> from portkit.runfolder import results
    >>> found = results.load("runs/minilm", "accuracy")         # None where stage 4 has no result
    >>> found.target("tpu").verdict, found.target("tpu").task.checks[0]["value"]

Written by portkit.stages.accuracy; read here only, validated as it is read (portkit.runfolder.reading): a damaged
value raises UnreadableResult naming the file, the key and the damage.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.runfolder import reading

STAGE = "accuracy"


@dataclass(frozen=True)
class Task:
    """The task metrics a target was judged on, each check with its value, interval, budget and decision."""
    metric: str | None = None
    checks: tuple[dict, ...] = ()
    sample_text: str | None = None
    cosine_min: float | None = None
    cosine_mean: float | None = None
    items: int | None = None

    @classmethod
    def from_dict(cls, node: reading.Node) -> Task:
        checks = node.objects("checks")
        for c in checks:
            c.number("value"), c.integer("n"), c.items("ci95")
        return cls(node.text("metric"), tuple(dict(c.value) for c in checks), node.obj("sample").text("text"),
                   node.number("cosine_min"), node.number("cosine_mean"), node.integer("items"))

    def by_label(self) -> dict[str, dict]:
        """The checks by label (by metric where a check has no label)."""
        return {c.get("label") or c.get("metric"): c for c in self.checks}


@dataclass(frozen=True)
class BucketRow:
    """One bucket of the chosen plan run on the target: its texts, padding, and the error of each output."""
    boundary: object
    texts: object
    padding: float | None
    primary: str | None              # the output that decides
    outputs: dict[str, dict]
    passed: object

    @classmethod
    def from_dict(cls, node: reading.Node) -> BucketRow:
        return cls(node.raw("boundary"), node.raw("texts"), node.number("padding"), node.text("primary"),
                   node.records("outputs"), node.raw("passed"))


@dataclass(frozen=True)
class Cause:
    """One cause of the error (float64 run as float32, then the precision's rounding) and its error per output."""
    cause: str
    outputs: dict[str, dict]

    @classmethod
    def from_dict(cls, node: reading.Node) -> Cause:
        return cls(str(node.raw("cause")), node.records("outputs"))


@dataclass(frozen=True)
class Target(reading.TargetPart):
    verdict: str | None
    basis: str | None
    precision: dict | None           # the chosen precision: name, setting, matmul_inputs, all_ops
    suggestions: tuple[str, ...]
    reasons: tuple[str, ...]
    target_side: str | None
    outputs: dict[str, dict]         # output name -> its error against the reference
    task: Task
    buckets: tuple[BucketRow, ...]
    baseline: dict | None            # the error against today's GPU
    error_by_cause: tuple[Cause, ...]
    layer_modules: tuple[dict, ...]  # per module, its error (compared, rel_l2, max_abs, mismatched, numel, passed)
    first_failing: str | None        # the first module out of tolerance

    @classmethod
    def from_dict(cls, t: reading.Node) -> Target:
        layers = t.obj("layers")
        return cls(**cls.common(t), verdict=t.text("verdict"), basis=t.text("basis"), precision=t.record("precision"),
                   suggestions=tuple(str(x.value) for x in t.items("suggestions")),
                   reasons=tuple(str(x.value) for x in t.items("reasons")), target_side=t.text("target_side"),
                   outputs=t.records("outputs"), task=Task.from_dict(t.obj("task")),
                   buckets=tuple(BucketRow.from_dict(b) for b in t.objects("buckets")), baseline=t.record("baseline"),
                   error_by_cause=tuple(Cause.from_dict(c) for c in t.objects("error_by_cause")),
                   layer_modules=tuple(dict(m.value) for m in layers.objects("modules")),
                   first_failing=layers.obj("first_failing").text("module"))


@dataclass(frozen=True)
class Result(reading.StageFile):
    generation: dict[str, dict]      # workload "generate": per target, greedy tokens against the reference
    stream_runs: tuple[dict, ...]    # a streaming step: per target, its state's drift
    training: dict[str, dict]        # workload "train": per target, the training verdict
    gpu_numerics: str | None = None  # the GPU setting the errors were measured against (reference.gpu_baseline)

    @classmethod
    def from_dict(cls, data: dict, path) -> Result:
        root = reading.Node(data, path, STAGE)
        return cls(**cls.common(root, Target.from_dict),
                   generation=root.obj("generation").records("targets"),
                   stream_runs=tuple(dict(r.value) for r in root.obj("stream").objects("runs")),
                   training=root.obj("training").records("verdicts"),
                   gpu_numerics=root.obj("reference").obj("gpu_baseline").text("gpu_numerics"))

