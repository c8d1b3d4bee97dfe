"""Emulated-cluster plots: time vs processes per algorithm with the model, and model error.

    python -m benchmarks.emulated_plots      # redraw from benchmarks/results/emulated_cluster.json
"""

import json
import os

from benchmarks.plotting import RESULTS, pyplot

STYLES = {  # method -> (label, color)
    "ps_1": ("PS, 1 server", "tab:red"),
    "tree": ("tree (fanout 2)", "tab:purple"),
    "ps_k": ("PS, K = P co-located", "tab:green"),
    "ring_collective": ("ring, TF collectives", "tab:blue"),
    "ring_horovod": ("ring, Horovod", "tab:cyan"),
}


def plot_scaling(result):
    """One panel per (bandwidth, size): measured median (markers) and model (dashed) vs P."""
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    sizes = {rate: sorted({r["bytes"] for r in rows if r["rate_mbit"] == rate})
             for rate in sorted({r["rate_mbit"] for r in rows})}
    columns = max(map(len, sizes.values()))
    fig, axes = plt.subplots(len(sizes), columns, figsize=(5.5 * columns, 4.2 * len(sizes)),
                             squeeze=False)
    panels = [(axes[i][j], rate, nbytes) for i, (rate, row_sizes) in enumerate(sizes.items())
              for j, nbytes in enumerate(row_sizes)]
    for ax, rate, nbytes in panels:
        for method, (label, color) in STYLES.items():
            points = sorted((r["processes"], r["median_s"], r["predicted_s"]) for r in rows
                            if r["method"] == method and (r["rate_mbit"], r["bytes"]) == (
                                rate, nbytes))
            if not points:
                continue
            worlds = [p for p, _, _ in points]
            ax.plot(worlds, [m for _, m, _ in points], "o-", color=color, label=label)
            ax.plot(worlds, [p for _, _, p in points], "--", color=color, alpha=0.7)
        ax.set_title(f"{rate} Mbit/s links, {nbytes / 2**20:g} MiB")
        ax.set_xlabel("processes P")
        ax.set_xticks(sorted({r["processes"] for r in rows}))
        ax.grid(True, alpha=0.3)
    for row in axes:
        row[0].set_ylabel("seconds per aggregation")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Emulated cluster, one namespace per process (o measured, -- model): PS with one "
                 "server grows linearly with P,\nthe tree with its depth (log P), the ring "
                 "stays near its bound 2 (P - 1) / P n / B")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "emulated_scaling.png"), dpi=120)


def plot_model_error(result):
    """Predicted vs measured, every emulated cell, with the +-25% band."""
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for method, (label, color) in STYLES.items():
        subset = [r for r in rows if r["method"] == method]
        ax.plot([r["median_s"] for r in subset], [r["predicted_s"] for r in subset], "o",
                color=color, label=label, markersize=4)
    low = min(min(r["median_s"], r["predicted_s"]) for r in rows) / 1.5
    high = max(max(r["median_s"], r["predicted_s"]) for r in rows) * 1.5
    ax.plot([low, high], [low, high], "k-", lw=0.8)
    for factor in (0.75, 1.25):
        ax.plot([low, high], [low * factor, high * factor], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured seconds (emulated)")
    ax.set_ylabel("predicted seconds (loopback fit + link)")
    ax.set_title("Alpha-beta model vs emulated cluster (dotted: +-25%)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "emulated_model_error.png"), dpi=120)


def plot(result):
    plot_scaling(result)
    plot_model_error(result)


if __name__ == "__main__":
    with open(os.path.join(RESULTS, "emulated_cluster.json")) as f:
        plot(json.load(f))
