"""The what-if's plots: GPU allocation per queue over time for both runs, and the distribution
of waits per queue for both runs (matplotlib, Agg backend: files only, no display)."""

from __future__ import annotations

from typing import Any

from kai_es.report import Summary, queue_series, step_values, style_panel, timeline_by_queue

RUNS = (("recorded", "tab:blue", "-"), ("counterfactual", "tab:orange", "--"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, n: int) -> tuple[Any, Any, int]:
    cols = 2 if n > 1 else 1
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 2.6 * rows), dpi=100, squeeze=False)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    return fig, axes, cols


def plot_allocation(recorded: Summary, counterfactual: Summary, path: str) -> None:
    """One panel per queue: GPUs allocated over time in both runs, with the recorded run's
    fair share for reference."""
    plt = _pyplot()
    queues = sorted(q for q in set(recorded.queues) | set(counterfactual.queues) if q) or [""]
    fig, axes, cols = _grid(plt, len(queues))
    runs = (recorded, counterfactual)
    times = sorted({recorded.start_ns, recorded.end_ns, counterfactual.end_ns,
                    *(e[0] for s in runs for e in s.timeline)})
    hours = [(t - recorded.start_ns) / 3.6e12 for t in times]
    by_queue = [timeline_by_queue(s) for s in runs]
    for i, q in enumerate(queues):
        ax = axes[i // cols][i % cols]
        for (label, color, style), s, index in zip(RUNS, runs, by_queue):
            values = step_values(queue_series(s, q, index)["allocated"], times)
            ax.step(hours, [v / 1000 for v in values], where="post", color=color, linestyle=style, label=label)
        style_panel(ax, q, "GPUs", legend=i == 0)
    fig.suptitle("GPU allocation per queue: recorded vs counterfactual (hours from start)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_waits(recorded: Summary, counterfactual: Summary, path: str) -> None:
    """One panel per queue: the cumulative distribution of pod waits in both runs (censored
    waits of pods that never ran included)."""
    plt = _pyplot()
    queues = sorted(q for q in set(recorded.queues) | set(counterfactual.queues)
                    if q and ((recorded.queues.get(q) and recorded.queues[q].waits_ns)
                              or (counterfactual.queues.get(q) and counterfactual.queues[q].waits_ns))) or [""]
    fig, axes, cols = _grid(plt, len(queues))
    for i, q in enumerate(queues):
        ax = axes[i // cols][i % cols]
        for (label, color, style), s in zip(RUNS, (recorded, counterfactual)):
            qs = s.queues.get(q)
            waits = sorted(qs.waits_ns) if qs is not None else []
            if not waits:
                continue
            minutes = [w / 6e10 for w in waits]
            share = [(k + 1) / len(waits) for k in range(len(waits))]
            ax.step(minutes, share, where="post", color=color, linestyle=style, label=f"{label} ({len(waits)})")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("wait (minutes)", fontsize=8)
        style_panel(ax, q, "share of pods", legend=True, legend_at="lower right")
    fig.suptitle("Wait distribution per queue: recorded vs counterfactual", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
