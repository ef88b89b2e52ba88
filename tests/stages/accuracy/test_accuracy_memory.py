"""Memory by construction: the accuracy stage streams its task sample in passes sized from the model's measured
activations and a budget, keeping per-item values; each stage's peak memory is recorded in run.json and read back.
A tiny image classifier built to hold a large activation a row (its input repeated WIDE times): seconds."""
import json
import mmap
import sys

import pytest
import torch
from torch import nn

from portkit.core import memory
from portkit.corpora.corpus import corpus_for, example_batch
from portkit.models import inputs
from portkit.models import registry
from portkit.runfolder import layout, reading, run_log
from portkit.stages.accuracy import footprint
from portkit.stages.accuracy import settings
from portkit.stages.accuracy import stage

from fixtures.images import image_folder

SIZE = 8
WIDE = 4096                                  # the input repeated: 3 * 8 * 8 * 4096 floats = 3 MiB a row
ROW = 3 * SIZE * SIZE * WIDE * 4


class _Wide(nn.Module):
    """Four classes far apart on every image (each target's top-1 label equals float32's), through one activation
    of ROW bytes a row."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, pixel_values):
        wide = pixel_values.repeat(1, WIDE, 1, 1)              # ROW bytes a row, alive until the sum below
        logits = self.conv(pixel_values).mean((2, 3)) + wide.sum((1, 2, 3), keepdim=True) * 0
        return {"logits": logits + 100 * nn.functional.one_hot(logits.argmax(-1), 4)}


def _model() -> registry.LoadedModel:
    decl = inputs.image_declaration(SIZE, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),))
    return registry.LoadedModel("wide-classifier", inputs.IMAGE_CLASSIFIER, _Wide().eval(), "test",
                                image_size=SIZE, declaration=decl)


def _task(model, corpus, pass_bytes):
    batch, described = example_batch(model, corpus, 2, SIZE, seed=0)
    report = stage.check_accuracy(model, batch, ["tpu"], stage.Options.of({"task_bounds": {"agreement": 0.95}}),
                                  corpus=corpus, description=described,
                                  scope=stage.Scope(all_precisions=False, layers=False, compiled=False, progress=False,
                                                    float64_reference=False, task_items=40, pass_bytes=pass_bytes))
    return report.targets["tpu"].chosen.task


def test_live_bytes_counts_what_ops_create_and_still_hold_once_per_storage():
    """Rule: a pass's activations are the bytes its ops create and still reference, at their peak: a view counts
    nothing more, a freed tensor leaves the count, a view of a tensor made before (an input) counts nothing."""
    x = torch.ones(1000)
    with footprint.LiveBytes() as meter:
        a = x * 2                        # 4,000 bytes
        view = a[:10]                    # the same storage: nothing more
        del a
        b = x + 1                        # a's storage is still held by the view: 8,000 at the peak
        del view, b
        x.view(10, 100)                  # a view of the input: nothing
        c = torch.ones(250)              # 1,000 bytes, after the others were freed
    assert meter.peak == 8000 and meter.live == c.nbytes == 1000


def test_a_model_with_large_activations_gets_passes_sized_to_the_budget_and_the_same_verdict(tmp_path):
    """Rule: the task sample runs in passes of TASK_BATCH rows, fewer where a row's measured activations times
    PASS_OVERHEAD would take the pass past its budget; the result says so, and the values decided on are the same
    as in passes of TASK_BATCH (per-item values, joined)."""
    model = _model()
    corpus = corpus_for(model, image_folder(tmp_path / "photos", 40, SIZE))
    batch, _ = example_batch(model, corpus, 2, SIZE, seed=0)
    per_row = footprint.row_bytes(model, batch, fixed_rows=True)
    assert per_row >= ROW                    # the repeated input at least; the process's own pages may add more
    budget = 10 * ROW                        # at PASS_OVERHEAD x ROW a row: at most 3 rows a pass
    assert footprint.rows_per_pass(ROW, settings.TASK_BATCH, budget) == 3
    streamed = _task(model, corpus, budget)
    rows = streamed["sample"]["batch"]
    assert 1 <= rows <= 3 and streamed["sample"]["items"] == 40
    assert f"{rows} a pass, not {settings.TASK_BATCH}" in streamed["sample"]["batch_why"]
    whole = _task(model, corpus, footprint.PASS_BYTES)      # portkit's cap: rows of a few MiB fit 32 to a pass
    assert whole["sample"]["batch"] == settings.TASK_BATCH and "batch_why" not in whole["sample"]
    assert [c["value"] for c in streamed["checks"]] == [c["value"] for c in whole["checks"]]
    assert streamed["decision"] == whole["decision"] == "pass"


class _LazyBuffer(nn.Module):
    """Builds a 64 MiB buffer on its first call and keeps it: a one-time cost of the first call, like weights loaded
    memory-mapped from safetensors entering resident memory when an op first reads them."""

    def __init__(self):
        super().__init__()
        self.conv, self.table = nn.Conv2d(3, 4, 3), None

    def forward(self, pixel_values):
        if self.table is None:
            self.table = torch.ones(16 * 2 ** 20)
        return {"logits": self.conv(pixel_values).mean((2, 3)) + self.table[:4]}


def test_a_first_calls_one_time_costs_are_no_rows_activations():
    """Rule: one row's measured activations exclude what a first call allocates once and keeps (a lazily built
    buffer; memory-mapped weights paging in): measured cold, a tiny masked LM's plan step estimated 40 GiB for a
    batch of 2 and refused it."""
    decl = inputs.image_declaration(SIZE, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),))
    model = registry.LoadedModel("lazy", inputs.IMAGE_CLASSIFIER, _LazyBuffer().eval(), "test", image_size=SIZE,
                                 declaration=decl)
    row = {"pixel_values": torch.zeros(1, 3, SIZE, SIZE)}
    assert footprint.row_bytes(model, row, fixed_rows=True) < 2 ** 20


def test_a_pass_holds_one_row_at_least_and_the_budget_follows_the_memory_available():
    """Rule: a row too large for the budget still runs, alone; the budget is portkit's cap or a share of the memory
    available, whichever is less."""
    assert footprint.rows_per_pass(10 * memory.GIB, 32, footprint.PASS_BYTES) == 1
    assert footprint.rows_per_pass(1, 32, footprint.PASS_BYTES) == 32
    assert footprint.pass_budget(available=64 * memory.GIB) == footprint.PASS_BYTES
    assert footprint.pass_budget(available=4 * memory.GIB) == int(footprint.PASS_SHARE * 4 * memory.GIB)


def test_each_stage_records_its_peak_memory_in_the_run_log_and_reads_it_back(tmp_path):
    """Rule: run.json holds each stage's peak resident memory in bytes under run_log.PEAK_KEY, written by
    run_log.record and read by run_log.StageRun beside the stage's time; a damaged value is named."""
    run_log.record(tmp_path, "accuracy", "ok", 12.34, "", 3 * memory.GIB)
    run_log.record(tmp_path, "compile", "failed", 1.0, "boom")
    saved = json.loads((tmp_path / layout.RUN_LOG).read_text())
    assert saved["stages"]["accuracy"][run_log.PEAK_KEY] == 3 * memory.GIB
    log = run_log.read(tmp_path)
    assert log.stages["accuracy"] == run_log.StageRun("ok", "", 12.3, "04_accuracy.ipynb", 3 * memory.GIB)
    assert log.stages["compile"].peak_memory_bytes is None
    saved["stages"]["accuracy"][run_log.PEAK_KEY] = "3 GiB"
    (tmp_path / layout.RUN_LOG).write_text(json.dumps(saved))
    with pytest.raises(reading.UnreadableResult, match=r"stages.accuracy.peak_memory_bytes is '3 GiB', not an integer"):
        run_log.read(tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak is read from Linux's /proc")
def test_a_process_peak_is_reset_and_read_from_the_systems_own_accounting():
    """Rule: a stage's peak is the kernel's VmHWM since the stage started (reset through clear_refs), not sampled."""
    assert memory.reset_peak()
    before = memory.resident()
    # 64 MiB of new pages, written: an anonymous mapping is resident only once written, whatever freed memory the
    # process's allocator keeps from earlier tests (a tensor of 64 MiB reused such memory once: no rise at all)
    held = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(held), mmap.PAGESIZE):
        held[offset] = 1
    high = memory.peak()
    held.close()
    assert high - before >= 60 * 2**20
    assert memory.reset_peak() and memory.peak() < high


def test_the_reports_stage_table_shows_each_stages_time_and_peak_memory():
    """Rule: the report shows a stage's peak memory beside its time, from run.json; "not measured" where the run
    recorded none, a dash where no run recorded the stage."""
    from portkit.stages.report.stage import StageResult
    recorded = StageResult("accuracy", "accuracy.json", "04_accuracy.ipynb", "ok",
                           run=run_log.StageRun("ok", "", 612.4, peak_memory_bytes=3 * memory.GIB))
    assert recorded.time_and_memory() == ("612 s", "3.00 GiB")
    assert recorded.to_dict()["peak_memory_bytes"] == 3 * memory.GIB
    unmeasured = StageResult("xla", "xla.json", "03b_xla.ipynb", "ok", run=run_log.StageRun("ok", "", 5.0))
    assert unmeasured.time_and_memory() == ("5 s", "not measured")
    assert StageResult("compile", "compile.json", "02_compile.ipynb", "missing").time_and_memory() == ("—", "—")


def test_the_float64_reference_runs_in_calls_that_fit_its_budget_and_whole_where_the_batch_fits():
    """Rule: the float64 copy (no fast CPU kernels for some ops: a row can cost many times its float32 pass) runs a
    batch in calls of as many rows as fit the budget, sized once by one row's measured peak; a batch that fits runs
    in one call, as without a budget; the outputs are the batch's either way."""
    from portkit.stages.accuracy import target_runs
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 8)).eval()

    class _Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = module

        def forward(self, x):
            return {"y": self.net(x)}
    x = torch.randn(5, 64)
    whole, _ = target_runs.Float64Reference(_Named())({"x": x})
    tight = target_runs.Float64Reference(_Named(), budget=1)
    split, note = tight({"x": x})
    assert tight.rows == 1 and note == "float64 eager on the CPU"
    torch.testing.assert_close(split["y"], whole["y"], rtol=1e-12, atol=1e-12)
    roomy = target_runs.Float64Reference(_Named(), budget=footprint.PASS_BYTES)
    assert torch.equal(roomy({"x": x})[0]["y"], whole["y"]) and roomy.rows >= 5


# ---------------------------------------------------------------- vocabulary-wide outputs: a piece at a time
VOCAB = 30522                                # minilm's tokenizer: 2 texts x 128 tokens of logits = 62 MiB in float64


class _TinyLM(nn.Module):
    """A causal LM built for the comparisons' memory: a few weights, logits as wide as a real vocabulary."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)

    def forward(self, input_ids, attention_mask):
        return {"logits": self.head(torch.tanh(self.embed(input_ids).cumsum(1)))}


def _lm() -> registry.LoadedModel:
    return registry.LoadedModel("tiny-lm", inputs.CAUSAL_LM, _TinyLM().eval(), "test model",
                                tokenizer=registry.minilm_tokenizer())


def test_comparisons_of_vocabulary_wide_outputs_hold_a_piece_not_the_output_and_give_the_same_values(monkeypatch):
    """Rule: compare() and a language model's per-item values work through the real positions in pieces of at most
    PIECE_BYTES of float64, so what they create at their peak is a few pieces, less than one float64 copy of the
    logits; the values are the one-piece values (the relative L2 error up to the order of its sum)."""
    from portkit.stages.accuracy import comparison
    from portkit.targets.tolerance import tolerance_for
    from portkit.targets import specs
    torch.manual_seed(1)
    expected = torch.randn(2, 128, VOCAB)
    actual = expected.to(torch.bfloat16).float()
    mask = torch.ones(2, 128, dtype=torch.long)
    mask[1, 100:] = 0
    ids = torch.randint(0, VOCAB, (2, 128))
    tol = tolerance_for(specs.get("tpu").precision("highest"))
    whole = comparison.compare(actual, expected, tol, mask), comparison.item_values(
        inputs.CAUSAL_LM, actual, expected, mask, {"input_ids": ids})
    monkeypatch.setattr(comparison, "PIECE_BYTES", 2**20)
    with footprint.LiveBytes() as meter:
        pieces = comparison.compare(actual, expected, tol, mask), comparison.item_values(
            inputs.CAUSAL_LM, actual, expected, mask, {"input_ids": ids})
    assert meter.peak < expected.numel() * 8 / 4          # a quarter of one float64 copy: a few 1 MiB pieces
    assert pieces[0].pop("rel_l2") == pytest.approx(whole[0].pop("rel_l2"), rel=1e-12)
    assert pieces[0] == whole[0] and not whole[0]["passed"]
    assert pieces[1].keys() == whole[1].keys() and all(torch.equal(pieces[1][k], whole[1][k]) for k in whole[1])


@pytest.mark.parametrize("rows", [1, 3, 7, 64])
def test_the_tolerance_over_pieces_says_what_assert_close_says_over_the_whole(rows):
    """Rule: Tolerance.misses gives Tolerance.check's words (torch.testing.assert_close's message) for a tensor taken
    in pieces of rows: how many elements miss, and the greatest absolute and relative difference among them, the
    first where they tie, NaN first of all, at its index in the whole tensor; None where every element is close."""
    from portkit.targets.tolerance import Tolerance
    tol = Tolerance("float32", 1.3e-6, 1e-5)
    expected = torch.zeros(64, 5)
    cases = [expected.clone()]
    ties = expected.clone()
    ties[3, 2], ties[10, 1], ties[40, 0] = 1.0, 1.0, -1.0
    cases.append(ties)
    nan = ties.clone()
    nan[50, 4] = float("nan")
    cases.append(nan)
    relative = torch.full((64, 5), 2.0)
    relative[5, 0], relative[60, 3] = 2.5, 9.0
    cases += [relative, torch.randn(64, 5)]
    for actual in cases:
        misses = tol.misses(actual.shape)
        for a, e in zip(actual.split(rows), (expected if actual is not relative else torch.full((64, 5), 2.0 + 1e-3))
                        .split(rows)):
            misses.add(a, e)
        whole = tol.check(actual, expected if actual is not relative else torch.full((64, 5), 2.0 + 1e-3))
        assert misses.reason() == whole
    assert tol.check(cases[0], expected) is None
    ints = tol.misses((4,))
    ints.add(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 5, 3, 0]))
    assert ints.reason() == tol.check(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 5, 3, 0]))


def test_bucket_references_are_kept_within_reference_bytes_and_recomputing_them_changes_no_result(monkeypatch, corpus):
    """Rule: a bucket's reference outputs (float32, float64) are kept for the next path that needs them only while the
    kept ones stay within REFERENCE_BYTES, the oldest given up first, and never its GPU-baseline outputs; a bucket
    given up is recomputed where needed again (another target with the same boundaries), with the same result."""
    from portkit.stages.accuracy import reference
    model, kept = _lm(), []
    build = reference.Reference.build

    def keep(*args, **kwargs):
        kept.append(build(*args, **kwargs))
        return kept[-1]
    monkeypatch.setattr(reference.Reference, "build", keep)
    batch, _ = example_batch(model, corpus, 2, 16, seed=0)
    scope = stage.Scope(task_items=8, task_items_max=8, all_precisions=False, layers=False, compiled=False,
                        progress=False)

    def run():
        return stage.check_accuracy(model, batch, ["neuron", "tpu"], stage.Options.of({"batch_size": 2}),
                                    corpus=corpus, buckets=[16, 128], scope=scope).to_dict()
    unbounded = run()
    every = kept[-1].buckets
    assert len(every) == 2 and all("outputs" not in b[2] for b in every.values())     # both buckets, no GPU outputs
    largest = max(map(reference._output_bytes, every.values()))
    monkeypatch.setattr(reference, "REFERENCE_BYTES", largest - 1)
    bounded = run()
    assert sum(map(reference._output_bytes, kept[-1].buckets.values())) < largest    # the 128-token bucket given up
    assert len(kept[-1].buckets) == 1
    for found in (bounded, unbounded):
        for target in found["targets"].values():
            target.pop("seconds", None)
    assert bounded == unbounded


def test_a_model_that_takes_no_single_row_runs_its_float64_batch_whole():
    """Rule: a stage fails only for a defect in portkit. The float64 reference sizes its calls by one row's
    measured peak; a group norm over a 1x1 map has one value a group at batch 1 and raises (Deformable DETR's input
    projection, built at the zoo's size, crashed stage 4). One row is portkit's measure, so the batch runs whole."""
    import torch
    from portkit.stages.accuracy.target_runs import Float64Reference
    module = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 1), torch.nn.GroupNorm(8, 8)).eval()
    batch = torch.randn(3, 4, 1, 1)
    with pytest.raises(ValueError):
        module.double()(batch[:1].double())
    out, note = Float64Reference(torch.nn.Sequential(module), budget=10**9)({"input": batch})
    assert out is not None and note == "float64 eager on the CPU"


class _NoSingleRow(torch.nn.Module):
    """A group norm over one pooled position: one value a group at batch 1, so a single row raises."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(30522, 8), torch.nn.GroupNorm(8, 8)

    def forward(self, input_ids, attention_mask):
        return {"logits": self.norm(self.embed(input_ids).mean(1, keepdim=True).transpose(1, 2)).transpose(1, 2)}


def test_a_model_that_takes_no_single_row_is_measured_on_its_batch():
    """Rule: a stage fails only for a defect in portkit. Stage 4 sizes its task passes by one row's measured
    footprint; a model that takes no single row (Deformable DETR at the zoo's size) crashed stage 4 there. The
    batch as given is measured instead, per row."""
    from portkit.models import registry
    from portkit.stages.accuracy import footprint
    m = registry.LoadedModel("no-single-row", registry.TOKEN_CLASSIFIER, _NoSingleRow().eval(), "test model",
                             tokenizer=registry.minilm_tokenizer())
    batch = m.encode(["return the sum of two numbers", "open a socket"])
    with pytest.raises(ValueError):
        m.module(**m.declaration.fit(batch, {"batch": 1}, pad=False))
    assert footprint.row_bytes(m, batch, fixed_rows=False) > 0


class _Chunked(nn.Module):
    """Activations that do not grow with the length: one CHUNK-byte buffer a row whatever its tokens (as Kimi Linear's
    chunked attention holds about 205 MiB at 16, 32 and 64 tokens)."""
    CHUNK = 32 * 2 ** 20

    def forward(self, input_ids, attention_mask):
        held = torch.ones(input_ids.shape[0], self.CHUNK // 4)
        return {"logits": (input_ids[..., None].float() + held.sum(-1)[:, None, None] * 0).repeat(1, 1, 4)}


def test_a_batch_refused_on_a_scaled_estimate_is_measured_at_the_longest_length_first():
    """Rule: a refusal rests on a measure. One row's activations, measured at 16 tokens, are scaled to the model's
    longest length (512) in proportion; where that estimate would refuse the batch and one such row is safe to run,
    the row is measured at 512 tokens instead. Kimi Linear's plan step refused a batch of 2 on 79.9 GiB."""
    tok = registry.minilm_tokenizer()
    decl = inputs.text_declaration(tok, ("input_ids", "attention_mask"), 512,
                                   (inputs.Output("logits", inputs.TOKEN_CLASSIFIER),))
    model = registry.LoadedModel("chunked", inputs.TOKEN_CLASSIFIER, _Chunked().eval(), "test", tokenizer=tok,
                                 max_length=512, declaration=decl)
    row = model.encode(["Open the file and read it."], pad_to=16)
    scaled = footprint.row_bytes(model, row, fixed_rows=False)
    assert scaled >= 30 * _Chunked.CHUNK                         # 512 / 16 times the buffer
    fixed = footprint.INTERPRETER_BYTES + footprint.WEIGHT_COPIES * footprint.weight_bytes(model.module) \
        + footprint.pass_budget()
    budget = fixed + 4 * footprint.MAIN_BATCH_OVERHEAD * _Chunked.CHUNK      # room for 4 measured rows, not 2 scaled
    needed, fits = footprint.stage_estimate(model, row, 2, budget)
    assert fits >= 2 and needed < budget
    assert needed - fixed < 2 * 2 * footprint.MAIN_BATCH_OVERHEAD * _Chunked.CHUNK
