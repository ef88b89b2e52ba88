"""Stage results: how they are written (stamped with their environment) and typed readers of the run folder.

Every stage result carries the environment that produced it, because a run folder can be reported on
another machine (`portkit report DIR` on a laptop, for a run made on a Trainium host) and the report must
describe the machine that ran the stages. `save_result` adds an "environment" key (environment.environment():
python, platform, torch build, packages, and per target its mode, reason, backend, precision and op table
source); the report reads it back with `run_environment`. Target modes make this module sit above targets
and environment; portkit.core.findings is re-exported here as results.Finding.

    >>> from portkit.runfolder import results
    >>> results.save_result("runs/minilm/fallbacks.json", report.to_dict())   # adds "environment"
    >>> env = results.run_environment({"fallbacks.json": data}, ["neuron", "tpu"])
    >>> env.info["targets"]["neuron"]["mode"], env.source, env.gaps
    >>> results.read_buckets("runs/minilm").chosen["tpu"].boundaries      # stage 3's plan, or None
    >>> results.fixed_shape("runs/minilm", "tpu")        # stage 2's {"batch": 1, "seq": 64}, or None

A stage reads an earlier stage's result only through a reader here (load, read_buckets, fixed_shape,
bucket_shapes), never by opening its JSON itself: each result has one typed reader (TYPED: fallbacks_result,
compile_result, buckets_result, xla_result, accuracy_result), which names what is wrong with a damaged file in
one line, with its key (UnreadableResult).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from portkit.models import meta_device
from portkit.planning import cost
from portkit.runfolder import (accuracy_result, buckets_result, compile_result, environment, fallbacks_result, reading,
                               xla_result)
from portkit.runfolder import layout
from portkit.targets import specs
from portkit.core.atomic_io import write_json
from portkit.core.errors import StageSkipped
from portkit.core.findings import ROOT, Finding  # noqa: F401 (re-exported: results.Finding, results.ROOT)

KEY = "environment"
REQUIRED = ("python", "platform", "torch_build", "packages", "targets")   # what environment.render reads
NOT_RECORDED = "environment not recorded; detected at report time"


def target_names(result: dict) -> list[str]:
    """The known targets a stage result covers: the keys of its "targets", or its single "target"."""
    names = list(result.get("targets") or {}) if isinstance(result.get("targets"), dict) else [result.get("target")]
    return [n for n in names if n in specs.TARGETS]


def stamp(result: dict) -> dict:
    """`result` with the environment of this process, for the targets it covers."""
    return {**result, KEY: environment.environment(target_names(result))}


SKIPPED = "skipped"    # a stage result's key: why the stage does not apply to the model (skip_stage)


def skip_stage(out_dir, stage: str, model: dict, targets, reason: str):
    """Save `stage`'s result as skipped, with the reason, and raise StageSkipped: the notebook stops there,
    the runner records the stage as skipped (not failed), the report shows the reason, and later stages
    read the stage as absent (read_stage)."""
    save_result(Path(out_dir) / result_file(stage), {"model": model, SKIPPED: reason, "summary": f"skipped: {reason}",
                                                     "targets": {name: {SKIPPED: reason} for name in targets}})
    raise StageSkipped(reason)


ABSTRACT = "abstract model: no weights"


def skip_if_abstract(model: str, out_dir, stage: str, targets) -> None:
    """A stage that runs the model on values (runfolder.Stage.needs_weights) has nothing to run for an abstract
    model (a real-size config without weights, portkit.models.meta_device): it is saved as skipped with the reason
    and stops (skip_stage). The runner skips such a stage without starting its notebook; a notebook run by
    hand stops here."""
    if meta_device.is_name(model) and layout.stage(stage).needs_weights:
        skip_stage(out_dir, stage, {"name": model, "abstract": True}, targets,
                   f"{ABSTRACT}: {model} is a published config on the meta device, so stage {stage} has no values "
                   "to run; stage 3b (xla) checks it")


def save_result(path, result: dict) -> Path:
    """Write a stage's result dict as JSON, atomically, stamped with the environment it ran in."""
    return write_json(path, stamp(result))


def recorded(result: dict) -> tuple[dict | None, str]:
    """(the environment a stage result recorded, ""), or (None, what is wrong with it)."""
    info = result.get(KEY)
    if info is None:
        return None, "environment not recorded"
    if not isinstance(info, dict):
        return None, f"environment is a {type(info).__name__}, not an object"
    missing = [k for k in REQUIRED if k not in info]
    if missing:
        return None, "environment lacks " + ", ".join(missing)
    if not isinstance(info["packages"], dict) or not isinstance(info["targets"], dict):
        return None, "environment's packages or targets is not an object"
    bad = [n for n, t in info["targets"].items() if not isinstance(t, dict) or not isinstance(t.get("mode"), str)]
    if bad:
        return None, "environment has no mode for target " + ", ".join(bad)
    return info, ""


@dataclass
class RunEnvironment:
    """The environment a run folder's stages recorded, merged; where it came from; what did not fit."""
    info: dict
    source: str
    gaps: list[str] = field(default_factory=list)


def run_environment(stage_results: dict[str, dict], names) -> RunEnvironment:
    """Merge the environments recorded by `stage_results` ({file name: result dict}).

    Stages that disagree (another platform, another package version, another mode for a target) are
    named as a gap. Only what no stage recorded is detected on this machine, and the source says so.
    """
    found, unrecorded, gaps = {}, [], []
    for file, result in stage_results.items():
        info, problem = recorded(result)
        if info is not None:
            found[file] = info
        elif KEY in result:
            gaps.append(f"{file}: {problem}")
        else:
            unrecorded.append(file)      # written before stages recorded their environment
    if not found:
        if unrecorded:
            gaps.append(f"{', '.join(unrecorded)}: {NOT_RECORDED}")
        info = environment.environment([n for n in names if n in specs.TARGETS])
        return RunEnvironment(info, NOT_RECORDED, gaps)
    first_file, first = next(iter(found.items()))
    if unrecorded:
        gaps.append(f"{', '.join(unrecorded)}: environment not recorded; the report uses the one in {first_file}")
    merged = {**{k: v for k, v in first.items() if k != "targets"}, "targets": {}}
    for file, info in found.items():
        theirs, ours = _flat(info), _flat(first)
        for key in [k for k in dict.fromkeys([*ours, *theirs]) if ours.get(k) != theirs.get(k)]:
            gaps.append(f"stage results disagree on the environment: {key} is {_short(ours.get(key))} in "
                        f"{first_file} but {_short(theirs.get(key))} in {file}")
        for name, t in info["targets"].items():
            seen = merged["targets"].setdefault(name, {**t, "recorded_in": file})
            for key in [k for k in t if k in seen and t[k] != seen[k]]:
                gaps.append(f"stage results disagree on target {name}: {key} is {_short(seen[key])} in "
                            f"{seen['recorded_in']} but {_short(t[key])} in {file}")
    missing = [n for n in names if n in specs.TARGETS and n not in merged["targets"]]
    if missing:
        detected = environment.environment(missing)["targets"]
        merged["targets"].update({n: {**t, "recorded_in": NOT_RECORDED} for n, t in detected.items()})
        gaps.append(f"target {', '.join(missing)}: {NOT_RECORDED}")
    return RunEnvironment(merged, "recorded at run time by " + ", ".join(found), gaps)


def _flat(info: dict) -> dict:
    """The machine-wide fields of an environment, one level of nesting spelled out ("packages.torch")."""
    flat = {}
    for key, value in info.items():
        if key != "targets":
            flat.update({f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    return flat


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- typed readers of the run folder
result_file = layout.result_file   # the run folder's layout has one owner


UnreadableResult = reading.UnreadableResult   # the one class, raised by every reader


@dataclass(frozen=True)
class ChosenBuckets:
    """Stage 3's chosen plan for one target."""
    planner: str
    boundaries: tuple[int, ...]              # ascending sequence lengths
    batch_sizes: tuple[int, ...] | None      # batch buckets; None: every call takes the whole batch


@dataclass(frozen=True)
class BucketsResult:
    """What later stages read of buckets.json: the chosen plan of each target that has one."""
    path: Path
    chosen: dict[str, ChosenBuckets]


def read_buckets(out_dir) -> BucketsResult | None:
    """Stage 3's chosen plans in `out_dir`: from its result (buckets.json), or where there is none yet, from
    the plans it writes before its replay (runfolder's early file, buckets.plan.json); None when neither is there.

    A target whose result has no chosen boundaries is left out of `chosen`. A file that is not JSON,
    not an object, or whose boundaries or batch sizes are not positive integers raises UnreadableResult
    (buckets_result reads both files)."""
    path, found = _buckets_so_far(out_dir)
    if found is None:
        return None
    chosen = {}
    for name in found.names:
        plan = found.target(name).chosen       # UnreadableResult where this target's part is damaged
        if plan.boundaries:
            chosen[name] = ChosenBuckets("?" if plan.planner is None else plan.planner, tuple(sorted(plan.boundaries)),
                                         tuple(plan.batch_sizes) if plan.batch_sizes else None)
    return BucketsResult(path, chosen)


def _buckets_so_far(out_dir):
    """(its path, stage 3's typed result): buckets.json, or where there is none yet, the plans stage 3 writes before
    its replay (buckets.plan.json: the chosen plans and a generation workload's serving plans, the same as
    buckets.json will hold); (None, None) when neither is there."""
    path = Path(out_dir) / result_file("buckets")
    if path.exists():
        return path, load(out_dir, "buckets")
    path = Path(out_dir) / layout.stage("buckets").early
    return (path, typed("buckets", _read_object(path, "buckets"), path)) if path.exists() else (None, None)


def read_stage(out_dir, stage: str) -> dict | None:
    """The result `stage` saved in `out_dir`, or None when there is none or the stage was skipped (it does
    not apply to the model: skip_stage). Its file is <stage>.json, the
    name the run folder's layout (runfolder) gives every stage's result. A file that is not a JSON object raises
    UnreadableResult naming the file."""
    path = Path(out_dir) / result_file(stage)
    if not path.exists():
        return None
    saved = _read_object(path, stage)
    return None if saved.get(SKIPPED) else saved


_read_object = reading.read_object

# each stage result's typed reader (its from_dict validates as it reads)
TYPED = {"fallbacks": fallbacks_result.Result, "compile": compile_result.Result, "buckets": buckets_result.Result,
         "xla": xla_result.Result, "accuracy": accuracy_result.Result}


def typed(stage: str, data: dict, path):
    """`data`, the result `stage` saved at `path`, read as its type (TYPED); UnreadableResult naming the damage."""
    return TYPED[stage].from_dict(data, Path(path))


def model_parameters(out_dir, stage: str) -> int | None:
    """The model's parameter count a stage's result in `out_dir` records ("model"."parameters"), None where it
    has none (no result, a skipped stage, no count)."""
    saved = read_stage(out_dir, stage)
    model = saved.get("model") if saved is not None else None
    found = model.get("parameters") if isinstance(model, dict) else None
    return found if reading.is_int(found) else None


def load(out_dir, stage: str):
    """The result `stage` saved in `out_dir` read as its type (fallbacks_result.Result, compile_result.Result,
    ...), or None when there is none or the stage was skipped; UnreadableResult naming the file, key and damage."""
    saved = read_stage(out_dir, stage)
    return None if saved is None else typed(stage, saved, Path(out_dir) / result_file(stage))


def wait_while_running(out_dir, stage: str, poll: float = 0.2) -> float:
    """Wait while `stage` runs in the `portkit run` that started this one beside it (a stage that reads it late:
    layout.Stage.reads_late): while its layout.running_marker is in `out_dir` and the run that wrote it lives.
    Returns the seconds waited; at once where no run holds the marker (a notebook run on its own, a run killed)."""
    marker, start = Path(out_dir) / layout.running_marker(stage), time.perf_counter()
    while True:
        try:
            os.kill(int(marker.read_text()), 0)       # signal 0: only whether the run's process lives
        except (OSError, ValueError):                 # no marker (the stage ended), a dead run, a damaged marker
            return time.perf_counter() - start
        time.sleep(poll)


def target_part(found, name: str, *, damaged_as_none: bool = False):
    """The typed part of target `name` in a stage's typed result `found` (load's); None where there is no result or
    it has no part for the target. A damaged part raises UnreadableResult, or is None with damaged_as_none (the
    report names the damage as a gap)."""
    if found is None:
        return None
    return found.targets.get(name) if damaged_as_none else found.target(name)


def fixed_shape(out_dir, target: str) -> dict | None:
    """Stage 2's fixed input shape for `target` (compile.json): {"batch": B, "seq": S}, seq None for an
    image model; None when stage 2 recorded none."""
    found = target_part(load(out_dir, "compile"), target)
    return None if found is None else found.fixed_shape


def bucket_shapes(out_dir, target: str) -> tuple[str, list[dict]] | None:
    """(planner, every input shape) of stage 3's chosen bucket plan for `target` (buckets.json, or its early plans
    while stage 3 replays); None when stage 3 chose none."""
    found = target_part(_buckets_so_far(out_dir)[1], target)
    if found is None or not found.chosen.shapes:
        return None
    return found.chosen.planner or "", [{"batch": batch, "seq": seq} for batch, seq in found.chosen.shapes]


def serving_buckets(out_dir, target: str) -> tuple[list[int], list[int]] | None:
    """(prompt buckets, context buckets) of stage 3's auto serving plan for `target` (buckets.json or its early
    plans, workload "generate"); None when stage 3 made none."""
    found = _buckets_so_far(out_dir)[1]
    return None if found is None else found.serving.get(target)


def compile_cost(out_dir, target: str) -> dict | None:
    """Stage 2's compile cost model for `target` (compile.json: targets[t].compile_cost, as
    economics.CostModel.to_dict writes it), or None when stage 2 recorded none. A model without a kind,
    a source or a numeric intercept raises UnreadableResult."""
    found = target_part(load(out_dir, "compile"), target)
    return None if found is None else found.compile_cost


def cost_figures(buckets, xla=None, accuracy=None, compiled=None) -> cost.Figures:
    """What the cost estimate (portkit.planning.cost) reads of a run: stage 3's typed result (buckets_result.Result),
    stage 3b's (xla_result.Result), stage 4's (accuracy_result.Result) and stage 2's (compile_result.Result: the tokens
    a request generates under workload generate), the last three None where absent."""
    plans = {name: cost.Plan(t.chosen.shapes, t.chosen.real_tokens, t.chosen.padded_tokens, t.chosen.padding_waste,
                             t.chosen.warmup_seconds, tuple(t.chosen.batch_sizes or ()))
             for name, t in buckets.targets.items()}
    prices = {name: cost.PaddingPrice(p.kind, p.seconds, p.flops, p.source or "", p.activation_bytes)
              for name, p in buckets.padding_price.items()}
    xla_compiled = {name: cost.Compiled(t.topology, tuple((s.label, s.flops, s.bytes_accessed) for s in t.shapes))
                    for name, t in (xla.targets.items() if xla is not None else ())}
    parameters = (buckets.model or {}).get("parameters")
    precision = ({name: t.precision for name, t in accuracy.targets.items() if t.precision}
                 if accuracy is not None else {})
    generated = next((t.generation.get("new_tokens") for t in (compiled.targets.values() if compiled else ())
                      if t.generation), None)
    return cost.Figures(buckets.distribution_count, plans, prices, xla_compiled,
                        float(parameters) if reading.is_number(parameters) else None, precision,
                        accuracy.gpu_numerics if accuracy is not None else None,
                        int(generated) if reading.is_number(generated) else None)


def run_cost_figures(run_dir) -> cost.Figures:
    """What the cost estimate reads of the run folder `run_dir` (cost_figures over its stage results); empty
    Figures where stage 3 left no result. The estimate itself is portkit.planning.cost's."""
    buckets = load(run_dir, "buckets")
    if buckets is None:
        return cost.Figures()
    return cost_figures(buckets, load(run_dir, "xla"), load(run_dir, "accuracy"), load(run_dir, "compile"))
