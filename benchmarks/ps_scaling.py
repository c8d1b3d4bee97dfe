"""Parameter-server scaling worker (run under tfdist-run; rank 0 writes JSON).

Run with `--num-servers 1` (one dedicated server) or without dedicated
servers (co-located: K = P servers). For each payload size, times in the same
processes and interleaved:
  ps                 the ParameterServerStrategy's aggregator (this launch's servers);
  tree               ReductionTreeAggregator (fanout 2) on TF collectives;
  ring_collective    RingAllReduceAggregator on TF collectives.

Usage: ps_scaling.py OUT.json [SIZES]
"""

import sys

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
    run_sizes(out, sizes, methods,
              {"ps_over_ring_collective": ("ps", "ring_collective"),
               "ps_over_tree": ("ps", "tree")},
              strategy.rank, strategy.world_size, servers=strategy.num_servers,
              colocated=strategy.colocated)


if __name__ == "__main__":
    main()
