"""Real-size models without weights (meta device) through the XLA compile-only check, sharded over
multi-chip TPU topologies. Compiles use tiny configs; the Llama-3 sizes are checked by shape only
here (building them on the meta device allocates no weight), and compiled in benchmarks/bench_sharded.py."""
from __future__ import annotations

import json

import pytest
import torch
from portkit.models import meta_device
from portkit.core import availability
from portkit.tpu_compile import compiler
from portkit.tpu_compile import sharded
from portkit.core.errors import BadParameter

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax (pip install 'portkit[xla]')")


def test_every_config_names_its_source():
    table = json.loads(meta_device.CONFIGS.read_text())
    assert "_provenance" in table
    for name in meta_device.names():
        assert meta_device.source(name).startswith(("https://huggingface.co/", "portkit test config"))


def test_a_meta_model_has_its_config_size_and_no_storage():
    m = meta_device.build("tiny-llama")
    params = list(m.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    c = m.config      # embeddings and head, 2 layers of q,o (64x64), k,v (64x32), MLP 3x(64x128), 2 norms, final norm
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert sum(p.numel() for p in params) == 2 * c.vocab_size * 64 + 2 * layer + 64
    assert compiler.is_abstract(m) and m.portkit_abstract["name"] == "tiny-llama"


def test_bad_names_and_shapes_are_one_line_errors():
    with pytest.raises(BadParameter, match="llama3-9b"):
        meta_device.build("llama3-9b")
    m = meta_device.build("tiny-llama")
    with pytest.raises(BadParameter, match="at most 256 tokens"):
        meta_device.text_shape(m, 1, 257)
    with pytest.raises(BadParameter, match="batch"):
        meta_device.text_shape(m, 0, 8)
    with pytest.raises(BadParameter, match="v5e:9x9"):
        sharded.compile_sharded(m, [meta_device.text_shape(m, 4, 8)], "v5e:9x9")


def test_collectives_are_counted_once_per_op_not_per_reference():
    hlo = ("%ag = (bf16[2], bf16[8]) all-gather-start(%p)\n%d = bf16[8] all-gather-done(%ag)\n"
           "%ar.1 = f32[] all-reduce(%x), to_apply=%sum\n%y = f32[] add(%ar.1, %all-reduce.7)")
    counts = compiler.collectives(hlo)
    assert counts["all-gather"] == 1 and counts["all-reduce"] == 1 and counts["reduce-scatter"] == 0


def test_an_unprintable_compiled_module_keeps_its_verdict_without_a_collective_count():
    from portkit.tpu_compile import results

    class Unprintable:             # what libtpu gave for Llama-3-70B on v5p:2x2x1: compiled, as_text() fails
        def as_text(self):
            raise RuntimeError("INTERNAL: RET_CHECK failure ... async-update instruction should have 1 operands")
    assert results.compiled_collectives(Unprintable()) is None


def test_fsdp_splits_the_first_dimension_that_divides():
    PartitionSpec = pytest.importorskip("jax.sharding").PartitionSpec
    assert sharded.fsdp_weight_spec((6, 8), 4, PartitionSpec) == PartitionSpec(None, "fsdp")
    assert sharded.fsdp_weight_spec((8, 6), 4, PartitionSpec) == PartitionSpec("fsdp")
    assert sharded.fsdp_weight_spec((3,), 4, PartitionSpec) == PartitionSpec()


@needs_xla
def test_tiny_meta_llama_compiles_sharded_on_v5e_2x2():
    m = meta_device.build("tiny-llama")
    report = sharded.compile_sharded(m, [meta_device.text_shape(m, 4, 16)], "v5e:2x2")
    r = report.shapes[0]
    assert (r.status, r.platform, r.fits_hbm) == ("compiled", "tpu", True), r.message
    assert report.devices == 4 and r.collectives["all-gather"] > 0     # weights gathered: they were sharded
    # sharded weights take about a quarter per device of what the model holds
    assert r.memory["argument"] < report.parameter_bytes / 2


def test_scale_parameters_are_checked_before_any_compile():
    from portkit.stages.xla import stage
    for values, words in (({"scale_topologies": ["v5e:3x3"]}, "v5e:3x3"), ({"scale_topologies": []},
                          "scale_topologies"), ({"scale_buckets": [64, 0]}, "scale_buckets entry")):
        with pytest.raises(BadParameter, match=words):                  # the stage's options
            stage.Options.of(values)
    with pytest.raises(BadParameter, match="at most 8192 tokens"):       # what `portkit run --model` preflights
        stage.Options.of({"scale_seq": 1024, "scale_buckets": [16384]}, model="llama3-8b")
    stage.Options.of({"scale_seq": 16384}, model="minilm")     # a loaded model: the scale_* shape is not used


@needs_xla
def test_the_real_size_check_stops_at_the_smallest_topology_that_fits_and_searches_the_batch():
    from portkit.stages.xla import realsize
    from portkit.stages.xla import stage
    m = meta_device.build("tiny-llama")
    checks = realsize.run(m, ["neuron", "tpu", "cpu"], stage.Options.of(
        {"scale_topologies": ["v5e:2x2", "v5e:1x1"], "scale_batch": 4, "scale_seq": 16}))
    tpu = checks["tpu"]
    assert tpu.smallest == "v5e:1x1" and [r.topology for r in tpu.tried] == ["v5e:1x1"]   # 2x2 never compiled
    row = tpu.rows()[0]
    assert row["fits"] and row["roofline"]["label"] == "estimate, not measured"
    # tiny-llama fits far more than the search's limit: the guess from the first compile starts at the limit
    assert tpu.largest == [{"seq": 16, "topology": "v5e:1x1", "batch": 1024, "guess": tpu.largest[0]["guess"],
                            "limit": 1024, "compiles": 1, "tried": {"1024": True}}]
    neuron = checks["neuron"]
    assert neuron.lowering.ok and neuron.capacity["chips"]["trn1"]["copies_per_chip"] == 2   # one a NeuronCore
    # the Neuron method checked against the real compiler: FLOPs counted on the graph vs XLA's cost analysis
    assert neuron.capacity["flops"] == pytest.approx(tpu.tried[0].shapes[0].flops, rel=0.1)
    assert set(checks) == {"neuron", "tpu"}                        # cpu is a reference platform: no check
    assert "smallest topology that fits: v5e:1x1" in str(tpu) and tpu.findings()[0]["severity"] == "work"


@pytest.mark.parametrize("capacity", [0, 1, 2, 37, 64, 1000, 5000])
def test_bisection_finds_the_boundary_of_a_fake_compiler_in_few_compiles(capacity):
    calls = []

    def fits(batch):              # a fake compiler verdict: out of HBM above `capacity`
        calls.append(batch)
        return batch <= capacity
    best, tried = sharded.largest_fitting(fits, limit=1024)
    assert best == min(capacity, 1024)
    assert tried == {b: b <= capacity for b in calls} and len(calls) == len(set(calls)) <= 21
    assert all(tried[b] for b in tried if b <= best) and not any(tried[b] for b in tried if b > best)
    with pytest.raises(BadParameter, match="batch limit"):
        sharded.largest_fitting(fits, limit=0)


@pytest.mark.parametrize("capacity", [0, 1, 7, 37, 64, 999, 1024, 5000])
@pytest.mark.parametrize("guess", [1, 30, 40, 100, 2000])
def test_a_guess_from_measured_memory_finds_the_same_boundary(capacity, guess):
    calls = []

    def fits(batch):
        calls.append(batch)
        return batch <= capacity
    best, tried = sharded.largest_fitting(fits, limit=1024, guess=guess)
    assert best == min(capacity, 1024) and len(calls) == len(set(calls))
    assert all(tried[b] == (b <= capacity) for b in tried)
    if guess == 40 and capacity == 37:      # a close guess: a handful of compiles, not doubling from 1
        assert calls == [40, 39, 37, 38]
    if guess == capacity:                   # a right guess: it and the next one
        assert calls == [guess, guess + 1]


def test_the_guess_is_a_linear_memory_model_of_one_compile():
    from types import SimpleNamespace
    measured = SimpleNamespace(status="compiled", memory={"argument": 4 * 2**30, "total": 6 * 2**30})
    # 2 GiB for batch 8 at seq 1024: 0.25 GiB a sequence; 12 GiB free -> 48; at seq 2048 -> 24
    assert sharded.guess_batch(measured, 16 * 2**30, 8, 1024, 1024) == 48
    assert sharded.guess_batch(measured, 16 * 2**30, 8, 1024, 2048) == 24
    assert sharded.guess_batch(SimpleNamespace(status="out_of_hbm", memory=None), 1, 1, 1, 1) is None


@needs_xla
def test_the_compilers_out_of_hbm_verdict_is_the_boundary():
    m = meta_device.build("tiny-llama")
    huge = sharded.compile_sharded(m, [meta_device.text_shape(m, 65536, 256)], "v5e:1x1").shapes[0]
    assert huge.status == "out_of_hbm" and huge.fits_hbm is False, huge.message     # the compiler refused
    assert sharded.largest_batch(m, 16, "v5e:1x1", limit=1) == (1, {1: True})


def test_roofline_is_an_estimate_bound_by_the_slower_of_compute_and_hbm():
    from types import SimpleNamespace

    from portkit.targets import capacity
    report = SimpleNamespace(topology="v5e:2x2", hbm_bytes_per_device=16 * 2**30)
    result = SimpleNamespace(status="compiled", flops=197e12, bytes_accessed=819e9 / 2,
                             memory={"total": 5 * 2**30})
    r = capacity.roofline(report, result, tokens=4000)      # 1 s of v5e compute, 0.5 s of its HBM bandwidth
    assert r["label"] == "estimate, not measured" and r["bound"] == "compute"
    assert r["step_seconds"] == pytest.approx(1.0) and r["tokens_per_second_per_chip"] == pytest.approx(1000)
    assert r["copies_per_device"] == 3 and r["source"] == "https://cloud.google.com/tpu/docs/v5e"
    with pytest.raises(BadParameter, match="unknown TPU chip 'v9z'; choose one of: tpu7x, v4, v5e, v5p, v6e"):
        capacity.chip("v9z:2x2")


def test_every_chip_value_names_its_source_and_the_compile_check_reads_the_same_hbm():
    from portkit.targets import capacity
    table = json.loads(capacity.CHIPS.read_text())
    assert "_provenance" in table
    for name, spec in capacity.chips().items():
        values = [k for k in ("peak_bf16_flops", "hbm_bytes_per_s", "hbm_gib", "neuron_cores", "instance_chips")
                  if k in spec]
        assert set(values) <= set(spec["sources"]), name                 # every value has its page
        assert all(spec["sources"][k].startswith("https://") for k in values), name
    assert set(capacity.chips("neuron")) == {"trn1", "trn2", "inf2"}
    assert capacity.chip("v6e")["hbm_bytes_per_s"] == 1638e9            # the page's figure (it said 1640 before)
    assert capacity.chip("trn2", "neuron")["peak_bf16_flops"] == 667e12
    assert compiler.HBM_GIB_PER_CHIP == capacity.hbm_gib_per_chip()    # one owner: chips.json


def test_neuron_capacity_counts_llama3_8b_flops_on_the_graph_without_weights():
    from portkit.targets import capacity
    m = meta_device.build("llama3-8b")
    found = capacity.neuron_capacity(m, meta_device.text_shape(m, 8, 1024))
    c = m.config
    tokens = 8 * 1024
    # matmuls: q,o (h x h), k,v (h x h/4), MLP 3 x (h x 14336) per layer, and the LM head; attention 2 x s x h
    layer = 2 * c.hidden_size ** 2 + 2 * c.hidden_size * 1024 + 3 * c.hidden_size * c.intermediate_size
    matmuls = 2 * tokens * (c.num_hidden_layers * layer + c.hidden_size * c.vocab_size)
    attention = c.num_hidden_layers * 2 * 2 * 8 * 1024 * 1024 * c.hidden_size
    assert found["flops"] == matmuls + attention
    buffers = sum(b.numel() * b.element_size() for b in m.buffers())      # the rotary frequencies, fp32
    assert found["label"] == "estimate, not measured"
    assert found["weight_bytes"] == 2 * sum(p.numel() for p in m.parameters()) + buffers
    trn1, trn2 = found["chips"]["trn1"], found["chips"]["trn2"]
    # 16 GB of bf16 weights + 2 GB of logits: two 16 GiB NeuronCore-v2 (one Trainium chip), one 24 GiB Trn2 core
    assert (trn1["neuron_cores_per_copy"], trn1["copies_per_chip"], trn1["copies_per_instance"]) == (2, 1, 16)
    assert (trn2["neuron_cores_per_copy"], trn2["copies_per_chip"], trn2["copies_per_instance"]) == (1, 4, 64)
    assert trn1["bound"] == "compute" and trn1["step_seconds"] == pytest.approx(found["flops"] / 190e12)


def _native(name: str) -> bool:
    from portkit.targets import specs
    return specs.detect(name).native


def test_an_emulated_target_gets_no_measured_throughput_only_estimates(minilm):
    from portkit.targets import capacity
    from portkit.targets import specs
    if specs.detect("tpu").native:
        pytest.skip("a TPU is present: the measurement runs (test_native_throughput_is_measured_on_the_device)")
    with pytest.raises(BadParameter, match="invalid target for a measured throughput 'tpu': needs its device"):
        capacity.measure_native(minilm, "tpu", [{"batch": 1, "seq": 16}])


@pytest.mark.parametrize("name", ["neuron", "tpu"])
def test_native_throughput_is_measured_on_the_device(minilm, name):
    if not _native(name):
        pytest.skip(f"needs {name}'s vendor package and device (native mode); emulated here")
    from portkit.targets import capacity
    rows = capacity.measure_native(minilm, name, [{"batch": 1, "seq": 16}, {"batch": 4, "seq": 64}], repeats=3)
    assert [r["shape"] for r in rows] == [{"batch": 1, "seq": 16}, {"batch": 4, "seq": 64}]
    assert all(r["per_second"] > 0 and r["unit"] == "tokens" and r["label"].startswith("measured on") for r in rows)


@pytest.mark.parametrize("capacity", [0, 1, 7, 37, 500, 953, 1024, 5000])
@pytest.mark.parametrize("guess", [None, 1, 40, 509, 2000])
def test_a_search_within_a_fraction_stops_close_below_the_boundary_in_fewer_compiles(capacity, guess):
    def search(within):
        calls = []

        def fits(batch):
            calls.append(batch)
            return batch <= capacity
        best, tried = sharded.largest_fitting(fits, 1024, guess, within)
        return best, tried, calls
    exact, _, exact_calls = search(0.0)
    near, tried, calls = search(1 / 32)
    assert exact == min(capacity, 1024) and near <= exact
    assert near == 0 or tried[near] is True
    refused = [b for b, ok in tried.items() if not ok and b > near]
    # what it reports is close: the smallest refusal above it is within 1/32 of it, or it is the exact answer
    assert near == exact or min(refused) - near <= max(1, near // 32)
    assert len(calls) <= len(exact_calls) + 1
