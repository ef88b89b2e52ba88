"""Stage 2's result (compile.json) as types: the graph breaks and graph contents per target, and per target its
recompile storm, fixed-shape check, compile time, and the generation and training workloads compiled.

    >>> from portkit.runfolder import results
    >>> found = results.load("runs/minilm", "compile")          # None where stage 2 has no result
    >>> found.target("tpu").storm.compile_count, found.graph_breaks["checks"]["tpu"]["graphs"]

Written by portkit.stages.compile; read here only, validated as it is read (portkit.runfolder.reading): a damaged
value raises UnreadableResult naming the file, the key and the damage.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.runfolder import reading

STAGE = "compile"


@dataclass(frozen=True)
class Storm:
    """The recompile storm over stage 2's own requests."""
    requests: int                    # requests it sent
    summary: str | None
    compile_count: int | None        # compiles, one per distinct shape
    counted: int | None              # of them, counted from Dynamo's guard failures rather than compiled here
    distinct_shapes: int | None

    @classmethod
    def from_dict(cls, node: reading.Node) -> Storm:
        # an older result named the count "compiles" (today a list of compile records)
        count = node.integer("compile_count") if node.has("compile_count") else (
            node.raw("compiles") if reading.is_int(node.raw("compiles")) else None)
        return cls(len(node.items("requests")), node.text("summary"), count, node.integer("counted"),
                   node.integer("distinct_shapes"))


@dataclass(frozen=True)
class CompileSeconds:
    """The compile time per shape on the target (median over stage 2's compiles) and where it comes from."""
    median: float | None
    count: int | None
    source: str | None

    @classmethod
    def from_dict(cls, node: reading.Node) -> CompileSeconds:
        return cls(node.number("median"), node.integer("count"), node.text("source"))


@dataclass(frozen=True)
class Target(reading.TargetPart):
    storm: Storm
    fixed_compiles_after: int | None     # compiles after warm-up at the fixed shape
    compile_seconds: CompileSeconds
    generation: dict | None              # workload "generate": dynamic against static KV cache
    training: dict | None                # workload "train": the training step compiled
    fixed_shape: dict | None             # the fixed input shape {"batch": B, "seq": S}, seq None for an image model
    compile_cost: dict | None            # the compile cost model (economics.CostModel.to_dict)

    @property
    def encoder_decoder_plan(self) -> tuple[list[int], list[int], bool] | None:
        """An encoder-decoder's static-cache plan stage 2 decoded with (workload generate): (source buckets, decoder
        contexts, whether the source is one fixed shape); None for another model, or where the static caches did
        not run."""
        found = self.generation if isinstance(self.generation, dict) else {}
        plan = found.get("plan")
        if not (found.get("static") and isinstance(plan, dict) and plan.get("encoder_decoder")):
            return None
        return list(plan["prompt_buckets"]), list(plan["context_buckets"]), bool(plan.get("fixed_source"))

    @classmethod
    def from_dict(cls, t: reading.Node) -> Target:
        shape = t.at("fixed_shape")
        fixed = None if shape.value is None else reading.shape(shape, shape.key)
        return cls(**cls.common(t), storm=Storm.from_dict(t.obj("storm")),
                   fixed_compiles_after=t.obj("fixed").integer("compiles_after"),
                   compile_seconds=CompileSeconds.from_dict(t.obj("compile_seconds")),
                   generation=t.record("generation"), training=t.record("training"),
                   fixed_shape=None if fixed is None else {"batch": fixed[0], "seq": fixed[1]},
                   compile_cost=_cost(t.at("compile_cost")))


def _cost(node: reading.Node) -> dict | None:
    """A compile cost model with its target, kind, source and numeric intercept; None where absent."""
    cost = node.value
    if cost is None:
        return None
    if not (isinstance(cost, dict) and isinstance(cost.get("kind"), str) and isinstance(cost.get("source"), str)
            and reading.is_number(cost.get("intercept")) and isinstance(cost.get("target"), str)):
        node.fail("a cost model (target, kind, source, intercept)")
    return dict(cost)


def _graph_breaks(node: reading.Node) -> dict:
    """compile.json's "graph_breaks", checked where portkit.stages.reconcile and the report read it: breaks a list
    of objects, fullgraph an object, checks an object of objects whose ops are an object."""
    breaks = [dict(b.value) for b in node.objects("breaks")]
    checks = node.entries("checks")
    for name, check in checks.items():
        if not isinstance(check.value, dict):
            check.fail("an object")
        check.obj("ops"), check.integer("graphs")
    return {**node.value, "breaks": breaks, "fullgraph": dict(node.obj("fullgraph").value),
            "checks": {name: dict(c.value) for name, c in checks.items()}}


@dataclass(frozen=True)
class Result(reading.StageFile):
    requests_source: str | None          # where stage 2's requests came from
    graph_breaks: dict

    @property
    def reconcilable(self) -> dict:
        """What portkit.stages.reconcile reads of stage 2 (its "graph_breaks"), checked."""
        return {"graph_breaks": self.graph_breaks}

    @classmethod
    def from_dict(cls, data: dict, path) -> Result:
        root = reading.Node(data, path, STAGE)
        return cls(**cls.common(root, Target.from_dict), requests_source=root.obj("requests").text("source"),
                   graph_breaks=_graph_breaks(root.obj("graph_breaks")))
