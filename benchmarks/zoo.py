"""The conformance zoo: every architecture the installed transformers' Auto mappings list for the tasks portkit
feeds, built from its config at a tiny size with seeded weights and its own processor (benchmarks/zoo_build.py),
saved as a user's Hugging Face directory, run through every stage on both targets, and checked against the rules
a verdict must keep (benchmarks/zoo_rules.py).

    .venv/bin/python benchmarks/zoo.py [--workers 2] [--family causal-lm,ctc] [--only gpt2,bert.masked-lm]
                                       [--quick] [--stages fallbacks,compile,report] [--out runs/zoo]
                                       [--doc docs/zoo.md] [--fresh] [--build-only] [--table]

A row is one model type in one task family (zoo_build.FAMILIES). Causal LMs and encoder-decoders (text and speech
seq2seq) run the generation workload (`-p workload generate`): a causal LM's prefill and decode buckets and KV
cache; an encoder-decoder's decoding token by token in stage 2 (its serving buckets and graphs stay open questions).
Object detectors are judged per query (class agreement, box IoU), semantic segmenters on the argmax map per pixel.
On seeded weights stage 4's task-metric findings are set aside (SEEDED). --workers 1 runs one row after another
in this process (portkit.run.runner); more run on Ray (portkit.run.sweep), a row's two targets as two tasks.

Each row's result is written to <out>/rows/<row>.json as it ends: a zoo killed and started again with the same
command skips the rows it finished (--fresh clears them). The table (--doc) is rewritten after every row; --table
writes it from the finished rows alone (a zoo run in parts, one family at a time), each row naming its commit and host.

The last line: `zoo: N architectures (B not buildable), K stage crashes, V rule violations, M not assessed (wall
...; host ...)`. N counts rows, B those the zoo could not build (each with its one line), K row x stage pairs that
failed, V rule violations, M row x target verdicts "not assessed" (a model portkit refuses in its plan step is
not assessed on both targets). Exit code 1 where K or V > 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import html
import io
import os
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import zoo_build, zoo_rules  # noqa: E402
from portkit.core import atomic_io  # noqa: E402
from portkit.core.errors import PortkitError, StageFailed  # noqa: E402
from portkit.run import runner  # noqa: E402
from portkit.run import kernel_forks  # noqa: E402
from portkit.run import notebook_parameters  # noqa: E402
from portkit.runfolder import layout  # noqa: E402
from portkit.runfolder import run_log  # noqa: E402
from portkit.stages.report.stage import BLOCKED, NOT_ASSESSED, READY, READY_WITH_WORK  # noqa: E402

TARGETS = ("neuron", "tpu")
# Small parameters of every stage; each run gets those its stages declare. Four requests give stage 2's storm
# several shapes where the inputs vary (audio) and the storm finding its compiles; the rules the zoo checks read
# which ops, causes and caps a run names, not how many requests it streamed.
PARAMETERS = {"batch_size": 2, "seq_len": 16, "requests": 4, "bucket_count": 2, "max_shapes": 2,
              "train_steps": 2}
QUICK_PARAMETERS = {**PARAMETERS, "max_shapes": 1}
# causal LMs: the generation workload, four tokens from two prompts: a prefill and three decode steps, so a compile
# after warm-up that recurs from the second decode step on is seen recurring (gemma2's cache: "at 2 of 3 decode
# steps"; with three tokens it shows once, "at 1 of 2")
GENERATION = {"workload": "generate", "new_tokens": 4, "prompts": 2}
# The kernels draw no figure: matplotlib's Agg backend instead of the inline one ipykernel picks where MPLBACKEND is
# unset (ipykernel's kernelapp), so a plot cell builds its figure but renders no PNG into the notebook. The zoo
# reads the stages' JSON results; report.html draws its own figures (Agg) either way.
KERNEL_ENVIRONMENT = {"MPLBACKEND": "agg"}
GENERATING = ("causal-lm", "seq2seq-lm", "speech-seq2seq")     # the families run with GENERATION
# one row of each family, the cheapest
QUICK = ("gpt2.causal-lm", "bert.masked-lm", "t5.seq2seq-lm", "wav2vec2.ctc", "vit.image-classification",
         "clip.zero-shot-image")
# Stage 4's task metrics (top-1 agreement, greedy-token agreement, KL, perplexity change) judge whether a trained
# model's decisions survive the target. The zoo's weights are seeded random ones, whose logits sit in near-ties, so
# there a task metric measures tie-breaking, not the architecture. Stage 4 lets the element-wise error decide only
# a pass (within the GPU baseline's factor); every fail or undecided verdict of it rests on a task metric. So the
# zoo sets those findings aside ("accuracy", "accuracy_inconclusive") and grades the rest with the written policy
# (zoo_rules.graded, core.grading): a target whose verdict changes is counted as SEEDED, not as its verdict.
TASK_METRIC_FINDINGS = ("accuracy", "accuracy_inconclusive")
SEEDED = "seeded weights: task metric not judged"
# The row's peak memory: the largest a stage's run.json records (PEAK_KEY, per stage), else the resident memory of
# the row's kernels sampled while it ran ("process peak"; --workers 1 only: on Ray the rows run in other processes).
PEAK_KEY = run_log.PEAK_KEY
PEAK_EVERY = 0.5                # seconds between samples of the kernels' resident memory
ZOO_MARKER = ".portkit-zoo"     # in the runs folder: a folder the zoo may clear with --fresh
NOT_BUILDABLE = "not buildable"
# a row with a stage crash or a rule violation has failed, whatever its verdict says: its verdict is not counted
ROW_FAILED = "row failed (crash or rule violation)"
OUTCOMES = (READY, READY_WITH_WORK, BLOCKED, NOT_ASSESSED,
            SEEDED, NOT_BUILDABLE, ROW_FAILED)


# ---------------------------------------------------------------- one row
@dataclasses.dataclass
class Result:
    """A row's outcome, as written to <out>/rows/<row>.json."""
    key: str
    model_type: str
    family: str
    cls: str
    built: str = ""                 # "" when built, else the one line why not
    refused: str = ""               # the plan step's one line where portkit refuses the model
    stages: dict = dataclasses.field(default_factory=dict)      # stage: status ("neuron ok / tpu failed")
    verdicts: dict = dataclasses.field(default_factory=dict)    # target: verdict
    finding: str = ""
    crashes: list = dataclasses.field(default_factory=list)     # [stage, first line of its error]
    violations: list = dataclasses.field(default_factory=list)  # one line each
    generation: str = ""            # causal LMs: prefill and decode buckets per target; seq2seq: the note
    seconds: float = 0.0
    run_dirs: dict = dataclasses.field(default_factory=dict)    # target: run folder
    seeded: dict = dataclasses.field(default_factory=dict)      # target: the task-metric finding set aside
    judged: dict = dataclasses.field(default_factory=dict)      # target: the verdict without it, where it differs
    peak: dict = dataclasses.field(default_factory=dict)        # {"bytes": n, "source": what measured it}
    cpu_seconds: float = 0.0        # --workers 1: CPU time of this process and the row's kernels (kernel_forks)
    commit: str = ""                # the portkit commit the row ran at (rows of one table may span commits)
    host: str = ""                  # the host's speed and load when the row ended (host_speed)
    builder: str = ""               # the key of the builders and sizes it was built with (zoo_build.cache_folder)

    @classmethod
    def of(cls, row: zoo_build.Row) -> "Result":
        return cls(row.key, row.model_type, row.family, row.cls)


def first_line(text) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def parameters_for(stages: list[str], chosen: dict) -> dict:
    """The zoo's parameters the chosen stages declare (a parameter no stage declares is refused)."""
    declared = notebook_parameters.all_parameters(notebook_parameters.select_stages(stages))
    return {k: v for k, v in chosen.items() if k in declared}


def row_parameters(row: zoo_build.Row, stages: list[str], base: dict) -> dict:
    extra = GENERATION if row.family in GENERATING else {}
    return parameters_for(stages, {**base, **extra})


def _generation(run_dirs: dict) -> str:
    """Prefill and decode buckets per target (buckets.json "generation", the auto plan) and stage 3b's compile
    of them (xla.json's "serving"), in one line."""
    parts = []
    for target, run_dir in run_dirs.items():
        buckets = _json(run_dir / "buckets.json").get("generation") or {}
        plan = ((buckets.get("targets") or {}).get(target) or {}).get("auto") or {}
        if plan:
            parts.append(f"{target}: prefill {plan['prompt']['boundaries']} decode {plan['context']['boundaries']} "
                         f"({plan['compiles']} compiles){_served(run_dir, target)}")
        else:
            parts.append(f"{target}: no generation buckets (stage 3 {'absent' if not buckets else 'empty'})")
    return "; ".join(parts)


def _served(run_dir: Path, target: str) -> str:
    """"; 3b GRAPH STATUS, ..." of stage 3b's serving graphs for `target` (xla.json's "serving"), or ""."""
    xla = (((_json(run_dir / "xla.json").get("targets") or {}).get(target) or {}).get("serving") or {})
    served = ", ".join(f"{k} {v['status']}" for k, v in xla.items() if isinstance(v, dict) and "status" in v)
    return f"; 3b {served}" if served else ""


def _decoding(run_dirs: dict) -> str:
    """An encoder-decoder's decoding per target (compile.json's "generation": stage 2's dynamic and static caches),
    its serving plan (buckets.json's, the auto plan) and stage 3b's decode step, in one line."""
    parts = []
    for target, run_dir in run_dirs.items():
        gen = ((_json(run_dir / "compile.json").get("targets") or {}).get(target) or {}).get("generation") or {}
        dynamic, static = gen.get("dynamic"), gen.get("static")
        if not gen:
            parts.append(f"{target}: no decoding (stage 2 holds no generation)")
            continue
        plan = (((_json(run_dir / "buckets.json").get("generation") or {}).get("targets") or {}).get(target)
                or {}).get("auto") or {}
        serving = (f"; serving: source {plan['prompt']['boundaries']} x decoder context "
                   f"{plan['context']['boundaries']} ({plan['compiles']} compiles)" if plan else "")
        parts.append(f"{target}: dynamic cache "
                     + (f"{dynamic['compiles']} compiles" if dynamic else "refused") + ", static cache "
                     + (f"{static['warmup_compiles']} warm-up + {static['compiles']} after" if static else "refused")
                     + f" ({gen['new_tokens']} tokens){serving}{_served(run_dir, target)}")
    return "; ".join(parts)


def _json(path: Path) -> dict:
    try:
        return atomic_io.read_json(path) or {}
    except (OSError, ValueError):
        return {}


def read_result(result: Result, run_dirs: dict, stages: list[str], config: dict | None) -> Result:
    """The stages' outcomes, verdicts, first finding, crashes and rule violations of the row's run folders."""
    result.run_dirs = {t: str(d) for t, d in run_dirs.items()}
    seen: dict[str, dict[str, str]] = {s: {} for s in stages}
    for target, run_dir in run_dirs.items():
        run = zoo_rules.Run.read(run_dir, config=config)
        for stage in stages:
            status = run.status(stage)
            seen[stage][target] = status
            if status == "failed" and not any(c[0] == stage for c in result.crashes):
                error = first_line(run.error(stage)).split("; the executed notebook is ")[0]
                result.crashes.append([stage, error])
        entry = run.get("report").get("targets", {}).get(target) or {}
        result.verdicts[target] = entry.get("verdict") or NOT_ASSESSED
        first = entry.get("first") or entry.get("findings") or []
        if first and not result.finding:
            result.finding = f"{target}: {first_line(first[0].get('message'))}"
        _set_aside(result, target, entry)
        violations = zoo_rules.check(run) if run.get("report") else []
        lines = [v.line() for v in violations if target in ("", v.target) or v.target == target]
        result.violations += [line for line in lines if line not in result.violations]
    recorded = [(run_dir, _recorded_peak(run_dir)) for run_dir in run_dirs.values()]
    if any(n for _, n in recorded):
        result.peak = {"bytes": max(n for _, n in recorded), "source": f"run.json's {PEAK_KEY}, largest stage"}
    for stage, by_target in seen.items():
        values = set(by_target.values())
        split = " / ".join(f"{t} {v}" for t, v in by_target.items())
        result.stages[stage] = values.pop() if len(values) == 1 else split
    if result.family == "causal-lm":
        result.generation = _generation(run_dirs)
    elif result.family in GENERATING:
        result.generation = _decoding(run_dirs)
    return result


def _set_aside(result: Result, target: str, entry: dict) -> None:
    """Stage 4's task-metric findings of a report target (TASK_METRIC_FINDINGS), set aside on seeded weights: the
    first one's line in result.seeded, and the verdict the policy gives the other findings in result.judged where it
    differs from the report's."""
    findings = entry.get("findings") or []
    task = [f for f in findings if f.get("stage") == "accuracy" and f.get("kind") in TASK_METRIC_FINDINGS]
    if not task:
        return
    result.seeded[target] = first_line(task[0].get("message"))
    judged = zoo_rules.graded({**entry, "findings": [f for f in findings if f not in task]})
    if judged != entry.get("verdict"):
        result.judged[target] = judged


def _recorded_peak(run_dir: Path) -> int:
    """The largest peak memory a stage of the run folder's run.json records under PEAK_KEY (0: none)."""
    stages = _json(Path(run_dir) / layout.RUN_LOG).get("stages") or {}
    return max((int(s.get(PEAK_KEY) or 0) for s in stages.values() if isinstance(s, dict)), default=0)


class KernelPeak:
    """The largest resident memory this process's children (the row's kernels, but the fork server they are forked
    from) held together, sampled every PEAK_EVERY seconds on a daemon thread while the row runs (psutil)."""

    def __init__(self):
        import threading
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, name="zoo-kernel-peak", daemon=True)

    def _sample(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            # not the fork server the kernels are forked from: it serves every row (portkit/run/kernel_forks.py)
            server = kernel_forks.server_pid()
            for child in me.children(recursive=True):
                if child.pid == server:
                    continue
                try:
                    total += child.memory_info().rss
                except psutil.Error:      # a kernel that ended between the listing and the read
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(PEAK_EVERY)

    def __enter__(self) -> "KernelPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _config(folder: Path) -> dict | None:
    return _json(folder / "config.json") or None


def run_serial(row: zoo_build.Row, folder: Path, out: Path, stages, params: dict) -> Result:
    """One row's run, both targets in one run folder (portkit.run.runner), its stages side by side as `portkit run`
    runs them (the row's peak memory is its largest stage's, from run.json, where the stages record one)."""
    result, run_dir = Result.of(row), out / "runs" / row.key
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        with redirect_stdout(io.StringIO()), KernelPeak() as peak:   # the plan step's line on each target's mode
            try:
                runner.run(str(folder), list(TARGETS), str(run_dir), params, stages, progress=False,
                           log=lambda _: None)
            finally:
                result.peak = {"bytes": peak.peak, "source": "process peak: the row's kernels, sampled"} \
                    if peak.peak else {}
    except StageFailed:
        pass                                   # each failed stage is read from the run log below
    except PortkitError as exc:                # refused in the plan step: one line, nothing run
        result.refused = first_line(exc)
        result.verdicts = {t: NOT_ASSESSED for t in TARGETS}
        return result
    except Exception as exc:  # noqa: BLE001 (a run that ends in a traceback is portkit's crash, a row of the table)
        result.crashes.append(["run", f"{type(exc).__name__}: {first_line(exc)}"])
    return read_result(result, {t: run_dir for t in TARGETS}, stages, _config(folder))


def run_ray(rows: list[tuple[zoo_build.Row, Path]], out: Path, stages, params: dict, workers: int) -> list[Result]:
    """Rows on Ray (portkit sweep): one task per row x target, `workers` at once."""
    from portkit.run import sweep
    cells, results = [], {}
    for row, folder in rows:
        results[row.key] = Result.of(row)
        try:
            with redirect_stdout(io.StringIO()):
                cells += sweep.plan_sweep([str(folder)], list(TARGETS), out / "runs",
                                          row_parameters(row, stages, params), stages=stages, log=lambda _: None)
        except PortkitError as exc:
            results[row.key].refused = first_line(exc)
            results[row.key].verdicts = {t: NOT_ASSESSED for t in TARGETS}
    cores = os.cpu_count() or 1
    resources = sweep.Resources(cpus_per_task=max(cores / max(workers, 1), 0.01), memory_per_task_gib=2.0)
    if cells:
        outcome = sweep.run_sweep(cells, out / "runs", resources, progress=False, log=lambda line: print(f"  {line}"))
        for cell, record in zip(outcome.cells, outcome.records):
            if record["status"] == "failed" and not record.get("notebook"):   # no stage ran: the run itself failed
                crashes = results[Path(cell.model).name].crashes
                if not crashes:
                    crashes.append(["run", first_line(record.get("error"))])
    for row, folder in rows:
        result = results[row.key]
        if not result.refused:
            dirs = {t: out / "runs" / layout.model_tag(str(folder)) / t for t in TARGETS}
            read_result(result, dirs, stages, _config(folder))
    return list(results.values())


# ---------------------------------------------------------------- the counts
def counts(results: list[Result]) -> dict:
    return {"architectures": len(results), "not_buildable": sum(bool(r.built) for r in results),
            "crashes": sum(len(r.crashes) for r in results), "violations": sum(len(r.violations) for r in results),
            "not_assessed": sum(v == NOT_ASSESSED for r in results for v in r.verdicts.values())}


def summary_line(results: list[Result]) -> str:
    c = counts(results)
    return (f"zoo: {c['architectures']} architectures ({c['not_buildable']} not buildable), {c['crashes']} stage "
            f"crashes, {c['violations']} rule violations, {c['not_assessed']} not assessed")


def outcome(result: Result, target: str) -> str:
    """How the row counts in the shares: not buildable, failed (a crash or a rule violation), else its verdict."""
    if result.built:
        return NOT_BUILDABLE
    if result.crashes or result.violations:
        return ROW_FAILED
    if target in result.judged:
        return SEEDED
    return result.verdicts.get(target, NOT_ASSESSED)


def shares(results: list[Result]) -> dict:
    """{family: {target: {outcome: count}}}, each family's rows in the denominator, not buildable included."""
    table: dict = {}
    for r in results:
        for target in TARGETS:
            cell = table.setdefault(r.family, {}).setdefault(target, dict.fromkeys(OUTCOMES, 0))
            cell[outcome(r, target)] += 1
    return table


def causal_claim(results: list[Result], listed: int | None = None) -> str:
    """The causal-LM share ready or ready with work per target: the figure comparable to a vendor's claim. `listed`:
    how many causal-LM model types the mapping lists; where fewer have a row, the share is said to be a sample's."""
    causal = [r for r in results if r.family == "causal-lm"]
    if not causal:
        return ""
    parts = []
    for target in TARGETS:
        good = sum(outcome(r, target) in (READY, READY_WITH_WORK) for r in causal)
        parts.append(f"{target} {good}/{len(causal)} ({good / len(causal):.0%})")
    return (f"Causal LMs ready or ready with work (generation workload, emulated: CPU under each target's rules, "
            f"not hardware): {', '.join(parts)}; " + (
                "the denominator holds every causal-LM model type the mapping lists" if not listed or
                listed <= len(causal) else f"a sample: {len(causal)} of the {listed} causal-LM model types the "
                "mapping lists have a row here; the denominator holds the sample's rows")
            + ", the not buildable ones and the rows with a stage crash or a rule violation included.")


# ---------------------------------------------------------------- the page
def _esc(text) -> str:
    return html.escape(" ".join(str(text).split()))


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _status(result: Result, stages: list[str]) -> str:
    if result.built:
        return NOT_BUILDABLE
    if result.refused:
        return "refused by portkit's plan step"
    bad = [s for s in stages if result.stages.get(s) not in ("ok", "skipped")]
    return "all ok" if not bad else f"not ok: {', '.join(bad)}"


def _details(result: Result, stages: list[str]) -> str:
    """The row's detail, in a collapsible cell."""
    items = []
    if result.built:
        items.append(f"<b>not buildable</b>: {_esc(result.built)}")
    if result.refused:
        items.append(f"<b>refused</b>: {_esc(result.refused)}")
    if result.stages:
        items.append("<b>stages</b>: " + ", ".join(f"{s} {_esc(result.stages.get(s, ''))}" for s in stages))
    if result.finding:
        items.append(f"<b>first finding</b>: {_esc(result.finding)}")
    if result.generation:
        items.append(f"<b>generation</b>: {_esc(result.generation)}")
    items += [f"<b>crash</b> ({_esc(s)}): {_esc(e)}" for s, e in result.crashes]
    items += [f"<b>rule violation</b>: {_esc(v)}" for v in result.violations]
    items += [f"<b>{_esc(SEEDED)}</b> ({t}): set aside: {_esc(_short(line, 300))}"
              + (f"; the report's verdict {result.verdicts.get(t)}, without it {result.judged[t]}"
                 if t in result.judged else "; the verdict stands without it") for t, line in result.seeded.items()]
    if result.peak:
        items.append(f"<b>peak memory</b>: {_peak(result)} ({_esc(result.peak['source'])})")
    if result.seconds:
        items.append(f"<b>wall</b>: {result.seconds:.0f} s" + (f", CPU {result.cpu_seconds:.0f} s (this process and "
                                                               "the row's kernels)" if result.cpu_seconds else "")
                     + (f"; host {_esc(result.host)}" if result.host else ""))
    alarms = [f"crash in {', '.join(s for s, _ in result.crashes)}"] if result.crashes else []
    alarms += [f"{len(result.violations)} rule violation(s)"] if result.violations else []
    text = result.finding or result.built or result.refused or _status(result, stages)
    summary = _esc(_short(f"{'; '.join(alarms)}: {text}" if alarms else text))
    return f"<details><summary>{summary}</summary>{'<br>'.join(items)}</details>"


def _peak(result: Result) -> str:
    """The row's peak memory in MiB, "process peak" where the zoo sampled its kernels, "-" where nothing measured."""
    if not result.peak:
        return "-"
    label = "" if result.peak["source"].startswith("run.json") else " (process peak)"
    return f"{result.peak['bytes'] / 2 ** 20:.0f} MiB{label}"


def _verdict_cell(result: Result, target: str) -> str:
    if result.built:
        return NOT_BUILDABLE
    verdict = result.verdicts.get(target, NOT_ASSESSED)
    if target in result.judged:
        return f"{verdict}<br><sub>{_esc(SEEDED)}: {result.judged[target]} without it</sub>"
    return verdict


def render(results: list[Result], stages: list[str], meta: dict) -> str:
    lines = ["# Conformance zoo", "",
             "Every architecture the installed transformers' Auto mappings list for the tasks portkit feeds, one row "
             "per model type and task family, built from its config at a tiny size with seeded weights "
             "(`benchmarks/zoo_build.py`, sizes in `data/models/zoo.json`), saved as a Hugging Face directory with "
             "its own processor, run through the workbook on both targets, and checked against the rules a "
             "verdict must keep (`benchmarks/zoo_rules.py`). Causal LMs run the generation workload; every result "
             "is emulated (the CPU under each target's rules), never a hardware measurement. A row the zoo could "
             "not build says why in one line and stays in the denominator.", "",
             f"Seeded weights: stage 4's task metrics (top-1 and greedy-token agreement, KL, perplexity) judge whether "
             "a trained model's decisions survive the target; on seeded random weights the logits sit in near-ties "
             "and a task metric measures tie-breaking. The zoo sets stage 4's task-metric findings aside and grades "
             f"the rest with the written policy: a verdict that changes without them is counted as \"{SEEDED}\" "
             "(its cell shows both), not as ready, ready with work or blocked. Peak memory: the largest a stage "
             f"records in run.json (`{PEAK_KEY}`), else the row's kernels' resident memory sampled every "
             f"{PEAK_EVERY:g} s (\"process peak\", both targets in one run).", "",
             f"- date: {meta['date']}", f"- commit: {_commits(results, meta['commit'])}",
             f"- command: `{meta['command']}`",
             f"- host: {meta['host']}", f"- result: {meta['summary']}", ""]
    if len(stages) < len(layout.STAGE_NAMES):
        lines += [f"Stages run: {', '.join(stages)}. A verdict needs every stage's result, so with a subset "
                  "every target's verdict reads \"not assessed\".", ""]
    claim = causal_claim(results, meta.get("causal_listed"))
    if claim:
        lines += [f"**{claim}**", ""]
    lines += ["## Share per task family and target", "",
              "| family | target | rows | " + " | ".join(OUTCOMES) + " |", "|---|---|---|" + "---|" * len(OUTCOMES)]
    for family, by_target in shares(results).items():
        for target, cell in by_target.items():
            n = sum(cell.values())
            lines.append(f"| {family} | {target} | {n} | "
                         + " | ".join(f"{cell[o]} ({cell[o] / n:.0%})" for o in OUTCOMES) + " |")
    alarms = [f"- {r.key}: crash in {stage}: {_esc(error)}" for r in results for stage, error in r.crashes]
    alarms += [f"- {r.key}: {_esc(line)}" for r in results for line in r.violations]
    lines += ["", "## Stage crashes and rule violations", "", *(alarms or ["None."])]
    lines += ["", "## Architectures", "",
              "| architecture | family | stages | " + " | ".join(TARGETS) + " | peak memory | detail |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        flag = " ⚠" if r.crashes or r.violations else ""
        verdicts = [_verdict_cell(r, t) for t in TARGETS]
        lines.append(f"| {r.model_type}{flag} <br><sub>{r.cls}</sub> | {r.family} | {_esc(_status(r, stages))} | "
                     + " | ".join(verdicts) + f" | {_peak(r)} | {_details(r, stages)} |")
    return "\n".join(lines) + "\n"


def _commits(results: list[Result], current: str) -> str:
    """The commits the rows ran at, with their counts: a zoo resumed across commits says which rows ran where."""
    import collections
    ran = collections.Counter(r.commit or "not recorded" for r in results if not r.built)
    if not ran or set(ran) == {current}:
        return f"`{current}`"
    return "; ".join(f"`{c}` ({n} rows)" for c, n in ran.most_common()) + f"; table written at `{current}`"


def host_speed() -> str:
    """The host's speed at the time, for reading the wall time on a shared machine: float32 matmuls on one
    thread, and the load average."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(256, 256)
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < 0.3:
            a @ a
            n += 1
        gflops = n * 2 * 256 ** 3 / (time.perf_counter() - start) / 1e9
    finally:
        torch.set_num_threads(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores, {gflops:.1f} GFLOP/s one thread, load {load:.1f}"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------- the command
def _prepare_out(out: Path, fresh: bool) -> None:
    """The runs folder: the zoo's own is kept (its finished rows are skipped) or cleared with --fresh; any other
    non-empty folder is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / ZOO_MARKER).is_file():
            sys.exit(f"zoo: {out} is not empty and not a zoo runs folder; give another --out")
        if fresh:
            shutil.rmtree(out)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    (out / ZOO_MARKER).write_text("runs of benchmarks/zoo.py: kept between runs, cleared with --fresh\n")


def select(rows: list[zoo_build.Row], only: str | None, family: str | None, quick: bool,
           parser: argparse.ArgumentParser) -> list[zoo_build.Row]:
    """The rows --only (row names or model types), --family and --quick choose; an unknown name is refused."""
    if family:
        families = [f.strip() for f in family.split(",") if f.strip()]
        unknown = [f for f in families if f not in zoo_build.FAMILIES]
        if unknown or not families:
            parser.error(f"unknown family {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(zoo_build.FAMILIES)}")
        rows = [r for r in rows if r.family in families]
    names = [n.strip() for n in only.split(",") if n.strip()] if only else list(QUICK) if quick else None
    if names is None:
        return rows
    known = {r.key for r in rows} | {r.model_type for r in rows}
    unknown = [n for n in names if n not in known]
    if unknown:
        close = sorted(k for k in known if any(k.startswith(u.split(".")[0]) for u in unknown))[:12]
        parser.error(f"unknown architecture {', '.join(unknown)}; give a row (type.family) or a model type"
                     f"{' such as ' + ', '.join(close) if close else ''} (see --list)")
    return [r for r in rows if r.key in names or r.model_type in names]


def _signature(stages: list[str], params: dict) -> str:
    """What a finished row was run with: its stages and parameters. Its builder is the row's own (Result.builder),
    like its commit: a zoo resumed after a builder change keeps the rows it finished; --fresh, or deleting a row's
    <out>/rows file, runs them again."""
    return f"{','.join(stages)}|{sorted(params.items())}|{sorted(GENERATION.items())}"


def load_done(out: Path, signature: str) -> dict[str, Result]:
    """The rows an earlier zoo with the same stages and parameters finished (<out>/rows/*.json). A row saved when
    the signature also held the builder's key ("<signature>|<key>") is read with that key as its builder."""
    done = {}
    for path in sorted((out / "rows").glob("*.json")):
        data = _json(path)
        saved = str(data.get("signature") or "")
        if (saved == signature or saved.startswith(signature + "|")) and data.get("result"):
            result = Result(**data["result"])
            result.builder = result.builder or saved[len(signature) + 1:]
            done[result.key] = result
    return done


def save(out: Path, result: Result, signature: str) -> None:
    atomic_io.write_json(out / "rows" / f"{result.key}.json",
                         {"signature": signature, "result": dataclasses.asdict(result)})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated rows (type.family) or model types")
    parser.add_argument("--family", default=None, help=f"comma-separated families: {', '.join(zoo_build.FAMILIES)}")
    parser.add_argument("--quick", action="store_true", help=f"the quick subset ({', '.join(QUICK)})")
    parser.add_argument("--stages", default=None, help="comma-separated stages (default: every stage)")
    parser.add_argument("--workers", type=int, default=1, help="runs at once: 1 in this process, more on Ray")
    parser.add_argument("--chunk", type=int, default=4, help="rows per Ray sweep (workers > 1; default 4)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "zoo"), help="runs folder (kept: finished rows skipped)")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "zoo.md"), help="the table (markdown with HTML cells)")
    parser.add_argument("--fresh", action="store_true", help="clear the runs folder's finished rows first")
    parser.add_argument("--build-only", action="store_true", help="build the rows' directories, run no stage")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    parser.add_argument("--table", action="store_true",
                        help="write the table from the rows finished before (same stages and parameters), run none")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: give 1 or more")
    start = time.perf_counter()
    for key, value in KERNEL_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    every = zoo_build.enumerate_rows()
    rows = select(every, args.only, args.family, args.quick, parser)
    if args.list:
        print("\n".join(f"{r.key}\t{r.cls}" for r in rows))
        return 0
    stages = [s.name for s in notebook_parameters.select_stages(args.stages)]
    base = QUICK_PARAMETERS if args.quick else PARAMETERS
    folder, cache = zoo_build.cache_folder(), {}
    signature = _signature(stages, parameters_for(stages, base))
    out = Path(args.out).expanduser().resolve()
    _prepare_out(out, args.fresh)
    command = "python benchmarks/zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])
    done = load_done(out, signature)
    print(f"zoo: {len(rows)} rows x {len(TARGETS)} targets, stages {','.join(stages)}, "
          f"{'in this process' if args.workers == 1 else f'{args.workers} workers on Ray'} -> {out}; "
          f"{sum(r.key in done for r in rows)} finished before", flush=True)
    doc = Path(args.doc).expanduser()
    doc.parent.mkdir(parents=True, exist_ok=True)
    results = {k: v for k, v in done.items() if k in {r.key for r in rows}}
    meta = {"date": datetime.date.today().isoformat(), "commit": _commit(), "command": command.strip(),
            "host": f"{os.cpu_count()} cores", "causal_listed": sum(r.family == "causal-lm" for r in every)}

    def finish(result: Result) -> None:
        result.commit, result.builder = result.commit or meta["commit"], result.builder or folder.name
        result.host = result.host or host_speed()
        results[result.key] = result
        save(out, result, signature)
        ordered = [results[r.key] for r in rows if r.key in results]
        meta["summary"] = f"{summary_line(ordered)} so far ({len(ordered)} of {len(rows)} rows)"
        if not args.build_only:
            atomic_io.write_text(doc, render(ordered, stages, meta))
        print(f"  {result.key}: {_status(result, stages)}{'; ' + result.built if result.built else ''}"
              f"{'; refused: ' + result.refused if result.refused else ''} ({result.seconds:.0f} s)", flush=True)

    pending = []
    for row in ([] if args.table else rows):
        if row.key in results:
            continue
        begin, at = time.perf_counter(), _commit()     # the row's own commit: a resumed zoo's tree may move
        try:
            built = zoo_build.build(row, folder, cache)
        except zoo_build.NotBuilt as exc:
            result = Result.of(row)
            result.built, result.seconds, result.commit = str(exc), time.perf_counter() - begin, at
            finish(result)
            continue
        if args.build_only:
            continue
        if args.workers == 1:
            used = kernel_forks.cpu_seconds()
            result = run_serial(row, built, out, stages, row_parameters(row, stages, base))
            result.seconds, result.cpu_seconds = time.perf_counter() - begin, kernel_forks.cpu_seconds() - used
            now = _commit()
            result.commit = at if now == at else f"{at[:12]}..{now[:12]} (the tree moved during the row)"
            finish(result)
        else:
            pending.append((row, built))
            if len(pending) >= max(args.chunk, 1):
                _ray_chunk(pending, out, stages, base, args.workers, finish)
                pending = []
    if pending:
        _ray_chunk(pending, out, stages, base, args.workers, finish)
    if args.build_only:
        print(f"zoo: {len(rows)} rows, {sum(1 for r in results.values() if r.built)} not buildable "
              f"({time.perf_counter() - start:.0f} s) in {folder}")
        return 0
    ordered = [results[r.key] for r in rows if r.key in results]
    host, wall = host_speed(), time.perf_counter() - start
    summary = summary_line(ordered)
    left = f" ({len(ordered)} of {len(rows)} rows finished)" if len(ordered) < len(rows) else ""
    meta.update(summary=f"{summary}{left}" if args.table else f"{summary} in {wall:.0f} s",
                host=f"{host} now; each row's own in its detail" if args.table else host)
    atomic_io.write_text(doc, render(ordered, stages, meta))
    atomic_io.write_json(out / "zoo.json", {"summary": summary, "wall_seconds": round(wall, 1), "host": host,
                                            "command": meta["command"], "commit": meta["commit"],
                                            "rows": [dataclasses.asdict(r) for r in ordered]})
    for r in ordered:
        for stage, error in r.crashes:
            print(f"  crash: {r.key} {stage}: {error}")
        for line in r.violations:
            print(f"  rule violation: {r.key}: {line}")
    print(f"  table: {doc}")
    c = counts(ordered)
    ran = [r for r in ordered if r.cpu_seconds]
    cpu = f"; CPU {sum(r.cpu_seconds for r in ran) / len(ran):.0f} s per row run here ({len(ran)})" if ran else ""
    print(f"{summary} (wall {wall:.0f} s{cpu}; host {host})")
    return 1 if c["crashes"] or c["violations"] else 0


def _ray_chunk(pending, out: Path, stages, base: dict, workers: int, finish) -> None:
    begin = time.perf_counter()
    found = run_ray(pending, out, stages, base, workers)
    for result in found:
        result.seconds = (time.perf_counter() - begin) / len(found)     # the chunk's wall, shared
        finish(result)


if __name__ == "__main__":
    sys.exit(main())
