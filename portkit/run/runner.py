"""The workbook runner: execute the stage notebooks in order with papermill into one run folder.

    >>> from portkit import audio, runner
    >>> result = runner.run("minilm", ["neuron", "tpu"], "runs/minilm", {"batch_size": 4})
    >>> result.summaries
    {'fallbacks': 'neuron (emulated): ...'}

Each notebook gets the shared parameters (model, targets, out_dir) and those of the user's
parameters it declares; a parameter no notebook declares is an error, raised before anything is
written. `plan` checks everything first (values, the model spec, the corpus file's content, the run
folder) and makes every path absolute: the notebooks run in notebooks/, not where the user typed it.
The stages run in kept kernels, cleared between stages (portkit/run/jupyter_kernels.py): a stage does not pay for a
new interpreter and its imports; two stages that do not read each other's results run side by side.

A run folder is one holding MARKER (written by every run) or only files a run writes; `portkit run`
refuses any other non-empty folder. A notebook is executed under a partial name and renamed when done,
so a killed run leaves no half-written notebook; a stage that fails stops the run, and its executed
notebook is moved into place showing the error.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core import atomic_io as _io
from portkit.corpora import audio
from portkit.corpora import corpus as data
from portkit.corpora import images
from portkit.run import jupyter_kernels as kernels
from portkit.stages import options
from portkit.runfolder import results
from portkit.runfolder import layout as runfolder
from portkit.core.errors import BadParameter, StageFailed, StageSkipped
from portkit.core.locations import NOTEBOOKS
from portkit.core.progress import HEADLESS_VARIABLE
from portkit.runfolder.layout import MARKER, STAGE_NAMES, STAGES, Stage, is_run_folder  # noqa: F401 (the runner's API)

SHARED = ("model", "targets", "out_dir")



def declared_parameters(stage: Stage) -> dict[str, dict]:
    """The parameters a stage notebook declares, with default and help text (papermill's inspector)."""
    return options.declared(stage.notebook)


def parameters_by_stage(stages=STAGES) -> dict[str, dict[str, dict]]:
    """{parameter: {stage: its declaration (default, help)}}: one parameter may differ per stage."""
    found: dict[str, dict[str, dict]] = {}
    for stage in stages:
        for name, info in declared_parameters(stage).items():
            found.setdefault(name, {})[stage.name] = info
    return found


def all_parameters(stages=STAGES) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for stage in stages:
        for name, info in declared_parameters(stage).items():
            found.setdefault(name, {**info, "stages": []})["stages"].append(stage.name)
    return found


def coerce(name: str, raw: str, declared: dict):
    """A value typed on the command line, read the way the notebook's default is written."""
    default = declared[name].get("default", "")
    try:
        default_value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        default_value = None
    if isinstance(default_value, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def select_stages(names) -> list[Stage]:
    """None: every stage. Otherwise a list or comma-separated string of stage names, at least one."""
    if names is None:
        return list(STAGES)
    given = names
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    for n in names:
        if n not in STAGE_NAMES:
            raise BadParameter("stage", n, STAGE_NAMES)
    if not names:
        raise BadParameter("stage list", given, STAGE_NAMES, hint="give at least one stage")
    return [s for s in STAGES if s.name in names]


def plan(model: str, targets, out_dir: str, user_params: dict, stages=None):
    """Validate everything a run needs, writing nothing (one empty folder is created and removed to prove
    the run folder writable). Returns (stages, per-stage params), every path in them absolute."""
    chosen = select_stages(stages)
    declared = all_parameters(chosen)
    for name in user_params:
        if name in SHARED:
            raise BadParameter("parameter", name, hint=f"give {name} with its own option, not -p")
        if name not in declared:
            raise BadParameter("parameter", name, sorted(n for n in declared if n not in SHARED))
    user_params = dict(user_params)
    if "corpus" in user_params:
        user_params["corpus"] = data.resolve_corpus(user_params["corpus"])
    model, names, out = options.common(model, targets, out_dir)   # model and out come back absolute
    per_stage = []
    for stage in chosen:
        mine = declared_parameters(stage)
        values = {"model": model, "targets": names, "out_dir": str(out)}
        values.update({k: v for k, v in user_params.items() if k in mine})
        _preflight(stage, mine, values)
        per_stage.append((stage, values))
    _check_corpora(per_stage, model)
    check_out_dir(out)   # last: its probe is the one step that touches the disk
    return chosen, per_stage


_NO_DEFAULT = object()


def _default(declared: dict, name: str):
    """A notebook parameter's default value; _NO_DEFAULT for an expression the notebook evaluates."""
    try:
        return ast.literal_eval(declared[name]["default"])
    except (KeyError, ValueError, SyntaxError):
        return _NO_DEFAULT


def _preflight(stage: Stage, declared: dict, values: dict) -> None:
    """Run the stage's own parameter checks on its defaults overridden by the user's values."""
    module = importlib.import_module(stage.module)
    if hasattr(module, "Options"):
        module.Options.of(values, model=values.get("model"))
        return
    check = getattr(module, "check_parameters", None)
    if check is None:
        return
    accepted = inspect.signature(check).parameters
    merged = {}
    for name in accepted:
        if name in values:
            merged[name] = values[name]
        elif name in declared and _default(declared, name) is not _NO_DEFAULT:
            merged[name] = _default(declared, name)
    check(**merged)


def _check_corpora(per_stage, model: str) -> None:
    """Read each corpus file a stage will read, with its text column: a bad line fails here, not mid-run.
    A folder is checked against the model's kind of data (the model is loaded for it: folders only)."""
    checked = set()
    for stage, values in per_stage:
        declared = declared_parameters(stage)
        if "corpus" not in declared:
            continue
        corpus = values.get("corpus", _default(declared, "corpus"))
        column = values.get("text_column", _default(declared, "text_column"))
        if corpus == "stdlib" or (corpus, column) in checked:
            continue
        if data.is_folder(corpus):
            from portkit.models import registry as models
            data.check_folder_for(models.load(model), corpus)
        if data.is_folder(corpus) and audio.holds_audio(Path(corpus).expanduser()):
            audio.folder_corpus(corpus)      # every file's header read: an unreadable one fails here
        elif data.is_folder(corpus):
            images.check_folder(corpus)      # likewise every image's header
        else:
            data.load_corpus(corpus, column)
        checked.add((corpus, column))


def check_out_dir(out: Path) -> None:
    """The run folder is a new folder that can be created, or a run folder that can be written."""
    what = "out folder"
    if out.exists() and not out.is_dir():
        raise BadParameter(what, str(out), hint="it is a file, not a folder")
    if out.is_dir():
        try:
            foreign = not is_run_folder(out)
        except OSError as exc:
            raise BadParameter(what, str(out), hint=f"cannot list it ({exc.strerror})") from None
        if foreign:
            raise BadParameter(what, str(out), hint="it holds files that are not a portkit run's; give a new or "
                                                    f"empty folder, or a run folder (one holding {MARKER})")
        base = out
    else:
        base = next(parent for parent in out.parents if parent.exists())
        if not base.is_dir():
            raise BadParameter(what, str(out), hint=f"{base} is a file, not a folder")
    # os.access answers yes to root everywhere, and some file systems (/proc) refuse all the same:
    # create and remove an empty folder to know.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".portkit-probe-", dir=base))
    except OSError as exc:
        raise BadParameter(what, str(out), hint=f"cannot create a folder in {base} ({exc.strerror})") from None


@dataclass
class RunResult:
    out_dir: Path
    summaries: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)   # stage: its one-line error
    report_rebuilt: bool = False


@contextlib.contextmanager
def _kernel_environment(folder: str | None):
    """The environment of the kernels started inside the block: `folder` first on their Python path, and
    kernels.ENVIRONMENT where the user set none of it. Set once for the run, before any stage starts."""
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", *kernels.ENVIRONMENT)}
    if folder is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, before["PYTHONPATH"]) if p)
    for key, value in kernels.ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _keep_if_whole(partial: Path, output: Path) -> None:
    """Move an executed notebook into place if it reads as a notebook; remove it otherwise."""
    import nbformat
    try:
        nbformat.read(str(partial), as_version=4)
    except (OSError, ValueError):
        partial.unlink(missing_ok=True)
        return
    os.replace(partial, output)


def _summary(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("summary", "(no summary)")
    except (OSError, ValueError):
        return "(its result file is missing or unreadable)"


def run(model: str, targets, out_dir: str, user_params: dict | None = None, stages=None,
        progress: bool = True, log=print, rebuild_report: bool = True, lanes: int = kernels.LANES) -> RunResult:
    """Execute the workbook. Raises BadParameter before writing anything.

    A stage that fails does not stop the run: its executed notebook shows the error, the run log
    (runfolder.RUN_LOG) records it, the stages after it run on what there is, and the report names the
    gap. After the stages, StageFailed is raised naming every failure (its `result` is the RunResult).
    A run without the report stage rebuilds report.html/report.json from the folder (a few seconds),
    so the report never describes older results; rebuild_report=False leaves it as it was.

    A stage starts once the stages whose results it reads have ended (runfolder.Stage.reads); up to `lanes`
    stages run at once, each in a kernel of its own, where the machine holds that many kernels with the
    model (kernels.lanes_for); lanes=1 runs them one after another."""
    chosen, per_stage = plan(model, targets, out_dir, dict(user_params or {}), stages)
    out = Path(per_stage[0][1]["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():
        _io.write_text(out / MARKER, "A portkit run folder: `portkit run` writes its stage results here.\n")
    _io.remove_partials(out)   # what a killed run left
    result = RunResult(out)
    # The kernels papermill starts inherit this: nobody watches them, so stages skip widgets.
    os.environ.setdefault(HEADLESS_VARIABLE, "1")
    model_spec = per_stage[0][1]["model"]
    # a validated spec with ":" is file.py:factory (absolute now) or package.module:factory, which the
    # kernel (working in notebooks/) imports from the folder the user ran portkit in
    user_folder = os.getcwd() if ":" in model_spec and not model_spec.rpartition(":")[0].endswith(".py") else None
    with _kernel_environment(user_folder):
        _run_stages(per_stage, out, model_spec, progress, log, result, lanes)
    if rebuild_report and runfolder.REPORT not in {s.name for s in chosen}:
        from portkit.stages.report import stage as report
        try:
            report.build_report(out, per_stage[0][1]["targets"]).save(out)
            result.report_rebuilt = True
            log("[report] rebuilt from the run folder")
        except BadParameter as exc:          # no stage result at all: nothing to report on
            log(f"[report] not rebuilt: {exc}")
    if result.failures:
        failed = StageFailed("; ".join(f"stage {name} failed: {error}" for name, error in result.failures.items()))
        failed.result = result
        raise failed
    return result


def _reads(stage: Stage, targets) -> tuple[str, ...]:
    """The stages whose results `stage` reads in a run for `targets`: its declared ones, narrowed by its
    module's reads(targets) where it has one."""
    narrowed = getattr(importlib.import_module(stage.module), "reads", None)
    return tuple(narrowed(targets)) if narrowed is not None else stage.reads


def _model_parameters(out: Path, stage: Stage) -> int | None:
    """The model's parameter count from a stage's result (None where it has none)."""
    found = ((results.read_stage(out, stage.name) or {}).get("model") or {}).get("parameters")
    return found if isinstance(found, int) else None


def _run_stages(per_stage, out: Path, model_spec: str, progress: bool, log, result: RunResult, lanes: int) -> None:
    """Start each stage once the stages it reads have ended (or written the early file it needs: _unmet), in
    order, up to the lanes the machine holds, each in a kernel cleared when its last stage ended; record each
    as it ends (this thread alone writes the run log)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from tqdm.auto import tqdm

    from portkit.models import registry as models
    selected = {s.name for s, _ in per_stage}
    targets = per_stage[0][1]["targets"]
    waits = {s.name: set(_reads(s, targets)) & selected for s, _ in per_stage}
    pending, running, ended = list(per_stage), {}, []
    # the model's size for the lanes: a bound before it is loaded (None: one lane), then the stages' own count
    parameters = models.size_hint(model_spec)
    counted = False
    # the kernel's own start-up warnings (loopback TCP) are noise on the user's terminal
    free = [kernels.SharedKernel(lane=i, cwd=str(NOTEBOOKS), extra_arguments=["--IPKernelApp.log_level=ERROR"])
            for i in reversed(range(max(1, lanes)))]
    bar = tqdm(total=len(per_stage), desc="portkit", unit="stage", disable=not progress)
    clearing: dict = {}   # a kernel being cleared for the next stage as soon as its own stage has ended
    with ThreadPoolExecutor(max_workers=len(free)) as pool:
        try:
            while pending or running:
                now = kernels.lanes_for(parameters, lanes)
                for item in [p for p in pending if not _unmet(p[0], waits, ended, pending, out)]:
                    if len(running) >= now or not free:
                        break
                    stage, values = item
                    pending.remove(item)
                    # this run rewrites the stage's result: one from an earlier run must not outlive a failure now
                    (out / stage.result).unlink(missing_ok=True)
                    if stage.early:
                        (out / stage.early).unlink(missing_ok=True)
                    start = time.perf_counter()
                    try:
                        # an abstract model (no weights): a stage that runs values is skipped without its notebook
                        results.skip_if_abstract(model_spec, out, stage.name, values["targets"])
                    except StageSkipped as skipped:
                        _ended(stage, start, skipped, out, log, result)
                        ended.append(stage.name)
                        bar.update()
                        continue
                    kernel = next((k for k in reversed(free) if k.prepared), free[-1])   # a cleared one first
                    free.remove(kernel)
                    running[pool.submit(_execute, stage, values, out, progress, kernel)] = (
                        stage, start, kernel)
                if not running and not clearing:
                    continue
                bar.set_postfix_str(", ".join(s.name for s, _, _ in running.values()))
                # a stage that may start on a running stage's early file: look for it every quarter second
                early = any(_unmet(p[0], waits, ended, pending, out) & set(p[0].reads_early) for p in pending)
                for future in wait([*running, *clearing], timeout=0.25 if early else None,
                                   return_when=FIRST_COMPLETED)[0]:
                    if future in clearing:   # a failed clear leaves the kernel unprepared: its next stage retries
                        free.append(clearing.pop(future))
                        continue
                    stage, start, kernel = running.pop(future)
                    if pending:
                        clearing[pool.submit(kernel.prepare)] = kernel
                    else:
                        free.append(kernel)
                    try:
                        outcome = future.result()
                    except StageSkipped as skipped:      # the stage does not apply to the model: its result says why
                        outcome = skipped
                    _ended(stage, start, outcome, out, log, result)
                    ended.append(stage.name)
                    bar.update()
                    if not counted and (found := _model_parameters(out, stage)) is not None:
                        parameters, counted = found, True
            wait(clearing)
        finally:
            for kernel in [*free, *clearing.values(), *(k for _, _, k in running.values())]:
                kernel.close()   # a stage still running (an error, an interrupt) ends with its kernel
    bar.close()


def _unmet(stage: Stage, waits: dict, ended: list, pending: list, out: Path) -> set[str]:
    """The stages `stage` still waits for: those it reads that have not ended, except one whose early file
    (runfolder.Stage.early) is all it needs and that this run's stage has written."""
    waiting = {s.name for s, _ in pending}   # not started yet
    return {read for read in waits[stage.name] - set(ended)
            if not (read in stage.reads_early and read not in waiting
                    and (out / runfolder.stage(read).early).exists())}


def _ended(stage: Stage, start: float, outcome, out: Path, log, result: RunResult) -> None:
    """Record how a stage ended: skipped (outcome is the StageSkipped), failed (its one-line error) or ok (None)."""
    seconds = result.seconds[stage.name] = time.perf_counter() - start
    if isinstance(outcome, StageSkipped):
        runfolder.record(out, stage.name, "skipped", seconds, str(outcome))
        result.summaries[stage.name] = f"skipped: {outcome}"
        log(f"[{stage.name}] skipped: {outcome} ({seconds:.0f} s)")
        return
    runfolder.record(out, stage.name, "failed" if outcome else "ok", seconds, outcome or "")
    if outcome:
        result.failures[stage.name] = outcome
        log(f"[{stage.name}] FAILED: {outcome} ({seconds:.0f} s)")
        return
    result.summaries[stage.name] = _summary(out / stage.result)
    log(f"[{stage.name}] {result.summaries[stage.name]} ({seconds:.0f} s)")


def _execute(stage: Stage, values: dict, out: Path, progress: bool, kernel: kernels.SharedKernel) -> str | None:
    """Run one stage notebook into the run folder; None, or the failure's one line."""
    km = kernel.for_stage()   # first: a new kernel starts up while papermill is imported
    import papermill
    from papermill.exceptions import PapermillExecutionError
    output = out / stage.notebook
    partial = _io.partial_path(output)
    try:
        papermill.execute_notebook(
            str(NOTEBOOKS / stage.notebook), str(partial), parameters=values, kernel_name=kernels.KERNEL,
            km=km,
            progress_bar={"desc": f"  {stage.name} cells", "leave": False, "position": kernel.lane + 1}
            if progress else False,
            # the stage's own progress bars (portkit.core.progress: text on the kernel's stderr) reach the terminal
            stderr_file=sys.stderr if progress else None, request_save_on_cell_execute=True)
    except PapermillExecutionError as exc:
        os.replace(partial, output)   # papermill saved it whole before raising: the error cell shows
        last = exc.evalue.strip().splitlines()[-1] if exc.evalue.strip() else ""
        if exc.ename == StageSkipped.__name__:
            raise StageSkipped(last) from None
        return (f"cell {exc.exec_count} of {stage.notebook} raised {exc.ename}: {last}; "
                f"the executed notebook is {output}")
    except Exception:
        if kernel.closed:
            partial.unlink(missing_ok=True)   # the run stopped it (an interrupt, another stage's error)
        else:
            _keep_if_whole(partial, output)   # a dead kernel: show how far it got
        raise
    except BaseException:
        partial.unlink(missing_ok=True)   # interrupted, perhaps mid-save
        raise
    os.replace(partial, output)
    return None
