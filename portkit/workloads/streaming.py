"""A stateful streaming step under each target: compiled once per chunk shape, its state carried across a
real stream, and the state's drift against float64 measured over the whole stream.

    >>> from portkit.models import audio as audio_models
    >>> from portkit.workloads import streaming
    >>> step = audio_models.gru_step()                  # STFT log-mel front end + GRU; random weights (seed 0)
    >>> stream = streaming.speech_stream(seconds=20)    # recordings and spoken corpus texts, end to end, 16 kHz
    >>> result = streaming.check_stream(step, stream, ["neuron", "tpu"])
    >>> print(result)        # per target: compiles per chunk shape, the state's error chunk by chunk, its growth

A streaming step is a module called as `step(chunk, state) -> (output, state)`. Each step's rounding is
small, but the state carries it on and a recurrence can amplify it, so each target's run carries its own
state and at every chunk is measured against a float64 run of the same stream; the error of one step alone
(from the float64 state) shows how much of the drift is carried. A drift fails the budget
(tolerance.DEFAULT_TASK_BOUNDS["drift_growth"]) where the error over the stream's second half grows beyond it
against the first chunks' and a rank test says that rise is no noise (drift_check).

The step is compiled per target with the backend `selection` picks (native, else emulated): once per chunk
shape (the full chunk and the stream's shorter tail), warmed up on silence, then the whole stream runs under
`set_stance("fail_on_recompile")`, so any further compile is caught and counted.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from portkit.corpora import audio
from portkit.targets import backends
from portkit.corpora import corpus as data
from portkit.targets import selection
from portkit.targets import specs as targets_mod
from portkit.models.audio import RATE, StreamStep
from portkit.core.errors import BadParameter
from portkit.targets.tolerance import DEFAULT_TASK_BOUNDS, TASK_BOUND_REASONS, budget_text, within

START_CHUNKS = 3           # the drift's yardstick: the state's error over the stream's first chunks
MIN_CHUNKS = 20            # a stream shorter than this cannot show a drift apart from its start
DRIFT_P = 0.01             # a drift's significance: noise alone reads as a rising error once in a hundred streams
STREAM_SECONDS = 20.0      # the workbook's stream: 200 chunks of 100 ms


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
        """(1, size) chunks in order; the last is shorter where the stream does not divide evenly."""
        whole = torch.from_numpy(self.samples).float().unsqueeze(0)
        # each chunk its own buffer, as a stream delivers it (a view of the whole would carry other strides)
        return [whole[:, i:i + size].clone(memory_format=torch.contiguous_format)
                for i in range(0, whole.shape[1], size)]


def speech_stream(seconds: float = STREAM_SECONDS, rate: int = RATE, clips=None, source: str | None = None,
                  seed: int = 0) -> Stream:
    """`clips` (audio.Clip, e.g. the run's corpus: data.corpus_for) end to end, cut at `seconds`; by default
    the alsa-utils recordings, then stdlib docstrings spoken by espeak-ng."""
    if clips is None:
        corpus = data.audio_corpus("stdlib", clips=64, seed=seed)
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


@dataclass
class TargetStream:
    """One target's run over the stream."""
    target: str
    mode: str
    backend: str
    precision: str
    compiles: list[dict]                      # each compile: the chunk shape and when (warm-up or stream)
    late_compiles: int                        # compiles the fail_on_recompile stance caught during the stream
    state_error: list[float]                  # per chunk: carried state vs float64
    step_error: list[float]                   # per chunk: one step from the float64 state vs float64
    agreement: float                          # frame labels (argmax) equal to float64's, over the stream
    not_lowered: list[str] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)

    @property
    def growth(self) -> float:
        """The state's median error over the stream's second half against its median over the first START_CHUNKS:
        medians of windows, so one low or high chunk does not make a flat error look like drift."""
        first = float(np.median(self.state_error[:START_CHUNKS]))
        last = float(np.median(self.state_error[len(self.state_error) // 2:]))
        return last / first if first > 0 else (1.0 if last == 0 else math.inf)

    @property
    def trend(self) -> dict:
        """Whether the error over the stream's second half is higher than at its start beyond what noise explains: a
        one-sided Mann-Whitney U test of the two windows' errors (scipy.stats.mannwhitneyu). Noise around a flat error
        makes the windows exchangeable, so it reads "rising" with probability DRIFT_P."""
        from scipy import stats
        first, last = self.state_error[:START_CHUNKS], self.state_error[len(self.state_error) // 2:]
        p = float(stats.mannwhitneyu(last, first, alternative="greater").pvalue)
        return {"test": f"Mann-Whitney U, the second half's chunks > the first {START_CHUNKS}", "p": p,
                "rising": p < DRIFT_P}

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)

    def to_dict(self) -> dict:
        return {"target": self.target, "mode": self.mode, "backend": self.backend, "precision": self.precision,
                "compiles": self.compiles, "late_compiles": self.late_compiles,
                "compiled_shapes": sorted({tuple(c["shape"]) for c in self.compiles}),
                "state_error_first": self.state_error[0], "state_error_last": self.state_error[-1],
                "state_error_max": max(self.state_error), "step_error_median": float(np.median(self.step_error)),
                "carried_over_step": self.state_error[-1] / max(float(np.median(self.step_error)), 1e-300),
                "drift_growth": self.growth, "drift_trend": self.trend, "label_agreement": self.agreement,
                "state_error": self.state_error, "step_error": self.step_error,
                "not_lowered": self.not_lowered, "checks": self.checks, "passed": self.passed}


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
        for r in self.runs:
            d = r.to_dict()
            lines.append(f"  {r.target} ({r.mode}, {r.backend}, precision {r.precision}): "
                         f"{len(r.compiles)} compiles for {len(d['compiled_shapes'])} chunk shapes, "
                         f"{r.late_compiles} during the stream; state error vs float64 "
                         f"{d['state_error_first']:.2e} at the first chunk, {d['state_error_last']:.2e} at the "
                         f"last (one step alone: {d['step_error_median']:.2e}); growth {d['drift_growth']:.2f}x "
                         f"-> {'PASS' if r.passed else 'FAIL'}; frame labels agree {r.agreement:.2%}")
        return "\n".join(lines)

    __repr__ = __str__

    def plot(self, ax=None):
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(7, 3))[1]
        for r in self.runs:
            ax.semilogy(r.state_error, label=f"{r.target}: carried state")
            ax.semilogy(r.step_error, ls=":", label=f"{r.target}: one step from the float64 state")
        ax.set_xlabel("chunk")
        ax.set_ylabel("relative error vs float64")
        ax.set_title("State drift over the stream")
        ax.legend(fontsize=7)
        return ax


def _reference(step: StreamStep, chunks) -> tuple[list, list]:
    """float64 outputs and states along the stream (the truth every target is measured against)."""
    module = copy.deepcopy(step.module).double()
    state, outs, states = step.initial_state(dtype=torch.float64), [], []
    with torch.no_grad():
        for chunk in chunks:
            out, state = module(chunk.double(), state)
            outs.append(out)
            states.append(state)
    return outs, states


def _run_target(step: StreamStep, name: str, chunks, ref_outs, ref_states, bounds, precision=None):
    detected = targets_mod.detect(name)
    backend, device = selection.backend_for(detected, "auto", precision=precision)
    counter = backends.CompileCounter(backend)
    module = step.module.to(device)
    compiled = torch.compile(module, backend=counter, dynamic=False)
    late: list[dict] = []
    with torch.no_grad():
        for shape in dict.fromkeys(tuple(c.shape) for c in chunks):      # warm-up: one compile per shape
            compiled(torch.zeros(shape, device=device), step.initial_state().to(device))
        warm = len(counter.events)
        state, errors, single, same, frames = step.initial_state().to(device), [], [], 0, 0
        with torch.compiler.set_stance("fail_on_recompile"):
            for i, chunk in enumerate(chunks):
                counter.request = i
                inputs = {"chunk": chunk.to(device), "state": state}
                out, state = backends.call_counting_recompiles(lambda x: compiled(**x), inputs, late, i)
                errors.append(_relative(state.cpu(), ref_states[i]))
                prior = ref_states[i - 1].float().to(device) if i else step.initial_state().to(device)
                one = backends.call_counting_recompiles(lambda x: compiled(**x),
                                                        {"chunk": chunk.to(device), "state": prior}, late, i)[1]
                single.append(_relative(one.cpu(), ref_states[i]))
                same += int((out.cpu().argmax(-1) == ref_outs[i].argmax(-1)).sum())
                frames += ref_outs[i].shape[0] * ref_outs[i].shape[1]
    step.module.to("cpu")
    compiles = [{"shape": e.shapes.get("chunk") or next(iter(e.shapes.values()), []),
                 "when": "warm-up" if e.index < warm else f"chunk {e.request}", "seconds": e.seconds}
                for e in counter.events]
    not_lowered = sorted({f"{n['op']} ({n['status']})" for e in counter.events if e.check
                          for n in e.check.not_lowered})
    precision_name = getattr(getattr(backend, "precision", None), "name", detected.target.default_precision.name)
    run = TargetStream(name, detected.mode, counter.__name__, precision_name, compiles, len(late), errors, single,
                       same / max(frames, 1), not_lowered)
    run.checks = [drift_check(run, bounds)]
    return run


def drift_check(run: TargetStream, bounds: dict) -> dict:
    """The stream's drift check: it fails only where the error grows beyond the budget (run.growth) and the
    second half's errors are higher than the start's beyond noise (run.trend)."""
    trend = run.trend
    passed = within("drift_growth", run.growth, bounds) or not trend["rising"]
    return {"metric": "drift_growth", "label": "state error's median over the stream's second half / over its first "
            f"{START_CHUNKS} chunks, failing only where it is higher beyond noise ({trend['test']}: "
            f"p = {trend['p']:.2g})", "value": run.growth, "budget": budget_text("drift_growth", bounds),
            "bound": bounds["drift_growth"], "passed": passed, "trend": trend,
            "why": TASK_BOUND_REASONS["drift_growth"]}


def check_stream(step: StreamStep, stream: Stream, names, task_bounds: dict | None = None,
                 precision: dict | None = None) -> StreamResult:
    """Each target's compiled step carried over the stream, its state against float64 chunk by chunk.
    precision: {target: setting} (stage 4's parameter); a target not named runs its default."""
    names = targets_mod.parse_targets(names)
    if stream.rate != step.rate:
        raise BadParameter("stream rate", stream.rate, hint=f"{step.name} takes {step.rate} Hz audio")
    chunks = stream.chunks(step.chunk)
    if len(chunks) < MIN_CHUNKS:
        raise BadParameter("stream length", f"{stream.seconds:g} s",
                           hint=f"give at least {MIN_CHUNKS} chunks of {step.chunk} samples")
    bounds = {**DEFAULT_TASK_BOUNDS, **(task_bounds or {})}
    ref_outs, ref_states = _reference(step, chunks)
    runs = [_run_target(step, n, chunks, ref_outs, ref_states, bounds, (precision or {}).get(n)) for n in names]
    return StreamResult(step.describe(), {"seconds": stream.seconds, "source": stream.source,
                                          "label": stream.label, "rate": stream.rate}, len(chunks), runs)
