"""Sweeps: one workbook run per model × target × option set, as Ray tasks, and a sweep report.

    >>> from portkit.run import sweep
    >>> cells = sweep.plan_sweep(["minilm", "gpt2"], ["neuron", "tpu"], "runs/sweep", stages="fallbacks")
    >>> outcome = sweep.run_sweep(cells, "runs/sweep")   # writes runs/sweep/sweep.html and sweep.json
    >>> outcome.counts()                                  # {'finished': 4, 'skipped': 0, 'failed': 0}

A local Ray is started for the sweep and shut down after it; sweep.Resources(address="HOST:6379")
joins an existing cluster instead (portkit installed on its workers).

Each cell is the same papermill run as `portkit run --model M --target T` (portkit.run.runner.run, inside a
Ray task, its notebooks in kernels of their own), into <out>/<model tag>/<target>[/<options>]; every run
leaves a report.json, which the sweep report reads. The sweep's own record of each cell (cell.json, run.log)
lives apart, under <out>/.sweep/. Every cell's plan is checked before Ray starts: bad input writes nothing.
A run that finished before with the same inputs is skipped; a failed stage is retried once inside the task,
a dead worker once by Ray (max_retries), then the cell is recorded as failed.

sweep.json's keys are stable (the conventions of report.json) and documented in docs/reference/sweep-json.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import io
import json
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from portkit.runfolder import layout
from portkit.run import kernel_forks
from portkit.run import notebook_parameters
from portkit.run import preflight
from portkit.run import runner
from portkit.core.atomic_io import read_json, write_json, write_text
from portkit.core.errors import BadParameter, MissingPackage, PortkitError, StageFailed
from portkit.core.progress import watched

SCHEMA = "portkit.sweep/1"
CELL_SCHEMA = "portkit.run.sweep-cell/1"
RECORDS = ".sweep"              # under the sweep folder, beside the run folders: the sweep's record of each cell
CELL_FILE = "cell.json"         # the inputs, attempts and times of the cell's latest finished run
LOG_FILE = "run.log"            # what the task printed, attempt by attempt
ATTEMPTS = 2                    # a run with a failed stage is retried once, then recorded
SYSTEM_RETRIES = 1              # a dead worker: Ray runs the task once more
OBJECT_STORE_BYTES = 128 * 2 ** 20   # tasks return small dicts; Ray's default takes 30% of memory
# The driver's values of these reach the tasks, also on a cluster whose workers never saw this shell.
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TPU_WORKER_HOSTNAMES", "ALLOW_MULTIPLE_LIBTPU_LOAD")
INSTALL_HINT = "portkit sweep needs Ray: pip install 'portkit[sweep]'"


def require_ray():
    """The ray module, or MissingPackage with the install line (Ray is the optional `sweep` extra)."""
    try:
        import ray
    except ImportError:
        raise MissingPackage(INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class Cell:
    model: str
    target: str
    options: dict           # this cell's option set (parameters)
    options_label: str      # "" for the only option set
    parameters: dict        # every parameter of the run: the sweep's -p values, then the option set
    stages: tuple[str, ...]
    run_dir: Path           # absolute
    record_dir: Path        # absolute: <out>/.sweep/<the run folder's path below out>

    def spec(self) -> dict:
        """The inputs that decide a run's results: a finished run with the same spec is not rerun."""
        return json.loads(json.dumps({"model": self.model, "target": self.target, "stages": list(self.stages),
                                      "parameters": self.parameters}, sort_keys=True, default=str))


@dataclass(frozen=True)
class Resources:
    """What each task asks Ray for, and where Ray runs (None: a local Ray started for the sweep)."""
    cpus_per_task: float = 1.0
    memory_per_task_gib: float = 3.0
    address: str | None = None
    address_from: str = "--address"   # where the address came from: the option, or RAY_ADDRESS (with_environment)

    def __post_init__(self):
        for name, value in (("cpus per task", self.cpus_per_task), ("memory per task", self.memory_per_task_gib)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise BadParameter(name, value, hint="must be a positive number")


RAY_ADDRESS = "RAY_ADDRESS"   # Ray's environment variable: ray.init() joins the cluster it names (Ray's docs)


def with_environment(resources: Resources, log=print) -> Resources:
    """`resources` with RAY_ADDRESS as the address where --address is not given: ray.init() would join that cluster
    anyway, where a local Ray's options (object_store_memory) are refused. Said in a note; errors name it."""
    found = os.environ.get(RAY_ADDRESS)
    if resources.address is not None or not found:
        return resources
    log(f"portkit: note: {RAY_ADDRESS}={found} is set in the environment: the sweep joins that Ray cluster "
        f"(unset {RAY_ADDRESS} for a local Ray)")
    return dataclasses.replace(resources, address=found, address_from=f"environment variable {RAY_ADDRESS}")


def parse_options(text: str, declared: dict) -> dict:
    """One option set, written `NAME=VALUE NAME=VALUE`; values read as `-p` reads them."""
    options = {}
    for item in text.split():
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise BadParameter("option set", text, hint="write it as NAME=VALUE NAME=VALUE")
        options[name] = notebook_parameters.coerce(name, raw, declared) if name in declared else raw
    return options


def plan_sweep(models, targets, out_dir, parameters: dict | None = None, option_sets=None,
               stages=None, log=print) -> list[Cell]:
    """Every cell of the sweep, each run's plan checked (preflight.plan) before anything is written.

    option_sets: a list of {name: value} (one run per set per model and target); None for one set."""
    chosen = [s.name for s in notebook_parameters.select_stages(stages)]   # rejects an unknown stage
    sets = [dict(s) for s in option_sets] if option_sets else [{}]
    labels = [" ".join(f"{k}={v}" for k, v in s.items()) for s in sets]
    slugs = [re.sub(r"[^A-Za-z0-9._=-]+", "_", label).replace("=", "-") for label in labels]
    out = Path(out_dir).expanduser().resolve()
    models, targets = list(dict.fromkeys(models)), list(dict.fromkeys(targets))
    cells, seen_lines = [], []
    for model in models:
        for target in targets:
            for options, label, slug in zip(sets, labels, slugs):
                below = Path(layout.model_tag(model), target, slug if len(sets) > 1 else "")
                parameters = {**(parameters or {}), **options}
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):   # each plan prints the target's mode; once is enough
                    _, per_stage = preflight.plan(model, [target], str(out / below), parameters, chosen)
                seen_lines += [line for line in printed.getvalue().splitlines() if line not in seen_lines]
                cells.append(Cell(model, per_stage[0][1]["targets"][0], options, label if len(sets) > 1 else "",
                                  parameters, tuple(chosen), Path(per_stage[0][1]["out_dir"]), out / RECORDS / below))
    _no_shared_folders("model", models, [layout.model_tag(m) for m in models])
    _no_shared_folders("option set", labels, slugs)
    for line in seen_lines:
        log(line)
    return cells


def _no_shared_folders(what: str, values: list[str], folders: list[str]) -> None:
    for i, folder in enumerate(folders):
        if folder in folders[:i]:
            first = values[folders.index(folder)]
            raise BadParameter(what, values[i], hint=f"its run folder {folder!r} is also that of {first!r}; "
                                                     "give them different names")


def is_finished(cell: Cell) -> bool:
    """A run finished with this cell's inputs: its cell.json matches and its report.json holds the
    cell's target and an "ok" result for every stage asked for."""
    try:
        done, report = read_json(cell.record_dir / CELL_FILE), layout.read_report(cell.run_dir)
        stages = report["stages"]
        return (done.get("spec") == cell.spec() and report.get("schema") == _report_schema()
                and cell.target in report["targets"]
                and all(stages[s]["status"] == "ok" for s in cell.stages if s != layout.REPORT))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _report_schema() -> str:
    from portkit.stages.report import stage
    return stage.SCHEMA


# ---------------------------------------------------------------- the task
def run_cell(cell: Cell, environ: dict, cwd: str) -> dict:
    """One cell's workbook run, in a Ray worker. A run with a failed stage is retried once (ATTEMPTS);
    the result names the executed notebook that shows the error. Prints go to the cell's run.log."""
    started = time.time()
    os.environ.update(environ)
    if os.path.isdir(cwd):   # relative paths in parameters mean what they mean to `portkit run` there
        os.chdir(cwd)
    cpu_before = kernel_forks.cpu_seconds()
    cell.record_dir.mkdir(parents=True, exist_ok=True)
    result = {"status": "failed", "attempts": 0, "error": None, "notebook": None, "seconds": 0.0}
    with open(cell.record_dir / LOG_FILE, "a", encoding="utf-8") as handle, \
            contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
        for attempt in range(1, ATTEMPTS + 1):
            print(f"--- {datetime.datetime.now().isoformat(timespec='seconds')} attempt {attempt} of {ATTEMPTS}: "
                  f"{cell.model} on {cell.target}, stages {','.join(cell.stages)}", flush=True)
            start = time.perf_counter()
            result["attempts"] = attempt
            try:
                # one stage at a time: the cell's task holds the CPUs and memory of one (ResourcesPerTask)
                runner.run(cell.model, [cell.target], str(cell.run_dir), cell.parameters, list(cell.stages),
                           progress=False, log=lambda line: print(line, flush=True),
                           settings=runner.RunSettings(lanes=1))
            except StageFailed as exc:   # the run went on past the failed stage; its notebook shows the error
                result["error"] = str(exc)
                first = next(iter(exc.result.failures))
                result["notebook"] = str(cell.run_dir / layout.stage(first).notebook)
                print(f"failed: {exc}", flush=True)
                continue
            except PortkitError as exc:   # bad input found only here (a file missing on this worker): no retry
                result["error"] = str(exc)
                print(f"failed: {exc}", flush=True)
                break
            finally:
                result["seconds"] += time.perf_counter() - start
            result.update(status="finished", error=None, notebook=None)
            break
    result.update(cpu_seconds=kernel_forks.cpu_seconds() - cpu_before, started=started, ended=time.time())
    if result["status"] == "finished":
        write_json(cell.record_dir / CELL_FILE, {"schema": CELL_SCHEMA, "spec": cell.spec(), **result})
    return result


# ---------------------------------------------------------------- the sweep
@dataclass
class SweepOutcome:
    out_dir: Path
    cells: list[Cell]
    records: list[dict]                 # one per cell, in the same order: status and timings (epoch seconds
                                        # submitted, started, ended, received where it ran)
    engine: dict
    wall_seconds: float
    created: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))

    def counts(self) -> dict[str, int]:
        return {s: sum(r["status"] == s for r in self.records) for s in ("finished", "skipped", "failed")}

    def to_dict(self) -> dict:
        cells = [_cell_entry(self.out_dir, c, r) for c, r in zip(self.cells, self.records)]
        return {"schema": SCHEMA, "created": self.created, "out_dir": str(self.out_dir),
                "models": list(dict.fromkeys(c.model for c in self.cells)),
                "targets": list(dict.fromkeys(c.target for c in self.cells)),
                "option_sets": list(dict.fromkeys(c.options_label for c in self.cells)),
                "stages": list(self.cells[0].stages) if self.cells else [], "engine": self.engine,
                "wall_seconds": self.wall_seconds, "counts": self.counts(), "cells": cells}

    def save(self) -> Path:
        data = self.to_dict()
        write_json(self.out_dir / "sweep.json", data)
        return write_text(self.out_dir / "sweep.html", _render(data))


def run_sweep(cells: list[Cell], out_dir, resources: Resources = Resources(), progress: bool = True,
              log=print) -> SweepOutcome:
    """Run every cell not finished before as a Ray task; wait for all; return their records. progress=True: a
    bar of the runs where someone watches stdout (progress.watched), none in a file or a pipe."""
    start = time.perf_counter()
    out = Path(out_dir).expanduser().resolve()
    records: list[dict | None] = [None] * len(cells)
    pending = []
    for i, cell in enumerate(cells):
        if is_finished(cell):
            earlier = read_json(cell.record_dir / CELL_FILE)
            records[i] = {**{k: earlier.get(k) for k in ("attempts", "seconds", "cpu_seconds")}, "status": "skipped"}
        else:
            pending.append(i)
    ray = require_ray()
    resources = with_environment(resources, log)
    engine = {"name": "ray", "ray_version": ray.__version__, "address": resources.address or "local",
              "cluster_cpus": None, "cpus_per_task": resources.cpus_per_task,
              "memory_per_task_gib": resources.memory_per_task_gib, "start_seconds": None}
    log(f"sweep: {len(cells)} runs, {len(cells) - len(pending)} finished before, {len(pending)} to run")
    if pending:
        _on_ray(ray, [cells[i] for i in pending], resources, engine, progress, len(cells),
                lambda k, record: records.__setitem__(pending[k], record))
    outcome = SweepOutcome(out, cells, records, engine, time.perf_counter() - start)
    outcome.save()
    return outcome


def _on_ray(ray, cells: list[Cell], resources: Resources, engine: dict, progress: bool, total: int, keep) -> None:
    """Start (or join) Ray, run one task per cell, keep(index, record) as each ends; shut Ray down."""
    from tqdm.auto import tqdm
    if resources.address is not None:
        _check_reachable(resources.address, f"Ray address (from {resources.address_from})")
    temp = tempfile.mkdtemp(prefix="portkit-ray-") if resources.address is None else None
    began = time.perf_counter()
    try:
        if temp:
            _start_local(ray, temp)
        else:
            try:
                ray.init(address=resources.address, log_to_driver=False, logging_level="ERROR")
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise BadParameter(f"Ray address (from {resources.address_from})", resources.address,
                                   hint=f"cannot join it ({' '.join(str(exc).split())[:200]}); where the cluster "
                                        "uses token authentication, set RAY_AUTH_MODE=token") from None
        engine["start_seconds"] = round(time.perf_counter() - began, 2)
        available = ray.cluster_resources()
        engine["cluster_cpus"] = available.get("CPU", 0)
        memory = resources.memory_per_task_gib * 2 ** 30
        if available.get("CPU", 0) < resources.cpus_per_task or available.get("memory", 0) < memory:
            raise BadParameter("task size", f"{resources.cpus_per_task} CPU, {resources.memory_per_task_gib} GiB",
                               hint=f"the Ray cluster has {available.get('CPU', 0):g} CPUs and "
                                    f"{available.get('memory', 0) / 2 ** 30:.1f} GiB for tasks")
        task = ray.remote(run_cell).options(num_cpus=resources.cpus_per_task, memory=int(memory),
                                            max_retries=SYSTEM_RETRIES)
        environ = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        environ.update({k: v for k, v in os.environ.items() if k.startswith("PORTKIT_")})
        submitted = {}
        for k, cell in enumerate(cells):
            submitted[task.remote(cell, environ, os.getcwd())] = (k, time.time())
        bar = tqdm(total=total, initial=total - len(cells), desc="sweep", unit="run",
                   disable=not (progress and watched()))
        waiting = list(submitted)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            k, sent = submitted[ready[0]]
            keep(k, _collect(ray, ready[0], sent, cells[k]))
            bar.update(1)
        bar.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


# Ray gives a starting node a fixed 30 s to register with its GCS (ray/_private/node.py, not configurable), which a
# loaded machine can miss: the start is tried this many times, with a pause between, before it is a failure.
START_ATTEMPTS, START_PAUSE_SECONDS = 3, 10


def _start_local(ray, temp: str) -> None:
    """Start a local Ray in `temp` (removed by the caller however this ends); a start that fails START_ATTEMPTS
    times is one line: what Ray said and what to try (the processes it started are shut down first)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            ray.init(include_dashboard=False, _temp_dir=temp, log_to_driver=False, logging_level="ERROR",
                     object_store_memory=OBJECT_STORE_BYTES)
            return
        except Exception as exc:   # noqa: BLE001 (Ray raises many kinds here: RuntimeError, ConnectionError, ...)
            with contextlib.suppress(Exception):
                ray.shutdown()
            if attempt < START_ATTEMPTS:
                time.sleep(START_PAUSE_SECONDS)
                continue
            said = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise PortkitError(f"Ray did not start on this machine in {START_ATTEMPTS} tries ({type(exc).__name__}: "
                               f"{said}); try --address of a running Ray cluster, or fewer workers at once (a larger "
                               "--cpus-per-task or --memory-per-task), or free memory and rerun") from None


def _check_reachable(address: str, what: str = "Ray address", seconds: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens at (Ray itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        if address == "auto":   # Ray finds the cluster started on this machine
            return
        raise BadParameter(what, address, hint="give HOST:PORT of the cluster's head, or auto")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as exc:
        raise BadParameter(what, address, hint=f"nothing answers there ({exc.strerror or exc})") from None


def _collect(ray, ref, sent: float, cell: Cell) -> dict:
    received = time.time()
    try:
        r = ray.get(ref)
    except ray.exceptions.RayError as exc:   # the task raised a bug (not retried), or its worker died twice
        lines = [line for line in str(exc).splitlines() if line.strip()]
        attempts = 1 if isinstance(exc, ray.exceptions.RayTaskError) else SYSTEM_RETRIES + 1
        error = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
        if isinstance(exc, getattr(ray.exceptions, "OutOfMemoryError", ())):
            # Ray's memory monitor killed the worker (Ray's "Out-Of-Memory Prevention" docs): its diagnostic is
            # a page of advice on Ray's settings; the record says what happened and what to change here
            error = (f"Ray's memory monitor killed the run's worker (the node ran low on memory), {attempts} "
                     "attempt(s); give each run more memory (--memory-per-task) so that fewer run at once, or a "
                     "smaller -p batch_size")
        return {"status": "failed", "attempts": attempts, "seconds": None, "cpu_seconds": None,
                "error": error, "notebook": None}
    return {**r, "submitted": sent, "received": received, "queue_seconds": r["started"] - sent,
            "task_seconds": r["ended"] - r["started"], "result_seconds": received - r["ended"]}


# ---------------------------------------------------------------- the report
def _cell_entry(out: Path, cell: Cell, record: dict) -> dict:
    """One cell of sweep.json: how its run went, and what its report.json says."""
    def rel(path) -> str | None:
        return os.path.relpath(path, out) if path and Path(path).exists() else None

    entry = {"model": cell.model, "model_tag": layout.model_tag(cell.model), "target": cell.target,
             "options": cell.options, "options_label": cell.options_label, "status": record["status"],
             "attempts": record.get("attempts"), "run_dir": os.path.relpath(cell.run_dir, out),
             "report": rel(cell.run_dir / "report.html"),
             "notebook": rel(record.get("notebook")), "log": rel(cell.record_dir / LOG_FILE),
             "error": record.get("error"), "seconds": record.get("seconds"), "cpu_seconds": record.get("cpu_seconds"),
             **{k: record.get(k) for k in ("queue_seconds", "task_seconds", "result_seconds")},
             "mode": None, "verdict": None, "verdict_reason": None, "blockers": [], "bucket_plan": None,
             "hbm": None, "accuracy": None}
    if record["status"] == "failed" and not record.get("notebook"):   # no stage ran to its end: any report is older
        entry["report"] = None
        return entry
    try:
        entry.update(cell_summary(layout.read_report(cell.run_dir), cell.target))
    except FileNotFoundError:
        entry["report"] = None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        entry["error"] = entry["error"] or f"its report.json cannot be read ({type(exc).__name__}: {exc})"
    return entry


def cell_summary(report: dict, target: str) -> dict:
    """Verdict, blockers, bucket plan, HBM and accuracy of one target in a run's report.json."""
    from portkit.targets.specs import BLOCKER
    t = report["targets"][target]
    buckets = t["checklist"].get("buckets")
    shapes = [s for s in t["details"].get("xla shapes", []) if s.get("HBM MiB") is not None]
    outputs = t["details"].get("accuracy outputs") or [{}]
    precision = t.get("precision")
    return {
        "mode": t["mode"], "verdict": t["verdict"], "verdict_reason": t["verdict_reason"],
        "blockers": [f["message"] for f in t["findings"] if f["severity"] == BLOCKER],
        "bucket_plan": {k: buckets.get(k) for k in ("planner", "boundaries", "batch_sizes")} if buckets else None,
        "hbm": {"peak_mib": max(s["HBM MiB"] for s in shapes), "fits": all(bool(s.get("fits HBM")) for s in shapes),
                "per_device": t["metrics"].get("xla", {}).get("peak HBM per device")} if shapes else None,
        "accuracy": {"verdict": precision.get("verdict"), "setting": precision.get("setting"),
                     "output": outputs[0].get("output"), "max_abs": outputs[0].get("max abs")} if precision else None,
    }


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.PackageLoader("portkit.run", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("sweep.html.j2")


def _render(data: dict) -> str:
    from portkit.stages.report.stage import VERDICT_COLORS
    rows = list(dict.fromkeys((c["model"], c["options_label"]) for c in data["cells"]))
    matrix = [(model, label, [next((c for c in data["cells"] if (c["model"], c["options_label"], c["target"])
                                    == (model, label, t)), None) for t in data["targets"]])
              for model, label in rows]
    emulated = sorted({c["target"] for c in data["cells"] if c["mode"] and c["mode"] != "native"})
    return _template().render(d=data, matrix=matrix, emulated=emulated, colors=VERDICT_COLORS)
