"""Stage 4's reference: what every target is held against, computed once for all of them.

    >>> ref = reference.Reference.build(model, inputs, options, scope, corpus)
    >>> ref.outputs, ref.outputs64, ref.baseline["gpu_error"]     # float32 as written, float64, today's GPU
    >>> ref.task(out[ref.main], side, precision)                   # task metrics over the task sample
    >>> plain, expected, baseline, truth = ref.bucket(64, texts, padded, "right")

The model's own outputs on the main batch (float32 as written, and in float64), today's GPU setup on it
(measure_baseline), the task sample the task metrics are decided on (TaskSample), and each bucket's batch at its
own length with its reference and baseline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from portkit.corpora import images
from portkit.models import registry
from portkit.stages.accuracy import stats
from portkit.stages.accuracy import footprint
from portkit.stages.accuracy import target_runs
from portkit.stages.accuracy.comparison import (check, compare, finish, item_values, join_values, neighbour_shares,
                                                primary_output, shape_mismatch, summarize, task_metrics, unmeasured)
from portkit.stages.accuracy.localize import LayerProbe
from portkit.stages.accuracy.settings import (NEIGHBOURS, REFERENCE_BYTES, TASK_BATCH, TASK_ITEMS_MAX, Options,
                                              Scope)
from portkit.stages.accuracy.target_runs import TargetSide
from portkit.targets import gpu_baseline, numerics
from portkit.targets import specs
from portkit.targets.tolerance import rounds

_BUCKET_POOL = 512       # texts sampled and tokenized to fill the buckets


def bucket_batches(model, corpus, boundaries, batch_size, seed):
    """Real texts for each bucket: those whose token length falls in (previous boundary, boundary];
    the last bucket also takes longer texts, truncated to it as the target would."""
    pool = corpus.sample(min(len(corpus), _BUCKET_POOL), seed)
    sized = list(zip(pool, model.token_lengths(pool)))
    low = 0
    for i, high in enumerate(boundaries):
        last = i == len(boundaries) - 1
        chosen = [(t, n) for t, n in sized if n > low and (n <= high or last)][:batch_size]
        yield low, high, [t for t, _ in chosen], sum(n > high for _, n in chosen)
        low = high


def _rows_like(inputs: dict, other: dict) -> bool:
    """Whether `other`'s rows have the shapes of `inputs`' rows (the same inputs, one row for another)."""
    return set(inputs) == set(other) and all(tuple(inputs[k].shape[1:]) == tuple(other[k].shape[1:]) for k in inputs)


def real_mask(model, inputs: dict):
    """The real positions along the model's varying dimension (its declaration's mask), or None."""
    return model.declaration.real_mask(inputs, model.seq_dim) if model.seq_dim else None


def judged_output(model, outputs) -> str:
    """The output judged by its task metric: the declaration's primary one (else the kind's)."""
    declared = model.declaration.primary.name
    return declared if declared in outputs else primary_output(model.declaration.primary.metric, outputs)


def _output_bytes(bucket: tuple) -> int:
    """The bytes of a kept bucket's reference outputs: float32, and float64 where it is another tensor."""
    _, out, _, wide = bucket
    tensors = {id(t): t for d in (out, wide) for t in d.values() if isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _key(items) -> tuple:
    """A batch of items as a cache key: texts by value, other items (arrays) by identity within the run."""
    return tuple(t if isinstance(t, str) else id(t) for t in items)


def _unpadded(model, inputs: dict, padding_side: str) -> dict:
    """The same batch at its own longest length, as an eager GPU run sees it (no bucket padding)."""
    longest = max(model.declaration.real_lengths(inputs)[model.seq_dim])
    if padding_side == "right":
        return model.declaration.fit(inputs, {model.seq_dim: longest}, pad=False)
    return {k: v[:, -longest:] for k, v in inputs.items()}      # a tokenizer that pads on the left


# ---------------------------------------------------------------- (a) the reference, shared by every target
@dataclass
class Reference:
    """What every target is held against: the model's own outputs on the batch (float32 as written, and in
    float64), today's GPU setup on it, the corpus sample for neighbour agreement, and each bucket's batch
    at its own length with its reference and baseline (computed once, for every target)."""
    model: object
    inputs: dict
    options: Options
    scope: Scope
    corpus: object
    compiled: bool                   # the chosen precision judged compiled (Scope.judged_compiled)
    mask: torch.Tensor | None        # the real positions
    probe: LayerProbe | None         # the per-layer reference activations
    outputs: dict                    # eager on the CPU, as written
    wide: bool                       # the model computes in float64: it is its own float64 reference
    float64: target_runs.Float64Reference
    outputs64: dict | None           # the float64 copy's outputs (None: not run)
    note64: str
    main: str                        # the output judged by the task metric
    baseline: dict = field(default_factory=dict)
    sample: TaskSample | None = None   # the items the task metrics are decided on (None: the main batch)
    buckets: dict = field(default_factory=dict)

    @classmethod
    def build(cls, model, inputs: dict, options: Options, scope: Scope, corpus=None) -> Reference:
        compiled = scope.judged_compiled()
        module = model.module.eval()
        mask = real_mask(model, inputs)
        probe = LayerProbe(module, mask, scope.progress) if scope.layers else None
        out = probe.capture(lambda: module(**inputs)) if probe else target_runs.forward(module, inputs)
        wide = target_runs.float64_model(module)
        float64 = target_runs.Float64Reference(module, scope.pass_budget())
        out64, note64 = float64(inputs) if scope.float64_reference and not wide else \
            (None, "the reference is the float64 model itself" if wide else "not requested")
        ref = cls(model=model, inputs=inputs, options=options, scope=scope, corpus=corpus, compiled=compiled,
                  mask=mask, probe=probe, outputs=out, wide=wide, float64=float64, outputs64=out64, note64=note64,
                  main=judged_output(model, out))
        ref.baseline = measure_baseline(module, inputs, out, ref.truth, ref.main, mask, options)
        ref.sample = TaskSample.build(model, corpus, inputs, options.seed, scope.task_items, scope.task_items_max)
        if ref.sample is not None:
            ref.sample.size_passes(model, inputs, scope.pass_budget(), ref.main)
        return ref

    @property
    def module(self) -> torch.nn.Module:
        return self.model.module

    @property
    def kind(self) -> str:
        return self.model.declaration.primary.metric

    @property
    def truth(self) -> dict | None:
        """The float64 reference: the model's own, or the float64 copy's; None: not run."""
        return self.outputs if self.wide else self.outputs64

    def bucket(self, high: int, texts: list, padded: dict, padding_side: str) -> tuple:
        """A bucket's batch at its own longest length (as an eager GPU run sees it), its reference, its GPU
        baseline and the truth that baseline is measured against (float64 as for the main batch)."""
        key = (high, _key(texts), padding_side)
        found = self.buckets.get(key)
        if found is None:
            plain = _unpadded(self.model, padded, padding_side)
            out = target_runs.forward(self.module, plain)
            wide = out if self.wide else self.float64(plain)[0] if self.truth is not None else None
            baseline = measure_baseline(self.module, plain, out, wide, self.main, real_mask(self.model, plain),
                                        self.options)
            baseline.pop("outputs")       # its error is what a bucket's row needs, not its outputs
            found = (plain, out, baseline, wide if wide is not None else out)
            self._keep_bucket(key, found)
        return found

    def _keep_bucket(self, key: tuple, found: tuple) -> None:
        """Keep a bucket's references for the next path that needs them (another target with the same boundaries, a
        failing bucket's tries) while the kept buckets' outputs stay within REFERENCE_BYTES, the oldest given up
        first; one beyond it is recomputed where needed again (the same eager passes on the CPU: the same values)."""
        size = _output_bytes(found)
        if size > REFERENCE_BYTES:
            return
        while self.buckets and sum(map(_output_bytes, self.buckets.values())) + size > REFERENCE_BYTES:
            del self.buckets[next(iter(self.buckets))]
        self.buckets[key] = found

    def task(self, out: torch.Tensor, side: TargetSide, precision, compiled: bool = False,
             batch: int | None = None, sampled: bool = True) -> dict:
        """The output kind's task metrics, each check with its n and 95% interval: over the task sample where there
        is one and `sampled` (the precision judged; run on `side` at `precision`, compiled where `compiled` and the
        sample's rows have the main batch's shape, in calls of `batch` rows), else over the main batch's outputs
        `out`. Embeddings add top-k neighbour agreement over the sample."""
        bounds, unit = self.options.bounds, self.unit
        if self.sample is None or not sampled:
            found = task_metrics(self.kind, out, self.outputs[self.main], self.mask, bounds, self.inputs, unit,
                                 self.main)
            rows = len(next(iter(self.inputs.values())))
            why = "no corpus given" if self.sample is None else "the task sample decides the precision judged only"
            found["sample"] = {"items": rows, "of": rows, "source": "the main batch", "run": side.label(compiled),
                               "text": f"the main batch ({rows} {self.model.declaration.items}; {why})"}
            return found
        found = self._sampled(side, precision, compiled, batch)
        grown = self.sample.grown() if found.get("decision") == stats.INCONCLUSIVE else None
        # undecided on the sample and the data holds more: decide on all of it (to the cap); the grown sample stays,
        # so the targets judged after this one are decided on it too
        if grown is not None:
            straddled = f"{len(self.sample.items):,}: {found['reason']}"
            self.sample = grown
            found = self._sampled(side, precision, compiled, batch)
            found["sample"]["grown_from"] = straddled
            found["sample"]["text"] += f"; grown from {straddled}"
        return found

    def _sampled(self, side: TargetSide, precision, compiled: bool, batch: int | None) -> dict:
        """The task metrics over the task sample (see task), its words under "sample"."""
        bounds, unit = self.options.bounds, self.unit
        values, described = self.sample.run(self, side, precision, compiled, batch)
        if values is None:      # a batch of the sample came out in another shape than the reference's
            return {**unmeasured(self.kind, described["shape_mismatch"], self.main), "sample": described}
        found = summarize(self.kind, values, bounds, unit)
        if self.kind == registry.EMBEDDING and len(values["cosine"]) > NEIGHBOURS:
            shares = neighbour_shares(values["actual"], values["expected"], NEIGHBOURS)
            found["neighbour_agreement"] = shares.mean().item()
            # the k decisions of one item are not independent: a bootstrap over the items, not a Wilson interval
            found["checks"].append(check("neighbours", f"top-{NEIGHBOURS} nearest-neighbour agreement within the "
                                         "sample", found["neighbour_agreement"], bounds,
                                         len(shares), stats.bootstrap(shares, stats.MEAN), unit))
            found = finish(found, found["checks"])
        found["sample"] = described
        return found

    @property
    def unit(self) -> str:
        return unit_of(self.model, self.kind)


def unit_of(model, kind: str) -> str:
    """What an output kind's task metrics count: the declaration's items, or tokens for a per-token classifier."""
    return "tokens" if kind == registry.TOKEN_CLASSIFIER else model.declaration.items


@dataclass
class TaskSample:
    """The task sample: Scope.task_items items of the user's data (all it holds where fewer), in batches of
    `rows` (TASK_BATCH, fewer where its activations would not fit a pass's budget: size_passes), encoded when a pass
    reaches them; each batch with its reference output (kept up to REFERENCE_BYTES, else
    recomputed a pass); grown (grown()) to all the data holds, up to Scope.task_items_max, where undecided."""
    items: list
    encode: Callable                     # a list of items -> the model's inputs
    source: str
    fixed_rows: bool                     # every row has the main batch's shape: compiled calls reuse its graphs
    expected: list = field(default_factory=list)   # per batch: the reference's main output, or None
    draw: Callable | None = None         # n -> n items of the data (a larger sample), None: made up, it does not grow
    pool: int | None = None              # the items the data holds (None: no data, made-up items)
    cap: int = TASK_ITEMS_MAX            # what the sample grows to at most (Scope.task_items_max)
    rows: int = TASK_BATCH               # items a pass holds (size_passes)
    rows_why: str | None = None          # why fewer than TASK_BATCH, in words (None: TASK_BATCH)

    @classmethod
    def build(cls, model, corpus, inputs: dict, seed: int, first: int, cap: int = TASK_ITEMS_MAX) -> TaskSample | None:
        """The sample from `corpus` when its items are the model's kind (text models: padded to the main batch's
        length), else real image crops for an image model; None where there is no data beyond the main batch."""
        if corpus is not None and len(corpus) and isinstance(corpus.texts[0], str) == model.takes_text:
            pool, source = len(corpus), corpus.name

            def draw(n):
                return corpus.sample(n, seed)
        elif model.declaration.data == "image" and model.image_size and _rows_like(inputs, model.encode(
                images.sample_images(1, model.image_size, seed))):      # the main batch is crops too

            def crops(ids):     # made when a pass reaches them: a thousand crops at once would not fit lightly
                return model.encode(images.sample_images(len(ids), model.image_size, seed + 1 + ids[0]))
            # crops are no user data: the sample does not grow on them (the advice is to give a folder)
            return cls(list(range(first)), crops, "real image crops (no folder of images given)", True, cap=cap)
        else:
            return None
        tokens = model.seq_dim == "tokens" and "attention_mask" in inputs
        length = model.declaration.size_of(inputs, model.seq_dim) if tokens else None
        return cls(draw(min(pool, first)), lambda chunk: model.encode(chunk, pad_to=length) if tokens else
                   model.encode(chunk), source, model.seq_dim in (None, "tokens"), draw=draw, pool=pool, cap=cap)

    def grown(self) -> TaskSample | None:
        """The sample grown to every item the data holds up to `cap`; None where it holds no more than this."""
        if self.draw is None or min(self.cap, self.pool) <= len(self.items):
            return None
        n = min(self.cap, self.pool)
        return TaskSample(self.draw(n), self.encode, self.source, self.fixed_rows, draw=self.draw, pool=self.pool,
                          rows=self.rows, rows_why=self.rows_why,
                          cap=self.cap)

    def size_passes(self, model, inputs: dict, budget: int, main: str) -> None:
        """Rows a pass holds: TASK_BATCH, or as many as fit `budget` bytes where fewer (footprint, measured on one row
        of the main batch: the model's pass and the per-item values of its `main` output, at the longest item where
        rows are padded to their own longest)."""
        kind = model.declaration.primary.metric

        def values(out, row):
            return item_values(kind, out[main], out[main].clone(), real_mask(model, row), row)
        per_row = footprint.row_bytes(model, inputs, self.fixed_rows, values)
        self.rows = footprint.rows_per_pass(per_row, TASK_BATCH, budget)
        if self.rows < TASK_BATCH:
            self.rows_why = (f"{self.rows} a pass, not {TASK_BATCH}: a row (its pass and per-item values) measured "
                             f"{per_row / 2**20:,.0f} MiB, and a pass takes at most {budget / 2**20:,.0f} MiB at "
                             f"{footprint.PASS_OVERHEAD}x that (portkit's pass budget, footprint.pass_budget)")
            print(f"task sample: {self.rows_why}")

    def why(self) -> str:
        """Why the sample holds the items it does, in words."""
        n = len(self.items)
        if self.draw is None:
            return "portkit's sample size (Scope.task_items) of crops made for the check; it grows only on your data"
        if n >= self.pool:
            return f"all {self.pool:,} the data holds"
        held = f"of the {self.pool:,} the data holds"
        if n >= self.cap:
            return f"{held}: portkit's cap on a grown sample (Scope.task_items_max, {self.cap:,})"
        return (f"{held}: portkit's first sample (Scope.task_items), where perfect agreement clears a 0.99 budget; "
                f"it grows to {self.cap:,} at most where an interval straddles its budget")

    @property
    def batches(self) -> int:
        return -(-len(self.items) // self.rows)

    def batch(self, i: int) -> dict:
        return self.encode(self.items[i * self.rows:(i + 1) * self.rows])

    def reference(self, ref: Reference, i: int) -> torch.Tensor:
        """Batch i's reference main output (the model as written, eager on the CPU)."""
        if i < len(self.expected) and self.expected[i] is not None:
            return self.expected[i]
        out = target_runs.forward(ref.module, self.batch(i))[ref.main]
        kept = sum(e.numel() * e.element_size() for e in self.expected if e is not None)
        if i == len(self.expected):
            self.expected.append(out if kept + out.numel() * out.element_size() <= REFERENCE_BYTES else None)
        return out

    def run(self, ref: Reference, side: TargetSide, precision, compiled: bool, batch: int | None) -> tuple:
        """One precision's pass: per-item values of every batch of the sample; (the joined values, what was run in
        words). Compiled where judged so, in calls of `rows` rows (the last padded to them: one graph shape
        more than the main batch's, compiled once). A batch whose output has another shape than its reference's
        ends the pass: (None, the words with "shape_mismatch")."""
        compiled = compiled and self.fixed_rows and side.refused is None
        values = []
        described = {"of": len(self.items), "source": self.source, "batch": self.rows, "run": side.label(compiled)}
        if self.rows_why:
            described["batch_why"] = self.rows_why
        for i in range(self.batches):
            inputs = self.batch(i)
            out = side.run(inputs, precision, compiled=compiled, batch=self.rows if compiled else None)[0][ref.main]
            expected = self.reference(ref, i)
            differs = shape_mismatch(out, expected)
            if differs is not None:
                return None, {**described, "items": i * self.rows, "shape_mismatch": differs,
                              "text": f"task sample batch {i + 1} of {self.batches} from {self.source}"}
            values.append(item_values(ref.kind, out, expected, real_mask(ref.model, inputs), inputs))
        done = len(self.items)
        return join_values(values), {**described, "items": done, "pool": self.pool, "why": self.why(),
                                     "text": f"{done:,} {ref.model.declaration.items} from {self.source} "
                                             f"({self.why()})"}


def measure_baseline(module, batch: dict, plain: dict, truth: dict | None, main: str, mask, options: Options) -> dict:
    """Today's GPU setup (options.gpu_numerics), and its own error on the `main` output against `truth` (None:
    against `plain`): what a target's error is held against. Native where a GPU is present (gpu_baseline: a
    float32 copy run on it under the real flags or autocast, unless PORTKIT_MODE=emulated); else emulated on the
    CPU (the cuda target has no dtype rules: float64 stays). `plain`: the model's own outputs for `batch`, which an
    emulated setting that rounds nothing (fp32) computes exactly."""
    name = options.gpu_numerics
    chosen, gpu = numerics.GPU_NUMERICS[name], specs.get("cuda")
    mode, measured = "emulated", gpu_baseline.emulated_label()
    if gpu_baseline.present():
        (out, measured), mode = gpu_baseline.measure(module, batch, name), "native"
    elif rounds(chosen) or gpu.dtype_rules:
        with torch.no_grad(), numerics.emulate(gpu, chosen):
            out = module(**batch)
    else:
        out = plain
    found = compare(out[main], (truth if truth is not None else plain)[main], None, mask)
    return {"gpu_numerics": name, "setting": chosen.setting, "description": chosen.description,
            "label": f"the GPU baseline '{name}'", "mode": mode, "measured": measured,
            "factor": options.bounds["baseline_factor"], "output": main,
            "truth": "the float32 reference (no float64 run)" if truth is None else "the float64 reference",
            "gpu_error": found["rel_l2"], "gpu_max_abs": found["max_abs"], "outputs": out}


def versus_baseline(baseline: dict, out: torch.Tensor, truth: dict, main: str, mask,
                    float32_on_cpu: bool = False) -> dict:
    """A target's error against float64 (relative L2 on the main output) as a ratio to the GPU setup's.
    `float32_on_cpu`: the target side computed the CPU's own float32 (TargetSide.float32_on_cpu), kept in the
    result so that every text of the ratio says it compares nothing about the target (tables.against_baseline)."""
    error = compare(out, truth[main], None, mask)["rel_l2"]     # nan where the shapes differ
    gpu = baseline["gpu_error"]
    ratio = error / gpu if gpu > 0 else (1.0 if error == 0 else None)    # None: the GPU setup has no error
    ratio = None if error != error else ratio                            # nothing compared: no ratio
    return {**{k: v for k, v in baseline.items() if k != "outputs"}, "target_error": error, "ratio": ratio,
            "within": ratio is not None and ratio <= baseline["factor"], "float32_on_cpu": float32_on_cpu}
