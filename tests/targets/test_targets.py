import importlib.util
import json

import pytest

from conftest import ROOT
from portkit.core import availability
from portkit.targets import specs
from portkit.core.errors import BadParameter

SOURCES = ROOT / "data" / "sources"     # the snapshots the op tables are built from, shipped in the repo


def load_tool(name: str):
    """A tools/ script as a module, so its functions run in-process."""
    spec = importlib.util.spec_from_file_location(f"portkit_tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_target_is_complete_data():
    for name, t in specs.TARGETS.items():
        assert t.name == name and t.device and t.backend and t.precisions
        if not t.reference:
            assert t.static_shapes and t.op_table and t.vendor_package and t.kernel_language
            assert t.dtype_rules[0].source.__repr__() == "torch.float64"
            assert {"cpu_fallback", "unsupported", "custom_op", "sparse"} <= set(t.features)


def test_dtype_rules_and_precision_as_documented():
    import torch
    neuron, tpu = specs.get("neuron"), specs.get("tpu")
    assert [(r.source, r.result) for r in neuron.dtype_rules] == [(torch.float64, torch.float32),
                                                                  (torch.int64, torch.int32)]
    assert [(r.source, r.result) for r in tpu.dtype_rules] == [(torch.float64, torch.float32)]
    assert tpu.default_precision.matmul_inputs == torch.bfloat16   # one bf16 pass, fp32 accumulate
    assert tpu.default_precision.matmul_output is None
    assert neuron.default_precision.matmul_inputs is None          # --auto-cast=none
    assert tpu.precision("highest").matmul_inputs is None


def test_unknown_target_names_the_choices():
    with pytest.raises(BadParameter, match=r"unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda"):
        specs.get("trn")
    with pytest.raises(BadParameter, match="precision"):
        specs.get("tpu").precision("bf16")
    assert specs.parse_targets("tpu, neuron,tpu") == ["tpu", "neuron"]
    with pytest.raises(BadParameter):
        specs.parse_targets([])


def test_detect_is_native_only_with_the_vendor_device(monkeypatch):
    # Derived from the device probe, so this holds on a host with the device as well as without.
    monkeypatch.delenv(specs.MODE_VARIABLE, raising=False)
    for name in specs.MIGRATION_TARGETS:
        t, d = specs.get(name), specs.detect(name)
        mode = "native" if availability.device_available(t.vendor_module, t.device) else "emulated"
        assert d.mode == mode and d.to_dict()["mode"] == mode and str(d).startswith(f"target {name}: {mode}, ")
        assert d.backend == (t.backend if mode == "native" else t.emulated_backend)
        if mode == "emulated":
            assert d.reason.endswith("; running on the CPU under the target's rules")
            assert d.op_table.provenance == specs.OpTable.load(t.op_table).provenance   # the shipped table
    assert specs.detect("cpu").mode == "native"


@pytest.mark.parametrize("name,package,reason,backend", [
    ("tpu", "torch-tpu", "torch-tpu 0.2.0 with a tpu device", "tpu"),
    ("neuron", "torch-neuronx", "torch-neuronx 0.2.0 with a neuron device", "neuron"),
])
def test_detect_in_native_mode_says_so(monkeypatch, name, package, reason, backend):
    # What detect() writes on a host with the device, checked here by answering the probes as one would.
    monkeypatch.setattr(availability, "device_available", lambda module, device: True)
    monkeypatch.setattr(availability, "package_version", lambda dist: "0.2.0" if dist == package else None)
    d = specs._detect.__wrapped__(name, "auto")   # uncached: the real detection is left as it was
    assert (d.mode, d.reason, d.backend) == ("native", reason, backend)
    assert str(d) == f"target {name}: native, {reason}"
    assert d.to_dict()["mode"] == "native" and d.to_dict()["backend"] == backend
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1" and d.op_table.device_paths


def test_op_tables_carry_provenance():
    for name in specs.MIGRATION_TARGETS:
        table = specs.OpTable.load(specs.get(name).op_table)
        assert len(table.native) > 300
        for key in ("source", "version", "method", "date", "generated_by"):
            assert table.provenance.get(key), (name, key)


def test_tpu_table_matches_the_checked_snapshot():
    ours = json.loads((specs.DATA / "tpu.json").read_text())
    theirs = json.loads((SOURCES / "torch_tpu_0.2.0_dispatcher_ops.json").read_text())
    assert set(ours["native"]) == {o for o in theirs["PrivateUse1"] if o.startswith("aten::")}


def test_neuron_table_is_built_from_the_dev_tree_data():
    ours = json.loads((specs.DATA / "neuron.json").read_text())
    theirs = json.loads((SOURCES / "neuron_ops_devtree_2026-04.json").read_text())
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
    got = specs.OpTable.load(specs.get(target).op_table).classify(op)
    assert got.status == status, got
    assert got.via == via


def test_probes_return_false_instead_of_raising():
    assert availability.module_available("torch")
    assert not availability.module_available("no_such_module_portkit")
    assert not availability.device_available("no_such_module_portkit", "tpu")
    assert availability.package_version("no-such-dist-portkit") is None


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_neuronx", "neuron"),
                    reason="needs torch-neuronx and a Trainium device")
def test_native_neuron_reads_the_live_table():
    d = specs.detect("neuron")
    assert d.mode == "native" and d.backend == "neuron"
    assert d.reason == f"torch-neuronx {availability.package_version('torch-neuronx')} with a neuron device"
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1"


@pytest.mark.native
@pytest.mark.skipif(not availability.device_available("torch_tpu", "tpu"), reason="needs torch-tpu and a TPU")
def test_native_tpu_reads_the_live_table():
    d = specs.detect("tpu")
    assert d.mode == "native" and d.backend == "tpu"
    assert d.reason == f"torch-tpu {availability.package_version('torch-tpu')} with a tpu device"
    assert d.op_table.provenance["source"] == "live dispatcher, key PrivateUse1"
    assert "aten::addmm.out" in d.op_table.native


def test_neuron_builder_reads_data_sources_and_rebuilds_the_shipped_table(tmp_path, capsys):
    tool = load_tool("build_neuron_optable")
    assert tool.DEFAULT_SOURCE == SOURCES / "neuron_ops_devtree_2026-04.json"
    assert tool.main(["--out", str(tmp_path / "neuron.json")]) == 0
    assert "data/sources/neuron_ops_devtree_2026-04.json" in capsys.readouterr().out
    built = json.loads((tmp_path / "neuron.json").read_text())
    shipped = json.loads((specs.DATA / "neuron.json").read_text())
    built["provenance"].pop("date"), shipped["provenance"].pop("date")
    assert built == shipped
    # Provenance as it is: a public repository's development-tree snapshot, superseded by the release table.
    prov = shipped["provenance"]
    assert "parmoham-aws/test-repo-parmoham at commit 98154b867aa24562a3213e520d9ad7fd41032291 (2026-04-21)" \
        in prov["source"]
    assert "not an AWS release" in prov["source"] and "read statically" in prov["source"]
    assert prov["superseded_by"].startswith("aws-neuron/torch-neuronx docs/torch_api_compatibility.md")


def test_builders_refuse_a_bad_source_in_one_line_before_writing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "table.json"
    neuron = load_tool("build_neuron_optable")
    with pytest.raises(SystemExit) as exited:
        neuron.main(["--source", str(tmp_path / "missing.json"), "--out", str(out)])
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        neuron.main(["--source", str(SOURCES / "torch_tpu_0.2.0_dispatcher_ops.json"), "--out", str(out)])
    tpu = load_tool("build_tpu_optable")
    monkeypatch.setattr(tpu, "query_wheel", lambda version: pytest.fail("fetched the wheel despite a bad --compare"))
    with pytest.raises(SystemExit) as exited:
        tpu.main(["--compare", str(tmp_path / "missing.json"), "--out", str(out)])
    assert exited.value.code == 2 and not out.exists()
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and "missing.json" in errors[0]
    assert "not an op snapshot: it lacks native, cpu_fallback, decomposed" in errors[1]


def test_tpu_builder_compares_with_the_shipped_snapshot():
    tpu = load_tool("build_tpu_optable")
    assert tpu.DEFAULT_COMPARE == SOURCES / "torch_tpu_0.2.0_dispatcher_ops.json"
    reference = tpu.read_snapshot(tpu.DEFAULT_COMPARE)
    assert len(reference) == 731
    table = json.loads((specs.DATA / "tpu.json").read_text())
    same = tpu.comparison(table["native"] + table["native_other_namespaces"], reference, "snapshot")
    assert same["same"] and not same["only_here"]
    differ = tpu.comparison(table["native"], reference, "snapshot")
    assert not differ["same"] and differ["only_there"] == sorted(table["native_other_namespaces"])


@pytest.mark.parametrize("op,eager,compiled", [
    ("aten::elu", "cpu_fallback", "decomposed"),                 # named in the decomposition list
    ("aten::binary_cross_entropy", "cpu_fallback", "decomposed"),
    ("aten::argsort.stable", "cpu_fallback", "decomposed"),      # host-CPU kernel eagerly, decomposed compiled
    ("aten::logsumexp.out", "composite", "decomposed"),          # a whole operator named: its overloads too
    ("aten::as_strided_", "composite", "composite"),              # a kernel for every backend, not structured
    ("aten::_linalg_svd", "cpu_fallback", "cpu_fallback"),       # not in the list: still would not lower
    ("aten::addmm", "native", "native"),
])
def test_neuron_compile_decompositions_lower_under_torch_compile(op, eager, compiled):
    table = specs.detect("neuron").op_table
    got = table.classify(op)
    assert got.status == eager
    if eager in ("cpu_fallback", "unsupported"):     # the eager detail says where compiling changes that
        assert ("torch.compile decomposes it" in got.detail) == (compiled == specs.DECOMPOSED)
    assert table.classify(op, compiled=True).status == compiled
    assert specs.DECOMPOSED not in specs.STATUSES       # never an eager status


def test_only_overloads_with_a_decomposition_follow_a_bare_name():
    table = specs.OpTable("t", native=frozenset(), compile_decomposed=frozenset({"aten::lerp", "aten::topk"}))
    assert table.is_compile_decomposed("aten::lerp.Scalar")      # PyTorch decomposes every lerp overload
    assert table.is_compile_decomposed("aten::topk")             # the default overload, by name
    assert not table.is_compile_decomposed("aten::topk.values")  # no upstream decomposition for it
    assert specs.detect("tpu").op_table.classify("aten::elu", compiled=True).status == "composite"


def test_portkit_mode_forces_emulation_and_rejects_other_values(monkeypatch):
    monkeypatch.setattr(availability, "device_available", lambda module, device: True)   # as on a device host
    monkeypatch.setattr(specs.OpTable, "live", classmethod(lambda cls, *a, **k: specs.OpTable.load("tpu.json")))
    monkeypatch.setattr(specs, "_detect", specs._detect.__wrapped__)   # uncached, as the probes are faked
    monkeypatch.delenv(specs.MODE_VARIABLE, raising=False)
    assert specs.detect("tpu").mode == "native"
    monkeypatch.setenv(specs.MODE_VARIABLE, "emulated")
    d = specs.detect("tpu")
    assert d.mode == "emulated" and d.reason.startswith("PORTKIT_MODE=emulated")
    assert specs.detect("cpu").mode == "native"            # the reference target is never emulated
    monkeypatch.setenv(specs.MODE_VARIABLE, "fast")
    with pytest.raises(BadParameter, match="unknown PORTKIT_MODE 'fast'; choose one of: auto, emulated"):
        specs.detect("tpu")


def test_vendor_lists_and_requirements_are_data_with_their_source_and_date():
    lists, required = specs.vendor_lists(), specs.requirements()
    assert set(lists) == set(required) == set(specs.MIGRATION_TARGETS)
    for name, lst in lists.items():
        assert lst["source"].startswith("the vendors' launch documentation") and lst["read"] == "2026-12-04"
    for name, req in required.items():      # the pins: the release notes' support matrix, the wheel's METADATA
        assert req["source"].startswith("https://") and req["read"] == "2026-12-05" and req["rows"], name
    tpu = {e["feature"]: e for e in lists["tpu"]["entries"]}
    assert set(tpu) == {"symbolic integers", "ragged tensors", "LSTM", "GRU", "Mamba-family models", "FSDPv2"}
    assert {(e["status"], e["severity"]) for e in tpu.values()} == {("experimental", "work")}
    neuron = {e["feature"]: (e["status"], e["severity"]) for e in lists["neuron"]["entries"]}
    assert neuron.pop("FP8 quantization through TorchAO") == ("private beta", "work")
    assert set(neuron.values()) == {("unsupported", "blocker")} and len(neuron) == 5
    assert [r["torch"] for r in required["neuron"]["rows"]] == [{"pin": "2.13.0"}, {"pin": "2.14.0"}]
    assert {str(r["python"]) for r in required["neuron"]["rows"]} == {str({"min": "3.12", "max": "3.14"})}
    assert required["tpu"]["rows"] == [{"package": "torch-tpu 0.2.0", "torch": {"min": "2.11.0", "max": "2.15.0"},
                                        "python": {"min": "3.11"}, "libtpu": {"min": "0.0.50"}}]
    assert not any(r.get("transformers") for req in required.values() for r in req["rows"])
