"""Eager findings against the compiled graphs, whose code they are, and severity by consequence."""
import os
import sysconfig

import pytest
import torch

from conftest import FIXTURES, fixture_model
from portkit.stages.compile.stage import eager_findings, find_graph_breaks
from portkit.corpora.corpus import example_batch
from portkit.stages.fallbacks import recording
from portkit.stages.fallbacks.stage import find_fallbacks
from portkit.core import owners
from portkit.models import registry
from portkit.stages import reconcile
from portkit.stages.report.stage import build_report
from portkit.runfolder import results
from portkit.core.findings import BLOCKER, INFO, NOT_CHECKED, PERSISTS, VANISHES, WORK


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(FIXTURES.read_text().splitlines(), 1) if marker in line)


def eager_and_compiled(m, inputs, targets):
    eager = find_fallbacks(m, inputs, targets)
    compiled = {"stage": "compile", "graph_breaks": find_graph_breaks(m, inputs, targets).to_dict()}
    return eager, compiled


def reconciled(eager, compiled, target, kind):
    found = reconcile.reconcile(eager.to_dict()["targets"][target]["findings"], compiled, target)
    return [f for f in found if f["kind"] == kind]


@pytest.fixture(scope="module")
def minilm_run(minilm, corpus, tmp_path_factory):
    """MiniLM (real weights), stage 1 and stage 2's capture for TPU, saved as a run folder."""
    inputs, described = example_batch(minilm, corpus, 2, 16)
    eager, compiled = eager_and_compiled(minilm, inputs, ["tpu"])
    folder = tmp_path_factory.mktemp("minilm")
    eager.save(folder / "fallbacks.json")
    results.save_result(folder / "compile.json", {**compiled, "model": minilm.describe(), "targets": {"tpu": {}}})
    return eager, compiled, folder


def test_minilm_masking_host_sync_is_eager_only_library_code_that_vanishes(minilm_run):
    eager, compiled, _ = minilm_run
    sync = eager.targets["tpu"].findings
    sync = next(f for f in sync if f.kind == "host_sync")
    # stage 1 names transformers' own line, a library the user configures, not the user's code
    assert sync.where["file"].endswith(os.path.join("transformers", "masking_utils.py"))
    assert "padding_mask.all()" in sync.where["code"]
    assert sync.owner["owner"] == owners.CONFIGURABLE and sync.owner["setting"] == "attn_implementation"
    assert "keep the value as a tensor" not in sync.advice and "attn_implementation" in sync.advice
    # stage 2 captured one graph without it: it vanishes, as info, and says so
    assert compiled["graph_breaks"]["breaks"] == [] and compiled["graph_breaks"]["fullgraph"]["ok"]
    [f] = reconciled(eager, compiled, "tpu", "host_sync")
    assert (f["eager_severity"], f["compiled"], f["severity"]) == (WORK, VANISHES, INFO)
    assert "no cost under torch.compile" in f["consequence"]


def test_the_report_opens_with_consequences_and_counts_what_vanishes(minilm_run):
    _, _, folder = minilm_run
    r = build_report(run_dir=folder)
    tpu = r.to_dict()["targets"]["tpu"]
    assert not any(f["kind"] == "host_sync" for f in tpu["first"])          # not listed as work
    assert tpu["vanished"].startswith("1 thing found when the model runs eagerly is gone once torch.compile traces")
    assert "host sync" in tpu["vanished"]
    assert "host sync" not in tpu["verdict_reason"]
    sync = next(f for f in tpu["findings"] if f["kind"] == "host_sync")
    assert (sync["eager"], sync["compiled"], sync["owner"]) == (WORK, VANISHES, owners.CONFIGURABLE)
    assert tpu["findings"][-1]["compiled"] == VANISHES                       # ordered by consequence
    text = str(r).splitlines()
    assert any(line.strip().startswith("1 thing found when the model runs eagerly") for line in text[:6])
    page = r.html()
    assert page.index("What to fix first") < page.index("Environment")
    # the findings table: plain words first, the eager and compiled readings behind each finding's disclosure
    assert "<th>severity</th><th>finding</th><th>consequence</th>" in page
    assert "<summary>technical detail</summary>" in page and "under torch.compile: vanishes" in page


def test_a_host_sync_in_the_users_forward_persists_as_a_graph_break_with_its_line(tmp_path):
    m = registry.load(fixture_model("item_branch_model"))
    inputs = m.encode(["Return x."], pad_to=6)
    eager = find_fallbacks(m, inputs, ["neuron", "tpu"])
    breaks = find_graph_breaks(m, inputs, ["neuron", "tpu"])
    compiled = {"graph_breaks": breaks.to_dict()}
    line = line_of(".item() > 1.0")
    for target in ("neuron", "tpu"):
        [f] = reconciled(eager, compiled, target, "host_sync")
        assert f["where"]["file"] == str(FIXTURES) and f["where"]["line"] == line
        assert f["owner"]["owner"] == owners.USER and f["advice"].endswith("keep the value as a tensor")
        assert (f["compiled"], f["severity"]) == (PERSISTS, WORK)
        assert "graph break at this line" in f["compiled_detail"] and "device-to-host" in f["consequence"]
    assert compiled["graph_breaks"]["breaks"][0]["where"]["line"] == line
    # the stage 2 notebook shows the same, read from stage 1's saved result
    assert "no stage 1 result" in eager_findings(breaks, tmp_path, ["tpu"])["tpu"].caption
    eager.save(tmp_path / "fallbacks.json")
    shown = eager_findings(breaks, tmp_path, ["tpu"])["tpu"]
    assert any(row[:2] == [WORK, WORK] and row[2].startswith(PERSISTS) and row[3] == owners.USER for row in shown.rows)


@pytest.mark.parametrize("compiled_run", [True, False], ids=["compiled", "not compiled"])
def test_a_recurrent_cell_stays_a_blocker_on_neuron_whether_or_not_compiled(compiled_run):
    m = registry.load(fixture_model("gru_model"))
    inputs = m.encode(["Return x."], pad_to=6)
    eager = find_fallbacks(m, inputs, ["neuron"])
    compiled = ({"graph_breaks": find_graph_breaks(m, inputs, ["neuron"]).to_dict()}
                if compiled_run else None)
    [f] = reconciled(eager, compiled, "neuron", "recurrent")
    assert f["severity"] == BLOCKER and f["compiled"] == (PERSISTS if compiled_run else NOT_CHECKED)
    assert "cannot run on the target" in f["consequence"]
    assert f["owner"]["owner"] == owners.USER and f["where"]["line"] == line_of("out, _ = self.rnn(")


def test_whose_code_a_frame_is():
    site = sysconfig.get_paths()["purelib"]
    mask = {"file": os.path.join(site, "transformers", "masking_utils.py"), "line": 354}
    assert owners.owner(mask)["owner"] == owners.CONFIGURABLE
    other = {"file": os.path.join(site, "timm", "layers", "mlp.py"), "line": 1}
    assert owners.owner(other) == {"owner": owners.LIBRARY, "package": "timm", "setting": None, "setting_help": None}
    assert owners.owner({"file": str(FIXTURES), "line": 1})["owner"] == owners.USER      # a factory file
    assert owners.owner({"file": "/home/me/project/model.py", "line": 1})["owner"] == owners.USER
    assert owners.owner(None)["owner"] == "unknown"
    # a model factory's own package counts as the user's, even installed in site-packages
    mine = {"file": os.path.join(site, "acme_models", "heads.py"), "line": 3}
    assert owners.owner(mine)["owner"] == owners.LIBRARY
    owners.claim(os.path.join(site, "acme_models"))
    assert owners.owner(mine)["owner"] == owners.USER and owners.owner(other)["owner"] == owners.LIBRARY
    # a library's line is never "rewrite this line": an upgrade or a wrapper, worded as leads where portkit knows
    # no setting of the library for the path and tried nothing (never "look for a setting")
    sync = {"kind": "host_sync", "severity": WORK, "advice": "keep the value as a tensor",
            "where": {**other, "text": "x"}}
    advice = reconcile.advice_for(sync, owners.owner(other))
    assert "keep the value" not in advice and "a newer timm" in advice and "wrap" in advice
    assert "may help" in advice and "look for a setting" not in advice
    # the frame a finding names skips torch and the standard library
    assert owners.caller()["file"] == __file__


class RelativeBuckets(torch.nn.Module):
    """T5's relative-position buckets in small: log(0) cast to int64 is -2**63, then masked by torch.where."""

    def forward(self, input_ids, attention_mask):
        rel = (input_ids[:, None, :] - input_ids[:, :, None]).abs()
        large = 8 + (torch.log(rel.float() / 8) * 4).to(torch.long)
        return {"buckets": torch.where(rel < 8, rel, torch.clamp(large, max=15))}


class BigIds(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return {"ids": input_ids * (1 << 40)}


def neuron_findings(module) -> dict:
    ids = {"input_ids": torch.tensor([[0, 3, 9, 20]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    m = registry.LoadedModel("t", registry.TOKEN_CLASSIFIER, module, "test", tokenizer=None)
    return {f.kind: f for f in find_fallbacks(m, ids, ["neuron"]).targets["neuron"].findings}


def test_int64_sentinels_of_a_masked_cast_are_a_check_not_a_blocker():
    saturated = neuron_findings(RelativeBuckets())
    assert "int64_overflow" not in saturated and saturated["int64_saturated"].severity == WORK
    assert saturated["int64_saturated"].where["file"] == __file__
    overflow = neuron_findings(BigIds())
    assert overflow["int64_overflow"].severity == BLOCKER and "to 21990232555520" in overflow["int64_overflow"].message


def test_uninitialized_memory_is_never_an_int64_overflow():
    """Mixtral's grouped experts allocate an index permutation with torch.empty_like and fill it after
    (transformers/integrations/moe.py): the allocation holds whatever the memory held (heap pointers, here), which
    is not the model's value and never an overflow; the values the model writes are still checked (BigIds)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    from portkit.models.adapters import LogitsAdapter
    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2)
    module = LogitsAdapter(MixtralForCausalLM(config).eval())
    found = neuron_findings(module)
    assert "int64" in found and "int64_overflow" not in found
    assert recording.UNINITIALIZED >= {"aten::empty", "aten::empty_like", "aten::new_empty"}


def test_a_cpu_trace_never_clears_a_fused_recurrent_cell():
    """LSTMCell and GRUCell decompose into matmuls in a CPU trace, while a PrivateUse1 device runs the fused cell:
    the compiled CPU graphs cannot show the cell gone, so the eager blocker stands as "not checked"."""
    m = registry.load(fixture_model("cell_only_model"))
    inputs = m.encode(["Return x."], pad_to=6)
    eager, compiled = eager_and_compiled(m, inputs, ["neuron"])
    found = reconciled(eager, compiled, "neuron", "recurrent")
    assert found, "the cell tagger's recurrent modules are findings"
    assert all(f["severity"] == BLOCKER for f in found)
    assert all(f["compiled"] != VANISHES for f in found)
    cells = [f for f in found if f["compiled"] == NOT_CHECKED]
    assert cells and all("the device takes another path" in f["compiled_detail"] for f in cells)
    assert "vanish" not in (reconcile.vanished_line(found) or "")
