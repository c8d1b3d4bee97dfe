"""Parameter-server scaling report: one server vs K = P, server load, cost model, plot."""

import os

from benchmarks.plotting import RESULTS, pyplot


def ps_samples(rows):
    return [("ps", r["bytes"], r["processes"], {"num_servers": r["servers"]},
             r["ps"]["median_ms"] / 1e3) for r in rows]


def ps_analysis(rows):
    """One server vs K = P servers: growth with P, ratios, and the fitted cost model."""
    from benchmarks.cost_fit import error_summary, fit_alpha_beta, relative_errors

    samples = ps_samples(rows)
    alpha, beta = fit_alpha_beta(samples)
    fit = {"alpha_s": alpha, "beta_s_per_byte": beta,
           "prediction_error": error_summary(relative_errors(samples, alpha, beta)),
           "prediction_error_one_server": error_summary(relative_errors(
               [s for s in samples if s[3]["num_servers"] == 1], alpha, beta)),
           "prediction_error_k_equals_p": error_summary(relative_errors(
               [s for s in samples if s[3]["num_servers"] == s[2]], alpha, beta))}

    def median_ms(method, nbytes, np_, servers):
        return next(r[method]["median_ms"] for r in rows if r["bytes"] == nbytes
                    and r["processes"] == np_ and r["servers"] == servers)

    by_size = {}
    for nbytes in sorted({r["bytes"] for r in rows}):
        worlds = sorted({r["processes"] for r in rows if r["bytes"] == nbytes})
        one = {p: median_ms("ps", nbytes, p, 1) for p in worlds}
        sharded = {p: median_ms("ps", nbytes, p, p) for p in worlds}
        lo, hi = worlds[0], worlds[-1]

        def load(key, p, servers):
            return next(r["server_load"][key] for r in rows if r["bytes"] == nbytes
                        and r["processes"] == p and r["servers"] == servers)

        cpu_one = {p: 1e3 * load("max_server_cpu_s", p, 1) for p in worlds}
        cpu_sharded = {p: 1e3 * load("max_server_cpu_s", p, p) for p in worlds}
        bytes_one = {p: load("max_server_bytes", p, 1) for p in worlds}
        bytes_sharded = {p: load("max_server_bytes", p, p) for p in worlds}
        by_size[str(nbytes)] = {
            "busiest_server_cpu_ms_one_server": cpu_one,
            "busiest_server_cpu_ms_k_equals_p": cpu_sharded,
            "busiest_server_bytes_one_server": bytes_one,
            "busiest_server_bytes_k_equals_p": bytes_sharded,
            f"busiest_server_cpu_growth_one_server_P{hi}_over_P{lo}": cpu_one[hi] / cpu_one[lo],
            f"busiest_server_cpu_growth_k_equals_p_P{hi}_over_P{lo}":
                cpu_sharded[hi] / max(cpu_sharded[lo], 1e-9),
            f"busiest_server_bytes_growth_one_server_P{hi}_over_P{lo}":
                bytes_one[hi] / bytes_one[lo],
            f"busiest_server_bytes_growth_k_equals_p_P{hi}_over_P{lo}":
                bytes_sharded[hi] / bytes_sharded[lo],
            "ps_one_server_ms": one,
            "ps_k_equals_p_ms": sharded,
            "tree_ms": {p: median_ms("tree", nbytes, p, p) for p in worlds},
            "ring_collective_ms": {p: median_ms("ring_collective", nbytes, p, p) for p in worlds},
            "one_server_over_k_equals_p": {p: one[p] / sharded[p] for p in worlds},
            f"one_server_growth_P{hi}_over_P{lo}": one[hi] / one[lo],
            f"k_equals_p_growth_P{hi}_over_P{lo}": sharded[hi] / sharded[lo],
            "workers_ratio": hi / lo,
        }
    summary = {size: {k: v for k, v in entry.items() if "growth" in k or "over" in k}
               for size, entry in by_size.items()}
    summary["model_median_abs_relative_error"] = fit["prediction_error"][
        "median_abs_relative_error"]
    return {"summary": summary, "by_size": by_size, "fit": fit, "rows": rows}


def plot_ps_scaling(rows, fit):
    """Aggregation time vs workers, one panel per payload; PS model as dashed lines."""
    plt = pyplot()
    if plt is None:
        return
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds

    sizes = sorted({r["bytes"] for r in rows})
    fig, grid = plt.subplots(2, len(sizes), figsize=(5.5 * len(sizes), 8))
    for ax, nbytes in zip(grid[1], sizes):
        subset = [r for r in rows if r["bytes"] == nbytes]
        for label, keep, color in (("1 server", lambda r: r["servers"] == 1, "tab:red"),
                                   ("K = P servers", lambda r: r["servers"] == r["processes"],
                                    "tab:green")):
            points = sorted((r["processes"], 1e3 * r["server_load"]["max_server_cpu_s"])
                            for r in subset if keep(r))
            ax.plot([p for p, _ in points], [c for _, c in points], "o-", color=color,
                    label=f"busiest server, {label}")
        ax.set_title(f"{nbytes / 2**20:g} MiB: CPU time of the busiest server")
        ax.set_xlabel("workers P")
        ax.set_ylabel("server CPU ms per aggregation")
        ax.set_xticks(sorted({r["processes"] for r in subset}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes = grid[0]
    for ax, nbytes in zip(axes, sizes):
        subset = [r for r in rows if r["bytes"] == nbytes]
        worlds = sorted({r["processes"] for r in subset})
        lines = (("ps", lambda r: r["servers"] == 1, "PS, 1 server", "tab:red"),
                 ("ps", lambda r: r["servers"] == r["processes"], "PS, K = P servers",
                  "tab:green"),
                 ("tree", lambda r: r["servers"] == r["processes"], "tree (fanout 2)",
                  "tab:purple"),
                 ("ring_collective", lambda r: r["servers"] == r["processes"],
                  "ring (TF collectives)", "tab:blue"))
        for method, keep, label, color in lines:
            points = sorted((r["processes"], r[method]["median_ms"]) for r in subset if keep(r))
            ax.plot([p for p, _ in points], [t for _, t in points], "o-", color=color,
                    label=label)
        for servers, color in (("1", "tab:red"), ("P", "tab:green")):
            ax.plot(worlds, [1e3 * predict_all_reduce_seconds(
                "ps", nbytes, p, fit["alpha_s"], fit["beta_s_per_byte"],
                num_servers=1 if servers == "1" else p) for p in worlds], "--", color=color,
                label=f"model, K = {servers}")
        ax.set_title(f"{nbytes / 2**20:g} MiB of gradients: time per aggregation")
        ax.set_xlabel("workers P")
        ax.set_ylabel("time per aggregation (ms)")
        ax.set_xticks(worlds)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Parameter server: one server vs one per worker (loopback, 2 cores)")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "ps_scaling.png"), dpi=120)
