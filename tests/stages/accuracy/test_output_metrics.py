"""Stage 4's task metrics for waveforms (SNR, SI-SDR), discrete codes and probabilities, and an output whose shape
on a target differs from the reference's, which is a finding while the other outputs and targets are compared."""
import math

import pytest
import torch
from torch import nn

from portkit.core.errors import BadParameter
from portkit.models import inputs
from portkit.models import registry
from portkit.stages.accuracy import comparison
from portkit.stages.accuracy import stage
from portkit.stages.report.stage import build_report
from portkit.targets import numerics
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS

SCOPE = {"compiled": False, "progress": False, "all_precisions": False, "layers": False}


def _sine(n: int = 4000) -> torch.Tensor:
    return torch.sin(torch.arange(n, dtype=torch.float64) * 0.031) + 0.5 * torch.sin(torch.arange(n) * 0.007)


def _noise_at(signal: torch.Tensor, snr_db: float, seed: int = 0) -> torch.Tensor:
    """Noise orthogonal to `signal` whose energy is the signal's divided by 10^(snr_db / 10)."""
    n = torch.randn(signal.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    n = n - signal * (n @ signal) / (signal @ signal)
    return n * torch.sqrt(signal.square().sum() / 10 ** (snr_db / 10) / n.square().sum())


# ---------------------------------------------------------------- SNR and SI-SDR on constructed signals
@pytest.mark.parametrize("snr", [6.0, 20.0, 45.0])
def test_snr_and_si_sdr_read_the_noise_power_they_were_built_with(snr):
    s = _sine()
    x = s + _noise_at(s, snr)
    assert comparison.snr_db(x, s) == pytest.approx(snr, abs=1e-9)
    assert comparison.si_sdr_db(x, s) == pytest.approx(snr, abs=1e-9)     # orthogonal noise: alpha is 1


def test_si_sdr_ignores_a_gain_the_snr_counts():
    s = _sine()
    x = s + _noise_at(s, 30.0, seed=1)
    for gain in (0.25, 3.7, -2.0):
        assert comparison.si_sdr_db(gain * x, s) == pytest.approx(comparison.si_sdr_db(x, s), abs=1e-9)
    assert comparison.snr_db(0.5 * x, s) < 7.0 < 30.0 - 1e-6      # half the amplitude: the SNR sees ~6 dB
    assert comparison.snr_db(s, s) == comparison.DB_LIMIT == comparison.si_sdr_db(s.clone(), s)
    assert comparison.snr_db(s, torch.zeros_like(s)) == -comparison.DB_LIMIT     # an error against silence


def test_waveform_metrics_count_real_samples_only_and_fail_their_floor():
    s = torch.stack([_sine(), _sine() * 0.3])
    mask = torch.ones(2, 4000, dtype=torch.long)
    mask[1, 3000:] = 0
    garbage = s.clone()
    garbage[1, 3000:] = 5.0                 # the padding differs wildly: not a real sample
    clean = comparison.task_metrics(inputs.WAVEFORM, garbage, s, mask, DEFAULT_TASK_BOUNDS, unit="recordings")
    assert clean["passed"] and clean["snr_db_min"] == comparison.DB_LIMIT and clean["samples"] == 7000
    loud = s + torch.stack([_noise_at(s[0], 10.0), _noise_at(s[1], 12.0)])     # both below the 30 dB floor
    found = comparison.task_metrics(inputs.WAVEFORM, loud, s, mask, DEFAULT_TASK_BOUNDS, unit="recordings")
    checks = {c["metric"]: c for c in found["checks"]}
    assert found["decision"] == "fail" and checks["snr_db"]["n"] == 2 and checks["snr_db"]["ci95"] is not None
    assert checks["snr_db"]["value"] == pytest.approx(10.0, abs=1e-9) and checks["snr_db"]["budget"] == \
        "budget >= 30 dB"
    assert "lowest SNR (dB) 10 " in found["reason"] and "outside its budget >= 30 dB" in found["reason"]


# ---------------------------------------------------------------- codes and probabilities
def test_code_agreement_on_equal_and_perturbed_codes():
    codes = torch.randint(0, 1024, (4, 8, 50), generator=torch.Generator().manual_seed(0))    # (batch, n_q, frames)
    same = comparison.task_metrics(inputs.CODES, codes.clone(), codes, None, DEFAULT_TASK_BOUNDS)
    assert same["passed"] and same["code_agreement"] == 1.0 and same["codes"] == 1600
    flipped = codes.clone()
    flipped.view(-1)[::10] += 1                                  # one code in ten
    found = comparison.task_metrics(inputs.CODES, flipped, codes, None, DEFAULT_TASK_BOUNDS)
    assert found["code_agreement"] == pytest.approx(0.9) and found["decision"] == "fail"
    low, high = found["checks"][0]["ci95"]
    assert low < 0.9 < high < DEFAULT_TASK_BOUNDS["codes"]


def test_codes_from_logits_are_their_argmax_at_real_positions():
    logits = torch.randn(2, 300, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 300, dtype=torch.long)
    mask[1, 200:] = 0
    other = logits.clone()
    other[1, 200:] = -other[1, 200:]                  # every padded position's code changes
    found = comparison.task_metrics(inputs.CODES, other, logits, mask, DEFAULT_TASK_BOUNDS)
    assert found["code_agreement"] == 1.0 and found["codes"] == 500 and found["passed"]
    ids = logits.argmax(-1)                           # (batch, frames) integers of the mask's shape: masked too
    moved = ids.clone()
    moved[0, :30] += 1
    assert comparison.task_metrics(inputs.CODES, moved, ids, mask, DEFAULT_TASK_BOUNDS)["code_agreement"] == \
        pytest.approx(470 / 500)


def test_probability_error_and_decision_agreement():
    p = torch.linspace(0.01, 0.99, 2000, dtype=torch.float64)
    near = comparison.task_metrics(inputs.PROBABILITY, p + 0.002, p, None, DEFAULT_TASK_BOUNDS)
    crossing = int(((p >= 0.498) & (p < 0.5)).sum())           # only those just below 0.5 change side
    assert near["mae"] == pytest.approx(0.002, rel=1e-9) and near["passed"] and near["threshold"] == 0.5
    assert crossing and near["decision_agreement"] == pytest.approx(1 - crossing / 2000)
    far = comparison.task_metrics(inputs.PROBABILITY, (p + 0.1).clamp(max=1), p, None, DEFAULT_TASK_BOUNDS)
    checks = {c["metric"]: c for c in far["checks"]}
    assert checks["probability_mae"]["decision"] == "fail" and checks["agreement"]["decision"] == "fail"
    assert far["decision_agreement"] < 0.95 and "range_note" not in far
    logits = comparison.task_metrics(inputs.PROBABILITY, p * 4, p * 4, None, DEFAULT_TASK_BOUNDS)
    assert "outside [0, 1]" in logits["range_note"]


def test_the_new_budgets_are_checked_as_options():
    opts = stage.Options.of({"task_bounds": {"snr_db": 40, "codes": 0.9, "probability_mae": 0.02}})
    assert opts.bounds["snr_db"] == 40 and opts.bounds["si_sdr_db"] == DEFAULT_TASK_BOUNDS["si_sdr_db"]
    with pytest.raises(BadParameter, match="task bound codes"):
        stage.Options.of({"task_bounds": {"codes": 2}})
    with pytest.raises(BadParameter, match="task bound snr_db"):
        stage.Options.of({"task_bounds": {"snr_db": -3}})


# ---------------------------------------------------------------- a waveform model through stage 4
class Decoder(nn.Module):
    """A small convolutional decoder: audio, a voiced probability per recording and discrete codes. With
    `bf16_length`, the audio's length is computed by a matmul, as a hop-rounded length can be: a target that
    rounds matmul operands to bfloat16 (TPU's default) rounds 1001 real samples to 1000."""

    def __init__(self, bf16_length: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.bf16_length = bf16_length
        self.net = nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.GELU(), nn.Conv1d(16, 16, 7, padding=3),
                                 nn.GELU(), nn.Conv1d(16, 1, 7, padding=3))

    def forward(self, wave, mask):
        y = self.net(wave.unsqueeze(1)).squeeze(1) * mask
        out = {"audio": y, "voiced": torch.sigmoid(y.sum(-1) / mask.sum(-1)),
               "codes": (y.clamp(-1, 1) * 4).round().long()}
        if self.bf16_length:
            length = (mask.sum(-1, keepdim=True).to(y.dtype).max(0, keepdim=True).values @ torch.ones(1, 1,
                                                                                                    dtype=y.dtype))
            out["audio"] = y[:, :int(length.item())]
        return out


def _declaration(outputs) -> inputs.Declaration:
    def build(items, sizes):
        n = sizes["samples"]
        wave, mask = torch.zeros(len(items), n), torch.zeros(len(items), n, dtype=torch.long)
        for i, x in enumerate(items):
            wave[i, :min(n, len(x))], mask[i, :min(n, len(x))] = x[:n], 1
        return {"wave": wave, "mask": mask}
    return inputs.Declaration((inputs.TensorSpec("wave", torch.float32, ("batch", "samples")),
                               inputs.TensorSpec("mask", torch.long, ("batch", "samples"))),
                              (inputs.Dim("batch", batch=True), inputs.Dim("samples", varies=True, max=4096)),
                              build, lambda items: {"samples": [len(x) for x in items]}, tuple(outputs), inputs.AUDIO,
                              masks={"samples": "mask"}, sample_rate=16_000, item_label="recordings")


OUTPUTS = (inputs.Output("audio", inputs.WAVEFORM), inputs.Output("voiced", inputs.PROBABILITY),
           inputs.Output("codes", inputs.CODES))


def _batch(model, lengths=(1001, 800, 600, 1001)):
    g = torch.Generator().manual_seed(1)
    return model.encode([torch.sin(torch.arange(n) * 0.05) + 0.1 * torch.randn(n, generator=g) for n in lengths])


def test_a_conv_decoder_passes_on_both_targets_and_a_broken_op_fails_its_snr():
    m = registry.LoadedModel("decoder", inputs.WAVEFORM, Decoder().eval(), "random weights (seed 0)",
                           declaration=_declaration(OUTPUTS))
    batch = _batch(m)
    report = stage.check_accuracy(m, batch, ["neuron", "tpu"], scope=stage.Scope(**SCOPE))
    for name, t in report.targets.items():
        checks = {c["metric"]: c for c in t.chosen.task["checks"]}
        assert t.verdict == "pass" and not t.findings(), (name, t.chosen.basis())
        assert checks["snr_db"]["n"] == 4 and checks["snr_db"]["unit"] == "recordings"
        assert checks["snr_db"]["ci95"][0] >= DEFAULT_TASK_BOUNDS["snr_db"]
        assert set(t.chosen.output_tasks) == {"voiced", "codes"}       # each declared output by its own metric
        assert t.chosen.output_tasks["codes"]["codes"] == 1001 + 800 + 600 + 1001     # real positions only
    assert report.targets["tpu"].chosen.task["snr_db_min"] < comparison.DB_LIMIT     # bf16 operands: an error
    broken = stage.check_accuracy(m, batch, ["neuron", "tpu"], scope=stage.Scope(
        **{**SCOPE, "emulation": numerics.wrong_op_TESTING_ONLY("aten::gelu", 1, 0.5)}))
    for t in broken.targets.values():
        checks = {c["metric"]: c for c in t.chosen.task["checks"]}
        assert t.verdict == "fail" and checks["snr_db"]["decision"] == "fail"
        assert t.chosen.task["snr_db_min"] < DEFAULT_TASK_BOUNDS["snr_db"]
        assert "lowest SNR (dB)" in t.reasons[0] and [f.kind for f in t.findings()] == ["accuracy"]


def test_an_output_of_another_length_on_a_target_is_a_finding_and_the_rest_is_compared(tmp_path):
    m = registry.LoadedModel("decoder", inputs.WAVEFORM, Decoder(bf16_length=True).eval(), "random weights (seed 0)",
                           declaration=_declaration(OUTPUTS[:2]))
    batch = _batch(m)
    report = stage.check_accuracy(m, batch, ["tpu", "neuron"], scope=stage.Scope(**SCOPE))
    tpu, neuron = report.targets["tpu"], report.targets["neuron"]
    audio = tpu.chosen.outputs["audio"]
    assert audio["shape_mismatch"] == {"shape": [4, 1000], "reference_shape": [4, 1001]} and not audio["passed"]
    assert tpu.chosen.task["shape_mismatch"]["output"] == "audio" and tpu.chosen.task["checks"] == []
    voiced = tpu.chosen.outputs["voiced"]                   # the other output: still compared
    assert voiced["shape"] == [4] and math.isfinite(voiced["max_abs"])
    decided = {c["metric"]: c["decision"] for c in tpu.chosen.output_tasks["voiced"]["checks"]}
    assert decided == {"probability_mae": "pass", "agreement": "inconclusive"}     # 4 decisions: a wide interval
    (finding,) = tpu.findings()
    assert finding.kind == "output_shape" and finding.severity == "work"
    assert "'audio'" in finding.message and "[4, 1000]" in finding.message and "[4, 1001]" in finding.message
    assert "pad the input to a multiple of the model's hop" in finding.advice
    assert tpu.verdict == "fail" and "has shape [4, 1000] on the target" in tpu.reasons[0]
    assert neuron.verdict == "pass" and not neuron.findings()    # the other target: float32, the same length
    assert neuron.chosen.task["snr_db_min"] == comparison.DB_LIMIT
    report.save(tmp_path / "accuracy.json")                 # nan errors are written as null, and read back
    built = build_report(run_dir=tmp_path).to_dict()
    assert not any("accuracy.json" in gap for gap in built["gaps"])
    assert built["targets"]["tpu"]["metrics"]["accuracy"]["max abs error (audio)"] == "—"
    assert "output_shape" in {f["kind"] for f in built["targets"]["tpu"]["findings"]}


# ---------------------------------------------------------------- detection and semantic segmentation
def test_box_iou_of_known_boxes():
    """Rule pinned: a detection box is compared by its IoU with the reference's box for the same query (cx, cy, w,
    h): equal boxes 1, a box shifted by half its width 1/3, disjoint boxes 0, two empty boxes agree."""
    a = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1], [0.3, 0.3, 0.0, 0.0]],
                     dtype=torch.float64)
    b = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.6, 0.5, 0.2, 0.2], [0.8, 0.8, 0.1, 0.1], [0.3, 0.3, 0.0, 0.0]],
                     dtype=torch.float64)
    assert comparison.box_iou(a, b).tolist() == pytest.approx([1.0, 1 / 3, 0.0, 1.0])


def test_detection_outputs_are_judged_per_query_and_by_box_iou():
    """Rule pinned: a detector's class logits are judged by top-1 agreement per query, its boxes by the lowest IoU
    with the reference's (budget box_iou 0.95, decided on its bootstrap interval as the lowest cosine is): boxes moved
    by 0.1% of the image pass, a quarter of them moved by a third of their width fail."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 200, 4, generator=g, dtype=torch.float64)     # 400 decisions: enough to pass at 0.99
    boxes = torch.rand(2, 200, 4, generator=g, dtype=torch.float64) * 0.3 + 0.3
    same = comparison.task_metrics(inputs.DETECTION, logits, logits, None, DEFAULT_TASK_BOUNDS)
    assert same["passed"] and same["decisions"] == 400 and same["checks"][0]["unit"] == "queries"
    near = comparison.task_metrics(inputs.BOXES, boxes + torch.tensor([0.001, 0, 0, 0]), boxes, None,
                                   DEFAULT_TASK_BOUNDS)
    assert near["passed"] and near["boxes"] == 400 and 0.95 < near["iou_min"] < 1
    moved = boxes.clone()
    moved[:, ::4, 0] += moved[:, ::4, 2] / 3
    far = comparison.task_metrics(inputs.BOXES, moved, boxes, None, DEFAULT_TASK_BOUNDS)
    assert far["decision"] == "fail" and far["iou_min"] == pytest.approx(0.5, abs=1e-9)
    assert far["checks"][0]["metric"] == "box_iou" and far["checks"][0]["bound"] == 0.95


def test_segmentation_is_judged_on_the_argmax_map_per_pixel():
    """Rule pinned: a semantic segmenter's (batch, classes, height, width) logits are judged by the agreement of the
    per-pixel argmax map; one pixel's class flipped in 2 x 16 x 16 pixels is 511 of 512 agreeing."""
    logits = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    flipped = logits.clone()
    top = flipped[1, :, 4, 7].argmax()
    flipped[1, (top + 1) % 3, 4, 7] = flipped[1, top, 4, 7] + 1
    found = comparison.task_metrics(inputs.SEGMENTATION, flipped, logits, None, DEFAULT_TASK_BOUNDS)
    assert found["decisions"] == 512 and found["argmax_agreement"] == pytest.approx(511 / 512)
    assert found["checks"][0]["unit"] == "pixels" and "argmax (class) map" in found["metric"]
