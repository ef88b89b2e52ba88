"""portkit.workloads.training: a real training step (the model's own loss, AdamW) and its compiled form."""
import pytest
import torch

from portkit.models import registry
from portkit.targets import numerics
from portkit.targets import specs
from portkit.targets import tolerance
from portkit.workloads import training
from portkit.core.errors import BadParameter


def _decreases(run, distinct: int) -> bool:
    """Each batch's loss is lower on its last visit than on its first (batches cycled)."""
    first, last = run.losses[:distinct], run.losses[-distinct:]
    return all(b < a for a, b in zip(first, last))


def test_loss_decreases_for_minilm_contrastive(minilm, corpus):
    batches = training.batches(minilm, corpus, steps=2, batch_size=4, seq_len=24)
    run = training.train(minilm, batches * 2, lr=1e-4)
    assert run.loss.startswith("in-batch contrastive") and len(run.losses) == 4
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
        training.loss_for(registry.LoadedModel("x", registry.TOKEN_CLASSIFIER, torch.nn.Linear(1, 1), "test"))


def _own_loss(module, batch):
    """sum of squared outputs"""
    return next(iter(module(**batch).values())).square().mean()


def _matches_eager(model, batches, target, precision, lr=1e-3):
    """A step compiled with the target's emulated backend against eager under its numerics, within the
    precision's tolerance; both apart from the fp32 reference (the target's rounding reached backward)."""
    eager = training.train(model, batches, lr=lr, target=target, precision=precision)
    compiled = training.train(model, batches, lr=lr, target=target, precision=precision, compiled=True)
    assert compiled.runs == f"portkit_{target}" and eager.runs == "eager"
    assert compiled.graphs == [1] * len(batches) and not eager.graphs   # one graph, no recompile across steps
    tol = tolerance.tolerance_for(numerics.emulate(specs.get(target), precision).precision)
    assert tol.check(torch.tensor(compiled.losses), torch.tensor(eager.losses)) is None
    for step in range(len(batches)):
        names = sorted(eager.grad_norms[step])
        assert tol.check(torch.tensor([compiled.grad_norms[step][n] for n in names]),
                         torch.tensor([eager.grad_norms[step][n] for n in names])) is None
    reference = training.train(model, batches[:1], lr=lr)
    assert reference.grad_norms[0] != compiled.grad_norms[0]


def test_a_compiled_training_step_matches_eager_under_tpu_numerics_on_gpt2(gpt2, corpus):
    _matches_eager(gpt2, training.batches(gpt2, corpus, steps=2, batch_size=2, seq_len=16, layout="packed"),
                   "tpu", None)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.proj = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 16)

    def forward(self, input_ids, attention_mask):
        return {"logits": self.proj(self.embed(input_ids % 100)) * attention_mask.unsqueeze(-1)}


def test_a_compiled_training_step_matches_eager_under_neuron_matmult(gpt2, corpus):
    tiny = registry.LoadedModel("tiny", registry.CAUSAL_LM, _Tiny(), "test", gpt2.tokenizer, loss=_own_loss)
    _matches_eager(tiny, training.batches(tiny, corpus, steps=2, batch_size=2, seq_len=16), "neuron", "matmult")


class _Gather(torch.nn.Module):
    """An embedding read at each row's last real token: embedding_dense_backward and index_put in backward."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)

    def forward(self, input_ids, attention_mask):
        hidden = self.embed(input_ids % 100)
        return {"embedding": hidden[torch.arange(hidden.shape[0]), attention_mask.sum(1) - 1]}


def test_training_step_ops_call_out_backward_and_optimizer_kernels(gpt2):
    tokens = gpt2.encode(["Return the sum of a and b.", "Sum."], pad_to=8)
    gather = registry.LoadedModel("gather", registry.EMBEDDING, _Gather(), "test", gpt2.tokenizer, loss=_own_loss)
    lstm = registry.load("lstm")
    lstm.loss = _own_loss
    for target in ("neuron", "tpu"):
        found = training.step_ops(gather, tokens, target)
        kinds = {(r["callout"], r["op"]) for r in found.callouts}
        assert ("embedding backward", "aten::embedding_dense_backward") in kinds
        assert any(k == "index_put / scatter in backward" for k, _ in kinds), kinds
        assert ("fused optimizer kernel", "aten::_fused_adamw_") in kinds
        rnn = [r for r in training.step_ops(lstm, tokens, target, optimizer="foreach").callouts
               if r["callout"] == "fused RNN cell backward"]
        assert [r["op"] for r in rnn] == ["aten::_thnn_fused_lstm_cell_backward_impl"]
        assert rnn[0]["status"] == ("unsupported" if target == "neuron" else "native")   # the vendors' tables
    assert "embedding backward: aten::embedding_dense_backward (backward, 1 calls): native" in str(found)


def test_functional_forms_of_in_place_writes_are_judged_as_the_write_under_compile():
    # AOTAutograd writes T5's in-place `shifted[..., 1:] = ids[..., :-1]` as slice_scatter in a training graph
    table = specs.detect("neuron").op_table
    compiled = table.classify("aten::slice_scatter", compiled=True)
    assert (compiled.status, compiled.via) == (table.classify("aten::copy_").status, "aten::copy_")
    assert table.classify("aten::slice_scatter").status == "unsupported"   # eager: the vendor's table as it is


def test_packing_against_padding_to_seq_len_and_to_buckets_on_real_texts(gpt2, minilm, corpus):
    from portkit.stages.buckets import stage
    from portkit.planning.planner import BucketPlan
    plan = BucketPlan("auto", (16, 48, 128), 0, 0, 1, "truncate", "test")
    rows = stage.training_layouts(gpt2, corpus, {"tpu": plan}, batch_size=4, seq_len=128)["tpu"]
    packed, padded, bucketed = rows
    assert packed["compiles"] == padded["compiles"] == 1 and packed["fill"] == 1.0
    assert packed["tokens_per_step"] == 4 * 128 > padded["tokens_per_step"] == bucketed["tokens_per_step"] > 0
    assert 1 <= bucketed["compiles"] <= 3 and padded["fill"] <= bucketed["fill"] < 1.0
    assert "buckets [16, 48, 128]" in bucketed["layout"]
    embedding = training.layouts(minilm, corpus, (128,), batch_size=4, seq_len=128)
    assert [r["layout"] for r in embedding] == ["padded to seq_len 128", "padded to stage 3's buckets [128]"]
