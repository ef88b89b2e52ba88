"""Stage 3b with workload "generate" (portkit.stages.xla.generation): a causal LM's prefill and decode graphs over a
static KV cache, compiled by XLA for a TPU topology with the cache in HBM, and the largest batch that fits at
a context. Compiles need the xla extra and skip without it; the graph itself is checked eagerly everywhere."""
import json

import pytest
import torch

from portkit.workloads import generation
from portkit.models.registry import load
from portkit.core import availability
from portkit.stages.report.stage import build_report
from portkit.stages.xla.stage import Options, plot_hbm, run_stage
from portkit.tpu_compile import compiler
from portkit.stages.xla.generation import (_Serving, cache_shapes, compile_graph, compile_serving, graph_inputs,
                                           largest_batch)
from portkit.tpu_compile import sharded
from portkit.core.errors import BadParameter

needs_xla = pytest.mark.skipif(not availability.xla_tpu_compile_available(),
                               reason="needs jax, jaxlib, libtpu and torchax: pip install 'portkit[xla]'")


@pytest.fixture(scope="module")
def gpt2():
    return load("gpt2")      # GPT-2's architecture from its config, 2 layers: small graphs that compile quickly


def test_the_compiled_graph_is_generation_with_a_static_cache(gpt2):
    model = generation.causal_model(gpt2).eval()
    ids = gpt2.tokenizer(["def add(a, b): return a + b"], return_tensors="pt")["input_ids"][:, :6]
    prompt, context = ids.shape[1], 16
    spec = graph_inputs(model, 1, prompt, context)
    keys, values = torch.zeros(spec["keys"][0]), torch.zeros(spec["values"][0])
    mask = torch.zeros(1, context, dtype=torch.long)
    mask[:, :prompt + 1] = 1
    serve = _Serving(model)
    with torch.no_grad():
        first, keys_1, values_1 = serve(ids, mask, torch.arange(prompt)[None], torch.arange(prompt), keys, values)
        nxt = first.argmax(-1)[:, None]
        second, keys_2, _ = serve(nxt, mask, torch.tensor([[prompt]]), torch.tensor([prompt]), keys_1, values_1)
        whole = model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1]
    torch.testing.assert_close(second, whole, rtol=1e-4, atol=1e-4)     # prefill then one decode step
    filled = [bool(keys_2[:, :, :, i].abs().sum() > 0) for i in range(context)]
    assert filled == [True] * (prompt + 1) + [False] * (context - prompt - 1)
    assert not keys.abs().sum()                  # the caller's cache is not written: the graph returns a new one


def test_a_latent_attention_cache_takes_the_shapes_the_model_writes():
    """Rule: the serving graph's cache is shaped as the model's attention writes it, read from one step, not from
    config fields: DeepSeek V3's latent attention caches its compressed keys and values, other shapes than
    num_key_value_heads x head_dim (the config formula made axk1's prefill fail to trace: "not assessed")."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, DynamicCache
    config = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
                              q_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8, head_dim=8,
                              n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                              max_position_embeddings=64)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config).eval()
    keys, values = cache_shapes(model, 1, 16)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.ones(1, 1, dtype=torch.long), cache=cache, use_cache=True)
    layer = cache.layers[0]
    assert keys == (1, 1, layer.keys.shape[1], 16, layer.keys.shape[-1])
    assert values == (1, 1, layer.values.shape[1], 16, layer.values.shape[-1])
    assert (keys[2], keys[4]) != (config.num_key_value_heads, config.head_dim)
    ids = torch.tensor([[3, 5, 7, 9]])
    mask = torch.zeros(1, 16, dtype=torch.long)
    mask[:, :5] = 1
    with torch.no_grad():
        first, k, v = _Serving(model)(ids, mask, torch.arange(4)[None], torch.arange(4),
                                                     torch.zeros(keys), torch.zeros(values))
        nxt = first.argmax(-1)[:, None]
        second, _, _ = _Serving(model)(nxt, mask, torch.tensor([[4]]), torch.tensor([4]), k, v)
        whole = model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1]
    torch.testing.assert_close(second, whole, rtol=1e-4, atol=1e-4)


@needs_xla
def test_prefill_and_decode_compile_with_the_cache_in_hbm(gpt2):
    graphs = compile_serving(gpt2, batch=4, prompt=32, context=64, topology="v5e:1x1")
    config = generation.causal_model(gpt2).config
    head = config.hidden_size // config.num_attention_heads
    cache_bytes = 2 * config.num_hidden_layers * 4 * config.num_attention_heads * 64 * head * 4
    for graph in graphs.values():
        assert graph.status == "compiled" and graph.fits
        assert sum(graph.breakdown.values()) == graph.memory["total"]
        assert graph.breakdown["KV cache"] == cache_bytes
        assert graph.memory["alias"] >= cache_bytes          # donated: updated in place, held once
    assert graphs["prefill"].tokens == 32 and graphs["decode"].tokens == 1
    longer = compile_graph(gpt2, "decode", 4, 1, 128, "v5e:1x1")
    assert longer.breakdown["KV cache"] == 2 * cache_bytes
    with pytest.raises(BadParameter, match="prompt bucket"):
        compile_graph(gpt2, "prefill", 1, 65, 64, "v5e:1x1")


@needs_xla
def test_the_largest_batch_is_the_compilers_boundary(gpt2, monkeypatch):
    first = compile_graph(gpt2, "decode", 1, 1, 256, "v5e:1x1")
    per_row = first.breakdown["KV cache"] + first.breakdown.get("outputs not in place", 0)
    monkeypatch.setitem(compiler.HBM_GIB_PER_CHIP, "v5e", (first.memory["total"] + 6 * per_row) / 2 ** 30)
    n, tried = largest_batch(gpt2, 256, "v5e:1x1", limit=64)
    assert 1 <= n < 64 and tried[n] is True and tried[n + 1] is False    # the compiler's own boundary


@needs_xla
def test_stage_3b_compiles_stage_3s_largest_serving_buckets_and_the_report_shows_them(gpt2, tmp_path, monkeypatch):
    monkeypatch.setattr(sharded, "BATCH_LIMIT", 2)
    plan = {"prompt": {"boundaries": [16, 48]}, "context": {"boundaries": [32, 80]}}
    (tmp_path / "buckets.json").write_text(json.dumps({"stage": "buckets", "targets": {}, "generation": {
        "targets": {"tpu": {"auto": plan}}}}))
    stage = run_stage(gpt2, ["neuron", "tpu"],
                          Options.of({"batch_size": 2, "seq_len": 32, "workload": "generate"}), run_dir=tmp_path)
    served = stage.serving["tpu"]
    assert (served["prompt"], served["context"], served["status"]) == (48, 80, "compiled")
    assert served["prefill"]["batch"] == 2 and served["largest_batch"] == 2
    assert "(the search's limit)" in served["summary"]
    assert stage.serving["neuron"]["status"] == "skipped"
    stage.save(tmp_path / "xla.json")
    shown = build_report(["tpu"], run_dir=tmp_path).to_dict()["targets"]["tpu"]["metrics"]["xla"]
    assert "KV cache" in shown["serving graphs (XLA)"] and "context 80" in shown["serving graphs (XLA)"]
    # the notebook's plot: one stacked bar per graph, its parts adding up to the compiler's total
    fig = plot_hbm({g: served[g]["breakdown"] for g in ("prefill", "decode")},
                       served["decode"]["hbm_bytes_per_device"])
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(set(served["prefill"]["breakdown"]) | set(served["decode"]["breakdown"]))
    ends = [max(b.get_x() + b.get_width() for b in bars if round(b.get_y() + b.get_height() / 2) == row)
            for row in (0, 1)]
    totals = [served[g]["memory"]["total"] / 2 ** 20 for g in ("prefill", "decode")]
    assert ends == pytest.approx(totals, rel=1e-6)


def test_generate_needs_a_causal_lm():
    with pytest.raises(BadParameter, match="workload 'inference'"):
        Options.of({"workload": "generate"}, model="minilm")
