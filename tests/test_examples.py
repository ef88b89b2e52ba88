"""The runnable examples in examples/ go through the stages the way the notebooks call them, on small
parameters: a waveform model (two inputs, `samples` varying with real recordings) and a model with three
inputs (token ids, their mask and numeric features). Each stage works from the model's declaration."""
import json
from pathlib import Path

import pytest
import torch

from portkit.stages.accuracy import stage as accuracy
from portkit.stages.buckets import stage as buckets
from portkit.stages.compile import stage as compiling
from portkit.corpora import corpus as data
from portkit.planning import economics
from portkit.stages.fallbacks import stage as fallbacks
from portkit.models import registry as models
from portkit.stages.report import stage as report

ROOT = Path(__file__).resolve().parents[1]
AUDIO = f"{ROOT / 'examples' / 'audio_classifier.py'}:build"
THREE = f"{ROOT / 'examples' / 'text_and_features.py'}:build"
TARGETS = ["neuron", "tpu"]


def fake_xla(model, shape, topology, dtype):
    """A stand-in for xla_compile.compile_seconds (these tests are not about XLA; tests/test_xla.py is)."""
    return 1.0 + shape["seq"] / 10_000, "XLA compile for v5e:1x1, measured now (test stand-in)"


def _stages(spec: str, out: Path, seq_len: int = 32):
    """Stages 1, 2, 3, 4 and the report, as notebooks/0*.py call them, with small parameters."""
    m = models.load(spec)
    items = data.corpus_for(m)
    batch, described = data.example_batch(m, items, batch_size=2, seq_len=seq_len, seed=0)
    found = fallbacks.find_fallbacks(m, batch, TARGETS, description=described)
    found.save(out / "fallbacks.json")
    stream = compiling.make_requests(m, items, 4, batch_size=1, max_tokens=seq_len, seed=4, horizon=16)
    breaks = compiling.find_graph_breaks(m, stream.inputs[0], TARGETS)
    opts = compiling.Options.of({"seq_len": seq_len})
    storms = compiling.recompile_storms(m, stream, TARGETS, opts, progress=False)
    fixed = {t: compiling.check_fixed_shape(m, stream, t, opts) for t in TARGETS}
    costs = {"tpu": economics.xla_model(m, [s[1] for s in stream.shapes()], measure=fake_xla),
             "neuron": economics.neuron_estimate(m.parameters)}
    compiled = compiling.CompileReport.from_steps(m, stream, breaks, storms=storms, fixed=fixed, costs=costs)
    compiled.save(out / "compile.json")
    dist = buckets.distribution(items, m)
    hist = buckets.histogram(dist)
    plans = buckets.compare(hist, 2, 1)
    trace = data.make_trace(items, m, 6, seed=0, dist=dist)
    chosen = buckets.choose(hist, costs, 1e-7, buckets.Options.of({"serve_requests": 1000}), quiet=True)
    per_target = buckets.replay_targets(m, trace, plans, chosen=chosen, costs=costs,
                                        replay=buckets.Replay(progress=False))     # backend "auto", the default
    bucketed = buckets.BucketReport(m.describe(), dist.to_dict(), hist, k=2, plans=plans, curves=buckets.sweep(hist),
                                    token_seconds=1e-7, trace=trace.describe(), targets=per_target)
    bucketed.save(out / "buckets.json")
    judged = accuracy.check_accuracy(m, batch, TARGETS, accuracy.Options.of({"batch_size": 2, "seed": 0}), corpus=items,
                                     buckets=accuracy.bucket_plan(out, TARGETS), description=described,
                                     scope=accuracy.Scope(compiled=False, progress=False))
    judged.save(out / "accuracy.json")
    return m, found, stream, breaks, fixed, dist, per_target, judged, report.build_report(out, TARGETS)


@pytest.mark.skipif(not list(Path("/usr/share/sounds/alsa").glob("*.wav")),
                    reason="needs the spoken recordings of Debian's alsa-utils (/usr/share/sounds/alsa)")
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
    bm = buckets.bucketed.BucketedModel(m, per_target["tpu"].chosen, backend="aot_eager")
    padded, rows, length = bm.pad(m.encode(["Return the sum of a and b."]))
    assert padded["features"].shape == (1, 4) and padded["input_ids"].shape[1] == per_target["tpu"].chosen.bucket_for(9)
    assert all(c["ok"] for r in per_target["tpu"].runs for c in r.padding_checks)
    assert judged.targets["neuron"].chosen.task["metric"] == "top-1 agreement"
    assert set(migration.verdicts()) == set(TARGETS)
    torch.testing.assert_close(m(m.encode(["a b c"]))["logits"], m(m.encode(["a b c"], pad_to=16))["logits"])
