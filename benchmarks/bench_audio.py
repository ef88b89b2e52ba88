"""Bucketing audio durations: padded samples of the `optimal` plan divided by those of `pow2` with the same
number of buckets, on real speech durations at 16 kHz (CREPE's and wav2vec2's rate).

    .venv/bin/python benchmarks/bench_audio.py [--texts 512] [--max-seconds 30]

The durations: the spoken recordings of Debian's alsa-utils (real, 8 clips) and the first paragraphs of
`--texts` docstrings of the standard library spoken by espeak-ng (synthetic speech, labelled so; cached after
the first run): the corpus the workbook gives an audio model (data.audio_corpus), capped at
`--max-seconds` (30 s: Whisper's window; longer clips are cut to it, as a model's max_length cuts texts).
Every k is printed up to one past the k whose smallest power of two still holds a clip (beyond it pow2 only adds
empty buckets); the headline is k = 4.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from portkit.corpora import audio
from portkit.models.audio import crepe_declaration, wav2vec2_declaration
from portkit.corpora.corpus import audio_corpus
from portkit.planning import planner

RATE = 16000


def _row(k: int, hist: planner.Histogram) -> tuple[planner.BucketPlan, planner.BucketPlan]:
    return planner.plan_pow2(hist, k=k), planner.plan_optimal(hist, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=512, help="docstrings spoken by espeak-ng")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="the largest bucket, in seconds")
    args = parser.parse_args()
    start = time.perf_counter()
    recorded = audio.alsa_recordings()
    both = audio_corpus("stdlib", clips=args.texts)      # the workbook's audio corpus, as the stages read it
    print(f"synthesis (or cache) {time.perf_counter() - start:.1f} s")
    cap = int(args.max_seconds * RATE)
    for corpus in (recorded, both):
        lengths = corpus.lengths(RATE)
        hist = planner.histogram(lengths, max_seq=cap)
        secs = lengths / RATE
        print(f"\n{corpus}")
        print(f"  seconds p50 {np.percentile(secs, 50):.2f}, p90 {np.percentile(secs, 90):.2f}, "
              f"max {secs.max():.2f}; {hist.over} longer than {args.max_seconds:g} s (cut to it); "
              f"{hist.values.size} distinct lengths in samples")
        print(f"  {'k':>3} {'pow2 boundaries (s)':<46} {'pow2 padded':>12} {'optimal padded':>15} {'ratio':>6}")
        # past the k whose smallest power of two is below the shortest clip, pow2 adds only empty buckets
        useful = planner.plan_pow2(hist, minimum=int(hist.values[0])).k
        for k in range(1, min(useful + 1, hist.values.size) + 1):
            pow2, best = _row(k, hist)
            shown = str([round(b / RATE, 2) for b in pow2.boundaries])
            ratio = best.padded_tokens / pow2.padded_tokens if pow2.padded_tokens else 1.0
            print(f"  {k:>3} {shown:<46} {pow2.padded_tokens:>12,} {best.padded_tokens:>15,} {ratio:>6.3f}")
        k = min(4, hist.values.size)
        pow2, best = _row(k, hist)
        print(f"  k={k}: pow2 {[round(b / RATE, 2) for b in pow2.boundaries]} s pads {pow2.waste:.1%} of computed "
              f"samples; optimal {[round(b / RATE, 2) for b in best.boundaries]} s pads {best.waste:.1%}; "
              f"ratio optimal/pow2 padded samples = "
              f"{best.padded_tokens / pow2.padded_tokens if pow2.padded_tokens else 1.0:.3f}")

    print("\nWhat the workbook buckets for each audio model: its varying dimension (frames), capped at its maximum")
    for name, decl in (("crepe", crepe_declaration()), ("wav2vec2", wav2vec2_declaration())):
        dim = decl.varying[0]
        frames = decl.lengths(list(both.clips))[dim.name]
        hist = planner.histogram(frames, max_seq=dim.max)
        k = min(4, hist.values.size)
        pow2, best = _row(k, hist)
        ratio = best.padded_tokens / pow2.padded_tokens if pow2.padded_tokens else 1.0
        print(f"  {name}: {len(frames)} clips, {hist.over} over {dim.max} {dim.name}; k={k}: pow2 "
              f"{list(pow2.boundaries)} pads {pow2.waste:.1%}, optimal {list(best.boundaries)} pads "
              f"{best.waste:.1%}; ratio optimal/pow2 padded {dim.name} = {ratio:.3f}")


if __name__ == "__main__":
    main()
