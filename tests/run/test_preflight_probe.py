"""The plan step calls an image or audio model from a directory once on the inputs portkit builds for it: a model that
raises on them is refused in one line (what it raised, where, the inputs its processor makes that portkit does not
feed), so no stage crashes on it. Each case is the zoo's architecture that found it, built from its config."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT
from portkit.core.errors import BadParameter
from portkit.run import preflight


def _built(tmp_path, model_type: str, family: str = "zero-shot-image"):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build
    row = next(r for r in zoo_build.enumerate_rows([family]) if r.model_type == model_type)
    return zoo_build.build(row, tmp_path, {})


def test_a_model_that_needs_inputs_portkit_does_not_feed_is_refused_in_the_plan_step(tmp_path):
    # Siglip2 (NaFlex) takes its patches with spatial_shapes and pixel_attention_mask from its processor; portkit's
    # zero-shot adapter feeds pixel_values only, and the model raises reading spatial_shapes: it crashed stages 1, 2, 4
    folder = _built(tmp_path, "siglip2")
    with pytest.raises(BadParameter) as raised:
        preflight.plan(str(folder), ["neuron"], str(tmp_path / "run"), {}, stages=["fallbacks"])
    message = str(raised.value)
    assert "\n" not in message
    assert "raises on the inputs portkit builds" in message and "modeling_siglip2.py" in message
    assert "spatial_shapes" in message and "pixel_attention_mask" in message
    assert not (tmp_path / "run").exists()


def test_a_model_that_runs_on_portkits_inputs_passes_and_one_that_raises_names_its_line(tmp_path):
    # BLIP-2's image-text retrieval reads captions through the Q-Former's text input, built only where its config's
    # use_qformer_text_input is set (the zoo's override, as transformers' retrieval tests set it); without it the
    # model raises AttributeError in its own feed-forward
    folder = _built(tmp_path, "blip-2")
    preflight.plan(str(folder), ["neuron"], str(tmp_path / "run"), {}, stages=["fallbacks"])
    config = json.loads((folder / "config.json").read_text())
    config["qformer_config"]["use_qformer_text_input"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadParameter, match=r"AttributeError: .*intermediate.* at transformers/models/blip_2/"):
        preflight.plan(str(folder), ["neuron"], str(tmp_path / "run2"), {}, stages=["fallbacks"])


def test_a_directory_whose_own_processor_raises_on_portkits_images_is_refused_naming_it(tmp_path):
    # ImageGPT's image processor quantizes colours to its palette (clusters); one saved without it raises on any
    # image: the directory's processor, not portkit, and not a crash of the run
    import torch
    from transformers import ImageGPTConfig, ImageGPTForImageClassification, ImageGPTImageProcessor
    torch.manual_seed(0)
    config = ImageGPTConfig(vocab_size=17, n_positions=64, n_embd=16, n_layer=1, n_head=2, num_labels=3)
    ImageGPTForImageClassification(config).save_pretrained(tmp_path / "igpt")
    ImageGPTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(tmp_path / "igpt")
    with pytest.raises(BadParameter, match=r"its own processor raises on an image portkit feeds it: ValueError: "
                                           r"Clusters must be provided.* at transformers/models/imagegpt/"):
        preflight.plan(str(tmp_path / "igpt"), ["tpu"], str(tmp_path / "run"), {}, stages=["fallbacks"])
    assert not (tmp_path / "run").exists()


def test_an_image_size_given_as_a_height_width_pair_is_read_as_the_square_it_names(tmp_path):
    # Hiera's config says image_size [224, 224]; its processor makes 224x224 images: the plan step compared the
    # processor's side with the list and refused every Hiera directory ("takes [224, 224]x[224, 224]")
    folder = _built(tmp_path, "hiera", family="image-classification")
    assert json.loads((folder / "config.json").read_text())["image_size"] == [32, 32]
    preflight.plan(str(folder), ["tpu"], str(tmp_path / "run"), {}, stages=["fallbacks"])
