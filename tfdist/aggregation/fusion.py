"""Tensor fusion: pack many tensors into few flat buffers and unpack them.

Per-collective latency dominates for the many small gradients of a model, so
aggregators all-reduce a handful of fused buffers instead of one tensor per
variable (Horovod's "tensor fusion", PyTorch DDP's "buckets"). Tensors are
grouped by dtype, in order, into buckets of at most `bucket_bytes` (a single
larger tensor forms a bucket of its own, as does a tensor whose static shape
is not fully known).

Cost: one concat and one split per bucket (memory traffic 2n), in exchange
for (number of tensors - number of buckets) fewer collective latencies.
"""

import tensorflow as tf

DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024
# Reverse-order gradient buckets (`reverse_order_buckets`). PyTorch DDP uses 25 MiB; on a
# 19 MB model, 4 MiB buckets were as fast or faster on every engine measured
# (benchmarks/results/overlap_buckets.json), and a model under 1 MiB is one bucket anyway.
DEFAULT_GRADIENT_BUCKET_BYTES = 4 * 1024 * 1024
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


class FusionPlan:
    """How `tensors` were packed: buckets of (dtype, [(index, shape, size)])."""

    def __init__(self, tensors, bucket_bytes=DEFAULT_BUCKET_BYTES):
        self.count = len(tensors)
        self.buckets = []
        open_bucket = {}  # dtype -> (entries, bytes so far)
        for index, tensor in enumerate(tensors):
            size = tensor.shape.num_elements()
            if size is None:
                # Not fused: a buffer of its own, its shape read when the step runs.
                self.buckets.append((tensor.dtype, [(index, tf.shape(tensor), None)]))
                continue
            nbytes = size * tensor.dtype.size
            entries, used = open_bucket.get(tensor.dtype, (None, 0))
            if entries is None or used + nbytes > bucket_bytes:
                entries, used = [], 0
                self.buckets.append((tensor.dtype, entries))
            entries.append((index, tensor.shape, size))
            open_bucket[tensor.dtype] = (entries, used + nbytes)

    def pack(self, tensors):
        """One flat tensor per bucket."""
        return [
            tf.concat([tf.reshape(tensors[i], [-1]) for i, _, _ in entries], axis=0)
            if len(entries) > 1 else tf.reshape(tensors[entries[0][0]], [-1])
            for _, entries in self.buckets
        ]

    def unpack(self, flats):
        """Inverse of `pack` (on reduced buffers): the tensors in original order."""
        out = [None] * self.count
        for flat, (_, entries) in zip(flats, self.buckets):
            pieces = split_flat(flat, [size for _, _, size in entries])
            for piece, (index, shape, _) in zip(pieces, entries):
                out[index] = tf.reshape(piece, shape)
        return out


def near_equal_sizes(num_elements, count):
    """`count` sizes (at most `num_elements` of them, at least one) that differ by at most
    one element and sum to `num_elements`: how chunked algorithms cut a flat buffer."""
    count = max(1, min(count, num_elements))
    base, extra = divmod(num_elements, count)
    return [base + 1] * extra + [base] * (count - extra)


def split_flat(flat, sizes):
    """`flat` cut into consecutive pieces of `sizes` elements."""
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


def reverse_order_buckets(sizes, bucket_bytes, first_bucket_bytes=None):
    """Positions of tensors of `sizes` bytes grouped into buckets, last tensor first.

    Gradients are listed in layer order, and the backward pass produces them
    in reverse: walking the list backwards, each bucket takes tensors until
    the next one would overflow `bucket_bytes` (`first_bucket_bytes` for the
    first bucket, which is sent while most of the backward pass is still to
    run; a tensor larger than the limit gets a bucket of its own). Buckets
    are returned in the order they are issued (PyTorch DDP's reverse-order
    buckets with a small first bucket). Every rank computes the same
    partition from the same sizes.

    Cost: one collective latency per bucket; in exchange each bucket's
    all-reduce can start as soon as its gradients exist, while the
    backward pass of earlier layers is still computing.
    """
    buckets, current, used = [], [], 0
    limit = first_bucket_bytes if first_bucket_bytes is not None else bucket_bytes
    for position in reversed(range(len(sizes))):
        if current and used + sizes[position] > limit:
            buckets.append(current)
            current, used, limit = [], 0, bucket_bytes
        current.append(position)
        used += sizes[position]
    if current:
        buckets.append(current)
    return buckets
