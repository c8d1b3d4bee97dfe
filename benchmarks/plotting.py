"""Plot helpers shared by the benchmark reports (matplotlib is optional)."""

import os

from benchmarks.harness import RESULTS


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note) if not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
        return None
    return plt


def plot_bus_bandwidth(rows, methods, title, filename):
    """Bus bandwidth vs payload, one line per method and process count."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for np_, style in ((2, "-"), (4, "--")):
        subset = [r for r in rows if r["processes"] == np_]
        sizes = [r["bytes"] for r in subset]
        for name, color in methods:
            ax.plot(sizes, [r[name]["bus_bandwidth_MBps"] for r in subset], style, color=color,
                    marker="o", markersize=3, label=f"{name}, P={np_}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("payload (bytes)")
    ax.set_ylabel("bus bandwidth (MB/s)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save(fig, filename)


def save(fig, filename, dpi=120, results=RESULTS):
    """Write `fig` to `results`/`filename` (default: benchmarks/results/)."""
    path = os.path.join(results, filename)
    fig.savefig(path, dpi=dpi)
    print(f"wrote {path}", flush=True)
