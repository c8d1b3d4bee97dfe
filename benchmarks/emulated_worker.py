"""Emulated-cluster worker: times tfdist's aggregators on one float32 buffer per size.

Every call is preceded by a barrier (untimed), so that all processes enter it
together, as after the previous step of training. Every process writes
OUT.json.rank<k>: the (start, end) of each of its calls on the machine's
monotonic clock, which all processes of the emulated cluster share
(`emulated_analysis.collective_seconds` turns them into the time of each
collective: from the last process's entry to the last process's exit). The same
script serves every launch of `benchmarks/emulated_cluster.py`:
  * TF_CONFIG naming the namespaces' addresses, with one `ps` task:
    ring_collective, tree, ps (one dedicated server);
  * horovodrun -H <addresses> (Gloo): ring_horovod, ps (co-located, K = P);
  * tfdist-run --horovod --num-servers 1 on loopback (the model's fit): all four
    of ring_collective, tree, ring_horovod and ps (one server).
The methods, interleaved per round in the same processes:
  ring_collective  RingAllReduceAggregator on TF collectives (gRPC);
  ring_horovod     RingAllReduceAggregator on Horovod (Gloo);
  tree             ReductionTreeAggregator (fanout 2, default chunks);
  ps               the ParameterServerStrategy's aggregator (the launch's servers).

Usage: emulated_worker.py OUT.json SIZES ROUNDS METHODS   (comma-separated lists)
"""

import json
import sys

import tensorflow as tf

from benchmarks.allreduce import output_and_sizes, spans_interleaved
from tfdist import runtime
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.tree import DEFAULT_CHUNK_BYTES, ReductionTreeAggregator
from tfdist.strategies import ParameterServerStrategy

FANOUT = 2
METHODS = ("ring_collective", "ring_horovod", "tree", "ps")


def make_methods(names, strategy):
    """{name: (all_reduce, 1)} for the requested methods, in a fixed order."""
    unknown = set(names) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown method(s) {sorted(unknown)}; choose from {METHODS}")
    collective = strategy.extended.communicator
    builders = {
        "ring_collective": lambda: RingAllReduceAggregator(collective),
        "ring_horovod": lambda: RingAllReduceAggregator(runtime.communicator("horovod")),
        "tree": lambda: ReductionTreeAggregator(collective, fanout=FANOUT),
        "ps": lambda: strategy.extended.aggregator,
    }
    return {name: (builders[name]().all_reduce, 1) for name in METHODS if name in names}


def main():
    out, sizes = output_and_sizes(sys.argv)
    rounds, names = int(sys.argv[3]), sys.argv[4].split(",")
    # First: a server process serves its shard here and exits; TensorFlow's collective
    # server must start before any TensorFlow op (Horovod's initialization runs some).
    strategy = ParameterServerStrategy()
    methods = make_methods(names, strategy)
    tf.get_logger().setLevel("ERROR")  # one tf.function per method and size: retracing is meant
    barrier = strategy.extended.communicator.barrier
    spans = {str(nbytes): spans_interleaved(methods, nbytes, rounds, before_each=barrier)
             for nbytes in sizes}
    with open(f"{out}.rank{strategy.rank}", "w") as f:
        json.dump({"rank": strategy.rank, "processes": strategy.world_size,
                   "servers": strategy.num_servers, "colocated": strategy.colocated,
                   "fanout": FANOUT, "chunk_bytes": DEFAULT_CHUNK_BYTES,
                   "launcher": runtime.cluster().launcher, "spans": spans}, f)


if __name__ == "__main__":
    main()
