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


def _batch_rows(batch):
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
    gives the global batch back, so a final partial batch is split as evenly
    as possible (slices differ by at most one row) and predictions gathered in
    rank order keep the input order. The first batch (the configured global
    batch size) must be divisible by P; otherwise iterating raises
    `InvalidArgumentError` saying so.

    Cost: a slice per tensor per batch; every rank still reads (and
    preprocesses) the whole global batch, which is what makes shuffling and
    sharding exactly match a single process.
    """
    if world_size == 1:
        return dataset

    def take_slice(index, batch):
        rows = _batch_rows(batch)
        check = tf.debugging.Assert(
            tf.logical_or(index > 0, tf.equal(rows % world_size, 0)),
            [
                f"tfdist: the global batch size must be divisible by the number of processes "
                f"({world_size}); got a first batch of",
                rows,
                "rows. Choose batch_size as a multiple of the process count.",
            ],
        )
        with tf.control_dependencies([check]):
            start = (rank * rows) // world_size
            end = ((rank + 1) * rows) // world_size
        return tf.nest.map_structure(lambda t: _rows(t, start, end), batch)

    sharded = dataset.enumerate().map(take_slice, num_parallel_calls=tf.data.AUTOTUNE,
                                      deterministic=True)
    return sharded.prefetch(tf.data.AUTOTUNE)
