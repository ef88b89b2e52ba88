"""Advice that was tried, for the padding side: where a bucket fails only padded (its texts pass at their own length),
stage 4 pads it on the side the tokenizer does not pad on and runs it again on the same target side and precision,
and the padding finding says "tried: passes" (pad on that side) or "tried: still fails" (exact-length batches)."""
import pytest
import torch
from torch import nn

from portkit.models import registry
from portkit.core import grading
from portkit.core.findings import PADDING_CAUSE
from portkit.stages.accuracy import stage
from portkit.stages.accuracy import padding_side

SCOPE = dict(task_items=8, all_precisions=False, layers=False, float64_reference=False, compiled=False,
             progress=False)


def _tokenizer(side: str):
    tokenizer = registry.minilm_tokenizer()       # a fresh copy: the side is set on this one only
    tokenizer.padding_side = side
    return tokenizer


class SlotCountingDecoder(nn.Module):
    """A causal token tagger whose positions count from the first slot (as a decoder without position_ids from its
    mask does) and which reads no mask: left padding moves every real token's position and runs the padding into
    its prefix sums, while right padding, after the real tokens, reaches none of them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.position, self.head = nn.Embedding(30522, 16), nn.Embedding(512, 16), nn.Linear(16, 5)

    def forward(self, input_ids, attention_mask):
        slots = torch.arange(input_ids.shape[1])
        h = self.embed(input_ids) + self.position(slots)
        h = h.cumsum(1) / (slots + 1).unsqueeze(-1)       # causal: each slot sees the slots before it
        return {"logits": self.head(torch.tanh(h))}


class SequenceNormTagger(nn.Module):
    """A token tagger that normalises over the whole sequence axis with no mask: padding on either side reaches
    every real position."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.norm, self.head = nn.Embedding(30522, 16), nn.InstanceNorm1d(16), nn.Linear(16, 5)

    def forward(self, input_ids, attention_mask):
        return {"logits": self.head(self.norm(self.embed(input_ids).transpose(1, 2)).transpose(1, 2))}


class TinyGPT2Tagger(nn.Module):
    """GPT-2's architecture (transformers' GPT2ForTokenClassification) at tiny size, random weights: causal
    attention, and position ids counted from the first slot when none are given."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2ForTokenClassification
        torch.manual_seed(0)
        self.gpt2 = GPT2ForTokenClassification(GPT2Config(vocab_size=30522, n_positions=256, n_embd=32, n_layer=1,
                                                          n_head=2, num_labels=5)).eval()

    def forward(self, input_ids, attention_mask):
        return {"logits": self.gpt2(input_ids=input_ids, attention_mask=attention_mask).logits}


def _padding_finding(module: nn.Module, side: str, corpus):
    from portkit.corpora.corpus import example_batch
    m = registry.LoadedModel("padding-side test", registry.TOKEN_CLASSIFIER, module.eval(), "test model",
                           tokenizer=_tokenizer(side))
    inputs, _ = example_batch(m, corpus, batch_size=2, seq_len=32)
    report = stage.check_accuracy(m, inputs, ["tpu"], stage.Options.of({"precision": {"tpu": "highest"}}),
                                     corpus=corpus, buckets=[16, 128], scope=stage.Scope(**SCOPE))
    tpu = report.targets["tpu"]
    found = {f.kind: f for f in tpu.findings()}
    assert m.tokenizer.padding_side == side            # the try leaves the tokenizer's own side as it was
    return tpu, found


@pytest.mark.parametrize("module", [SlotCountingDecoder, TinyGPT2Tagger], ids=["built", "gpt2"])
def test_a_left_padded_decoder_is_told_to_pad_on_the_right_because_it_was_tried(module, corpus):
    """Rule (advice that was tried: a padding side): a decoder whose tokenizer pads on the left fails its buckets
    padded (positions move), passes at the texts' own length; right padding, tried on the same buckets, target side
    and precision, passes, so the padding finding (work, one cause) says to pad on the right and that it was tried,
    not that the model needs exact-length batches. Pinned on a model built for it and on GPT-2 at tiny size."""
    tpu, found = _padding_finding(module(), "left", corpus)
    sides = [t for t in tpu.tried if t.get("padding_side")]
    assert sides and all(t["padding_side"] == "right" and t["passed"] for t in sides), tpu.tried
    padding = found["padding"]
    assert padding.severity == grading.severity("padding") and padding.cause == PADDING_CAUSE
    assert "pad on the right" in padding.advice and "tried:" in padding.advice
    assert "exact-length" not in padding.advice and "accuracy" not in found


def test_padding_that_fails_on_either_side_says_the_other_side_was_tried_and_still_fails(corpus):
    """Rule (advice that was tried: a padding side): a model that normalises over the whole sequence fails padded on
    the right and, tried, on the left too: the advice stays exact-length batches and says the left still fails."""
    tpu, found = _padding_finding(SequenceNormTagger(), "right", corpus)
    assert [t for t in tpu.tried if t.get("padding_side") == "left" and not t["passed"]], tpu.tried
    advice = found["padding"].advice
    assert "exact-length" in advice and "tried: padding on the left still fails" in advice


def test_the_other_side_is_only_tried_where_there_is_a_side():
    """Rule: a model without a tokenizer (images, audio) has no padding side to try; the try restores the side."""
    class NoTokenizer:
        tokenizer = None
    assert padding_side.other(NoTokenizer()) is None
    m = registry.LoadedModel("t", registry.TOKEN_CLASSIFIER, SequenceNormTagger(), "test", tokenizer=_tokenizer("left"))
    assert padding_side.other(m) == "right"
    with padding_side.padding_on(m, "right"):
        assert m.encode(["a b"], pad_to=8)["attention_mask"][0, -1] == 0
    assert m.encode(["a b"], pad_to=8)["attention_mask"][0, 0] == 0 and m.tokenizer.padding_side == "left"


def test_the_side_a_batch_is_padded_on_is_read_from_its_mask():
    """Rule: the other side is tried only where flipping the tokenizer moves the padding (a declaration that builds
    its batches another way gives no other side to try, rather than a try that tried nothing)."""
    m = registry.LoadedModel("t", registry.TOKEN_CLASSIFIER, SequenceNormTagger(), "test", tokenizer=_tokenizer("left"))
    texts = ["a b", "a much longer text than the other one"]
    assert padding_side.lands_on(m, m.encode(texts, pad_to=16), "left")
    assert not padding_side.lands_on(m, m.encode(texts, pad_to=16), "right")
    with padding_side.padding_on(m, "right"):
        assert padding_side.lands_on(m, m.encode(texts, pad_to=16), "right")
