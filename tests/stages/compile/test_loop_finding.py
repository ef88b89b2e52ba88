"""Stage 2 names a Python loop over the input length as the cause of a recompile storm: Dynamo unrolls it, so
each length is its own graph, and the graphs grow with the length. Both signals are required: the loop in the
source and the graphs growing; a loop over a constant, a loop over the batch or a shape-dependent branch is not it."""
from pathlib import Path

import pytest
import torch
from torch import nn

from portkit.core.findings import cause_key
from portkit.corpora.requests import Requests
from portkit.models.registry import LoadedModel, OutputsAdapter, TOKEN_CLASSIFIER, minilm_tokenizer
from portkit.stages.compile import loops
from portkit.stages.compile.stage import CompileReport, Options, StormSettings, compile_model, economics

CHUNK = 4
LENGTHS = (8, 16, 24)            # 2, 4 and 6 chunks: three graphs, each larger than the last
HERE = Path(__file__).resolve()


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(HERE.read_text().splitlines(), 1) if marker in line)


class ChunkedLoop(nn.Module):
    """The user's chunked model: a Python loop over fixed chunks of its input's length."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        outs = []
        for start in range(0, h.shape[1], CHUNK):   # the length loop
            outs.append(self.proj(h[:, start:start + CHUNK]))
        return {"out": torch.cat(outs, 1)}


class ConstantLoop(nn.Module):
    """A loop over a fixed count: the same graph at every length (the storm is the static shapes' alone)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        for _ in range(4):
            h = self.proj(h)
        return {"out": h}


class BatchLoopAndBranch(nn.Module):
    """A loop over the batch (one row at every length) and a branch on the length: the source reads a size in a
    loop and the graphs differ by length, but they do not grow with it (one step, the branch's)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        if input_ids.shape[1] > LENGTHS[0]:
            h = torch.tanh(self.proj(h))
        rows = []
        for b in range(h.shape[0]):          # the batch loop
            rows.append(h[b] * 2)
        return {"out": torch.stack(rows)}


class ShapeBranch(nn.Module):
    """Recompiles for another reason: a shape-dependent branch, no loop."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        if h.shape[1] > LENGTHS[0]:
            h = torch.tanh(self.proj(h))
        return {"out": self.proj(h)}


def loaded(module: nn.Module) -> LoadedModel:
    torch.manual_seed(0)
    return LoadedModel(type(module).__name__, TOKEN_CLASSIFIER, OutputsAdapter(module).eval(),
                              "test module", tokenizer=minilm_tokenizer())


def storm_of(m: LoadedModel) -> Requests:
    """One request at each of LENGTHS tokens (a real text padded to it)."""
    text = "A chunked model reads its input in fixed chunks."
    return Requests([[text] for _ in LENGTHS], [m.encode([text], pad_to=n) for n in LENGTHS], "test", m)


def report_of(module: nn.Module, targets=("neuron",)) -> CompileReport:
    m = loaded(module)
    cost = economics.neuron_estimate(10**6)    # these tests are not about the price of a compile
    return compile_model(m, storm_of(m), list(targets), Options.of({"seq_len": LENGTHS[0]}),
                                   storm=StormSettings(progress=False), costs=dict.fromkeys(targets, cost))


def storm_findings(report: CompileReport) -> list[dict]:
    return [f for f in report.findings("neuron") if f["kind"] == "recompile_storm"]


@pytest.fixture(scope="module")
def chunked():
    return report_of(ChunkedLoop(), ("neuron", "tpu"))    # two emulated targets: one shared Dynamo pass


def test_the_loop_over_the_length_is_named_with_its_line_and_its_graphs(chunked):
    loop = line_of("# the length loop")
    storm = chunked.storms["neuron"]
    assert storm.compile_count() == len(LENGTHS)
    assert storm.loop["where"]["file"] == str(HERE) and storm.loop["where"]["line"] == loop
    assert storm.loop["lengths"] == list(LENGTHS) and storm.loop["nodes"] == sorted(set(storm.loop["nodes"]))
    [found] = storm_findings(chunked)         # one finding per cause: the loop is the storm's cause, not a second one
    assert found["message"].startswith(loops.CAUSE)
    assert f"test_loop_finding.py:{loop} in forward" in found["message"]
    assert f"{len(LENGTHS)} graphs for {len(LENGTHS)} requests" in found["message"]
    assert found["where"]["line"] == loop and found["owner"]["owner"] == "user"
    assert found["severity"] == "work" and "StreamStep" in found["advice"] and "batch" in found["advice"]
    assert found["occurrences"]["graphs"] == len(LENGTHS) and found["occurrences"]["lengths"] == list(LENGTHS)
    assert "size mismatch at index 1" in found["occurrences"]["guard"]    # Dynamo's guard: the length it burnt in
    assert found["cause"] == f"recompile_storm: {loops.CAUSE} at {HERE}:{loop}"
    assert found["cause"] == cause_key("recompile_storm", loops.CAUSE, found["where"])
    assert f"{loops.CAUSE}, at " in storm.summary()
    saved = chunked.to_dict()["targets"]
    assert saved["neuron"]["storm"]["loop"]["where"]["line"] == saved["tpu"]["storm"]["loop"]["where"]["line"] == loop
    assert [f["cause"] for f in storm_findings(chunked)] == [f["cause"] for f in saved["tpu"]["findings"]
                                                             if f["kind"] == "recompile_storm"]


@pytest.mark.parametrize("module", [ConstantLoop, BatchLoopAndBranch, ShapeBranch])
def test_a_storm_for_another_reason_is_not_named_a_length_loop(module):
    report = report_of(module())
    storm = report.storms["neuron"]
    assert storm.compile_count() == len(LENGTHS) and storm.loop is None   # a storm, with no loop behind it
    [found] = storm_findings(report)
    assert loops.CAUSE not in found["message"] and found["cause"] == "recompile_storm: one compile per input shape"


def test_the_batch_loop_is_in_the_source_but_the_graphs_do_not_grow_with_the_length():
    """The source signal alone would name the batch loop: the graphs' sizes keep it out."""
    found = loops.source_loops(BatchLoopAndBranch())
    assert [w["line"] for w in found] == [line_of("# the batch loop")]
    assert not loops.source_loops(ConstantLoop()) and not loops.source_loops(ShapeBranch())


def halves(x, step):
    n = x.size(-1)
    start, out = 0, []
    while start < n:                          # the helper's loop
        out.append(x[..., start:start + step])
        start += step
    return out


class Helpers(nn.Module):
    """Length loops in the functions forward calls from its own module: a method and a module-level function."""

    def forward(self, x):
        return torch.cat(self.pieces(x) + halves(x, 2), -1)

    def pieces(self, x):
        return [p * 2 for p in x.split(3, dim=-1)]   # the split loop


def test_the_scan_follows_forward_into_its_own_modules_functions():
    found = loops.source_loops(Helpers())
    assert [(w["line"], w["function"]) for w in found] == sorted(
        [(line_of("# the helper's loop"), "halves"), (line_of("# the split loop"), "pieces")])
    assert {w["reads"] for w in found} == {"n", "x.split(3, dim=-1)"}


def test_the_report_lists_the_loop_once_with_its_line(chunked, tmp_path):
    """Stage 5 reads stage 2's findings as they are: the cause needs no registration there."""
    from portkit.stages.report.stage import build_report
    chunked.save(tmp_path / "compile.json")
    found = [f for f in build_report(run_dir=tmp_path).targets["neuron"].findings
             if f["message"].startswith(loops.CAUSE)]
    assert len(found) == 1 and found[0]["stage"] == "compile" and found[0]["severity"] == "work"
    assert f"test_loop_finding.py:{line_of('# the length loop')} in forward" in found[0]["where"]
    assert "StreamStep" in found[0]["advice"]


def test_a_library_loop_a_config_switches_on_is_named_with_the_setting_that_switches_it_off():
    """BERT with chunk_size_feed_forward > 0 (a real transformers setting): apply_chunking_to_forward splits the
    sequence into x.chunk(length // chunk) pieces and runs the feed-forward on each, so every length is a new,
    larger graph. The finding points into transformers and says which config key to set; the same model
    without the setting compiles one graph per length that does not grow, and gets the plain storm."""
    from transformers import BertConfig, BertModel

    def bert(chunk: int) -> nn.Module:
        model = BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, chunk_size_feed_forward=chunk)).eval()

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = model

            def forward(self, input_ids, attention_mask):
                return {"out": self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state}
        return Encoder()

    [found] = storm_findings(report_of(bert(4)))
    assert found["message"].startswith(loops.CAUSE) and "apply_chunking_to_forward" in found["message"]
    assert "chunk_size_feed_forward to 0" in found["advice"] and found["where"]["file"].endswith("pytorch_utils.py")
    [plain] = storm_findings(report_of(bert(0)))
    assert not plain["message"].startswith(loops.CAUSE)


CHUNKS_AND_REMAINDER = '''
    """A library's model file: a loop over whole chunks of the sequence, then a loop over the remainder."""
    import torch
    from torch import nn


    class ChunkedMixer(nn.Module):
        def __init__(self, dim=8, chunk=4):
            super().__init__()
            self.embed = nn.Embedding(30522, dim)
            self.proj = nn.Linear(dim, dim)
            self.chunk = chunk

        def forward(self, input_ids, attention_mask):
            hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
            length = hidden.shape[1]
            outs = []
            for chunk in range(length // self.chunk):                 # the chunks
                outs.append(self.proj(hidden[:, chunk * self.chunk:(chunk + 1) * self.chunk]))
            for i in range(length // self.chunk * self.chunk, length):  # the remainder
                outs.append(self.proj(hidden[:, i:i + 1]))
            return {"out": torch.cat(outs, 1)}
'''


def test_a_library_loop_over_chunks_and_the_remainder_is_named(tmp_path):
    """A loop over whole chunks plus a loop over the remainder, in a library's model file (site-packages): at 7, 8, 13
    and 16 tokens the graphs hold 1+3, 2+0, 3+1 and 4+0 bodies, so their sizes shrink and grow again instead of
    growing. Rule: graphs that change more often than one shape-dependent branch changes them, with a loop over an
    input's size in the source, are the length loop's, named at the library's line with the library as owner."""
    import importlib
    import sys
    import textwrap
    root = tmp_path / "site-packages"
    (root / "chunkedlib").mkdir(parents=True)
    (root / "chunkedlib" / "__init__.py").write_text(textwrap.dedent(CHUNKS_AND_REMAINDER))
    sys.path.insert(0, str(root))
    try:
        library = importlib.import_module("chunkedlib")
    finally:
        sys.path.remove(str(root))
    lengths = (7, 8, 13, 16)
    m = loaded(library.ChunkedMixer())
    text = "A chunked model reads its input in fixed chunks."
    requests = Requests([[text] for _ in lengths], [m.encode([text], pad_to=n) for n in lengths], "test", m)
    cost = economics.neuron_estimate(10**6)
    report = compile_model(m, requests, ["neuron"], Options.of({"seq_len": lengths[0]}),
                                     storm=StormSettings(progress=False), costs={"neuron": cost})
    storm = report.storms["neuron"]
    nodes = storm.loop["nodes"]
    assert storm.loop["lengths"] == list(lengths) and nodes[1] < nodes[0]   # not growing: the remainder's steps
    [found] = storm_findings(report)
    source = (root / "chunkedlib" / "__init__.py").read_text().splitlines()
    assert [w["line"] for w in storm.loop["loops"]] == [i for i, line in enumerate(source, 1)
                                                         if "# the chunks" in line or "# the remainder" in line]
    assert found["message"].startswith(loops.CAUSE) and "library code at chunkedlib/__init__.py:" in found["message"]
    assert found["owner"]["owner"] == "library" and found["owner"]["package"] == "chunkedlib"
    assert "not your code (chunkedlib" in found["advice"] and "growing" not in found["message"]
