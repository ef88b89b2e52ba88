"""The input contract (portkit/models/inputs.py): a declaration builds batches from items, measures them, pads
and cuts built batches, and says which dimensions vary; text and image models are two instances."""
import numpy as np
import pytest
import torch

from portkit.models import inputs
from portkit.models import registry
from portkit.core.errors import BadParameter


def _waves():
    def build(items, sizes):
        n = sizes["samples"]
        wave = torch.zeros(len(items), 2, n)                 # two channels: the varying dimension is third
        mask = torch.zeros(len(items), n, dtype=torch.long)
        for i, w in enumerate(items):
            cut = torch.as_tensor(w[:n])
            wave[i, :, :len(cut)], mask[i, :len(cut)] = cut, 1
        return {"wave": wave, "mask": mask}
    return inputs.Declaration(
        inputs=(inputs.TensorSpec("wave", torch.float32, ("batch", "channels", "samples")),
                inputs.TensorSpec("mask", torch.long, ("batch", "samples"))),
        dims=(inputs.Dim("batch", batch=True), inputs.Dim("channels", size=2),
              inputs.Dim("samples", varies=True, max=100, min=4)),
        build=build, measure=lambda items: {"samples": [len(w) for w in items]},
        outputs=(inputs.Output("logits", inputs.CLASSIFIER),), data=inputs.AUDIO, masks={"samples": "mask"},
        sample_rate=8000)


ITEMS = [np.arange(1, 6, dtype=np.float32), np.arange(1, 11, dtype=np.float32)]


def test_a_declaration_builds_padded_batches_and_measures_items():
    decl = _waves()
    assert decl.varying_names == ("samples",) and not decl.fixed_shape and decl.primary.metric == "classifier"
    assert decl.lengths(ITEMS) == {"samples": [5, 10]}
    longest = decl.batch(ITEMS)                                     # to the longest item
    assert longest["wave"].shape == (2, 2, 10) and decl.real_lengths(longest) == {"samples": [5, 10]}
    bucket = decl.batch(ITEMS, sizes={"samples": 8})                # a bucket: the long item is cut
    assert decl.real_lengths(bucket) == {"samples": [5, 8]} and decl.shape_label(bucket) == "2x2x8"
    assert decl.batch(ITEMS, limits={"samples": 6})["wave"].shape[-1] == 6
    assert decl.batch(ITEMS[:1], sizes={"samples": 2})["wave"].shape[-1] == 4      # never below the minimum
    with pytest.raises(BadParameter, match="invalid input length 10: longer than 8 samples and truncation is off"):
        decl.batch(ITEMS, sizes={"samples": 8}, truncate=False)
    with pytest.raises(BadParameter, match="invalid samples length 200: the model takes at most 100 samples"):
        decl.batch(ITEMS, sizes={"samples": 200})
    with pytest.raises(BadParameter, match="unknown varying dimension 'tokens'; choose one of: samples"):
        decl.batch(ITEMS, sizes={"tokens": 8})


def test_fit_pads_and_cuts_along_each_inputs_own_axis_and_adds_rows():
    decl = _waves()
    built = decl.batch(ITEMS)
    wider = decl.fit(built, {"samples": 16}, rows=3)
    assert wider["wave"].shape == (3, 2, 16) and wider["mask"].shape == (3, 16)
    assert torch.equal(wider["wave"][2], wider["wave"][0]) and int(wider["mask"][:2].sum()) == 15
    cut = decl.fit(built, {"samples": 3}, pad=False)
    assert cut["wave"].shape == (2, 2, 3) and decl.fit(cut, {"samples": 7}, pad=False)["wave"].shape[-1] == 3
    joined = decl.stack([decl.batch(ITEMS[:1]), decl.batch(ITEMS[1:])])
    assert torch.equal(joined["wave"], built["wave"]) and torch.equal(joined["mask"], built["mask"])
    probe = decl.dummy(2, {"samples": 6})
    assert probe["wave"].shape == (2, 2, 6) and int(probe["mask"].sum()) == 12    # a mask is all real
    assert decl.size_of({"wave": [1, 2, 9], "mask": [1, 9]}, "samples") == 9        # shapes as a compile records


def test_a_declaration_refuses_what_it_cannot_mean():
    with pytest.raises(BadParameter, match="invalid varying dimension 'frames': give max="):
        inputs.Dim("frames", varies=True)
    with pytest.raises(BadParameter, match="exactly one of"):
        inputs.Dim("x", size=3, varies=True, max=4)
    spec = inputs.TensorSpec("x", torch.float32, ("batch", "time"))
    with pytest.raises(BadParameter, match="unknown dimension of input 'x' 'time'; choose one of: batch"):
        inputs.Declaration((spec,), (inputs.Dim("batch", batch=True),), lambda i, s: {}, lambda i: {},
                           (inputs.Output("y", inputs.CLASSIFIER),), inputs.AUDIO)
    decl = inputs.Declaration((inputs.TensorSpec("x", torch.float32, ("batch", "time")),),
                              (inputs.Dim("batch", batch=True), inputs.Dim("time", varies=True, max=9)),
                              lambda i, s: {}, lambda items: {"frames": []}, (inputs.Output("y", "classifier"),),
                              inputs.AUDIO, sample_rate=8000)
    with pytest.raises(BadParameter, match="lengths from measure.*none for 'time'"):
        decl.lengths([1])


def test_text_and_image_models_are_two_instances_of_the_contract(minilm):
    text = minilm.declaration
    assert text.data == inputs.TEXT and text.varying_names == ("tokens",) and text.masks == {"tokens": "attention_mask"}
    assert text.primary == inputs.Output("embedding", registry.EMBEDDING)
    texts = ["Return the sum of a and b.", "Open the file."]
    assert minilm.token_lengths(texts) == text.lengths(texts)["tokens"]
    batch = minilm.encode(texts, pad_to=16)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"} and batch["input_ids"].shape == (2, 16)
    assert text.real_lengths(batch)["tokens"] == minilm.token_lengths(texts)
    vit = registry.load("vit")
    image = vit.declaration
    assert image.fixed_shape and vit.seq_dim is None and image.shape_of("pixel_values", 2, {}) == (2, 3, 64, 64)
    assert vit.describe()["declaration"]["varying"] == []
    with pytest.raises(BadParameter, match="no dimension of its inputs varies"):
        vit.token_lengths([np.zeros((64, 64, 3), np.float32)])


def test_xla_input_shapes_and_dtypes_come_from_the_declaration():
    from portkit.tpu_compile import compiler
    two = inputs.Declaration(
        (inputs.TensorSpec("input_ids", torch.long, ("batch", "source")),
         inputs.TensorSpec("decoder_input_ids", torch.long, ("batch", "target"))),
        (inputs.Dim("batch", batch=True), inputs.Dim("source", varies=True, max=64),
         inputs.Dim("target", varies=True, max=16)),
        lambda items, sizes: {}, lambda items: {"source": [], "target": []},
        (inputs.Output("logits", inputs.SEQ2SEQ_LM),), inputs.TEXT)
    m = registry.LoadedModel("pairs", inputs.SEQ2SEQ_LM, torch.nn.Identity(), "test", declaration=two)
    assert m.seq_dim == "source" and m.max_length == 64
    assert compiler.input_specs(m, {"batch": 2, "seq": 8}) == {          # the other dimension at its largest
        "input_ids": ((2, 8), torch.int64), "decoder_input_ids": ((2, 16), torch.int64)}
    waves = registry.LoadedModel("waves", inputs.CLASSIFIER, torch.nn.Identity(), "test", declaration=_waves())
    assert compiler.input_specs(waves, {"batch": 1, "seq": 40}) == {
        "wave": ((1, 2, 40), torch.float32), "mask": ((1, 40), torch.int64)}
    with pytest.raises(BadParameter, match="invalid seq 101: waves takes at most 100 samples"):
        compiler.input_specs(waves, {"batch": 1, "seq": 101})
