"""Reduction tree: sum up a k-ary tree to the root, send the sum back down."""

import math

import tensorflow as tf

from tfdist.aggregation.base import Aggregator, positive_bytes, require_static_shapes
from tfdist.aggregation.fusion import (DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_GRADIENT_BUCKET_BYTES,
                                      FusionPlan, near_equal_sizes, split_flat)

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
_UP, _DOWN = 0, 1


def validate_fanout(fanout):
    """`fanout` if it is an integer >= 2, else a ValueError showing it."""
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 2:
        raise ValueError(f"fanout must be an integer >= 2. Got: {fanout!r}")
    return fanout


class KaryTree:
    """The k-ary tree over ranks 0..P-1 in heap order: rank r's parent is (r - 1) // k.

    Any P works (the last level is filled from the left); k >= P - 1 is a
    star with rank 0 at the centre.
    """

    def __init__(self, world_size, fanout):
        self.world_size = int(world_size)
        self.fanout = validate_fanout(fanout)

    def parent(self, rank):
        return None if rank == 0 else (rank - 1) // self.fanout

    def children(self, rank):
        first = self.fanout * rank + 1
        return list(range(first, min(first + self.fanout, self.world_size)))

    @property
    def depth(self):
        """Number of edges from the deepest rank to the root (0 for one rank)."""
        depth, rank = 0, self.world_size - 1
        while rank > 0:
            rank, depth = self.parent(rank), depth + 1
        return depth


def chunk_sizes(num_elements, element_bytes, chunk_bytes):
    """Split `num_elements` into near-equal chunks of at most `chunk_bytes` each."""
    return near_equal_sizes(num_elements, math.ceil(num_elements * element_bytes / chunk_bytes))


class ReductionTreeAggregator(Aggregator):
    """k-ary reduction tree (FireCaffe, Iandola et al. 2016) with pipelined chunks.

    Algorithm: tensors are fused into flat buffers (`FusionPlan`), each
    buffer is cut into C chunks of at most `chunk_bytes`. For every chunk,
    each rank receives its children's partial sums, adds its own, and sends
    the result to its parent (`KaryTree`: heap order, fanout k); the root
    then sends the total down the same edges. Transfers are TensorFlow
    collective broadcasts in two-rank groups (in-graph point-to-point over
    gRPC). Chunks only depend on their own transfers, so inside a compiled
    function chunk c + 1 climbs the tree while chunk c is still on its way:
    the pipeline keeps every level busy.

    Cost model (alpha: latency per message, beta: seconds per byte, n bytes,
    P processes, depth d = ceil(log_k((k - 1) P + 1)) - 1, C chunks): each of
    the two phases (reduce, broadcast) is a pipeline of d + C - 1 stages in
    which a node moves k chunks of n / C bytes through its link:
        T_tree(n, P) = 2 (d + C - 1) (alpha + k n / C beta)
    Unpipelined (C = 1) that is 2 d (alpha + k n beta): latency grows with
    log_k P (the ring's with P - 1), but every level moves the whole buffer k
    times. The optimum C* = sqrt((d - 1) k n beta / alpha) brings the
    bandwidth term towards k n beta, still k / 2 times the ring's
    2 (P - 1) / P n beta: the tree wins on small, latency-bound buffers and
    loses on large ones (`tfdist.aggregation.cost_model` and `make bench`
    give the crossover). A star (k >= P - 1, d = 1) is
    2 alpha + 2 (P - 1) n beta: the root carries all the traffic.

    Guarantee: every rank receives the root's result bit for bit; it equals
    the exact sum up to floating-point reassociation (partial sums are added
    in tree order).

    Args:
        communicator: a `tfdist.comm.base.Communicator` with point-to-point
            transfers (TensorFlow's collectives).
        fanout: children per node, >= 2.
        chunk_bytes: pipeline chunk size in bytes.
        bucket_bytes: largest bucket (fused buffer) in bytes; buckets are
            issued in reverse order as the ring's (`RingAllReduceAggregator`).
        first_bucket_bytes: largest first bucket, in bytes.
    """

    name = "tree"

    def __init__(self, communicator, fanout=2, chunk_bytes=DEFAULT_CHUNK_BYTES,
                 bucket_bytes=DEFAULT_GRADIENT_BUCKET_BYTES,
                 first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES):
        if not communicator.supports_point_to_point:
            raise ValueError(
                "the reduction tree needs point-to-point transfers, which the "
                f"{communicator.engine} engine does not offer; use TensorFlow's "
                "collectives (engine='collective')."
            )
        super().__init__()
        self.communicator = communicator
        self.tree = KaryTree(communicator.world_size, fanout)
        self.chunk_bytes = positive_bytes("chunk_bytes", chunk_bytes)
        self.bucket_bytes = positive_bytes("bucket_bytes", bucket_bytes)
        self.first_bucket_bytes = positive_bytes("first_bucket_bytes", first_bucket_bytes)

    def reduce_bucket(self, bucket):
        tensors = list(bucket.tensors)
        if self.tree.depth == 0:
            return tensors
        require_static_shapes(bucket, "reduction tree")
        plan = FusionPlan(tensors, self.bucket_bytes)
        return plan.unpack([self._reduce_flat(flat) for flat in plan.pack(tensors)])

    def sent_bytes(self, n_bytes):
        """n to the parent (reduce) plus n to each child (broadcast)."""
        rank = self.communicator.rank
        links = len(self.tree.children(rank)) + (self.tree.parent(rank) is not None)
        return links * n_bytes

    @classmethod
    def predict_seconds(cls, n_bytes, world_size, alpha, beta, fanout=2,
                        chunk_bytes=DEFAULT_CHUNK_BYTES):
        """2 (d + C - 1) (alpha + k n / C beta): reduce and broadcast, each a pipeline."""
        depth = KaryTree(world_size, fanout).depth
        if depth == 0:
            return 0.0
        fanout = min(fanout, world_size - 1)
        chunks = max(1, math.ceil(n_bytes / chunk_bytes))
        return 2 * (depth + chunks - 1) * (alpha + fanout * n_bytes / chunks * beta)

    def _reduce_flat(self, flat):
        comm, tree, rank = self.communicator, self.tree, self.communicator.rank
        sizes = chunk_sizes(flat.shape.num_elements(), flat.dtype.size, self.chunk_bytes)
        chunks = split_flat(flat, sizes)
        # One key per (edge, chunk, direction), the same block on every rank; an
        # edge is named by its child rank 1..P-1.
        first_key = comm.reserve_instance_keys(2 * len(chunks) * (tree.world_size - 1))

        def key(child, chunk, direction):
            return first_key + ((child - 1) * len(chunks) + chunk) * 2 + direction

        parent, children = tree.parent(rank), tree.children(rank)
        results = []
        for index, chunk in enumerate(chunks):
            partial = chunk
            for child in children:
                partial = partial + comm.recv(chunk.shape, chunk.dtype, child,
                                              key(child, index, _UP))
            sends = []
            if parent is None:
                total = partial
            else:
                sends.append(comm.send(partial, parent, key(rank, index, _UP)))
                total = comm.recv(chunk.shape, chunk.dtype, parent, key(rank, index, _DOWN))
            sends += [comm.send(total, child, key(child, index, _DOWN)) for child in children]
            # The result must depend on every send: tf.function prunes sends nobody uses.
            with tf.control_dependencies(sends):
                results.append(tf.identity(total))
        return tf.concat(results, axis=0) if len(results) > 1 else results[0]
