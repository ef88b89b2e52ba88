"""Stage results are read as types, each by one reader in portkit/runfolder that checks what it reads: a damaged value
is named with its file, key and damage; a key a reader does not know is ignored; and no module that reads a stage
result picks it apart with `.get(...) or {}` chains outside its reader."""
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT
from portkit.runfolder import accuracy_result, buckets_result, compile_result, fallbacks_result, reading, results
from portkit.runfolder import run_log, xla_result

PORTKIT = ROOT / "portkit"
# the readers: the only modules that take a stage result (or the run log, or an environment block) apart
READERS = {"runfolder/reading.py", "runfolder/results.py", "runfolder/layout.py", "runfolder/run_log.py",
           "runfolder/environment.py", *(f"runfolder/{s}_result.py" for s in ("fallbacks", "compile", "buckets", "xla",
                                                                               "accuracy"))}
# the modules that read stage results back: the report, the run folder's numbers, the cost estimate, export, the
# gate, reconciliation, the runner and the command line
CONSUMERS = ("stages/report", "runfolder", "deploy", "run", "planning/cost.py", "stages/reconcile.py", "cli.py")
CHAIN = re.compile(r"\.get\([^()]*\)\s*or\s*\{\}")


def _modules(where: str) -> list[Path]:
    path = PORTKIT / where
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def test_no_stage_result_is_read_through_get_or_empty_chains_outside_its_reader():
    """The rule: a stage result's layout is read in one place, its typed reader; a consumer reads the types."""
    found = []
    for module in (m for where in CONSUMERS for m in _modules(where)):
        name = module.relative_to(PORTKIT).as_posix()
        if name in READERS:
            continue
        found += [f"{name}:{i}: {line.strip()}" for i, line in enumerate(module.read_text().splitlines(), 1)
                  if CHAIN.search(line)]
    # a stage package reads an earlier stage's result through results.load, never by picking its dict apart
    for module in PORTKIT.joinpath("stages").rglob("*.py"):
        found += [f"{module.relative_to(PORTKIT)}:{i}: {line.strip()}"
                  for i, line in enumerate(module.read_text().splitlines(), 1)
                  if CHAIN.search(line) and "read_stage(" in line]
    assert found == []
    assert CHAIN.search('x = (d.get("targets") or {}).get("tpu")') and not CHAIN.search("x = d.get('a', {})")


def _node(data: dict, stage: str) -> reading.Node:
    return reading.Node(data, Path(f"/run/{stage}.json"), stage)


# (reader, a result with one damaged value, the key named, the damage named)
DAMAGED = [
    (fallbacks_result.Result, {"targets": {"tpu": {"counts": {"native": "3"}}}}, "targets.tpu.counts.native",
     "is '3', not a number"),
    (fallbacks_result.Result, {"targets": {"tpu": {"ops": [{"status": "native"}]}}}, "targets.tpu.ops.0.op",
     "is None, not an op name"),
    (fallbacks_result.Result, {"targets": {"tpu": {"findings": [{"owner": "me"}]}}}, "targets.tpu.findings.0.owner",
     "is 'me', not an object"),
    (compile_result.Result, {"targets": {}, "graph_breaks": {"checks": {"tpu": {"ops": []}}}},
     "graph_breaks.checks.tpu.ops", "is [], not an object"),
    (compile_result.Result, {"targets": {"tpu": {"compile_seconds": {"median": "1 s"}}}},
     "targets.tpu.compile_seconds.median", "not a number"),
    (buckets_result.Result, {"targets": {"tpu": {"chosen": {"boundaries": [16, "64"]}}}},
     "targets.tpu.chosen.boundaries", "is [16, '64'], not a list of positive integers"),
    (buckets_result.Result, {"targets": {}, "padding_price": {"tpu": 3}}, "padding_price.tpu", "not an object"),
    (xla_result.Result, {"targets": {"tpu": {"shapes": [{"memory": {"peak": 1}}]}}},
     "targets.tpu.shapes.0.memory.total", "not a number of bytes"),
    (accuracy_result.Result, {"targets": {"tpu": {"task": {"checks": [{"value": None, "n": 1.5}]}}}},
     "targets.tpu.task.checks.0.n", "is 1.5, not an integer"),
    (accuracy_result.Result, {"targets": {}, "stream": {"runs": {"tpu": 1}}}, "stream.runs", "not a list"),
]


@pytest.mark.parametrize("reader, data, key, damage", DAMAGED, ids=[f"{d[0].__module__.split('.')[-1]}-{d[2]}"
                                                                    for d in DAMAGED])
def test_a_reader_names_the_file_the_key_and_the_damage(reader, data, key, damage):
    """A damaged value raises UnreadableResult (one line: file, key, damage, what to do); a damaged target's part
    leaves the others readable."""
    stage = reader.__module__.split(".")[-1].removesuffix("_result")
    data = {**data, "targets": {**data["targets"], "neuron": {"summary": "fine"}}}
    try:
        found = reader.from_dict(data, Path(f"/run/{stage}.json"))
    except reading.UnreadableResult as exc:      # damage outside the targets: the whole result cannot be read
        message = str(exc)
    else:
        assert found.target("neuron").summary == "fine" and list(found.damaged) == ["tpu"]
        with pytest.raises(reading.UnreadableResult) as info:
            found.target("tpu")
        message = str(info.value)
    assert message.startswith(f"/run/{stage}.json: {key} is ") and damage in message
    assert message.endswith(f"; rerun stage {stage}")
    assert "\n" not in message


def test_readers_ignore_keys_they_do_not_know_and_keep_absent_values_absent():
    """Stages may add keys: a reader ignores what it does not read; what a result does not hold reads as None or
    empty, never as a zero."""
    extra = {"new_key": {"deep": [1]}, "summary": "s", "findings": [{"kind": "k", "severity": "work", "x": 1}]}
    data = {"targets": {"tpu": dict(extra)}, "new_top": [1, 2], "graph_breaks": {"checks": {}, "later": 1}}
    for reader in (fallbacks_result.Result, compile_result.Result, buckets_result.Result, xla_result.Result,
                   accuracy_result.Result):
        found = reader.from_dict(data, Path("/run/x.json"))
        tpu = found.target("tpu")
        assert tpu.summary == "s" and tpu.findings[0]["x"] == 1 and found.names == ("tpu",)
        assert found.target("gpu") is None
    compiled = compile_result.Result.from_dict(data, Path("/run/compile.json")).target("tpu")
    assert compiled.storm.compile_count is None and compiled.compile_seconds.median is None
    bucketed = buckets_result.Result.from_dict(data, Path("/run/buckets.json"))
    assert bucketed.target("tpu").chosen == buckets_result.Chosen() and bucketed.distribution_count is None
    assert xla_result.Result.from_dict(data, Path("/run/xla.json")).target("tpu").hbm_bytes is None


def test_load_reads_a_result_in_the_run_folder_as_its_type(tmp_path):
    """results.load: None without a result or for a skipped stage; the typed result otherwise; a file that is not
    JSON is named."""
    assert results.load(tmp_path, "compile") is None
    (tmp_path / "compile.json").write_text(json.dumps({"targets": {"tpu": {"storm": {"compile_count": 7}}}}))
    assert results.load(tmp_path, "compile").target("tpu").storm.compile_count == 7
    (tmp_path / "xla.json").write_text(json.dumps({"skipped": "abstract", "targets": {"tpu": {"skipped": "x"}}}))
    assert results.load(tmp_path, "xla") is None
    (tmp_path / "buckets.json").write_text("{not json")
    with pytest.raises(results.UnreadableResult, match="buckets.json cannot be read"):
        results.load(tmp_path, "buckets")


def test_the_run_log_and_report_json_are_read_as_types(tmp_path):
    """run.json and report.json: None or FileNotFoundError where absent, their types where whole, UnreadableResult
    naming the file and key where damaged."""
    assert run_log.read(tmp_path) is None
    (tmp_path / "run.json").write_text(json.dumps({"stages": {"compile": {"status": "failed", "error": "boom"}}}))
    assert run_log.read(tmp_path).stages["compile"] == run_log.StageRun("failed", "boom")
    (tmp_path / "run.json").write_text(json.dumps({"stages": []}))
    with pytest.raises(reading.UnreadableResult, match=r"run.json: stages is \[\], not an object of stages"):
        run_log.read(tmp_path)
    with pytest.raises(FileNotFoundError):
        run_log.read_report(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"targets": {"tpu": {"findings": [{"severity": "blocker"}]},
                                                                  "neuron": {"verdict": "ready"}}}))
    found = run_log.read_report(tmp_path)
    assert found.targets["tpu"].verdict == "not assessed" and found.targets["neuron"].verdict == "ready"
    (tmp_path / "report.json").write_text(json.dumps({"targets": {"tpu": {"verdict": 1}}}))
    with pytest.raises(reading.UnreadableResult, match="targets.tpu.verdict is 1, not a string; rebuild it"):
        run_log.read_report(tmp_path)


def test_the_run_log_is_written_by_the_writer_beside_its_reader(tmp_path):
    """Rule: run.json has one schema, in runfolder/run_log.py: record writes each stage's StageRun.to_dict and keeps
    the other stages' entries; read gives back what record wrote."""
    run_log.record(tmp_path, "fallbacks", "ok", 12.34)
    run_log.record(tmp_path, "compile", "failed", 3.0, "cell 4 raised ValueError: boom")
    written = json.loads((tmp_path / "run.json").read_text())
    assert written["stages"]["fallbacks"] == {"status": "ok", "seconds": 12.3, "error": "",
                                              "notebook": "01_fallbacks.ipynb", run_log.PEAK_KEY: None}
    found = run_log.read(tmp_path).stages
    assert found["fallbacks"] == run_log.StageRun("ok", "", 12.3, "01_fallbacks.ipynb")
    assert found["compile"].status == "failed" and found["compile"].error.endswith("boom")
    assert found["compile"].to_dict() == written["stages"]["compile"]
