"""`tfdist-bench --only engines`: all-reduce on each engine on one host, MPI vs Gloo vs TF.

Horovod's all-reduce runs on Gloo (TCP over loopback, `tfdist-run --horovod`)
or on MPI (Open MPI under `mpirun`: shared memory between local processes);
tfdist's own ring runs on TensorFlow's collectives (gRPC). The same worker
(`allreduce_backends.py`) runs under both launchers at P = 2, in alternating
rounds (Gloo, MPI, MPI, Gloo, ...), and times inside each process, per payload
size (4 KB to 64 MB), Horovod's raw `grouped_allreduce` on that run's
engine interleaved with tfdist's ring on TF collectives. Each engine is
compared to the TF ring measured in the same processes at the same moment
(mpi_over_tf, gloo_over_tf: medians over rounds); MPI over Gloo is the ratio
of those two; tf_one_bucket is tfdist's ring with buckets as large as the
payload (one fused all-reduce, subdivided from 16 MiB). The limit all three
are read against is the host's memory copy (`memcpy_MBps`: numpy's copy of
the payload, median of 20, in this process between rounds): an all-reduce
on one host moves at least the payload through memory.
Result: benchmarks/results/engine_curves.json and engine_curves.png (bus
bandwidth, NCCL convention 2 (P - 1) / P bytes / time).
"""

import json
import os
import statistics
import time

import numpy as np

from benchmarks.harness import launch, launch_mpirun, mpirun_available, write_result
from benchmarks.plotting import pyplot, save

ROUNDS = 4
PROCESSES = 2
ENGINES = ("gloo", "mpi", "mpi_engine")


def _run_once(tmp, engine, index):
    out = os.path.join(tmp, f"engines{index}.json")
    if engine == "gloo":
        launch(PROCESSES, "allreduce_backends.py", [out], flags=["--no-mpi", "--horovod"])
    elif engine == "mpi":
        launch_mpirun(PROCESSES, "allreduce_backends.py", [out])
    else:  # tfdist's MPI engine, in processes without Horovod
        launch_mpirun(PROCESSES, "allreduce_backends.py", [out, "--mpi-engine"])
    with open(out) as f:
        rows = json.load(f)
    assert all(r["engine"] == engine for r in rows), (engine, [r["engine"] for r in rows])
    return rows


def memcpy_mbps(nbytes, repeats=20):
    """The host's memory-copy bandwidth for a payload of `nbytes` (MB/s, median)."""
    source = np.ones(max(nbytes // 4, 1), np.float32)
    target = np.empty_like(source)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e6


def run(tmp):
    if not mpirun_available():
        print("engines: skipped - Open MPI's mpirun or a Horovod built with MPI is missing "
              "(make install provides both)", flush=True)
        return None
    runs = {engine: [] for engine in ENGINES}
    memcpy = []
    for round_ in range(ROUNDS):
        for engine in (ENGINES if round_ % 2 == 0 else tuple(reversed(ENGINES))):
            runs[engine].append(_run_once(tmp, engine, sum(len(r) for r in runs.values())))
        memcpy.append({r["bytes"]: memcpy_mbps(r["bytes"]) for r in runs["gloo"][0]})
    sizes = [r["bytes"] for r in runs["gloo"][0]]
    table = []
    for i, nbytes in enumerate(sizes):
        row = {"bytes": nbytes, "processes": PROCESSES}
        for engine in ("gloo", "mpi"):
            rounds = [rows[i] for rows in runs[engine]]
            row[f"{engine}_ms"] = statistics.median(r["raw_horovod"]["median_ms"] for r in rounds)
            row[f"tf_ms_in_{engine}_runs"] = statistics.median(
                r["tfdist_collective"]["median_ms"] for r in rounds)
            row[f"{engine}_over_tf"] = statistics.median(
                r["raw_horovod"]["median_ms"] / r["tfdist_collective"]["median_ms"]
                for r in rounds)
            row[f"{engine}_bus_bandwidth_MBps"] = _bus_bandwidth(nbytes, row[f"{engine}_ms"])
        row["tf_ms"] = statistics.median([row["tf_ms_in_gloo_runs"], row["tf_ms_in_mpi_runs"]])
        row["tf_bus_bandwidth_MBps"] = _bus_bandwidth(nbytes, row["tf_ms"])
        one_bucket = [rows[i]["tfdist_collective_one_bucket"]["median_ms"]
                      for engine in ("gloo", "mpi") for rows in runs[engine]]
        row["tf_one_bucket_ms"] = statistics.median(one_bucket)
        row["tf_one_bucket_bus_bandwidth_MBps"] = _bus_bandwidth(nbytes, row["tf_one_bucket_ms"])
        row["tf_one_bucket_over_tf"] = statistics.median(
            rows[i]["tfdist_collective_one_bucket"]["median_ms"]
            / rows[i]["tfdist_collective"]["median_ms"]
            for engine in ("gloo", "mpi") for rows in runs[engine])
        row["tf_ms_all_runs"] = statistics.median(
            rows[i]["tfdist_collective"]["median_ms"] for engine in ENGINES
            for rows in runs[engine])
        row["memcpy_MBps"] = statistics.median(m[nbytes] for m in memcpy)
        for engine in ("mpi", "gloo", "tf", "tf_one_bucket"):
            row[f"{engine}_bus_bandwidth_over_memcpy"] = (
                row[f"{engine}_bus_bandwidth_MBps"] / row["memcpy_MBps"])
        row["mpi_over_gloo"] = row["mpi_over_tf"] / row["gloo_over_tf"]
        mpi_rounds = [rows[i] for rows in runs["mpi_engine"]]
        if mpi_rounds:  # tfdist's MPI engine against the TF ring in its own runs
            row["mpi_engine_ms"] = statistics.median(
                r["tfdist_mpi"]["median_ms"] for r in mpi_rounds)
            row["tf_ms_in_mpi_engine_runs"] = statistics.median(
                r["tfdist_collective"]["median_ms"] for r in mpi_rounds)
            row["mpi_engine_over_tf"] = statistics.median(
                r["tfdist_mpi"]["median_ms"] / r["tfdist_collective"]["median_ms"]
                for r in mpi_rounds)
            row["mpi_engine_bus_bandwidth_MBps"] = _bus_bandwidth(nbytes, row["mpi_engine_ms"])
            row["mpi_engine_bus_bandwidth_over_memcpy"] = (
                row["mpi_engine_bus_bandwidth_MBps"] / row["memcpy_MBps"])
        table.append(row)
    engines = ("mpi_engine", "mpi", "gloo", "tf") if "mpi_engine_ms" in table[0] else (
        "mpi", "gloo", "tf")
    fastest = {r["bytes"]: min(engines, key=lambda e: r[f"{e}_ms"]) for r in table}
    result = {
        "summary": {
            "mpi_over_tf": {str(r["bytes"]): round(r["mpi_over_tf"], 3) for r in table},
            "gloo_over_tf": {str(r["bytes"]): round(r["gloo_over_tf"], 3) for r in table},
            "mpi_over_gloo": {str(r["bytes"]): round(r["mpi_over_gloo"], 3) for r in table},
            **({"mpi_engine_over_tf": {str(r["bytes"]): round(r["mpi_engine_over_tf"], 3)
                                       for r in table}} if "mpi_engine_ms" in table[0] else {}),
            "tf_one_bucket_over_tf": {str(r["bytes"]): round(r["tf_one_bucket_over_tf"], 3)
                                      for r in table},
            "bus_bandwidth_over_memcpy": {
                str(r["bytes"]): {e: round(r[f"{e}_bus_bandwidth_over_memcpy"], 4)
                                  for e in (*engines, "tf_one_bucket")}
                for r in table},
            "fastest_engine": {str(k): v for k, v in fastest.items()},
            # What `tfdist.comm.engines` ranks: each engine's median time over
            # the TF ring's median over every run. The per-run ratios above compare an engine
            # with the TF ring in the same processes, where Horovod's background thread also
            # slows the TF ring (2.2-2.9x the TF ring of the runs without Horovod here); across
            # engines only one denominator for all is fair.
            "over_tf_ring": {engine: {str(r["bytes"]): round(r[f"{engine}_ms"]
                                                             / r["tf_ms_all_runs"], 3)
                                      for r in table}
                             for engine in engines if engine != "tf"},
        },
        "rows": table, "rounds": ROUNDS,
        "description": "median time per all-reduce of one float32 payload at P = 2 on one "
                       "host: Horovod on Gloo (tfdist-run --horovod) and on MPI (Open MPI, "
                       "mpirun), each timed interleaved with tfdist's ring on TF collectives "
                       "in the same processes; *_over_tf: median over rounds of the per-run "
                       "ratio; mpi_over_gloo = mpi_over_tf / gloo_over_tf; tf_one_bucket: "
                       "tfdist's ring with one bucket as large as the payload (subdivided "
                       "from 16 MiB), over the default 4 MiB buckets in the same runs; "
                       "memcpy_MBps: numpy copy of the payload in the parent process between "
                       "rounds (median of 20 per round, median over rounds); "
                       "*_bus_bandwidth_over_memcpy: each engine's bus bandwidth over it; "
                       "mpi_engine: tfdist's MPI engine (Open MPI's collectives from compiled "
                       "TensorFlow ops), timed against the TF ring in mpirun runs of its own "
                       "without Horovod; over_tf_ring: each engine's median time over the "
                       "TF ring's median over every run (what backend='auto' ranks); "
                       "rounds alternate the launchers.",
    }
    write_result("engine_curves.json", result)
    plot(table)
    return result


def _bus_bandwidth(nbytes, ms):
    return 2 * (PROCESSES - 1) / PROCESSES * nbytes / (ms / 1e3) / 1e6


def plot(table):
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [r["bytes"] for r in table]
    lines = ((("mpi_engine", "tab:purple", "tfdist's MPI engine (Open MPI's collectives)"),)
             if "mpi_engine_ms" in table[0] else ())
    for engine, color, label in lines + (("mpi", "tab:green", "Horovod on MPI (Open MPI)"),
                                 ("gloo", "tab:blue", "Horovod on Gloo"),
                                 ("tf", "tab:red", "tfdist ring on TF collectives"),
                                 ("tf_one_bucket", "tab:orange",
                                  "tfdist ring, one bucket (subdivided from 16 MiB)")):
        left.plot(sizes, [r[f"{engine}_ms"] for r in table], marker="o", markersize=3,
                  color=color, label=label)
        right.plot(sizes, [r[f"{engine}_bus_bandwidth_MBps"] for r in table], marker="o",
                   markersize=3, color=color, label=label)
    right.plot(sizes, [r["memcpy_MBps"] for r in table], "k--", label="memory copy (limit)")
    right.legend(fontsize=7)
    for ax, ylabel in ((left, "median time per all-reduce (ms)"), (right, "bus bandwidth (MB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"All-reduce on one host, P = {PROCESSES}: latency and bandwidth per engine")
    fig.tight_layout()
    save(fig, "engine_curves.png")
