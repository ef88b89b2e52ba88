"""The workbook runner: execute the stage notebooks in order with papermill into one run folder.

    >>> from portkit.run import runner
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
so a killed run leaves no half-written notebook. A stage that fails does not stop the run: its executed
notebook is moved into place showing the error, the stages after it still run, and StageFailed names every
failure at the end.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from portkit.core import atomic_io
from portkit.core import checks
from portkit.core import memory
from portkit.corpora import audio
from portkit.corpora import corpus as data
from portkit.corpora import images
from portkit.run import jupyter_kernels
from portkit.stages import options
from portkit.runfolder import results
from portkit.runfolder import layout
from portkit.core.errors import BadParameter, PortkitError, StageFailed, StageSkipped
from portkit.core.locations import NOTEBOOKS
from portkit.core.progress import HEADLESS_VARIABLE, watched
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
    """A value typed on the command line, read the way the notebook's default is written: a Python literal, else
    JSON (true, null). Text where a list belongs, or a list or dict that does not parse, is BadParameter saying
    so (and where it breaks); other text passes through for the parameter's own check."""
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
        pass
    try:
        return json.loads(raw)
    except ValueError as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else exc
    if raw.lstrip().startswith(("[", "{")):
        raise BadParameter(name, raw, hint=f"malformed JSON ({where})")
    if isinstance(default_value, (list, tuple)):
        example = json.dumps(default_value[:1] or ["..."])
        raise BadParameter(name, raw, hint=f"must be a list, not a single value; e.g. -p {name} '{example}'")
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
    # model and out come back absolute; the targets' mode lines wait until the whole plan holds (run prints them)
    model, names, out = options.common(model, targets, out_dir, announce=False)
    per_stage = []
    for stage in chosen:
        mine = declared_parameters(stage)
        values = {"model": model, "targets": names, "out_dir": str(out)}
        values.update({k: v for k, v in user_params.items() if k in mine})
        _preflight(stage, values)
        per_stage.append((stage, values))
    loaded = _Loaded(model)
    _check_sizes(per_stage, user_params, loaded)
    _check_corpora(per_stage, loaded)
    _check_memory(per_stage, user_params, loaded)
    _probe_factory(loaded)
    check_out_dir(out)   # last: its probe is the one step that touches the disk
    return chosen, per_stage


_NO_DEFAULT = object()


def _default(declared: dict, name: str):
    """A notebook parameter's default value; _NO_DEFAULT for an expression the notebook evaluates."""
    try:
        return ast.literal_eval(declared[name]["default"])
    except (KeyError, ValueError, SyntaxError):
        return _NO_DEFAULT


def _preflight(stage: Stage, values: dict) -> None:
    """Check the stage's options (its notebook's defaults overridden by the user's values) and its rules on the
    run's targets, before anything is written."""
    chosen = importlib.import_module(stage.module).Options.of(values, model=values.get("model"))
    chosen.check_targets(values["targets"])


class _Loaded:
    """The run's model, loaded in the plan step only where a check needs it (once)."""

    def __init__(self, spec: str):
        self.spec, self._model = spec, None

    def get(self):
        if self._model is None:
            from portkit.models import registry
            self._model = registry.load(self.spec)
        return self._model


SEQ_PARAMETERS = ("seq_len",)   # tokens of a batch's every text: at most the model's maximum


def _check_sizes(per_stage, user_params: dict, loaded: _Loaded) -> None:
    """A sequence length the user gave is at most the model's own maximum (its max_position_embeddings): the
    model is loaded for it, where it is one with weights and takes tokens."""
    from portkit.models import abstract
    given = {name: user_params[name] for name in SEQ_PARAMETERS if name in user_params}
    if not given or abstract.is_name(loaded.spec):
        return
    try:
        model = loaded.get()
    except Exception:   # noqa: BLE001 (a model that does not build fails in its first stage, which shows how)
        return
    if model.seq_dim != "tokens":
        return
    for name, value in given.items():
        if value > model.max_length:
            raise BadParameter(name, value, hint=f"{model.name} takes at most {model.max_length} tokens")


MEMORY_PARAMETERS = ("batch_size", "seq_len")   # what sizes stage 4's main batch


def _check_memory(per_stage, user_params: dict, loaded: _Loaded) -> None:
    """Stage 4's main batch against the machine's memory where the user sized it (MEMORY_PARAMETERS; the defaults are
    measured to fit every built-in model, benchmarks/bench_memory.py): a batch that cannot fit the machine is
    BadParameter naming the batch_size that fits (accuracy.stage.check_memory); one beyond the memory available now
    is a warning on stderr, since what other processes hold changes. A model that does not build, or a batch that
    cannot be made, is left to the stage, whose notebook shows why."""
    from portkit.models import abstract
    chosen = [values for stage, values in per_stage if stage.name == "accuracy"]
    if not chosen or not set(MEMORY_PARAMETERS) & set(user_params) or abstract.is_name(loaded.spec):
        return
    from portkit.stages.accuracy import stage as accuracy
    try:
        model = loaded.get()
        warning = accuracy.check_memory(model, chosen[0])
    except BadParameter:
        raise
    except Exception:   # noqa: BLE001 (the stage meets the same error and shows where)
        return
    if warning:
        print(f"portkit: warning: {warning}", file=sys.stderr)


def _check_corpora(per_stage, loaded: _Loaded) -> None:
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
            data.check_folder_for(loaded.get(), corpus)
        if data.is_folder(corpus) and audio.holds_audio(Path(corpus).expanduser()):
            audio.folder_corpus(corpus)      # every file's header read: an unreadable one fails here
        elif data.is_folder(corpus):
            images.check_folder(corpus)      # likewise every image's header
        else:
            data.load_corpus(corpus, column)
        checked.add((corpus, column))


PROBE_TEXT = "A short text to probe the model's forward."


def _probe_factory(loaded: _Loaded) -> None:
    """A model from the user's factory (module:factory, file.py:factory) is built in the plan step and called once
    on one item: a model whose weights are on the meta device (shapes, no values) and a forward that returns
    something other than a tensor, a tuple or a dict fail here in one line, not mid-stage. A factory or a forward
    that raises is left to stage 1, whose notebook shows where."""
    import torch
    from portkit.models import inputs
    if ":" not in loaded.spec:
        return
    try:
        model = loaded.get()     # a factory returning the wrong type is BadParameter: it stops here
    except PortkitError:
        raise
    except Exception:   # noqa: BLE001 (a factory that raises: stage 1's notebook shows where)
        return
    meta = [name for name, t in [*model.module.named_parameters(), *model.module.named_buffers()] if t.is_meta]
    if meta:
        raise BadParameter("model", loaded.spec, hint=f"its factory built it on the meta device: {len(meta)} "
                           f"tensor(s), first {meta[0]}, have shapes and no values (no weights); build it with its "
                           "weights, or give a real-size model without weights as its config folder "
                           "(docs/guides/real-size.md)")
    try:
        declaration = model.declaration
        own = declaration.own_items() if declaration.own_items else None
        items = own[:1] if own else {inputs.TEXT: [PROBE_TEXT]}.get(declaration.data)
        if items is None and declaration.data == inputs.IMAGE and model.image_size:
            items = images.sample_images(1, model.image_size, 0, channels=data.image_channels(model))
        batch = model.encode(list(items)) if items is not None else None
    except Exception:   # noqa: BLE001 (no items to probe with: the stages build their own batches)
        return
    if batch is None:
        return
    try:
        with torch.no_grad():
            out = model.module(**batch)
    except PortkitError:
        raise
    except Exception:   # noqa: BLE001 (stage 1 shows the forward's error where it is raised)
        return
    if not isinstance(out, (torch.Tensor, tuple, list, dict)):
        raise BadParameter(f"forward of {model.name}", type(out).__name__,
                           hint="forward must return a tensor, a tuple or a dict of tensors")


def check_out_dir(out: Path) -> None:
    """The run folder is a new folder that can be created, or a run folder that can be written."""
    what = "out folder"
    if out.is_symlink() and not out.exists():   # a loop or a broken link: mkdir would fail mid-run
        raise BadParameter(what, str(out), hint=checks.missing_path(out))
    if out.exists() and not out.is_dir():
        raise BadParameter(what, str(out), hint="it is a file, not a folder")
    _refuse_inside_a_run(out)
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


def _refuse_inside_a_run(out: Path) -> None:
    """A run folder is never made inside another run's folder (one holding MARKER): the outer run's rerun, report
    and export would meet a folder that is not theirs, and removing one run would remove the other."""
    outer = next((parent for parent in out.parents if (parent / MARKER).is_file()), None)
    if outer is not None:
        raise BadParameter("out folder", str(out), hint=f"it is inside the run folder {outer} (which holds {MARKER}); "
                                                        "give a folder outside any run")


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
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", *jupyter_kernels.ENVIRONMENT)}
    if folder is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, before["PYTHONPATH"]) if p)
    for key, value in jupyter_kernels.ENVIRONMENT.items():
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


@dataclass(frozen=True)
class RunSettings:
    """How a run goes beyond what its stages compute: up to `lanes` stages side by side (run's docstring), and
    whether a run without the report stage rebuilds report.html/report.json after its stages."""
    lanes: int = jupyter_kernels.LANES
    rebuild_report: bool = True


def run(model: str, targets, out_dir: str, user_params: dict | None = None, stages=None,
        progress: bool = True, log=print, settings: RunSettings = RunSettings()) -> RunResult:
    """Execute the workbook. Raises BadParameter before writing anything.

    Each stage that ends gets one line through `log`. progress=True draws progress bars where someone watches
    stdout (progress.watched: a terminal, not a file or a pipe), each stage's line then printed on a line of
    its own above the run's bar.

    A stage that fails does not stop the run: its executed notebook shows the error, the run log
    (runfolder.RUN_LOG) records it, the stages after it run on what there is, and the report names the
    gap. After the stages, StageFailed is raised naming every failure (its `result` is the RunResult).
    A run without the report stage rebuilds report.html/report.json from the folder (a few seconds),
    so the report never describes older results; settings.rebuild_report=False leaves it as it was.

    A stage starts once the stages whose results it reads have ended (runfolder.Stage.reads); up to settings.lanes
    stages run at once, each in a kernel of its own, where the machine holds that many kernels with the
    model (kernels.lanes_for); RunSettings(lanes=1) runs them one after another."""
    chosen, per_stage = plan(model, targets, out_dir, dict(user_params or {}), stages)
    for line in options.announce_targets(per_stage[0][1]["targets"]):   # bad input stopped before: its line alone
        log(line)
    out = Path(per_stage[0][1]["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    try:
        with layout.hold(out):
            return _run_held(chosen, per_stage, out, progress, log, settings)
    except layout.FolderInUse as exc:
        raise BadParameter("out folder", str(out), hint=f"in use by another run (process {exc.pid}); wait for it "
                                                        "to end, or give another --out") from None


def _run_held(chosen, per_stage, out: Path, progress: bool, log, settings: RunSettings) -> RunResult:
    """run() in a run folder it holds (runfolder.hold)."""
    if not (out / MARKER).exists():
        atomic_io.write_text(out / MARKER, "A portkit run folder: `portkit run` writes its stage results here.\n")
    atomic_io.remove_partials(out)   # what a killed run left
    result = RunResult(out)
    # bars where someone watches (asked before this process is marked headless); a log file gets lines alone
    shown = progress and watched()
    # The kernels papermill starts inherit this: nobody watches them, so stages skip widgets.
    os.environ.setdefault(HEADLESS_VARIABLE, "1")
    model_spec = per_stage[0][1]["model"]
    # a validated spec with ":" is file.py:factory (absolute now) or package.module:factory, which the
    # kernel (working in notebooks/) imports from the folder the user ran portkit in
    user_folder = os.getcwd() if ":" in model_spec and not model_spec.rpartition(":")[0].endswith(".py") else None
    with _kernel_environment(user_folder):
        _run_stages(per_stage, _Run(out, model_spec, shown, _Printer(len(per_stage), shown, log), result,
                                    lanes=settings.lanes), settings.lanes)
    if settings.rebuild_report and layout.REPORT not in {s.name for s in chosen}:
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
    return results.model_parameters(out, stage.name)


class _Printer:
    """What a run shows as its stages end: each one's line through `log`; where progress is shown, a bar of
    the stages besides, cleared (with the stages' cell bars) before each line so that the line starts a line
    of its own, not glued onto a bar, and drawn again below it."""

    def __init__(self, total: int, progress: bool, log):
        from tqdm.auto import tqdm
        self.log = log
        self.bar = tqdm(total=total, desc="portkit", unit="stage", disable=not progress)

    def running(self, names) -> None:
        self.bar.set_postfix_str(", ".join(names))

    def ended(self, line: str) -> None:
        if self.bar.disable:
            self.log(line)
        else:
            with type(self.bar).external_write_mode():
                self.log(line)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


class _PeakMemory:
    """The largest resident memory this process and its children (the kernels) held together, sampled every
    `every` seconds on a daemon thread while the stages run (psutil), to say what a dead kernel had reached."""

    def __init__(self, every: float = 0.5):
        import threading
        self.peak, self.every, self._stop = 0, every, threading.Event()
        self._thread = threading.Thread(target=self._sample, name="portkit-peak-memory", daemon=True)

    def _sample(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += process.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


class _KernelDied(Exception):
    """A stage's kernel process died mid-stage (nbclient's DeadKernelError): its exit status (negative: the signal
    that killed it, as subprocess reports it; None: not known), the stage's batch size and its executed notebook."""

    def __init__(self, stage: str, status: int | None, batch_size, notebook: Path):
        super().__init__(stage)
        self.status, self.batch_size, self.notebook = status, batch_size, notebook


# The share of the machine's memory the run's processes must have reached for a kernel killed by SIGKILL to be
# called likely out of memory (the Linux OOM killer sends SIGKILL; a kill far below the machine's memory is
# something else: a container's own limit, or a person)
OOM_SHARE = 0.5


def _kernel_died(stage: Stage, peak: int, died: _KernelDied, lanes: int) -> str:
    """The one line a dead kernel's stage fails with: what is known (the kernel died, how it ended, the run's
    memory peak against the machine's) and, where memory is the likely cause, only what the run has not done
    already (one kernel at a time, a batch of one); otherwise where to look."""
    import psutil
    import signal
    total = psutil.virtual_memory().total
    if died.status is None:
        how = "its exit status is not known"
    elif died.status < 0:
        number = -died.status
        try:
            how = f"killed by {signal.Signals(number).name} (signal {number})"
        except ValueError:
            how = f"killed by signal {number}"
    else:
        how = f"it exited with code {died.status}"
    reached = f"the run's processes had reached {peak / 2**30:.1f} GiB of the machine's {total / 2**30:.1f} GiB" \
        if peak else f"the run's memory peak was not sampled (the machine has {total / 2**30:.1f} GiB)"
    line = f"the kernel running stage {stage.name} ({stage.notebook}) died, {how}; {reached}"
    if died.status == -signal.SIGKILL and peak >= OOM_SHARE * total:
        left = [text for text, done in (("one kernel at a time (--lanes 1)", lanes <= 1),
                                        ("a smaller -p batch_size", not isinstance(died.batch_size, int)
                                         or died.batch_size <= 1)) if not done]
        return line + ("; likely out of memory (the Linux OOM killer sends SIGKILL): run with less: " +
                       " or ".join(left) if left else "; likely out of memory (the Linux OOM killer sends SIGKILL), "
                       "with one kernel and a batch of one already: it needs a machine with more memory")
    return line + f"; the executed notebook {died.notebook} shows the last cell that ran"


@dataclass
class _Run:
    """What starting, running and recording a stage read: the run folder, the model, whether progress shows,
    the printer, the result being filled in, and the peak memory sampled while the stages run."""
    out: Path
    model_spec: str
    progress: bool
    printer: _Printer
    result: RunResult
    memory: _PeakMemory = field(default_factory=_PeakMemory)
    lanes: int = jupyter_kernels.LANES   # the most stages the run allowed at once (RunSettings.lanes)


@dataclass
class _Schedule:
    """The stages of a run: waiting (pending, each with the stages it reads: waits), running ({future: (stage,
    start, kernel)}) and ended; the kernels free or being cleared ({future: kernel}); and the model's size for
    the lanes: a bound before it is loaded (None: one lane), then the first count a stage reports (counted)."""
    pending: list
    waits: dict
    free: list
    parameters: int | None
    running: dict = field(default_factory=dict)
    clearing: dict = field(default_factory=dict)
    ended: list = field(default_factory=list)
    counted: bool = False

    def ready(self, out: Path) -> list:
        """The waiting stages whose reads have ended (or written the early file they need), in order."""
        return [p for p in self.pending if not _unmet(p[0], self.waits, self.ended, self.pending, out)]

    def polls_early(self, out: Path) -> bool:
        """Whether a waiting stage may start on a running stage's early file (which nothing signals)."""
        return any(_unmet(p[0], self.waits, self.ended, self.pending, out) & set(p[0].reads_early)
                   for p in self.pending)

    def take_kernel(self) -> jupyter_kernels.SharedKernel:
        kernel = next((k for k in reversed(self.free) if k.prepared), self.free[-1])   # a cleared one first
        self.free.remove(kernel)
        return kernel

    def all_kernels(self) -> list:
        return [*self.free, *self.clearing.values(), *(k for _, _, k in self.running.values())]


def _run_stages(per_stage, run: _Run, lanes: int) -> None:
    """Start each stage once the stages it reads have ended (or written the early file it needs: _unmet), in
    order, up to the lanes the machine holds, each in a kernel cleared when its last stage ended; record each
    as it ends (this thread alone writes the run log)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from portkit.models import registry
    selected = {s.name for s, _ in per_stage}
    targets = per_stage[0][1]["targets"]
    # the kernel's own start-up warnings (loopback TCP) are noise on the user's terminal
    free = [jupyter_kernels.SharedKernel(lane=i, cwd=str(NOTEBOOKS), extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                 log=run.out / layout.KERNEL_LOG)
            for i in reversed(range(max(1, lanes)))]
    schedule = _Schedule(list(per_stage), {s.name: set(_reads(s, targets)) & selected for s, _ in per_stage},
                         free, registry.size_hint(run.model_spec))
    with ThreadPoolExecutor(max_workers=len(free)) as pool, run.memory:
        try:
            while schedule.pending or schedule.running:
                _start_ready(schedule, pool, run, lanes)
                if not schedule.running and not schedule.clearing:
                    continue
                run.printer.running(s.name for s, _, _ in schedule.running.values())
                # a stage that may start on a running stage's early file: look for it every quarter second
                for future in wait([*schedule.running, *schedule.clearing], return_when=FIRST_COMPLETED,
                                   timeout=0.25 if schedule.polls_early(run.out) else None)[0]:
                    _collect(future, schedule, pool, run)
            wait(schedule.clearing)
        except KeyboardInterrupt:
            raise RunInterrupted(run.out, _stop_interrupted(schedule, run)) from None
        finally:
            for kernel in schedule.all_kernels():
                kernel.close()   # a stage still running (an error, an interrupt) ends with its kernel
    run.printer.close()


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during the stages: the kernels were stopped, each stage that was running is recorded in the run log
    as interrupted (its result removed), the stages that had ended keep theirs; the same command runs them again."""

    def __init__(self, out: Path, stopped: list[str]):
        self.out, self.stopped = out, stopped
        which = f"stage(s) {', '.join(stopped)} stopped and recorded as interrupted in {out / layout.RUN_LOG}" \
            if stopped else f"no stage was running; the run log {out / layout.RUN_LOG} holds the stages that ended"
        super().__init__(f"interrupted: {which}; rerun the same command to run them again")


@contextlib.contextmanager
def _quiet_stop():
    """While an interrupted run stops: a second Ctrl-C is ignored (the main thread only can set it), and the kernel
    libraries' log lines about the kernels being killed (nbclient's "Kernel died", asyncio's) stay off the terminal."""
    import logging
    import signal
    import threading
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    loggers = [logging.getLogger(name) for name in ("papermill", "nbclient", "traitlets", "asyncio", "")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        if main:
            signal.signal(signal.SIGINT, before)


def _stop_interrupted(schedule: _Schedule, run: _Run) -> list[str]:
    """Ctrl-C: kill every kernel (a stage mid-cell stops writing at once), wait for the stages' threads, record a
    stage that ended meanwhile as it ended and each one still running as interrupted, its result and early file
    removed (a result of a stopped stage is not one), and remove the partial files. Returns the stopped stages."""
    from concurrent.futures import wait
    stopped = []
    with _quiet_stop():
        for kernel in schedule.all_kernels():
            kernel.kill()
        wait([*schedule.running, *schedule.clearing])
        for kernel in schedule.all_kernels():
            with contextlib.suppress(Exception):   # the kernel is dead: only its manager's files are left
                kernel.close()
        for future, (stage, start, _) in schedule.running.items():
            outcome = future.exception() or future.result()
            if outcome is None or isinstance(outcome, (str, StageSkipped)):   # it ended before the kill
                _ended(stage, start, outcome, run)
                continue
            (run.out / stage.result).unlink(missing_ok=True)
            if stage.early:
                (run.out / stage.early).unlink(missing_ok=True)
            layout.record(run.out, stage.name, layout.INTERRUPTED, time.perf_counter() - start,
                             "interrupted (Ctrl-C) before it ended; rerun the stage")
            stopped.append(stage.name)
        atomic_io.remove_partials(run.out)
        run.printer.close()
    return stopped


def _start_ready(schedule: _Schedule, pool, run: _Run, lanes: int) -> None:
    """Start the stages that are ready, in order, while a lane and a kernel are free; a stage an abstract
    model (no weights) cannot run ends skipped without its notebook."""
    now = jupyter_kernels.lanes_for(schedule.parameters, lanes)
    for item in schedule.ready(run.out):
        if len(schedule.running) >= now or not schedule.free:
            break
        stage, values = item
        schedule.pending.remove(item)
        # this run rewrites the stage's result: one from an earlier run must not outlive a failure now
        (run.out / stage.result).unlink(missing_ok=True)
        if stage.early:
            (run.out / stage.early).unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            results.skip_if_abstract(run.model_spec, run.out, stage.name, values["targets"])
        except StageSkipped as skipped:
            _ended(stage, start, skipped, run)
            schedule.ended.append(stage.name)
            continue
        kernel = schedule.take_kernel()
        schedule.running[pool.submit(_execute, stage, values, run.out, run.progress, kernel)] = (stage, start, kernel)


def _collect(future, schedule: _Schedule, pool, run: _Run) -> None:
    """A future that finished: a cleared kernel is free again (a failed clear leaves it unprepared: its next
    stage retries); a stage that ended is recorded, its kernel cleared for the next stage, and the first count
    of the model's parameters it reports sizes the lanes from then on."""
    if future in schedule.clearing:
        schedule.free.append(schedule.clearing.pop(future))
        return
    stage, start, kernel = schedule.running.pop(future)
    peak = kernel.peak_memory()   # before the kernel is cleared for the next stage
    if schedule.pending:
        schedule.clearing[pool.submit(kernel.prepare)] = kernel
    else:
        schedule.free.append(kernel)
    try:
        outcome = future.result()
    except StageSkipped as skipped:      # the stage does not apply to the model: its result says why
        outcome = skipped
    except _KernelDied as died:          # a failure of the stage (the report names the gap), not a traceback
        outcome = _kernel_died(stage, run.memory.peak, died, run.lanes)
    _ended(stage, start, outcome, run, peak)
    schedule.ended.append(stage.name)
    if not schedule.counted and (found := _model_parameters(run.out, stage)) is not None:
        schedule.parameters, schedule.counted = found, True


def _unmet(stage: Stage, waits: dict, ended: list, pending: list, out: Path) -> set[str]:
    """The stages `stage` still waits for: those it reads that have not ended, except one whose early file
    (runfolder.Stage.early) is all it needs and that this run's stage has written."""
    waiting = {s.name for s, _ in pending}   # not started yet
    return {read for read in waits[stage.name] - set(ended)
            if not (read in stage.reads_early and read not in waiting
                    and (out / layout.stage(read).early).exists())}


def _ended(stage: Stage, start: float, outcome, run: _Run, peak: int | None = None) -> None:
    """Record how a stage ended: skipped (outcome is the StageSkipped), failed (its one-line error) or ok (None),
    with its kernel's peak resident memory (`peak` bytes, None: not measured)."""
    out, result = run.out, run.result
    seconds = result.seconds[stage.name] = time.perf_counter() - start
    if isinstance(outcome, StageSkipped):
        layout.record(out, stage.name, "skipped", seconds, str(outcome), peak)
        result.summaries[stage.name] = f"skipped: {outcome}"
        run.printer.ended(f"[{stage.name}] skipped: {outcome} ({seconds:.0f} s)")
        return
    layout.record(out, stage.name, "failed" if outcome else "ok", seconds, outcome or "", peak)
    if outcome:
        result.failures[stage.name] = outcome
        run.printer.ended(f"[{stage.name}] FAILED: {outcome} ({seconds:.0f} s)")
        return
    result.summaries[stage.name] = _summary(out / stage.result)
    used = f", peak {memory.gib(peak)}" if peak is not None else ""
    run.printer.ended(f"[{stage.name}] {result.summaries[stage.name]} ({seconds:.0f} s{used})")


# Lines the libraries under a stage write to the kernel's stderr that are no news to the user: libtpu's host-bounds
# warning (it looks for a TPU's metadata; compile-only stage 3b has no TPU by design) and glog-style lines of XLA's
# C++ ("W1205 08:22:21.123 ..."). They go to the run's kernel log, not to the terminal.
LIBRARY_NOISE = re.compile(r"Failed to find host bounds for accelerator type|could not determine TPU accelerator "
                           r"type|^[IWE]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)


class _StageStderr:
    """The kernel's stderr stream as papermill forwards it (stderr_file): the stage's progress bars to the terminal,
    LIBRARY_NOISE to the run's kernel log."""

    def __init__(self, terminal, log: Path):
        self.terminal, self.log = terminal, log

    def write(self, text: str) -> int:
        if LIBRARY_NOISE.search(text):
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(text if text.endswith("\n") else text + "\n")
        else:
            self.terminal.write(text)
        return len(text)

    def flush(self) -> None:
        self.terminal.flush()


def _execute(stage: Stage, values: dict, out: Path, progress: bool, kernel: jupyter_kernels.SharedKernel) -> str | None:
    """Run one stage notebook into the run folder; None, or the failure's one line."""
    km = kernel.for_stage()   # first: a new kernel starts up while papermill is imported
    kernel.reset_peak()       # the stage's own peak memory from here (run.json's peak_memory_bytes)
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError
    output = out / stage.notebook
    partial = atomic_io.partial_path(output)
    with open(out / layout.KERNEL_LOG, "a", encoding="utf-8") as log:
        log.write(f"---- stage {stage.name} ({stage.notebook}) starts in kernel lane {kernel.lane}\n")
    try:
        papermill.execute_notebook(
            str(NOTEBOOKS / stage.notebook), str(partial), parameters=values, kernel_name=jupyter_kernels.KERNEL,
            km=km,
            progress_bar={"desc": f"  {stage.name} cells", "leave": False, "position": kernel.lane + 1}
            if progress else False,
            # the stage's own progress bars (portkit.core.progress: text on the kernel's stderr) reach the terminal
            stderr_file=_StageStderr(sys.stderr, out / layout.KERNEL_LOG) if progress else None,
            request_save_on_cell_execute=True)
    except PapermillExecutionError as exc:
        os.replace(partial, output)   # papermill saved it whole before raising: the error cell shows
        last = exc.evalue.strip().splitlines()[-1] if exc.evalue.strip() else ""
        if exc.ename == StageSkipped.__name__:
            raise StageSkipped(last) from None
        return (f"cell {exc.exec_count} of {stage.notebook} raised {exc.ename}: {last}; "
                f"the executed notebook is {output}")
    except DeadKernelError:
        if kernel.closed:
            partial.unlink(missing_ok=True)
            raise
        _keep_if_whole(partial, output)   # shows how far it got
        batch = values.get("batch_size", _default(declared_parameters(stage), "batch_size"))
        raise _KernelDied(stage.name, kernel.exit_status(), batch, output) from None
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
