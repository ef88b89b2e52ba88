"""portkit.training: a real training step (the model's own loss, AdamW) and its compiled form."""
import pytest
import torch

from portkit import models, training
from portkit.errors import BadParameter


@pytest.fixture(scope="module")
def gpt2():
    return models.load("gpt2")


def _decreases(run, distinct: int) -> bool:
    """Each batch's loss is lower on its last visit than on its first (batches cycled)."""
    first, last = run.losses[:distinct], run.losses[-distinct:]
    return all(b < a for a, b in zip(first, last))


def test_loss_decreases_for_minilm_contrastive(minilm, corpus):
    batches = training.batches(minilm, corpus, steps=2, batch_size=4, seq_len=32)
    run = training.train(minilm, batches * 3, lr=1e-4)
    assert run.loss.startswith("in-batch contrastive") and len(run.losses) == 6
    assert _decreases(run, 2), run.losses
    assert set(run.grad_norms[0]) >= {"encoder.encoder.layer.0.attention.self.query",
                                      "encoder.embeddings.word_embeddings"}
    # the loaded model is never changed by training
    assert all(p.grad is None for p in minilm.module.parameters())


def test_loss_decreases_for_causal_lm_packed(gpt2, corpus):
    batches = training.batches(gpt2, corpus, steps=2, batch_size=2, seq_len=32, layout="packed")
    assert all(int(b["attention_mask"].sum()) == 64 for b in batches)
    run = training.train(gpt2, batches * 4, lr=1e-3)
    assert run.loss == "next-token cross-entropy" and _decreases(run, 2), run.losses
    norms = run.grad_norms[0]
    assert norms["model.transformer.h.0.attn.c_attn"] > 0 and all(v >= 0 for v in norms.values())


def test_packing_fills_every_slot(gpt2, corpus):
    found = training.tokens_per_step(gpt2, corpus, batch_size=4, seq_len=64, steps=2)
    assert found["packed_tokens_per_step"] == 4 * 64 > found["padded_tokens_per_step"] > 0
    assert found["packed_over_padded"] == pytest.approx(256 / found["padded_tokens_per_step"])


def test_bad_training_input_names_the_value(gpt2, corpus):
    with pytest.raises(BadParameter, match="unknown layout 'ragged'; choose one of: padded, packed"):
        training.batches(gpt2, corpus, steps=1, layout="ragged")
    with pytest.raises(BadParameter, match="invalid lr -1"):
        training.train(gpt2, [], lr=-1)
    with pytest.raises(BadParameter, match="unknown model kind for training 'token-classifier'"):
        training.loss_for(models.LoadedModel("x", models.TOKEN_CLASSIFIER, torch.nn.Linear(1, 1), "test"))
