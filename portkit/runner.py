"""The workbook runner: execute the stage notebooks in order with papermill into one run folder.

    >>> from portkit import runner
    >>> result = runner.run("minilm", ["neuron", "tpu"], "runs/minilm", {"batch_size": 4})
    >>> result.summaries
    {'fallbacks': 'neuron (emulated): ...'}

Each notebook gets the shared parameters (model, targets, out_dir) and those of the user's
parameters it declares; a parameter no notebook declares is an error, raised before anything is
written. A stage that fails stops the run; its executed notebook stays in the folder showing the error.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from portkit import params as params_mod
from portkit.errors import BadParameter, StageFailed

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SHARED = ("model", "targets", "out_dir")


@dataclass(frozen=True)
class Stage:
    name: str
    notebook: str
    result: str          # the JSON file the notebook writes into out_dir
    module: str          # its portkit module; its check_parameters() runs before anything is written


STAGES: tuple[Stage, ...] = (
    Stage("fallbacks", "01_fallbacks.ipynb", "fallbacks.json", "portkit.fallbacks"),
    Stage("compile", "02_compile.ipynb", "compile.json", "portkit.compiling"),
    Stage("buckets", "03_buckets.ipynb", "buckets.json", "portkit.buckets"),
    Stage("xla", "03b_xla.ipynb", "xla.json", "portkit.xla"),
    Stage("accuracy", "04_accuracy.ipynb", "accuracy.json", "portkit.accuracy"),
    Stage("report", "05_report.ipynb", "report.json", "portkit.report"),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def declared_parameters(stage: Stage) -> dict[str, dict]:
    """The parameters a stage notebook declares, with default and help text (papermill's inspector)."""
    import papermill
    return papermill.inspect_notebook(str(NOTEBOOKS / stage.notebook))


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
    if not names:
        return list(STAGES)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    for n in names:
        if n not in STAGE_NAMES:
            raise BadParameter("stage", n, STAGE_NAMES)
    return [s for s in STAGES if s.name in names]


def plan(model: str, targets, out_dir: str, user_params: dict, stages=None):
    """Validate everything a run needs, without writing anything. Returns (stages, per-stage params)."""
    chosen = select_stages(stages)
    declared = all_parameters(chosen)
    for name in user_params:
        if name in SHARED:
            raise BadParameter("parameter", name, hint=f"give {name} with its own option, not -p")
        if name not in declared:
            raise BadParameter("parameter", name, sorted(n for n in declared if n not in SHARED))
    model, names, out = params_mod.common(model, targets, out_dir)
    per_stage = []
    for stage in chosen:
        mine = declared_parameters(stage)
        values = {"model": model, "targets": names, "out_dir": str(out)}
        values.update({k: v for k, v in user_params.items() if k in mine})
        _preflight(stage, mine, values)
        per_stage.append((stage, values))
    return chosen, per_stage


def _preflight(stage: Stage, declared: dict, values: dict) -> None:
    """Run the stage's own parameter checks on its defaults overridden by the user's values."""
    check = getattr(importlib.import_module(stage.module), "check_parameters", None)
    if check is None:
        return
    accepted = inspect.signature(check).parameters
    merged = {}
    for name in accepted:
        if name in values:
            merged[name] = values[name]
        elif name in declared:
            try:
                merged[name] = ast.literal_eval(declared[name]["default"])
            except (ValueError, SyntaxError):
                pass   # a default that is an expression: the notebook itself will check it
    check(**merged)


@dataclass
class RunResult:
    out_dir: Path
    summaries: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _summary(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("summary", "(no summary)")
    except (OSError, ValueError):
        return "(its result file is missing or unreadable)"


def run(model: str, targets, out_dir: str, user_params: dict | None = None, stages=None,
        progress: bool = True, log=print) -> RunResult:
    """Execute the workbook. Raises BadParameter before writing anything, StageFailed on a failed stage."""
    import papermill
    from papermill.exceptions import PapermillExecutionError
    from tqdm.auto import tqdm

    chosen, per_stage = plan(model, targets, out_dir, dict(user_params or {}), stages)
    out = Path(per_stage[0][1]["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    result = RunResult(out)
    # The kernels papermill starts inherit this: nobody watches them, so stages skip widgets.
    os.environ.setdefault("PORTKIT_HEADLESS", "1")
    bar = tqdm(per_stage, desc="portkit", unit="stage", disable=not progress)
    for stage, values in bar:
        bar.set_postfix_str(stage.name)
        output = out / stage.notebook
        start = time.perf_counter()
        try:
            papermill.execute_notebook(
                str(NOTEBOOKS / stage.notebook), str(output), parameters=values, kernel_name="python3",
                progress_bar={"desc": f"  {stage.name} cells", "leave": False} if progress else False,
                cwd=str(NOTEBOOKS), request_save_on_cell_execute=True,
                # the kernel's own start-up warnings (loopback TCP) are noise on the user's terminal
                extra_arguments=["--IPKernelApp.log_level=ERROR"])
        except PapermillExecutionError as exc:
            raise StageFailed(f"stage {stage.name} failed in cell {exc.exec_count} of {stage.notebook} "
                              f"({exc.ename}: {exc.evalue.strip().splitlines()[-1] if exc.evalue.strip() else ''}); "
                              f"the executed notebook is {output}") from None
        result.seconds[stage.name] = time.perf_counter() - start
        result.summaries[stage.name] = _summary(out / stage.result)
        log(f"[{stage.name}] {result.summaries[stage.name]} ({result.seconds[stage.name]:.0f} s)")
    return result

