"""Stage 3's result (buckets.json) as types: per target, the chosen bucket plan, its replay and compile price; for
the run, the request distribution and trace, the padding price per target, truncation, and the generation,
training and grid plans of the other workloads.

    >>> from portkit.runfolder import results
    >>> found = results.load("runs/minilm", "buckets")          # None where stage 3 has no result
    >>> found.target("tpu").chosen.boundaries, found.distribution_count, found.padding_price["tpu"].seconds

Written by portkit.stages.buckets; read here only, validated as it is read (portkit.runfolder.reading): a damaged
value raises UnreadableResult naming the file, the key and the damage.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.runfolder import reading

STAGE = "buckets"


@dataclass(frozen=True)
class Chosen:
    """The bucket plan stage 3 chose for a target (every field None where it chose none)."""
    planner: str | None = None
    boundaries: list[int] | None = None        # ascending sequence lengths
    batch_sizes: list[int] | None = None
    why: str | None = None
    padding_waste: float | None = None
    shapes: tuple[tuple[int, int | None], ...] = ()     # (batch, seq) of every shape it compiles
    real_tokens: float | None = None
    padded_tokens: float | None = None
    overflow: str | None = None
    warmup_seconds: float | None = None

    @classmethod
    def from_dict(cls, node: reading.Node) -> Chosen:
        # "waste" is the name an older result gave the padding waste
        waste = node.number("padding_waste") if node.has("padding_waste") else node.number("waste")
        shapes = tuple(reading.shape(s, node.at("shapes").key) for s in node.items("shapes"))
        return cls(node.text("planner"), reading.positive_ints(node, "boundaries"),
                   reading.positive_ints(node, "batch_sizes"), node.text("why"), waste, shapes,
                   node.number("real_tokens"), node.number("padded_tokens"), node.text("overflow"),
                   node.obj("settings").number("warmup_seconds"))


@dataclass(frozen=True)
class ReplayRow:
    """One replay of stage 3's requests: without buckets (plan None) or with a plan."""
    plan: dict | None
    requests: int | None
    compiles: int | None
    compiles_after_warmup: int | None
    target_compile_seconds: float | None       # its compiles priced on the target
    failure: object = None                     # why it was stopped (falsy: it ran); nothing it counts is known then
    note: str | None = None

    @property
    def plan_boundaries(self) -> list | None:
        return None if self.plan is None else self.plan.get("boundaries")

    @classmethod
    def from_dict(cls, node: reading.Node) -> ReplayRow:
        plan = node.obj("plan") if node.at("plan").value is not None else None
        if plan is not None:
            reading.positive_ints(plan, "boundaries")
        return cls(None if plan is None else dict(plan.value), node.integer("requests"), node.integer("compiles"),
                   node.integer("compiles_after_warmup"), node.number("target_compile_seconds"),
                   node.raw("failure"), node.text("note"))


@dataclass(frozen=True)
class PaddingPrice:
    """What stage 3 charged a padded position on a target, and where that came from."""
    seconds: float | None
    kind: str | None
    label: str | None
    flops: float | None = None         # the FLOPs a position adds, where the price is the FLOPs estimate
    source: str | None = None
    activation_bytes: float | None = None   # the activation bytes a position adds, counted on the graph

    @classmethod
    def from_dict(cls, node: reading.Node) -> PaddingPrice:
        return cls(node.number("seconds"), node.text("kind"), node.text("label"), node.number("flops"),
                   node.text("source"), node.number("activation_bytes"))


@dataclass(frozen=True)
class Target(reading.TargetPart):
    chosen: Chosen
    compile_seconds_per_bucket: float | None
    compile_seconds_per_bucket_source: str | None
    replay: tuple[ReplayRow, ...]
    compiles_after_warmup: int | None
    info: reading.TargetInfo

    @classmethod
    def from_dict(cls, t: reading.Node) -> Target:
        per_bucket = t.obj("compile_seconds_per_bucket")
        return cls(**cls.common(t), chosen=Chosen.from_dict(t.obj("chosen")),
                   compile_seconds_per_bucket=per_bucket.number("value"),
                   compile_seconds_per_bucket_source=per_bucket.text("source"),
                   replay=tuple(ReplayRow.from_dict(r) for r in t.objects("replay")),
                   compiles_after_warmup=t.integer("compiles_after_warmup"), info=reading.TargetInfo.from_dict(t))


@dataclass(frozen=True)
class Result(reading.StageFile):
    distribution_count: int | None             # requests in the distribution the plans were made over
    trace_source: str | None
    trace_max_length: int | None
    padding_price: dict[str, PaddingPrice]
    truncation: dict | None
    generation: dict[str, dict]                # workload "generate": per target, its serving plans
    serving: dict[str, tuple[list[int], list[int]]]   # per target, the auto serving plan's prompt and context buckets
    training: dict[str, list[dict]]            # workload "train": per target, packing against padding
    grid: dict[str, dict]                      # two varying dimensions: per target, the grid plan

    @classmethod
    def from_dict(cls, data: dict, path) -> Result:
        root = reading.Node(data, path, STAGE)
        trace = root.obj("trace")
        training = {k: [dict(r.value) for r in root.obj("training").objects(k)] for k in root.obj("training").value}
        return cls(**cls.common(root, Target.from_dict), distribution_count=root.obj("distribution").integer("count"),
                   trace_source=trace.text("source"), trace_max_length=trace.integer("max_length"),
                   padding_price={k: PaddingPrice.from_dict(root.obj("padding_price").obj(k))
                                  for k in root.records("padding_price")},
                   truncation=root.record("truncation"),
                   generation=root.obj("generation").records("targets"), serving=_serving(root), training=training,
                   grid=root.obj("grid").records("targets"))



def _serving(root: reading.Node) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt buckets, context buckets) of each target's auto serving plan (generation.targets[t].auto)."""
    found = {}
    for name, plan in root.obj("generation").entries("targets").items():
        auto = plan.at("auto") if isinstance(plan.value, dict) else None
        if auto is not None and isinstance(auto.value, dict):
            prompt, context = (reading.positive_ints(auto.obj(part), "boundaries") for part in ("prompt", "context"))
            for part, boundaries in (("prompt", prompt), ("context", context)):
                if boundaries is None:
                    auto.obj(part).at("boundaries").fail("a list of positive integers")
            found[name] = (prompt, context)
    return found
