"""The workbook runner: execute the stage notebooks in order with papermill into one run folder.

    >>> from portkit.run import runner
    >>> result = runner.run("minilm", ["neuron", "tpu"], "runs/minilm", {"batch_size": 4})
    >>> result.summaries
    {'fallbacks': 'neuron (emulated): ...'}

Each notebook gets the shared parameters (model, targets, out_dir) and those of the user's parameters it declares
(run/notebook_parameters.py); preflight.plan checks everything before anything is written. The stages run in kept
kernels, cleared between stages (run/jupyter_kernels.py), scheduled by run/scheduling.py: a stage does not pay for a
new interpreter and its imports; two stages that do not read each other's results run side by side. A stage that
fails does not stop the run: its executed notebook is moved into place showing the error, the stages after it still
run, and StageFailed names every failure at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from portkit.core import atomic_io
from portkit.core.errors import BadParameter, StageFailed
from portkit.core.progress import watched
from portkit.run import jupyter_kernels
from portkit.run import preflight
from portkit.run import scheduling
from portkit.runfolder import layout
from portkit.runfolder.layout import MARKER, STAGE_NAMES, STAGES, Stage, is_run_folder  # noqa: F401 (the runner's API)
from portkit.stages import options


@dataclass(frozen=True)
class RunSettings:
    """How a run goes beyond what its stages compute: up to `lanes` stages side by side (run's docstring), and
    whether a run without the report stage rebuilds report.html/report.json after its stages."""
    lanes: int = jupyter_kernels.LANES
    rebuild_report: bool = True


def run(model: str, targets, out_dir: str, user_params: dict | None = None, stages=None,
        progress: bool = True, log=print, settings: RunSettings = RunSettings()) -> scheduling.RunResult:
    """Execute the workbook. Raises BadParameter before writing anything.

    Each stage that ends gets one line through `log`. progress=True draws progress bars where someone watches
    stdout (progress.watched: a terminal, not a file or a pipe), each stage's line then printed on a line of
    its own above the run's bar.

    A stage that fails does not stop the run: its executed notebook shows the error, the run log
    (runfolder.RUN_LOG) records it, the stages after it run on what there is, and the report names the
    gap. After the stages, StageFailed is raised naming every failure (its `result` is the scheduling.RunResult).
    A run without the report stage rebuilds report.html/report.json from the folder (a few seconds),
    so the report never describes older results; settings.rebuild_report=False leaves it as it was.

    A stage starts once the stages whose results it reads have ended (runfolder.Stage.reads); up to settings.lanes
    stages run at once, each in a kernel of its own, where the machine holds that many kernels with the
    model (kernels.lanes_for); RunSettings(lanes=1) runs them one after another."""
    chosen, per_stage = preflight.plan(model, targets, out_dir, dict(user_params or {}), stages)
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


def _run_held(chosen, per_stage, out: Path, progress: bool, log, settings: RunSettings) -> scheduling.RunResult:
    """run() in a run folder it holds (runfolder.hold)."""
    if not (out / MARKER).exists():
        atomic_io.write_text(out / MARKER, "A portkit run folder: `portkit run` writes its stage results here.\n")
    atomic_io.remove_partials(out)   # what a killed run left
    result = scheduling.RunResult(out)
    # bars where someone watches (asked outside the kernels' environment, which is headless); a log file gets lines
    # alone
    shown = progress and watched()
    model_spec = per_stage[0][1]["model"]
    with jupyter_kernels.kernel_environment(jupyter_kernels.kernel_folder(model_spec)):
        printer = scheduling.Printer(len(per_stage), shown, log)
        scheduling.run_stages(per_stage, scheduling.Run(out, model_spec, shown, printer, result, lanes=settings.lanes),
                              settings.lanes)
    if settings.rebuild_report and layout.REPORT not in {s.name for s in chosen}:
        from portkit.stages.report import stage
        try:
            stage.build_report(per_stage[0][1]["targets"], run_dir=out).save(out)
            result.report_rebuilt = True
            log("[report] rebuilt from the run folder")
        except BadParameter as exc:          # no stage result at all: nothing to report on
            log(f"[report] not rebuilt: {exc}")
    if result.failures:
        failed = StageFailed("; ".join(f"stage {name} failed: {error}" for name, error in result.failures.items()))
        failed.result = result
        raise failed
    return result

