"""Stage 4's result in words, tables and plots: the GPU baseline's role, and the notebook's tables of an AccuracyReport.

    >>> report.outputs_table(), report.precision_table(), report.bucket_table(), report.layer_table("tpu")
    >>> report.plot()                  # error against depth, one line per precision; max error per bucket
    >>> tables.against_baseline(result.baseline)   # "error against the float64 reference 3.1x that of ..."

AccuracyTables is the AccuracyReport's notebook side (result.py holds the data and the verdict); it reads only
the report's fields (model, reference, targets).
"""
from __future__ import annotations

from portkit.core.tables import HtmlTable
from portkit.stages.accuracy import stats
from portkit.stages.accuracy.comparison import primary_output
from portkit.targets.tolerance import FLOAT32_ON_CPU

ASSERT_CLOSE = "element-wise assert_close (detail, does not decide)"


def against_baseline(b: dict) -> str:
    """A result's error against float64 next to the GPU baseline's own, in words."""
    if b["target_error"] != b["target_error"]:      # nan: the output's shape differs, nothing was compared
        return f"no error against {b['truth']}: the output's shape differs from it"
    if b["ratio"] is None:
        return f"relative L2 error {b['target_error']:.2g} against {b['truth']} where {b['label']} has none"
    cpu = f", the target side {FLOAT32_ON_CPU}" if b.get("float32_on_cpu") else ""
    return f"error against {b['truth']} {b['ratio']:.3g}x that of {b['label']}{cpu}"


def baseline_role(b: dict) -> str:
    """Whether the GPU comparison decides, in words. It decides only within its factor: an error no worse than
    today's deployment's is no regression, a PASS whatever the task metrics say. Beyond it, the task metrics decide:
    the ratio is to the GPU setup's own error, and an fp32 GPU's is float32 rounding alone (relative ~1e-7), so any
    reduced-precision rounding reads as thousands of times it without being a regression by itself."""
    if b["within"]:
        return f"within {b['factor']:g}x: no regression against today's GPU, so this decides (PASS)"
    own = f"its own error is {b['gpu_error']:.1g}" if b.get("gpu_error") else "it has no error of its own"
    return (f"beyond {b['factor']:g}x of today's error, so the task metrics decide; a ratio to {b['label']} is no "
            f"regression by itself: {own}, so any rounding below float32 reads as a large multiple of it")


class AccuracyTables:
    """The notebook's tables and plot of an AccuracyReport (result.AccuracyReport inherits them)."""

    def outputs_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for name, o in t.chosen.outputs.items():
                rows.append([t.name, t.chosen.name, t.chosen.target_side, name, f"{o['max_abs']:.3g}",
                             f"{o['max_rel']:.3g}",
                             f"{o['rel_l2']:.3g}", f"{o['cosine_min']:.7f}",
                             f"{o['tolerance']['dtype']} ({o['tolerance']['rtol']:g}, {o['tolerance']['atol']:g})",
                             "pass" if o["passed"] else "FAIL", "every change the target makes"])
                for cause in t.chosen.error_by_cause or []:   # the same error, split by what caused it
                    c = cause["outputs"][name]
                    rows.append([t.name, t.chosen.name, cause["measured"], name, f"{c['max_abs']:.3g}",
                                 f"{c['max_rel']:.3g}", f"{c['rel_l2']:.3g}", f"{c['cosine_min']:.7f}", "-", "-",
                                 cause["cause"]])
        return HtmlTable(["target", "precision", "run as", "output", "max abs", "max rel", "rel L2", "cosine min",
                          "tolerance (rtol, atol)", ASSERT_CLOSE, "error caused by"], rows,
                         f"outputs at real positions vs the reference ({self.reference['description']}); the "
                         "verdict is the task metrics' against their budgets (see the verdict), not this table")

    def precision_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for r, a in zip((t.chosen, *t.others), t.advice()):
                o = r.outputs[primary_output(self.model["kind"], r.outputs)]
                first = (r.layers or {}).get("first_failing")
                cost = f"{a['relative_matmul_cost']:g}x ({a['cost_source']})" if a["cost_source"] else a["cost_stated"]
                rows.append([t.name, r.name, r.precision["setting"], r.target_side, a["task"],
                             f"{against_baseline(r.baseline)} ({baseline_role(r.baseline)})" if r.baseline else "-",
                             f"{o['max_abs']:.3g}", first["module"] if first else "-", cost, r.decision.upper()])
        return HtmlTable(["target", "precision", "set on hardware with", "run as", "task metrics [95% interval] on "
                          "their sample (budget): they decide", "against today's GPU (decides only within its "
                          "factor)", "max abs (main output)", "first module out of tolerance (eager)",
                          "matmul cost, vendor-stated", "verdict"], rows,
                         "every precision setting of each target (chosen first): what it buys, what it costs")

    def bucket_table(self) -> HtmlTable:
        rows = []
        for t in self.targets.values():
            for b in t.buckets:
                if b.get("skipped"):
                    rows.append([t.name, b["boundary"], 0, "-", "-", "-", b["skipped"]])
                    continue
                o = b["outputs"][b["primary"]]
                task = "; ".join(stats.described(c) for c in b["task"].get("checks", []))
                decided = b["task"].get("decision", "pass")
                rows.append([t.name, b["boundary"], b["texts"], f"{b['padding']:.0%}", f"{o['max_abs']:.3g}", task,
                             "FAIL: " + "; ".join(b["reasons"])[:120] if not b["passed"] else
                             "pass" if decided == stats.PASS else
                             "not failed: too few items to decide, the task sample decides"])
        return HtmlTable(["target", "bucket", "texts", "padding", "max abs", "task", "verdict"], rows,
                         "per bucket: reference unpadded (as on the GPU), target padded to the bucket")

    def layer_table(self, target: str, limit: int = 12) -> HtmlTable:
        r = self.targets[target].chosen
        mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
        first = next((i for i, m in enumerate(mods) if not m["passed"]), None)
        if first is None:
            shown, caption = sorted(mods, key=lambda m: -m["rel_l2"])[:limit], "none out of tolerance; largest errors"
        else:
            shown, caption = mods[first:first + limit], "execution order from the first module out of tolerance"
        rows = [[m["index"], m["module"], m["type"], f"{m['max_abs']:.3g}", f"{m['rel_l2']:.3g}",
                 f"{m['mismatched']}/{m['numel']}", ", ".join(f"{k} x{v}" for k, v in m.get("changes", {}).items())]
                for m in shown]
        return HtmlTable(["#", "module", "type", "max abs", "rel L2", "out of tolerance", "changed by the target"],
                         rows, f"{target} ({r.name}, {(r.layers or {}).get('target_side', r.target_side)}): {caption}")

    def plot(self):
        """Left: relative L2 error of every module's output against depth, one line per precision.
        Right: the main output's max abs error per bucket."""
        import matplotlib.pyplot as plt
        names = list(self.targets)
        fig, axes = plt.subplots(len(names), 2, figsize=(13, 3.4 * len(names)), squeeze=False,
                                 gridspec_kw={"width_ratios": [3, 1]})
        floor = 1e-10
        for row, name in enumerate(names):
            t, ax = self.targets[name], axes[row][0]
            for r in (t.chosen, *t.others):
                mods = [m for m in (r.layers or {}).get("modules", []) if m.get("compared")]
                if mods:
                    ax.plot([m["index"] for m in mods], [max(m["rel_l2"], floor) for m in mods], lw=1,
                            label=f"{r.name}{' (chosen)' if r is t.chosen else ''}")
            first = (t.chosen.layers or {}).get("first_failing")
            if first:
                ax.axvline(first["index"], color="#C44E52", ls="--", lw=1)
                ax.text(first["index"], ax.get_ylim()[1], f" first out of tolerance: {first['module']}",
                        color="#C44E52", fontsize=7, va="top")
            ax.set_yscale("log")
            ax.set_xlabel("module, in execution order")
            ax.set_ylabel(f"rel. L2 error (floor {floor:g})")
            ax.set_title(f"{name} ({t.target['mode']}, layers in {(t.chosen.layers or {}).get('target_side', '-')}): "
                         "error against depth", fontsize=10)
            ax.legend(fontsize=7, loc="lower right")
            done = [b for b in t.buckets if not b.get("skipped")]
            axes[row][1].bar([str(b["boundary"]) for b in done],
                             [b["outputs"][b["primary"]]["max_abs"] for b in done],
                             color=["#55A868" if b["passed"] else "#C44E52" for b in done])
            axes[row][1].set_title(f"{name}: max abs error per bucket", fontsize=9)
            axes[row][1].set_xlabel("bucket (tokens)")
        fig.tight_layout()
        return fig
