"""All-reduce benchmark worker across engines (run under `tfdist-run --horovod`).

For each payload size, times in the same processes and interleaved:
  raw_horovod        `hvd.grouped_allreduce` on the payload (Horovod alone);
  tfdist_horovod     tfdist's RingAllReduceAggregator on Horovod, same tensor;
  raw_horovod_16     the payload as 16 tensors in one `hvd.grouped_allreduce`;
  tfdist_horovod_16  the same 16 tensors through tfdist on Horovod;
  tfdist_collective  tfdist's RingAllReduceAggregator on TF collectives (gRPC);
With --mpi-engine (under mpirun), no Horovod in the processes (its MPI thread would share
Open MPI and the cores with the engine) and instead:
  tfdist_mpi         tfdist's RingAllReduceAggregator on the MPI engine (Open MPI's
                     collectives from compiled ops, `tfdist.comm.mpi`), beside the two
                     tfdist_collective methods.
  tfdist_collective_one_bucket
                     the same with buckets as large as the payload: one fused
                     all-reduce, run in 16 subdivisions from 16 MiB
                     (`tfdist.comm.tf_collective.ring_subdivisions`).
Bus bandwidth follows the NCCL convention: 2 (P - 1) / P * bytes / time.

Usage: allreduce_backends.py OUT.json [SIZES] [--mpi-engine]
"""

import sys

from benchmarks.allreduce import collective_and_horovod, output_and_sizes, run_sizes
from tfdist import runtime
from tfdist.aggregation.ring import RingAllReduceAggregator

PIECES = 16
ONE_BUCKET = 1 << 30


def mpi_engine_main(out, sizes):
    collective = runtime.communicator("collective")
    mpi = runtime.communicator("mpi")
    methods = {
        "tfdist_mpi": (RingAllReduceAggregator(mpi).all_reduce, 1),
        "tfdist_collective": (RingAllReduceAggregator(collective).all_reduce, 1),
        "tfdist_collective_one_bucket": (RingAllReduceAggregator(
            collective, ONE_BUCKET, ONE_BUCKET).all_reduce, 1),
    }
    run_sizes(out, sizes, methods, {"mpi_engine_over_collective": ("tfdist_mpi",
                                                                   "tfdist_collective")},
              mpi.rank, mpi.world_size, engine="mpi_engine")


def main():
    if "--mpi-engine" in sys.argv:
        out, sizes = output_and_sizes([a for a in sys.argv if a != "--mpi-engine"])
        mpi_engine_main(out, sizes)
        return
    out, sizes = output_and_sizes(sys.argv)
    collective, horovod = collective_and_horovod()
    hvd = horovod._hvd  # pylint: disable=protected-access
    world = horovod.world_size

    def raw(tensors):
        return hvd.grouped_allreduce(tensors, op=hvd.Sum)

    methods = {
        "raw_horovod": (raw, 1),
        "tfdist_horovod": (RingAllReduceAggregator(horovod).all_reduce, 1),
        "raw_horovod_16": (raw, PIECES),
        "tfdist_horovod_16": (RingAllReduceAggregator(horovod).all_reduce, PIECES),
        "tfdist_collective": (RingAllReduceAggregator(collective).all_reduce, 1),
        "tfdist_collective_one_bucket": (RingAllReduceAggregator(
            collective, ONE_BUCKET, ONE_BUCKET).all_reduce, 1),
    }
    run_sizes(out, sizes, methods,
              {"tfdist_horovod_over_raw": ("tfdist_horovod", "raw_horovod"),
               "tfdist_horovod_16_over_raw_16": ("tfdist_horovod_16", "raw_horovod_16"),
               "collective_over_horovod": ("tfdist_collective", "tfdist_horovod")},
              horovod.rank, world, engine=horovod.transport)


if __name__ == "__main__":
    main()
