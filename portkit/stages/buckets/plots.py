"""Stage 3's plots and slider: padding against the number of buckets per planner, the length histogram
with each plan's boundaries, and (in JupyterLab) a slider over the number of buckets. The stage's module,
portkit/stages/buckets/stage.py, exposes them to the notebook.
"""
from __future__ import annotations

from portkit.planning.planner import BucketPlan, Histogram, plan_buckets
from portkit.core.progress import headless

PLANNER_COLORS = {"pow2": "#4C72B0", "linear": "#8C8C8C", "padding_bounded": "#DD8452", "optimal": "#55A868",
                  "auto": "#C44E52"}
# each target's chosen plan: its own marker and colour, so two targets' points never read as one
CHOSEN_MARKERS = (("*", "#C44E52"), ("P", "#8172B3"), ("X", "#937860"), ("D", "#DA8BC3"))


def plot_padding(curves: dict, chosen: dict[str, BucketPlan] | None = None, k: int | None = None, ax=None):
    """Padding waste (%) against the number of buckets for every planner; each target's chosen plan marked with its
    own marker and colour (CHOSEN_MARKERS)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], "o-", ms=3, label=name,
                color=PLANNER_COLORS.get(name))
    for i, (target, plan) in enumerate((chosen or {}).items()):
        marker, color = CHOSEN_MARKERS[i % len(CHOSEN_MARKERS)]
        ax.plot([plan.k], [100 * plan.waste], marker, ms=(16, 11)[i % 2], color=color, mec="black", alpha=0.85,
                label=f"chosen for {target}: {plan.planner}, {plan.k} buckets, {plan.waste:.1%} padding")
    if k is not None:
        ax.axvline(k, color="black", lw=0.8, ls=":")
    ax.set_xlabel("number of sequence buckets (compiles per batch size)")
    ax.set_ylabel("padding (% of computed tokens)")
    ax.set_title("Padding waste against the number of buckets")
    ax.legend(fontsize=7)
    return ax


def plot_histogram(hist: Histogram, plans: list[BucketPlan], ax=None):
    """The length histogram with each plan's boundaries drawn over it."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    ax.bar(hist.values, hist.counts, width=1.0, color="#B0B0B0")
    ax.set_yscale("log")
    for i, plan in enumerate(plans):
        for j, b in enumerate(plan.boundaries):
            ax.axvline(b, color=PLANNER_COLORS.get(plan.planner), lw=1.2, ls=("-", "--", ":")[i % 3],
                       label=f"{plan.planner}: {plan.waste:.1%} padding" if j == 0 else None)
    ax.set_xlabel("tokens per request")
    ax.set_ylabel("requests (log)")
    ax.set_title(f"{hist.requests} requests and their buckets")
    ax.legend(fontsize=7)
    return ax


def draw_buckets(hist: Histogram, k: int, curves: dict):
    """Histogram with the k-bucket plans of pow2 and optimal, beside the padding curves at k."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.6))
    plot_histogram(hist, [plan_buckets(hist, "pow2", k=k), plan_buckets(hist, "optimal", k=k)], axes[0])
    plot_padding(curves, k=k, ax=axes[1])
    fig.tight_layout()
    return fig


def padding_slider(hist: Histogram, curves: dict, k: int):
    """An ipywidgets slider for the number of buckets, starting at k, that redraws draw_buckets. Headless runs
    (papermill, nbval: PORTKIT_HEADLESS=1, set by the runner and the tests) and plain Python get None."""
    try:
        import ipywidgets
        from IPython import get_ipython
    except ImportError:
        print("ipywidgets is not installed: the slider is skipped")
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel") or headless():
        print("headless run: the slider is skipped (open the notebook in JupyterLab to use it)")
        return None
    import matplotlib.pyplot as plt

    def redraw(buckets: int):
        draw_buckets(hist, buckets, curves)
        plt.show()
    k_max = max(p[0] for points in curves.values() for p in points)
    return ipywidgets.interactive(redraw, buckets=ipywidgets.IntSlider(value=min(k, k_max), min=1, max=k_max,
                                                                       description="buckets"))


