"""Real requests as a server meets them: each text tokenized to its own length, no bucketing.

    >>> from portkit import models
    >>> from portkit.corpora import corpus, requests
    >>> m = models.load("minilm")
    >>> stream = requests.make_requests(m, corpus.load_corpus(), n=100)   # 100 requests, each at its own length
    >>> stream.shapes()[:3], len(stream.ahead)       # shapes run, and the stream's later shapes (not run)
    >>> stream.padded(64)                            # the same requests, padded to one fixed length

Stage 2 streams these through the compiled model (portkit/stages/compile/fixed_shape.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Requests:
    """Real inputs as a server meets them: each request tokenized to its own length, no bucketing.
    `ahead` holds the shapes of the requests that follow in the same stream (tokenized, not run)."""
    texts: list[list[str]]
    inputs: list[dict[str, torch.Tensor]]
    source: str
    model: object = field(repr=False, default=None)
    ahead: list[list[int]] = field(default_factory=list)

    def shapes(self) -> list[list[int]]:
        """Each request's (batch, length along the varying dimension); a fixed-shape model's whole shape."""
        dim = self.model.seq_dim if self.model is not None else None
        if dim is None:
            return [list(next(iter(x.values())).shape) for x in self.inputs]
        decl = self.model.declaration
        return [[decl.rows(x), decl.size_of(x, dim)] for x in self.inputs]

    def fixed_size(self, seq_len: int) -> int | None:
        """The one length every request is padded to for a single compiled shape: seq_len for text (its
        tokens), the longest request of the whole stream along any other varying dimension (no request is
        cut), None for a model that takes one shape."""
        dim = self.model.seq_dim
        if dim is None:
            return None
        if dim == "tokens":
            return seq_len
        return max(shape[1] for shape in self.shapes() + self.ahead)

    def padded(self, seq_len: int) -> list[dict[str, torch.Tensor]]:
        """The same requests padded (or truncated) to one fixed length along the varying dimension."""
        if self.model.seq_dim is None:
            return self.inputs
        return [self.model.encode(group, pad_to=seq_len) for group in self.texts]

    def to_dict(self) -> dict:
        return {"source": self.source, "count": len(self.inputs), "shapes": self.shapes(),
                "stream_shapes": self.shapes() + self.ahead}

    def __str__(self) -> str:
        shapes = self.shapes()
        return (f"{len(shapes)} requests from {self.source}, {len(set(map(tuple, shapes)))} distinct shapes: "
                + ", ".join("x".join(map(str, s)) for s in shapes))


def make_requests(model, corpus, n: int = 6, batch_size: int = 1, max_tokens: int = 64, seed: int = 0,
                  horizon: int = 1000) -> Requests:
    """n requests of batch_size texts from the corpus, each padded only to its own longest text; the
    stream goes on to `horizon` requests whose shapes are kept (not run) to project a longer storm."""
    total = max(n, horizon)
    if corpus is None and not model.takes_text:
        from portkit.corpora import images
        crops = images.sample_images(n * batch_size, model.image_size, seed)
        inputs = [model.encode(crops[i * batch_size:(i + 1) * batch_size]) for i in range(n)]
        shape = list(inputs[0]["pixel_values"].shape)
        return Requests([[] for _ in inputs], inputs, "image crops", model, [shape] * (total - n))
    texts = corpus.sample(total * batch_size, seed)
    groups = [texts[i * batch_size:(i + 1) * batch_size] for i in range(total)]
    dim = model.seq_dim
    if dim is None:     # a fixed shape: every request the same shape, built by the declaration
        inputs = [model.encode(group) for group in groups[:n]]
        shape = list(next(iter(inputs[0].values())).shape)
        return Requests(groups[:n], inputs, corpus.name, model, [shape] * (total - n))
    # max_tokens caps a text model's tokens; any other varying dimension is capped at the model's maximum
    limit = min(max_tokens, model.max_length) if dim == "tokens" else model.max_length
    inputs = [model.encode(group, max_length=limit) for group in groups[:n]]
    rest = texts[n * batch_size:]
    lengths = [min(count, limit) for count in model.token_lengths(rest)] if rest else []
    ahead = [[len(g), max(lengths[i * batch_size:(i + 1) * batch_size])] for i, g in enumerate(groups[n:])]
    return Requests(groups[:n], inputs, f"{corpus.name} (at most {limit} {dim})", model, ahead)
