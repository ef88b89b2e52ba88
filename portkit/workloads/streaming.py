"""A stateful streaming step under each target: compiled once per chunk shape, its state carried across a
real stream, and the state's drift against float64 measured over the whole stream.

    >>> from portkit.models import audio
    >>> from portkit.workloads import streaming
    >>> step = audio.gru_step()                         # STFT log-mel front end + GRU; random weights (seed 0)
    >>> stream = streaming.speech_stream(seconds=20)    # recordings and spoken corpus texts, end to end, 16 kHz
    >>> result = streaming.check_stream(step, stream, ["neuron", "tpu"])
    >>> print(result)        # per target: compiles per chunk shape, the state's error chunk by chunk, its growth

A step is `step(chunk, state) -> (outputs, state)`, its state one tensor or a pytree of them (an LSTM cell's
(h, c) beside a context buffer) with each leaf's batch axis declared (StreamStep). Each target's run carries its own
state, measured at every chunk against a float64 run per leaf (the worst reported: TargetStream.drift_leaf), beside
one step's error from the float64 state. A drift fails the budget (tolerance.DEFAULT_TASK_BOUNDS["drift_growth"])
where a leaf's error over one step's grows beyond it from the stream's first quarter to its second half and a rank
test says the rise is no noise (_drift), on the chunks up to the stream's last sound (trailing silence left out and
counted). A state wrong from the first chunk, which does not grow, fails the level check (level_check: one step's
error against its precision's tolerance, or twice the model's own float32 error where larger). Each declared output
is judged by its metric kind (STREAM_METRICS). The step compiles once per chunk shape, warmed up on silence, then
runs under `set_stance("fail_on_recompile")`: a compile is counted.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from portkit.core import torch_private
from portkit.corpora import audio
from portkit.targets import backends
from portkit.corpora.corpus import audio_corpus
from portkit.targets import selection
from portkit.targets import specs
from portkit.models import inputs
from portkit.models.audio import RATE, STATE, StreamStep
from portkit.core.errors import BadParameter
from portkit.targets.tolerance import (DEFAULT_TASK_BOUNDS, TASK_BOUND_REASONS, budget_text, compute_dtype,
                                       tolerance_for, within)

# The drift's yardstick: the stream's first quarter, against its second half. A quarter of the stream holds many
# chunks, so neither one chunk nor one quiet recording sets it (the first 3 chunks did: a silent start made any error
# look like growth), and it is early enough that an error which grows until it saturates within the stream still
# stands out against it (a chaotic state reaches its ceiling within a tenth of a stream).
START_SHARE = 0.25
MIN_CHUNKS = 20            # a stream shorter than this cannot show a drift apart from its start
DRIFT_P = 0.01             # a drift's significance: noise alone reads as a rising error once in a hundred streams
STREAM_SECONDS = 20.0      # the workbook's stream: 200 chunks of 100 ms
# A chunk is silence where every sample lies below -60 dBFS (amplitude 0.001 of full scale), ffmpeg's silencedetect
# filter's default noise tolerance. A stream's trailing silence (a recording's quiet tail, the zeros padding its last
# chunk) holds no content: one step's error there is the rounding of a resting state, far below the error the state
# carries from the speech before it, so over one step's it would read as growth. The drift is judged on the chunks
# up to the last one with sound; the silence after it is counted and said.
SILENCE = 10 ** (-60 / 20)


@dataclass
class Stream:
    """One real stream: clips end to end at the step's rate."""
    samples: np.ndarray
    rate: int
    source: str
    label: str                 # recorded, synthetic, or recorded and synthetic

    @property
    def seconds(self) -> float:
        return self.samples.size / self.rate

    def chunks(self, size: int) -> list[torch.Tensor]:
        """(1, size) chunks in order; where the stream does not divide evenly, the last is padded with silence
        (zeros) to `size`, as a streaming service pads its final partial chunk: one shape, the warm-up's, and a
        front end whose window is longer than the remainder (an STFT) still reads a whole chunk."""
        whole = torch.from_numpy(self.samples).float().unsqueeze(0)
        whole = torch.nn.functional.pad(whole, (0, -whole.shape[1] % size))
        # each chunk its own buffer, as a stream delivers it (a view of the whole would carry other strides)
        return [whole[:, i:i + size].clone(memory_format=torch.contiguous_format)
                for i in range(0, whole.shape[1], size)]


def speech_stream(seconds: float = STREAM_SECONDS, rate: int = RATE, clips=None, source: str | None = None,
                  seed: int = 0) -> Stream:
    """`clips` (audio.Clip, e.g. the run's corpus: corpus.corpus_for) end to end, cut at `seconds`; by default
    the alsa-utils recordings, then stdlib docstrings spoken by espeak-ng."""
    if clips is None:
        corpus = audio_corpus("stdlib", clips=64, seed=seed)
        clips, source = corpus.clips, corpus.source
    clips = [c for c in clips if isinstance(c, audio.Clip)]
    if not clips:
        raise BadParameter("stream", "no clips", hint="give recordings (audio.Clip) to stream")
    parts, total = [], 0
    for clip in clips:
        parts.append(clip.load(rate))
        total += parts[-1].size
        if total >= seconds * rate:
            break
    samples = np.concatenate(parts)[:int(seconds * rate)]
    used = audio.AudioCorpus("stream", source or "", tuple(clips[:len(parts)]))
    return Stream(samples, rate, f"{len(parts)} clips of {source or 'recordings'}", used.label)


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.detach().double()
    return ((a.detach().double() - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()


def _moved(state, device=None, floats=None):
    """A state (a tensor or any pytree of tensors) on `device`, its floating leaves cast to `floats` if given."""
    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=floats if floats is not None and t.is_floating_point() else None)
    return torch_private.tree_map(move, state)


def _leaf_errors(step: StreamStep, state, ref) -> dict[str, float]:
    """Each floating leaf's relative error against the float64 state's (StreamStep.state_leaves' names)."""
    truth = step.flat_state(ref)
    return {n: _relative(t.cpu(), truth[n]) for n, t in step.flat_state(state).items() if t.is_floating_point()}


def _amplification(carried, single) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk, the carried state's error over one step's error at the same chunk (one step from the float64
    state: the error that chunk's own content gives a state that starts exact), and the chunks' indices. A stream's
    content sets its error's level (silence into a zero state is exact, a loud recording rounds more than a quiet
    one), so the carried error alone rises or falls with the order of the recordings; over one step's error it is
    what the state carries from earlier chunks, which stays level where the state forgets its rounding and grows
    where it accumulates it. A chunk where both are exactly 0 measures nothing and is left out; a one-step error
    of exactly 0 under a carried one is floored at the leaf's smallest nonzero one-step error."""
    c, s = np.asarray(carried, dtype=float), np.asarray(single, dtype=float)
    measured = (c > 0) | (s > 0)
    positive = s[s > 0]
    floor = positive.min() if positive.size else 1.0       # no one-step error at all: the carried error as it is
    return c[measured] / np.maximum(s[measured], floor), np.flatnonzero(measured)


def sounding(chunks: list[torch.Tensor]) -> int:
    """How many chunks the stream has up to its last one with sound (any sample at or above SILENCE): the chunks
    the drift is judged on; those after it are its trailing silence."""
    loud = [i for i, c in enumerate(chunks) if float(c.abs().max()) >= SILENCE]
    return loud[-1] + 1 if loud else 0


def _drift(carried, single, end: int | None = None) -> dict:
    """The drift of one state leaf over its first `end` chunks (sounding: the trailing silence left out; None: all):
    its amplification (_amplification) over their second half against their first START_SHARE. growth: the ratio of
    the windows' medians (windows of many chunks, so neither one high chunk nor a quiet start makes a flat error look
    like drift); rising: a one-sided Mann-Whitney U test of the windows (scipy.stats.mannwhitneyu). Noise around a
    flat amplification makes the windows exchangeable, so it reads "rising" with probability DRIFT_P. exact: no chunk
    has any error (nothing drifts; never the worst leaf)."""
    from scipy import stats
    carried, single = list(carried)[:end], list(single)[:end]
    ratio, where = _amplification(carried, single)
    start, half = max(1, int(len(carried) * START_SHARE)), len(carried) // 2
    first, last = ratio[where < start], ratio[where >= half]
    found = {"test": f"Mann-Whitney U, the second half's chunks > the first {START_SHARE:.0%}'s "
                     "(carried error / one step's)",
             "chunks_measured": int(ratio.size), "exact": not ratio.size}
    if not first.size or not last.size:      # a window with no error at all: nothing to compare
        return {**found, "growth": 1.0, "p": 1.0, "rising": False}
    low, high = float(np.median(first)), float(np.median(last))
    growth = high / low if low > 0 else (1.0 if high == 0 else math.inf)
    p = float(stats.mannwhitneyu(last, first, alternative="greater").pvalue)
    return {**found, "growth": growth, "p": p, "rising": p < DRIFT_P}


# ---------------------------------------------------------------- each streamed output, by its metric kind
# Every check compares one measurement with its budget in tolerance.DEFAULT_TASK_BOUNDS (tolerance.within), the
# budgets a batch output of the same kind is held to: a decision (top-1 label, a probability's side of its threshold)
# to "agreement", a probability's mean absolute error to "probability_mae", a vector to "cosine". The stream is the
# whole population measured, not a sample of one, so a measurement is compared as it is, without an interval.
def _check(key: str, label: str, value: float, bounds: dict, output: str | None = None) -> dict:
    """One check of a stream: a measurement against its budget."""
    return {"metric": key, "output": output, "label": label, "value": value, "budget": budget_text(key, bounds),
            "bound": bounds[key], "passed": within(key, value, bounds), "why": TASK_BOUND_REASONS[key]}


def _rows(chunks: list[torch.Tensor]) -> torch.Tensor:
    """Every chunk's output as rows along its last axis, in float64: (decisions or vectors, last axis)."""
    return torch.cat([c.detach().cpu().double().reshape(-1, c.shape[-1] if c.dim() else 1) for c in chunks])


def _labels(actual: list, expected: list, output, bounds: dict) -> tuple[dict, list[dict]]:
    """Logits along the last axis: the share of top-1 labels (argmax) equal to float64's."""
    a, e = _rows(actual), _rows(expected)
    found = {"metric": "top-1 agreement", "decisions": int(e.shape[0]), "classes": int(e.shape[-1])}
    if e.shape[-1] < 2:       # argmax over one entry is always 0: it would agree whatever the numbers
        found["note"] = ("one entry on the last axis: argmax agrees whatever the values, so nothing is measured; "
                         "declare one probability per decision as inputs.PROBABILITY")
        found["summary"] = "not measured (one class)"
        return found, []
    found["agreement"] = (a.argmax(-1) == e.argmax(-1)).double().mean().item()
    found["summary"] = f"top-1 agreement {found['agreement']:.2%} of {found['decisions']} decisions"
    return found, [_check("agreement", "top-1 labels equal to float64's", found["agreement"], bounds, output.name)]


def _probability(actual: list, expected: list, output, bounds: dict) -> tuple[dict, list[dict]]:
    """A probability per element, held as a batch's is: its mean absolute error ("probability_mae"), and the share
    of decisions (p >= threshold) equal to float64's ("agreement")."""
    a, e, t = _rows(actual).reshape(-1), _rows(expected).reshape(-1), output.threshold
    error, flips = (a - e).abs(), (a >= t) != (e >= t)
    found = {"metric": f"absolute error, and decisions at p >= {t:g}", "threshold": t, "mae": error.mean().item(),
             "max_abs": error.max().item(), "decision_agreement": 1.0 - flips.double().mean().item(),
             "flips": int(flips.sum()), "decisions": int(flips.numel())}
    if e.min() < 0 or e.max() > 1:
        found["note"] = (f"float64 gives values in [{e.min().item():.3g}, {e.max().item():.3g}], outside [0, 1]: not a "
                         "probability; declare logits over classes as inputs.CLASSIFIER")
    found["summary"] = (f"decisions at {t:g} agree {found['decision_agreement']:.2%} ({found['flips']} of "
                        f"{found['decisions']} flip), absolute error mean {found['mae']:.2g}, "
                        f"max {found['max_abs']:.2g}")
    return found, [_check("probability_mae", "mean absolute probability error", found["mae"], bounds, output.name),
                   _check("agreement", f"decisions (p >= {t:g}) equal to float64's", found["decision_agreement"],
                          bounds, output.name)]


def _embedding(actual: list, expected: list, output, bounds: dict) -> tuple[dict, list[dict]]:
    """Vectors along the last axis: each one's cosine to float64's and its relative error; the lowest cosine decides."""
    a, e = _rows(actual), _rows(expected)
    cosine = torch.nn.functional.cosine_similarity(a, e, dim=-1)
    relative = (a - e).norm(dim=-1) / e.norm(dim=-1).clamp_min(1e-300)
    found = {"metric": "cosine and relative error per vector", "vectors": int(e.shape[0]),
             "cosine_min": cosine.min().item(), "cosine_mean": cosine.mean().item(),
             "relative_error_max": relative.max().item()}
    found["summary"] = (f"lowest cosine {found['cosine_min']:.6f} over {found['vectors']} vectors, relative error "
                        f"max {found['relative_error_max']:.2g}")
    return found, [_check("cosine", "lowest cosine of a streamed vector to float64's", found["cosine_min"], bounds,
                          output.name)]


# The stream-level metric of each output kind (portkit.models.inputs' kinds): its measurements and its checks.
STREAM_METRICS = {inputs.CLASSIFIER: _labels, inputs.TOKEN_CLASSIFIER: _labels, inputs.IMAGE_CLASSIFIER: _labels,
                  inputs.PROBABILITY: _probability, inputs.EMBEDDING: _embedding}


def output_metrics(step: StreamStep, actual: list[dict], expected: list[dict], bounds: dict) -> dict[str, dict]:
    """Each declared output over the stream (per chunk {name: tensor}, the target's and float64's), by its kind."""
    found = {}
    for output in step.outputs:
        values, checks = STREAM_METRICS[output.metric]([a[output.name] for a in actual],
                                                       [e[output.name] for e in expected], output, bounds)
        found[output.name] = {"kind": output.metric, **values, "checks": checks,
                              "passed": all(c["passed"] for c in checks)}
    return found


@dataclass
class TargetStream:
    """One target's run over the stream."""
    target: str
    mode: str
    backend: str
    precision: str
    compiles: list[dict]                      # each compile: the chunk shape and when (warm-up or stream)
    late_compiles: int                        # compiles the fail_on_recompile stance caught during the stream
    state_error: list[float]                  # per chunk: carried state vs float64, its worst leaf
    step_error: list[float]                   # per chunk: one step from the float64 state vs float64, its worst leaf
    agreement: float | None                   # the first decision output's decisions equal to float64's
    not_lowered: list[str] = field(default_factory=list)
    sound_chunks: int | None = None           # chunks up to the last with sound (sounding); None: every chunk
    state_rtol: float | None = None           # the state's tolerance at the precision (tolerance.tolerance_for)
    float32_step_error: list[float] | None = None   # per chunk: one step of the model as written (float32_steps)
    # where a check failed at a precision that rounds below float32: the same stream at the target's float32
    # precision, {"precision", "setting", "checks": {check_key: passed}} (try_float32)
    tried: dict | None = None
    checks: list[dict] = field(default_factory=list)
    leaf_errors: dict[str, list[float]] = field(default_factory=dict)   # per state leaf: carried error per chunk
    leaf_step_errors: dict[str, list[float]] = field(default_factory=dict)  # per state leaf: one step's per chunk
    outputs: dict[str, dict] = field(default_factory=dict)              # per declared output: output_metrics
    late: list[dict] = field(default_factory=list)   # each late compile: its chunk and Dynamo's first guard failure

    @property
    def leaves(self) -> dict[str, list[float]]:
        """Each state leaf's carried error per chunk; a run given only state_error has the one leaf 'state'."""
        return self.leaf_errors or {STATE: self.state_error}

    @property
    def step_leaves(self) -> dict[str, list[float]]:
        """Each state leaf's one-step error per chunk (from the float64 state), matching `leaves`."""
        return self.leaf_step_errors or {STATE: self.step_error}

    def leaf_drift(self, name: str) -> dict:
        """One leaf's drift (_drift): its carried error over its one-step error, start against second half."""
        return _drift(self.leaves[name], self.step_leaves[name], self.sound_chunks)

    @property
    def drift_leaf(self) -> str | None:
        """The leaf the drift check judges: one whose error rises beyond noise before one whose does not, then the
        fastest growing; never a leaf whose error is exactly 0 at every chunk (it has nothing to drift), and None
        where every leaf is exact. Drift is judged per leaf, as a small leaf's growing error would vanish in a norm
        over all leaves beside a large flat one; so if any leaf drifts beyond the budget, this one does."""
        drifts = {n: self.leaf_drift(n) for n in self.leaves}
        inexact = [n for n, d in drifts.items() if not d["exact"]]
        return max(inexact, key=lambda n: (drifts[n]["rising"], drifts[n]["growth"])) if inexact else None

    @property
    def trend(self) -> dict:
        """The drift leaf's drift (_drift); where every leaf is exact, no growth and no rise."""
        leaf = self.drift_leaf
        return self.leaf_drift(leaf) if leaf is not None else _drift([0.0], [0.0])

    @property
    def growth(self) -> float:
        """The drift leaf's growth (_drift)."""
        return self.trend["growth"]

    @property
    def trailing_silence(self) -> int:
        """Chunks of silence after the stream's last sound, left out of the drift."""
        return 0 if self.sound_chunks is None else len(self.state_error) - self.sound_chunks

    @property
    def level(self) -> dict:
        """How wrong the state is from the stream's start, apart from any growth: the median over the first
        START_SHARE of the sounding chunks of one step's error (worst leaf) from the float64 state, which carries
        nothing from earlier chunks. A state whose one step is already beyond its precision's tolerance is wrong
        from the first chunk, whether or not it then drifts."""
        single = self.step_error[:self.sound_chunks]
        start = single[:max(1, int(len(single) * START_SHARE))]
        own = self.float32_step_error[:len(start)] if self.float32_step_error else None
        return {"first_chunk": single[0], "median": float(np.median(start)), "chunks": len(start),
                "float32_median": float(np.median(own)) if own else None}

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)

    def leaf_summary(self) -> dict[str, dict]:
        drifts = {n: self.leaf_drift(n) for n in self.leaves}
        return {n: {"error_first": e[0], "error_last": e[-1], "error_max": max(e), "growth": drifts[n]["growth"],
                    "rising": drifts[n]["rising"], "exact": drifts[n]["exact"]} for n, e in self.leaves.items()}

    def to_dict(self) -> dict:
        return {"target": self.target, "mode": self.mode, "backend": self.backend, "precision": self.precision,
                "compiles": self.compiles, "late_compiles": self.late_compiles, "late": self.late,
                "compiled_shapes": sorted({tuple(c["shape"]) for c in self.compiles}),
                "state_error_first": self.state_error[0], "state_error_last": self.state_error[-1],
                "state_error_max": max(self.state_error), "step_error_median": float(np.median(self.step_error)),
                "carried_over_step": self.state_error[-1] / max(float(np.median(self.step_error)), 1e-300),
                "drift_growth": self.growth, "drift_trend": self.trend, "drift_leaf": self.drift_leaf,
                "sound_chunks": self.sound_chunks, "trailing_silence": self.trailing_silence,
                "state_level": self.level, "state_rtol": self.state_rtol,
                "leaves": self.leaf_summary(), "label_agreement": self.agreement, "outputs": self.outputs,
                "state_error": self.state_error, "step_error": self.step_error,
                "not_lowered": self.not_lowered, "checks": self.checks, "passed": self.passed, "tried": self.tried}

    def __str__(self) -> str:
        d = self.to_dict()
        leaves = (f" (worst of {len(self.leaves)} leaves: {self.drift_leaf or 'none, every leaf exact'})"
                  if len(self.leaves) > 1 else "")
        lines = [f"{self.target} ({self.mode}, {self.backend}, precision {self.precision}): "
                 f"{len(self.compiles)} compiles for {len(d['compiled_shapes'])} chunk shapes, "
                 f"{self.late_compiles} during the stream; state error vs float64{leaves} "
                 f"{d['state_error_first']:.2e} at the first chunk, {d['state_error_last']:.2e} at the "
                 f"last (one step alone: {d['step_error_median']:.2e}); growth {d['drift_growth']:.2f}x"
                 + (f" over the chunks with sound ({self.trailing_silence} of trailing silence left out)"
                    if self.trailing_silence else "")
                 + "".join(f"; wrong from the first chunk: one step's error {c['value']:.2e} > {c['bound']:.2g}"
                           for c in self.checks if c["metric"] == "state_error" and not c["passed"])
                 + f" -> {'PASS' if self.passed else 'FAIL'}"]
        for name, o in self.outputs.items():
            verdict = ("PASS" if o["passed"] else "FAIL") if o["checks"] else "not judged"
            lines.append(f"    {name} ({o['kind']}): {o['summary']} -> {verdict}")
            lines += [f"      note: {o['note']}"] if "note" in o else []
        return "\n".join(lines)


@dataclass
class StreamResult:
    step: dict
    stream: dict
    chunks: int
    runs: list[TargetStream]

    def to_dict(self) -> dict:
        return {"step": self.step, "stream": self.stream, "chunks": self.chunks,
                "runs": [r.to_dict() for r in self.runs]}

    def __str__(self) -> str:
        lines = [f"streaming step {self.step['name']} ({self.step['origin']}): {self.chunks} chunks of "
                 f"{self.step['chunk_seconds'] * 1000:g} ms over {self.stream['seconds']:.1f} s of "
                 f"{self.stream['label']} audio ({self.stream['source']})"]
        lines += [f"  {r}" for r in self.runs]
        return "\n".join(lines)

    __repr__ = __str__

    def plot(self, ax=None):
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(7, 3))[1]
        for r in self.runs:
            ax.semilogy(r.state_error, label=f"{r.target}: carried state")
            ax.semilogy(r.step_error, ls=":", label=f"{r.target}: one step from the float64 state")
        ax.set_xlabel("chunk")
        ax.set_ylabel("relative error vs float64 (worst leaf)")
        ax.set_title("State drift over the stream")
        ax.legend(fontsize=7)
        return ax


def _reference(step: StreamStep, chunks) -> tuple[list[dict], list]:
    """float64 outputs (by name) and states along the stream (the truth every target is measured against)."""
    module = copy.deepcopy(step.module).double()
    state, outs, states = step.initial_state(dtype=torch.float64), [], []
    with torch.no_grad():
        for chunk in chunks:
            out, state = module(chunk.double(), state)
            outs.append(step.named_outputs(out))
            states.append(state)
    return outs, states


def float32_steps(step: StreamStep, chunks, ref_states: list) -> list[float]:
    """Per chunk, the worst leaf's error of one step of the model as written (eager on the CPU, no target's numerics)
    from the float64 state, in the dtype the step carries its state in (StreamStep.as_carried: float32, or float64
    for a step that computes in it): the error the model's own arithmetic makes, today's yardstick."""
    errors = []
    with torch.no_grad():
        for i, chunk in enumerate(chunks):
            prior = step.as_carried(ref_states[i - 1]) if i else step.carried_state()
            errors.append(max(_leaf_errors(step, step.module(chunk, prior)[1], ref_states[i]).values(), default=0.0))
    return errors


def _by_leaf(per_chunk: list[dict]) -> dict[str, list[float]]:
    return {n: [c[n] for c in per_chunk] for n in per_chunk[0]}


def _carry(step: StreamStep, compiled, chunks, device, ref_states, counter, late: list) -> tuple[list, dict, dict]:
    """The stream through the compiled step: per chunk its outputs by name (on the CPU); per state leaf its error
    carried, and from one step off the float64 state."""
    def call(x):
        return compiled(**x)
    state, outs, carried, single = _moved(step.carried_state(), device), [], [], []
    for i, chunk in enumerate(chunks):
        counter.request = i
        out, state = backends.call_counting_recompiles(call, {"chunk": chunk.to(device), "state": state}, late, i)
        outs.append({n: t.detach().cpu() for n, t in step.named_outputs(out).items()})
        carried.append(_leaf_errors(step, state, ref_states[i]))
        prior = _moved(step.as_carried(ref_states[i - 1]) if i else step.carried_state(), device)
        one = backends.call_counting_recompiles(call, {"chunk": chunk.to(device), "state": prior}, late, i)[1]
        single.append(_leaf_errors(step, one, ref_states[i]))
    return outs, _by_leaf(carried), _by_leaf(single)


def _worst(leaves: dict[str, list[float]]) -> list[float]:
    """Per chunk, the largest error of any leaf."""
    return [max(errors) for errors in zip(*leaves.values())]


def _run_target(step: StreamStep, name: str, chunks, reference: tuple[list, list, list], bounds, precision=None,
                sound: int | None = None):
    detected = specs.detect(name)
    backend, device = selection.backend_for(detected, "auto", precision=precision)
    counter = backends.CompileCounter(backend)
    # One target's graphs at a time (torch.compiler.reset docs: reset between unrelated compilations): Dynamo keeps
    # its graphs per code object, so steps of one class checked before would count against its recompile limit
    # and past it the step would run eagerly, uncompiled, as if it were compiled.
    torch.compiler.reset()
    compiled = torch.compile(step.module.to(device), backend=counter, dynamic=False)
    late: list[dict] = []
    with torch.no_grad():
        for shape in dict.fromkeys(tuple(c.shape) for c in chunks):      # warm-up: one compile per shape
            compiled(torch.zeros(shape, device=device), _moved(step.carried_state(), device))
        warm = len(counter.events)
        with torch.compiler.set_stance("fail_on_recompile"):
            outs, carried, single = _carry(step, compiled, chunks, device, reference[1], counter, late)
    step.module.to("cpu")
    compiles = [{"shape": e.shapes.get("chunk") or next(iter(e.shapes.values()), []),
                 "when": "warm-up" if e.index < warm else f"chunk {e.request}", "seconds": e.seconds}
                for e in counter.events]
    not_lowered = sorted({f"{n['op']} ({n['status']})" for e in counter.events if e.check
                          for n in e.check.not_lowered})
    precision_used = getattr(backend, "precision", None) or detected.target.default_precision
    precision_name = precision_used.name
    outputs = output_metrics(step, outs, reference[0], bounds)
    checks = [c for o in outputs.values() for c in o["checks"]]
    agreement = next((c["value"] for c in checks if c["metric"] == "agreement"), None)
    run = TargetStream(name, detected.mode, counter.__name__, precision_name, compiles, len(late), _worst(carried),
                       _worst(single), agreement, not_lowered, leaf_errors=carried, leaf_step_errors=single,
                       outputs=outputs,
                       late=[{"chunk": e["request"], "reason": e["reason"]} for e in late], sound_chunks=sound,
                       state_rtol=tolerance_for(precision_used).rtol, float32_step_error=reference[2])
    run.checks = [drift_check(run, bounds), level_check(run, bounds), *checks]
    return run


def check_key(check: dict) -> str:
    """A stream check's key, the same at every precision: its metric and the output it judges."""
    return f"{check['metric']}:{check['output'] or ''}"


def try_float32(step: StreamStep, run: TargetStream, chunks, reference: tuple[list, list, list], bounds,
                sound: int | None = None) -> dict | None:
    """Where `run` fails a check at a precision that rounds below float32, the same stream at the target's float32
    precision (the advice every stream finding gives), on the same target side: per failing check whether it passes
    there. None where nothing failed, the run computes in float32 already, the target has no float32 precision, or
    it runs natively (a precision is a flag set before the process starts there, so only the one in effect runs)."""
    failing = [check_key(c) for c in run.checks if not c["passed"]]
    target = specs.get(run.target)
    fp32 = next((q for q in target.precisions if compute_dtype(q) == torch.float32), None)
    if not failing or fp32 is None or fp32.name == run.precision or run.mode == "native":
        return None
    other = _run_target(step, run.target, chunks, reference, bounds, fp32.name, sound)
    passed = {check_key(c): c["passed"] for c in other.checks}
    return {"precision": fp32.name, "setting": fp32.setting, "checks": {k: passed.get(k, False) for k in failing}}


def level_check(run: TargetStream, bounds: dict | None = None) -> dict:
    """The stream's state-level check: one step's error from the float64 state at the stream's start (run.level),
    failing where it exceeds both the rtol of the dtype the precision computes in (tolerance.tolerance_for, the
    tolerance the state's leaves are held to on stage 4's main batch) and baseline_factor times the error of one
    step of the model as written in float32 (float32_steps: a deep step's own float32 arithmetic may exceed an rtol
    meant for one op, and that is no regression). It fails where the state is wrong from the first chunk, which the
    drift check, a ratio to one step's error, cannot see: a state off by the same amount at every chunk does not
    grow. Passed where the run knows no tolerance."""
    level, rtol = run.level, run.state_rtol
    factor = {**DEFAULT_TASK_BOUNDS, **(bounds or {})}["baseline_factor"]
    own = level.get("float32_median")
    bound = None if rtol is None else max(rtol, factor * own) if own is not None else rtol
    budget = ("no tolerance" if bound is None else f"<= {bound:.2g}, the larger of rtol {rtol:g} and {factor:g}x "
              f"one float32 step's own error ({own:.2g})" if own is not None else f"<= {rtol:g}")
    return {"metric": "state_error", "output": None,
            "label": f"one step's state error from the float64 state (worst leaf, relative to its norm), median over "
                     f"the stream's first {level['chunks']} sounding chunks; {level['first_chunk']:.2g} at the first",
            "value": level["median"], "budget": budget, "bound": bound,
            "passed": bound is None or level["median"] <= bound,
            "why": "the rtol of the dtype the precision computes in (tolerance.tolerance_for), or the model's own "
                   "float32 error where that is larger: a state wrong beyond it from the first chunk is wrong at "
                   "every chunk, whatever the stream's length"}


def drift_check(run: TargetStream, bounds: dict) -> dict:
    """The stream's drift check: it fails only where the drift leaf's carried error, over one step's, grows beyond
    the budget from the stream's start to its second half (run.growth) and the rise is beyond noise (run.trend)."""
    trend, leaf = run.trend, run.drift_leaf
    where = (" (every state leaf equals float64's exactly)" if leaf is None else
             f" (state leaf {leaf}, the worst of {len(run.leaves)})" if len(run.leaves) > 1 else "")
    silence = (f"; the last {run.trailing_silence} chunks are silence (below {20 * math.log10(SILENCE):.0f} dBFS) "
               "and left out" if run.trailing_silence else "")
    check = _check("drift_growth", f"state error carried over one step's error at the same chunk, its median over "
                   f"the stream's second half / over its first {START_SHARE:.0%}{where}, failing only where it is "
                   f"higher beyond noise ({trend['test']}: p = {trend['p']:.2g}){silence}", run.growth, bounds)
    return {**check, "passed": check["passed"] or not trend["rising"], "trend": trend, "leaf": leaf,
            "trailing_silence": run.trailing_silence}


def check_stream(step: StreamStep, stream: Stream, names, task_bounds: dict | None = None,
                 precision: dict | None = None) -> StreamResult:
    """Each target's compiled step carried over the stream, its state against float64 chunk by chunk and each
    declared output by its kind (STREAM_METRICS, which names the kinds a stream output may declare).
    precision: {target: setting} (stage 4's parameter); a target not named runs its default."""
    names = specs.parse_targets(names)
    if stream.rate != step.rate:
        raise BadParameter("stream rate", stream.rate, hint=f"{step.name} takes {step.rate} Hz audio")
    chunks = stream.chunks(step.chunk)
    if len(chunks) < MIN_CHUNKS:
        raise BadParameter("stream length", f"{stream.seconds:g} s",
                           hint=f"give at least {MIN_CHUNKS} chunks of {step.chunk} samples")
    unknown = next((o for o in step.outputs if o.metric not in STREAM_METRICS), None)
    if unknown is not None:
        raise BadParameter(f"metric of stream output {unknown.name!r}", unknown.metric, list(STREAM_METRICS))
    sound = sounding(chunks)
    if sound < MIN_CHUNKS:
        raise BadParameter("stream length", f"{sound} chunks with sound",
                           hint=f"give at least {MIN_CHUNKS} chunks of {step.chunk} samples before its trailing "
                                f"silence (every sample below {20 * math.log10(SILENCE):.0f} dBFS)")
    bounds = {**DEFAULT_TASK_BOUNDS, **(task_bounds or {})}
    outs, states = _reference(step, chunks)
    reference = (outs, states, float32_steps(step, chunks, states))
    runs = [_run_target(step, n, chunks, reference, bounds, (precision or {}).get(n), sound) for n in names]
    for run in runs:
        run.tried = try_float32(step, run, chunks, reference, bounds, sound)
    # the dtype each state leaf is carried in: the stream starts from it (StreamStep.carried_state)
    carried = {name: str(d).removeprefix("torch.") for name, d in step.carried_dtypes().items()}
    return StreamResult({**step.describe(), "state_dtypes": carried},
                        {"seconds": stream.seconds, "source": stream.source, "label": stream.label,
                         "rate": stream.rate}, len(chunks), runs)
