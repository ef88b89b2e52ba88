"""portkit.stages.xla.stage (stage 3b) and its machinery (portkit.tpu_compile: compiler, results, cache): real XLA
compiles for TPU topologies on this CPU host, the verdict cache, and the Neuron lowering check.

Tests that compile need jax, jaxlib, libtpu and torchax (`pip install 'portkit[xla]'`) and skip
without them; validation and the skip path run everywhere. The whole session shares one fresh cache
root (tests/conftest.py); the cache tests below each use their own empty one.
"""
import functools
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import ROOT
from portkit.corpora import corpus
from portkit.models import registry
from portkit.core import availability
from portkit.runfolder import results
from portkit.run import runner
from portkit.targets import specs
from portkit.stages.xla.stage import (COMPILE_ONLY_ENV, Options, XlaSkipped, check_lowering, compile_for_tpu,
    compile_seconds, run_stage, stage_shapes, xla_section)
from portkit.tpu_compile import cache
from portkit.tpu_compile import compiler
from portkit.core.errors import BadParameter, MissingPackage, PortkitError

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax: pip install 'portkit[xla]'")


class Airy(nn.Module):
    """torch.special.airy_ai has no JAX lowering in torchax 0.0.13."""

    def forward(self, x):
        return torch.special.airy_ai(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.act = Airy()

    def forward(self, x):
        return self.act(self.proj(x))


class NoLowering(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16), Block()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return {"y": x}


class Dense(nn.Module):
    def __init__(self, width: int = 1024):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return {"y": torch.tanh(self.fc(x))}


@pytest.fixture(scope="module")
def bert():
    return registry.load("bert")      # 2 layers, hidden 128, random weights: a graph small enough to compile quickly


# ---------------------------------------------------------------- compiles (need jax + libtpu + torchax)
@needs_xla
def test_small_model_compiles_for_v5e_with_hbm_and_flops(bert, tmp_path):
    report = compile_for_tpu(bert, shapes=[{"batch": 1, "seq": 32}, {"batch": 4, "seq": 32}])
    one, four = report.shapes
    for s in (one, four):
        assert s.status == "compiled" and s.ok, s.message
        assert s.platform == "tpu"
        assert s.memory["argument"] > 0 and s.memory["generated_code"] > 0 and s.memory["total"] > 0
        assert s.flops > 0 and s.bytes_accessed > 0 and s.compile_seconds > 0
        assert s.fits_hbm is True
        # The compiled program holds the weights once, in float32: argument bytes track parameter bytes.
        assert 0.95 < s.memory["argument"] / report.parameter_bytes < 1.1
    assert four.flops > 3 * one.flops            # one compile per shape, not one reused program
    assert report.hbm_bytes_per_device == 16 * 2 ** 30 and report.devices == 1
    text = str(report)
    assert "real XLA compile" in text and "compile-only" in text and "nothing executed on a TPU" in text
    assert "sanity: argument bytes" in text
    assert "nothing executed on a TPU" in report._repr_html_()
    saved = json.loads(json.dumps(report.to_dict()))
    assert saved["ok"] is True and saved["shapes"][0]["memory"]["total"] == one.memory["total"]
    assert "optimal_seconds" not in json.dumps(saved)     # can be negative: never reported


@needs_xla
def test_guard_rejects_an_executable_compiled_for_the_cpu():
    jax, _ = compiler.require_xla()
    spec = jax.ShapeDtypeStruct((8, 8), jax.numpy.float32)           # no sharding: JAX picks the CPU
    compiled = jax.jit(lambda a: a @ a).lower(spec).compile()
    with pytest.raises(PortkitError, match="not TPU"):
        compiler._compiled_platform(jax, compiled, "v5e:1x1")


@needs_xla
def test_op_without_lowering_is_reported_with_its_module_path():
    report = compile_for_tpu(NoLowering(), shapes=[{"x": ((4, 16), "float32")}])
    (s,) = report.shapes
    assert s.status == "no_lowering" and not report.ok
    assert s.op == "aten::special_airy_ai"
    assert s.module_path == "layers.1.act" and s.module_type == "Airy"
    assert "NO LOWERING for aten::special_airy_ai in module layers.1.act (Airy)" in str(report)
    assert "Traceback" not in str(report)


@needs_xla
def test_oversized_shape_does_not_fit_hbm():
    report = compile_for_tpu(Dense(), shapes=[{"x": ((8, 1024), "float32")},
                                                  {"x": ((1 << 22, 1024), "float32")}])   # 16 GiB of input
    small, huge = report.shapes
    assert small.ok and small.fits_hbm is True
    assert huge.status == "out_of_hbm" and huge.fits_hbm is False and not huge.ok
    assert "HBM" in huge.message                  # the compiler's own words
    assert "DOES NOT FIT HBM" in str(report) and not report.ok
    # Not fitting is the compiler's verdict on this program: a rerun reads it back instead of compiling.
    again = compile_for_tpu(Dense(), shapes=[{"x": ((1 << 22, 1024), "float32")}]).shapes[0]
    assert again.cached and again.status == "out_of_hbm" and again.fits_hbm is False
    assert again.message == huge.message and again.compile_seconds == huge.compile_seconds


@needs_xla
def test_batch_splits_over_devices_when_it_divides():
    report = compile_for_tpu(Dense(256), shapes=[{"x": ((8, 256), "float32")}, {"x": ((2, 256), "float32")}],
                                 topology="v5e:2x2")
    split, replicated = report.shapes
    assert report.devices == 4
    assert split.input_sharding == "batch split over 4 devices"
    assert replicated.input_sharding == "replicated on 4 device(s)"
    # Per device: 8 rows split four ways hold as many input bytes as 2 rows replicated.
    assert split.memory["argument"] == replicated.memory["argument"]


@needs_xla
def test_bfloat16_halves_the_weights(bert):
    report = compile_for_tpu(bert, shapes=[{"batch": 1, "seq": 16}], dtype="bfloat16")
    assert report.dtype == "bfloat16" and report.shapes[0].ok
    assert 0.95 < report.shapes[0].memory["argument"] / report.parameter_bytes < 1.1
    assert report.parameter_bytes == 2 * report.parameters


@needs_xla
def test_neuron_gets_a_lowering_check_only(bert):
    report = xla_section(bert, "neuron", [{"batch": 2, "seq": 16}])
    assert report.check == "lowering" and report.ok
    assert report.headline == "lowering check only (StableHLO export), not a Neuron compile"
    assert report.shapes[0].stablehlo_ops > 100 and report.shapes[0].memory is None
    assert str(report).startswith("neuron: lowering check only")
    failed = xla_section(NoLowering(), "neuron", [{"x": ((4, 16), "float32")}])
    assert failed.shapes[0].op == "aten::special_airy_ai" and failed.shapes[0].module_path == "layers.1.act"


@needs_xla
def test_torchax_shim_leaves_torch_usable_for_the_other_stages():
    fast_path = torch.backends.mha.get_fastpath_enabled()
    compiler.require_xla()
    with pytest.raises(AttributeError):
        torch.ops.aten.prod.dim_Dimname           # removed in torch 2.13; the shim only bends it during import
    assert torch.backends.mha.get_fastpath_enabled() == fast_path
    # torchax claims PrivateUse1 as "jax"; Dynamo must still see no usable accelerator and compile.
    assert not torch.accelerator.is_available()
    torch._dynamo.reset()
    double = torch.compile(lambda t: t * 2 + 1, backend="eager", fullgraph=True)
    assert torch.equal(double(torch.ones(3)), torch.full((3,), 3.0))


# ------------------------------------------------------- the verdict cache: a shape never compiles twice
@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty cache root of this test's own, and a count of the XLA compiles actually run."""
    import jax
    monkeypatch.setenv(corpus.CACHE_VARIABLE, str(tmp_path / "cache"))
    compiles = []
    original = jax.stages.Lowered.compile

    def counted(self, *args, **kwargs):
        compiles.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    return compiles


TINY = [{"x": ((2, 64), "float32")}]


@needs_xla
def test_a_rerun_reads_the_verdict_instead_of_compiling(empty_cache, tmp_path):
    first = compile_for_tpu(Dense(64), TINY).shapes[0]
    assert empty_cache == [1] and first.status == "compiled" and not first.cached
    assert cache.cache_dir() == tmp_path / "cache" / "xla-verdicts"      # PORTKIT_CACHE_DIR moves it
    assert len(list(cache.cache_dir().glob("*.json"))) == 1
    report = compile_for_tpu(Dense(64), TINY)
    second = report.shapes[0]
    assert empty_cache == [1], "the second call compiled again"
    assert second.cached and second.status == "compiled" and second.fits_hbm is True
    for field in ("memory", "flops", "bytes_accessed", "platform", "compile_seconds", "measured_at"):
        assert getattr(second, field) == getattr(first, field), field      # the seconds measured the first time
    assert f"(verdict cache; compile measured {first.measured_at})" in str(report)   # the notebook's view
    assert "verdict cache " in str(report) and "1 of 1 shapes served from it" in str(report)
    assert report.to_dict()["cached_shapes"] == 1 and report.to_dict()["shapes"][0]["cached"] is True
    # what findings and summaries quote reads the same cold and warm: the provenance is in its own keys
    described = second.describe(report.hbm_bytes_per_device)
    assert "cache" not in described and f"compiled in {first.compile_seconds:.1f} s" in described


@needs_xla
def test_another_topology_or_dtype_is_another_verdict(empty_cache):
    compile_for_tpu(Dense(64), TINY)
    other_topology = compile_for_tpu(Dense(64), TINY, topology="v6e:1x1").shapes[0]
    other_dtype = compile_for_tpu(Dense(64), TINY, dtype="bfloat16").shapes[0]
    assert empty_cache == [1, 1, 1] and not other_topology.cached and not other_dtype.cached
    assert len(list(cache.cache_dir().glob("*.json"))) == 3


@needs_xla
@pytest.mark.parametrize("damage", ["not json {", '{"format": 1, "key": "another key", "verdict": {}}',
                                    "[1, 2]", '{"format": 1, "key": "KEY", "verdict": {"status": "compiled"}}'])
def test_a_damaged_entry_is_compiled_again_and_rewritten(empty_cache, damage):
    first = compile_for_tpu(Dense(64), TINY).shapes[0]
    (entry,) = cache.cache_dir().glob("*.json")
    entry.write_text(damage.replace("KEY", entry.stem))
    again = compile_for_tpu(Dense(64), TINY).shapes[0]
    assert empty_cache == [1, 1] and not again.cached and again.memory == first.memory
    assert json.loads(entry.read_text())["verdict"]["status"] == "compiled"
    assert compile_for_tpu(Dense(64), TINY).shapes[0].cached and empty_cache == [1, 1]


@needs_xla
def test_an_internal_compiler_error_is_reported_but_not_cached(empty_cache, monkeypatch):
    import jax

    def internal(self, *args, **kwargs):
        empty_cache.append(1)
        raise RuntimeError("INTERNAL: the compiler crashed")

    monkeypatch.setattr(jax.stages.Lowered, "compile", internal)
    for _ in range(2):
        result = compile_for_tpu(Dense(64), TINY).shapes[0]
        assert result.status == "compile_failed" and not result.cached and "INTERNAL" in result.message
    assert empty_cache == [1, 1] and not list(cache.cache_dir().glob("*.json"))


@needs_xla
def test_a_rerun_neither_converts_nor_lowers(empty_cache, monkeypatch):
    """The program key names the verdict (TPU) or the lowering figures (Neuron) before any conversion."""
    first = compile_for_tpu(Dense(64), TINY).shapes[0]
    lowered = check_lowering(Dense(64), TINY).shapes[0]
    assert not lowered.cached and lowered.stablehlo_ops > 0 and lowered.measured_at
    conversions = []
    original = compiler.Program._convert
    monkeypatch.setattr(compiler.Program, "_convert",
                        lambda self: (self._converted is None and conversions.append(1)) or original(self))
    report = compile_for_tpu(Dense(64), TINY)
    again = report.shapes[0]
    assert again.cached and conversions == [] and empty_cache == [1]
    for field in ("memory", "compile_seconds", "measured_at", "lower_seconds", "input_sharding"):
        assert getattr(again, field) == getattr(first, field), field
    assert (report.devices, report.device_kind) == (1, "TPU v5 lite")
    neuron = check_lowering(Dense(64), TINY)
    assert neuron.shapes[0].cached and conversions == []
    for field in ("stablehlo_ops", "custom_calls", "lower_seconds", "measured_at"):
        assert getattr(neuron.shapes[0], field) == getattr(lowered, field), field
    assert f"(lowering cache; measured {lowered.measured_at})" in str(neuron)
    assert "1 of 1 shapes read from it" in str(neuron)
    # Another model (other weight shapes), or a class with no source file, is converted and lowered again.
    assert not compile_for_tpu(Dense(32), [{"x": ((2, 32), "float32")}]).shapes[0].cached
    configured = Dense(64)
    configured.fc.config = {"hidden_act": "gelu"}      # a submodule's config is part of the key
    assert cache.module_fingerprint(configured) != cache.module_fingerprint(Dense(64))
    Unsourced = type("Unsourced", (Dense,), {"__module__": "not_a_module"})
    assert cache.module_fingerprint(Unsourced(64)) is None
    assert compile_for_tpu(Unsourced(64), TINY).shapes[0].cached      # its lowered module is Dense(64)'s
    assert len(conversions) == 2 and empty_cache == [1, 1]


def test_only_repeatable_verdicts_are_cached():
    verdict = functools.partial(cache.Verdict, compile_seconds=1.0, measured_at="2025-01-01T00:00:00Z")
    assert verdict("compiled").repeatable and verdict("out_of_hbm", message="RESOURCE_EXHAUSTED: ...").repeatable
    assert verdict("compile_failed", message="INVALID_ARGUMENT: bad sharding").repeatable
    assert not verdict("compile_failed", message="INTERNAL: crashed").repeatable
    assert not verdict("compile_failed", message="Segmentation fault").repeatable


@needs_xla
def test_compile_seconds_prices_a_shape_once(empty_cache, bert):
    seconds, source = compile_seconds(bert, {"batch": 1, "seq": 16})
    assert seconds > 0 and source == "XLA compile for v5e:1x1, measured on this host (compile-only)"
    again, cached_source = compile_seconds(bert, {"batch": 1, "seq": 16})
    assert again == seconds and cached_source == source     # the same words cold and warm (no cache state, no time)
    assert empty_cache == [1]
    none, why = compile_seconds(NoLowering(), {"x": ((4, 16), "float32")})
    assert none is None and "NO LOWERING for aten::special_airy_ai" in why and empty_cache == [1]


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(corpus.CACHE_VARIABLE, str(tmp_path))
    assert cache.cache_dir() == tmp_path / "xla-verdicts"
    monkeypatch.delenv(corpus.CACHE_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "portkit" / "xla-verdicts"


# A plain JAX program that loads libtpu for a compile-only topology and keeps it loaded, as a second
# `portkit run`, a notebook kernel or any JAX program does. "busy": another process already holds
# libtpu's lockfile (this test process, after the compiles above), which is the same situation.
_HOLD_LIBTPU = """
import sys, time
from jax.experimental import topologies
try:
    topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1")
except Exception as exc:
    print("busy" if "lockfile" in str(exc) else f"failed: {exc}", flush=True)
    sys.exit(0)
print("holding", flush=True)
time.sleep(300)
"""
_COMPILE_TINY = """
import os, torch
from portkit.stages.xla.stage import compile_for_tpu
report = compile_for_tpu(torch.nn.Linear(8, 8), [{"input": ((2, 8), "float32")}], topology="v5e:1x1")
print(report.shapes[0].status, report.shapes[0].platform, os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD"))
"""


@needs_xla
def test_compiles_while_another_process_holds_libtpu():
    if availability.tpu_chip_count() != 0:
        pytest.skip("TPU chips on this host (or JAX cannot scan for them): there the lockfile guards a device")
    # Neither process is told about the lockfile: portkit.stages.xla.stage must allow the second load itself.
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_ONLY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LIBTPU], env={**env, "TPU_WORKER_HOSTNAMES": "localhost"},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        state = holder.stdout.readline().strip()
        assert state in ("holding", "busy"), state
        done = subprocess.run([sys.executable, "-c", _COMPILE_TINY], env=env, capture_output=True, text=True,
                              check=False, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert "lockfile" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["compiled", "tpu", "1"]


def test_compile_only_environment_is_set_only_without_tpu_chips(monkeypatch):
    for name in COMPILE_ONLY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(availability, "tpu_chip_count", lambda: 4)        # a TPU host: the lock guards real chips
    assert compiler._compile_only_environment() == {}
    assert not set(COMPILE_ONLY_ENV) & set(os.environ)
    monkeypatch.setattr(availability, "tpu_chip_count", lambda: None)     # cannot tell: leave libtpu's defaults
    assert compiler._compile_only_environment() == {}
    monkeypatch.setattr(availability, "tpu_chip_count", lambda: 0)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2")           # the user's own setting wins
    assert compiler._compile_only_environment() == {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    assert os.environ["TPU_WORKER_HOSTNAMES"] == "10.0.0.2" and os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"


# ---------------------------------------------------------------- validation and skips (run everywhere)
def test_bad_topology_is_one_line_naming_the_choices(bert):
    with pytest.raises(BadParameter) as info:
        compile_for_tpu(bert, shapes=[{"batch": 1, "seq": 8}], topology="v5e:3x3")
    message = str(info.value)
    assert "\n" not in message
    assert message == ("unknown TPU topology 'v5e:3x3'; choose one of: v5e:1x1, v5e:2x2, v5e:2x4, v6e:1x1, "
                       "v6e:2x2, v6e:2x4, v5p:2x2x1, v5p:2x2x2, v4:2x2x1, tpu7x:2x2x1")
    with pytest.raises(BadParameter, match="v5e:3x3"):
        xla_section(bert, "tpu", [{"batch": 1, "seq": 8}], Options.of({"topology": "v5e:3x3"}))


@pytest.mark.parametrize("shape, words", [
    ({"batch": 1, "seq": 4096}, "at most 512 tokens"),
    ({"batch": 0, "seq": 8}, "positive"),
    ({"pixels": ((1, 8), "int64")}, "choose one of: input_ids, attention_mask, token_type_ids"),
    ({"input_ids": (8, "int64")}, "give (shape, dtype)"),
    ({}, "input shape"),
])
def test_bad_shapes_are_rejected_before_any_work(bert, shape, words):
    with pytest.raises(BadParameter, match=words.replace("(", r"\(").replace(")", r"\)")):
        compile_for_tpu(bert, shapes=[shape])


def test_bad_dtype_and_bare_module_shapes():
    with pytest.raises(BadParameter, match="choose one of: float32, bfloat16"):
        compile_for_tpu(Dense(8), shapes=[{"x": ((1, 8), "float32")}], dtype="float16")
    with pytest.raises(BadParameter, match="bare nn.Module"):
        compile_for_tpu(Dense(8), shapes=[{"batch": 1, "seq": 8}])


def test_skipped_with_one_install_line_when_packages_are_missing(bert, monkeypatch):
    monkeypatch.setattr(availability, "missing_for_xla_tpu_compile", lambda: ["libtpu", "torchax"])
    skipped = xla_section(bert, "tpu", [{"batch": 1, "seq": 8}])
    assert isinstance(skipped, XlaSkipped)
    assert str(skipped) == ("XLA check skipped: libtpu, torchax not installed; pip install 'portkit[xla]' "
                            "(or: pip install jax jaxlib libtpu torchax==0.0.13)")
    assert skipped.to_dict()["skipped"] is True and "pip install" in skipped._repr_html_()
    with pytest.raises(MissingPackage, match="pip install 'portkit\\[xla\\]'"):
        compile_for_tpu(bert, shapes=[{"batch": 1, "seq": 8}])


def test_reference_targets_have_no_xla_check(bert):
    skipped = xla_section(bert, "cpu", [{"batch": 1, "seq": 8}])
    assert isinstance(skipped, XlaSkipped) and "reference platform" in str(skipped)
    with pytest.raises(BadParameter, match="choose one of: neuron, tpu, cpu, cuda"):
        xla_section(bert, "trn", [{"batch": 1, "seq": 8}])


def test_stage_shapes_come_from_the_earlier_stages(bert, tmp_path):
    assert stage_shapes(tmp_path, "tpu", bert, Options.of({"batch_size": 2, "seq_len": 48}))[0] == [
        {"batch": 2, "seq": 48}]
    (tmp_path / "compile.json").write_text(json.dumps({"targets": {"tpu": {"fixed_shape": {"batch": 1, "seq": 64}}}}))
    (tmp_path / "buckets.json").write_text(json.dumps({"targets": {"tpu": {"chosen": {
        "planner": "auto", "shapes": [{"batch": 1, "seq": 32}, {"batch": 1, "seq": 64}, {"batch": 1, "seq": 256}]}}}}))
    shapes, sources = stage_shapes(tmp_path, "tpu", bert,
                                       Options.of({"batch_size": 2, "seq_len": 48, "max_shapes": 3}))
    assert shapes == [{"batch": 1, "seq": 32}, {"batch": 1, "seq": 64}, {"batch": 1, "seq": 256}]
    assert sources[1] == "stage 2's fixed shape" and "auto bucket" in sources[2]
    assert stage_shapes(tmp_path, "tpu", bert, Options.of(
        {"batch_size": 2, "seq_len": 48, "max_shapes": 1}))[0] == [{"batch": 1, "seq": 256}]
    with pytest.raises(BadParameter, match="invalid max_shapes 0: must be a positive whole number"):
        Options.of({"max_shapes": 0})


@pytest.mark.parametrize("file, text, words", [
    ("compile.json", "{not json", "compile.json cannot be read (JSONDecodeError"),
    ("compile.json", "[]", "compile.json holds a list, not a stage result"),
    ("compile.json", json.dumps({"targets": {"tpu": {"fixed_shape": {"batch": 0, "seq": 64}}}}),
     "targets.tpu.fixed_shape has {'batch': 0, 'seq': 64}"),
    ("buckets.json", json.dumps({"targets": {"tpu": {"chosen": {"shapes": [{"batch": 1, "seq": "64"}]}}}}),
     "targets.tpu.chosen.shapes has {'batch': 1, 'seq': '64'}"),
])
def test_a_damaged_earlier_result_is_named_not_ignored(bert, tmp_path, file, text, words):
    (tmp_path / file).write_text(text)
    with pytest.raises(results.UnreadableResult) as info:
        stage_shapes(tmp_path, "tpu", bert)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_readers_name_each_stage_result_as_the_runner_does(tmp_path):
    assert all(stage.result == f"{stage.name}.json" for stage in runner.STAGES)     # read_stage relies on it
    assert results.read_stage(tmp_path, "compile") is None and results.fixed_shape(tmp_path, "tpu") is None
    (tmp_path / "compile.json").write_text(json.dumps({"targets": {"tpu": {"fixed_shape": {"batch": 2, "seq": None}}}}))
    assert results.fixed_shape(tmp_path, "tpu") == {"batch": 2, "seq": None}        # an image model's
    assert results.fixed_shape(tmp_path, "neuron") is None and results.bucket_shapes(tmp_path, "tpu") is None


@needs_xla
def test_stage_turns_failures_into_findings(bert, tmp_path):
    stage = run_stage(bert, ["tpu", "cpu"], Options.of({"batch_size": 4096, "seq_len": 512}), run_dir=tmp_path)
    saved = stage.to_dict()
    tpu = saved["targets"]["tpu"]
    assert tpu["target"]["name"] == "tpu" and tpu["target"]["mode"] == specs.detect("tpu").mode
    assert [f["kind"] for f in tpu["findings"]] == ["hbm"] and tpu["findings"][0]["severity"] == "blocker"
    assert "skipped" in saved["targets"]["cpu"]["summary"]
    assert saved["stage"] == "xla" and "real XLA compile" in saved["summary"]


@needs_xla
def test_largest_batch_per_shape_is_searched_on_request_and_reported(bert, tmp_path, monkeypatch):
    from portkit.stages.report.stage import build_report
    from portkit.tpu_compile import sharded
    monkeypatch.setattr(sharded, "BATCH_LIMIT", 4)      # batch 4 x 32: the shape the first test compiled
    stage = run_stage(bert, ["tpu"],
                          Options.of({"batch_size": 1, "seq_len": 32, "largest_batch": True}), run_dir=tmp_path)
    (found,) = stage.largest["tpu"]
    # the memory model puts bert's boundary far past the search's limit: one compile, at the limit, fits
    assert found["guess"] > 4 and found["tried"] == {"4": True} and found["batch"] == 4
    assert "largest batch that fits, seq=32: 4+" in stage.summary()
    stage.save(tmp_path / "xla.json")
    scale = build_report(["tpu"], run_dir=tmp_path).to_dict()["targets"]["tpu"]["metrics"]["scale"]
    assert scale == {"largest batch that fits HBM, seq 32": "4+ (the search's limit) on v5e:1x1 (1 compiles)"}
    assert "largest_batch" not in run_stage(bert, ["tpu"], Options.of(
        {"batch_size": 1, "seq_len": 32}), run_dir=tmp_path).to_dict()["targets"]["tpu"]   # off by default: no compile


@needs_xla
def test_the_cost_model_and_the_shape_texts_read_the_same_cold_and_warm(empty_cache, bert):
    """Same input, same output: the XLA compile-time cost model (compile_cost.source, its details) and each shape's
    description (quoted by findings and summaries) carry no cache state and no timestamp; a warm run reads the
    cached verdicts (nothing compiles) and writes the same texts. The provenance stays in the shapes' own keys."""
    from portkit.planning import economics
    cold = economics.xla_model(bert, [8, 16])
    compiled = len(empty_cache)
    warm = economics.xla_model(bert, [8, 16])
    assert len(empty_cache) == compiled, "the warm run compiled again"
    assert warm.source == cold.source and warm.details == cold.details and warm.label() == cold.label()
    assert "cache" not in cold.source and "measured now" not in str(cold.details)
    first = compile_for_tpu(bert, [{"batch": 1, "seq": 8}])
    again = compile_for_tpu(bert, [{"batch": 1, "seq": 8}])
    assert again.shapes[0].cached and again.to_dict()["shapes"][0]["measured_at"] == first.shapes[0].measured_at
    assert "cache" not in again.shapes[0].describe(again.hbm_bytes_per_device)


def test_one_compiler_rejection_or_hbm_miss_is_one_finding_with_its_shapes():
    """Rule (one cause, one finding): the XLA compiler rejecting several shapes for one reason, or several shapes not
    fitting one topology's HBM, is one finding each, the shapes its occurrences, not one finding per shape."""
    from portkit.stages.xla.stage import _findings
    from portkit.tpu_compile.results import ShapeResult, XlaCompileReport

    def shape(seq, status, message=None, fits=None):
        return ShapeResult(f"1x{seq}", {"input_ids": [[1, seq], "int32"]}, status, 0.1, message=message,
                           fits_hbm=fits)
    rejected = [shape(s, "compile_failed", f"INVALID_ARGUMENT: dimension {s} is not divisible by 7") for s in (8, 16)]
    report = XlaCompileReport("m", "tpu", "compile", "bfloat16", 10, 20, topology="v5e:1x1", hbm_bytes_per_device=1,
                              shapes=[*rejected, shape(32, "out_of_hbm", "RESOURCE_EXHAUSTED", False),
                                      shape(64, "out_of_hbm", "RESOURCE_EXHAUSTED", False)])
    found = {f["kind"]: f for f in _findings(report)}
    assert len(_findings(report)) == 2
    assert found["xla_compile"]["occurrences"]["shapes"] == ["1x8", "1x16"]
    assert found["hbm"]["occurrences"]["count"] == 2 and found["hbm"]["severity"] == "blocker"
