"""Advice that was tried, for the padding side: where a bucket fails only padded (its texts pass at their own length),
stage 4 pads it on the side the tokenizer does not pad on and runs it again on the same target side and precision,
and the padding finding says "tried: passes" (pad on that side) or "tried: still fails" (exact-length batches).
Stage 3's padding check pads on the side the model's own batches are padded on, and tries the other side by the same
rule (portkit/models/padding_side.py, the one owner)."""
import pytest
import torch
from torch import nn

from portkit.models import registry
from portkit.core import grading
from portkit.core.findings import PADDING_CAUSE
from portkit.stages.accuracy import stage
from portkit.corpora.corpus import example_batch, make_trace
from portkit.models import padding_side
from portkit.planning import economics
from portkit.stages.buckets import bucketed
from portkit.stages.buckets.stage import Replay, plan_buckets, replay_targets

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


RUNS: dict = {}      # (stage, module class, side) -> its result, so that a later test reuses an earlier run


def _padding_finding(module: nn.Module, side: str, corpus):
    key = ("accuracy", type(module), side)
    if key not in RUNS:
        RUNS[key] = _stage4(module, side, corpus)
    return RUNS[key]


def _stage4(module: nn.Module, side: str, corpus):
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
    # the stage's suggestions say the same, from the same tries, never an untried "check the mask"
    bucket = [s for s in tpu.suggestions if s.startswith("bucket ")]
    assert bucket and all("tried: its texts pass at their own length" in s and "pad on the right" in s
                          for s in bucket), tpu.suggestions
    assert not any("check that the model masks" in s for s in tpu.suggestions)


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


def _stage3(module: nn.Module, side: str, corpus):
    """Stage 3's replay of buckets [8, 32] on the emulated TPU with the padding check: its TargetBuckets."""
    key = ("buckets", type(module), side)
    if key not in RUNS:
        RUNS[key] = _replay(module, side, corpus)
    return RUNS[key]


def _replay(module: nn.Module, side: str, corpus):
    m = registry.LoadedModel("padding-side test", registry.TOKEN_CLASSIFIER, module.eval(), "test model",
                             tokenizer=_tokenizer(side))
    trace = make_trace(corpus, m, 6, seed=1)
    plans = {"tpu": plan_buckets([8, 32], "optimal", k=2)}
    t = replay_targets(m, trace, [], plans, {"tpu": economics.neuron_estimate(10**6)},
                               replay=Replay(progress=False))["tpu"]
    assert m.tokenizer.padding_side == side            # the try leaves the tokenizer's own side as it was
    return m, t


@pytest.mark.parametrize("module", [SlotCountingDecoder, TinyGPT2Tagger], ids=["built", "gpt2"])
def test_stage_3_checks_a_left_padding_decoder_left_padded_and_tries_the_right(module, corpus):
    """Rule (stage 3's padding check is honest about the side; advice that was tried): a decoder whose tokenizer pads
    on the left is bucketed and padding-checked left-padded, as its batches are, where its positions move: the check
    fails (right padding alone had passed it). The right side, tried on the same shapes, passes, so the padding
    finding (work, the cause stage 4 names) says to pad on the right and that it was tried. Pinned on a model built
    for it and on GPT-2 at tiny size."""
    m, t = _stage3(module(), "left", corpus)
    (run,) = [r for r in t.runs if r.plan]
    assert run.padding_ok is False and all(c["side"] == "left" for c in run.padding_checks)
    failed = [c for c in run.padding_checks if c["ok"] is False]
    assert failed and all(c["other_side"] == {"side": "right", "ok": True, "failures": []} for c in failed)
    assert run.compiles_after_warmup == 0        # the other side's try has the bucket's shapes: no compile
    assert "padding check FAILED (padded on the left, as the model's batches are)" in t.summary()
    [padding] = [f for f in t.findings() if f["kind"] == "padding"]
    assert padding["severity"] == grading.severity("padding") and padding["cause"] == PADDING_CAUSE
    assert "on the left" in padding["message"] and "pad on the right" in padding["advice"]
    assert "tried:" in padding["advice"] and "exact-length" not in padding["advice"]


def test_stage_3_says_the_other_side_still_fails_where_padding_fails_on_either(corpus):
    """Rule (advice that was tried: a padding side, stage 3): a model that normalises over the whole sequence fails
    its padding check on the right and, tried, on the left: the advice stays exact-length batches and says so."""
    _, t = _stage3(SequenceNormTagger(), "right", corpus)
    [padding] = [f for f in t.findings() if f["kind"] == "padding"]
    assert "exact-length" in padding["advice"] and "tried: padding on the left still fails" in padding["advice"]
    assert padding["occurrences"]["tried"] and not any(x["passed"] for x in padding["occurrences"]["tried"])


def test_the_bucketed_model_pads_on_the_side_the_models_batches_are_padded_on():
    """Rule: stage 3 pads a bucket where the model's own batches hold their padding (read from the declaration's
    mask), real positions read back from that side; a right-padding tokenizer keeps the right."""
    plan = plan_buckets([8, 32], "optimal", k=2)
    for side in ("left", "right"):
        m = registry.LoadedModel("t", registry.TOKEN_CLASSIFIER, SlotCountingDecoder().eval(), "test",
                                 tokenizer=_tokenizer(side))
        bm = bucketed.BucketedModel(m, plan, backend="portkit_tpu")
        assert bm.side == side and padding_side.pads_on(m, ["a b", "a longer text"]) == side
        padded, rows, length = bm.pad(m.encode(["a b c"]))
        mask = padded["attention_mask"][0]
        assert int(mask.sum()) == length and bool(mask[-1 if side == "left" else 0])
        out = bm.unpad(bm.run_padded(padded), rows, length)["logits"]
        assert out.shape[1] == length


def test_stage_3_and_4s_padding_findings_on_gpt2_are_one_cause_with_one_advice(corpus):
    """Rule (one cause, one finding, with every stage's evidence): tiny GPT-2 padded on the left fails stage 3's
    padding check and stage 4's buckets; both name the padding cause and, having tried the right, the same fix, so
    the report lists one finding found by stages buckets and accuracy, its advice the tried one."""
    from portkit.core import findings
    from portkit.stages.report.stage import merge_causes
    _, buckets_tpu = _stage3(TinyGPT2Tagger(), "left", corpus)
    accuracy_tpu, _ = _padding_finding(TinyGPT2Tagger(), "left", corpus)
    found = [("buckets", f) for f in buckets_tpu.findings() if f["kind"] == "padding"]
    found += [("accuracy", f.to_dict()) for f in accuracy_tpu.findings() if f.kind == "padding"]
    assert [s for s, _ in found] == ["buckets", "accuracy"]
    rows = [{"stage": s, "severity": f["severity"], "kind": f["kind"], "message": f["message"], "advice": f["advice"],
             "consequence": "", "where": "", "owner": "", "cause": findings.cause_of(f), "stages": [s]}
            for s, f in found]
    [merged] = merge_causes(rows)
    assert merged["stages"] == ["buckets", "accuracy"] and len(merged["evidence"]) == 2
    assert all("pad on the right" in f["advice"] and "tried:" in f["advice"] for _, f in found)
