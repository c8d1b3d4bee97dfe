"""Parameter-server scaling worker (run under tfdist-run; rank 0 writes JSON).

Run with `--num-servers 1` (one dedicated server) or without dedicated
servers (co-located: K = P servers). For each payload size, times in the same
processes and interleaved:
  ps                 the ParameterServerStrategy's aggregator (this launch's servers);
  tree               ReductionTreeAggregator (fanout 2) on TF collectives;
  ring_collective    RingAllReduceAggregator on TF collectives.
Then, per size, the servers' load per aggregation: CPU seconds of each server
process (from /proc: servers run on this machine) and bytes pushed to each.

Usage: ps_scaling.py OUT.json [SIZES]
"""

import json
import os
import sys

import tensorflow as tf

from benchmarks.allreduce import output_and_sizes, run_sizes
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.tree import ReductionTreeAggregator
from tfdist.strategies import ParameterServerStrategy


def main():
    out, sizes = output_and_sizes(sys.argv)
    strategy = ParameterServerStrategy()  # first: before any TensorFlow op
    communicator = strategy.extended.communicator
    methods = {
        "ps": (strategy.extended.aggregator.all_reduce, 1),
        "tree": (ReductionTreeAggregator(communicator, fanout=2).all_reduce, 1),
        "ring_collective": (RingAllReduceAggregator(communicator).all_reduce, 1),
    }
    rows = run_sizes(out, sizes, methods,
                     {"ps_over_ring_collective": ("ps", "ring_collective"),
                      "ps_over_tree": ("ps", "tree")},
                     strategy.rank, strategy.world_size, servers=strategy.num_servers,
                     colocated=strategy.colocated)
    for row in rows:
        row["server_load"] = server_load(strategy, row["bytes"])
    if strategy.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
        for row in rows:
            print(json.dumps({"bytes": row["bytes"], **row["server_load"]}), flush=True)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def server_load(strategy, nbytes, rounds=40):
    """Per aggregation of `nbytes`: CPU seconds and bytes received of each server."""
    aggregator, communicator = strategy.extended.aggregator, strategy.extended.communicator
    function = tf.function(aggregator.all_reduce)
    tensors = [tf.ones([nbytes // 4])]
    function(tensors)[0].numpy()
    communicator.barrier()
    before = aggregator.server_stats()
    cpu_before = [cpu_seconds(s["pid"]) for s in before]
    communicator.barrier()  # nobody pushes before every rank has read the counters
    for _ in range(rounds):
        function(tensors)[0].numpy()
    communicator.barrier()
    after = aggregator.server_stats()
    cpu = [(cpu_seconds(s["pid"]) - c) / rounds for s, c in zip(after, cpu_before)]
    received = [(a["bytes_received"] - b["bytes_received"]) / rounds
                for a, b in zip(after, before)]
    return {"server_cpu_s_per_aggregation": cpu, "max_server_cpu_s": max(cpu),
            "server_bytes_per_aggregation": received, "max_server_bytes": max(received)}


if __name__ == "__main__":
    main()
