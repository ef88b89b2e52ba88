"""CREPE (real pretrained weights) through stages 1, 3 and 4 from its declaration, on a user's folder of tiny
recordings: frames vary with the clip, buckets are fitted to them, the pitch is judged in cents."""
import importlib.util
import json

import numpy as np
import pytest

from portkit.stages.accuracy.stage import Options, Scope, bucket_plan, check_accuracy
from portkit.stages.buckets.stage import (BucketReport, Options as BucketsOptions, Replay, choose, compare,
    distribution, histogram, replay_targets, sweep)
from portkit.stages.compile.stage import make_requests
from portkit.corpora import corpus
from portkit.planning import economics
from portkit.stages.fallbacks.stage import RecordSettings, find_fallbacks
from portkit.models import registry

soundfile = pytest.importorskip("soundfile", reason="the audio extra is not installed (pip install 'portkit[audio]')")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchcrepe") is None,
                                reason="torchcrepe is not installed (scripts/bootstrap.sh installs it)")
TARGETS = ["neuron", "tpu"]


def fake_xla(model, shape, topology, dtype):
    """A stand-in for xla_compile.compile_seconds (these tests are not about XLA; tests/stages/xla/test_xla.py is)."""
    return 1.0 + shape["seq"] / 10_000, "XLA compile for v5e:1x1, measured now (test stand-in)"


@pytest.fixture
def recordings(tmp_path):
    """Six voiced clips of 0.1-0.35 s (a gliding tone with noise), at 22.05 and 44.1 kHz, stereo and mono."""
    folder, rng = tmp_path / "recordings", np.random.default_rng(0)
    folder.mkdir()
    for i, seconds in enumerate([0.1, 0.15, 0.2, 0.25, 0.3, 0.35]):
        rate = (22050, 44100)[i % 2]
        t = np.arange(int(seconds * rate)) / rate
        wave = 0.4 * np.sin(2 * np.pi * (150 + 40 * i) * t * (1 + 0.1 * t)) + 0.005 * rng.standard_normal(t.size)
        soundfile.write(folder / f"clip{i}.{('wav', 'flac')[i % 2]}", np.stack([wave] * (1 + i % 2), 1), rate)
    return folder


def test_crepe_runs_through_the_stages_on_a_folder_of_recordings(tmp_path, recordings):
    m = registry.load("crepe")
    items = corpus.corpus_for(m, str(recordings))
    assert len(items) == 6 and "recorded" in items.source
    batch, described = corpus.example_batch(m, items, batch_size=2, seq_len=32, seed=0)
    found = find_fallbacks(m, batch, TARGETS, RecordSettings(description=described))
    found.save(tmp_path / "fallbacks.json")
    # stage 1: the CPU fallbacks of CREPE's own layers on Neuron, named at torchcrepe's lines
    neuron = json.loads((tmp_path / "fallbacks.json").read_text())["targets"]["neuron"]["findings"]
    assert any("max_pool2d" in f["message"] and "torchcrepe/model.py" in json.dumps(f) for f in neuron)
    # stage 2's requests: each a real clip at its own number of frames (the storm itself: the workbook run)
    stream = make_requests(m, items, 4, batch_size=1, max_tokens=32, seed=4, horizon=8)
    assert all(shape[0] == 1 for shape in stream.shapes())
    costs = {"tpu": economics.xla_model(m, [s[1] for s in stream.shapes()], measure=fake_xla),
             "neuron": economics.neuron_estimate(m.parameters)}
    # stage 3: buckets fitted to the clips' frames (10 ms each), padding checked on the real frames
    dist = distribution(items, m)
    assert dist.unit == "frames" and sorted(dist.lengths.tolist()) == [11, 16, 21, 26, 31, 36]
    hist = histogram(dist)
    plans = compare(hist, 2, 1)
    trace = corpus.make_trace(items, m, 4, seed=0, dist=dist)
    chosen = choose(hist, costs, 1e-7, BucketsOptions.of({"serve_requests": 1000}), quiet=True)
    # stages 3 and 4 for TPU alone (their per-target code is shared; one target keeps the test short)
    chosen = {"tpu": chosen["tpu"]}
    per_target = replay_targets(m, trace, plans, chosen=chosen, costs=costs,
                                        replay=Replay(progress=False))     # backend "auto", the default
    for t in chosen:
        assert all(c["ok"] for r in per_target[t].runs for c in r.padding_checks)
    bucketed = BucketReport(m.describe(), dist.to_dict(), hist, k=2, plans=plans, curves=sweep(hist),
                                    token_seconds=1e-7, trace=trace.describe(), targets=per_target)
    bucketed.save(tmp_path / "buckets.json")
    # stage 4: the pitch judged in cents on voiced frames, and the voicing, per bucket too
    judged = check_accuracy(m, batch, ["tpu"], Options.of({"batch_size": 2, "seed": 0}), corpus=items,
                                     buckets=bucket_plan(tmp_path, ["tpu"]), description=described,
                                     scope=Scope(compiled=False, progress=False))
    task = judged.targets["tpu"].chosen.task
    assert task["metric"].startswith("pitch error in cents") and task["voiced_reference"] > 0
    assert {c["metric"] for c in task["checks"]} == {"cents", "voicing"}
    assert all("frames" in b["target"] for b in judged.targets["tpu"].buckets if "skipped" not in b)
