"""The cost a budget can be made from (portkit.planning.budget, planning.cost): the chip and precision that run, a
roofline with a memory term, a range calibrated on published measurements that never passes its bound, a verdict.
Fast: plain dicts shaped like stage results, read through the run folder's typed readers (results.cost_figures), no
model and no run folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from portkit.planning import budget, cost, economics
from portkit.runfolder import accuracy_result, buckets_result, results, xla_result
from portkit.targets import capacity

PARAMS = 22_713_216          # all-MiniLM-L6-v2's parameters, as stage 3 records them


def _buckets(batch: int = 1, flops: float = 21.2e6, activation_bytes: float | None = None) -> dict:
    """Stage 3's result as planning.cost reads it: a plan per target over 1,000 requests, padding priced by FLOPs
    (and activation bytes a position, where given)."""
    plan = {"shapes": [{"batch": batch, "seq": 32}, {"batch": batch, "seq": 128}], "real_tokens": 40_000,
            "padded_tokens": 10_000, "batch_sizes": [batch], "padding_waste": 0.2, "settings": {"warmup_seconds": 40}}
    price = {"kind": economics.ESTIMATE, "seconds": flops / 667e12, "flops": flops, "source": "estimate",
             "activation_bytes": activation_bytes}
    return {"model": {"parameters": PARAMS}, "distribution": {"count": 1000},
            "targets": {"neuron": {"chosen": plan}, "tpu": {"chosen": plan}},
            "padding_price": {"neuron": price, "tpu": price}}


def _figures(buckets: dict, xla: dict | None = None, accuracy: dict | None = None) -> cost.Figures:
    """The figures planning.cost reads, from stage results shaped as dicts, as the run folder's readers give them."""
    return results.cost_figures(buckets_result.Result.from_dict(buckets, Path("buckets.json")),
                                xla_result.Result.from_dict(xla, Path("xla.json")) if xla else None,
                                accuracy_result.Result.from_dict({"targets": {}, **accuracy}, Path("accuracy.json"))
                                if accuracy else None)


def _accuracy(neuron: str, gpu: str) -> dict:
    from portkit.targets import specs
    chosen = next(p for p in specs.get("neuron").precisions if p.name == neuron)
    return {"targets": {"neuron": {"precision": chosen.to_dict()}},
            "reference": {"gpu_baseline": {"gpu_numerics": gpu}}}


def test_neuron_is_priced_on_trn2_from_the_vendors_pages():
    """TorchNeuron runs on Trn2/Trn3 only: Neuron's chip is trn2, whose peaks per precision come from AWS's page."""
    assert economics.PRICE_CHIPS["neuron"] == "trn2"
    trn2 = capacity.chip("trn2", "neuron")
    assert trn2["peaks"] == {"fp32": 181e12, "tf32": 667e12, "bf16": 667e12, "fp8": 1299e12}
    assert "trainium2" in trn2["sources"]["peaks"]
    found = cost.estimate(_figures(_buckets()), "neuron")
    assert found["chip"] == "trn2" and found["price"]["instance"] == "trn2.48xlarge"


def test_the_precision_stage_4_chose_is_the_one_priced():
    """float32 throughout on Neuron is priced at Trainium2's FP32 peak (181 TFLOP/s), matmult at BF16 (667); the
    GPU runs at the setting stage 4 measured (TF32 on the H100: 494.5 TFLOP/s), float32 without stage 4."""
    big = _buckets(batch=4096)             # compute-bound, so the precision shows in the time
    fp32 = cost.estimate(_figures(big, accuracy=_accuracy("none", "tf32")), "neuron")
    bf16 = cost.estimate(_figures(big, accuracy=_accuracy("matmult", "tf32")), "neuron")
    assert fp32["roofline"]["peak_flops"] == 181e12 and bf16["roofline"]["peak_flops"] == 667e12
    assert fp32["roofline"]["bound"] == bf16["roofline"]["bound"] == "compute"
    assert fp32["chip_seconds_per_million_requests"] / bf16["chip_seconds_per_million_requests"] == pytest.approx(
        667 / 181)
    assert "stage 4 chose 'none'" in fp32["precision"]
    graph = cost.Graph(21.2e6, None, PARAMS)
    gpu = cost.gpu_estimate(_figures(big, accuracy=_accuracy("none", "tf32")), "H100", graph)
    assert gpu["roofline"]["precision"] == "tf32" and gpu["roofline"]["peak_flops"] == 494.5e12
    plain = cost.gpu_estimate(_figures(big), "H100", graph)
    assert plain["roofline"]["precision"] == "fp32" and "float32 assumed" in plain["precision"]


def test_tpu_float32_matmuls_cost_their_bf16_passes():
    """A TPU has no separate FP32 peak: HIGHEST runs float32 matmuls in 6 bf16 passes (JAX's Precision docs)."""
    flops, source = budget.peak("v5e", "tpu", "fp32", passes=6)
    assert flops == pytest.approx(197e12 / 6) and "6 bf16 passes" in source


def test_the_roofline_has_a_memory_term_and_says_which_binds():
    """A 22.7 M-parameter encoder at batch 1 reads its weights every request: memory-bound on every chip; at a
    large batch the weights amortise and compute binds. time = max(FLOPs / peak, bytes / bandwidth)."""
    one = budget.Workload(flops=21.2e6 * 50, bytes_per_batch=4.0 * PARAMS, bytes_per_request=0, batch=1)
    for chip, family in (("trn2", "neuron"), ("H100", "gpu"), ("v5e", "tpu")):
        found = budget.roofline(one, chip, "bf16", family)
        assert found.bound == "HBM bandwidth" and found.seconds == found.memory_seconds > found.compute_seconds
        assert found.memory_seconds == pytest.approx(4.0 * PARAMS / capacity.chip(chip, family)["hbm_bytes_per_s"])
    many = budget.roofline(budget.Workload(21.2e6 * 50, 4.0 * PARAMS, 0, 4096), "trn2", "bf16", "neuron")
    assert many.bound == "compute" and many.seconds == pytest.approx(21.2e6 * 50 / 667e12)


def test_every_side_counts_bytes_by_the_same_rule():
    """One bytes rule on every side (budget.graph_workload): the weights as stored once a batch plus the activation
    bytes a position counted on the graph (stage 3's padding price). The TPU side no longer takes XLA's bytes
    accessed: those are shown beside it as a labelled cross-check and do not move its cost."""
    act, batch = 1.8e5, 4
    buckets = _buckets(batch=batch, activation_bytes=act)
    shapes = [{"label": f"batch=1 seq={s}", "flops": 2.2e7 * s, "bytes_accessed": 3e8 + 1e6 * s} for s in (32, 128)]
    xla = {"targets": {"tpu": {"topology": "v5e:1x1", "shapes": shapes}}}
    found = cost.comparison(_figures(buckets, xla), ["neuron", "tpu"])
    sides = [*found["targets"].values(), *found["gpus"].values()]
    for side in sides:
        spec = capacity.chip(side["chip"], "gpu" if "gpu" in side else side["target"])
        request = 4.0 * PARAMS / batch + act * side["positions_per_request"]
        assert side["roofline"]["memory_seconds"] == pytest.approx(request / spec["hbm_bytes_per_s"]), side["chip"]
        assert "counted on the graph" in side["method"]
    tpu = found["targets"]["tpu"]
    assert tpu["cross_check"]["label"].startswith("cross-check, not used")
    assert tpu["cross_check"]["xla_bytes_per_request"] == pytest.approx(
        3e8 / batch + 1e6 * tpu["positions_per_request"])
    assert "cross-check, not used: XLA's bytes accessed" in cost.line(tpu)
    assert "cross_check" not in found["targets"]["neuron"]          # no compiled TPU shapes for Neuron
    bigger = [{**s, "bytes_accessed": 10 * s["bytes_accessed"]} for s in shapes]
    again = cost.estimate(_figures(buckets, {"targets": {"tpu": {"topology": "v5e:1x1", "shapes": bigger}}}), "tpu")
    assert again["chip_seconds_per_million_requests"] == tpu["chip_seconds_per_million_requests"]
    # a run folder whose stage 3 recorded no activation bytes: every side alike counts the weights only, and says so
    old = cost.comparison(_figures(_buckets(batch=batch), xla), ["neuron", "tpu"])
    for side in [*old["targets"].values(), *old["gpus"].values()]:
        assert side["roofline"]["memory_seconds"] == pytest.approx(
            4.0 * PARAMS / batch / capacity.chip(side["chip"], "gpu" if "gpu" in side else side["target"])[
                "hbm_bytes_per_s"])
        assert "activations not counted" in side["method"]


def test_the_graph_counts_the_bytes_every_op_writes():
    """capacity.ACTIVATION_RULE, on a module built for it: each op's outputs once (x * 2 and the in-place add_ write
    n x 4 float32 each), a view writes nothing; a Linear's matmul writes its output once."""
    import torch

    class Writes(torch.nn.Module):
        def forward(self, x):
            y = (x * 2).view(-1)
            y.add_(1)
            return y

    for n in (8, 16):
        assert capacity.count_flops(Writes(), {"x": ((n, 4), "float32")}).activation_bytes == 2 * n * 4 * 4
    linear = capacity.count_flops(torch.nn.Linear(4, 8), {"input": ((1, 16, 4), "float32")})
    assert linear.activation_bytes == 16 * 8 * 4 and linear.flops == 2 * 16 * 4 * 8


def test_the_padding_price_is_the_roofline_at_the_declared_precision():
    """Stage 3 prices a padded position with budget.position_price: max(FLOPs / peak, activation bytes / HBM
    bandwidth), at the target's default precision (stage 3 runs before stage 4 chooses): Neuron's 'none' at
    Trainium2's FP32 peak, the TPU's one-pass bf16. Memory-bound, the price follows the HBM bandwidth."""
    flops, act = 21.2e6, 1.8e5
    neuron = economics.roofline_price("neuron", flops, act)
    assert neuron.seconds == pytest.approx(max(flops / 181e12, act / 2.9e12))
    assert "stage 3 runs before stage 4" in neuron.source and "'none'" in neuron.source
    tpu = economics.roofline_price("tpu", flops, act)
    assert tpu.seconds == pytest.approx(act / 819e9) and "HBM bandwidth-bound" in tpu.source
    assert tpu.activation_bytes == act and tpu.to_dict()["activation_bytes"] == act
    real = capacity.chip

    def halved(name, family="tpu"):
        spec = dict(real(name, family))
        spec["hbm_bytes_per_s"] /= 2
        return spec
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "chip", halved)
        assert economics.roofline_price("tpu", flops, act).seconds == pytest.approx(2 * tpu.seconds)
    assert economics.roofline_price("tpu", flops).seconds == pytest.approx(flops / 197e12)   # bytes not counted


def test_the_range_never_extends_past_its_bound():
    """The roofline is a lower bound on cost; dividing it by efficiencies of at most 1 cannot go below it."""
    for family in ("neuron", "gpu", "tpu"):
        eff = budget.efficiency(family)
        assert 0 < eff.low <= eff.median <= eff.high <= 1
        usd = budget.cost_range(1.0, eff)
        assert usd.bound == 1.0 <= usd.low <= usd.estimate <= usd.high
    found = cost.comparison(_figures(_buckets()), ["neuron", "tpu"])
    for side in [*found["targets"].values(), *found["gpus"].values()]:
        usd = side.get("usd_per_million_requests")
        if usd:
            assert usd["bound"] <= usd["low"] <= usd["estimate"] <= usd["high"]
            assert "at twice the throughput" not in usd


def test_the_calibration_table_is_what_the_code_uses():
    """Each family's spread is computed from data/targets/calibration.json's rows (at least 3 where published
    measurements exist); a family without one (TPU) says so and borrows the whole spread."""
    rows = json.loads(budget.CALIBRATION.read_text())["rows"]
    assert rows == list(budget.calibration_rows())
    for family, least in (("neuron", 3), ("gpu", 3)):
        mine = [budget.row_efficiency(r) for r in rows if r["family"] == family]
        eff = budget.efficiency(family)
        assert eff.measurements == len(mine) >= least and (eff.low, eff.high) == (min(mine), max(mine))
    for row in rows:
        assert row["source"].startswith("https://") and row["date"] and row["scenario"], row["model"]
    assert "no published encoder measurement" in budget.efficiency("tpu").note
    # a batch-1 plan reads the batch-1 measurements where a family has 3 of them (trn1's Real Time table)
    single = [r for r in rows if r["family"] == "neuron" and r["batch"] == 1]
    one = budget.efficiency("neuron", 1)
    assert one.measurements == len(single) >= 3 and "at batch 1" in one.note
    assert one.low == pytest.approx(min(budget.row_efficiency(r) for r in single))
    assert "fewer than 3" in budget.efficiency("gpu", 1).note          # one L4 SingleStream result: said
    page = (budget.CALIBRATION.parents[2] / "docs" / "benchmarks" / "calibration.md").read_text()
    assert all(r["source"] in page for r in rows)
    # a family with no measurement stays uncalibrated, and the page lists every search made for one
    searched = budget.calibration_searches()
    assert {r["family"] for r in searched} == {"tpu"} and not [r for r in rows if r["family"] == "tpu"]
    assert all(r["query"] in page and r["found"] in page for r in searched)
    # one row checked by hand: bert-base at 128 tokens, batch 8, bf16 on one Inferentia2 chip (190 TFLOP/s)
    bert = next(r for r in rows if r["model"] == "bert-base-uncased")
    flops = 2 * 12 * (4 * 768 ** 2 + 2 * 768 * 3072) * 128 + 4 * 12 * 128 ** 2 * 768
    assert budget.row_efficiency(bert) == pytest.approx(bert["measured_per_second"] * flops / 190e12)


def test_the_verdict_reads_the_ranges_and_gives_the_break_even():
    """Per target: which side the estimate favours against the cheapest GPU, the chip-hour price at which its
    estimate matches that GPU's, the share of its roofline it would need at today's price, how sure."""
    eff = budget.Efficiency("x", 0.5, 0.5, 0.5, 3, "test")
    gpus = {"H100": budget.cost_range(1.0, eff), "L4": budget.cost_range(3.0, eff)}
    cheap = budget.verdict("tpu", budget.cost_range(0.2, eff), 1.2, gpus)
    assert (cheap.favours, cheap.gpu, cheap.sure.split(":")[0]) == ("moving", "H100", "clear")
    dear = budget.verdict("neuron", budget.cost_range(1.5, eff), 2.4, gpus)
    assert dear.favours == "staying" and dear.break_even_usd_per_chip_hour == pytest.approx(2.4 / 1.5)
    assert dear.break_even_utilisation == pytest.approx(1.5 / 2.0) and "break-even: $1.6 per chip-hour" in dear.line
    wide = budget.Efficiency("x", 0.2, 0.5, 1.0, 3, "test")
    assert budget.verdict("tpu", budget.cost_range(1.1, wide), 1.0, gpus).sure.startswith("uncertain")
    assert budget.verdict("tpu", budget.cost_range(1.0, eff), 1.0, {}) is None
    found = cost.comparison(_figures(_buckets()), ["neuron", "tpu"])
    assert set(found["verdicts"]) == {"neuron", "tpu"}
    assert all(v["favours"] in ("moving", "staying") for v in found["verdicts"].values())


def test_a_generation_runs_cost_says_its_decode_steps_are_not_priced():
    """Rule: a cost says what it priced. The estimate prices one forward pass over a request's positions; under
    workload generate a request also runs new_tokens decode steps, which it does not price: the assumptions say so
    and every verdict line calls the figure a lower bound. Without a generation nothing is added."""
    from portkit.runfolder import compile_result
    plain = cost.comparison(_figures(_buckets()), ["neuron", "tpu"])
    assert "not_priced" not in plain and not any("decode steps" in v["line"] for v in plain["verdicts"].values())
    compiled = compile_result.Result.from_dict(
        {"targets": {"tpu": {"generation": {"new_tokens": 16, "dynamic": None, "static": None}}}},
        Path("compile.json"))
    figures = results.cost_figures(buckets_result.Result.from_dict(_buckets(), Path("buckets.json")), None, None,
                                   compiled)
    assert figures.generated_tokens == 16
    found = cost.comparison(figures, ["neuron", "tpu"])
    assert "not its 16 decode steps" in found["not_priced"] and found["not_priced"] in found["assumptions"]
    for verdict in found["verdicts"].values():
        assert verdict["line"].endswith("(prompt only: 16 decode steps a request not priced, a lower bound)")
    assert found["targets"]["tpu"]["chip_seconds_per_million_requests"] == \
        plain["targets"]["tpu"]["chip_seconds_per_million_requests"]
