"""Stage 4's GPU baseline measured on a real GPU (portkit/targets/gpu_baseline.py): the flags and autocast each
GPU setting sets, and puts back; the native path, run on the CPU as a stand-in device; the real GPU where present."""
import copy
import functools
import subprocess
import sys
import types

import pytest
import torch

from conftest import ROOT
from portkit.core import availability
from portkit.core.errors import BadParameter
from portkit.stages.accuracy import stage
from portkit.stages.accuracy import reference
from portkit.stages.accuracy import target_runs
from portkit.targets import gpu_baseline, numerics
from portkit.targets import specs
from tests.fixtures.sections import read_section

NEW_API = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul")   # torch.backends.<...>.fp32_precision
SKIP_LINE = "bench_gpu_baseline: skipped: no CUDA device (torch.cuda.is_available() is False)"


def _backend(key):
    found = torch.backends
    for part in key.split("."):
        found = getattr(found, part, None)
    return found


def _legacy(getter):
    try:
        return getter()
    except RuntimeError:    # torch 2.9+: the legacy getters refuse once the newer API set what they cannot express
        return "unreadable"


def _state() -> dict:
    """Every global TF32 flag, read through PyTorch's public API."""
    return {"float32_matmul_precision": _legacy(torch.get_float32_matmul_precision),
            "cuda.matmul.allow_tf32": _legacy(lambda: torch.backends.cuda.matmul.allow_tf32),
            "cudnn.allow_tf32": _legacy(lambda: torch.backends.cudnn.allow_tf32),
            **{f"{key}.fp32_precision": _backend(key).fp32_precision for key in NEW_API
               if hasattr(_backend(key), "fp32_precision")},
            "autocast cpu": torch.is_autocast_enabled("cpu")}


@pytest.fixture(autouse=True)
def flags_put_back():
    """Each test leaves the process's flags as it found them, whatever the code under test does."""
    before = _state()
    yield
    torch.set_float32_matmul_precision(before["float32_matmul_precision"])
    torch.backends.cudnn.allow_tf32 = before["cudnn.allow_tf32"]
    for key in NEW_API:
        if f"{key}.fp32_precision" in before:
            _backend(key).fp32_precision = before[f"{key}.fp32_precision"]
    assert _state() == before


class _Named(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8, dtype=dtype)

    def forward(self, x):
        return {"y": self.linear(x)}


# ---------------------------------------------------------------- the settings
def test_every_gpu_numerics_key_has_a_setting_that_matches_its_emulation():
    """A new GPU_NUMERICS key without a native setting fails here; so does a setting that runs something else
    than the emulation of the same name (TF32 operands, autocast's low dtype)."""
    assert set(gpu_baseline.SETTINGS) == set(numerics.GPU_NUMERICS)
    for name, precision in numerics.GPU_NUMERICS.items():
        setting = gpu_baseline.lookup(name)
        assert setting.tf32 == (precision.matmul_inputs == numerics.TF32), name
        low = precision.matmul_inputs if isinstance(precision.matmul_inputs, torch.dtype) else None
        assert setting.autocast == low, name


def test_an_unknown_setting_names_the_valid_ones():
    with pytest.raises(BadParameter, match="unknown gpu_numerics 'int8'; choose one of: fp32, tf32, bf16_autocast, "
                                           "fp16_autocast"):
        with gpu_baseline.setting("int8", "cpu"):
            pass


@pytest.mark.parametrize("start", ["default", "medium, cudnn off"])
@pytest.mark.parametrize("name", list(numerics.GPU_NUMERICS))
def test_a_setting_sets_its_flags_for_the_block_and_puts_every_one_back(name, start):
    if start != "default":      # a process that set the legacy flags itself
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.allow_tf32 = False
    before = _state()
    with gpu_baseline.setting(name, "cpu") as chosen:
        tf32 = name == "tf32"
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        assert torch.is_autocast_enabled("cpu") == (chosen.autocast is not None)
        if chosen.autocast is not None:
            assert torch.get_autocast_dtype("cpu") == chosen.autocast
    assert _state() == before


def test_the_flags_are_put_back_after_an_error():
    before = _state()
    with pytest.raises(RuntimeError, match="inside"), gpu_baseline.setting("tf32", "cpu"):
        assert torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("inside")
    assert _state() == before


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch before 2.9 has no fp32_precision API")
def test_a_process_on_the_newer_fp32_precision_api_gets_its_settings_back():
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    before = {k: v for k, v in _state().items() if k.endswith("fp32_precision")}
    with gpu_baseline.setting("fp32", "cpu"):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert {k: v for k, v in _state().items() if k.endswith("fp32_precision")} == before


# ---------------------------------------------------------------- stage 4's baseline
def _baseline(name: str, module=None):
    torch.manual_seed(0)
    module = module or _Named()
    x = torch.randn(4, 16, dtype=module.linear.weight.dtype)
    plain = target_runs.forward(module, {"x": x})
    opts = stage.Options.of({"gpu_numerics": name})
    return reference.measure_baseline(module, {"x": x}, plain, None, "y", None, opts), plain, module


def test_without_a_gpu_the_baseline_is_emulated_and_says_so(monkeypatch):
    monkeypatch.setattr(availability, "cuda_available", lambda: False)
    monkeypatch.setenv(specs.MODE_VARIABLE, "auto")
    found, plain, _ = _baseline("tf32")
    assert found["mode"] == "emulated" and found["measured"] == "emulated on the CPU (no GPU present)"
    assert not torch.equal(found["outputs"]["y"], plain["y"])     # TF32 operands, emulated


def test_a_gpu_host_asked_for_emulation_emulates_and_says_why(monkeypatch):
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setenv(specs.MODE_VARIABLE, "emulated")
    found, _, _ = _baseline("fp32")
    assert found["mode"] == "emulated" and found["measured"] == "emulated on the CPU (PORTKIT_MODE=emulated)"


@pytest.mark.parametrize("name", list(numerics.GPU_NUMERICS))
def test_the_native_path_runs_end_to_end_on_a_stand_in_device(monkeypatch, name):
    """A GPU reported present and the device replaced by the CPU: the native path (a float32 copy, the setting's
    flags and autocast, outputs back in float64) runs whole, and the user's module is not touched."""
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setenv(specs.MODE_VARIABLE, "auto")
    monkeypatch.setattr(gpu_baseline, "measure", functools.partial(gpu_baseline.measure, device="cpu"))
    before = _state()
    found, plain, module = _baseline(name, _Named(torch.float64))
    assert found["mode"] == "native" and found["measured"] == f"measured on cpu, torch {torch.__version__}"
    assert _state() == before
    got = found["outputs"]["y"]
    assert got.dtype == torch.float64 and got.device.type == "cpu"
    assert module.linear.weight.dtype == torch.float64          # the copy ran in float32, not the module
    assert 0 < (got - plain["y"]).abs().max() < 0.1              # float32 (or lower) against the float64 model
    if name.endswith("autocast"):                                # the low dtype's rounding is in the result
        low = gpu_baseline.lookup(name).autocast
        assert torch.equal(got, got.to(low).double())


def test_the_report_says_where_the_baseline_came_from():
    def sentence(baseline):
        out = types.SimpleNamespace(name="tpu", mode="emulated", metrics={}, details={}, precision=None)
        read_section("accuracy", out, target={"baseline": {"gpu_numerics": "tf32", "truth": "the float64 reference",
                                                           "ratio": 1.5, "factor": 2.0, "within": True,
                                                           "gpu_error": 1e-3, **baseline}})
        return out.metrics["accuracy"]["error vs today's GPU"]
    assert "GPU 'tf32' (measured on NVIDIA H200, torch 2.13.0) against" in sentence(
        {"measured": "measured on NVIDIA H200, torch 2.13.0", "mode": "native"})
    assert "GPU 'tf32' (emulated on the CPU) against" in sentence({})            # results written before the field


# ---------------------------------------------------------------- a real GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("name", list(numerics.GPU_NUMERICS))
def test_the_real_gpu_path(name):
    torch.manual_seed(0)
    module, x = _Named(), torch.randn(64, 16)
    truth = target_runs.forward(copy.deepcopy(module).double(), {"x": x.double()})
    before = _state()
    out, measured = gpu_baseline.measure(module, {"x": x}, name)
    assert _state() == before
    assert measured == f"measured on {torch.cuda.get_device_name()}, torch {torch.__version__}"
    assert out["y"].device.type == "cpu" and out["y"].dtype == torch.float64
    assert next(module.parameters()).device.type == "cpu"
    error = ((out["y"] - truth["y"]).norm() / truth["y"].norm()).item()
    assert error < {"fp32": 1e-5, "tf32": 1e-2, "bf16_autocast": 5e-2, "fp16_autocast": 1e-2}[name]


# ---------------------------------------------------------------- the benchmark
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would measure, not skip")
def test_the_benchmark_skips_in_one_line_without_a_gpu():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_baseline.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SKIP_LINE
