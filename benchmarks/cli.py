"""`tfdist-bench`: run the benchmarks and write results under benchmarks/results/.

    tfdist-bench                      # everything
    tfdist-bench --only allreduce     # one part: allreduce, backends, fit, compression, tree, ps,
                                      # large_batch, sparse, async, patterns, profiling,
                                      # anatomy, overlap, anchor, engines, engine_step, peer,
                                      # horovod_api, elastic, sharding, cluster,
                                      # default_step,
                                      # emulated, revision
    tfdist-bench --only emulated      # root only, never in the default run: one network
                                      # namespace per process, shaped links (~20 min)
    tfdist-bench --only revision      # never in the default run: this checkout's step
                                      # against an older revision's (benchmarks/revision_step.py)

One-off studies (a question answered once, e.g. the compression training
experiment and the consistency costs) live in experiments/ with their frozen
results.

Every comparison is made inside one run (same machine, same moment): these
machines are shared and noisy, so read the ratios, not the absolute times.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import (anatomy_report, anchor_report, async_report, default_step,
                        elastic_resize,
                        emulated_cluster, engine_curves, engine_step, horovod_api,
                        keras_patterns_report, large_batch, optimizer_sharding, overlap_report,
                        parameter_sharding, billion_parameters,
                        peer_report, profiling_report, revision_step)
from benchmarks.harness import HERE, launch, launch_rows, write_result
from benchmarks.plotting import plot_bus_bandwidth
from benchmarks.ps_report import plot_ps_scaling, ps_analysis
from benchmarks.tree_report import plot_tree_vs_ring, tree_analysis

def run_allreduce(tmp):
    rows = launch_rows(tmp, "allreduce.py", [(2, []), (4, [])])
    large = [r["tfdist_over_raw"] for r in rows if r["bytes"] >= 16 << 20]
    summary = {
        "tfdist_over_raw_median": sorted(r["tfdist_over_raw"] for r in rows)[len(rows) // 2],
        "tfdist_over_raw_max": max(r["tfdist_over_raw"] for r in rows),
        "tfdist_over_raw_max_16MiB_and_above": max(large),
        "fusion_speedup_16_tensors_min": min(r["unfused_16_over_tfdist_16"] for r in rows),
        "fusion_speedup_16_tensors_max": max(r["unfused_16_over_tfdist_16"] for r in rows),
    }
    result = { "summary": summary, "rows": rows,
              "description": "median time per all-reduce of a float32 payload; 'raw' is one "
                             "TensorFlow all_reduce_v2, 'tfdist' the RingAllReduceAggregator on the "
                             "same tensor, '*_16' the payload split into 16 tensors "
                             "(fused by tfdist, or 16 raw calls); methods interleaved per round."}
    write_result("allreduce.json", result)
    plot_allreduce(rows)
    return result


def plot_allreduce(rows):
    plot_bus_bandwidth(rows, (("raw", "tab:gray"), ("tfdist", "tab:blue"),
                              ("tfdist_16", "tab:green"), ("unfused_16", "tab:red")),
                       "All-reduce over TF collectives (gRPC, loopback)",
                       "allreduce_bus_bandwidth.png")


def run_backends(tmp):
    rows = launch_rows(tmp, "allreduce_backends.py", [(2, ["--horovod"]), (4, ["--horovod"])])
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
    result = { "summary": summary, "rows": rows,
              "description": "median time per all-reduce of a float32 payload on each engine; "
                             "'raw_horovod' is hvd.grouped_allreduce, 'tfdist_horovod' tfdist's "
                             "ring aggregator on Horovod (Gloo), 'tfdist_collective' on TF "
                             "collectives (gRPC); '_16': payload as 16 tensors; interleaved."}
    write_result("allreduce_backends.json", result)
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
    write_result("fit_step.json", result)
    return result


def run_compression(tmp):
    per_backend = {}
    for backend in ("horovod", "collective"):
        out = os.path.join(tmp, f"wire_{backend}.json")
        launch(2, "wire_bytes.py", [out, backend], flags=["--horovod"])
        with open(out) as f:
            per_backend[backend] = json.load(f)
    result = {
        "summary": {f"{b}_fp16_over_none": r["fp16_over_none"] for b, r in per_backend.items()},
        "backends": per_backend,
        "description": "bytes counted on the loopback interface per 16 MiB float32 gradient "
                       "all-reduce through the strategy's gradient path, 2 processes, without "
                       "and with compression='fp16'; max_abs_error is against the exact sum.",
    }
    write_result("fp16_wire_bytes.json", result)
    return result


def run_tree(tmp):
    rows = launch_rows(tmp, "tree_vs_ring.py", [(np_, ["--horovod"]) for np_ in (2, 3, 4)])
    result = tree_analysis(rows)
    result["description"] = (
        "median time per all-reduce of one float32 payload, interleaved in the same processes: "
        "'tree' is the ReductionTreeAggregator (fanout 2, pipelined chunks) and "
        "'ring_collective' the ring aggregator, both on TF collectives (gRPC); 'ring_horovod' the "
        "ring aggregator on Horovod (Gloo). alpha/beta are fitted per engine by least squares on "
        "relative error over all sizes and process counts; crossover = payload from which the "
        "ring is faster than the tree.")
    write_result("tree_vs_ring.json", result)
    plot_tree_vs_ring(rows, result["fit"])
    return result


PS_WORKERS = (2, 3, 4, 8)
PS_SIZES = (256 << 10, 4 << 20)


def run_ps(tmp):
    # One dedicated server, then co-located servers (K = P), at each P.
    rows = launch_rows(tmp, "ps_scaling.py",
                       [(np_, flags) for np_ in PS_WORKERS
                        for flags in (["--num-servers", "1"], [])],
                       args=[",".join(map(str, PS_SIZES))])
    result = ps_analysis(rows)
    result["description"] = (
        "median time per aggregation of one float32 gradient buffer vs number of workers P: "
        "'ps' is the ParameterServerStrategy's aggregator with one dedicated server "
        "(servers=1) or one co-located server per worker (servers=P); 'tree' (fanout 2) and "
        "'ring_collective' are measured in the same processes, interleaved. The PS cost model "
        "2 (m alpha + P n / K beta) is fitted to both PS configurations at once. All processes "
        "share one 2-core machine, so every method also slows down with P from CPU contention "
        "(wall times are not the servers' cost); server_load gives, per aggregation, the CPU "
        "seconds of each server process and the bytes pushed to it, i.e. the server's own "
        "cost, which the model's P n / K term describes.")
    write_result("ps_scaling.json", result)
    plot_ps_scaling(rows, result["fit"])
    return result


SPARSE_VOCABULARIES = (20_000, 200_000)


def run_sparse(tmp):
    rows = launch_rows(tmp, "sparse_gradients.py", [(np_, []) for np_ in (2, 3)],
                       args=[",".join(map(str, SPARSE_VOCABULARIES))])
    result = {
        "summary": {f"P{r['processes']}_vocab{r['vocabulary']}": {
            "dense_over_sparse_bytes": round(r["dense_over_sparse_bytes"], 2),
            "dense_over_sparse_step_time": round(r["dense_over_sparse_step_time"], 2),
            "max_weight_difference": r["max_weight_difference"]} for r in rows},
        "runs": rows,
        "description": "Embedding(vocab, 64) text model with Adam, global batch 256 x 16 tokens, "
                       "ring on TF collectives: Keras' train_step (embedding gradient stays "
                       "IndexedSlices; tfdist all-gathers the (index, value) pairs) vs the same "
                       "step with the gradient made dense (all-reduced). Per step: median time "
                       "and bytes on the loopback interface (all processes are on this host); "
                       "max_weight_difference compares the two runs' final weights: they "
                       "differ because Keras' sparse Adam update is not the dense one when a "
                       "token repeats in a batch - one process takes the sparse path, which "
                       "is why tfdist keeps these gradients sparse.",
    }
    write_result("sparse_gradients.json", result)
    return result


def run_cluster(tmp):
    """The parameter server's workers on Open MPI's engine against TensorFlow's collectives,
    and the start-up (benchmarks/cluster_costs.py)."""
    from benchmarks import cluster_costs  # pylint: disable=import-outside-toplevel

    del tmp
    result = cluster_costs.measure()
    write_result("cluster_costs.json", result)
    return result


PARTS = {"allreduce": run_allreduce, "backends": run_backends, "fit": run_fit,
         "compression": run_compression, "tree": run_tree, "ps": run_ps, "cluster": run_cluster,
         "default_step": default_step.run,
         "large_batch": large_batch.run, "sparse": run_sparse, "async": async_report.run,
         "patterns": lambda tmp: keras_patterns_report.main([]),
         "profiling": profiling_report.run, "anatomy": anatomy_report.run,
         "overlap": overlap_report.run, "anchor": anchor_report.run,
         "emulated": emulated_cluster.run,
         "engines": engine_curves.run, "engine_step": engine_step.run, "peer": peer_report.run,
         "horovod_api": horovod_api.run, "elastic": elastic_resize.run,
         "sharding": optimizer_sharding.run, "parameter_sharding": parameter_sharding.run,
         "billion": billion_parameters.run,
         "revision": revision_step.run}
# Need root and network namespaces, and take long; or compare with a fixed old revision; or
# about 20 GB of free memory (the billion-parameter model): only when named.
NOT_BY_DEFAULT = ("emulated", "revision", "billion")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tfdist-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(p for p in PARTS if p not in NOT_BY_DEFAULT),
                        help=f"comma-separated parts to run: {', '.join(PARTS)} "
                             f"({', '.join(NOT_BY_DEFAULT)} only when named)")
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
