"""Real-size models without weights (meta device) through the XLA compile-only check, sharded over
multi-chip TPU topologies (#16). Compiles use tiny configs; the Llama-3 sizes are checked by shape only
here (building them on the meta device allocates no weight), and compiled in benchmarks/bench_sharded.py."""
from __future__ import annotations

import json

import pytest
import torch
from portkit import abstract_models, probes, xla_compile, xla_sharded
from portkit.errors import BadParameter

needs_xla = pytest.mark.skipif(not probes.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax (pip install 'portkit[xla]')")


def test_every_config_names_its_source():
    table = json.loads(abstract_models.CONFIGS.read_text())
    assert "_provenance" in table
    for name in abstract_models.names():
        assert abstract_models.source(name).startswith(("https://huggingface.co/", "portkit test config"))


def test_a_meta_model_has_its_config_size_and_no_storage():
    m = abstract_models.build("tiny-llama")
    params = list(m.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    c = m.config      # embeddings and head, 2 layers of q,o (64x64), k,v (64x32), MLP 3x(64x128), 2 norms, final norm
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert sum(p.numel() for p in params) == 2 * c.vocab_size * 64 + 2 * layer + 64
    assert xla_compile.is_abstract(m) and m.portkit_abstract["name"] == "tiny-llama"


def test_bad_names_and_shapes_are_one_line_errors():
    with pytest.raises(BadParameter, match="llama3-9b"):
        abstract_models.build("llama3-9b")
    m = abstract_models.build("tiny-llama")
    with pytest.raises(BadParameter, match="at most 256 tokens"):
        abstract_models.text_shape(m, 1, 257)
    with pytest.raises(BadParameter, match="batch"):
        abstract_models.text_shape(m, 0, 8)
    with pytest.raises(BadParameter, match="v5e:9x9"):
        xla_sharded.compile_sharded(m, [abstract_models.text_shape(m, 4, 8)], "v5e:9x9")


def test_collectives_are_counted_once_per_op_not_per_reference():
    hlo = ("%ag = (bf16[2], bf16[8]) all-gather-start(%p)\n%d = bf16[8] all-gather-done(%ag)\n"
           "%ar.1 = f32[] all-reduce(%x), to_apply=%sum\n%y = f32[] add(%ar.1, %all-reduce.7)")
    counts = xla_compile.collectives(hlo)
    assert counts["all-gather"] == 1 and counts["all-reduce"] == 1 and counts["reduce-scatter"] == 0


def test_fsdp_splits_the_first_dimension_that_divides():
    PartitionSpec = pytest.importorskip("jax.sharding").PartitionSpec
    assert xla_sharded._weight_spec((6, 8), 4, PartitionSpec) == PartitionSpec(None, "fsdp")
    assert xla_sharded._weight_spec((8, 6), 4, PartitionSpec) == PartitionSpec("fsdp")
    assert xla_sharded._weight_spec((3,), 4, PartitionSpec) == PartitionSpec()


@needs_xla
def test_tiny_meta_llama_compiles_sharded_on_v5e_2x2():
    m = abstract_models.build("tiny-llama")
    report = xla_sharded.compile_sharded(m, [abstract_models.text_shape(m, 4, 16)], "v5e:2x2")
    r = report.shapes[0]
    assert (r.status, r.platform, r.fits_hbm) == ("compiled", "tpu", True), r.message
    assert report.devices == 4 and r.collectives["all-gather"] > 0     # weights gathered: they were sharded
    # sharded weights take about a quarter per device of what the model holds
    assert r.memory["argument"] < report.parameter_bytes / 2


def test_scale_parameters_are_checked_before_any_compile():
    xla_sharded.check_scale_parameters("", "anything", 0, 0)           # "" turns the check off
    with pytest.raises(BadParameter, match="v5e:3x3"):
        xla_sharded.check_scale_parameters("tiny-llama", ["v5e:3x3"], 1, 8)
    with pytest.raises(BadParameter, match="scale_topologies"):
        xla_sharded.check_scale_parameters("tiny-llama", [], 1, 8)
    from portkit import xla
    with pytest.raises(BadParameter, match="llama3-9b"):             # what `portkit run -p scale_model` preflights
        xla.check_parameters(scale_model="llama3-9b")
    with pytest.raises(BadParameter, match="scale_model"):
        xla.check_parameters(scale_model=8)


@needs_xla
def test_fit_table_stops_at_the_smallest_topology_that_fits():
    table = xla_sharded.fit_table("tiny-llama", ["v5e:2x2", "v5e:1x1"], batch=4, seq=16)
    assert "smallest topology that fits: v5e:1x1" in str(table)
    assert len(table.rows) == 1 and table.rows[0][0] == "v5e:1x1"    # the 1-chip one fit: 2x2 never compiled


@pytest.mark.parametrize("capacity", [0, 1, 2, 37, 64, 1000, 5000])
def test_bisection_finds_the_boundary_of_a_fake_compiler_in_few_compiles(capacity):
    calls = []

    def fits(batch):              # a fake compiler verdict: out of HBM above `capacity`
        calls.append(batch)
        return batch <= capacity
    best, tried = xla_sharded.largest_fitting(fits, limit=1024)
    assert best == min(capacity, 1024)
    assert tried == {b: b <= capacity for b in calls} and len(calls) == len(set(calls)) <= 21
    assert all(tried[b] for b in tried if b <= best) and not any(tried[b] for b in tried if b > best)
    with pytest.raises(BadParameter, match="batch limit"):
        xla_sharded.largest_fitting(fits, limit=0)


@needs_xla
def test_the_compilers_out_of_hbm_verdict_is_the_boundary():
    m = abstract_models.build("tiny-llama")
    huge = xla_sharded.compile_sharded(m, [abstract_models.text_shape(m, 65536, 256)], "v5e:1x1").shapes[0]
    assert huge.status == "out_of_hbm" and huge.fits_hbm is False, huge.message     # the compiler refused
    assert xla_sharded.largest_batch(m, 16, "v5e:1x1", limit=1) == (1, {1: True})


def test_roofline_is_an_estimate_bound_by_the_slower_of_compute_and_hbm():
    from types import SimpleNamespace

    from portkit import capacity
    report = SimpleNamespace(topology="v5e:2x2", hbm_bytes_per_device=16 * 2**30)
    result = SimpleNamespace(status="compiled", flops=197e12, bytes_accessed=819e9 / 2,
                             memory={"total": 5 * 2**30})
    r = capacity.roofline(report, result, tokens=4000)      # 1 s of v5e compute, 0.5 s of its HBM bandwidth
    assert r["label"] == "estimate, not measured" and r["bound"] == "compute"
    assert r["step_seconds"] == pytest.approx(1.0) and r["tokens_per_second_per_chip"] == pytest.approx(1000)
    assert r["copies_per_device"] == 3 and r["source"] == "https://cloud.google.com/tpu/docs/v5e"
    with pytest.raises(BadParameter, match="tpu7x"):
        capacity.chip("tpu7x:2x2x1")
