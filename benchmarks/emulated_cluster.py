"""Emulated cluster benchmark (`tfdist-bench --only emulated`, root only).

Each process runs on a host of its own - a network namespace with its own
address and a link shaped to a set bandwidth in both directions
(`benchmarks.netns`) - and tfdist's aggregators run across those addresses:
  * TF_CONFIG job (P workers + one `ps` task on a host of its own): the ring
    on TensorFlow's collectives, the reduction tree (fanout 2) and the
    parameter server with one dedicated server;
  * `horovodrun --gloo -H 10.77.0.1:1,...` job: the ring on Horovod and the
    parameter server with K = P servers (one co-located with each worker);
for P = 2 .. 8 and each bandwidth, one float32 buffer per size, methods
interleaved per round (`benchmarks/emulated_worker.py`). The same methods are
timed on loopback (`tfdist-run`) to fit the alpha-beta model, which then
predicts every emulated cell (`benchmarks.emulated_analysis`).

    python -m benchmarks.emulated_cluster    # re-analyse the rows already measured (no root)

Bandwidths are chosen so that the links, not this machine's 2 cores, are the
bottleneck. A first run at 100 and 250 Mbit/s
(`experiments/results/emulated_cluster_100_250mbit.json`) had the ring within
3-22% of its bound 2 (P - 1) / P n / B at 100 Mbit/s for every P, but 1.6-2.8
times the bound at 250 Mbit/s from P = 6 on: P processes, their servers and the
kernel's bridging and shaping of ~30 MB/s per link are more than 2 cores can
carry (on loopback alone the ring on TF collectives needs 79 ms for 4 MiB at
P = 8). Hence 100 and 50 Mbit/s, with payloads that take the same wire time at
both (1 and 4 MiB; 512 KiB and 2 MiB), 5 timed rounds each.
"""

import json
import os
import time

from benchmarks import emulated_analysis, emulated_launch, emulated_plots
from benchmarks.harness import RESULTS, environment, write_result
from benchmarks.link_probe import probe_link
from benchmarks.netns import EmulatedNetwork, NetworkUnavailable, check_available

# Link rate (Mbit/s) -> payload sizes: the same wire seconds at both rates.
RATES_AND_SIZES = ((100, (1 << 20, 4 << 20)), (50, (512 << 10, 2 << 20)))
WORLDS = (2, 3, 4, 6, 8)
ROUNDS = 5
LOOPBACK_SIZES = (64 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20)
LOOPBACK_ROUNDS = 10
DESCRIPTION = (
    "Every process on a host of its own: a network namespace with its own address "
    "(10.77.0.x) on a Linux bridge, its link shaped with tc tbf to rate_mbit in each direction "
    "(both ends of the veth). Per cell (rate, P, size): median seconds of one aggregation of a "
    "float32 buffer, from the last process entering to the last leaving (calls separated by "
    "untimed barriers, methods interleaved). ring_collective, tree (fanout 2, 4 MiB chunks) and "
    "ps_1 (one dedicated server on a host of its own) run in a TF_CONFIG job; ring_horovod and "
    "ps_k (K = P servers, co-located with the workers) under horovodrun -H (ssh emulated by "
    "entering the host's namespace). predicted_s: each method's alpha-beta formula with "
    "alpha/beta fitted on loopback (loopback_rows, same methods and P) plus the link: "
    "alpha + latency, beta + 1 / goodput (links: TCP goodput and round trip measured on the "
    "shaped link). recommend: tfdist.aggregation.recommend's pick among the measured "
    "settings, given the link's goodput (bits/s) and latency, vs the measured fastest.")
TF_CONFIG_METHODS = ("ring_collective", "tree", "ps")
HOROVOD_METHODS = ("ring_horovod", "ps")


def measure_loopback(tmp, worlds):
    rows = []
    for p in worlds:
        out = os.path.join(tmp, f"loopback{p}.json")
        ranks = emulated_launch.run_loopback(p, out, LOOPBACK_SIZES, LOOPBACK_ROUNDS,
                                             TF_CONFIG_METHODS + ("ring_horovod",))
        rows += emulated_analysis.rows_of(ranks, network="loopback")
    return rows


def measure_emulated(tmp, network, rate, sizes, worlds):
    rows = []
    for p in worlds:
        out = os.path.join(tmp, f"emulated{rate}_{p}")
        jobs = (("tf_config", lambda: emulated_launch.run_tf_config(
                    network, p, 1, out + "tf.json", sizes, ROUNDS, TF_CONFIG_METHODS)),
                ("horovodrun", lambda: emulated_launch.run_horovodrun(
                    network, p, out + "hvd.json", sizes, ROUNDS, HOROVOD_METHODS)))
        for _, job in jobs:
            rows += emulated_analysis.rows_of(job(), network="emulated", rate_mbit=rate)
    return rows


def run(tmp, rates_and_sizes=RATES_AND_SIZES, worlds=WORLDS):
    """Measure loopback and every rate, analyse, write emulated_cluster.json and the plots."""
    try:
        check_available()
    except NetworkUnavailable as error:
        raise SystemExit(f"tfdist-bench --only emulated: {error}") from None
    if not os.path.exists(emulated_launch.HOROVODRUN):
        raise SystemExit("tfdist-bench --only emulated: horovodrun is not installed next to "
                         "this Python (`make install` builds Horovod).")
    start = time.monotonic()
    loopback = measure_loopback(tmp, worlds)
    links, rows = {}, []
    # Hosts 0 .. P-1 workers, then the dedicated server, then horovodrun's head.
    with EmulatedNetwork(max(worlds) + 2, rates_and_sizes[0][0]) as network:
        for rate, sizes in rates_and_sizes:
            network.shape(rate)
            probe = probe_link(network, 0, 1)
            links[str(rate)] = {"goodput_Bps": probe["throughput_MBps"] * 1e6,
                                "latency_s": probe["rtt_s"] / 2, "rtt_s": probe["rtt_s"]}
            rows += measure_emulated(tmp, network, rate, sizes, worlds)
        description = network.describe()
    description.pop("rate_mbit_each_direction")
    result = emulated_analysis.analyse(loopback, rows, links)
    result["description"] = DESCRIPTION
    result["network"] = dict(description, rates_mbit=[r for r, _ in rates_and_sizes],
                             links=links)
    result["minutes"] = (time.monotonic() - start) / 60
    result["environment"] = dict(environment(), transport="network namespaces + veth + tc tbf "
                                 "(fit: loopback)")
    write_result("emulated_cluster.json", result)
    emulated_plots.plot(result)
    return result


def reanalyse():
    """Analysis and plots again from the rows in emulated_cluster.json (nothing measured)."""
    with open(os.path.join(RESULTS, "emulated_cluster.json")) as f:
        measured = json.load(f)
    result = emulated_analysis.analyse(measured["loopback_rows"], measured["rows"],
                                       measured["network"]["links"])
    result["description"] = DESCRIPTION
    for kept in ("network", "minutes", "environment"):
        result[kept] = measured[kept]
    write_result("emulated_cluster.json", result)
    emulated_plots.plot(result)


if __name__ == "__main__":
    reanalyse()
