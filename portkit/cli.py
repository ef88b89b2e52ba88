"""The `portkit` command.

    portkit run --model minilm --target neuron --target tpu --out runs/minilm [-p batch_size 4 ...]
    portkit report runs/minilm   # rebuild report.html / report.json from a run folder, no stage rerun
    portkit targets              # each target's mode on this machine, and why
    portkit params               # every parameter the stage notebooks take
    portkit sweep --model a --model b --target neuron --target tpu --out runs/sweep   # Ray tasks (portkit[sweep])
    portkit export runs/minilm --to pytorch      # the bucket plan as a serving stack's config (pytorch, vllm, nxdi)
    portkit check runs/new --baseline runs/old   # CI regression gate: exit 1 on a regression
    portkit scan org/name        # static scan of a model's code (remote code too): GPU-only code, vendor lists

Bad input gets one line naming the bad value and the valid choices, exit code 2, and nothing written.
A failed stage exits 1 and names the notebook and the cell.
"""
from __future__ import annotations

import argparse
import os
import sys

from portkit import __version__
from portkit.core import offline
from portkit.core.errors import NeedsNetwork, PortkitError, StageFailed


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, exit 2 (argparse prints the whole usage otherwise)
        self.exit(2, f"portkit: error: {message}\n")


class _Once(argparse.Action):
    """An option that takes one value: given twice, it is an error (argparse keeps the last one silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            parser.error(f"argument {'/'.join(self.option_strings)}: given twice ({getattr(namespace, self.dest)!r}, "
                         f"then {values!r}); give it once")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


def _unique(what: str, values):
    """`values` without repeats, in order; a note on stdout names what was dropped."""
    if values is None:
        return None
    kept = list(dict.fromkeys(values))
    if len(kept) < len(values):
        print(f"portkit: note: {what} given more than once; using {', '.join(map(str, kept))}")
    return kept


def _stage_list(text):
    """--stages without repeats or empty names (a trailing comma), a note naming what was dropped."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if "" in names and any(names):
        print(f"portkit: note: empty stage name in --stages {text!r} ignored")
    kept = _unique("stage", [n for n in names if n])
    return ",".join(kept) if kept else text


def _param_values(pairs) -> dict:
    """-p NAME VALUE pairs as {name: raw}; a name given twice is an error (it takes one value)."""
    given: dict = {}
    for name, raw in pairs:
        if name in given:
            from portkit.core.errors import BadParameter
            raise BadParameter("parameter", name, hint=f"given twice (-p {name} {given[name]}, then -p {name} {raw}); "
                                                       "give it once")
        given[name] = raw
    return given


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="portkit", description="Move a PyTorch model to Trainium and TPU, stage by stage.")
    parser.add_argument("--version", action="version", version=f"portkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="execute the workbook's notebooks into a run folder")
    run.add_argument("--model", default="minilm", action=_Once,
                     help="portkit model name, local HF directory, or module:factory")
    run.add_argument("--target", action="append", dest="targets", metavar="TARGET",
                     help="neuron, tpu, cpu or cuda; repeat for several (default: neuron and tpu)")
    run.add_argument("--out", default=None, action=_Once, help="run folder (default: runs/<model>)")
    run.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="a notebook parameter, e.g. -p batch_size 4 (see `portkit params`)")
    run.add_argument("--stages", default=None, action=_Once, help="comma-separated subset of the stages to run")
    run.add_argument("--lanes", type=int, default=None, action=_Once,
                     help="stages run at once, each in a kernel of its own (default: as many as the stages can use, at "
                          "most one more than the cores, as memory allows; 1 needs the least memory)")
    run.add_argument("--no-progress", action="store_true",
                     help="no progress bars (there are none where stdout is not a terminal)")
    run.add_argument("--no-report", action="store_true",
                     help="do not rebuild report.html/report.json after a run that leaves the report stage out")
    rep = sub.add_parser("report", help="rebuild report.html and report.json from a run folder")
    rep.add_argument("run_dir", help="a folder written by `portkit run`")
    rep.add_argument("--target", action="append", dest="targets", metavar="TARGET",
                     help="targets to report on (default: those in the stage results)")
    sub.add_parser("targets", help="show each target's mode on this machine")
    sc = sub.add_parser("scan", help="static scan of a model's code for GPU-only code and the vendors' lists, "
                                     "without importing or running it")
    sc.add_argument("source", help="a model directory (its *.py: remote code), a Hub id in the cache, or a .py file")
    sc.add_argument("--target", action="append", dest="targets", metavar="TARGET",
                    help="targets to scan for (default: neuron and tpu)")
    sw = sub.add_parser("sweep", help="one workbook run per model x target x option set, as Ray tasks")
    sw.add_argument("--model", action="append", dest="models", metavar="MODEL", help="repeat for several")
    sw.add_argument("--target", action="append", dest="targets", metavar="TARGET",
                    help="repeat for several (default: neuron and tpu); one run per model and target")
    sw.add_argument("--out", default=os.path.join("runs", "sweep"), action=_Once,
                    help="sweep folder (default: runs/sweep)")
    sw.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a notebook parameter for every run")
    sw.add_argument("--options", action="append", default=[], metavar="'NAME=VALUE ...'",
                    help="an option set; repeat for several (one run per set per model and target)")
    sw.add_argument("--stages", default=None, action=_Once, help="comma-separated subset of the stages to run")
    sw.add_argument("--address", default=None, action=_Once,
                    help="an existing Ray cluster (default: a local Ray for the sweep)")
    sw.add_argument("--cpus-per-task", type=float, default=1.0, action=_Once,
                    help="CPUs each run asks Ray for (default 1)")
    sw.add_argument("--memory-per-task", type=float, default=3.0, action=_Once,
                    help="GiB each run asks Ray for (default 3)")
    sw.add_argument("--no-progress", action="store_true",
                    help="no progress bar (there is none where stdout is not a terminal)")
    sub.add_parser("params", help="list the notebooks' parameters")
    _deploy_parsers(sub)
    return parser


def _deploy_parsers(sub) -> None:
    """`portkit export` and `portkit check` (portkit/deploy)."""
    ex = sub.add_parser("export", help="write a run's bucket plan as a serving stack's configuration")
    ex.add_argument("run_dir", help="a folder written by `portkit run`")
    ex.add_argument("--to", required=True, choices=("pytorch", "vllm", "nxdi"), dest="stack",
                    help="pytorch (a generated wrapper), vllm or nxdi (NxD Inference) configuration")
    ex.add_argument("--target", action="append", dest="targets", metavar="TARGET",
                    help="targets to export (default: every target with a bucket plan)")
    ex.add_argument("--out", default=None, help="folder for the files (default: RUN/deploy/STACK)")
    ex.add_argument("--prices", default=None, metavar="FILE",
                    help='JSON {target or chip: {"usd_per_chip_hour", "source", "date"}}: replaces the prices of '
                         "data/targets/prices.json (third parties' reports of list prices) in the cost per million "
                         "requests, an estimate")
    ck = sub.add_parser("check", help="regression gate for CI: compare a run with a baseline (exit 1 on a regression)")
    ck.add_argument("run_dir", help="the new run folder")
    ck.add_argument("--baseline", required=True, metavar="OLD", help="the baseline run folder")
    ck.add_argument("--junit", default=None, metavar="FILE", help="also write the checks as JUnit XML (atomically)")


def _run(args) -> int:
    from portkit.run import jupyter_kernels
    jupyter_kernels.start_early(args.model)   # the kernels' fork server imports while this process does
    from portkit.run import notebook_parameters
    from portkit.run import runner
    from portkit.core import checks
    targets = _unique("target", args.targets) or ["neuron", "tpu"]
    stages = _stage_list(args.stages)
    from portkit.runfolder.layout import model_tag
    # --out "" is refused, not defaulted
    out = args.out if args.out is not None else os.path.join("runs", model_tag(args.model))
    declared = notebook_parameters.all_parameters(notebook_parameters.select_stages(stages))
    # Unknown names pass through as text; preflight.plan rejects them with the valid list.
    user = {name: notebook_parameters.coerce(name, raw, declared) if name in declared else raw
            for name, raw in _param_values(args.param).items()}
    lanes = runner.RunSettings.lanes if args.lanes is None else checks.positive_int("lanes", args.lanes, maximum=64)
    try:
        result = runner.run(args.model, targets, out, user, stages, progress=not args.no_progress,
                            settings=runner.RunSettings(lanes=lanes, rebuild_report=not args.no_report))
    except StageFailed as exc:   # the other stages ran; the report names the gap
        print(f"results: {exc.result.out_dir}")
        _print_verdicts(exc.result.out_dir)
        for stage, error in exc.result.failures.items():
            print(f"portkit: stage {stage} failed: {error}", file=sys.stderr)
        return 1
    print(f"results: {result.out_dir}")
    _print_verdicts(result.out_dir)
    return 0


def _print_verdicts(run_dir) -> None:
    """The last lines of a run: where the report is, each target's verdict, the findings that matter
    first (by consequence) and the count of eager findings that vanish under torch.compile."""
    from pathlib import Path
    from portkit.runfolder import layout
    try:
        saved = layout.read_report(run_dir)
    except FileNotFoundError:
        return
    except ValueError as exc:   # an interrupted save, or a damaged file: no verdict from it
        print(f"report: none ({exc})")
        return
    print(f"report: {Path(run_dir) / 'report.html'}")
    for name, t in saved["targets"].items():
        print(f"verdict {name} ({t['mode']}): {t['verdict'].upper()} — {t['verdict_reason']}")
        for f in (t.get("first") or [])[:3]:
            print(f"  [{f['severity']}] {f['message']} — {f['consequence']}")
        if t.get("vanished"):
            print(f"  {t['vanished']}")
        if t.get("training"):   # workload "train": the training verdict beside the inference one
            training = t["training"]
            reason = "; ".join(training["blockers"] + training["work"]) or training["numerics"]
            print(f"training verdict {name} ({t['mode']}): {training['verdict'].upper()} — {reason}")


def _report(args) -> int:
    from pathlib import Path
    from portkit.targets import specs
    from portkit.core.errors import BadParameter
    from portkit.core import checks
    run_dir = Path(args.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise BadParameter("run folder", args.run_dir, hint="it is a file, not a folder; give the folder `portkit run` "
                                                            "wrote (the one holding report.json and the stage results)")
    if not run_dir.is_dir():
        raise BadParameter("run folder", args.run_dir, hint=f"{checks.missing_path(run_dir)}; give one written by "
                                                            "`portkit run`")
    names = specs.parse_targets(args.targets) if args.targets else None
    r = _report_held(run_dir, names)
    for gap in r.gaps:
        print(f"gap: {gap}")
    _print_verdicts(run_dir)
    # a result there that cannot be read whole (or went after the run recorded it, or a damaged run log) is damage
    # (exit 1); a stage that never ran or failed is a gap only
    damaged = r.damaged()
    if damaged:
        print(f"portkit: damaged result(s) in {run_dir}: {', '.join(damaged)} (the report names the gap); rerun "
              "their stages", file=sys.stderr)
        return 1
    return 0


def _report_held(run_dir, names):
    """Build and save the report holding the run folder (as a run does): a run writing there now is refused, and
    what a killed run left under partial names (.05_report.partial.ipynb) is removed first, with a note."""
    from portkit.core import atomic_io
    from portkit.core.errors import BadParameter
    from portkit.runfolder import layout
    from portkit.stages.report import stage
    try:
        with layout.hold(run_dir):
            removed = atomic_io.remove_partials(run_dir)
            if removed:
                print(f"portkit: note: removed {len(removed)} partial file(s) a killed run left: "
                      f"{', '.join(p.name for p in removed)}")
            r = stage.build_report(names, run_dir=run_dir)
            r.save(run_dir)
            return r
    except layout.FolderInUse as exc:
        raise BadParameter("run folder", str(run_dir), hint=f"in use by a run (process {exc.pid}); wait for it to "
                                                            "end") from None
    except PermissionError as exc:
        raise BadParameter("run folder", str(run_dir), hint=f"cannot write in it ({exc.strerror})") from None



def _sweep(args) -> int:
    from portkit.run import notebook_parameters
    from portkit.run import sweep
    sweep.require_ray()   # the install line before anything else
    declared = notebook_parameters.all_parameters()
    user = {name: notebook_parameters.coerce(name, raw, declared) if name in declared else raw
            for name, raw in _param_values(args.param).items()}
    resources = sweep.Resources(args.cpus_per_task, args.memory_per_task, args.address)
    cells = sweep.plan_sweep(_unique("model", args.models) or ["minilm"], _unique("target", args.targets) or
                             ["neuron", "tpu"], args.out, user,
                             [sweep.parse_options(text, declared) for text in args.options], _stage_list(args.stages))
    outcome = sweep.run_sweep(cells, args.out, resources, progress=not args.no_progress)
    for c in outcome.to_dict()["cells"]:
        where = f"{c['model_tag']}/{c['target']}" + (f" [{c['options_label']}]" if c["options_label"] else "")
        if c["status"] == "failed":
            print(f"FAILED {where} after {c['attempts']} attempt(s): {c['error']} (notebook: {c['notebook']})")
        else:
            before = " (finished before)" if c["status"] == "skipped" else ""
            print(f"{where} ({c['mode']}): {str(c['verdict']).upper()}{before}")
    counts = outcome.counts()
    print(f"{counts['finished']} finished, {counts['skipped']} skipped, {counts['failed']} failed "
          f"in {outcome.wall_seconds:.0f} s; sweep report: {outcome.out_dir / 'sweep.html'}")
    return 1 if counts["failed"] else 0


def _targets() -> int:
    from portkit.runfolder import environment
    print(environment.block(["neuron", "tpu", "cpu", "cuda"]))
    return 0


def _params() -> int:
    """Each parameter once, with its default; where stages declare different defaults, one line per
    default, naming the stages that use it (what `-p` overrides in each)."""
    from portkit.run import notebook_parameters
    from portkit.stages import options
    for name, per_stage in notebook_parameters.parameters_by_stage().items():
        if name in options.SHARED:
            continue
        by_default: dict[str, list[str]] = {}
        for stage, info in per_stage.items():
            by_default.setdefault(info.get("default"), []).append(stage)
        help_text = next(iter(per_stage.values())).get("help", "")
        if len(by_default) == 1:
            print(f"{name} = {next(iter(by_default))}  # {help_text} [{', '.join(per_stage)}]")
            continue
        print(f"{name}  # {help_text}; the stages' defaults differ:")
        for default, stages in by_default.items():
            print(f"    = {default}  [{', '.join(stages)}]")
    return 0


def _scan(args) -> int:
    """`portkit scan SOURCE`: stage 1's static scan alone, on code portkit will not run (a Hub model's remote
    code), by target and severity; exit 0 whatever it finds (the findings are the result)."""
    from pathlib import Path

    from portkit.core.errors import BadParameter
    from portkit.models import huggingface
    from portkit.stages.fallbacks import source_scan
    from portkit.targets import specs
    from portkit.core import checks
    targets = specs.parse_targets(args.targets or list(specs.MIGRATION_TARGETS))
    path = Path(args.source).expanduser()
    if not path.exists() and not path.is_symlink() and huggingface.is_hub_id(args.source):
        path = huggingface.resolve(args.source).path          # the cached snapshot, pinned to its commit
    if not path.exists():   # a symlink loop, a broken link, no such path: say which
        raise BadParameter("source to scan", args.source, hint=f"{checks.missing_path(path)}; give a model "
                                                               "directory, a cached Hub id or a .py file")
    if not (path.is_dir() or path.suffix == ".py" and path.is_file()):
        raise BadParameter("source to scan", args.source, hint="a model directory, a cached Hub id or a .py file")
    scan = source_scan.scan_paths([path])
    read = len(scan.files) - len(scan.errors)
    if not read:   # an empty folder, or no file that parses: nothing was scanned, so no count of findings
        why = f"{len(scan.errors)} file(s) could not be parsed ({scan.errors[0]})" if scan.errors else \
            "it holds no .py, .cu or .cuh file"
        raise BadParameter("source to scan", args.source, hint=f"nothing to scan: {why}")
    print(f"scanned {read} file(s) under {path} statically (nothing imported or run)")
    for error in scan.errors:
        print(f"  not parsed: {error}")
    for target in targets:
        found = source_scan.findings(scan, target, static=True)
        print(f"{target}: {len(found)} finding(s)")
        for f in found:
            print(f"  [{f.severity}] {f.message}" + (f" — {f.advice}" if f.advice else ""))
    return 0


def _deploy(args) -> int:
    """`portkit export` (exit 0) and `portkit check` (exit 1 on a regression)."""
    from portkit.deploy import export, gate
    from portkit.planning import cost
    from portkit.runfolder import results
    if args.command == "check":
        if args.junit:   # before the comparison: a path that cannot be written fails first, nothing printed
            gate.check_junit_path(args.junit)
        result = gate.compare(args.run_dir, args.baseline)
        print(result.summary())
        if args.junit:
            print(f"junit: {gate.write_junit(result, args.junit)}")
        return 1 if result.failed else 0
    from portkit.targets import specs
    targets = specs.parse_targets(args.targets) if args.targets else None   # an unknown one, with the choices
    prices = cost.read_prices(args.prices) if args.prices else None
    written, skipped = export.export(args.run_dir, args.stack, args.out, targets)
    chosen = sorted({item.target for item in written})
    found = cost.comparison(results.run_cost_figures(args.run_dir), chosen, prices) if written else {}
    for item in written:
        print(f"{item.target}: {', '.join(str(f) for f in item.files)}")
        for lost in item.lost:
            print(f"  lost: {lost}")
        print("  " + cost.line(found["targets"][item.target]))
        if item.target in found["verdicts"]:
            print("  verdict: " + found["verdicts"][item.target]["line"])
    for line in skipped:
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    offline.set_offline()   # before `portkit run` starts its kernels' fork server: their environment includes it
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args)
        if args.command == "targets":
            return _targets()
        if args.command == "scan":
            return _scan(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command in ("export", "check"):
            return _deploy(args)
        return _params()
    except StageFailed as exc:
        print(f"portkit: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:   # Ctrl-C: one line (the runner's names what it stopped), the shell's 128 + SIGINT
        print(f"portkit: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    except (PortkitError, NeedsNetwork) as exc:
        print(f"portkit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
