"""`tfdist-bench`: run the benchmarks and write results under benchmarks/results/.

    tfdist-bench                      # everything
    tfdist-bench --only allreduce     # one part: allreduce, backends, fit, compression, tree, ps

Every comparison is made inside one run (same machine, same moment): these
machines are shared and noisy, so read the ratios, not the absolute times.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def environment():
    import tensorflow as tf
    import keras

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "transport": "loopback",
    }


def launch(np_, worker, args, flags=()):
    """Run `worker` under tfdist-run with np_ processes; fail loudly."""
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(np_), *flags, sys.executable,
               os.path.join(HERE, worker)] + [str(a) for a in args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, env=env, check=True)


def run_allreduce(tmp):
    rows = []
    for np_ in (2, 4):
        out = os.path.join(tmp, f"allreduce{np_}.json")
        launch(np_, "allreduce.py", [out])
        with open(out) as f:
            rows.extend(json.load(f))
    large = [r["tfdist_over_raw"] for r in rows if r["bytes"] >= 16 << 20]
    summary = {
        "tfdist_over_raw_median": sorted(r["tfdist_over_raw"] for r in rows)[len(rows) // 2],
        "tfdist_over_raw_max": max(r["tfdist_over_raw"] for r in rows),
        "tfdist_over_raw_max_16MiB_and_above": max(large),
        "fusion_speedup_16_tensors_min": min(r["unfused_16_over_tfdist_16"] for r in rows),
        "fusion_speedup_16_tensors_max": max(r["unfused_16_over_tfdist_16"] for r in rows),
    }
    result = {"environment": environment(), "summary": summary, "rows": rows,
              "description": "median time per all-reduce of a float32 payload; 'raw' is one "
                             "TensorFlow all_reduce_v2, 'tfdist' the RingAllReduceAggregator on the "
                             "same tensor, '*_16' the payload split into 16 tensors "
                             "(fused by tfdist, or 16 raw calls); methods interleaved per round."}
    write("allreduce.json", result)
    plot_allreduce(rows)
    return result


def plot_allreduce(rows):
    plot_bus_bandwidth(rows, (("raw", "tab:gray"), ("tfdist", "tab:blue"),
                              ("tfdist_16", "tab:green"), ("unfused_16", "tab:red")),
                       "All-reduce over TF collectives (gRPC, loopback)",
                       "allreduce_bus_bandwidth.png")


def plot_bus_bandwidth(rows, methods, title, filename):
    """Bus bandwidth vs payload, one line per method and process count."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
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
    fig.savefig(os.path.join(RESULTS, filename), dpi=120)


def run_backends(tmp):
    rows = []
    for np_ in (2, 4):
        out = os.path.join(tmp, f"backends{np_}.json")
        launch(np_, "allreduce_backends.py", [out], flags=["--horovod"])
        with open(out) as f:
            rows.extend(json.load(f))
    large = [r for r in rows if r["bytes"] >= 16 << 20]
    summary = {
        "tfdist_horovod_over_raw_max_16MiB_and_above": max(r["tfdist_horovod_over_raw"]
                                                            for r in large),
        "tfdist_horovod_16_over_raw_16_max_16MiB_and_above": max(
            r["tfdist_horovod_16_over_raw_16"] for r in large),
        "tfdist_horovod_over_raw_median": statistics.median(r["tfdist_horovod_over_raw"]
                                                            for r in rows),
        "collective_over_horovod_at_16MiB": {
            f"P={r['processes']}": r["collective_over_horovod"]
            for r in rows if r["bytes"] == 16 << 20},
    }
    result = {"environment": environment(), "summary": summary, "rows": rows,
              "description": "median time per all-reduce of a float32 payload on each engine; "
                             "'raw_horovod' is hvd.grouped_allreduce, 'tfdist_horovod' tfdist's "
                             "ring aggregator on Horovod (Gloo), 'tfdist_collective' on TF "
                             "collectives (gRPC); '_16': payload as 16 tensors; interleaved."}
    write("allreduce_backends.json", result)
    plot_bus_bandwidth(rows, (("raw_horovod", "tab:gray"), ("tfdist_horovod", "tab:blue"),
                              ("tfdist_collective", "tab:red")),
                       "All-reduce per engine (loopback)", "allreduce_backends_bus_bandwidth.png")
    return result


def run_fit(tmp):
    per_process_batch, threads = 64, 1
    runs = {}
    for np_, backend, flags in ((1, "collective", ()), (2, "collective", ()),
                                (2, "horovod", ("--horovod",))):
        out = os.path.join(tmp, f"fit{np_}{backend}.json")
        launch(np_, "fit_step.py", [out, per_process_batch, threads, backend], flags)
        with open(out) as f:
            runs[f"{np_}_process" + ("_horovod" if backend == "horovod" else "")] = json.load(f)
    # Control: two independent single-process trainings at once - the CPU contention of
    # two processes on this machine, without any communication.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFDIST_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    outs = [os.path.join(tmp, f"independent{i}.json") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "fit_step.py"), out,
                               str(per_process_batch), str(threads)], env=env) for out in outs]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit("independent fit_step run failed")
    independent = []
    for out in outs:
        with open(out) as f:
            independent.append(json.load(f)["median_step_ms"])
    one = runs["1_process"]["median_step_ms"]
    two = runs["2_process"]["median_step_ms"]
    two_horovod = runs["2_process_horovod"]["median_step_ms"]
    contention = sum(independent) / len(independent)
    result = {
        "environment": environment(),
        "runs": runs,
        "two_independent_processes_median_step_ms": independent,
        "summary": {
            "step_time_ratio_2_over_1": two / one,
            "step_time_ratio_2_horovod_over_1": two_horovod / one,
            "step_time_ratio_2_horovod_over_2_collective": two_horovod / two,
            "step_time_ratio_independent_over_1": contention / one,
            "communication_share_of_2_process_step": (two - contention) / two,
        },
        "description": "model.fit median step time, same per-process batch (weak scaling), "
                       f"{threads} intra-op thread(s) per process; the independent runs are two "
                       "single-process trainings at once (CPU contention without communication).",
    }
    write("fit_step.json", result)
    return result


def write(name, result):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}: {json.dumps(result.get('summary', {}))}", flush=True)


def run_compression(tmp):
    per_backend = {}
    for backend in ("horovod", "collective"):
        out = os.path.join(tmp, f"wire_{backend}.json")
        launch(2, "wire_bytes.py", [out, backend], flags=["--horovod"])
        with open(out) as f:
            per_backend[backend] = json.load(f)
    result = {
        "environment": environment(),
        "summary": {f"{b}_fp16_over_none": r["fp16_over_none"] for b, r in per_backend.items()},
        "backends": per_backend,
        "description": "bytes counted on the loopback interface per 16 MiB float32 gradient "
                       "all-reduce through the strategy's gradient path, 2 processes, without "
                       "and with compression='fp16'; max_abs_error is against the exact sum.",
    }
    write("fp16_wire_bytes.json", result)
    return result


def run_tree(tmp):
    rows = []
    for np_ in (2, 3, 4):
        out = os.path.join(tmp, f"tree{np_}.json")
        launch(np_, "tree_vs_ring.py", [out], flags=["--horovod"])
        with open(out) as f:
            rows.extend(json.load(f))
    result = tree_analysis(rows)
    result["environment"] = environment()
    result["description"] = (
        "median time per all-reduce of one float32 payload, interleaved in the same processes: "
        "'tree' is the ReductionTreeAggregator (fanout 2, pipelined chunks) and "
        "'ring_collective' the ring aggregator, both on TF collectives (gRPC); 'ring_horovod' the "
        "ring aggregator on Horovod (Gloo). alpha/beta are fitted per engine by least squares on "
        "relative error over all sizes and process counts; crossover = payload from which the "
        "ring is faster than the tree.")
    write("tree_vs_ring.json", result)
    plot_tree_vs_ring(rows, result["fit"])
    return result


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
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


PS_WORKERS = (2, 3, 4, 8)
PS_SIZES = (256 << 10, 4 << 20)


def run_ps(tmp):
    rows = []
    for np_ in PS_WORKERS:
        for flags in (["--num-servers", "1"], []):  # one dedicated server; co-located K = P
            out = os.path.join(tmp, f"ps{np_}_{len(flags)}.json")
            launch(np_, "ps_scaling.py", [out, ",".join(map(str, PS_SIZES))], flags=flags)
            with open(out) as f:
                rows.extend(json.load(f))
    result = ps_analysis(rows)
    result["environment"] = environment()
    result["description"] = (
        "median time per aggregation of one float32 gradient buffer vs number of workers P: "
        "'ps' is the ParameterServerStrategy's aggregator with one dedicated server "
        "(servers=1) or one co-located server per worker (servers=P); 'tree' (fanout 2) and "
        "'ring_collective' are measured in the same processes, interleaved. The PS cost model "
        "2 (m alpha + P n / K beta) is fitted to both PS configurations at once. All processes "
        "share one 2-core machine, so every method also slows down with P from CPU contention: "
        "read the ratios between methods at the same P.")
    write("ps_scaling.json", result)
    plot_ps_scaling(rows, result["fit"])
    return result


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
        by_size[str(nbytes)] = {
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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
        return
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds

    sizes = sorted({r["bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.2))
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
        ax.set_title(f"{nbytes / 2**20:g} MiB of gradients")
        ax.set_xlabel("workers P")
        ax.set_ylabel("time per aggregation (ms)")
        ax.set_xticks(worlds)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Parameter server: one server vs one per worker (loopback, 2 cores)")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "ps_scaling.png"), dpi=120)


PARTS = {"allreduce": run_allreduce, "backends": run_backends, "fit": run_fit,
         "compression": run_compression, "tree": run_tree, "ps": run_ps}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tfdist-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts to run: {', '.join(PARTS)}")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            PARTS[part](tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
