"""A real training step: the model's own loss on real data, AdamW, N steps from the loaded weights.

    >>> from portkit import models
    >>> from portkit.corpora import corpus
    >>> from portkit.workloads import training
    >>> m, texts = models.load("gpt2"), corpus.load_corpus("stdlib")
    >>> batches = training.batches(m, texts, steps=10, batch_size=4, seq_len=64, layout="packed")
    >>> run = training.train(m, batches, lr=1e-3)                        # eager float32, the reference
    >>> tpu = training.train(m, batches, lr=1e-3, target="tpu", compiled=True)  # torch.compile(portkit_tpu)

The loss is the model's own (loss_for): next-token cross-entropy for causal LMs; for embedding models an
in-batch contrastive loss (sentence-transformers' multiple-negatives ranking loss) over each text's first
paragraph against the rest; teacher-forced reconstruction for seq2seq; or the `loss` a user's LoadedModel
declares. Other kinds are refused, naming them. Every run starts from a copy of the loaded weights with
dropout off, so runs under different numerics see the same batches and differ only by the numerics: under a
target, numerics.emulate applies to the forward pass, the backward pass and the optimizer step alike (an
all-ops bf16 setting also rounds the weights' updates). With compiled=True the forward pass and loss go
through torch.compile with the target's emulated backend (portkit/targets/backends.py); the optimizer step
stays eager.
"""
from __future__ import annotations

import contextlib
import copy
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from portkit.core import torch_private
from portkit.targets import privateuse1_ops
from portkit.targets import numerics
from portkit.core import progress
from portkit.targets import specs
from portkit.core.errors import BadParameter
from portkit.models.registry import CAUSAL_LM, EMBEDDING, SEQ2SEQ_LM

LAYOUTS = ("padded", "packed")
CONTRASTIVE_SCALE = 20.0   # sentence-transformers MultipleNegativesRankingLoss default (cosine * 20)
MIN_WORDS = 3              # each side of a contrastive pair


# ---------------------------------------------------------------- losses
def _next_token(module: nn.Module, batch: dict) -> torch.Tensor:
    logits = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    labels, keep = batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:].to(logits.dtype)
    losses = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten(), reduction="none")
    return (losses * keep.flatten()).sum() / keep.sum().clamp(min=1)


def _reconstruction(module: nn.Module, batch: dict) -> torch.Tensor:
    logits = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    keep = batch["attention_mask"].to(logits.dtype).flatten()
    losses = nn.functional.cross_entropy(logits.flatten(0, 1), batch["input_ids"].flatten(), reduction="none")
    return (losses * keep).sum() / keep.sum().clamp(min=1)


def _contrastive(module: nn.Module, batch: dict) -> torch.Tensor:
    anchors = module(**{k[len("anchor_"):]: v for k, v in batch.items() if k.startswith("anchor_")})["embedding"]
    positives = module(**{k[len("positive_"):]: v for k, v in batch.items() if k.startswith("positive_")})["embedding"]
    scores = nn.functional.normalize(anchors, dim=-1) @ nn.functional.normalize(positives, dim=-1).T
    labels = torch.arange(scores.shape[0], device=scores.device)
    return nn.functional.cross_entropy(scores * CONTRASTIVE_SCALE, labels)


LOSSES: dict[str, tuple[str, Callable]] = {
    CAUSAL_LM: ("next-token cross-entropy", _next_token),
    EMBEDDING: (f"in-batch contrastive (multiple-negatives ranking, scale {CONTRASTIVE_SCALE:g}), first paragraph "
                "against the rest", _contrastive),
    SEQ2SEQ_LM: ("teacher-forced reconstruction cross-entropy", _reconstruction),
}


def loss_for(model) -> tuple[str, Callable]:
    """(description, loss(module, batch) -> scalar) for `model`: its factory's own, else its kind's."""
    declared = getattr(model, "loss", None)
    if declared is not None:
        return getattr(declared, "__doc__", None) or "the loss the model's factory declares", declared
    if model.kind not in LOSSES:
        raise BadParameter("model kind for training", model.kind, LOSSES,
                           hint="or declare `loss` on the LoadedModel your factory returns")
    return LOSSES[model.kind]


class WithLoss(nn.Module):
    """The model and its loss as one module: what a compiled training step captures whole."""

    def __init__(self, module: nn.Module, loss: Callable):
        super().__init__()
        self.model, self.loss = module, loss

    def forward(self, **batch):
        return self.loss(self.model, batch)


# ---------------------------------------------------------------- real batches, padded or packed
def _pair(text: str) -> tuple[str, str] | None:
    head, sep, rest = text.partition("\n\n")
    if not sep:
        words = text.split()
        head, rest = " ".join(words[:len(words) // 2]), " ".join(words[len(words) // 2:])
    head, rest = head.strip(), rest.strip()
    return (head, rest) if min(len(head.split()), len(rest.split())) >= MIN_WORDS else None


def _check(steps: int, batch_size: int, seq_len: int, layout: str, model) -> None:
    for name, value in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadParameter(name, value, hint="must be a positive whole number")
    if layout not in LAYOUTS:
        raise BadParameter("layout", layout, LAYOUTS)
    if seq_len > model.max_length:
        raise BadParameter("seq_len", seq_len, hint=f"{model.name} takes at most {model.max_length} tokens")
    if not model.takes_text:
        raise BadParameter("model kind for training", model.kind, LOSSES, hint="training batches are text")


def _packed_rows(model, texts: list[str], rows: int, seq_len: int) -> tuple[torch.Tensor, int]:
    """Rows of seq_len tokens filled with whole texts one after another, each closed by the tokenizer's
    separator (GPT-style packing: a row's texts attend to one another). Returns (ids, texts used)."""
    tok = model.tokenizer
    sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    stream, used = [], 0
    for ids in tok(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        stream.extend([*ids, sep])
        used += 1
        if len(stream) >= rows * seq_len:
            break
    if len(stream) < rows * seq_len:
        raise BadParameter("corpus", model.name, hint=f"too few tokens to pack {rows} rows of {seq_len}")
    return torch.tensor(stream[:rows * seq_len]).view(rows, seq_len), used


def batches(model, corpus, steps: int, batch_size: int = 8, seq_len: int = 128, layout: str = "padded",
            seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`steps` batches of real text for `model`'s loss, every one of the same shapes (static shapes, as
    both targets compile): texts padded or cut to seq_len one a row (layout "padded"), or packed into
    full rows ("packed"; language models only). An embedding model's batch is batch_size pairs."""
    _check(steps, batch_size, seq_len, layout, model)
    texts = list(corpus.sample(min(len(corpus), steps * batch_size * 8), seed))
    if model.kind == EMBEDDING and getattr(model, "loss", None) is None:
        if layout == "packed":
            raise BadParameter("layout", layout, ["padded"], hint="contrastive pairs are one text a row")
        pairs = [p for p in map(_pair, texts) if p][:steps * batch_size]
        if len(pairs) < steps * batch_size:
            raise BadParameter("corpus", corpus.name, hint=f"{len(pairs)} texts split into two parts of "
                               f"{MIN_WORDS}+ words; {steps * batch_size} needed")
        out = []
        for s in range(steps):
            chunk = pairs[s * batch_size:(s + 1) * batch_size]
            anchor = model.encode([a for a, _ in chunk], pad_to=seq_len)
            positive = model.encode([b for _, b in chunk], pad_to=seq_len)
            out.append({**{f"anchor_{k}": v for k, v in anchor.items()},
                        **{f"positive_{k}": v for k, v in positive.items()}})
        return out
    if layout == "packed":
        ids, _ = _packed_rows(model, texts, steps * batch_size, seq_len)
        return [{"input_ids": rows, "attention_mask": torch.ones_like(rows)} for rows in ids.split(batch_size)]
    if len(texts) < steps * batch_size:
        raise BadParameter("corpus", corpus.name, hint=f"{len(texts)} texts; {steps * batch_size} needed")
    return [model.encode(texts[s * batch_size:(s + 1) * batch_size], pad_to=seq_len) for s in range(steps)]


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens of real text in a batch (its attention masks' ones; padding excluded)."""
    return int(sum(v.sum() for k, v in batch.items() if k.endswith("attention_mask")))


def tokens_per_step(model, corpus, batch_size: int = 8, seq_len: int = 128, steps: int = 16,
                    seed: int = 0) -> dict:
    """Real (non-padding) tokens per step with texts padded one a row against packed rows, at the same
    batch shape (one compile either way): what packing buys a static-shape training step."""
    _check(steps, batch_size, seq_len, "padded", model)
    texts = list(corpus.sample(min(len(corpus), steps * batch_size * 8), seed))
    padded = sum(real_tokens(model.encode(texts[s * batch_size:(s + 1) * batch_size], pad_to=seq_len))
                 for s in range(steps)) / steps
    _, used = _packed_rows(model, texts, steps * batch_size, seq_len)
    slots = batch_size * seq_len
    return {"batch_size": batch_size, "seq_len": seq_len, "steps": steps, "slots_per_step": slots,
            "padded_tokens_per_step": padded, "packed_tokens_per_step": slots,
            "padded_fill": padded / slots, "packed_texts_per_step": used / steps,
            "padded_texts_per_step": batch_size, "packed_over_padded": slots / padded if padded else math.inf}


def layouts(model, corpus, boundaries, batch_size: int = 8, seq_len: int = 128, steps: int = 16,
            seed: int = 0) -> list[dict]:
    """Three ways to lay real texts out for static-shape training steps, on the same texts: packed rows of
    seq_len (one shape, every slot a token; causal LMs), each batch padded to seq_len (one shape), and each
    batch padded to the bucket of its longest text (`boundaries`: stage 3's plan; one shape per bucket used).
    Per layout: compiles (shapes), real tokens per step, and the fill (real / computed positions)."""
    _check(steps, batch_size, seq_len, "padded", model)
    texts = list(corpus.sample(min(len(corpus), steps * batch_size * 8), seed))
    groups = [texts[s * batch_size:(s + 1) * batch_size] for s in range(steps)]
    counted = [[min(len(x), seq_len) for x in model.tokenizer(g, verbose=False)["input_ids"]] for g in groups]
    edges = sorted({min(int(b), seq_len) for b in boundaries} | {seq_len})
    buckets = [next(b for b in edges if b >= max(c)) for c in counted]
    real = sum(map(sum, counted)) / steps
    rows = [{"layout": f"padded to seq_len {seq_len}", "compiles": 1, "tokens_per_step": real,
             "fill": real / (batch_size * seq_len)},
            {"layout": f"padded to stage 3's buckets {edges}", "compiles": len(set(buckets)), "tokens_per_step": real,
             "fill": real * steps / sum(b * batch_size for b in buckets)}]
    if model.kind == CAUSAL_LM:      # packing joins texts in a row: a language model's next-token loss
        rows.insert(0, {"layout": f"packed rows of {seq_len}", "compiles": 1, "tokens_per_step": batch_size * seq_len,
                        "fill": 1.0})
    return rows


# ---------------------------------------------------------------- the training loop
@dataclass
class TrainingRun:
    """Loss and per-layer gradient norms of N AdamW steps under one setting (target numerics or fp32)."""
    model: str
    loss: str                              # what the loss is
    target: str                            # "fp32" for the reference, else the target's name
    precision: str
    mode: str                              # "reference" (CPU float32) or "emulated"
    runs: str                              # "eager" or the compile backend's name
    lr: float
    batch: dict                            # shapes of one batch
    losses: list[float] = field(default_factory=list)
    grad_norms: list[dict[str, float]] = field(default_factory=list)   # per step: layer -> norm
    graphs: list[int] = field(default_factory=list)   # compiled: training graphs compiled by each step's end
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"model": self.model, "loss": self.loss, "target": self.target, "precision": self.precision,
                "mode": self.mode, "runs": self.runs, "lr": self.lr, "batch": self.batch, "steps": len(self.losses),
                "losses": self.losses, "grad_norms": self.grad_norms, "graphs": self.graphs,
                "seconds": self.seconds}

    def __str__(self) -> str:
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (math.nan, math.nan)
        graphs = (f", {self.graphs[0]} graph(s) at step 0, {self.graphs[-1] - self.graphs[0]} recompile(s) after"
                  if self.graphs else "")
        return (f"{self.model} training ({self.loss}), {self.target} {self.precision} [{self.mode}, {self.runs}]: "
                f"{len(self.losses)} AdamW steps, lr {self.lr:g}, loss {first:.4f} -> {last:.4f}{graphs}, "
                f"{self.seconds:.1f} s")


def layers(module: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The layers gradient norms are reported for: each module that holds parameters of its own, by path."""
    found = {}
    for name, sub in module.named_modules():
        own = [p for p in sub.parameters(recurse=False) if p.requires_grad]
        if own:
            found[name or "(root)"] = own
    return found


def grad_norms(module: nn.Module) -> dict[str, float]:
    """The L2 norm of each layer's gradients (all of its own parameters together)."""
    with torch_private.no_dispatch_modes(), torch.no_grad():
        return {name: math.hypot(*(float(torch.linalg.vector_norm(p.grad)) for p in params if p.grad is not None))
                for name, params in layers(module).items()}


class TrainingStep:
    """One AdamW step on a copy of `model`'s loaded weights per call: step(batch) -> (loss, per-layer
    gradient norms, or None with norms=False). target=None: the float32 CPU reference. With a target:
    its numerics (numerics.emulate, `precision` or the target's default) over forward, backward and
    optimizer. compiled=True compiles the model with its loss using the target's emulated backend (or
    the backend given: a name such as "inductor", or a backend object); the optimizer step runs eagerly."""

    def __init__(self, model, lr: float = 1e-4, target: str | None = None, precision: str | None = None,
                 compiled=False, weight_decay: float = 0.01):
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
            raise BadParameter("lr", lr, hint="must be a positive number")
        self.loss, loss = loss_for(model)
        self.module = copy.deepcopy(model.module).eval()   # dropout off: runs differ only by their numerics
        for p in self.module.parameters():
            p.requires_grad_(True)
        self.step_module: nn.Module = WithLoss(self.module, loss)
        self.mode, self.runs, self.precision, self.compiled = None, "eager", "fp32", bool(compiled)
        self.backend = None
        if target is not None:
            self.mode = numerics.emulate(specs.get(target), precision)
            self.precision = self.mode.precision.name
        if compiled:
            from portkit.targets import backends  # torch machinery beside this module; imported when compiling
            backend = backends.emulated_backend(target or "cpu", precision) if compiled is True else compiled
            self.runs = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
            self.backend = backend
            self.step_module = torch.compile(self.step_module, backend=backend, dynamic=False)
        # One kernel call per parameter (foreach=False): the target's numerics see, and round, every update.
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr, weight_decay=weight_decay, foreach=False)

    @property
    def graphs(self) -> int | None:
        """Training graphs an emulated backend compiled so far (Dynamo's graphs: more than one after the
        first step is a graph break; a rise after it, a recompile across steps); None when not counted."""
        checks = getattr(self.backend, "checks", None)
        return None if checks is None else sum(c.part == "joint" for c in checks)

    def _numerics(self, inside_graph: bool):
        # A compiled step runs the target's numerics inside its graphs, an eager one under the mode;
        # the optimizer step runs eagerly under the mode either way.
        use = self.mode is not None and not (inside_graph and self.compiled)
        return self.mode if use else contextlib.nullcontext()

    def __call__(self, batch: dict[str, torch.Tensor], norms: bool = True) -> tuple[float, dict | None]:
        self.optimizer.zero_grad(set_to_none=True)
        with self._numerics(inside_graph=True):
            value = self.step_module(**batch)
            value.backward()
        found = grad_norms(self.module) if norms else None
        with self._numerics(inside_graph=False):
            self.optimizer.step()
        return float(value.detach()), found


def train(model, batches: list[dict[str, torch.Tensor]], lr: float = 1e-4, target: str | None = None,
          precision: str | None = None, compiled=False, weight_decay: float = 0.01) -> TrainingRun:
    """TrainingStep over every batch in turn: the loss and each layer's gradient norm at every step."""
    step = TrainingStep(model, lr, target, precision, compiled, weight_decay)
    run = TrainingRun(model.name, step.loss, target or "fp32", step.precision, "emulated" if target else "reference",
                      step.runs, float(lr), {k: list(v.shape) for k, v in batches[0].items()} if batches else {})
    start = time.perf_counter()
    try:
        for batch in progress.bar(batches, desc=f"training {model.name} ({run.target} {run.precision}, {run.runs})",
                                  unit="step", leave=False):
            loss, norms = step(batch)
            run.losses.append(loss)
            run.grad_norms.append(norms)
            if step.graphs is not None:
                run.graphs.append(step.graphs)
    finally:
        if compiled:
            torch.compiler.reset()
    run.seconds = time.perf_counter() - start
    return run


# ---------------------------------------------------------------- the ops of a training step, per target
# Training ops that migrations trip on, called out by name (what each is on the target comes from its table).
CALLOUTS = (
    ("fused RNN cell backward", re.compile(r"_thnn_fused_(lstm|gru)_cell_backward|mkldnn_rnn_layer_backward"),
     ("backward",)),
    ("embedding backward", re.compile(r"embedding_(dense_)?backward|_embedding_bag_(dense_)?backward"), ("backward",)),
    ("index_put / scatter in backward", re.compile(r"index_put|scatter|index_add"), ("backward",)),
    ("attention backward", re.compile(r"_scaled_dot_product_\w+_backward"), ("backward",)),
    ("fused optimizer kernel", re.compile(r"_fused_(adam|adamw|sgd|adagrad)_|_foreach_"), ("optimizer",)),
)
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")


class _OpCounter(torch_private.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim":
            self.calls[func.name()] = self.calls.get(func.name(), 0) + 1
        return func(*args, **(kwargs or {}))


@dataclass
class StepOps:
    """The ATen ops of one training step on one target: the compiled forward and backward graphs (the
    emulated backend's checks), the eager optimizer step, each op classified with the target's table."""
    target: str
    model: str
    optimizer: str                 # the AdamW implementation recorded
    graphs: int                    # graphs Dynamo captured (more than one: graph breaks)
    rows: list[dict] = field(default_factory=list)   # phase, op, calls, status, detail, via, callout

    @property
    def callouts(self) -> list[dict]:
        return [r for r in self.rows if r["callout"]]

    def not_lowered(self, phase: str | None = None) -> list[dict]:
        from portkit.targets.specs import CPU_FALLBACK, UNSUPPORTED
        return [r for r in self.rows if r["status"] in (CPU_FALLBACK, UNSUPPORTED) and phase in (None, r["phase"])]

    def to_dict(self) -> dict:
        return {"target": self.target, "model": self.model, "optimizer": self.optimizer, "graphs": self.graphs,
                "rows": self.rows, "callouts": self.callouts}

    def __str__(self) -> str:
        lines = [f"{self.model} training step on {self.target} (emulated): {self.graphs} graph(s), "
                 f"{sum(r['calls'] for r in self.rows)} ATen calls, AdamW {self.optimizer}"]
        lines += [f"  {r['callout']}: {r['op']} ({r['phase']}, {r['calls']} calls): {r['status']}"
                  + (f" via {r['via']}" if r["via"] else "") for r in self.callouts]
        lines += [f"  not lowered: {r['op']} ({r['phase']}): {r['status']}, {r['detail']}"
                  for r in self.not_lowered() if not r["callout"]]
        return "\n".join(lines)


def _callout(op: str, phase: str) -> str | None:
    return next((name for name, pattern, phases in CALLOUTS if phase in phases and pattern.search(op)), None)


def step_ops(model, batch: dict[str, torch.Tensor], target: str, optimizer: str = "fused",
             precision: str | None = None) -> StepOps:
    """Compile one training step of `model` with `target`'s emulated backend, run it once on `batch`
    with an AdamW step (`optimizer`: "fused" kernels, "foreach" kernels or a "for-loop"), and classify
    every ATen op of the forward graph, the backward graph and the optimizer step with the target's op
    table. Recurrent modules, which Dynamo leaves out of its graphs (they run eagerly on the CPU), add
    the fused cell kernels their backward runs on the device (privateuse1_ops.fused_cell_ops)."""
    from portkit.targets import backends
    if optimizer not in OPTIMIZER_IMPLEMENTATIONS:
        raise BadParameter("optimizer implementation", optimizer, OPTIMIZER_IMPLEMENTATIONS)
    t = specs.detect(target)
    backend = backends.emulated_backend(target, precision)
    module = copy.deepcopy(model.module).eval()
    for p in module.parameters():
        p.requires_grad_(True)
    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[optimizer]
    adamw = torch.optim.AdamW(module.parameters(), lr=1e-5, **kind)
    torch.compiler.reset()
    try:
        torch.compile(WithLoss(module, loss_for(model)[1]), backend=backend, dynamic=False)(**batch).backward()
    finally:
        torch.compiler.reset()
    counter = _OpCounter()
    with counter:
        adamw.step()
    calls: dict[tuple[str, str], int] = {}
    for check in backend.checks:
        for op, n in check.ops.items():
            calls[(check.part, op)] = calls.get((check.part, op), 0) + n
    for op, n in counter.calls.items():
        calls[("optimizer", op)] = n
    for sub in module.modules():
        if fused := privateuse1_ops.fused_cell_ops(sub):
            op = fused[2]
            calls[("backward", op)] = calls.get(("backward", op), 0) + 1
    found = StepOps(target, model.name, optimizer, sum(c.part == "joint" for c in backend.checks))
    for (phase, op), n in sorted(calls.items()):
        cls = t.op_table.classify(op, compiled=phase != "optimizer")
        found.rows.append({"phase": phase, "op": op, "calls": n, "status": cls.status, "detail": cls.detail,
                           "via": cls.via, "callout": _callout(op, phase)})
    return found
