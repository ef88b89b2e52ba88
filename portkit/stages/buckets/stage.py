"""Stage 3, shape bucketing: fit sequence buckets to the real length distribution, choose how many
from the compile economics, and prove that nothing recompiles once every bucket is warm.

    >>> from portkit.corpora import corpus
    >>> from portkit.models import registry
    >>> from portkit.planning import economics
    >>> from portkit.stages.buckets import stage
    >>> m, texts = registry.load("minilm"), corpus.load_corpus()
    >>> opts = stage.Options.of({"bucket_count": 4})      # the notebook's parameters over its defaults, checked
    >>> hist = stage.histogram(stage.distribution(texts, m))   # the model's own tokenizer
    >>> costs = stage.stage_costs(m, hist, ["neuron", "tpu"], options=opts)   # measured XLA; Neuron's estimate
    >>> prices = economics.padding_prices(m, ["neuron", "tpu"], hist.top)   # a padded position on each target
    >>> print(stage.choose(hist, costs, prices, opts)["tpu"].why)   # k, warm-up vs padding, the budget
    >>> report = stage.fit_buckets(m, texts, ["neuron", "tpu"], opts, run_dir="runs/minilm")   # the whole stage
    >>> report.save("runs/minilm/buckets.json")    # targets[t]["chosen"]: planner, boundaries, shapes, why

Targets that compile one graph per input shape pay a compile per distinct length (pytorch/xla#2422: 27 compiles
in step 0). Per target, `auto` takes the bucket count whose warm-up compiles plus padded compute over
`serve_requests` cost least within the warm-up budget (planner.plan_auto; prices: portkit/planning/economics.py,
an estimate also planned at half and twice itself); then real requests are replayed per target (trace_replay.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path


from portkit.core import atomic_io
from portkit.core import checks
from portkit.stages.buckets import bucketed
from portkit.stages.buckets import trace_replay
from portkit.corpora.corpus import length_distribution, make_trace
from portkit.planning import economics
from portkit.stages.buckets import generation
from portkit.stages.buckets import grid_costs
from portkit.runfolder import results
from portkit.runfolder import layout
from portkit.stages.options import StageOptions, check_corpus
from portkit.targets import selection
from portkit.targets import specs
from portkit.core.errors import BadParameter
from portkit.planning.planner import (K_MAX, OVERFLOW, PLANNER_NAMES, PLANNERS, BucketPlan, Histogram, Prices,
                                      batch_buckets, compare, histogram, optimal_table, padded_tokens, plan_auto,
                                      plan_buckets, plan_linear, plan_optimal, plan_padding_bounded, plan_pow2, sweep)
from portkit.stages.buckets.plots import draw_buckets, padding_slider, plot_histogram, plot_padding  # noqa: F401
from portkit.stages.buckets.result import BucketReport, TargetBuckets, truncation, truncation_finding

__all__ = ["K_MAX", "OVERFLOW", "PLANNER_NAMES", "PLANNERS", "BucketPlan", "BucketReport", "Histogram", "Options",
           "Replay", "TargetBuckets", "batch_buckets", "choose", "compare", "distribution", "fit_buckets",
           "histogram", "optimal_table", "padded_tokens", "plan_auto", "plan_buckets", "plan_linear", "plan_optimal",
           "plan_padding_bounded", "plan_pow2", "replay_targets", "stage_costs", "sweep", "truncation",
           "truncation_finding"]

WHAT_IF = (0.5, 2.0)         # an estimated compile cost is also planned at half and twice itself


# ---------------------------------------------------------------- the stage's options
def _seconds_or_none(name: str, value):
    """None (no figure given), or a positive number of seconds, kept as given."""
    if value is not None:
        checks.positive_float(name, value)
    return value


class Options(StageOptions):
    """Stage 3's options: the parameters cell of notebooks/03_buckets.py, each field checked. With workload
    "generate" a built-in model is loaded to check it is a causal LM (other models: when the stage loads them).

    serve_requests is what the plan is priced for (the requests one warm-up serves: a deployment until its next
    restart), not the replay's length (`requests`): 10 million is about a day of a service at 116 requests a
    second. warmup_budget_seconds' 600 s is vLLM Neuron's default compilation timeout
    (VLLM_NEURON_COMPILATION_TIMEOUT). `backend` is checked against the targets by check_targets, where they
    are known (the runner's preflight, the notebook's validation cell, fit_buckets; replay_targets per target)."""
    NOTEBOOK = "03_buckets.ipynb"
    CHECKS = {"corpus": check_corpus, "text_column": checks.text, "bucket_count": checks.up_to(64),
              "max_batch": checks.up_to(1024), "requests": checks.up_to(checks.MAX_STEPS),
              "overflow": checks.one_of(OVERFLOW),
              "serve_requests": checks.up_to(checks.MAX_SERVED), "warmup_budget_seconds": _seconds_or_none,
              "neuron_compile_seconds": _seconds_or_none, "backend": checks.text, "seed": checks.seed,
              "workload": checks.one_of(checks.WORKLOADS), "new_tokens": checks.up_to(512)}

    def check(self, model: str | None) -> None:
        from portkit.workloads.generation import check_workload
        check_workload(self.workload, model)

    def check_targets(self, targets) -> None:
        """`backend` against every target the stage compiles for (selection.check_parameter)."""
        selection.check_parameter(self.backend, specs.parse_targets(targets))


@dataclass(frozen=True)
class Replay:
    """How replay_targets proves the plans: settings of the library call, not of the notebook."""
    check: bool = True                   # the padding check of every chosen plan's bucket shapes
    compare_every_target: bool = False   # the planners' comparison on every target's backend, not the first's
    compile_all: bool = False            # compile every compared run instead of counting its compiles
    progress: bool = True                # progress bars

    def __post_init__(self):
        for f in fields(self):
            checks.boolean(f.name, getattr(self, f.name))


# ---------------------------------------------------------------- the distribution
NOTHING_TO_BUCKET = ("takes one input shape: no dimension of its inputs but the batch varies with the data "
                     "(its declaration, portkit/models/inputs.py), so one compile and nothing to bucket")


def skip_unless_it_applies(model, out_dir, targets) -> None:
    """The stage's first step: a model whose inputs do not vary with the data has nothing to bucket, so the
    stage saves itself as skipped with the reason and stops (results.skip_stage raises StageSkipped)."""
    if model.seq_dim is None:
        results.skip_stage(out_dir, "buckets", model.describe(), specs.parse_targets(targets),
                           f"{model.name} {NOTHING_TO_BUCKET}")


def distribution(corpus, model):
    """Each item's length along the model's varying dimension (tokens under its own tokenizer for text;
    length_distribution), with a clear error for a model that takes one input shape."""
    if model.seq_dim is None:
        raise BadParameter("model for shape bucketing", model.name, hint=f"{model.name} {NOTHING_TO_BUCKET}")
    return length_distribution(corpus, model)


# ---------------------------------------------------------------- costs a plan is priced with
def stage_costs(model, hist: Histogram, targets, out_dir=None,
                options: Options | None = None) -> dict[str, economics.CostModel]:
    """Per target, what one bucket's compile costs (economics.cost_model) at options.max_batch: TPU measured
    by XLA over the histogram's lengths, the Neuron estimate (or options.neuron_compile_seconds); natively, and
    for a reference target, the compile times stage 2 measured (compile.json in out_dir, results.compile_cost)."""
    options = options or Options.defaults()
    out = {}
    for name in specs.parse_targets(targets):
        detected = specs.detect(name)
        if economics.priced_by_measured_compiles(name, detected.native):
            saved = results.compile_cost(out_dir, name) if out_dir is not None else None
            if saved is None:
                raise BadParameter(f"compile cost for {name} ({detected.mode})", "no compile.json in out_dir",
                                   hint="run stage compile first: it measures the compiler's own times")
            out[name] = economics.CostModel.from_dict(saved)
        else:
            out[name] = economics.cost_model(model, name, hist.values.tolist(), batch=options.max_batch,
                                             neuron_compile_seconds=options.neuron_compile_seconds)
    return out


def reads(targets) -> tuple[str, ...]:
    """The earlier stages whose results this stage reads for these targets (runfolder.Stage.reads): stage 2's
    compile times where a target's cost comes from them, else none (the runner may run it beside stage 2)."""
    names = specs.parse_targets(targets)
    return ("compile",) if any(economics.priced_by_measured_compiles(n, specs.detect(n).native)
                               for n in names) else ()


def grid(model, corpus, targets, costs: dict[str, economics.CostModel], options: Options | None = None):
    """A model with two varying dimensions: per target, the least-cost grid of buckets on both against the
    best one-dimensional plan for options.serve_requests, with the prices measured for the model
    (grid_costs.compare); None otherwise."""
    if not grid_costs.applies(model):
        return None
    return grid_costs.compare(model, corpus, targets, costs, (options or Options.defaults()).serve_requests)


def serving_plans(model, corpus, costs, token_seconds, options: Options | None = None):
    """Workload "generate": prefill and decode buckets per target for options.new_tokens, serve_requests and
    max_batch, auto against pow2 (generation.fit); for an encoder-decoder, source buckets over the corpus's source
    lengths (the stage's own histogram) and one decoder context. Any other workload: None (no serving plans)."""
    from portkit.workloads import encoder_decoder
    options = options or Options.defaults()
    if options.workload != "generate":
        return None
    if encoder_decoder.is_encoder_decoder(model):
        return generation.fit_sources(histogram(distribution(corpus, model), None, options.overflow), costs,
                                      token_seconds, options.new_tokens, options.serve_requests, options.max_batch)
    return generation.fit(model, corpus, costs, token_seconds, options.new_tokens, options.serve_requests,
                          options.max_batch)


def training_layouts(model, corpus, chosen: dict[str, BucketPlan], batch_size: int = 8, seq_len: int = 128):
    """Workload "train": per target, packed rows against padding to seq_len and to its chosen buckets:
    compiles, real tokens per step and fill: {target: training.layouts rows}."""
    from portkit.workloads import training
    return {n: training.layouts(model, corpus, plan.boundaries, batch_size, seq_len) for n, plan in chosen.items()}


def choose(hist: Histogram, costs: dict[str, economics.CostModel], token_seconds, options: Options | None = None,
           quiet: bool = False) -> dict[str, BucketPlan]:
    """The auto plan for every target, each priced with that target's own cost model, for
    options.serve_requests requests within options.warmup_budget_seconds, at batch sizes up to
    options.max_batch. token_seconds: {target: economics.TokenPrice} (economics.padding_prices) or one
    figure for all. The one place a plan is chosen: fit_buckets and the notebook call it alike."""
    options = options or Options.defaults()
    max_batch = options.max_batch
    chosen = {}
    for name, cost in costs.items():
        price = economics.price_of(token_seconds, name)
        prices = Prices(cost.seconds, float(price), cost.label(), economics.price_source(price))
        chosen[name] = plan_buckets(hist, "auto", prices=prices, requests=options.serve_requests,
                                    max_batch=max_batch, budget_seconds=options.warmup_budget_seconds)
        if not quiet:
            print(f"target {name}: using buckets {list(chosen[name].boundaries)}"
                  f"{'' if max_batch == 1 else f' x batch {list(chosen[name].batch_sizes)}'}: {chosen[name].why}")
    return chosen


def what_if(hist: Histogram, costs: dict[str, economics.CostModel], token_seconds,
            options: Options | None = None) -> dict[str, dict[float, BucketPlan]]:
    """For each target whose compile cost is an estimate: the auto plan (choose) at WHAT_IF times the estimate."""
    options = options or Options.defaults()
    out = {}
    for name, cost in costs.items():
        if cost.kind == economics.ESTIMATE:
            out[name] = {f: choose(hist, {name: cost.scaled(f)}, token_seconds, options, quiet=True)[name]
                         for f in WHAT_IF}
    return out


# ---------------------------------------------------------------- the stage's verbs
def replay_targets(model, trace, plans: list[BucketPlan], chosen: dict[str, BucketPlan],
                   costs: dict[str, economics.CostModel], options: Options | None = None, *,
                   what_ifs: dict | None = None, replay: Replay | None = None) -> dict[str, TargetBuckets]:
    """Replay the trace per target with its compile backend (options.backend, selection.check_backend; an
    emulated one checks and emulates each graph, no codegen). The first target's backend replays without
    buckets and with every plan; each target replays its own chosen plan (warm-up, then recompiles forbidden,
    then the padding check). replay.compare_every_target repeats the whole comparison on every target's
    backend. The replay without buckets counts its compiles (one per distinct shape; stage 2 compiled that
    storm) and the compared plans count theirs (one per bucket shape): only the chosen plans are compiled,
    replayed under fail_on_recompile and padding-checked, unless replay.compile_all compiles every run."""
    options, replay = options or Options.defaults(), replay or Replay()
    out, done = {}, {}     # done: backend -> its runs so far, reused by any plan with the same shapes
    proven = {_shapes(p) for p in chosen.values()}   # never only counted
    for i, name in enumerate(chosen):
        detected = specs.detect(name)
        be = selection.check_backend(detected, options.backend)
        compare = i == 0 or replay.compare_every_target
        runs = done.setdefault(be, [])
        wanted = [*plans, chosen[name]] if compare else [chosen[name]]
        missing = [p for p in wanted if _same_shapes(runs, p) is None]
        baseline = compare and not any(r.plan is None for r in runs)
        if missing or baseline:
            counted = () if replay.compile_all else tuple(p for p in missing if _shapes(p) not in proven)
            runs += trace_replay.replay(model, trace, missing, be, _settings(replay, detected, baseline, counted))
        out[name] = TargetBuckets(detected.to_dict(), be, chosen[name], costs[name], _runs_for(runs, wanted, compare),
                                  (what_ifs or {}).get(name, {}))
        if any(r.padding_ok is False for r in out[name].runs):
            out[name].mask_read = bucketed.mask_is_read(model, trace)
    return out


def _settings(replay: Replay, detected, baseline: bool, counted: tuple) -> trace_replay.ReplaySettings:
    """The stage's settings of one trace_replay.replay on a target: the baseline counted (never compiled) unless
    replay.compile_all, the plans in `counted` counted, on the target's device natively, no Inductor code."""
    return trace_replay.ReplaySettings(baseline=baseline, check=replay.check, progress=replay.progress,
                                   device=detected.target.device if detected.native else "cpu", inductor=False,
                                   count_baseline=not replay.compile_all, count=counted)


def _runs_for(runs, wanted: list[BucketPlan], compare: bool) -> list:
    """A target's runs: the baseline where it compares, then each wanted plan's run (a plan whose shapes an
    earlier plan already replayed shares that run, renamed)."""
    mine = [r for r in runs if r.plan is None] if compare else []
    for plan in wanted:
        run = _same_shapes(runs, plan)
        if run.plan != plan.to_dict():
            run = replace(run, name=plan.planner, plan=plan.to_dict(),
                          note=f"same shapes as {run.name}: replayed once")
        mine.append(run)
    return mine


def _shapes(plan: BucketPlan) -> tuple:
    return tuple(plan.boundaries), tuple(plan.batch_sizes)


def _same_shapes(runs, plan: BucketPlan):
    """The first run that compiled exactly this plan's shapes."""
    return next((r for r in runs if r.plan is not None and r.plan["boundaries"] == list(plan.boundaries)
                 and r.plan["batch_sizes"] == list(plan.batch_sizes)), None)


def save_plans(chosen: dict[str, BucketPlan], out_dir, served=None) -> Path:
    """Write the chosen plans, and a generation workload's serving plans (`served`, serving_plans), to the stage's
    early file (runfolder: buckets.plan.json) before the replay: a run starts stage 4 and stage 3b, which need only
    these, while the replay still runs. buckets.json, written at the end, holds the same plans with the replay's
    proof; portkit.runfolder.results reads it first."""
    path = Path(out_dir) / layout.stage("buckets").early
    atomic_io.write_json(path, {"targets": {name: {"chosen": plan.to_dict()} for name, plan in chosen.items()},
                                "generation": served.to_dict() if served is not None else None})
    return path


def fit_buckets(model, corpus, targets=("neuron", "tpu"), options: Options | None = None, *, run_dir,
                max_seq: int | None = None, costs: dict[str, economics.CostModel] | None = None,
                replay: Replay | None = None) -> BucketReport:
    """The whole stage in one call (the notebook walks the same steps one by one, with the same calls).
    options: the notebook's parameters (None: its defaults). The chosen plan is priced for
    options.serve_requests requests; options.requests only sets the replay's length. run_dir: the run folder
    (stage 2's measured compiles are read from it; the chosen plans are written to it before the replay).
    max_seq caps the lengths (histogram; None: the model's). `costs` (per target) replaces stage_costs' cost
    models. replay: Replay (None: its defaults)."""
    out_dir = run_dir
    options = options or Options.defaults()
    names = specs.parse_targets(targets)
    options.check_targets(names)
    dist = distribution(corpus, model)
    hist = histogram(dist, max_seq, options.overflow)
    plans, curves = compare(hist, options.bucket_count, options.max_batch), sweep(hist)
    token_seconds = economics.padding_prices(model, names, hist.top)
    trace = make_trace(corpus, model, options.requests, options.seed, options.max_batch, dist)
    costs = costs or stage_costs(model, hist, names, out_dir, options)
    costs = {n: costs[n] for n in names}    # the targets' order: the first one's backend runs the comparison
    chosen = choose(hist, costs, token_seconds, options)
    served = serving_plans(model, corpus, costs, token_seconds, options)
    save_plans(chosen, out_dir, served)
    alternatives = what_if(hist, costs, token_seconds, options)
    per_target = replay_targets(model, trace, plans, chosen, costs, options, what_ifs=alternatives, replay=replay)
    found = grid(model, corpus, names, costs, options)
    return BucketReport(model.describe(), dist.to_dict(), hist, options.bucket_count, plans, curves, token_seconds,
                        trace.describe(), per_target, found.to_dict() if found else None,
                        generation=served.to_dict() if served is not None else None, truncation=truncation(dist, hist))
