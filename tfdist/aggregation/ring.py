"""Ring all-reduce, on Open MPI's collectives, TensorFlow's collective ops or Horovod."""

from tfdist.comm import engines
from tfdist.aggregation.base import Aggregator, positive_bytes
from tfdist.aggregation.fusion import (DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_GRADIENT_BUCKET_BYTES,
                                      FusionPlan)


# Engines with a reduce-scatter of their own: a sharded optimizer's gradients are
# reduce-scattered there, half of an all-reduce (`predict_seconds`).


class RingAllReduceAggregator(Aggregator):
    """Fused ring all-reduce (Open MPI's `MPI_Allreduce`, TensorFlow's `CollectiveReduceV2`, or
    Horovod on Gloo or MPI).

    Algorithm: tensors are grouped into reverse-order buckets of at most
    `bucket_bytes` (`first_bucket_bytes` for the first;
    `Aggregator.bucket_positions`), each issued as soon as its tensors
    exist, so inside a compiled step the last layers' gradients are summed
    while the backward pass still computes the first layers'. A bucket is
    fused into one buffer per dtype by `tfdist.aggregation.fusion` for
    Open MPI's and TensorFlow's collectives (a tensor larger than a bucket goes alone, as
    itself: on the MPI engine it is summed in its own buffer), by the engine itself (one grouped all-reduce)
    when it fuses (Horovod), and all-reduced with the bandwidth-optimal ring
    (Patarasuk & Yuan 2009): a reduce-scatter of P - 1 steps followed by an
    all-gather of P - 1 steps, each step moving n / P bytes to the next rank (Open MPI
    picks its own algorithm per message size: recursive doubling for small ones, a ring or
    Rabenseifner's for large ones, the same cost to first order).

    Cost model, per bucket of n bytes over P processes:
        T_ring(n, P) = 2 (P - 1) alpha + 2 (P - 1) / P * n * beta
    i.e. latency grows linearly with P, bandwidth is nearly independent of P.

    Guarantee: every rank receives the same sum; it equals the exact sum up to
    floating-point reassociation (the ring adds in a rank-dependent order).

    Args:
        communicator: a `tfdist.comm` communicator (MPI, TF collectives or Horovod).
        bucket_bytes: largest bucket (fused buffer), in bytes (for Horovod
            it was given to the engine when it started).
        first_bucket_bytes: largest first bucket, in bytes (small: it is
            sent while most of the backward pass is still to run).
    """

    name = "ring"

    def __init__(self, communicator, bucket_bytes=DEFAULT_GRADIENT_BUCKET_BYTES,
                 first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES):
        super().__init__()
        self.communicator = communicator
        self.bucket_bytes = positive_bytes("bucket_bytes", bucket_bytes)
        self.first_bucket_bytes = positive_bytes("first_bucket_bytes", first_bucket_bytes)

    @property
    def learns_rows_first(self):  # type: ignore[override]
        """On an engine whose small all-reduce costs microseconds (Open MPI's): the step learns
        the row count first and its gradients need no weighting pass (`row_accounting`)."""
        return self.communicator.small_all_reduce_is_cheap

    def reduce_bucket(self, bucket):
        tensors = list(bucket.tensors)
        if self.communicator.world_size == 1:
            return tensors
        if self.communicator.fuses_tensors:
            return self.communicator.grouped_all_reduce(tensors)
        plan = FusionPlan(tensors, self.bucket_bytes)
        reduced = [self.communicator.all_reduce(flat) for flat in plan.pack(tensors)]
        return plan.unpack(reduced)

    def sent_bytes(self, n_bytes):
        """2 (P - 1) / P n: P - 1 steps of n / P in each of the two phases."""
        p = self.communicator.world_size
        return 2 * (p - 1) * n_bytes / p

    @classmethod
    def predict_seconds(cls, n_bytes, world_size, alpha, beta, shard_optimizer_state=False,
                        backend="collective"):
        """2 (P - 1) alpha + 2 (P - 1) / P n beta (reduce-scatter + all-gather). With the
        optimizer state sharded (`tfdist.strategies.modes.optimizer_shards`): the same on
        `backend` "horovod" or "mpi", whose reduce-scatter of the gradients and all-gather of the
        parameters are the two halves of that all-reduce; on TensorFlow's collectives (no
        reduce-scatter on CPUs) the all-gather adds (P - 1) alpha + (P - 1) / P n beta
        (1.5x the bytes)."""
        p = world_size
        seconds = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta
        if shard_optimizer_state and not engines.engine(backend).reduces_scatter:
            seconds += (p - 1) * alpha + (p - 1) / p * n_bytes * beta
        return seconds
