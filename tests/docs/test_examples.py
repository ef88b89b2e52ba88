"""The runnable examples in examples/, one per kind of declaration, each shown in full in
docs/guides/declaring-a-model.md (the guide's code blocks are the files, checked here). The waveform model and
the three-input text model go through every stage the way the notebooks call them, on small parameters; the
greyscale image model, the streaming step and the two-length text-pair model are checked cheaply (a few
seconds each): loaded by spec, batches built from real items by their declarations, the shapes the guide
states, a forward pass, and stage 1 for both targets."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT
from portkit.stages.accuracy.stage import Options, Scope, bucket_plan, check_accuracy
from portkit.stages.buckets.stage import (BucketReport, Options as BucketsOptions, Replay, choose, compare,
    distribution, histogram, replay_targets, sweep)
from portkit.stages.compile.stage import (CompileReport, Options as CompileOptions, check_fixed_shape,
    find_graph_breaks, make_requests, recompile_storms)
from portkit.corpora.corpus import corpus_for, example_batch, make_trace
from portkit.planning import economics
from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
from portkit.models import registry
from portkit.stages.buckets.bucketed import BucketedModel
from portkit.stages.report.stage import build_report

AUDIO = f"{ROOT / 'examples' / 'audio_classifier.py'}:build"
THREE = f"{ROOT / 'examples' / 'text_and_features.py'}:build"
GREY = f"{ROOT / 'examples' / 'greyscale_classifier.py'}:build"
VAD = f"{ROOT / 'examples' / 'vad_stream.py'}:build"
PAIRS = f"{ROOT / 'examples' / 'two_lengths.py'}:build"
GUIDE = ROOT / "docs" / "guides" / "declaring-a-model.md"
TARGETS = ["neuron", "tpu"]
needs_alsa = pytest.mark.skipif(not list(Path("/usr/share/sounds/alsa").glob("*.wav")),
                                reason="needs the spoken recordings of Debian's alsa-utils (/usr/share/sounds/alsa)")


def fake_xla(model, shape, topology, dtype):
    """A stand-in for xla_compile.compile_seconds (these tests are not about XLA; tests/stages/xla/test_xla.py is)."""
    return 1.0 + shape["seq"] / 10_000, "XLA compile for v5e:1x1, measured now (test stand-in)"


def _stages(spec: str, out: Path, seq_len: int = 32):
    """Stages 1, 2, 3, 4 and the report, as notebooks/0*.py call them, with small parameters."""
    m = registry.load(spec)
    items = corpus_for(m)
    batch, described = example_batch(m, items, batch_size=2, seq_len=seq_len, seed=0)
    found = find_fallbacks(m, batch, TARGETS, RecordSettings(description=described))
    found.save(out / "fallbacks.json")
    stream = make_requests(m, items, 4, batch_size=1, max_tokens=seq_len, seed=4, horizon=16)
    breaks = find_graph_breaks(m, stream.inputs[0], TARGETS)
    opts = CompileOptions.of({"seq_len": seq_len})
    storms = recompile_storms(m, stream, TARGETS, opts, progress=False)
    fixed = {t: check_fixed_shape(m, stream, t, opts) for t in TARGETS}
    costs = {"tpu": economics.xla_model(m, [s[1] for s in stream.shapes()], measure=fake_xla),
             "neuron": economics.neuron_estimate(m.parameters)}
    compiled = CompileReport.from_steps(m, stream, breaks, storms=storms, fixed=fixed, costs=costs)
    compiled.save(out / "compile.json")
    dist = distribution(items, m)
    hist = histogram(dist)
    plans = compare(hist, 2, 1)
    trace = make_trace(items, m, 6, seed=0, dist=dist)
    chosen = choose(hist, costs, 1e-7, BucketsOptions.of({"serve_requests": 1000}), quiet=True)
    per_target = replay_targets(m, trace, plans, chosen=chosen, costs=costs,
                                        replay=Replay(progress=False))     # backend "auto", the default
    bucketed = BucketReport(m.describe(), dist.to_dict(), hist, k=2, plans=plans, curves=sweep(hist),
                                    token_seconds=1e-7, trace=trace.describe(), targets=per_target)
    bucketed.save(out / "buckets.json")
    judged = check_accuracy(m, batch, TARGETS, Options.of({"batch_size": 2, "seed": 0}), corpus=items,
                                     buckets=bucket_plan(out, TARGETS), description=described,
                                     scope=Scope(compiled=False, progress=False))
    judged.save(out / "accuracy.json")
    return m, found, stream, breaks, fixed, dist, per_target, judged, build_report(TARGETS, run_dir=out)


@needs_alsa
def test_the_waveform_example_runs_through_every_stage_from_its_declaration(tmp_path):
    m, found, stream, breaks, fixed, dist, per_target, judged, migration = _stages(AUDIO, tmp_path)
    assert m.seq_dim == "samples" and m.declaration.sample_rate == 16_000
    # stage 1: the GRU is named by type at its module path; the batch is the real recordings' own length
    saved = json.loads((tmp_path / "fallbacks.json").read_text())
    assert any(f["kind"] == "recurrent" and "gru" in f["message"] for f in saved["targets"]["neuron"]["findings"])
    assert "padded to the longest" in saved["inputs"]["description"]
    # stage 2: the graph break is at the user's own line; each new duration is a compile; one fixed shape holds
    assert "examples/audio_classifier.py" in str(breaks) and "self.gru" in str(breaks)
    assert len({tuple(s) for s in stream.shapes()}) == stream.to_dict()["count"]
    longest = max(s[1] for s in stream.shapes() + stream.ahead)
    assert all(f.shape["seq"] == longest and f.armed and f.compiles_after == 0 for f in fixed.values())
    # stage 3: buckets fitted to the recordings' durations in samples, padding checked on real positions
    assert dist.unit == "samples" and dist.lengths.min() >= 400
    for t in TARGETS:
        assert per_target[t].chosen.boundaries[-1] == dist.lengths.max()
        assert all(c["ok"] for r in per_target[t].runs for c in r.padding_checks)
    # stage 4: the declared output's own metric, top-1 agreement, per bucket too
    assert judged.targets["tpu"].chosen.task["metric"] == "top-1 agreement"
    assert all("samples" in b["target"] for b in judged.targets["tpu"].buckets if "skipped" not in b)
    assert set(migration.verdicts()) == set(TARGETS)
    assert json.loads((tmp_path / "buckets.json").read_text())["distribution"]["unit"] == "samples"


def test_the_three_input_example_pads_only_what_varies(tmp_path):
    m, found, stream, breaks, fixed, dist, per_target, judged, migration = _stages(THREE, tmp_path)
    assert m.input_names == ("input_ids", "attention_mask", "features") and m.seq_dim == "tokens"
    saved = json.loads((tmp_path / "fallbacks.json").read_text())
    assert saved["inputs"]["description"].endswith("padded or truncated to 32 tokens")
    assert all(f.shape["dims"] == [1, 32] and f.armed for f in fixed.values())
    bm = BucketedModel(m, per_target["tpu"].chosen, backend="aot_eager")
    padded, rows, length = bm.pad(m.encode(["Return the sum of a and b."]))
    assert padded["features"].shape == (1, 4) and padded["input_ids"].shape[1] == per_target["tpu"].chosen.bucket_for(9)
    assert all(c["ok"] for r in per_target["tpu"].runs for c in r.padding_checks)
    assert judged.targets["neuron"].chosen.task["metric"] == "top-1 agreement"
    assert set(migration.verdicts()) == set(TARGETS)
    torch.testing.assert_close(m(m.encode(["a b c"]))["logits"], m(m.encode(["a b c"], pad_to=16))["logits"])


# ---------------------------------------------------------------- the guide shows every example in full
def _guide_blocks() -> dict[str, str]:
    """The guide's code blocks titled with an example's path: {path: the block's text}."""
    found = re.findall(r'^```python title="(examples/[^"]+)"\n(.*?)^```$', GUIDE.read_text(), re.S | re.M)
    return dict(found)


def test_the_guide_shows_every_example_file_exactly():
    blocks = _guide_blocks()
    files = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}
    assert set(blocks) == files, f"examples and the guide's blocks differ: {set(blocks) ^ files}"
    for path, text in blocks.items():
        assert text == (ROOT / path).read_text(), f"the guide's copy of {path} differs from the file: paste it again"
    named = set(re.findall(r"examples/\w+\.py", GUIDE.read_text()))
    assert named and all((ROOT / path).is_file() for path in named), f"named but missing: {named - files}"


def _stage1(m, batch, described):
    found = find_fallbacks(m, batch, TARGETS, RecordSettings(description=described))
    assert set(found.targets) == set(TARGETS)
    return found.to_dict()["targets"]


# ---------------------------------------------------------------- image folder: greyscale, and RGB by luminance
def test_the_greyscale_example_takes_one_channel_of_real_photographs(tmp_path):
    from matplotlib import cbook
    from portkit.corpora import images
    m = registry.load(GREY)
    decl = m.declaration
    assert decl.fixed_shape and decl.dim("channels").size == 1 and decl.input_names == ("pixel_values",)
    assert corpus_for(m) is None                # no folder: crops of matplotlib's photographs, in grey
    batch, described = example_batch(m, None, batch_size=2, seq_len=32, seed=0)
    pixels = batch["pixel_values"]
    assert pixels.shape == (2, 1, 32, 32) and described == "2 image crops of 32x32"
    crops = np.stack(images.sample_images(2, 32, 0, channels=1)).transpose(0, 3, 1, 2)
    torch.testing.assert_close(pixels * 0.3081 + 0.1307, torch.from_numpy(crops))     # (x - mean) / std applied
    with torch.no_grad():
        assert m(batch)["logits"].shape == (2, 10)
    neuron = _stage1(m, batch, described)["neuron"]
    assert any("max_pool2d" in f["message"] for f in neuron["findings"])
    # An RGB folder: the same model reads each photograph as its BT.601 luminance, one channel.
    (tmp_path / "photos").mkdir()
    with cbook.get_sample_data("grace_hopper.jpg") as src:
        (tmp_path / "photos" / "grace_hopper.jpg").write_bytes(src.read())
    folder = corpus_for(m, str(tmp_path / "photos"))
    (grey,) = folder.texts
    (rgb,) = images.folder_images(str(tmp_path / "photos"), 32, channels=3)[2]
    assert grey.shape == (32, 32, 1) and rgb.shape == (32, 32, 3)
    np.testing.assert_allclose(grey[..., 0], rgb @ np.array([0.299, 0.587, 0.114], np.float32), rtol=1e-6)
    assert m.encode(list(folder.texts))["pixel_values"].shape == (1, 1, 32, 32)


# ---------------------------------------------------------------- a streaming step with a tuple state
@needs_alsa
def test_the_vad_stream_example_carries_its_tuple_state_through_a_step():
    from portkit.workloads import streaming
    m = registry.load(VAD)
    step = m.stream
    assert step.state_leaves == {"state_0_0": (-1, 64), "state_0_1": (-1, 64), "state_1": (-1, 64)}
    assert [(o.name, o.metric, o.threshold) for o in step.outputs] == [("speech", "probability", 0.5)]
    corpus = corpus_for(m)                      # its own_items(): the alsa-utils recordings
    batch, described = example_batch(m, corpus, batch_size=2, seq_len=32, seed=0)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {"chunk": (2, 512), "state_0_0": (2, 64),
                                                             "state_0_1": (2, 64), "state_1": (2, 64)}
    with torch.no_grad():
        out = m(batch)
    assert out["speech"].shape == (2,) and bool(((out["speech"] > 0) & (out["speech"] < 1)).all())
    # The state round-trips: by name and back to ((h, c), context), the context the chunk's last 64 samples.
    stream = streaming.speech_stream(seconds=1.0, clips=corpus.texts, source=corpus.source)
    chunks = stream.chunks(step.chunk)
    state = step.initial_state(1)
    with torch.no_grad():
        for chunk in chunks[:3]:
            speech, state = step.module(chunk, state)
    (h, c), context = state
    assert speech.shape == (1,) and h.shape == c.shape == (1, 64)
    torch.testing.assert_close(context, chunks[2][:, -64:], rtol=0, atol=0)
    assert context.stride() == (64, 1)               # its own buffer: feeding it back does not recompile
    flat = step.flat_state(state)
    assert list(flat) == ["state_0_0", "state_0_1", "state_1"] and flat["state_0_1"] is c
    assert step.flat_state(step.state_from(flat)) == flat
    # Carried across the recordings under the TPU's rules: compiled once, no recompile during the stream.
    run = streaming.check_stream(step, stream, ["tpu"]).runs[0].to_dict()
    assert run["late_compiles"] == 0 and run["outputs"]["speech"]["kind"] == "probability"
    for target in _stage1(m, batch, described).values():                 # the LSTM cell, named where it is
        assert any("step.cell" in f["message"] for f in target["findings"])


# ---------------------------------------------------------------- two varying dimensions
def test_the_two_lengths_example_pads_each_side_to_its_own_size():
    m = registry.load(PAIRS)
    decl = m.declaration
    assert decl.varying_names == ("summary", "body") and m.seq_dim == "summary"
    assert decl.masks == {"summary": "summary_mask", "body": "body_mask"}
    corpus = corpus_for(m)                      # the standard library's docstrings
    texts = corpus.sample(16, 0)
    lengths = decl.lengths(texts)
    s, b = np.array(lengths["summary"]), np.array(lengths["body"])
    assert ((s[:, None] < s[None, :]) & (b[:, None] > b[None, :])).any(), "the two lengths should vary apart"
    batch = decl.batch(texts, sizes={"summary": 16, "body": 64})
    assert batch["summary_ids"].shape == (16, 16) and batch["body_ids"].shape == (16, 64)
    assert decl.real_lengths(batch) == {"summary": np.minimum(s, 16).tolist(), "body": np.minimum(b, 64).tolist()}
    longest = decl.batch(texts)
    padded = decl.fit(longest, {"summary": decl.size_of(longest, "summary") + 8,
                                "body": decl.size_of(longest, "body") + 8})
    with torch.no_grad():
        match = m(longest)["match"]
        torch.testing.assert_close(m(padded)["match"], match)        # padding on either side changes nothing
    assert match.shape == (16,) and bool(((match > 0) & (match < 1)).all())
    batch, described = example_batch(m, corpus, batch_size=2, seq_len=32, seed=0)
    assert "padded to the longest" in described
    _stage1(m, batch, described)
