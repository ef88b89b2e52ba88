"""A model's input contract: what it takes, how a batch is built from data items, how long each item is
along each dimension that varies with the data, and which outputs are compared with which metric.

Every stage works from this declaration alone, so a model of any modality runs through the same workbook:
stages 1 and 2 run batches built from real items, stage 3 fits buckets to each varying dimension's real
distribution, stage 3b compiles each bucket's shapes, stage 4 compares each declared output with its own
metric. Text and image models are two instances (`text_declaration`, `image_declaration`); a user's factory
may return a `models.LoadedModel` carrying its own declaration:

    >>> from portkit.models import inputs
    >>> decl = inputs.Declaration(inputs=(...), dims=(inputs.Dim("batch", batch=True),
    ...     inputs.Dim("samples", varies=True, max=160_000)), build=build, measure=measure, outputs=(...), ...)
    >>> decl.batch(waves, sizes={"samples": 1024})      # every varying dim padded (or cut) to the bucket

Rules: `build(items, sizes)` pads or cuts every varying dim to exactly `sizes[dim]`; `measure(items)` gives
each item's length along every varying dim; a varying `Dim` needs `max`. Both receive, by `data`: TEXT, texts;
IMAGE, float32 HxWxC arrays in [0, 1] (C: the `channels` dim, RGB or BT.601 luminance); AUDIO, 1-D float32
waveforms at `sample_rate` (required), each recording decoded once for both (portkit/corpora/audio.py), an
own_items() item that is not a recording as it is. A declaration that cannot mean anything raises BadParameter
naming the value. Moved names keep a warning alias (docs/changelog.md); docs/guides/declaring-a-model.md.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from portkit.corpora import audio, images
from portkit.core.errors import BadParameter

# Metric kinds: the keys of portkit.stages.accuracy.comparison.TASK_METRICS (each output is compared with its own).
EMBEDDING, CAUSAL_LM, SEQ2SEQ_LM, IMAGE_CLASSIFIER, TOKEN_CLASSIFIER = (
    "embedding", "causal-lm", "seq2seq-lm", "image-classifier", "token-classifier")
CLASSIFIER = "classifier"        # one label per item (a clip, a row): top-1 agreement, like an image classifier
PITCH = "pitch"                  # per frame (cents, confidence): cents error on voiced frames, voicing agreement
PROBABILITY = "probability"      # a probability per item or frame: absolute error, decision agreement at a threshold
WAVEFORM = "waveform"            # audio samples: SNR and SI-SDR in dB
CODES = "codes"                  # discrete tokens (VQ codes, CTC labels): code agreement
DETECTION = "detection"          # (batch, queries, classes) class logits per query: top-1 agreement per query
BOXES = "boxes"                  # (batch, queries, 4) boxes (cx, cy, w, h) in [0, 1]: IoU with the reference's box
SEGMENTATION = "segmentation"    # (batch, classes, height, width) logits: agreement of the argmax map, per pixel
# A PROBABILITY output's decision: the positive side from 0.5 on, where a calibrated binary classifier's expected
# cost of either error is equal (the Bayes rule for equal costs); silero-vad's get_speech_timestamps counts a chunk as
# speech at probability >= 0.5 too (src/silero_vad/utils_vad.py). A stream output may declare its own.
DECISION_THRESHOLD = 0.5
# What a model's data items are, and so where the stages draw them from.
TEXT, IMAGE, AUDIO = "text", "image", "audio"
DATA_KINDS = (TEXT, IMAGE, AUDIO)
BATCH = "batch"


@dataclass(frozen=True)
class Dim:
    """A named dimension: the batch, one that varies with the data, or a fixed one."""
    name: str
    size: int | None = None          # a fixed dimension's size
    varies: bool = False             # its size follows each item (tokens, samples, frames)
    batch: bool = False              # the number of items in a batch
    max: int | None = None           # the largest size the model takes along it (required when it varies)
    min: int = 1                     # the smallest size a batch is padded to along it
    label: str | None = None         # how errors name it ("sequence length"); default "<name> length"

    def __post_init__(self):
        if sum((self.size is not None, self.varies, self.batch)) != 1:
            raise BadParameter("dimension", self.name, hint="give exactly one of size=, varies=True, batch=True")
        if self.varies and (self.max is None or self.max < self.min):
            raise BadParameter("varying dimension", self.name, hint="give max=, the largest size the model takes")

    @property
    def what(self) -> str:
        return self.label or f"{self.name} length"


@dataclass(frozen=True)
class TensorSpec:
    """One input tensor: its name, dtype, dims by name (each a Dim of the declaration), padding value."""
    name: str
    dtype: torch.dtype
    dims: tuple[str, ...]
    pad: float | int = 0


@dataclass(frozen=True)
class Output:
    """An output to compare, and the metric kind it is compared with (a TASK_METRICS key).

    An output with fewer positions than its input along the varying dimension (a frame per hop of samples, a code
    per chunk) declares how they follow the input: one output position per `stride` input positions, the first
    reading `window` of them (default: the stride). positions(n), its real positions for n real input positions, is
    then (n - window) // stride + 1, at least 0: torch.nn.Conv1d's L_out with window = dilation * (kernel_size - 1)
    + 1 - 2 * padding (https://pytorch.org/docs/stable/generated/torch.nn.Conv1d.html); torch.stft's frames with
    center=True are window=0 (https://pytorch.org/docs/stable/generated/torch.stft.html). ceil=True counts a partial
    last window too, as a model that pads its input to whole windows does (EnCodec: ceil(n / hop)). Stage 3 slices
    such an output to positions(real length) when it checks padding; the defaults mean one position per input
    position, or whatever stage 3's probe finds."""
    name: str
    metric: str
    stride: int = 1                  # input positions per output position along the varying dimension
    window: int | None = None        # input positions the first output position reads; None: the stride
    ceil: bool = False               # a partial last window gives a position too

    def __post_init__(self):
        if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 1:
            raise BadParameter(f"stride of output {self.name!r}", self.stride,
                               hint="a whole number of input positions per output position, 1 or more")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)):
            raise BadParameter(f"window of output {self.name!r}", self.window,
                               hint="a whole number of input positions (kernel - 2 * padding), or None for the stride")
        if not isinstance(self.ceil, bool):
            raise BadParameter(f"ceil of output {self.name!r}", self.ceil, [True, False])

    @property
    def strided(self) -> bool:
        """Whether it declares anything but one output position per input position."""
        return (self.stride, self.window, self.ceil) != (1, None, False)

    def positions(self, n: int) -> int:
        """Its real positions along the varying dimension for n real input positions (see the class docstring)."""
        return self.count(n, self.stride, self.stride if self.window is None else self.window, self.ceil)

    @staticmethod
    def count(n: int, stride: int, window: int, ceil: bool = False) -> int:
        """Output positions for n input positions at `stride`, the first reading `window`: the one formula."""
        span = n - window
        return max(0, (-(-span // stride) if ceil else span // stride) + 1)


@dataclass(frozen=True)
class Declaration:
    """What a model takes and how to build it from data items; see the module docstring."""
    inputs: tuple[TensorSpec, ...]
    dims: tuple[Dim, ...]
    build: Callable[[list, dict[str, int]], dict[str, torch.Tensor]]
    measure: Callable[[list], Mapping[str, Sequence[int]]]
    outputs: tuple[Output, ...]
    data: str
    masks: Mapping[str, str] = field(default_factory=dict)
    sample_rate: int | None = None   # audio items: samples per second
    item_label: str | None = None    # what the items are called in reports ("texts", "image crops", "spoken words")
    own_items: Callable[[], Sequence] | None = None   # the model's own data: every item (else the run's corpus)

    def __post_init__(self):
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise BadParameter("dimension names", names, hint="each name once")
        for spec in self.inputs:
            unknown = [d for d in spec.dims if d not in names]
            if unknown:
                raise BadParameter(f"dimension of input {spec.name!r}", unknown[0], names)
        if self.data not in DATA_KINDS:
            raise BadParameter("data kind", self.data, DATA_KINDS)
        if not self.outputs:
            raise BadParameter("outputs", self.outputs, hint="name at least one output to compare")
        for dim, name in self.masks.items():
            if dim not in self.varying_names or name not in self.input_names:
                raise BadParameter(f"mask for {dim!r}", name, hint="needs a varying dimension and a declared input")
        if self.data == AUDIO and (isinstance(self.sample_rate, bool) or not isinstance(self.sample_rate, int)
                                   or self.sample_rate <= 0):
            raise BadParameter("sample_rate of an audio declaration", self.sample_rate,
                               hint="give sample_rate=, the samples per second its build and measure take")

    # ------------------------------------------------------------ what it declares
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def varying(self) -> tuple[Dim, ...]:
        """The dimensions that vary with the data (not the batch): what buckets are fitted to."""
        return tuple(d for d in self.dims if d.varies)

    @property
    def varying_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.varying)

    @property
    def fixed_shape(self) -> bool:
        """True when no dimension but the batch varies: one input shape per batch size, nothing to bucket."""
        return not self.varying

    @property
    def primary(self) -> Output:
        return self.outputs[0]

    @property
    def items(self) -> str:
        return self.item_label or {TEXT: "texts", IMAGE: "images", AUDIO: "recordings"}[self.data]

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise BadParameter("dimension", name, [d.name for d in self.dims])

    # ------------------------------------------------------------ from items to tensors
    def _items(self, items) -> list:
        """The items as build and measure take them: an audio model's recordings as 1-D float32 waveforms
        at its sample rate (audio.waveform), every other item as it is."""
        if self.data == AUDIO:
            return [audio.waveform(item, self.sample_rate) for item in items]
        return list(items)

    def lengths(self, items: list) -> dict[str, list[int]]:
        """Each item's length along each varying dimension: {dim: [one per item]}."""
        measured = self.measure(self._items(items)) if self.varying else {}
        out = {}
        for d in self.varying:
            if d.name not in measured:
                raise BadParameter("lengths from measure()", sorted(measured), hint=f"none for {d.name!r}")
            out[d.name] = [int(n) for n in measured[d.name]]
            if len(out[d.name]) != len(items):
                raise BadParameter(f"{d.name} lengths from measure()", len(out[d.name]),
                                   hint=f"give one per item ({len(items)})")
        return out

    def batch(self, items: list, sizes: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None,
              truncate: bool = True) -> dict[str, torch.Tensor]:
        """The input tensors for `items`, every varying dimension padded to `sizes[dim]` exactly (a bucket),
        or without a size to the longest item, cut at `limits[dim]` (the largest bucket) or the dimension's
        `max`. truncate=False raises BadParameter for an item longer than that instead of cutting it."""
        items = self._items(items)            # once: measuring and building see the same waveforms
        sizes, limits = dict(sizes or {}), dict(limits or {})
        unknown = [n for n in (*sizes, *limits) if n not in self.varying_names]
        if unknown:
            raise BadParameter("varying dimension", unknown[0], list(self.varying_names))
        resolved: dict[str, int] = {}
        measured = None
        for d in self.varying:
            limit = sizes.get(d.name) or limits.get(d.name) or d.max
            if d.max is not None and limit is not None and limit > d.max:
                raise BadParameter(d.what, limit, hint=f"the model takes at most {d.max} {d.name}")
            if d.name in sizes and truncate:
                resolved[d.name] = max(int(sizes[d.name]), d.min)
                continue
            measured = measured or self.lengths(items)
            longest = max(measured[d.name]) if items else d.min
            if not truncate and limit is not None and longest > limit:
                raise BadParameter("input length", longest,
                                   hint=f"longer than {limit} {d.name} and truncation is off")
            resolved[d.name] = int(sizes[d.name]) if d.name in sizes else max(min(longest, limit or longest), d.min)
        return self.build(items, resolved)

    def fit(self, batch: Mapping[str, torch.Tensor], sizes: Mapping[str, int], rows: int | None = None,
            pad: bool = True, side: str = "right") -> dict[str, torch.Tensor]:
        """A built batch brought to other sizes: each input cut (or, with pad, padded with its padding
        value) along each dimension in `sizes`, and with `rows` more rows than it has, the first row
        repeated (a fully padded row can give NaNs in attention). Inputs the declaration does not name
        are kept as they are. `side` is where padding goes and where a cut starts ("left": before the real
        positions, as a tokenizer with padding_side "left" pads; the first positions are cut)."""
        if side not in ("right", "left"):
            raise ValueError(f"padding side {side!r}: 'right' or 'left'")
        specs = {s.name: s for s in self.inputs}
        out = {}
        for name, t in batch.items():
            spec = specs.get(name)
            if spec is None:
                out[name] = t
                continue
            for dim, size in sizes.items():
                if dim not in spec.dims:
                    continue
                axis, have = spec.dims.index(dim), t.shape[spec.dims.index(dim)]
                if have > size:
                    t = t.narrow(axis, 0 if side == "right" else have - size, size)
                elif have < size and pad:
                    shape = list(t.shape)
                    shape[axis] = size - have
                    filler = torch.full(shape, spec.pad, dtype=t.dtype, device=t.device)
                    t = torch.cat([t, filler] if side == "right" else [filler, t], axis)
            if rows is not None and BATCH in spec.dims:
                axis = spec.dims.index(BATCH)
                if rows > t.shape[axis]:
                    first = t.narrow(axis, 0, 1)
                    t = torch.cat([t, first.expand(*[rows - t.shape[axis] if i == axis else -1
                                                     for i in range(t.dim())])], axis)
            out[name] = t
        return out

    def stack(self, batches: Sequence[Mapping[str, torch.Tensor]], side: str = "right") -> dict[str, torch.Tensor]:
        """Built batches joined along the batch dimension, each first padded (on `side`, see fit) to the
        longest along every varying dimension."""
        sizes = {d: max(self.size_of(b, d) for b in batches) for d in self.varying_names}
        fitted = [self.fit(b, sizes, side=side) for b in batches]
        axes = {s.name: s.dims.index(BATCH) if BATCH in s.dims else 0 for s in self.inputs}
        return {name: torch.cat([b[name] for b in fitted], axes.get(name, 0)) for name in fitted[0]}

    def real_mask(self, batch: Mapping[str, torch.Tensor], dim: str) -> torch.Tensor | None:
        """(batch, size) bool: which positions along `dim` are real, from the input declared in `masks`;
        None when the declaration names no mask for it."""
        name = self.masks.get(dim)
        return batch[name].to(torch.bool) if name is not None and name in batch else None

    def real_lengths(self, batch: Mapping[str, torch.Tensor]) -> dict[str, list[int]]:
        """Each row's real length along each varying dimension with a mask (a dimension without one
        counts as all real)."""
        out = {}
        for d in self.varying:
            mask = self.real_mask(batch, d.name)
            if mask is not None:
                out[d.name] = [int(n) for n in mask.sum(1)]
            else:
                out[d.name] = [self.size_of(batch, d.name)] * self.rows(batch)
        return out

    def size_of(self, batch: Mapping[str, Any], dim: str) -> int:
        """A batch's size along a named dimension, read from the first input that has it; the batch may
        hold tensors or their shapes ({name: [sizes]}, as a compile records them)."""
        for spec in self.inputs:
            if dim in spec.dims and spec.name in batch:
                value = batch[spec.name]
                return int((value.shape if hasattr(value, "shape") else value)[spec.dims.index(dim)])
        raise BadParameter("dimension", dim, [d.name for d in self.dims])

    def rows(self, batch: Mapping[str, torch.Tensor]) -> int:
        return self.size_of(batch, BATCH) if any(d.batch for d in self.dims) else 1

    def shape_of(self, name: str, rows: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape input `name` has for `rows` items at the given varying sizes."""
        spec = next(s for s in self.inputs if s.name == name)
        dims = {d.name: d for d in self.dims}
        return tuple(rows if dims[n].batch else dims[n].size if dims[n].size is not None else int(sizes[n])
                     for n in spec.dims)

    def dummy(self, rows: int, sizes: Mapping[str, int] | None = None, fill: Mapping[str, Any] | None = None,
              device: str = "cpu") -> dict[str, torch.Tensor]:
        """A probe batch of the declared shapes: each input filled with its padding value, a mask input with
        1 (all real) unless `fill` says otherwise; varying sizes default to each dimension's `min`."""
        sizes = {d.name: d.min for d in self.varying} | dict(sizes or {})
        fill = {name: 1 for name in self.masks.values()} | dict(fill or {})
        return {s.name: torch.full(self.shape_of(s.name, rows, sizes), fill.get(s.name, s.pad), dtype=s.dtype,
                                   device=device) for s in self.inputs}

    def shape_label(self, batch: Mapping[str, torch.Tensor]) -> str:
        """The whole shape of a batch's first input, e.g. "1x3x64x64" or "4x128"."""
        first = batch[self.inputs[0].name] if self.inputs[0].name in batch else next(iter(batch.values()))
        return "x".join(str(n) for n in first.shape)

    def to_dict(self) -> dict:
        return {"data": self.data, "items": self.items, "sample_rate": self.sample_rate,
                "inputs": [{"name": s.name, "dtype": str(s.dtype).removeprefix("torch."), "dims": list(s.dims)}
                           for s in self.inputs],
                "dims": [{"name": d.name, "role": "batch" if d.batch else "varies" if d.varies else "fixed",
                          "size": d.size, "max": d.max} for d in self.dims],
                "varying": list(self.varying_names),
                "outputs": [{"name": o.name, "metric": o.metric,
                             **({"stride": o.stride, "window": o.window, "ceil": o.ceil} if o.strided else {})}
                            for o in self.outputs],
                "masks": dict(self.masks)}


# ---------------------------------------------------------------- the two built-in instances
TOKENS = "tokens"


def text_declaration(tokenizer, input_names: Sequence[str], max_length: int,
                     outputs: Sequence[Output]) -> Declaration:
    """A text model's contract: items are texts, tokenized by `tokenizer` into `input_names`, padded
    along one varying dimension, `tokens` (at most `max_length`), with `attention_mask` marking the real
    tokens."""
    names = tuple(input_names)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    specs = tuple(TensorSpec(n, torch.long, (BATCH, TOKENS), pad=int(pad_id) if n == "input_ids" else 0)
                  for n in names)

    def build(items, sizes):
        enc = tokenizer(list(items), padding="max_length", max_length=sizes[TOKENS], truncation=True,
                        return_tensors="pt")
        return {k: enc[k] for k in names if k in enc}

    def measure(items):
        enc = tokenizer(list(items), add_special_tokens=True, truncation=False, verbose=False)
        return {TOKENS: [len(ids) for ids in enc["input_ids"]]}

    return Declaration(specs, (Dim(BATCH, batch=True), Dim(TOKENS, varies=True, max=max_length,
                                                            label="sequence length")),
                       build, measure, tuple(outputs), TEXT,
                       masks={TOKENS: "attention_mask"} if "attention_mask" in names else {})


def image_declaration(size: int, outputs: Sequence[Output], name: str = "pixel_values", channels: int = 3,
                      mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Declaration:
    """An image model's contract: items are float32 HxWxC arrays in [0, 1] at `size`, stacked into one
    (batch, channels, height, width) input; no dimension but the batch varies. channels: 3 (RGB) or 1
    (luminance); an item with the other count is converted (images.to_channels). mean, std: the model's own
    normalisation, one value per channel, applied as (x - mean) / std (a processor's image_mean, image_std)."""
    if channels not in images.CHANNELS:
        raise BadParameter("image channels", channels, images.CHANNELS)
    scale = {}
    for what, values in (("mean", mean), ("std", std)):
        if values is None:
            continue
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            raise BadParameter(f"image {what}", values, hint=f"give one number per channel ({channels})") from None
        if len(values) != channels:
            raise BadParameter(f"image {what}", values, hint=f"give one value per channel ({channels})")
        if what == "std" and not all(v > 0 for v in values):
            raise BadParameter("image std", values, hint="every value must be positive (it divides)")
        scale[what] = torch.tensor(values, dtype=torch.float32).reshape(1, channels, 1, 1)

    def build(items, sizes):
        stacked = np.stack([images.to_channels(item, channels) for item in items])
        pixels = torch.as_tensor(stacked).permute(0, 3, 1, 2).contiguous().float()
        if "mean" in scale:
            pixels = pixels - scale["mean"]
        if "std" in scale:
            pixels = pixels / scale["std"]
        return {name: pixels}

    dims = (Dim(BATCH, batch=True), Dim("channels", size=channels), Dim("height", size=size), Dim("width", size=size))
    return Declaration((TensorSpec(name, torch.float32, (BATCH, "channels", "height", "width")),), dims, build,
                       lambda items: {}, tuple(outputs), IMAGE, item_label="image crops")


def undeclared(input_names: Sequence[str], outputs: Sequence[Output]) -> Declaration:
    """A model that declares nothing of its inputs but their names (no tokenizer, no image size): its
    batches are built by the caller; asking the declaration to build one says how to declare them."""
    def build(items, sizes):
        raise BadParameter("data items for a model without a declaration", f"{len(items)} items",
                           hint="give its LoadedModel a declaration (portkit.models.inputs) to build batches from data")

    return Declaration(tuple(TensorSpec(n, torch.float32, (BATCH,)) for n in input_names), (Dim(BATCH, batch=True),),
                       build, lambda items: {}, tuple(outputs), IMAGE, item_label="inputs built by the caller")
