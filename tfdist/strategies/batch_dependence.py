"""Whether a tensor of a traced step is computed from the step's batch.

A sparse gradient (`tf.IndexedSlices`) has one (index, value) pair per
lookup. When the indices come from the batch (an `Embedding` of the input
tokens), one process's pairs for the global batch are every rank's pairs in
rank order: tfdist gathers them. When they do not (keras.io's position
embedding, `Embedding(maxlen)(ops.arange(maxlen))`), one process looks every
index up once and sums the values over the batch; every rank looks up the
same indices, so the global gradient is the same indices with the values
summed over ranks. `reads_batch` tells the two apart from the graph.

A tensor reads the batch if an op it is computed from is one of the ops
that produced the step's inputs. Shapes are the exception: every rank
holds rows of the same global batch, so a dimension other than the first
(`tf.shape(x)[1]`, a sequence length) is the same on every rank and does not
count; the first (the slice's rows) does.

The same test finds the denominator of a hand-written mean over the batch,
a scalar loss computed as `ops.sum(loss * mask) / ops.sum(mask)` (keras.io's
per-token NER loss): a ratio of two values that both read the batch
(`batch_ratio_denominator`), whose global value is the ratio of the sums.

Cost: one walk over the ancestors of the tensor, once per trace.
"""

import tensorflow as tf

from tfdist import _tf


def reads_batch(tensor, input_tensors):
    """True if `tensor` is computed from `input_tensors` (other than their non-batch sizes)."""
    sources = {t.op for t in tf.nest.flatten(input_tensors) if isinstance(t, tf.Tensor)
               and not tf.executing_eagerly() and hasattr(t, "op")}
    if not sources or not hasattr(tensor, "op"):
        return bool(sources)
    return _tf.has_ancestor(tensor, lambda op: op in sources, skip=_is_non_batch_dimension)


def _is_non_batch_dimension(op):
    """`tf.shape(x)[k]` for a constant k other than 0 (the same on every rank)."""
    if op.type != "StridedSlice" or op.inputs[0].op.type != "Shape":
        return False
    begin = tf.get_static_value(op.inputs[1])
    if begin is None or len(begin) != 1 or not op.get_attr("shrink_axis_mask") & 1:
        return False
    dimension = int(begin[0])
    if dimension < 0:
        rank = op.inputs[0].op.inputs[0].shape.rank
        if rank is None:
            return False
        dimension += rank
    return dimension >= 1


_DIVISIONS = ("RealDiv", "DivNoNan", "Div")
_PASS_THROUGH = ("Identity", "Cast")


def batch_ratio_denominator(tensor, input_tensors):
    """The denominator of a scalar `tensor` computed as a ratio of two batch values, or None.

    `sum(loss * mask) / sum(mask)` over one process's batch is a ratio of
    sums; on P processes its value is the ratio of the sums over all ranks,
    which the caller computes from this denominator. None when `tensor` is
    not such a division (a `Mean` op, a constant-weighted value).
    """
    if not hasattr(tensor, "op") or tensor.shape.rank != 0:
        return None
    op = tensor.op
    while op.type in _PASS_THROUGH:
        op = op.inputs[0].op
    if op.type not in _DIVISIONS:
        return None
    numerator, denominator = op.inputs[0], op.inputs[1]
    if denominator.shape.rank != 0:
        return None
    if reads_batch(numerator, input_tensors) and reads_batch(denominator, input_tensors):
        return denominator
    return None
