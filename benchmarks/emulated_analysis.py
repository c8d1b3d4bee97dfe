"""Emulated-cluster analysis: collective times, the loopback fit, predictions, recommend's picks.

What "fitted on loopback" means here. Per method, (alpha_L, beta_L) are
fitted (`benchmarks.cost_fit`, least squares on relative error) to the same
methods timed on this machine's loopback interface, same P and processes per
core: there is no wire there, so alpha_L is the per-message software latency
and beta_L the hosts' per-byte cost (copies, serialization, summation, with
P processes sharing the CPUs). On an emulated link of TCP goodput B
(bytes/s, measured) and latency l (half the measured round trip), each
message pays both and each byte is processed, then serialized onto the link:
    alpha = alpha_L + l,   beta = beta_L + 1 / B
and every cell's prediction is the method's own formula with these, i.e.
the model is not refitted on the emulated times. The parameter server with
K = P co-located servers uses the PS fit from one dedicated server (the
model's K is a parameter, not a fit).
"""

import math
import statistics

# The model's functions import TensorFlow: imported where used, so that
# `tfdist-bench` starts (and refuses a non-root user) without loading it.

# method -> (algorithm of the cost model, how its options follow from a row)
MODELS = {
    "ring_collective": ("ring", lambda row: {}),
    "ring_horovod": ("ring", lambda row: {}),
    "tree": ("tree", lambda row: {"fanout": row["fanout"], "chunk_bytes": row["chunk_bytes"]}),
    "ps_1": ("ps", lambda row: {"num_servers": 1}),
    "ps_k": ("ps", lambda row: {"num_servers": row["servers"]}),
}
FIT_OF = {"ring_collective": "ring_collective", "ring_horovod": "ring_horovod",
          "tree": "tree", "ps_1": "ps_1", "ps_k": "ps_1"}
# Where each formula's assumptions differ from what runs on full-duplex links.
WHY = {
    "ring_collective": "Each of 2 (P - 1) steps moves n / P over every link at once: the "
                       "formula is what runs, plus the loopback-fitted host cost.",
    "ring_horovod": "As ring_collective (Gloo's ring).",
    "tree": "2 d k n beta assumes every node on the critical path has k children and the levels "
            "run one after another. The heap-ordered tree over P = 4 (rank 1 has one child, "
            "rank 2 none) and P = 8 (one rank at depth 3) moves less on its critical path, and "
            "sibling subtrees overlap, so the formula is an upper bound there; it is exact for "
            "P = 2 and 3 (full trees).",
    "ps_1": "2 P n / K beta assumes the pull follows the push. With one piece per server (n / K "
            "<= 1 MiB) it does, and the formula holds; with m > 1 pieces, piece i is pulled "
            "while piece i + 1 is pushed, in the other direction of the full-duplex link, so "
            "the time falls towards (1 + 1 / m) P n / K beta.",
    "ps_k": "Co-located servers: a worker's own shard never crosses its link, so each link "
            "carries 2 (P - 1) / P n, not the formula's 2 n (at P = 2, half the prediction); "
            "from P = 6 on, P-to-P incast and 2 P processes (workers and servers) on 2 cores "
            "make it slower than the formula.",
}
TOLERANCE = 0.25  # the model's promise: within 25% of the emulated times
PICK_TOLERANCE = 0.10  # recommend's pick: within 10% of the measured fastest


def collective_seconds(ranks):
    """{bytes: {method: [seconds per call]}} from every rank's spans.

    A collective cannot finish before its last process enters it, and is done
    when its last process leaves it: call k takes max(end_k) - max(start_k)
    over the ranks (one machine, one monotonic clock). Timing one rank alone
    is wrong for the tree: its root returns as soon as it has sent the sum
    down, while the leaves are still receiving it.
    """
    result = {}
    for size, methods in ranks[0]["spans"].items():
        result[int(size)] = {}
        for method in methods:
            calls = zip(*(rank["spans"][size][method] for rank in ranks))
            result[int(size)][method] = [max(end for _, end in call) - max(
                start for start, _ in call) for call in calls]
    return result


def rows_of(ranks, **fields):
    """One row per (size, method) of a job: the medians and the settings the models need."""
    first = ranks[0]
    name = {"ps": "ps_k" if first["colocated"] else "ps_1"}
    rows = []
    for nbytes, methods in collective_seconds(ranks).items():
        for method, seconds in methods.items():
            rows.append({"method": name.get(method, method), "bytes": nbytes,
                         "processes": first["processes"],
                         "servers": first["servers"] if method == "ps" else None,
                         "fanout": first["fanout"], "chunk_bytes": first["chunk_bytes"],
                         "launcher": first["launcher"], "median_s": statistics.median(seconds),
                         "min_s": min(seconds), "seconds": seconds, **fields})
    return rows


def sample(row):
    algorithm, options = MODELS[row["method"]]
    return algorithm, row["bytes"], row["processes"], options(row), row["median_s"]


def fit_loopback(rows):
    """{method: alpha_s, beta_s_per_byte, loopback errors} from the loopback rows."""
    from benchmarks.cost_fit import fit_alpha_beta, relative_errors
    fits = {}
    for method in sorted({r["method"] for r in rows}):
        samples = [sample(r) for r in rows if r["method"] == method]
        alpha, beta = fit_alpha_beta(samples)
        errors = relative_errors(samples, alpha, beta)
        fits[method] = {"alpha_s": alpha, "beta_s_per_byte": beta,
                        "loopback_median_abs_error": statistics.median(map(abs, errors)),
                        "loopback_max_abs_error": max(map(abs, errors))}
    return fits


def predict(row, fits, link):
    """The model's seconds for an emulated row: its loopback fit plus the link (module doc)."""
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds
    algorithm, n, p, options, _ = sample(row)
    fit = fits[FIT_OF[row["method"]]]
    return predict_all_reduce_seconds(algorithm, n, p, fit["alpha_s"] + link["latency_s"],
                                      fit["beta_s_per_byte"] + 1.0 / link["goodput_Bps"],
                                      **options)


def predict_wire_only(row, link):
    """The same formula with the link's own alpha and beta (no host costs at all)."""
    from tfdist.aggregation.cost_model import predict_all_reduce_seconds
    algorithm, n, p, options, _ = sample(row)
    return predict_all_reduce_seconds(algorithm, n, p, link["latency_s"],
                                      1.0 / link["goodput_Bps"], **options)


def add_predictions(rows, fits, links):
    for row in rows:
        link = links[str(row["rate_mbit"])]
        row["predicted_s"] = predict(row, fits, link)
        row["relative_error"] = (row["predicted_s"] - row["median_s"]) / row["median_s"]
        row["within_tolerance"] = abs(row["relative_error"]) <= TOLERANCE
        row["wire_only_predicted_s"] = predict_wire_only(row, link)
        row["wire_only_relative_error"] = (row["wire_only_predicted_s"] - row["median_s"]) / \
            row["median_s"]


def measured_candidates(processes, fanout, chunk_bytes):
    """recommend's candidates that were measured, by the name of the method measuring each."""
    return {"ring": ("ring", {}), "tree": ("tree", {"fanout": fanout, "chunk_bytes": chunk_bytes}),
            "ps_1": ("ps", {"num_servers": 1}), "ps_k": ("ps", {"num_servers": processes})}


def validate_recommend(rows, links):
    """Per (rate, P, size): recommend's pick among the measured settings vs the measured fastest.

    recommend chooses an algorithm, not an engine (the model has one ring), so
    a pick of the ring is timed as the faster of the two measured rings
    (`RingAllReduceStrategy(backend=...)` chooses); `pick_over_fastest_tf_ring`
    is the stricter reading, the ring on TF collectives only. The fastest is
    over every measured method.
    """
    from tfdist.aggregation.recommend import recommend
    cells = []
    keys = sorted({(r["rate_mbit"], r["processes"], r["bytes"]) for r in rows})
    for rate, p, nbytes in keys:
        cell = {r["method"]: r for r in rows
                if (r["rate_mbit"], r["processes"], r["bytes"]) == (rate, p, nbytes)}
        measured = {m: r["median_s"] for m, r in cell.items()}
        link = links[str(rate)]
        any_row = next(iter(cell.values()))
        options = measured_candidates(p, any_row["fanout"], any_row["chunk_bytes"])
        if "ps_k" not in cell:
            options.pop("ps_k")
        pick = recommend(nbytes, p, bandwidth=8 * link["goodput_Bps"],
                         latency=link["latency_s"], candidates=options.values())
        chosen = next(name for name, (algorithm, opts) in options.items()
                      if (algorithm, opts) == (pick.algorithm, pick.options))
        rings = [m for m in ("ring_collective", "ring_horovod") if m in measured]
        chosen_method = min(rings, key=measured.get) if chosen == "ring" else chosen
        strict_method = "ring_collective" if chosen == "ring" else chosen
        fastest = min(measured, key=measured.get)
        ratio = measured[chosen_method] / measured[fastest]
        strict = measured[strict_method] / measured[fastest]
        cells.append({"rate_mbit": rate, "processes": p, "bytes": nbytes,
                      "measured_s": measured, "pick": chosen,
                      "pick_predicted_s": pick.predicted_seconds, "measured_fastest": fastest,
                      "pick_over_fastest": ratio, "passes": ratio <= 1 + PICK_TOLERANCE,
                      "pick_over_fastest_tf_ring": strict,
                      "passes_tf_ring": strict <= 1 + PICK_TOLERANCE})
    return cells


def _line_fit(xs, ys):
    """(slope, R^2) of the least-squares line through the points."""
    slope, _ = statistics.linear_regression(xs, ys)
    return slope, statistics.correlation(xs, ys) ** 2


def scaling(rows, links):
    """Per (rate, size): how each method's time grows with P (FireCaffe's comparison).

    Each method's times are fitted both as a + b P and as a + b log2 P (R^2
    of each says which shape the points have: FireCaffe's PS is linear, its
    tree logarithmic); the rings' times are also given over the
    bandwidth-optimal 2 (P - 1) / P n / B.
    """
    out = {}
    for rate, nbytes in sorted({(r["rate_mbit"], r["bytes"]) for r in rows}):
        goodput = links[str(rate)]["goodput_Bps"]
        entry = {}
        for method in ("ps_1", "tree", "ps_k", "ring_collective", "ring_horovod"):
            points = sorted((r["processes"], r["median_s"]) for r in rows if r["method"] == method
                            and (r["rate_mbit"], r["bytes"]) == (rate, nbytes))
            if len(points) < 3:
                continue
            worlds, seconds = [p for p, _ in points], [s for _, s in points]
            linear = _line_fit(worlds, seconds)
            logarithmic = _line_fit([math.log2(p) for p in worlds], seconds)
            entry[method] = {
                "seconds_by_P": dict(zip(map(str, worlds), seconds)),
                f"growth_P{worlds[-1]}_over_P{worlds[0]}": seconds[-1] / seconds[0],
                "linear_in_P": {"seconds_per_process": linear[0], "r2": linear[1]},
                "linear_in_log2_P": {"seconds_per_doubling": logarithmic[0],
                                     "r2": logarithmic[1]},
            }
            if method.startswith("ring"):  # vs the bandwidth-optimal 2 (P - 1) / P n / B
                entry[method]["over_ring_bound"] = {
                    str(p): s / (2 * (p - 1) / p * nbytes / goodput) for p, s in points}
        out[f"{rate}Mbit_{nbytes / 2**20:g}MiB"] = entry
    return out


def error_table(rows):
    """Per method: median / max |relative error| and how many cells are within 25%."""
    table = {}
    for method in sorted({r["method"] for r in rows}):
        errors = [r["relative_error"] for r in rows if r["method"] == method]
        wire = [r["wire_only_relative_error"] for r in rows if r["method"] == method]
        table[method] = {
            "cells": len(errors),
            "within_25_percent": sum(abs(e) <= TOLERANCE for e in errors),
            "median_abs_error": statistics.median(map(abs, errors)),
            "max_abs_error": max(map(abs, errors)),
            "mean_signed_error": statistics.fmean(errors),
            "wire_only_median_abs_error": statistics.median(map(abs, wire)),
            "why": WHY[method],
        }
    return table


def analyse(loopback_rows, rows, links):
    """Everything emulated_cluster.json holds but the network's description."""
    fits = fit_loopback(loopback_rows)
    add_predictions(rows, fits, links)
    cells = validate_recommend(rows, links)
    errors = error_table(rows)
    summary = {
        "model_cells_within_25_percent": f"{sum(r['within_tolerance'] for r in rows)} of "
                                         f"{len(rows)}",
        "model_error_by_method": {m: {k: round(v, 3) if isinstance(v, float) else v
                                      for k, v in e.items() if k != "why"}
                                  for m, e in errors.items()},
        "recommend_cells_passing": f"{sum(c['passes'] for c in cells)} of {len(cells)}",
        "recommend_cells_passing_tf_ring": f"{sum(c['passes_tf_ring'] for c in cells)} of "
                                           f"{len(cells)}",
        "scaling": scaling(rows, links),
    }
    return {"summary": summary, "model_errors": errors, "fits_on_loopback": fits,
            "recommend": cells, "rows": rows, "loopback_rows": loopback_rows}
