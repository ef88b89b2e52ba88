"""Stage 1's static scan (portkit/stages/fallbacks/source_scan.py): GPU-only code, the vendors' lists, versions."""
import warnings

import pytest
import torch
from torch import nn

from conftest import ROOT
from portkit.core import owners
from portkit.stages import reconcile
from portkit.core.findings import BLOCKER, INFO, NOT_CHECKED, WORK
from portkit.models import registry
from portkit.runfolder import environment
from portkit.stages.fallbacks import source_scan
from portkit.stages.fallbacks import stage

GPU_ONLY = ROOT / "tests" / "fixtures" / "gpu_only"


def found(path, target="neuron"):
    return source_scan.findings(source_scan.scan_paths([GPU_ONLY / path]), target)


def test_scan_a_triton_kernel_in_forward_through_the_module_it_imports():
    # triton_model.py's forward calls kernels.fused_add: the scan follows the relative import into kernels.py
    for target, language in (("neuron", "NKI"), ("tpu", "Pallas")):
        [kernel] = [f for f in found("triton_model.py", target) if f.kind == "gpu_kernel"]
        assert kernel.severity == BLOCKER and language in kernel.advice
        assert kernel.where["file"].endswith("kernels.py") and kernel.where["line"] == 9
        assert "fused_add_kernel (@triton.autotune, @triton.jit), launched at line 19 in fused_add" in kernel.message
        assert kernel.owner["owner"] == owners.USER


def test_scan_a_cuda_factory_names_each_line_and_its_replacement():
    by = {(f.message.split(":")[0], f.where["line"]): f for f in found("cuda_factory.py")}
    assert by[(".cuda() call", 17)].severity == BLOCKER
    assert "torch.accelerator" in by[(".cuda() call", 17)].advice
    assert by[("hard-coded CUDA device", 6)].message.endswith("(and lines 20)")   # DEVICE = "cuda"; device="cuda"
    assert by[("NCCL-only collectives (backend='nccl')", 10)].severity == BLOCKER
    assert by[("torch.cuda call (CUDA-only)", 11)].severity == WORK
    assert by[("CUDA availability query (off NVIDIA it says no device", 18)].severity == WORK
    assert by[("torch.backends.cudnn setting (no effect off NVIDIA)", 15)].severity == INFO


def test_scan_a_guarded_flash_attn_import_is_optional():
    [flash] = [f for f in found("flash_optional.py") if f.kind == "gpu_package"]
    assert flash.severity == INFO and flash.message.startswith("optional GPU-only package")
    assert "from flash_attn import flash_attn_func" in flash.message and "scaled_dot_product_attention" in flash.advice


def test_scan_torch_cuda_amp_autocast_block():
    [amp] = found("amp_block.py")
    assert amp.kind == "gpu_device" and amp.severity == WORK and amp.where["function"] == "forward"
    assert "torch.amp.autocast(device_type" in amp.advice and "float32" in amp.message


def test_scan_a_cuda_extension_its_source_and_its_torch_ops():
    rules = {f.message.split(":")[0]: f for f in found("extension_model.py", "tpu")}
    assert set(rules) == {"CUDA extension compiled at run time", "op registered by a CUDA extension",
                          "CUDA source file"}
    assert "torch.ops.gpu_fused.gelu()" in rules["op registered by a CUDA extension"].message
    assert rules["op registered by a CUDA extension"].where["function"] == "forward"
    assert all(f.severity == BLOCKER and "Pallas" in f.advice for f in rules.values())


def test_scan_ordinary_code_finds_nothing():
    scan = source_scan.scan_paths([ROOT / "portkit" / "planning" / "planner.py"], follow=False)
    assert scan.gpu == [] and scan.features == [] and not scan.errors


def test_a_model_that_cannot_run_here_still_names_its_gpu_code():
    scan = source_scan.scan_paths([GPU_ONLY / "triton_model.py"])

    def forward():
        raise ModuleNotFoundError("No module named 'triton'")
    with pytest.raises(ModuleNotFoundError) as caught:
        source_scan.noted(scan, forward)
    assert any("Triton kernel: fused_add_kernel" in note for note in caught.value.__notes__)


class Float8Linear(nn.Linear):
    """A stand-in for torchao's FP8 training layer (torchao.float8.float8_linear.Float8Linear)."""


Float8Linear.__module__ = "torchao.float8.float8_linear"


class MambaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)


def test_vendor_lists_apply_by_what_the_instantiated_model_contains():
    model = nn.Sequential(MambaBlock(), Float8Linear(8, 8), nn.LSTM(8, 8))
    scale = torch.ones(4)
    with warnings.catch_warnings():   # quantized tensors are deprecated, and still what per-channel weights are
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(torch.randn(4, 3), scale, torch.zeros(4).long(), 0,
                                      torch.qint8)
    model[0].register_buffer("q", q)
    scan = source_scan.scan_model(model)
    tpu = {f.message.split(" in ")[0]: f for f in source_scan.findings(scan, "tpu")}
    neuron = {f.message.split(" in ")[0]: f for f in source_scan.findings(scan, "neuron")}
    assert set(tpu) == {"Mamba-family models", "LSTM"} and tpu["Mamba-family models"].module == "0"
    assert "TorchTPU lists Mamba-family models as experimental (with low performance) (TorchTPU docs, read " \
           "2026-12-04)" in tpu["Mamba-family models"].message and tpu["LSTM"].severity == WORK
    assert set(neuron) == {"FP8 quantization through TorchAO", "per-channel quantization"}
    assert neuron["FP8 quantization through TorchAO"].severity == WORK          # private beta
    assert "private beta" in neuron["FP8 quantization through TorchAO"].message
    assert neuron["per-channel quantization"].severity == BLOCKER               # unsupported in the first release
    assert "torch.per_channel_affine" in neuron["per-channel quantization"].message
    assert all(f.source.startswith("the vendors' launch documentation") for f in neuron.values())


def test_stage_one_reports_the_scan_beside_the_recorded_findings():
    m = registry.load(f"{GPU_ONLY / 'flash_optional.py'}:build")
    report = stage.find_fallbacks(m, m.encode(["def f(x): return x", "Sum."], pad_to=8), ["neuron", "tpu"])
    tpu = {(f.kind, f.severity) for f in report.targets["tpu"].findings}
    assert {("vendor_list", WORK), ("gpu_package", INFO)} <= tpu
    assert not any(f.kind == "vendor_list" for f in report.targets["neuron"].findings)
    assert "Mamba-family models in model.mixer: MambaBlock" in str(report)
    # found in the source, not in the recording: torch.compile leaves it as it is
    view = {"graphs": 1, "breaks": [], "ops": {}, "fullgraph": {}}
    mamba = next(f for f in report.targets["tpu"].findings if f.kind == "vendor_list")
    assert reconcile.status_of(mamba.to_dict(), view)[0] == NOT_CHECKED


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lstm, self.head = nn.Embedding(50, 8), nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        hidden, _ = self.lstm(self.emb(input_ids))
        return {"logits": self.head(hidden)}


def test_an_lstm_is_one_cause_on_tpu_with_the_vendor_lists_word_in_it():
    """The recording finds the nn.LSTM (its fused cell on the device) and TorchTPU's list calls LSTM experimental:
    one module, one cause, one finding that says both; a count by cause counts it once."""
    m = registry.LoadedModel("tagger", registry.TOKEN_CLASSIFIER, Tagger().eval(), "test", tokenizer=None)
    ids = {"input_ids": torch.tensor([[1, 3, 9, 20]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    tpu = stage.find_fallbacks(m, ids, ["tpu"]).targets["tpu"].findings
    about = [f for f in tpu if f.module == "lstm"]
    assert len(about) == 1 and about[0].kind == "recurrent"
    assert "TorchTPU lists LSTM as experimental" in about[0].message and about[0].severity == WORK
    assert not any(f.kind == "vendor_list" for f in tpu)


NOTES = "TorchNeuron release notes, Neuron 2.33.0 (10/19/2026), support matrix, read 2026-12-05"
BOTH = "torch 2.13.0 (torch-neuronx 2.13.3.0.*) or 2.14.0 (torch-neuronx 2.14.3.0.*)"


@pytest.mark.parametrize("here,ok,line", [
    ({"torch": "2.13.0+cpu", "python": "3.11.7", "transformers": "5.24.0"}, [True, False, None, False],
     f"torch 2.13.0+cpu here; TorchNeuron needs {BOTH} ({NOTES})"),
    ({"torch": "2.14.0", "python": "3.14.1", "transformers": None}, [True, True, None, True],
     f"torch 2.14.0 here; TorchNeuron needs {BOTH} ({NOTES})"),
    ({"torch": "2.13.0", "python": "3.12.3", "transformers": None}, [True, True, None, True],
     f"torch 2.13.0 here; TorchNeuron needs {BOTH} ({NOTES})"),
    ({"torch": "2.15.0", "python": "3.12.0", "transformers": None}, [False, True, None, False],
     f"torch 2.15.0 here; TorchNeuron needs {BOTH} ({NOTES}): downgrade torch (and what depends on it: "
     "torchvision/torchaudio pins), re-run the workbook after"),
    ({"torch": "2.12.1", "python": "3.12.0", "transformers": None}, [False, True, None, False],
     f"torch 2.12.1 here; TorchNeuron needs {BOTH} ({NOTES}): upgrade torch (and what depends on it: "
     "torchvision/torchaudio pins), re-run the workbook after"),
])
def test_versions_against_every_torchneuron_row(here, ok, line):
    """The environment is checked against every row of TorchNeuron's support matrix (torch 2.13.0 and 2.14.0,
    Python 3.12 to 3.14): torch 2.13 is supported, and the matrix line says whether one row accepts it all."""
    checks = environment.compare_versions("neuron", here)
    assert [c["ok"] for c in checks] == ok and checks[0]["line"] == line
    if ok[1] is False:
        assert "a new environment with Python 3.12 to 3.14" in checks[1]["line"]
    matrix = checks[-1]
    assert matrix["package"] == "support matrix"
    assert matrix["row"] == (f"torch-neuronx {here['torch'][:5]}3.0.*" if matrix["ok"] else None)
    if here["torch"].startswith("2.13") and not matrix["ok"]:      # torch 2.13, Python 3.11: what the row lacks
        assert "the nearest, torch-neuronx 2.13.3.0.*, needs Python 3.12 to 3.14 (here 3.11.7)" in matrix["line"]


def test_torchtpu_versions_come_from_its_wheel_metadata():
    """torch-tpu 0.2.0's METADATA states Requires-Python >=3.11, torch>=2.11.0,<=2.15.0, libtpu>=0.0.50: each
    is checked, and transformers, which it does not name, is said to be unstated."""
    checks = {c["package"]: c for c in environment.compare_versions(
        "tpu", {"torch": "2.13.0", "python": "3.11.7", "transformers": "5.0", "libtpu": "0.0.52"})}
    assert {p: c["ok"] for p, c in checks.items()} == {"torch": True, "python": True, "transformers": None,
                                                       "libtpu": True, "support matrix": True}
    assert "torch 2.11.0 to 2.15.0" in checks["torch"]["line"] and "torch-tpu 0.2.0 wheel METADATA" in checks[
        "torch"]["line"]
    late = {c["package"]: c for c in environment.compare_versions(
        "tpu", {"torch": "2.15.1", "python": "3.11.7", "transformers": None, "libtpu": "0.0.49"})}
    assert not late["torch"]["ok"] and "downgrade torch" in late["torch"]["line"]
    assert not late["libtpu"]["ok"] and "upgrade libtpu" in late["libtpu"]["line"] and not late["support matrix"]["ok"]
    info = environment.environment(["neuron", "tpu"])
    text = environment.render(info)
    assert "target tpu versions: no transformers version stated by the vendor" in text
    assert "TorchNeuron needs torch 2.14.0: upgrade" not in text
    del info["requirements"]   # a result written before the comparison still renders
    assert "versions:" not in environment.render(info)


def test_scan_autocast_for_cuda_a_half_cast_and_an_item_read():
    """`portkit scan` reads torch.autocast("cuda") (by position or device_type=), .half() and .item(); the last two
    are the static scan's alone: stage 1 records them when the model runs."""
    scan = source_scan.scan_paths([GPU_ONLY / "precision_habits.py"])
    by = {(f.message.split(" (")[0], f.where["line"]) for f in source_scan.findings(scan, "tpu", static=True)}
    assert by == {("autocast for device_type 'cuda'", 13), ("float16 cast", 14),
                  ("tensor value read on the host", 17)}
    autocast = [f for f in source_scan.findings(scan, "tpu") if f.message.startswith("autocast")]
    assert [f.where["line"] for f in autocast] == [13] and "(and lines 15)" in autocast[0].message
    assert all(f.severity == WORK for f in source_scan.findings(scan, "tpu", static=True))
    assert {f.message.split(" (")[0] for f in source_scan.findings(scan, "tpu")} == {"autocast for device_type 'cuda'"}


def test_scan_cli_nothing_scanned_is_exit_2_and_a_symlink_loop_is_named(tmp_path, capsys):
    """An empty folder, a file that does not parse (null bytes) and a symlink loop: exit 2, one line, "nothing to
    scan" or the loop named, never "0 findings"."""
    from portkit import cli
    (tmp_path / "empty").mkdir()
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for source, expected in (("empty", "nothing to scan: it holds no .py, .cu or .cuh file"),
                             ("nul.py", "nothing to scan: 1 file(s) could not be parsed"),
                             ("loop", "a symlink loop (too many levels of symbolic links)")):
        assert cli.main(["scan", str(tmp_path / source)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and expected in captured.err
    assert cli.main(["scan", str(GPU_ONLY / "precision_habits.py")]) == 0
    out = capsys.readouterr().out
    assert "tpu: 3 finding(s)" in out and "float16 cast" in out and ".item()" in out
