"""The zoo's builder (benchmarks/zoo_build.py) sizes a config consistently: a routed top-k within the tiny expert
count whatever the config names it, a composite config's text model built from its text sub-config and saved whole,
a sub-config sized as its own model type. Each rule on the real architecture that was not buildable without it,
built at the zoo's tiny size (the build runs one eager forward pass)."""
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import zoo_build  # noqa: E402

EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@pytest.fixture(scope="module")
def rows():
    return {r.key: r for r in zoo_build.enumerate_rows(["causal-lm"])}


@pytest.fixture(scope="module")
def tokenizers():
    return {}


def test_every_name_for_the_routed_top_k_stays_within_the_tiny_expert_count():
    """Size: the experts a token is routed to never outnumber the tiny size's experts, under any name a config gives
    them (ERNIE 4.5's moe_k of 6 over 4 experts failed torch.topk, "selected index k out of range")."""
    table = zoo_build.sizes()
    out = zoo_build.shrink({"moe_num_experts": 64, "moe_k": 6, "hidden_size": 2560}, table, {})
    assert out["moe_k"] == table["scalars"]["num_experts_per_tok"] <= out["moe_num_experts"]
    assert zoo_build.shrink({"num_experts": 8, "moe_topk": 1}, table, {})["moe_topk"] == 1    # never grows


@pytest.mark.parametrize("key", ["ernie4_5_moe.causal-lm", "bailing_hybrid.causal-lm"])
def test_a_mixture_of_experts_routes_within_its_tiny_experts(rows, tokenizers, tmp_path, key):
    """Build: ERNIE 4.5 MoE (moe_k) and Bailing hybrid (num_experts_per_token, num_expert_group: eight groups of four
    experts were empty) build and run their forward pass, routing fewer experts than they hold."""
    folder = zoo_build.build(rows[key], tmp_path, tokenizers)
    config = json.loads((folder / "config.json").read_text())
    experts = min(config[k] for k in EXPERT_COUNTS if isinstance(config.get(k), int))
    top_k = [config[k] for k in zoo_build.sizes()["experts_per_token"] if isinstance(config.get(k), int)]
    assert top_k and max(top_k) < experts


def test_a_text_model_of_a_composite_config_is_built_from_its_text_config_and_saved_whole(rows, tokenizers, tmp_path):
    """Build: Emu3ForCausalLM takes Emu3TextConfig (the composite Emu3Config has no hidden_size): built from the text
    sub-config, as AutoModelForCausalLM.from_config gives it, and saved with the composite config naming its class,
    which AutoModelForCausalLM reloads with every weight."""
    from transformers import AutoModelForCausalLM
    folder = zoo_build.build(rows["emu3.causal-lm"], tmp_path, tokenizers)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "emu3" and config["architectures"] == ["Emu3ForCausalLM"]
    assert config["text_config"]["hidden_size"] == zoo_build.sizes()["scalars"]["hidden_size"]
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == "Emu3ForCausalLM" and not info["missing_keys"] and not info["unexpected_keys"]


def test_a_sub_config_is_sized_as_its_own_model_type(rows, tokenizers, tmp_path):
    """Size: a sub-config takes its own model type's overrides: Dots3 Note's text config gets dots3_note_text's
    sliding-window head_dim (nope + rope, its validator), so the composite builds and runs like the text model."""
    table = zoo_build.sizes()
    own = table["overrides"]["dots3_note_text"]["head_dim"]
    out = zoo_build.shrink({"text_config": {"model_type": "dots3_note_text", "head_dim": 256}}, table, {})
    assert out["text_config"]["head_dim"] == own
    folder = zoo_build.build(rows["dots3_note.causal-lm"], tmp_path, tokenizers)
    assert json.loads((folder / "config.json").read_text())["text_config"]["head_dim"] == own


def test_layers_that_share_another_layers_cache_keep_a_producer_of_every_type(rows, tokenizers, tmp_path):
    """Size: Gemma 3n's last num_kv_shared_layers layers reuse an earlier layer's keys and values of their type; at two
    layers its 15 shared layers left no producer ("the set of layer types producing a cache is different than the set
    of layer types using them"). Each kind now produces once and shares once, and its per-layer inputs index the
    tokenizer's ids at a tiny width (the default 262,144 x 256 per layer made a 275 M-parameter "tiny" model)."""
    table = zoo_build.sizes()
    out = zoo_build.shrink({"num_hidden_layers": 35, "num_kv_shared_layers": 15,
                            "layer_types": ["sliding_attention"] * 4 + ["full_attention"]}, table, {})
    assert out["layer_types"] == ["sliding_attention", "full_attention"] * 2 and out["num_kv_shared_layers"] == 2
    every = zoo_build.shrink({"num_hidden_layers": 4, "num_kv_shared_layers": 4,
                              "layer_types": ["sliding_attention", "full_attention"] * 2}, table, {})
    assert every["num_kv_shared_layers"] == every["num_hidden_layers"]      # a draft model sharing every layer
    config = json.loads((zoo_build.build(rows["gemma3n_text.causal-lm"], tmp_path, tokenizers)
                         / "config.json").read_text())
    assert config["num_kv_shared_layers"] == 2 and config["vocab_size_per_layer_input"] == config["vocab_size"]


def test_a_null_head_dim_is_sized_as_hidden_size_over_heads(rows, tokenizers, tmp_path):
    """Size: HunYuan MoE V1 reads getattr(config, "head_dim", hidden_size // heads), which gives its default None
    (the attribute exists), so it failed at any size ("NoneType ** float"). A null head_dim takes the tiny size's,
    which is what null means elsewhere: hidden_size // num_attention_heads."""
    scalars = zoo_build.sizes()["scalars"]
    out = zoo_build.shrink({"head_dim": None, "hidden_size": 4096, "num_attention_heads": 32}, zoo_build.sizes(), {})
    assert out["head_dim"] == scalars["hidden_size"] // scalars["num_attention_heads"]
    zoo_build.build(rows["hunyuan_v1_moe.causal-lm"], tmp_path, tokenizers)      # builds and runs its forward pass


def test_an_image_classifier_the_tiny_size_does_not_fit_is_not_buildable_and_overrides_fit_two(tmp_path):
    """Size: an image classifier runs one eager forward pass on its processor's image at build, so a size the zoo set
    wrong is the zoo's "not buildable" line, never a model portkit refuses (Donut-Swin's 7-wide attention windows
    over a 32-pixel image). MobileViTV2 (a 64-pixel image: five stride-2 stages) and EfficientNet (its top
    convolution's width) build with their overrides, and the plan step's probe then passes them."""
    from portkit.run import preflight
    rows = {r.key: r for r in zoo_build.enumerate_rows(["image-classification"])}
    with pytest.raises(zoo_build.NotBuilt, match="an eager forward pass at the zoo's size fails, outside portkit"):
        zoo_build.build(rows["donut-swin.image-classification"], tmp_path, {})
    for key in ("mobilevitv2.image-classification", "efficientnet.image-classification"):
        folder = zoo_build.build(rows[key], tmp_path, {})
        preflight.plan(str(folder), ["tpu"], str(tmp_path / f"run-{key}"), {}, stages=["fallbacks"])
