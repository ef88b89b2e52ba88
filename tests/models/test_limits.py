"""Limits that are portkit's, not the model's: "the model's maximum" is said only of a limit read from the model (its
config's position table, its factory's own word); portkit's own cap is named as portkit's, with what raises it, and
gets no advice that assumes a position table (sliding windows)."""
import types

from portkit.corpora import corpus
from portkit.models import registry
from portkit.stages.buckets import stage
from tests.models.test_hf_models import _gpt2, _text_dir

LONG = " ".join(["hello world return the sum of two numbers"] * 120)     # ~960 tokens
TEXTS = ["hello world", "return the sum of two numbers", LONG, LONG + " open a network socket"]

GRU_FACTORY = '''
import torch
from torch import nn


class GRUTagger(nn.Module):
    """A recurrent text model: no position table, so no length limit of its own."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 16)
        self.gru = nn.GRU(16, 16, batch_first=True)

    def forward(self, input_ids, attention_mask):
        out, _ = self.gru(self.embed(input_ids))
        return {"logits": out * attention_mask.unsqueeze(-1)}


def build():
    return GRUTagger()


def build_longer():
    from portkit.models import registry
    return registry.LoadedModel("gru", registry.TOKEN_CLASSIFIER, registry.OutputsAdapter(GRUTagger()), "factory",
                                tokenizer=registry.minilm_tokenizer(), max_length=2048)
'''


def truncation_of(m) -> dict:
    dist = corpus.length_distribution(types.SimpleNamespace(texts=TEXTS, name="texts"), m)
    return stage.truncation_finding(stage.truncation(dist, stage.histogram(dist)))


def test_a_model_without_positions_is_cut_at_portkits_cap_named_as_portkits(tmp_path):
    """Rule: a recurrent model (no position table) loaded from a factory is capped by portkit, and the truncation
    finding names the cap as portkit's with what raises it, never "the model's maximum", and advises no windows."""
    factory = tmp_path / "gru_model.py"
    factory.write_text(GRU_FACTORY)
    m = registry.load(f"{factory}:build")
    assert m.max_length == 512 and m.max_length_from is None
    found = truncation_of(m)
    assert found["severity"] == "work" and "model's maximum" not in found["message"]
    assert "longer than 512 tokens (portkit's cap, not the model's) and are cut" in found["message"]
    assert found["message"].endswith("the model states no length limit; a factory of your own raises it: return "
                                     "LoadedModel(..., max_length=N), or declare the dimension with Dim(..., max=N) "
                                     "(docs/guides/declaring-a-model.md)")
    assert "sliding windows" not in found["advice"]
    assert found["advice"].startswith("the limit is portkit's, not the model's: raise it")
    # the factory's own max_length is its word on the model: the model's maximum, and nothing is cut at 2048
    longer = registry.load(f"{factory}:build_longer")
    assert longer.max_length == 2048 and longer.max_length_from.startswith("the factory's own max_length")
    message = truncation_of(longer)["message"]
    assert message.startswith("none of the 4 texts is longer than")
    assert "below 2048 tokens (the model's maximum)" in message
    assert message.endswith("nothing is cut (the limit is the factory's own max_length or declaration)")


def test_a_state_space_directory_is_capped_by_portkit_a_gpt2_directory_by_its_config(tmp_path):
    """Rule: a Hugging Face directory whose config has no position table (Mamba) gets portkit's cap, named as such;
    one with one (GPT-2's n_positions) gets its own limit, called the model's maximum, with the windows advice."""
    from transformers import MambaConfig, MambaForCausalLM

    def mamba(vocab):
        return MambaForCausalLM(MambaConfig(vocab_size=vocab, hidden_size=16, state_size=4, num_hidden_layers=1))

    state_space = registry.load(str(_text_dir(tmp_path / "a", "mamba", mamba)))
    assert state_space.max_length_from is None and state_space.max_length == 512
    assert "512 tokens (portkit's cap, not the model's)" in truncation_of(state_space)["message"]
    gpt2 = registry.load(str(_text_dir(tmp_path / "b", "gpt2", _gpt2)))
    assert (gpt2.max_length, gpt2.max_length_from) == (64, "its config's n_positions")
    found = truncation_of(gpt2)
    assert "64 tokens (the model's maximum) and are cut" in found["message"]
    assert found["message"].endswith("; the limit is its config's n_positions")
    assert "sliding windows of 64 tokens" in found["advice"]
    assert gpt2.describe()["max_length_from"] == "its config's n_positions"


def test_an_encoder_decoders_limit_is_read_from_its_halves(tmp_path):
    """Rule: the model's maximum is read from the model. transformers' EncoderDecoderModel (BERT to BERT) keeps its
    position tables in its encoder's and decoder's sub-configs; portkit read none at the top and capped it at its
    own 512, so stage 4 fed 512 tokens to 128-position tables and crashed. The smaller half's table is the limit,
    named with its key, and the zoo's rule reads the same sub-configs."""
    import json
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo_build, zoo_rules
    row = next(r for r in zoo_build.enumerate_rows(["seq2seq-lm"]) if r.model_type == "encoder-decoder")
    folder = zoo_build.build(row, tmp_path, {})
    config = json.loads((folder / "config.json").read_text())
    lm = registry.load(str(folder))
    halves = min(config[k]["max_position_embeddings"] for k in ("encoder", "decoder"))
    assert lm.max_length == halves < registry.huggingface.PORTKIT_CAP
    assert lm.max_length_from.startswith("its config's encoder.max_position_embeddings")
    assert zoo_rules.model_limit(config) == halves
