"""Split each global batch of a dataset across the training processes."""

import tensorflow as tf


def _rows(tensor, start, end):
    if isinstance(tensor, tf.SparseTensor):
        shape = tf.shape(tensor, out_type=tf.int64)
        size = tf.concat([[tf.cast(end - start, tf.int64)], shape[1:]], axis=0)
        begin = tf.concat([[tf.cast(start, tf.int64)], tf.zeros_like(shape[1:])], axis=0)
        return tf.sparse.slice(tensor, begin, size)
    if isinstance(tensor, tf.experimental.Optional):
        return tensor  # Keras' placeholder for a missing y / sample_weight
    return tensor[start:end]


def batch_rows(batch):
    """Rows (int32 scalar) of a batch: the leading dimension of its first tensor."""
    for tensor in tf.nest.flatten(batch):
        if isinstance(tensor, tf.experimental.Optional):
            continue
        if isinstance(tensor, tf.SparseTensor):
            return tf.cast(tf.shape(tensor, out_type=tf.int64)[0], tf.int32)
        if isinstance(tensor, tf.RaggedTensor):
            return tensor.nrows(out_type=tf.int32)
        return tf.shape(tensor, out_type=tf.int32)[0]
    raise ValueError("tfdist cannot shard a dataset element with no tensor in it.")


def shard_global_batch(dataset, rank, world_size):
    """Give rank `rank` its contiguous slice of every batch of `dataset`.

    Each element of `dataset` is one global batch of n rows; rank r receives
    rows [r n // P, (r + 1) n // P). Concatenating the slices in rank order
    gives the global batch back, so any batch is split as evenly as possible
    (slices differ by at most one row; a rank's slice is empty when n < P) and
    predictions gathered in rank order keep the input order. Any global batch
    size works: each rank's step weights its slice by its share of the global
    batch (`replica_step`), which makes uneven splits exact.

    Cost: a slice per tensor per batch; every rank still reads (and
    preprocesses) the whole global batch, which is what makes shuffling and
    sharding exactly match a single process. The slice adds no prefetching:
    a pipeline's own `prefetch` still applies.
    """
    if world_size == 1:
        return dataset

    def take_slice(*components):  # tf.data unpacks a tuple element into arguments
        batch = components if len(components) > 1 else components[0]
        rows = batch_rows(batch)
        start = (rank * rows) // world_size
        end = ((rank + 1) * rows) // world_size
        return tf.nest.map_structure(lambda t: _rows(t, start, end), batch)

    # A plain map, no prefetch: an iterator Keras opens only to peek at the first
    # batch must not pull more elements from a shared Python generator.
    return dataset.map(take_slice)
