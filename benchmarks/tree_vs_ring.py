"""Tree vs ring benchmark worker (run under `tfdist-run --horovod`; rank 0 writes JSON).

For each payload size, times in the same processes and interleaved:
  tree               tfdist's ReductionTreeAggregator (fanout 2) on TF collectives;
  ring_collective    tfdist's RingAllReduceAggregator on TF collectives (gRPC);
  ring_horovod       tfdist's RingAllReduceAggregator on Horovod (Gloo).

Usage: tree_vs_ring.py OUT.json [SIZES]
"""

import sys

from benchmarks.allreduce import collective_and_horovod, output_and_sizes, run_sizes
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.tree import ReductionTreeAggregator

FANOUT = 2


def main():
    out, sizes = output_and_sizes(sys.argv)
    collective, horovod = collective_and_horovod()
    world = collective.world_size
    tree = ReductionTreeAggregator(collective, fanout=FANOUT)
    methods = {
        "tree": (tree.all_reduce, 1),
        "ring_collective": (RingAllReduceAggregator(collective).all_reduce, 1),
        "ring_horovod": (RingAllReduceAggregator(horovod).all_reduce, 1),
    }
    run_sizes(out, sizes, methods,
              {"tree_over_ring_collective": ("tree", "ring_collective"),
               "tree_over_ring_horovod": ("tree", "ring_horovod")},
              collective.rank, world, fanout=FANOUT, chunk_bytes=tree.chunk_bytes)


if __name__ == "__main__":
    main()
