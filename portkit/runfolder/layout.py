"""The run folder: which stage writes which file, how a run folder is recognised, and the run log.

    >>> from portkit.runfolder import layout
    >>> [s.name for s in layout.STAGES]
    ['fallbacks', 'compile', 'buckets', 'xla', 'accuracy', 'report']
    >>> layout.read_log("runs/minilm")["stages"]["compile"]["status"]         # "ok" or "failed"
    'ok'

A foundation: the runner, the report and the sweep read the layout from here, so no stage or
orchestrator imports another to learn it. The run log (RUN_LOG) records how each stage of the latest
`portkit run` ended; a stage that failed leaves no result file, and the report names the failure from
the log (read by runfolder.run_log) rather than only calling the result "missing".
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from portkit.core import atomic_io


def result_file(name: str) -> str:
    """The file a stage writes its result to in the run folder: <stage>.json."""
    return f"{name}.json"


@dataclass(frozen=True)
class Stage:
    name: str
    notebook: str
    module: str          # its portkit module; its Options are checked before anything is written
    needs_weights: bool = True   # runs the model on values: skipped for an abstract model (no weights)
    # the earlier stages whose results it reads (portkit.runfolder.results): it starts once they have
    # ended; its module's reads(targets), where there is one, narrows them for the targets of a run
    reads: tuple[str, ...] = ()
    # a file it writes before it ends, that a later stage may start on (stage 3's chosen plans, before its replay)
    early: str | None = None
    # of its reads, those whose early file is all it needs: it may start once that file is written
    reads_early: tuple[str, ...] = ()
    # of its reads, those it reads in a later cell only: it may start once they have started, and that cell waits
    # while they run (running_marker, results.wait_while_running)
    reads_late: tuple[str, ...] = ()

    @property
    def result(self) -> str:
        return result_file(self.name)


STAGES: tuple[Stage, ...] = (
    Stage("fallbacks", "01_fallbacks.ipynb", "portkit.stages.fallbacks.stage"),
    # compile: eager findings, compiled
    Stage("compile", "02_compile.ipynb", "portkit.stages.compile.stage", reads=("fallbacks",),   # to reconcile
          reads_late=("fallbacks",)),
    Stage("buckets", "03_buckets.ipynb", "portkit.stages.buckets.stage", reads=("compile",),   # compile times natively
          early="buckets.plan.json"),
    # xla: stage 2's fixed shape, stage 3's chosen and serving plans (its early file holds them)
    Stage("xla", "03b_xla.ipynb", "portkit.stages.xla.stage", needs_weights=False, reads=("compile", "buckets"),
          reads_early=("buckets",)),
    # accuracy: the chosen bucket plans
    Stage("accuracy", "04_accuracy.ipynb", "portkit.stages.accuracy.stage", reads=("buckets",),
          reads_early=("buckets",)),
    Stage("report", "05_report.ipynb", "portkit.stages.report.stage", needs_weights=False,
          reads=("fallbacks", "compile", "buckets", "xla", "accuracy")),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
REPORT = "report"
MARKER = ".portkit-run"   # marks a run folder: `portkit run` writes it, and writes into no foreign folder
RUN_LOG = "run.json"      # how each stage of the latest run ended
LOCK = ".portkit-lock"    # held by the run writing into the folder (hold), naming its process id
KERNEL_LOG = "kernels.log"   # the kernels' own output (libraries' C++ warnings), each stage's start marked
RUN_FILES = frozenset({MARKER, RUN_LOG, LOCK, KERNEL_LOG, "report.html", *(s.notebook for s in STAGES),
                       *(s.result for s in STAGES), *(s.early for s in STAGES if s.early)})


def model_tag(spec: str) -> str:
    """The folder name of a model's runs (runs/<tag>): the last part of its name or path."""
    return os.path.basename(os.path.normpath(spec)).replace(":", "-") or "model"


def stage(name: str) -> Stage:
    return next(s for s in STAGES if s.name == name)


def is_run_folder(folder: Path) -> bool:
    """A folder `portkit run` may write into: it holds MARKER, or nothing but files a run writes (an
    empty folder, one the notebooks wrote on their own, one written before the marker existed)."""
    folder = Path(folder)
    if (folder / MARKER).is_file():
        return True
    return all(entry.name in RUN_FILES or atomic_io.is_partial(entry.name) for entry in folder.iterdir())


REPORT_JSON, REPORT_HTML = "report.json", "report.html"


def read_report(folder) -> dict:
    """The run folder's report.json, where its report.html is there too: the report stage's save writes the pair
    under partial names and renames the HTML first, the JSON last, so a JSON without its HTML is an interrupted
    save. FileNotFoundError without report.json, IncompleteReport without its HTML, ValueError if unreadable."""
    folder = Path(folder)
    saved = atomic_io.read_json(folder / REPORT_JSON)
    if not (folder / REPORT_HTML).is_file():
        raise IncompleteReport(f"{folder / REPORT_JSON} has no {REPORT_HTML} beside it (an interrupted save); "
                               "rebuild it with `portkit report`")
    return saved


class IncompleteReport(ValueError):
    """report.json without report.html: a save that did not finish."""


class FolderInUse(Exception):
    """Another live process holds the run folder's LOCK; `pid` is its process id (None where unreadable)."""

    def __init__(self, folder, pid):
        self.folder, self.pid = folder, pid
        super().__init__(f"{folder} is in use by another run (process {pid if pid is not None else '?'})")


@contextlib.contextmanager
def hold(folder):
    """Hold the run folder for one run: an exclusive flock on LOCK, which names this process. The kernel drops a
    flock when its process ends however it ends (flock(2)), so the lock of a killed run is stale at once and is
    taken over here; another live holder raises FolderInUse with its process id."""
    import fcntl
    path = Path(folder) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUse(folder, _lock_pid(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)   # releases the flock; the file stays (removing it would race the next run's open)


def _lock_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def read_log(folder) -> dict:
    """The run log as run_log.record extends it, or an empty one where no run wrote it (notebooks run by hand) or it is
    unreadable; a reader of the log reads it as a type (runfolder.run_log), which names a damaged one."""
    try:
        log = json.loads((Path(folder) / RUN_LOG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"stages": {}}
    return log if isinstance(log, dict) and isinstance(log.get("stages"), dict) else {"stages": {}}


INTERRUPTED = "interrupted"   # a stage stopped by Ctrl-C: its kernel was stopped and its result removed


def running_marker(name: str) -> str:
    """The file in the run folder that says stage `name` is running in a `portkit run`: written when its kernel starts
    on it, holding the run's process id, removed when it ends (a stage that reads it late waits while it is there)."""
    return f".{name}.running"


def notebook_images(run_dir, stages) -> tuple[list[tuple[str, str]], list[str]]:
    """PNG plots (base64) from the executed notebooks of `stages` (names) in the run folder, in that order,
    each labelled "stage (notebook)"; and a line for each notebook that is there but cannot be read."""
    images, gaps = [], []
    for name in stages:
        notebook = stage(name).notebook
        path = Path(run_dir) / notebook
        if not path.exists():
            continue
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
            for cell in nb.get("cells", []):
                for output in cell.get("outputs", []):
                    png = output.get("data", {}).get("image/png")
                    if png:
                        data = "".join(png) if isinstance(png, list) else png
                        images.append((f"{name} ({notebook})", data.replace("\n", "")))
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
            gaps.append(f"{notebook} cannot be read, its plots are left out ({why})")
    return images, gaps


# where a run's stages were run, not how: two runs in different folders are the same setup
RUN_PLACE = ("out_dir",)


def run_parameters(run_dir) -> dict:
    """The parameters the run's stages were run with ({name: value}): papermill records each executed notebook's
    in its metadata ("papermill"."parameters"); the first notebook that sets a name gives its value, RUN_PLACE left
    out. A notebook that is not there or cannot be read adds nothing."""
    found = {}
    for s in STAGES:
        path = Path(run_dir) / s.notebook
        try:
            meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
            given = meta.get("papermill", {}).get("parameters", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(given, dict):
            for name, value in given.items():
                if name not in RUN_PLACE:
                    found.setdefault(name, value)
    return found
