"""Stage 3's result (buckets.json): what the overflow policy cuts from the corpus and its finding, each target's
chosen plan with its replays (TargetBuckets), and the stage's report with its tables and summary (BucketReport).

    >>> from portkit.stages.buckets import result
    >>> cut = result.truncation(dist, hist)               # the corpus's cut, the one owner of these figures
    >>> result.truncation_finding(cut)["severity"]
    'info'

stage.py computes what goes in; runfolder/buckets_result.py reads buckets.json back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from portkit.core import assessed, grading
from portkit.core import owners
from portkit.models import padding_side
from portkit.corpora import corpus
from portkit.planning import economics
from portkit.runfolder import results
from portkit.core.findings import PADDING_CAUSE
from portkit.planning.planner import (BucketPlan, Histogram, plural)
from portkit.stages.buckets.plots import draw_buckets, padding_slider, plot_histogram, plot_padding  # noqa: F401
from portkit.runfolder.results import Finding
from portkit.stages.buckets.output_probe import FOLLOWS_ADVICE
from portkit.core.tables import HtmlTable
from portkit.targets.backends import compile_cause, failure_text, refusal_advice


STAGE = "buckets"


# A tokenizer called with truncation=True cuts a text past the model's maximum without a word, and
# sentence-transformers embeds only the first max_seq_length tokens of a longer text
# (https://www.sbert.net/examples/sentence_transformer/applications/computing-embeddings/README.html, "Input Sequence
# Length"); return_overflowing_tokens with a stride splits it into overlapping windows instead
# (https://huggingface.co/docs/transformers/pad_truncation).
TRUNCATION_ADVICE = ("embed long {noun} in sliding windows of {limit} {unit} with an overlap (the tokenizer's "
                     "return_overflowing_tokens and stride) and pool the windows' outputs; or take a model with a "
                     "larger maximum; or refuse them with `-p overflow reject`, so that none is cut without a word")
TRUNCATION_SOURCE = "https://huggingface.co/docs/transformers/pad_truncation"
CAP_ADVICE = ("the limit is portkit's, not the model's: raise it to the longest {noun} you serve (" + corpus.RAISE_CAP
              + "), and stage 3 buckets them whole; or refuse them with `-p overflow reject`, so that none is cut "
              "without a word")


def truncation(dist, hist: Histogram) -> dict:
    """What the overflow policy costs the corpus: the items longer than the largest bucket (hist.top: the model's
    maximum or portkit's cap, max_length_from says which, or less), and the tokens they lose (cut off under
    "truncate", every one of them under "reject"), as a count, a share of those items' tokens and a share of the
    corpus's. Stage 3's one owner of these figures: buckets.json's "truncation", its finding (truncation_finding)
    and the report read them."""
    lengths = np.asarray(dist.lengths, dtype=np.int64)
    over = lengths[lengths > hist.top]
    lost = int((over - hist.top).sum()) if hist.overflow == "truncate" else int(over.sum())
    total = int(lengths.sum())
    return {"overflow": hist.overflow, "limit": int(hist.top), "max_length": dist.max_length,
            "max_length_from": getattr(dist, "max_length_from", None), "unit": dist.unit,
            "items": int(lengths.size), "over": int(over.size), "over_share": over.size / max(lengths.size, 1),
            "over_tokens": int(over.sum()), "lost_tokens": lost, "tokens": total,
            "lost_share_of_over": lost / int(over.sum()) if over.size else 0.0, "lost_share": lost / max(total, 1)}


def truncation_finding(cut: dict) -> dict:
    """Stage 3's finding on truncation (kind "truncation"): work when any item is cut, info when none is (or the
    longer ones are rejected, as the overflow policy asks); its figures are truncation's, unchanged."""
    noun = "texts" if cut["unit"] == "tokens" else "items"
    limit, unit, source = cut["limit"], cut["unit"], cut.get("max_length_from")
    cap, note = corpus.limit_text(cut["max_length"], unit, source), corpus.limit_note(source)
    where = cap if limit == cut["max_length"] else f"{limit} {unit} (the largest bucket, below {cap})"
    # windows are for a model whose position table ends there; a cap of portkit's own is raised instead
    advice = (TRUNCATION_ADVICE if source else CAP_ADVICE).format(noun=noun, limit=limit, unit=unit)
    if not cut["over"]:
        return Finding("truncation", grading.severity("truncation", grading.NOTHING_CUT),
                       f"none of the {cut['items']:,} {noun} is longer than {where}: "
                       f"nothing is cut ({note})", advice, source=TRUNCATION_SOURCE).to_dict()
    share = (f"{cut['over']:,} of {cut['items']:,} {noun} ({cut['over_share']:.1%}) are longer than {where}")
    if cut["overflow"] != "truncate":
        return Finding("truncation", grading.severity("truncation", grading.REJECTED),
                       f"{share} and are rejected (overflow {cut['overflow']}): "
                       f"{cut['lost_tokens']:,} {unit}, {cut['lost_share']:.1%} of the corpus's {cut['tokens']:,}, "
                       f"are never served ({note})", advice, source=TRUNCATION_SOURCE).to_dict()
    return Finding("truncation", grading.severity("truncation", grading.CUT),
                   f"{share} and are cut to {limit}: they lose {cut['lost_share_of_over']:.1%} of their {unit} "
                   f"({cut['lost_tokens']:,} of {cut['over_tokens']:,}; {cut['lost_share']:.1%} of the corpus's "
                   f"{cut['tokens']:,}); {note}", advice, source=TRUNCATION_SOURCE,
                   consequence="work: the cut part of each long text never reaches the model, so its output "
                               "describes only the beginning").to_dict()


# ---------------------------------------------------------------- the stage's result
def padding_ok(runs) -> bool | None:
    """The runs' padding checks together: False where padding changed an output at real positions, None where no
    run was checked or some output could not be (ReplayRun.padding_ok), else True."""
    oks = [r.padding_ok for r in runs if r.padding_checks]
    return False if False in oks else None if not oks or None in oks else True


@dataclass
class TargetBuckets:
    """One target's chosen plan, what its compiles cost there, and its replays."""
    target: dict                  # DetectedTarget.to_dict()
    backend: str                  # the torch.compile backend the replays used
    chosen: BucketPlan
    cost: economics.CostModel     # one shape's compile on this target, and where the figure came from
    runs: list = field(default_factory=list)      # trace_replay.ReplayRun, the first without buckets
    what_if: dict = field(default_factory=dict)   # {factor: the auto plan at factor x an estimated cost}
    # whether the model reads its mask input (bucketed.mask_is_read: tried where padding failed); None: no mask
    # input, or not tried
    mask_read: bool | str | None = None   # bucketed.mask_is_read's answer

    @property
    def name(self) -> str:
        return self.target["name"]

    def run_for(self, plan: BucketPlan):
        return run_for(self.runs, plan)

    def priced(self, run) -> float:
        """Seconds the run's compiles take on this target (every graph it compiled, at the target's cost)."""
        return self.cost.total(run.compiled_seqs)

    def replay_failure(self) -> dict | None:
        """Why the chosen plan's replay could not be measured (its run's failure: the target's compiler refused it,
        or the model raised), or None where it was: then what the replay was to establish is not assessed."""
        mine = self.run_for(self.chosen)
        return mine.failure if mine is not None else None

    def open_questions(self) -> list[dict]:
        """What this target's replay left open (core.assessed): where the chosen plan's replay was stopped, its
        compiles after warm-up, its compile time against none and its padding check."""
        mine = self.run_for(self.chosen)
        if mine is None or not mine.failure:
            return []
        why = f"the chosen plan's replay on {self.name} was stopped: {mine.not_measured.removeprefix('not measured: ')}"
        return [assessed.open_question(q, why) for q in (
            "compiles after warm-up under the chosen plan", "warm-up compile time of the chosen plan on the target",
            "padding check of the chosen plan")]

    def summary(self) -> str:
        mode = self.target["mode"]
        warmup = (f"warm-up {self.chosen.settings.get('warmup_seconds', 0):.0f} s ({self.cost.kind})"
                  if not self.replay_failure() else f"warm-up {assessed.NOT_ASSESSED}")
        text = (f"{self.name} ({mode}, {self.backend}): {plural(self.chosen.k, 'bucket')} "
                f"{list(self.chosen.boundaries)}, "
                f"{self.chosen.waste:.1%} padding over the corpus, {warmup}")
        if self.chosen.settings.get("budget_exceeded"):
            text += " (the warm-up budget cannot be met even by one bucket)"
        elif self.chosen.settings.get("budget_binds"):
            text += " (the warm-up budget binds)"
        mine, base = self.run_for(self.chosen), next((r for r in self.runs if r.plan is None), None)
        if mine is not None and mine.failure:     # nothing the replay was to establish is known: it says so
            text += (f"; replay of the chosen plan {assessed.NOT_ASSESSED} (compiles after warm-up, compile time "
                     f"with the plan, padding check): {mine.not_measured}")
        elif mine is not None:
            text += (f"; replay of {mine.requests} requests: {plural(mine.compiles, 'compile')}, "
                     f"{mine.compiles_after_warmup} after warm-up")
            if base is not None and base.failure:
                text += f"; without buckets {assessed.NOT_ASSESSED} ({base.not_measured})"
            elif base is not None:
                counted = "; counted, not compiled" if base.note.startswith("counted") else ""
                text += (f"; without buckets {base.compiles} compiles (one per distinct length among these "
                         f"requests{counted}), {self.priced(base):.0f} s compiling on {self.name} vs "
                         f"{self.priced(mine):.0f} s with the plan")
            ok = padding_ok(self.runs)
            text += {True: "; padding check passed", False: "; padding check FAILED", None: ""}[ok]
            left = any(c.get("side") == "left" for r in self.runs for c in r.padding_checks)
            text += " (padded on the left, as the model's batches are)" if ok is not None and left else ""
        unchecked = self.padding_unchecked()
        if unchecked:
            text += f"; could not check padding of output(s) {', '.join(unchecked)} (their real positions are unknown)"
        failed = [r.name for r in self.runs if r.failure and r is not mine]
        if failed:
            text += f"; not measured: {', '.join(failed)}"
        return text

    def padding_unchecked(self) -> dict[str, tuple[str, list[str]]]:
        """The outputs no padding check could compare: {output: (why, the runs)}."""
        found: dict[str, tuple[str, list[str]]] = {}
        for r in self.runs:
            for name, why in r.padding_unchecked.items():
                found.setdefault(name, (why, []))[1].append(r.name)
        return found

    def __str__(self) -> str:
        return self.summary()

    __repr__ = __str__

    def findings(self) -> list[dict]:
        """This stage's findings in the report's terms (severity, message, advice)."""
        out = []
        failed = [r for r in self.runs if r.padding_ok is False]
        if failed:
            out.append(self._padding_finding(failed))
        out += self._not_measured()
        for name, (why, runs) in self.padding_unchecked().items():
            out.append(Finding("padding_unchecked", grading.severity("padding_unchecked"),
                               f"could not check padding of output {name!r} ({', '.join(runs)}): "
                               + why.removesuffix(": " + FOLLOWS_ADVICE),
                               FOLLOWS_ADVICE, source="https://pytorch.org/docs/stable/generated/torch.nn.Conv1d.html",
                               consequence="work: the bucket plan is not proven to leave this output's real "
                                           "positions unchanged until its stride is declared").to_dict())
        late = sum(r.compiles_after_warmup for r in self.runs)
        if late:
            run = next(r for r in self.runs if r.compiles_after_warmup)
            first = (run.late_compiles or [{}])[0]
            where = (f"request {first['request'] + 1}" if first.get("request") is not None else "the padding check")
            shape = "x".join(map(str, first.get("shape") or ())) or "?"
            out.append(Finding("recompile_after_warmup", grading.severity("recompile_after_warmup"),
                               f"{late} compiles after warm-up under the bucket plan; first in {run.name}: "
                               f"{where}, shape {shape}, guard failure: {first.get('reason', '?')}",
                               "a shape the warm-up did not compile reached the model: warm up every "
                               "(batch, seq) bucket and pad every input the model takes to one of them").to_dict())
        mine = self.run_for(self.chosen)
        replayed = (f", {mine.compiles_after_warmup} after warm-up in the replay" if mine and not mine.failure
                    else f"; its replay {assessed.NOT_ASSESSED} ({mine.not_measured})" if mine else "")
        out.append(Finding("bucket_plan", grading.severity("bucket_plan"),
                           f"use {self.chosen.planner} buckets {list(self.chosen.boundaries)}"
                           + (f" x batch {list(self.chosen.batch_sizes)}" if self.chosen.batch_sizes != (1,) else "")
                           + f": {self.chosen.waste:.1%} padding, {plural(self.chosen.compiles, 'compile')} planned"
                           + replayed, self.chosen.why + self.what_if_text(), source=self.cost.label()).to_dict())
        return out

    def _padding_finding(self, failed: list) -> dict:
        """Padding that changes the outputs at real positions, as one finding for the target however many runs
        and bucket shapes showed it (the grading policy's "padding": work, the model runs at exact lengths). Each
        failing shape was checked again padded on the other side where the tokenizer's side moves the padding
        (bucketed.check_padding's "other_side"): the advice says what that try gave (padding_side.advice, stage 4's
        rule too). A model with no mask input reads its padded positions wherever it mixes positions (a
        normalisation or a pooling over the sequence axis): no mask can fix that, so the advice is what the policy
        names; with a mask, where the mask does not reach is a lead, not a tried fix."""
        checks = [c for r in failed for c in r.padding_checks if c.get("ok") is False]
        first = next(f for c in checks for f in c.get("failures", []))
        shapes = sorted({f"{c['batch']}x{c['seq']}" for c in checks})
        side = checks[0].get("side", "right")
        tried = [{"path": f"{c['batch']}x{c['seq']}", "padding_side": c["other_side"]["side"],
                  "passed": c["other_side"]["ok"] is True} for c in checks if c.get("other_side")]
        mixing = "a layer that mixes positions (a normalisation or a pooling over the sequence axis)"
        if isinstance(self.mask_read, str):       # the try could not run: nothing is said of the mask
            why = (f"whether the model reads its mask was not tried ({self.mask_read}); the real positions move or "
                   f"read the padding (positions counted from the first slot, or {mixing})")
        else:
            why = {None: f"the model takes no mask input, so {mixing} reads the padded ones",
                   False: "tried: the outputs are the same whether the mask marks the padding or not, so the model "
                          f"does not read its mask and {mixing} reads the padded ones",
                   True: "the padded positions are masked, yet a layer reads them (a normalisation over the sequence "
                         "axis, or a layer the mask does not reach)"}[self.mask_read]
        fixed = bool(tried) and all(t["passed"] for t in tried) and {t["path"] for t in tried} == set(shapes)
        if fixed:
            why = (f"padded on the {side}, the real positions move or read the padding (positions counted from the "
                   f"first slot, or a layer that mixes positions); padded on the {tried[0]['padding_side']}, tried, "
                   "they do not")
        advice = padding_side.advice(tried, shapes, "in stage 3's padding check")
        if self.mask_read is True and not fixed:
            advice += "; may help: pass the mask to every layer that mixes positions (not tried by portkit)"
        return Finding("padding", grading.severity("padding"),
                       f"padding to a bucket on the {side} changes the outputs at real positions "
                       f"({', '.join(shapes)} in {', '.join(r.name for r in failed)}; first: {first}): {why}", advice,
                       source="vllm-project/tpu-inference#3466",
                       consequence="work: the model runs, at exact-length batches or a compile per length",
                       cause=PADDING_CAUSE,
                       occurrences={"runs": [r.name for r in failed], "shapes": shapes, "count": len(checks),
                                    "side": side, "tried": tried}).to_dict()

    def _not_measured(self) -> list[dict]:
        """One finding per cause that stopped a run (a refusal of the target's compiler, or what the model raised):
        its cause is stage 2's for the same failure (backends.compile_cause), the runs it stopped its occurrences."""
        causes: dict[str, dict] = {}
        for r in self.runs:
            if r.failure:
                f = r.failure
                text = f["message"] if f["kind"] == "refused" else failure_text(f)    # as stage 2 words it
                entry = causes.setdefault(compile_cause(f["kind"], f["where"], text), {"failure": f, "runs": []})
                entry["runs"].append(f"{r.name} ({f['step']})")
        out = []
        for cause, entry in causes.items():
            f, runs = entry["failure"], entry["runs"]
            if f.get("eager"):
                out.append(self._raises_itself(f, runs, cause))
                continue
            refused = f["kind"] == "refused"
            kind = "compile_refused" if refused else "compile_failed"
            out.append(Finding(
                kind, grading.severity(kind),
                f"{', '.join(runs)} could not be measured on {self.name}: {failure_text(f)}",
                (refusal_advice(f["message"], f["where"], "the bucket plan's fixed shapes")
                 + " (stage 2 names the same cause), then replay the buckets") if refused
                else f.get("hint") or "fix the model where it raises, then replay the buckets",
                where=f["where"], owner=owners.owner(f["where"]) if f["where"] else None, cause=cause,
                consequence=("blocker: the target's compiler refuses the model, so no bucket plan runs there"
                             if refused else "blocker: the model raises at these bucket shapes"),
                occurrences={"runs": runs, "count": len(runs)}).to_dict())
        return out

    def _raises_itself(self, f: dict, runs: list[str], cause: str) -> dict:
        """A run the model stopped by raising at its shapes without any target: run eagerly in float32 on the CPU
        at the run's largest shape it raises too, so the shape is beyond what the model takes on every device (a
        maximum in practice below its config's), not the target's failure; the plan's questions stay open."""
        eager = f["eager"]
        where = eager["where"] or f["where"]
        return Finding(
            "model_raises", grading.severity("model_raises"),
            f"{', '.join(runs)} could not be measured on {self.name}: the model itself raises at length "
            f"{eager['length']:,}, eagerly in float32 on the CPU without the target ({eager['message']}), so on "
            f"every device; the target's run stopped on it ({failure_text(f)})",
            f"a lead, not tried: the model takes less than length {eager['length']:,} in practice: cap its inputs "
            "below that (a factory of your own: LoadedModel(..., max_length=N), docs/guides/declaring-a-model.md) "
            "and replay the buckets",
            where=where, owner=owners.owner(where) if where else None, cause=cause,
            consequence="work: the bucket plan must stay below the length the model raises at; what the plan "
                        "would show stays open",
            occurrences={"runs": runs, "count": len(runs), "length": eager["length"]}).to_dict()

    def what_if_text(self) -> str:
        """How the plan changes at WHAT_IF times an estimated compile cost ("" for a measured one)."""
        return "".join(f". At {f:g}x the estimate ({self.cost.seconds(self.chosen.top) * f:.0f} s a compile): "
                       f"{plural(p.k, 'bucket')} {list(p.boundaries)}, {p.waste:.1%} padding"
                       for f, p in self.what_if.items())

    def to_dict(self) -> dict:
        return {"target": self.target, "summary": self.summary(), "backend": self.backend,
                "findings": self.findings(), "chosen": self.chosen.to_dict(),
                "compile_cost": self.cost.to_dict(),
                "compile_seconds_per_bucket": {"value": self.chosen.settings.get("compile_seconds"),
                                               "source": self.cost.label(), "kind": self.cost.kind},
                "what_if": {str(f): {"k": p.k, "boundaries": list(p.boundaries), "padding_waste": p.waste,
                                     "warmup_seconds": p.settings.get("warmup_seconds")}
                            for f, p in self.what_if.items()},
                "compiles_after_warmup": (None if self.replay_failure()
                                          else sum(r.compiles_after_warmup for r in self.runs)),
                assessed.KEY: self.open_questions(),
                "padding_ok": padding_ok(self.runs), "mask_read": self.mask_read, "padding_unchecked": {
                    name: {"why": why, "runs": runs} for name, (why, runs) in self.padding_unchecked().items()},
                "not_measured": [{"run": r.name, **r.failure} for r in self.runs if r.failure],
                "replay": [{**r.to_dict(), "target_compile_seconds": None if r.failure else self.priced(r)}
                           for r in self.runs]}


@dataclass
class BucketReport:
    """Stage 3's result: the distribution, the planners side by side, and per target the chosen
    plan with its replays."""
    model: dict
    distribution: dict
    histogram: Histogram
    k: int
    plans: list[BucketPlan]
    curves: dict
    token_seconds: dict | float       # per target, what a padded position costs (economics.padding_prices)
    trace: dict
    targets: dict[str, TargetBuckets]
    grid: dict | None = None          # two varying dimensions: grid_costs.GridComparison.to_dict()
    generation: dict | None = None    # workload "generate": generation_buckets.ServingPlans.to_dict()
    training: dict | None = None      # workload "train": per target, training.layouts' rows
    truncation: dict | None = None    # what the overflow policy cuts from the corpus (truncation)

    def summary(self) -> str:
        return " | ".join(t.summary() for t in self.targets.values())

    def to_dict(self) -> dict:
        return {"stage": STAGE, "model": self.model, "summary": self.summary(),
                "distribution": {**self.distribution, "histogram": self.histogram.to_dict()},
                "k": self.k, "plans": [p.to_dict() for p in self.plans],
                "padding_by_buckets": {n: [{"k": k, "padding_waste": w} for k, w in pts]
                                       for n, pts in self.curves.items()},
                "padding_price": economics.prices_to_dict(self.token_seconds), "trace": self.trace,
                "targets": {n: self._target_dict(t) for n, t in self.targets.items()}, "grid": self.grid,
                "generation": self.generation, "training": self.training, "truncation": self.truncation}

    def _target_dict(self, t: TargetBuckets) -> dict:
        """One target's result, with the truncation finding first (the corpus's, the same for every target)."""
        out = t.to_dict()
        if self.truncation:
            out["findings"].insert(0, truncation_finding(self.truncation))
        return out

    def save(self, path) -> None:
        results.save_result(path, self.to_dict())

    def table(self, target: str | None = None):
        """Per replay run: compiles, padding, compile time on the target (priced) and here, run time."""
        t = self.targets[target or next(iter(self.targets))]
        rows = [[r.name + (" (chosen)" if r.plan == t.chosen.to_dict() else "") + (
                    " (counted, not compiled)" if r.note.startswith("counted") else ""),
                 "-" if r.plan is None else str(r.plan["boundaries"]),
                 *([assessed.NOT_ASSESSED] * 3 if r.failure else [r.compiles, r.compiles_after_warmup,
                                                                   f"{r.waste:.1%}"]),
                 assessed.NOT_ASSESSED if r.failure else f"{t.priced(r):.0f}", f"{r.compile_seconds:.1f}",
                 f"{r.run_seconds:.2f}",
                 "not measured" if r.failure else "-" if not r.padding_checks else
                 {None: "could not check", True: "ok", False: "FAILED"}[r.padding_ok]] for r in t.runs]
        return HtmlTable(["run", "buckets", "compiles", "after warm-up", "padding", f"compile s on {t.name}",
                          "compiling here s", "run here s", "padding check"], rows,
                         f"{t.name} ({t.target['mode']}), backend {t.backend}: replay of {self.trace['requests']} "
                         f"requests; compile on {t.name}: {t.cost.label()}")

    def padding_table(self):
        """Per target, plan and bucket shape: the padding check against unpadded eager outputs."""
        rows = []
        for t in self.targets.values():
            for r in t.runs:
                for c in r.padding_checks:
                    rows.append([t.name, f"{r.name} [{r.backend}]", f"{c['batch']} x {c['seq']}",
                                 ", ".join(map(str, c["lengths"])), f"{c['max_abs_error']:.1e}",
                                 f"{c['rtol']:g} / {c['atol']:g}", _check_result(c)])
        return HtmlTable(["target", "plan [backend]", "bucket (batch x seq)", "real lengths", "max abs error",
                          "rtol / atol", "result"], rows,
                         "outputs at real positions, padded and compiled, vs unpadded eager under the same numerics")

    def plot(self):
        """Each target's replay: its compile (priced on the target) and run time per plan, one panel per target. The
        padding against the number of buckets is the notebook's plot_padding, drawn once before the replay."""
        import matplotlib.pyplot as plt
        targets = list(self.targets.values())
        fig, axes = plt.subplots(1, max(len(targets), 1), figsize=(6.5 * max(len(targets), 1), 3.8), squeeze=False)
        for ax, t in zip(axes[0], targets):
            names = [r.name for r in t.runs]
            priced = [t.priced(r) for r in t.runs]
            ax.barh(names, priced, color="#C44E52", label=f"compile on {t.name} ({t.cost.kind})")
            ax.barh(names, [r.run_seconds for r in t.runs], left=priced, color="#4C72B0", label="run (this CPU)")
            ax.set_xlabel("seconds")
            ax.set_title(f"{t.name} ({t.target['mode']}, {t.backend}): replay of {self.trace['requests']} requests",
                         fontsize=9)
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def __str__(self) -> str:
        lines = [f"Shape buckets for {self.model['name']}: {self.distribution.get('count')} texts, p50 "
                 f"{self.distribution.get('p50')}, p99 {self.distribution.get('p99')}, max "
                 f"{self.distribution.get('max')}; {self.histogram}"]
        lines += ["  " + str(p) for p in self.plans]
        for t in self.targets.values():
            lines.append("  " + t.summary())
            lines += ["    " + str(r) for r in t.runs]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        parts = [f"<p><b>Shape buckets</b> for <code>{html.escape(self.model['name'])}</code>: "
                 f"{html.escape(str(self.histogram))}</p>"]
        for t in self.targets.values():
            parts.append(f"<h4>{html.escape(t.target['title'])} — <i>{t.target['mode']}</i></h4>"
                         f"<p>{html.escape(t.summary())}</p>"
                         f"<p><i>why:</i> {html.escape(t.chosen.why + t.what_if_text())}</p>"
                         + self.table(t.name)._repr_html_())
        return "\n".join(parts)


def _check_result(check: dict) -> str:
    """One bucket shape's padding check in a word and its first reason."""
    if check["ok"] is None:
        return "could not check: " + ", ".join(check.get("unchecked") or {})
    return "ok" if check["ok"] else "FAILED: " + check["failures"][0]


def run_for(runs, plan: BucketPlan):
    return next((r for r in runs if r.plan == plan.to_dict()), None)
