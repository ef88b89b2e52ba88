import json

import numpy as np
import pytest
import torch

from conftest import fixture_model
from portkit.corpora.corpus import check_corpus, corpus_for, example_batch, length_distribution, load_corpus
from portkit.corpora import images
from portkit.models import registry
from portkit.core.errors import BadParameter, NeedsNetwork


def test_minilm_gives_real_sentence_embeddings(minilm):
    inputs = minilm.encode(["Return the sum of a and b.", "Add two numbers together.",
                            "Open a network socket."], pad_to=32)
    assert set(inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    assert inputs["input_ids"].shape == (3, 32)
    with torch.no_grad():
        emb = minilm(inputs)["embedding"]
    assert emb.shape == (3, 384)
    sims = emb @ emb.T
    # Pretrained weights: the two paraphrases are closer to each other than to the unrelated text.
    assert sims[0, 1] > sims[0, 2] + 0.2
    assert "pretrained" in minilm.origin


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5", "mamba", "lstm"])
def test_random_text_models_build_and_run(name, corpus):
    m = registry.load(name)
    inputs = m.encode(corpus.sample(2, seed=1), pad_to=16)
    with torch.no_grad():
        out = m(inputs)
    assert out and all(v.shape[0] == 2 for v in out.values())
    again = registry.load(name)   # seeded: the same weights in every process
    assert all(torch.equal(a, b) for a, b in zip(m.module.state_dict().values(), again.module.state_dict().values()))


def test_vit_takes_real_images():
    m = registry.load("vit")
    crops = images.sample_images(3, m.image_size, seed=0)
    assert crops[0].shape == (64, 64, 3) and 0.0 <= crops[0].min() and crops[0].max() <= 1.0
    assert crops[0].std() > 0.01     # a photograph, not a constant
    with torch.no_grad():
        assert m(m.encode(crops))["logits"].shape == (3, 10)


def _photo_folder(root):
    """A user's folder: matplotlib's photographs saved as JPEG and PNG at their own sizes, one of them grey
    and in a subfolder."""
    from PIL import Image
    from matplotlib import cbook
    root.mkdir()
    (root / "sub").mkdir()
    with cbook.get_sample_data("grace_hopper.jpg") as handle:
        hopper = Image.open(handle).convert("RGB")
    hopper.save(root / "hopper.jpg")
    hopper.crop((0, 0, 300, 200)).save(root / "wide.png")
    hopper.convert("L").save(root / "sub" / "grey.png")
    (root / "notes.txt").write_text("not an image")
    return root


def test_an_image_model_takes_the_users_folder_of_images(tmp_path):
    folder = _photo_folder(tmp_path / "photos")
    assert check_corpus(str(folder)) == str(folder)
    m = registry.load("vit")
    corpus = corpus_for(m, str(folder))
    assert len(corpus) == 3 and "3 images in" in corpus.source
    assert all(item.shape == (64, 64, 3) and item.dtype == np.float32 for item in corpus.texts)
    grey = [item for item in corpus.texts if np.allclose(item[..., 0], item[..., 1])]
    assert len(grey) == 1          # the grey PNG became three equal channels
    inputs, described = example_batch(m, corpus, batch_size=2, seq_len=64)
    assert inputs["pixel_values"].shape == (2, 3, 64, 64) and "images from photos" in described
    with torch.no_grad():
        assert m(inputs)["logits"].shape == (2, 10)


def test_a_bad_image_folder_is_refused_naming_the_file(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("x")
    with pytest.raises(BadParameter, match="of .jpg/.jpeg/.png"):
        check_corpus(str(empty))
    folder = _photo_folder(tmp_path / "photos")
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(BadParameter, match="broken.jpg"):
        images.check_folder(str(folder))
    with pytest.raises(BadParameter, match="takes text"):
        corpus_for(registry.load("bert"), str(folder))


def test_hub_ids_fail_at_once_with_advice():
    with pytest.raises(NeedsNetwork, match="hf download"):
        registry.load("bert-base-uncased/foo")
    with pytest.raises(NeedsNetwork):
        registry.validate("meta-llama/Llama-3-8B")


def test_unknown_model_lists_choices():
    with pytest.raises(BadParameter, match=r"unknown model 'gpt5'; choose one of: minilm, gpt2"):
        registry.load("gpt5")


def test_factory_specs(tmp_path):
    m = registry.load(fixture_model("float64_model"))
    assert m.name == "float64_model" and m.takes_text
    assert registry.load(fixture_model("loaded_float64")).name == "float64-head"
    with pytest.raises(BadParameter, match="unknown factory"):
        registry.load(fixture_model("no_such_factory"))
    with pytest.raises(BadParameter, match="no such file"):
        registry.load(str(tmp_path / "missing.py") + ":f")


def test_local_model_directory(tmp_path):
    from transformers import BertConfig, BertModel
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(tmp_path)
    m = registry.load(str(tmp_path))
    assert m.kind == registry.EMBEDDING and "local directory" in m.origin
    with torch.no_grad():
        assert m(m.encode(["hello world"]))["embedding"].shape == (1, 32)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadParameter, match="config.json"):
        registry.load(str(empty))


def test_encode_policies(minilm):
    long_text = "word " * 600
    assert minilm.encode([long_text])["input_ids"].shape[1] == 512          # truncated to the model's max
    with pytest.raises(BadParameter, match="truncation is off"):
        minilm.encode([long_text], pad_to=64, truncate=False)
    with pytest.raises(BadParameter, match="at most 512"):
        minilm.encode(["x"], pad_to=1024)


def test_stdlib_corpus_is_real_and_long_tailed(corpus, minilm):
    assert len(corpus) > 5000
    assert corpus.sample(5, seed=3) == corpus.sample(5, seed=3)
    dist = length_distribution(corpus, minilm)
    p = dist.percentiles()
    assert p["p50"] < p["p90"] < p["p99"] < p["max"]
    assert p["max"] > 512 and dist.over_limit() > 0          # some texts exceed MiniLM's 512
    assert "p50" in str(dist) and dist.to_dict()["count"] == len(corpus)


def test_user_corpora(tmp_path):
    (tmp_path / "a.txt").write_text("first text\n\nsecond text\n")
    assert load_corpus(str(tmp_path / "a.txt")).texts == ("first text", "second text")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in ["x y", "z"]))
    assert load_corpus(str(tmp_path / "b.jsonl"), column="body").texts == ("x y", "z")
    with pytest.raises(BadParameter, match="unknown text column in b.jsonl line 1 'text'; choose one of: body"):
        load_corpus(str(tmp_path / "b.jsonl"))
    (tmp_path / "c.csv").write_text("id,review\n1,great\n2,bad\n")
    assert load_corpus(str(tmp_path / "c.csv"), column="review").texts == ("great", "bad")
    with pytest.raises(BadParameter, match="choose one of: id, review"):
        load_corpus(str(tmp_path / "c.csv"))
    with pytest.raises(BadParameter, match="no such file"):
        load_corpus(str(tmp_path / "missing.jsonl"))
    (tmp_path / "d.parquet").write_text("")
    with pytest.raises(BadParameter, match="corpus file type"):
        load_corpus(str(tmp_path / "d.parquet"))


def test_example_batch(corpus, minilm):
    inputs, described = example_batch(minilm, corpus, 4, 48, seed=0)
    assert inputs["input_ids"].shape == (4, 48) and "4 texts" in described
    vit = registry.load("vit")
    pixels, described = example_batch(vit, None, 2, 48)
    assert pixels["pixel_values"].shape == (2, 3, 64, 64) and "image" in described
    assert np.isfinite(pixels["pixel_values"].numpy()).all()


def test_validate_makes_paths_absolute_without_running_user_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    # a config save_pretrained could write (no weights: a real-size model built on the meta device)
    (tmp_path / "m" / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    assert registry.validate("m") == str(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(BadParameter, match="no model_type"):
        registry.validate("m")
    (tmp_path / "f.py").write_text("raise SystemExit('never run by validate')\nfrom elsewhere import *\n")
    assert registry.validate("f.py:anything") == f"{tmp_path / 'f.py'}:anything"   # a star import may define it
    assert registry.validate("minilm") == "minilm"
    assert registry.validate("json:loads") == "json:loads"      # a module on the path: found, not imported
    with pytest.raises(NeedsNetwork):
        registry.validate("hf:org/model")


def test_corpus_files_are_read_as_written(tmp_path):
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbftext,label\r\nhello there,1\r\n")   # a spreadsheet export
    assert load_corpus(str(tmp_path / "bom.csv")).texts == ("hello there",)
    long_text = "word " * 40_000                                                      # over csv's 128 KiB field
    (tmp_path / "long.csv").write_text(f'text\n"{long_text}"\nshort\n')
    assert load_corpus(str(tmp_path / "long.csv")).texts == (long_text, "short")
    (tmp_path / "ids.jsonl").write_text('{"text": "42"}\n{"text": "a sentence"}\n')  # digits in a string are text
    assert load_corpus(str(tmp_path / "ids.jsonl")).texts == ("42", "a sentence")
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    assert load_corpus(str(tmp_path / "crlf.txt")).texts == ("one", "two")
