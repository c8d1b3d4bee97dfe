"""Tree vs ring report: fitted alpha-beta model, prediction error, crossover, plot."""

import os
import statistics

from benchmarks.plotting import RESULTS, pyplot


def tree_samples(rows, method):
    algorithm = "tree" if method == "tree" else "ring"
    return [(algorithm, r["bytes"], r["processes"],
             {"fanout": r["fanout"], "chunk_bytes": r["chunk_bytes"]} if method == "tree" else {},
             r[method]["median_ms"] / 1e3) for r in rows]


def tree_analysis(rows):
    """Fitted cost model, its prediction error, and the tree/ring crossover per P.

    Two fits: one (alpha, beta) per engine, shared by its algorithms (the
    textbook use of the model), and one per method (does each formula's
    shape match, given that TF's ring and its point-to-point transfers are
    different code paths with different per-byte costs?).
    """
    from benchmarks.cost_fit import error_summary, fit_alpha_beta, relative_errors
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds

    groups = {"engine_collective": ("tree", "ring_collective"), "engine_horovod": ("ring_horovod",),
              "tree": ("tree",), "ring_collective": ("ring_collective",),
              "ring_horovod": ("ring_horovod",)}
    fit = {}
    for group, methods in groups.items():
        samples = [s for m in methods for s in tree_samples(rows, m)]
        alpha, beta = fit_alpha_beta(samples)
        fit[group] = {"methods": list(methods), "alpha_s": alpha, "beta_s_per_byte": beta,
                      "prediction_error": error_summary(relative_errors(samples, alpha, beta))}
        if len(methods) > 1:
            fit[group]["prediction_error_by_method"] = {
                m: error_summary(relative_errors(tree_samples(rows, m), alpha, beta))
                for m in methods}

    def predicted(method, n, np_, options):
        params = fit[method]
        algorithm = "tree" if method == "tree" else "ring"
        return predict_all_reduce_seconds(algorithm, n, np_, params["alpha_s"],
                                          params["beta_s_per_byte"],
                                          **(options if method == "tree" else {}))

    crossover = {}
    options = {"fanout": rows[0]["fanout"], "chunk_bytes": rows[0]["chunk_bytes"]}
    grid = [int(2 ** (e / 8)) for e in range(8 * 10, 8 * 28 + 1)]  # 1 KiB .. 256 MiB
    for np_ in sorted({r["processes"] for r in rows}):
        subset = sorted((r for r in rows if r["processes"] == np_), key=lambda r: r["bytes"])
        entry = {}
        for ring in ("ring_collective", "ring_horovod"):
            entry[f"tree_faster_than_{ring}_at_bytes"] = [
                r["bytes"] for r in subset if r["tree"]["median_ms"] < r[ring]["median_ms"]]
            entry[f"{ring}_faster_at_bytes"] = [
                r["bytes"] for r in subset if r["tree"]["median_ms"] >= r[ring]["median_ms"]]
            slower = [n for n in grid
                      if predicted("tree", n, np_, options) > predicted(ring, n, np_, options)]
            entry[f"model_{ring}_faster_from_bytes"] = min(slower) if slower else None
        crossover[f"P={np_}"] = entry
    summary = {
        "engine_fit_median_abs_relative_error": {
            g: fit[g]["prediction_error"]["median_abs_relative_error"]
            for g in ("engine_collective", "engine_horovod")},
        "per_method_fit_median_abs_relative_error": {
            g: fit[g]["prediction_error"]["median_abs_relative_error"]
            for g in ("tree", "ring_collective", "ring_horovod")},
        "per_method_fit_max_abs_relative_error": {
            g: fit[g]["prediction_error"]["max_abs_relative_error"]
            for g in ("tree", "ring_collective", "ring_horovod")},
        "ring_horovod_faster_at_bytes": {p: c["ring_horovod_faster_at_bytes"]
                                         for p, c in crossover.items()},
        "ring_collective_faster_at_bytes": {p: c["ring_collective_faster_at_bytes"]
                                            for p, c in crossover.items()},
        "tree_over_ring_collective_median": statistics.median(
            r["tree_over_ring_collective"] for r in rows),
    }
    return {"summary": summary, "fit": fit, "crossover": crossover, "rows": rows}


def plot_tree_vs_ring(rows, fit):
    """Measured time vs payload (markers) and the fitted model (lines), one panel per P."""
    plt = pyplot()
    if plt is None:
        return
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds

    worlds = sorted({r["processes"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(4.2 * len(worlds), 4), sharey=True)
    styles = {"tree": ("tab:green", "tree", {"fanout": rows[0]["fanout"]}),
              "ring_collective": ("tab:red", "ring", {}),
              "ring_horovod": ("tab:blue", "ring", {})}
    for ax, np_ in zip(axes, worlds):
        subset = sorted((r for r in rows if r["processes"] == np_), key=lambda r: r["bytes"])
        sizes = [r["bytes"] for r in subset]
        for method, (color, algorithm, options) in styles.items():
            if algorithm == "tree":
                options = dict(options, chunk_bytes=subset[0]["chunk_bytes"])
            ax.plot(sizes, [r[method]["median_ms"] for r in subset], "o", color=color,
                    markersize=4, label=f"{method} (measured)")
            alpha, beta = fit[method]["alpha_s"], fit[method]["beta_s_per_byte"]
            ax.plot(sizes, [1e3 * predict_all_reduce_seconds(algorithm, n, np_, alpha, beta,
                                                             **options) for n in sizes],
                    "--", color=color, label=f"{method} (model, own fit)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"P = {np_}")
        ax.set_xlabel("payload (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time per all-reduce (ms)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Reduction tree vs ring (loopback): measured and alpha-beta model")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "tree_vs_ring.png"), dpi=120)
