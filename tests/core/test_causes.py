"""A finding is a cause, its occurrences inside it; the verdict counts causes; the same input gives the same result."""
import json
import re

import pytest
import torch

from conftest import fixture_model
from portkit.core import findings
from portkit.models import registry
from portkit.planning import economics
from portkit.stages.compile.stage import Options, StormSettings, compile_model
from portkit.corpora import requests
from portkit.stages.compile import fixed_shape
from portkit.stages.fallbacks.stage import find_fallbacks

TEXTS = ["def f(x): return x", "Sum the values."]
FIXTURES = ("gru_model", "cell_model", "cell_only_model", "data_dependent_model", "float64_model", "sparse_model",
            "custom_op_model", "tiny_encoder", "item_branch_model", "codec_padding_model")


@pytest.fixture(scope="module")
def texts():
    from portkit.corpora import corpus
    return corpus.load_corpus()


def stage1(spec, seq=8):
    m = registry.load(spec)
    return find_fallbacks(m, m.encode(TEXTS, pad_to=seq), ["neuron", "tpu"])


def causes_of(found: list[dict]) -> list[str]:
    return [findings.cause_of(f) for f in found]


@pytest.mark.parametrize("spec", [*(fixture_model(n) for n in FIXTURES), "lstm", "bert"])
def test_no_two_findings_of_a_target_share_a_cause(spec):
    report = stage1(spec).to_dict()
    for name, target in report["targets"].items():
        causes = causes_of(target["findings"])
        assert all(causes) and len(set(causes)) == len(causes), (name, causes)
        # an op finding whose op is the device path of a recurrent module is that module's occurrence
        recurrent = {op for f in target["findings"] if f["kind"] == "recurrent" for op in f["ops"]}
        assert not [f for f in target["findings"] if f["kind"] in ("cpu_fallback", "unsupported")
                    and any(o["via"] in recurrent for o in target["ops"] if o["op"] in f["ops"])], name


def test_one_lstm_is_one_finding_with_its_cpu_op_inside():
    neuron = stage1("lstm").targets["neuron"]
    [lstm] = [f for f in neuron.findings if f.severity == "blocker"]
    assert lstm.kind == "recurrent" and lstm.cause == findings.cause_key("recurrent", "nn.LSTM")
    assert lstm.occurrences["ops"] == {"aten::mkldnn_rnn_layer": lstm.occurrences["ops"]["aten::mkldnn_rnn_layer"]}
    assert "aten::mkldnn_rnn_layer" in lstm.message and neuron.counts()["unsupported"] == 1


def test_host_syncs_on_one_line_are_one_finding_with_their_calls():
    """The same .item() line run from many modules (a shared helper) is one cause with its modules and calls."""
    class Block(torch.nn.Module):
        def forward(self, h):
            return shared_sync(h)

    class Twin(torch.nn.Module):
        def forward(self, h):
            return shared_sync(h) + 1

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(30522, 4)
            self.a, self.b = torch.nn.ModuleList([Block() for _ in range(3)]), torch.nn.ModuleList([Twin()] * 2)

        def forward(self, input_ids, attention_mask):
            h = self.embed(input_ids)
            for m in [*self.a, *self.b]:
                h = m(h)
            return {"out": h}

    m = registry.LoadedModel("syncs", registry.TOKEN_CLASSIFIER, registry.OutputsAdapter(Model()).eval(), "test",
                           tokenizer=registry.minilm_tokenizer())
    report = find_fallbacks(m, m.encode(TEXTS, pad_to=6), ["neuron"])
    [sync] = [f for f in report.targets["neuron"].findings if f.kind == "host_sync"]
    assert sync.occurrences["calls"] == 5 and len(sync.occurrences["modules"]) == 4
    assert sync.where["code"].startswith("return h * (h.abs().max().item()")


def shared_sync(h):
    return h * (h.abs().max().item() > 0)


def test_a_refusal_is_one_blocker_and_names_the_data_dependent_size(texts):
    """A size read with .item() (a codec's padding), captured as a symbol where a library sets
    capture_scalar_outputs: the refusal names the user's line, its cause and the advice that fixes it, and the
    capture, the storm and the fixed shape it stops are one finding."""
    m = registry.load(fixture_model("codec_padding_model"))
    stream = requests.make_requests(m, texts, 4, max_tokens=12, seed=0, horizon=4)
    opts = Options.of({"seq_len": 12, "requests": 4})
    with torch._dynamo.config.patch(capture_scalar_outputs=True):   # Dynamo's own scoped setting, restored after
        report = compile_model(m, stream, ["neuron"], opts,
                                         storm=StormSettings(progress=False, compile_shapes=2),
                                         costs={"neuron": economics.neuron_estimate(10**6)})
    blockers = [f for f in report.findings("neuron") if f["severity"] == "blocker"]
    assert len(blockers) == 1, blockers
    [refused] = blockers
    assert refused["kind"] == "compile_refused" and refused["occurrences"]["count"] >= 2
    assert refused["where"]["file"].endswith("fixtures/models.py") and refused["owner"]["owner"] == "user"
    assert "functional.py" not in refused["message"] and "data-dependent size" in refused["message"]
    assert ".item()" in refused["message"] and "stage 3 buckets" not in refused["message"]
    assert ".shape" in refused["advice"] and "torch._check" in refused["advice"]


TIMES = re.compile(r"(seconds|_s$|time|share|wall|median|^run$|elapsed|created|started|ended|pid|host|out_dir)", re.I)


def untimed(value):
    """The result without its numeric time fields: lists keep their order, strings are compared as they are."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not TIMES.search(k)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def test_the_same_input_gives_the_same_result(texts):
    spec = fixture_model("data_dependent_model")
    first, second = (json.dumps(untimed(stage1(spec).to_dict()), sort_keys=True) for _ in range(2))
    assert first == second
    m = registry.load(fixture_model("tiny_encoder"))
    stream = requests.make_requests(m, texts, 6, max_tokens=10, seed=0, horizon=6)
    opts = Options.of({"seq_len": 10, "requests": 6})
    runs = [fixed_shape.check_fixed_shapes(m, stream, ["neuron", "tpu"], opts) for _ in range(2)]
    a, b = ({n: untimed(f.to_dict()) for n, f in run.items()} for run in runs)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert not re.search(r"\d\s?(ms|s)\b", json.dumps(a))   # no measured time in a string


def test_a_module_computing_in_float64_at_three_lines_is_one_cause():
    """Rule (one cause, one finding): float64 is a cause of the module that computes in it, however many lines of
    its forward show it; the lines are its occurrences."""
    for name, target in stage1(fixture_model("float64_three_lines_model")).targets.items():
        found = [f for f in target.findings if f.kind == "float64"]
        assert len(found) == 1, (name, [f.message for f in found])
        assert found[0].module == "model.scorer" and len(found[0].occurrences["lines"]) == 3
        assert {"aten::_to_copy", "aten::mm"} <= set(found[0].ops)


def test_two_lstms_on_tpu_are_one_recurrent_cause_with_the_vendor_list_entry_folded_in():
    """Rule (one cause, one finding): TorchTPU's vendor-list entry "LSTM: experimental" about the very nn.LSTM
    modules stage 1 recorded is not counted again as a vendor_list finding."""
    tpu = stage1(fixture_model("two_lstm_model")).targets["tpu"]
    assert [f.kind for f in tpu.findings if f.kind in ("recurrent", "vendor_list")] == ["recurrent"]
    [lstm] = [f for f in tpu.findings if f.kind == "recurrent"]
    assert set(lstm.occurrences["modules"]) == {"model.first", "model.second"} and "experimental" in lstm.message


def test_one_refusal_met_by_stages_2_3_and_4_is_one_finding_with_each_stages_evidence(texts):
    """Rule (one cause, one finding): a data-dependent size the static-shape compiler refuses, met by stage 2's
    compile, stage 3's bucket replay and stage 4's compiled run, has one cause in each (backends.compile_cause at
    the user's line), and the report lists it once, the most severe grade, every stage's evidence under it."""
    from portkit.corpora import corpus
    from portkit.stages.accuracy import result
    from portkit.stages.accuracy import target_runs
    from portkit.stages.buckets import trace_replay
    from portkit.stages.buckets.stage import TargetBuckets, plan_buckets
    from portkit.stages.report.stage import merge_causes

    m = registry.load(fixture_model("codec_padding_model"))
    inputs = m.encode(TEXTS, pad_to=12)
    cost = economics.neuron_estimate(10**6)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        stream = requests.make_requests(m, texts, 4, max_tokens=12, seed=0, horizon=4)
        stage2 = compile_model(m, stream, ["neuron"], Options.of({"seq_len": 12, "requests": 4}),
                                         storm=StormSettings(progress=False, compile_shapes=2),
                                         costs={"neuron": cost}).findings("neuron")
        plan = plan_buckets([4, 8, 12], "optimal", k=2, max_seq=12)
        runs = trace_replay.replay(m, corpus.make_trace(texts, m, 4, seed=1), [plan], backend="portkit_neuron",
                               settings=trace_replay.ReplaySettings(baseline=False, progress=False))
        stage3 = TargetBuckets({"name": "neuron", "mode": "emulated"}, "portkit_neuron", plan, cost,
                                       runs).findings()
        torch.compiler.reset()
        with pytest.raises(Exception) as raised:
            torch.compile(m.module, backend="portkit_neuron", dynamic=False)(**inputs)
    refused = target_runs.refusal(raised.value, "portkit_neuron", False)
    precision = result.PrecisionResult({"name": "none"}, "eager", {}, {"decision": "pass", "passed": True},
                                                None, None, {}, {})
    stage4 = [f.to_dict() for f in result.TargetAccuracy(
        {"name": "neuron"}, precision, [], {}, [], compile_refused=refused.to_dict()).findings()]
    blockers = {s: [f for f in found if f["severity"] == "blocker"]
                for s, found in (("compile", stage2), ("buckets", stage3), ("accuracy", stage4))}
    assert all(len(found) == 1 for found in blockers.values()), blockers
    assert len({found[0]["cause"] for found in blockers.values()}) == 1
    rows = [{"stage": s, "severity": f["severity"], "kind": f["kind"], "message": f["message"],
             "advice": f["advice"], "consequence": "", "where": "", "owner": "", "cause": findings.cause_of(f),
             "stages": [s]} for s, found in blockers.items() for f in found]
    [merged] = merge_causes(rows)
    assert merged["stages"] == ["compile", "buckets", "accuracy"] and len(merged["evidence"]) == 3
    assert merged["severity"] == "blocker" and "found by stages compile, buckets, accuracy" in merged["message"]
    # portkit compiled with dynamic=False at fixed shapes: that fix was tried, and is never the advice
    assert all("pad to buckets" not in f["advice"] and "dynamic=False)" not in f["advice"].split("tried:")[0]
               for found in blockers.values() for f in found)
