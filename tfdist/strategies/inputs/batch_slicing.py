"""Split each global batch of a dataset across the training processes."""

import numpy as np
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
    rows = leading_rows(batch)
    if rows is None:
        raise ValueError("tfdist cannot shard a dataset element with no tensor in it.")
    return rows


def leading_rows(data):
    """The leading dimension (int32 scalar) of the first tensor of rank >= 1 in `data`, or None.

    `data` may hold anything a user passes to `strategy.run`: Python
    numbers and scalars are skipped.
    """
    for tensor in tf.nest.flatten(data):
        if isinstance(tensor, tf.SparseTensor):
            return tf.cast(tf.shape(tensor, out_type=tf.int64)[0], tf.int32)
        if isinstance(tensor, tf.RaggedTensor):
            return tensor.nrows(out_type=tf.int32)
        if (isinstance(tensor, (tf.Tensor, tf.Variable, np.ndarray))
                and tf.TensorShape(tensor.shape).rank != 0):
            return tf.shape(tensor, out_type=tf.int32)[0]
    return None


def _check_batched(element_spec):
    """Fail at `fit()` start, in one line, on a dataset whose elements are not batches.

    Every tensor of a batch has the batch as its first dimension, so a scalar
    component means the dataset yields single examples (`.batch()` missing):
    slicing it would fail deep inside tf.data, or split features across ranks.
    """
    for path, spec in _flatten_with_paths(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(
                f"tfdist: dataset element component {path} is a scalar, so the dataset yields "
                "single examples, not batches; call .batch(global_batch_size) on it before "
                "fit/evaluate/predict (tfdist gives each process its slice of every batch).")


def _flatten_with_paths(structure):
    """(path, spec) of each component: "1" for the second of a tuple, "x/a" in dicts."""
    if isinstance(structure, dict):
        items = structure.items()
    elif isinstance(structure, (tuple, list)):
        items = enumerate(structure)
    else:
        return [] if isinstance(structure, tf.OptionalSpec) else [("0", structure)]
    flat = []
    for key, value in items:
        for path, spec in _flatten_with_paths(value):
            inner = "" if path == "0" and not isinstance(value, (dict, tuple, list)) else f"/{path}"
            flat.append((f"{key}{inner}", spec))
    return flat


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
    _check_batched(dataset.element_spec)

    element_is_tuple = isinstance(dataset.element_spec, tuple)

    def take_slice(*components):
        # tf.data unpacks a tuple element into arguments: put it back together, as the
        # same structure (Keras' predict data `((a, b),)` is a 1-tuple holding a tuple).
        batch = components if element_is_tuple else components[0]
        rows = batch_rows(batch)
        start = (rank * rows) // world_size
        end = ((rank + 1) * rows) // world_size
        return tf.nest.map_structure(lambda t: _rows(t, start, end), batch)

    # A plain map, no prefetch: an iterator Keras opens only to peek at the first
    # batch must not pull more elements from a shared Python generator.
    return dataset.map(take_slice)


def slice_rows(global_rows, rank, world_size):
    """Rows of rank `rank`'s slice of a global batch of `global_rows` (`shard_global_batch`'s)."""
    return ((rank + 1) * global_rows) // world_size - (rank * global_rows) // world_size
