"""What each stage's result adds to a target's report (portkit/stages/report/stage.py): its metrics, the kernels to
write, the rewrites, the bucket and precision checklists, and the detail tables. One section per stage, each
taking the stage's typed result (portkit.runfolder: fallbacks_result, compile_result, buckets_result, xla_result,
accuracy_result), the target's typed part of it and the TargetReport it fills.

    >>> from portkit.stages.report import sections
    >>> sections.READERS["compile"](compiled, compiled.target("tpu"), target_report)
"""
from __future__ import annotations

import re

from portkit.stages.report import realsize
from portkit.targets import specs
from portkit.targets.tolerance import FLOAT32_ON_CPU
from portkit.workloads import decoding
from portkit.core import figures, grading
from portkit.core.findings import INFO

STAGE_FALLBACKS = "fallbacks"
LAYER_ROWS = 5   # modules with the largest error shown per target, after the first one out of tolerance
REWRITE_KINDS = ("float64", "recurrent", "data_dependent", "host_sync", "sparse", "nested", "custom_op",
                 "int64_overflow", "attention_mask")


def _fallbacks(data, t, out) -> None:
    counts, share = t.counts, t.time_share
    out.metrics["fallbacks"] = {
        "distinct ops": sum(counts.values()),
        "native / composite": f"{counts.get('native', 0)} / {counts.get('composite', 0)}",
        "CPU fallback ops (time share)": f"{counts.get('cpu_fallback', 0)} ({share.get('cpu_fallback', 0):.1%})",
        # the op table's status; what cannot run is counted by the findings (blockers), as stage 1's summary says
        "ops with no kernel in the op table": counts.get("unsupported", 0),
    }
    language = specs.get(out.name).kernel_language if out.name in specs.TARGETS else "a kernel"
    for op in t.ops:
        if op.status in ("cpu_fallback", "unsupported") and op.op not in out.vanished_ops:
            # name the op the device runs (the CPU recording may show its CPU-only twin)
            name = op.via if op.via else op.op
            out.kernels.append({"op": name, "recorded_as": op.op, "status": op.status, "time_share": op.time_share,
                                "calls": op.calls, "modules": list(op.modules[:3]), "language": language})
    for f in out.findings:   # reconciled: what vanishes under compile is no rewrite
        if f["stage"] == STAGE_FALLBACKS and f["kind"] in REWRITE_KINDS and f["severity"] != INFO:
            out.rewrite.append(f"{f['message']}: {f['advice']}")


def _or(value, default):
    """`value`, or `default` where the result did not record it."""
    return default if value is None else value


def _storm(data, storm) -> str:
    """Stage 2's storm: its compiles, one per distinct shape among its own requests (compile.json's "requests":
    not stage 3's), or why there is none (a storm that failed before its first request counts nothing)."""
    asked = storm.requests
    if not asked:
        return f"none measured: {storm.summary or 'the storm ran no request'}"
    counted = f"; {storm.counted} counted from Dynamo's guard failures" if storm.counted else ""
    source = data.requests_source
    return (f"{_compiles(_or(storm.compile_count, '?'))}: one per distinct shape "
            f"({_or(storm.distinct_shapes, '?')}) among stage 2's {asked} requests"
            f"{f' ({source})' if source else ''}{counted}")


def _compile(data, t, out) -> None:
    breaks = data.graph_breaks
    seconds = t.compile_seconds
    median = seconds.median
    out.metrics["compile"] = {
        "graph breaks": len(breaks.get("breaks", [])),
        "fullgraph=True": "captures the model" if breaks.get("fullgraph", {}).get("ok") else "fails",
        "compiles without buckets (stage 2's requests)": _storm(data, t.storm),
        "compile per shape on the target": (f"{median:.1f} s (median over stage 2's {_or(seconds.count, '?')} "
                                            f"compiles; {seconds.source or 'CPU Inductor'})"
                                            if median else "—"),
        "compiles after warm-up, fixed shape": _or(t.fixed_compiles_after, "—"),
    }
    if gen := t.generation:       # workload "generate": the dynamic KV cache against the static one
        d, s, plan, refused = gen["dynamic"], gen["static"], gen["plan"], gen["refused"]
        eager = f", eager from token {d['eager_from_step'] + 1}" if d and d.get("eager_from_step") is not None else ""
        out.metrics["compile"]["generation, dynamic cache"] = (
            f"refused: {refused['dynamic']['text']}" if d is None else
            f"{d['compiles']} compiles for {gen['new_tokens']} tokens ({d['compiles_per_token']:.2f} per token){eager}")
        agree = gen.get("token_agreement")
        out.metrics["compile"]["generation, static cache"] = (
            f"refused: {refused['static']['text']}" if s is None else
            f"prompt buckets {plan['prompt_buckets']}, context buckets {plan['context_buckets']}: "
            f"{s['warmup_compiles']} warm-up compiles, {s['compiles']} after"
            + (f"; tokens agree {agree:.0%}" if agree is not None else ""))
    if tr := t.training:         # workload "train": the training step compiled
        out.metrics["compile"]["training step"] = (
            f"refused: {tr['refused']['message']}" if tr.get("refused") else
            f"{tr['joint_graphs']} graph(s) ({tr['graphs'].get('forward', 0)} forward, "
            f"{tr['graphs'].get('backward', 0)} backward), {len(tr['not_lowered'])} op(s) not lowered, "
            f"{len(tr['late'])} compile(s) after the first of {tr['steps']} steps")


def _xla(data, t, out) -> None:
    realsize.read(t, out)       # an abstract model's real-size check, when there is one
    if t.skipped:
        out.metrics["xla"] = {"XLA check": f"skipped: {t.reason or ''}"}
        return
    shapes = t.shapes
    peak = max((s.memory_total for s in shapes if s.memory_total is not None), default=None)
    flops = max((s.flops for s in shapes if s.flops), default=None)
    out.metrics["xla"] = {
        "XLA check": (f"real compile for {t.topology} (no TPU needed)" if t.check == "compile"
                      else "StableHLO lowering only"),
        "shapes passing": _xla_shapes(shapes, out.buckets),
        "peak HBM per device": f"{peak / 2 ** 20:.3g} MiB of {t.hbm_bytes_per_device / 2 ** 30:.0f} GiB"
                               if peak and t.hbm_bytes_per_device else "—",
        "GFLOP, largest shape": f"{flops / 1e9:.3g}" if flops else "—",
    }
    out.details["xla shapes"] = [
        {"shape": s.label, "status": s.status,
         "HBM MiB": round(s.memory_total / 2 ** 20, 1) if s.memory_total is not None else None,
         "fits HBM": s.fits_hbm, "GFLOP": round(s.flops / 1e9, 2) if s.flops else None,
         "compile s": round(s.compile_seconds, 2) if s.compile_seconds else None,
         "problem": s.message or ""} for s in shapes]
    served = t.serving
    if served:      # workload "generate": prefill and decode compiled by XLA with the KV cache in HBM
        out.metrics["xla"]["serving graphs (XLA)"] = served.get("summary", served.get("status", "?"))
    step = t.training_step
    if step:        # workload "train": the whole step compiled by XLA, its memory in parts
        out.metrics["xla"]["training step (XLA)"] = step.get("summary", step.get("status", "?"))
    for m in t.measured_throughput:       # native mode: measured on the device, not estimated
        out.metrics["xla"][f"{m['unit']}/s per chip at {m['shape']}"] = f"{m['per_second']:,.0f} ({m['label']})"


_SEQ = re.compile(r"\bseq=(\d+)")


def _xla_shapes(shapes, plan: dict | None) -> str:
    """Stage 3b's shapes that passed, by sequence length, and the chosen plan's buckets it did not compile (a
    bucket the XLA check never saw is unchecked, and says so)."""
    ok = sum(s.ok for s in shapes)
    seqs = [int(m.group(1)) for s in shapes if (m := _SEQ.search(str(s.label or "")))]
    text = f"{ok}/{len(shapes)}" + (f" (seq {', '.join(map(str, seqs))})" if len(seqs) == len(shapes) > 0 else "")
    boundaries = (plan["boundaries"] if plan else None) or []
    missed = [b for b in boundaries if b not in seqs]
    if seqs and missed:
        text += (f"; {len(missed)} of stage 3's {len(boundaries)} buckets not checked by XLA "
                 f"(seq {', '.join(map(str, missed))})")
    return text


def _replay(row, data, name: str) -> str:
    """One row of stage 3's replay: its compiles over stage 3's own requests (buckets.json's "trace", not stage
    2's), and what they cost on the target (target_compile_seconds, priced by stage 3)."""
    if row.failure:      # stopped: nothing it was to count is known
        return f"not assessed: {row.note or 'the run could not be measured'}"
    priced = row.target_compile_seconds
    cost = f"; {priced:,.0f} s compiling on {name}" if priced is not None else ""
    what = "one per distinct length among" if row.plan is None else "one per bucket shape, for"
    return (f"{_compiles(_or(row.compiles, '?'))} ({_or(row.compiles_after_warmup, 0)} after warm-up): {what} "
            f"stage 3's {_or(row.requests, '?')} requests ({_or(data.trace_source, '?')}, longest "
            f"{_or(data.trace_max_length, '?')}){cost}")


def _compiles(n) -> str:
    return f"{n} compile" + ("" if n == 1 else "s")


def _truncation(cut: dict) -> str:
    """Stage 3's truncation figures (buckets.json's "truncation"), as its finding states them."""
    if not cut.get("over"):
        return f"none of {cut.get('items', 0):,} longer than {cut.get('limit')}"
    verb = "cut" if cut.get("overflow") == "truncate" else "rejected"
    return (f"{cut['over']:,} of {cut['items']:,} ({cut['over_share']:.1%}) {verb} at {cut['limit']}; "
            f"{cut['lost_share_of_over']:.1%} of their {cut.get('unit', 'tokens')} lost")


def _buckets(data, t, out) -> None:
    chosen = t.chosen
    out.buckets = {"planner": chosen.planner, "boundaries": chosen.boundaries, "batch_sizes": chosen.batch_sizes,
                   "why": chosen.why}
    waste = chosen.padding_waste
    per_bucket = t.compile_seconds_per_bucket
    out.metrics["buckets"] = {
        "bucket plan": f"{_or(chosen.planner, '?')} {_or(chosen.boundaries, [])}",
        "padding waste (planned)": f"{waste:.1%}" if waste is not None else "—",
        "compile per bucket on the target": (f"{per_bucket:.1f} s (stage 3, over the corpus's lengths; "
                                             f"{_or(t.compile_seconds_per_bucket_source, '?')})"
                                             if per_bucket is not None else "—"),
    }
    if data.truncation:
        out.metrics["buckets"]["longer than the largest bucket"] = _truncation(data.truncation)
    price = data.padding_price.get(out.name)
    # what the plan charged a padded position on this target, and where that came from
    if price is not None and (price.label is not None or price.seconds is not None):
        out.metrics["buckets"]["padded position priced at"] = price.label or f"{price.seconds:.2e} s"
    for row in t.replay:
        if row.plan is None or row.plan_boundaries == chosen.boundaries:
            label = ("replay without buckets (stage 3's requests, not stage 2's)" if row.plan is None
                     else "replay with the chosen plan")
            out.metrics["buckets"].setdefault(label, _replay(row, data, out.name))
    served = data.generation.get(out.name)
    first, second = decoding.SERVING_LABELS[(served or {}).get("kind", decoding.CAUSAL)]
    for plan in ("auto", "pow2") if served else ():     # workload "generate": prefill and decode buckets
        p = served[plan]
        out.metrics["buckets"][f"generation buckets ({plan})"] = (
            f"{first} {p['prompt']['boundaries']}, {second} {p['context']['boundaries']}: {p['compiles']} warm-up "
            f"compiles, {p['warmup_seconds']:,.0f} s; padding {p['prompt']['padding_waste']:.1%} / "
            f"{p['context']['padding_waste']:.1%}")
    for row in data.training.get(out.name, []):      # workload "train": packing vs padding
        out.metrics["buckets"][f"training, {row['layout']}"] = (
            f"{row['compiles']} compile(s), {row['tokens_per_step']:.0f} real tokens per step, fill {row['fill']:.0%}")
    found = data.grid.get(out.name)
    if found:     # two varying dimensions: the grid against the best one-dimensional plan
        g, one = found["grid"], found["one_dimensional"]
        out.metrics["buckets"][f"grid plan ({' x '.join(g['dims'])})"] = (
            f"{' x '.join(str(b) for b in g['boundaries'])}: {g['compiles']} cells, {g['padding_waste']:.1%} padding, "
            f"{g['total_seconds']:,.0f} s for {g['requests']:,} requests; best one-dimensional ({one['family']}) "
            f"{one['total_seconds']:,.0f} s; ratio {found['ratio']:.3f} (cell compile: {found['compile']})")


def resolve_storm(findings: list[dict], buckets) -> None:
    """Stage 2's recompile storm against stage 3's replay with the chosen plan, where the report has both: a plan
    that compiled nothing after warm-up resolves the storm (the finding says by which plan, at what warm-up, and
    is info: no longer work); one that still compiled after warm-up leaves it work and says so. `buckets`: the
    target's typed part of buckets.json (buckets_result.Target), None where there is none."""
    if buckets is None:
        return
    chosen = buckets.chosen
    # a replay without a plan has no boundaries, like a plan that chose none
    row = next((r for r in buckets.replay if r.plan_boundaries == chosen.boundaries), None)
    storms = [f for f in findings if f["stage"] == "compile" and f["kind"] == "recompile_storm"]
    after = (row.compiles_after_warmup if row else None) or 0
    if row is None or not storms or row.compiles is None:
        return
    plan = (f"stage 3's plan {chosen.planner} {chosen.boundaries}: {_compiles(row.compiles - after)} "
            f"in warm-up, {after} after (its replay of {_or(row.requests, '?')} requests)")
    for f in storms:
        if after:
            f["message"] += f"; not resolved by {plan}"
            continue
        f["resolved_by"] = plan
        f["message"] += f"; resolved by {plan}; serve it with `portkit export RUN --to pytorch|vllm|nxdi`"
        f["severity"] = grading.severity("recompile_storm", grading.RESOLVED)
        f["consequence"] = "resolved: the bucket plan pads every request to a shape compiled in warm-up"


def _accuracy_check(c: dict) -> str:
    """One task check with the sample it was decided on (accuracy.json's n, unit and ci95) and its decision."""
    bound = c.get("bound")
    ci = f" [{figures.share(c['ci95'][0], bound)}, {figures.share(c['ci95'][1], bound)}]" if c.get("ci95") else ""
    n = f" on {c['n']:,} {c.get('unit') or 'items'}" if isinstance(c.get("n"), int) else ""
    decision = c.get("decision") or ("pass" if c.get("passed") else "fail")
    said = {"pass": "within", "fail": "OUT OF BUDGET", "inconclusive": "INCONCLUSIVE (the interval straddles it)"}
    return f"{figures.share(c['value'], bound)}{ci}{n} ({c['budget']}): {said.get(decision, decision)}"


def _stream_row(st: dict) -> str:
    """A target's stream run in one cell: its verdict, its state's error at the end and at its first step, the drift
    (over the chunks with sound: trailing silence left out) and the compiles after warm-up."""
    level = next((c for c in st.get("checks") or () if c.get("metric") == "state_error" and c.get("bound")), None)
    first = (f", one step {level['value']:.2g} at the start ({'within' if level['passed'] else 'beyond'} "
             f"{level['bound']:.2g})" if level else "")
    silence = f" ({st['trailing_silence']} chunks of trailing silence left out)" if st.get("trailing_silence") else ""
    return (f"{'PASS' if st['passed'] else 'FAIL'}: error vs float64 {st['state_error_last']:.2g} at the end{first}, "
            f"growth {st['drift_growth']:.2f}x{silence}, {st['late_compiles']} compiles after warm-up")


def _accuracy_metrics(data, t, out, main) -> dict:
    """Stage 4's metrics of one target: the precision, the verdict's basis, the errors and the task checks."""
    task = t.task
    gen = data.generation.get(out.name)
    st = next((r for r in data.stream_runs if r["target"] == out.name), None)
    return {
        "precision": (t.precision or {}).get("setting", "—"),
        "verdict (task metrics)": t.basis or _or(t.verdict, "—"),
        f"max abs error ({main[0]})" if main else "max abs error": _max_abs(main, out.mode),
        "task metric": _or(task.metric, "—"),
        **{f"task: {c['label']}": _accuracy_check(c) for c in task.checks},
        "task sample": _or(task.sample_text, "the main batch"),
        "buckets passing": f"{sum(bool(b.passed) for b in t.buckets)}/{len(t.buckets)}",
        **({"generation (greedy tokens)": f"{'PASS' if gen['passed'] else 'FAIL'}: agree {gen['agreement']:.1%}, "
            f"{gen['judged_agreement']:.1%} with near-ties apart"} if gen else {}),
        **({"state over a stream": _stream_row(st)} if st else {}),
        "judged on": _or(t.target_side, "—"),
    }


SAME_KERNELS = ("emulated at float32, the target side ran the same CPU kernels as the side it is compared with, "
                "so this compares nothing about the hardware: measure on the device")


def _max_abs(main, mode: str) -> str:
    """The main output's max abs error against the reference; an emulated 0 says what it is (SAME_KERNELS), never a
    figure that reads like a hardware result."""
    found = _g(main[1].get("max_abs")) if main else None
    if found is None:
        return "—"
    return f"0: {SAME_KERNELS}" if mode == "emulated" and main[1].get("max_abs") == 0 else found


def _versus_gpu(baseline: dict, mode: str) -> str:
    """The target's error against today's GPU's, both against the same truth; an emulated target whose error is
    the GPU's own, exactly, ran the GPU side's kernels (SAME_KERNELS)."""
    if mode == "emulated" and baseline.get("target_error") is not None \
            and baseline.get("target_error") == baseline.get("gpu_error"):
        return (f"the same error as GPU '{baseline['gpu_numerics']}' against {baseline['truth']}, exactly: "
                f"{SAME_KERNELS}")
    ratio = f"{baseline['ratio']:.3g}x" if baseline.get("ratio") is not None else "more than (it has none)"
    # it decides only within its factor (a PASS whatever the task metrics); beyond it the task metrics decide
    own = f"{baseline['gpu_error']:.1g}" if baseline.get("gpu_error") else "none"
    cpu = f", the target side {FLOAT32_ON_CPU}" if baseline.get("float32_on_cpu") else ""
    return (f"{ratio} the error of GPU '{baseline['gpu_numerics']}' ({baseline.get('measured', 'emulated on the CPU')})"
            f" against {baseline['truth']}{cpu}: " +
            (f"within {baseline['factor']:g}x, no regression: this decides (PASS)" if baseline.get("within") else
             f"beyond {baseline['factor']:g}x, so it does not decide (the task metrics do); the GPU's own error is "
             f"{own}, so a large ratio to it is no regression by itself"))


def _accuracy(data, t, out) -> None:
    precision = t.precision or {}
    out.precision = {"name": precision.get("name"), "setting": precision.get("setting"), "verdict": t.verdict,
                     "suggestions": list(t.suggestions), "basis": t.basis, "reasons": list(t.reasons)}
    main = next(iter(t.outputs.items()), None)
    out.metrics["accuracy"] = _accuracy_metrics(data, t, out, main)
    if t.baseline:
        out.metrics["accuracy"]["error vs today's GPU"] = _versus_gpu(t.baseline, out.mode)
    for cause in t.error_by_cause:   # float64 run as float32, then the precision's rounding
        found = cause.outputs.get(main[0]) if main else None
        if found:
            out.metrics["accuracy"][f"max abs error from {cause.cause}"] = _g(found.get("max_abs", 0)) or "—"
    detail = "element-wise assert_close (detail, does not decide)"
    out.details["accuracy outputs"] = [{(detail if k == "passed" else k): v
                                        for k, v in _error_row({"output": name}, o).items()}
                                       for name, o in t.outputs.items()]
    out.details["accuracy buckets"] = [
        _error_row({"bucket": b.boundary, "texts": b.texts,
                    "padding": f"{b.padding:.0%}" if b.padding is not None else None,
                    "output": b.primary}, b.outputs.get(b.primary, {}), passed=b.passed) for b in t.buckets]
    out.details["accuracy layers"] = [{("within tolerance (detail, does not decide)" if k == "passed" else k): v
                                       for k, v in row.items()} for row in _layer_rows(t.layer_modules,
                                                                                       t.first_failing)]
    training = data.training.get(out.name)
    if training is not None:
        out.training = {k: training[k] for k in ("verdict", "precision", "numerics", "blockers", "work", "advice")}


def _layer_rows(layers, first: str | None) -> list[dict]:
    """The first module out of tolerance (`first`), then the LAYER_ROWS modules with the largest error."""
    modules = [m for m in layers if m.get("compared")]
    worst = sorted((m for m in modules if m.get("rel_l2")), key=lambda m: -m["rel_l2"])[:LAYER_ROWS]
    if modules and not worst:
        return [{"module": f"all {len(modules)} modules compared", "type": None, "rel L2": "0", "max abs": "0",
                 "mismatched": None, "passed": all(m.get("passed") for m in modules), "note": "no error at any layer"}]
    return [{"module": m["module"], "type": m.get("type"), "rel L2": _g(m.get("rel_l2")),
             "max abs": _g(m.get("max_abs")),
             "mismatched": f"{m.get('mismatched', 0)}/{m.get('numel', 0)}", "passed": m.get("passed"),
             "note": "first out of tolerance" if m["module"] == first else ""}
            for m in [m for m in modules if m["module"] == first][:1] + [m for m in worst if m["module"] != first]]


def _g(value) -> str | None:
    return f"{value:.2g}" if isinstance(value, (int, float)) else None


def _error_row(row: dict, o: dict, passed=None) -> dict:
    return {**row, "max abs": _g(o.get("max_abs")), "rel L2": _g(o.get("rel_l2")),
            "cosine min": f"{o['cosine_min']:.6f}" if isinstance(o.get("cosine_min"), (int, float)) else None,
            "passed": o.get("passed") if passed is None else passed}


READERS = {"fallbacks": _fallbacks, "compile": _compile, "buckets": _buckets, "xla": _xla, "accuracy": _accuracy}
