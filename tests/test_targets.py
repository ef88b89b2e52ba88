import json
from pathlib import Path

import pytest

from portkit import probes, targets
from portkit.errors import BadParameter

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_every_target_is_complete_data():
    for name, t in targets.TARGETS.items():
        assert t.name == name and t.device and t.backend and t.precisions
        if not t.reference:
            assert t.static_shapes and t.op_table and t.vendor_package and t.kernel_language
            assert t.dtype_rules[0].source.__repr__() == "torch.float64"
            assert {"cpu_fallback", "unsupported", "custom_op", "sparse"} <= set(t.features)


def test_dtype_rules_and_precision_as_documented():
    import torch
    neuron, tpu = targets.get("neuron"), targets.get("tpu")
    assert [(r.source, r.result) for r in neuron.dtype_rules] == [(torch.float64, torch.float32),
                                                                  (torch.int64, torch.int32)]
    assert [(r.source, r.result) for r in tpu.dtype_rules] == [(torch.float64, torch.float32)]
    assert tpu.default_precision.matmul_inputs == torch.bfloat16   # one bf16 pass, fp32 accumulate
    assert tpu.default_precision.matmul_output is None
    assert neuron.default_precision.matmul_inputs is None          # --auto-cast=none
    assert tpu.precision("highest").matmul_inputs is None


def test_unknown_target_names_the_choices():
    with pytest.raises(BadParameter, match=r"unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda"):
        targets.get("trn")
    with pytest.raises(BadParameter, match="precision"):
        targets.get("tpu").precision("bf16")
    assert targets.parse_targets("tpu, neuron,tpu") == ["tpu", "neuron"]
    with pytest.raises(BadParameter):
        targets.parse_targets([])


def test_detect_is_native_only_with_the_vendor_device():
    # Derived from the device probe, so this holds on a host with the device as well as without.
    for name in targets.MIGRATION_TARGETS:
        t, d = targets.get(name), targets.detect(name)
        mode = "native" if probes.device_available(t.vendor_module, t.device) else "emulated"
        assert d.mode == mode and d.to_dict()["mode"] == mode and str(d).startswith(f"target {name}: {mode}, ")
        assert d.backend == (t.backend if mode == "native" else t.emulated_backend)
        if mode == "emulated":
            assert d.reason.endswith("; running on the CPU under the target's rules")
            assert d.op_table.provenance == targets.OpTable.load(t.op_table).provenance   # the shipped table
    assert targets.detect("cpu").mode == "native"


@pytest.mark.parametrize("name,package,reason,backend", [
    ("tpu", "torch-tpu", "torch-tpu 0.2.0 with a tpu device", "tpu"),
    ("neuron", "torch-neuronx", "torch-neuronx 0.2.0 with a neuron device", "neuron"),
])
def test_detect_in_native_mode_says_so(monkeypatch, name, package, reason, backend):
    # What detect() writes on a host with the device, checked here by answering the probes as one would.
    monkeypatch.setattr(probes, "device_available", lambda module, device: True)
    monkeypatch.setattr(probes, "package_version", lambda dist: "0.2.0" if dist == package else None)
    d = targets.detect.__wrapped__(name)          # uncached: the real detection is left as it was
    assert (d.mode, d.reason, d.backend) == ("native", reason, backend)
    assert str(d) == f"target {name}: native, {reason}"
    assert d.to_dict()["mode"] == "native" and d.to_dict()["backend"] == backend
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1" and d.op_table.device_paths


def test_op_tables_carry_provenance():
    for name in targets.MIGRATION_TARGETS:
        table = targets.OpTable.load(targets.get(name).op_table)
        assert len(table.native) > 300
        for key in ("source", "version", "method", "date", "generated_by"):
            assert table.provenance.get(key), (name, key)


@pytest.mark.skipif(not (SHARED / "torch_tpu_0.2.0_dispatcher_ops.json").exists(), reason="shared data absent")
def test_tpu_table_matches_the_checked_snapshot():
    ours = json.loads((targets.DATA / "tpu.json").read_text())
    theirs = json.loads((SHARED / "torch_tpu_0.2.0_dispatcher_ops.json").read_text())
    assert set(ours["native"]) == {o for o in theirs["PrivateUse1"] if o.startswith("aten::")}


@pytest.mark.skipif(not (SHARED / "neuron_ops_devtree_2026-04.json").exists(), reason="shared data absent")
def test_neuron_table_is_built_from_the_dev_tree_data():
    ours = json.loads((targets.DATA / "neuron.json").read_text())
    theirs = json.loads((SHARED / "neuron_ops_devtree_2026-04.json").read_text())
    assert set(ours["native"]) == set(theirs["native"]) - set(theirs["cpu_fallback"])
    assert set(ours["cpu_fallback"]) == set(theirs["cpu_fallback"])


@pytest.mark.parametrize("target,op,status,via", [
    ("neuron", "aten::addmm", "native", None),
    ("tpu", "aten::addmm", "composite", "aten::addmm.out"),           # structured op -> out= kernel
    ("tpu", "aten::sum.dim_IntList", "composite", "aten::sum.IntList_out"),
    ("tpu", "aten::add_.Tensor", "composite", "aten::add.out"),          # in-place -> out=
    ("neuron", "aten::t", "composite", None),                         # composite kernel
    ("neuron", "aten::_linalg_svd", "cpu_fallback", None),            # the vendor's host kernel
    ("neuron", "aten::bernoulli_.float", "cpu_fallback", None),       # no kernel: generic fallback
    ("neuron", "aten::_thnn_fused_lstm_cell", "unsupported", None),   # no kernel anywhere
    ("tpu", "aten::_thnn_fused_lstm_cell", "native", None),
    ("neuron", "aten::mkldnn_rnn_layer", "unsupported", "aten::_thnn_fused_lstm_cell"),   # device path
    ("tpu", "aten::_scaled_dot_product_flash_attention_for_cpu", "native",
     "aten::_scaled_dot_product_fused_attention_overrideable"),
])
def test_classification(target, op, status, via):
    # The shipped tables (what emulated mode uses), not detect()'s: natively that is the live dispatcher.
    got = targets.OpTable.load(targets.get(target).op_table).classify(op)
    assert got.status == status, got
    assert got.via == via


def test_probes_return_false_instead_of_raising():
    assert probes.module_available("torch")
    assert not probes.module_available("no_such_module_portkit")
    assert not probes.device_available("no_such_module_portkit", "tpu")
    assert probes.package_version("no-such-dist-portkit") is None


@pytest.mark.native
@pytest.mark.skipif(not probes.device_available("torch_neuronx", "neuron"), reason="needs torch-neuronx and a Trainium device")
def test_native_neuron_reads_the_live_table():
    d = targets.detect("neuron")
    assert d.mode == "native" and d.backend == "neuron"
    assert d.reason == f"torch-neuronx {probes.package_version('torch-neuronx')} with a neuron device"
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1"


@pytest.mark.native
@pytest.mark.skipif(not probes.device_available("torch_tpu", "tpu"), reason="needs torch-tpu and a TPU")
def test_native_tpu_reads_the_live_table():
    d = targets.detect("tpu")
    assert d.mode == "native" and d.backend == "tpu"
    assert d.reason == f"torch-tpu {probes.package_version('torch-tpu')} with a tpu device"
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1"
    assert "aten::addmm.out" in d.op_table.native
