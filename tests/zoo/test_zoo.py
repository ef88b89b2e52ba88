"""The conformance zoo (benchmarks/zoo.py): its rows come from transformers' Auto mappings, the families migrations
stall on are among them, rows build at a tiny size or say in one line why not, the page and the last line count
what the rows hold, and a zoo started again skips the rows it finished."""
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import zoo, zoo_build  # noqa: E402

LAST_LINE = re.compile(r"^zoo: (\d+) architectures \((\d+) not buildable\), (\d+) stage crashes, (\d+) rule "
                       r"violations, (\d+) not assessed \(wall \d+ s(?:; CPU \d+ s per row run here \(\d+\))?; host .+ "
                       r"GFLOP/s one thread, load .+\)$")
# the families migrations stall on: recurrent and state-space, hybrids with attention, mixture-of-experts of
# each routing style, sliding-window and soft-capped attention, long-context sparse attention, convolutional
# speech front ends with group norm, detection heads
STALLING = ("mamba.causal-lm", "mamba2.causal-lm", "rwkv.causal-lm", "xlstm.causal-lm", "recurrent_gemma.causal-lm",
            "jamba.causal-lm", "zamba.causal-lm", "bamba.causal-lm", "falcon_h1.causal-lm",
            "mixtral.causal-lm", "qwen2_moe.causal-lm", "deepseek_v3.causal-lm", "olmoe.causal-lm", "dbrx.causal-lm",
            "switch_transformers.seq2seq-lm", "mistral.causal-lm", "gemma2.causal-lm", "gemma3_text.causal-lm",
            "big_bird.masked-lm", "longt5.seq2seq-lm", "led.seq2seq-lm", "wav2vec2.ctc", "hubert.ctc",
            "detr.object-detection", "rt_detr.object-detection", "yolos.object-detection")


@pytest.fixture(scope="module")
def rows():
    return {r.key: r for r in zoo_build.enumerate_rows()}


@pytest.fixture(scope="module")
def tokenizers():
    """The zoo's tokenizers, trained once for the module (each takes seconds)."""
    return {}


def test_every_causal_lm_the_mapping_lists_is_a_row_and_each_row_is_one_type_in_one_family(rows):
    """Breadth: the rows are enumerated from the Auto mappings, not hand-listed; a row is one model type in one
    task family, and an encoder's text heads are one row."""
    from transformers.models.auto import modeling_auto
    causal = {k for k, r in rows.items() if r.family == "causal-lm"}
    assert causal == {f"{t}.causal-lm" for t in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    assert set(zoo_build.FAMILIES) == {r.family for r in rows.values()}
    heads = [r.model_type for r in rows.values() if r.family in zoo_build.TEXT_HEADS]
    assert len(heads) == len(set(heads)) and "bert.masked-lm" in rows and "bert.text-classification" not in rows
    assert "bart.masked-lm" not in rows        # BART's masked-LM class is its seq2seq row's


def test_the_families_migrations_stall_on_are_rows(rows):
    """Breadth: recurrent, hybrid, mixture-of-experts, sliding-window, sparse-attention, speech front-end and
    detection architectures are all in the zoo."""
    assert [k for k in STALLING if k not in rows] == []


@pytest.mark.parametrize("key", ["mamba2.causal-lm", "wav2vec2.ctc", "detr.object-detection",
                                 "vit.image-classification", "convnext.image-classification", "t5.seq2seq-lm"])
def test_a_stalling_family_builds_at_a_tiny_size_with_its_processor(rows, tokenizers, tmp_path, key):
    """Build: Mamba2 (its heads fitted to expand x hidden), wav2vec2 with its group-normed convolutional front
    end, DETR on a transformers ResNet backbone, ViT and ConvNeXt build from their configs, saved with their
    processors (an image processor making the zoo's side: ViT's zoo run was refused at 224x224)."""
    import json
    folder = zoo_build.build(rows[key], tmp_path, tokenizers)
    config = json.loads((folder / "config.json").read_text())
    assert (folder / "DONE").is_file() and config["architectures"] == [rows[key].cls]
    assert any(folder.glob("*.safetensors"))
    if key not in ("mamba2.causal-lm", "t5.seq2seq-lm"):
        assert (folder / "preprocessor_config.json").is_file()
    if key == "wav2vec2.ctc":
        assert config["feat_extract_norm"] == "group" and config["num_hidden_layers"] == 2
    if key == "mamba2.causal-lm":
        assert (folder / "tokenizer.json").is_file() and config["hidden_size"] == 32
    if key == "t5.seq2seq-lm":    # the decoder's start token (T5's zoo run crashed in every stage without it)
        assert config["decoder_start_token_id"] == config["pad_token_id"] == 0
    if key.endswith("image-classification"):     # the processor makes the images the config takes
        from portkit.models import huggingface
        side = huggingface.image_side(huggingface.image_processor(folder))
        assert side == zoo_build.sizes()["image_side"] == config.get("image_size", side)


def test_a_row_that_needs_a_missing_package_says_so_in_one_line(rows, tmp_path):
    """Not buildable: timm's wrapper needs timm and torchvision, neither installed here; the row's one line names
    what transformers said is missing (it names only the backends it finds absent, which may be either)."""
    with pytest.raises(zoo_build.NotBuilt) as caught:
        zoo_build.build(rows["timm_wrapper.image-classification"], tmp_path, {})
    text = str(caught.value)
    assert "\n" not in text
    assert re.search(r"\(missing: [^)]*(timm|Torchvision)", text), text


def test_per_layer_lists_keep_one_layer_of_each_kind():
    """Size: a hybrid's per-layer list keeps an attention layer and a recurrent one, and the layer count follows."""
    table = zoo_build.sizes()
    out = zoo_build.shrink({"num_hidden_layers": 24, "hidden_size": 1024,
                            "layer_types": ["linear_attention"] * 3 + ["full_attention"] * 21}, table, {})
    assert out["layer_types"] == ["linear_attention", "full_attention"] and out["num_hidden_layers"] == 2
    assert out["hidden_size"] == table["scalars"]["hidden_size"]


def test_multi_head_attention_stays_multi_head_and_grouped_query_stays_grouped():
    """Size: the tiny size keeps an architecture's attention kind: as many key/value heads as query heads where its
    default has them (ESMC refuses grouped-query attention, so made grouped it was not buildable), fewer where its
    default groups them."""
    table = zoo_build.sizes()
    mha = zoo_build.shrink({"hidden_size": 960, "num_attention_heads": 15, "num_key_value_heads": 15}, table, {})
    assert mha["num_key_value_heads"] == mha["num_attention_heads"] == table["scalars"]["num_attention_heads"]
    gqa = zoo_build.shrink({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}, table, {})
    assert gqa["num_key_value_heads"] == table["scalars"]["num_key_value_heads"] < gqa["num_attention_heads"]


def test_a_width_derived_from_the_hidden_size_keeps_its_ratio():
    """Size: RWKV's attention is as wide as its model; shrinking one and not the other breaks its forward pass."""
    out = zoo_build.shrink({"hidden_size": 4096, "attention_hidden_size": 4096}, zoo_build.sizes(), {})
    assert out["attention_hidden_size"] == out["hidden_size"]


def test_a_text_model_that_does_not_run_at_the_zoos_size_is_not_buildable(tokenizers):
    """Build: a model whose eager forward pass fails at the zoo's size, outside portkit, is the zoo's row that
    could not be built (one line), never a stage crash blamed on portkit."""
    import torch

    class Broken(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            raise RuntimeError("The size of tensor a (32) must match the size of tensor b (64)\nat dimension 1")

    with pytest.raises(zoo_build.NotBuilt) as caught:
        zoo_build.smoke(Broken(), zoo_build.Row("x", "causal-lm", "X"), zoo_build.tokenizer("bpe", tokenizers))
    assert str(caught.value) == ("an eager forward pass at the zoo's size fails, outside portkit: RuntimeError: "
                                 "The size of tensor a (32) must match the size of tensor b (64)")


def test_a_detector_that_does_not_run_at_the_zoos_size_is_not_buildable():
    """Build: a detector or segmenter runs one eager pass on a grey image its own processor made; a neck sized for
    another backbone fails there, outside portkit, and the row is not buildable (one line), not a stage crash."""
    import torch

    class Broken(torch.nn.Module):
        def forward(self, pixel_values):
            assert pixel_values.shape == (2, 3, 16, 16)
            raise ValueError("The number of hidden states should be equal to the number of neck hidden sizes.")

    def processor(images, do_rescale, return_tensors):
        return {"pixel_values": torch.zeros(len(images), 3, 16, 16)}

    with pytest.raises(zoo_build.NotBuilt, match=r"^an eager forward pass at the zoo's size fails, outside portkit: "
                                                 r"ValueError: The number of hidden states"):
        zoo_build.smoke(Broken(), zoo_build.Row("dpt", "semantic-segmentation", "X"), None, [processor])


def _result(key, family, **fields):
    result = zoo.Result(key, key.split(".")[0], family, "Cls", commit="c")
    for name, value in fields.items():
        setattr(result, name, value)
    return result


def test_the_page_and_the_last_line_count_what_the_rows_hold():
    """Counts: N rows, B not buildable, K crashes, V violations and M not assessed; the causal-LM share per target
    labelled emulated; one row per architecture with its detail in a collapsible cell."""
    results = [
        _result("a.causal-lm", "causal-lm", verdicts={"neuron": "ready with work", "tpu": "blocked"},
                stages={"fallbacks": "ok"}, finding="neuron: attention mask"),
        _result("b.causal-lm", "causal-lm", built="ImportError: needs timm (missing: timm)"),
        _result("c.ctc", "ctc", verdicts={"neuron": "not assessed", "tpu": "ready"}, crashes=[["xla", "boom"]],
                violations=["cause counted twice (tpu): x"], stages={"fallbacks": "ok", "xla": "failed"}),
        _result("d.object-detection", "object-detection", refused="architecture X: portkit loads ...",
                verdicts={"neuron": "not assessed", "tpu": "not assessed"})]
    assert zoo.summary_line(results) == ("zoo: 4 architectures (1 not buildable), 1 stage crashes, "
                                         "1 rule violations, 3 not assessed")
    assert zoo.shares(results)["causal-lm"]["neuron"] == {"ready": 0, "ready with work": 1, "blocked": 0,
                                                           "not assessed": 0, zoo.SEEDED: 0, "not buildable": 1,
                                                           zoo.ROW_FAILED: 0}
    assert zoo.shares(results)["ctc"]["tpu"][zoo.ROW_FAILED] == 1     # "ready", but with a crash and a violation
    assert "neuron 1/2 (50%), tpu 0/2 (0%)" in zoo.causal_claim(results) and "emulated" in zoo.causal_claim(results)
    assert "denominator holds every causal-LM model type" in zoo.causal_claim(results, listed=2)
    assert "a sample: 2 of the 196 causal-LM model types" in zoo.causal_claim(results, listed=196)
    page = zoo.render(results, ["fallbacks", "xla"], {"date": "d", "commit": "c", "command": "python zoo", "host": "h",
                                                      "summary": "s"})
    table = page.split("## Architectures", 1)[1]
    assert table.count("<details>") == 4 and table.count("\n| ") == 5     # the header and one line per row
    assert "missing: timm" in page and "rule violation" in page and "- commit: `c`" in page
    alarms = page.split("## Stage crashes and rule violations", 1)[1].split("##", 1)[0]
    assert "c.ctc: crash in xla: boom" in alarms and "c.ctc: cause counted twice" in alarms


def test_a_table_of_rows_run_at_several_commits_names_each_commit_with_its_rows():
    """A zoo resumed across commits: the page names every commit the rows ran at, with its count, and the one the
    table was written at; a row whose commit was not recorded is counted as such, never as the current one."""
    results = [_result("a.ctc", "ctc"), _result("b.ctc", "ctc"), _result("c.ctc", "ctc", commit="old"),
               _result("d.ctc", "ctc", commit="")]
    page = zoo.render(results, ["fallbacks"], {"date": "d", "commit": "c", "command": "python zoo", "host": "h",
                                               "summary": "s"})
    assert "- commit: `c` (2 rows); `old` (1 rows); `not recorded` (1 rows); table written at `c`" in page


def _report_target(verdict, *findings):
    return {"verdict": verdict, "based_on": ["fallbacks", "accuracy"], "unassessed": [],
            "findings": [{"stage": stage, "kind": kind, "severity": severity, "message": message}
                         for stage, kind, severity, message in findings]}


def test_a_verdict_that_rests_on_a_task_metric_of_seeded_weights_is_counted_as_such():
    """Seeded weights: stage 4's task-metric findings are set aside and the rest graded by the written policy; a
    verdict that changes without them counts as SEEDED (its cell shows both), one that stands is counted as it is."""
    top1 = ("accuracy", "accuracy", "blocker", "precision 'default': task: top-1 agreement 0.988 outside >= 0.99")
    alone, beside = zoo.Result("w.ctc", "w", "ctc", "W"), zoo.Result("v.ctc", "v", "ctc", "V")
    zoo._set_aside(alone, "tpu", _report_target("blocked", top1, ("compile", "storm", "info", "10 compiles")))
    zoo._set_aside(beside, "tpu", _report_target("blocked", top1, ("buckets", "padding", "blocker", "padding")))
    assert alone.judged == {"tpu": "ready"} and "top-1 agreement 0.988" in alone.seeded["tpu"]
    assert beside.judged == {} and "top-1" in beside.seeded["tpu"]     # blocked by padding whatever the metric
    alone.verdicts, beside.verdicts = {"neuron": "ready", "tpu": "blocked"}, {"neuron": "ready", "tpu": "blocked"}
    assert zoo.outcome(alone, "tpu") == zoo.SEEDED and zoo.outcome(beside, "tpu") == "blocked"
    assert zoo.outcome(alone, "neuron") == "ready"
    alone.peak = {"bytes": 900 * 2 ** 20, "source": "process peak: the row's kernels, sampled"}
    page = zoo.render([alone, beside], ["fallbacks"], {"date": "d", "commit": "c", "command": "z", "host": "h",
                                                        "summary": "s"})
    row = next(line for line in page.splitlines() if line.startswith("| w "))
    assert f"blocked<br><sub>{zoo.SEEDED}: ready without it</sub>" in row and "900 MiB (process peak)" in row


def test_the_peak_memory_a_stage_records_in_run_json_wins_over_the_sampled_one(tmp_path):
    """Peak memory: the largest PEAK_KEY a stage records in run.json, read from the run folder; 0 where none."""
    (tmp_path / "run.json").write_text(json.dumps({"stages": {"fallbacks": {zoo.PEAK_KEY: 5 * 2 ** 20},
                                                              "compile": {zoo.PEAK_KEY: 7 * 2 ** 20}}}))
    assert zoo._recorded_peak(tmp_path) == 7 * 2 ** 20 and zoo._recorded_peak(tmp_path / "absent") == 0


def test_a_rows_cpu_time_counts_the_kernels_it_started():
    """CPU time: a child process that ended (a row's kernel) counts in the row's CPU seconds, beside this process
    (kernel_forks.cpu_seconds, which the zoo and a sweep read; a forked kernel's: tests/run/test_kernel_forks.py)."""
    from portkit.run import kernel_forks
    before = kernel_forks.cpu_seconds()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert kernel_forks.cpu_seconds() > before


def test_a_zoo_started_again_skips_the_rows_it_finished(tmp_path):
    """Resume: a finished row's result is on disk; the same stages and parameters read it back, others do not."""
    result = _result("a.causal-lm", "causal-lm", verdicts={"neuron": "ready", "tpu": "ready"})
    (tmp_path / "rows").mkdir()
    zoo.save(tmp_path, result, "sig")
    assert zoo.load_done(tmp_path, "sig") == {"a.causal-lm": result}
    assert zoo.load_done(tmp_path, "other") == {}
    # a row saved when the signature held the builder's key keeps it as its own builder
    zoo.save(tmp_path, _result("b.ctc", "ctc"), "sig|fd4cdb66170f")
    assert zoo.load_done(tmp_path, "sig")["b.ctc"].builder == "fd4cdb66170f"
    assert "b.ctc" not in zoo.load_done(tmp_path, "si")


@pytest.mark.slow
def test_the_zoo_runs_rows_writes_its_page_and_resumes(tmp_path):
    """End to end on two cheap rows through stage 1 and the report: a text encoder and a detection model (its class
    logits and boxes per query), no crash; run again, both rows are skipped."""
    command = [sys.executable, str(ROOT / "benchmarks" / "zoo.py"), "--only", "bert.masked-lm,detr.object-detection",
               "--stages", "fallbacks,report", "--out", str(tmp_path / "runs"), "--doc", str(tmp_path / "zoo.md")]
    first = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    last = first.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, f"{last!r}\n{first.stderr[-3000:]}"
    assert match.groups()[:3] == ("2", "0", "0"), first.stdout
    page = (tmp_path / "zoo.md").read_text()
    assert "detr" in page and "bert" in page and "- command: `python benchmarks/zoo.py --only" in page
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert "2 finished before" in again.stdout and again.stdout.strip().splitlines()[-1].startswith(last[:60])
    row = json.loads((tmp_path / "runs" / "rows" / "bert.masked-lm.json").read_text())["result"]
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", row["commit"]) and "GFLOP/s" in row["host"]
    # --table: the page from the finished rows; a selected row not finished is counted as such and never run
    table = subprocess.run([*command[:3], "bert.masked-lm,detr.object-detection,albert.masked-lm", *command[4:],
                            "--table"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "(2 of 3 rows finished)" in (tmp_path / "zoo.md").read_text()
    assert not (tmp_path / "runs" / "runs" / "albert.masked-lm").exists()
