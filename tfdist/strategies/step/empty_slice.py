"""Empty slices: no model runs on zero rows where one process would not.

A rank's slice of a global batch is empty when the batch has fewer rows than
processes (a last partial batch: 193 rows in batches of 32 at 2 or more
processes). One process never runs a model on zero rows, and TensorFlow's
kernels do not all handle them (`experiments/results/onednn_zero_rows.json`,
the sweep over Keras' common layers): under TensorFlow's oneDNN CPU kernels,
on by default on CPUs with AVX-512 VNNI or BF16, the gradient of every max
pool aborts the process and convolutions (Conv1D/2D, SeparableConv,
ConvLSTM) return a wrongly shaped result; on any CPU, Keras' LSTM and
GlobalMaxPooling2D fail on zero rows when run eagerly. So a model is never
given zero rows; it gets one stand-in row of zeros instead, in two places:

* Keras' steps (`fit`, `evaluate`, `predict`, a custom `train_step`,
  `test_step` or `predict_step`): the step's inputs
  (`stand_in_for_empty_slice`). Every effect of the stand-in row is
  weighted by zero (`row_accounting`), and `predict` drops its rows.
* A user's function run by `strategy.run` (a custom loop, whose loss the
  user scales): the outermost Keras layer called on zero rows (the model)
  runs on the stand-in row, and its outputs are cut back to zero rows
  (`call_on_rows`), so the user's code after the model sees what zero rows
  give: per-example losses with no rows, a zero data loss, no metric
  change. The cut rows' outputs get no upstream gradient, so the data
  terms of the gradient are exactly zero, while a term that does not
  depend on the rows (`scale_regularization_loss(model.losses)`) stays.
  What a layer does on the stand-in row besides its outputs is weighted by
  zero as in Keras' steps (a BatchNormalization's moving statistics:
  `local_state`); a loss a layer adds in `call` from its inputs or outputs
  (an activity regularizer) is the one exception: the stand-in row's is
  counted.

Guarantee: a rank with an empty slice contributes to the step exactly what
zero rows contribute on one process (nothing, beyond row-independent terms).
Cost: on a non-empty slice, one `tf.cond` per input tensor and one slice per
output of the outermost layer call of a custom loop's step (none where the
batch dimension is static and non-zero); on an empty slice, the model's
forward and backward pass over one row.
"""

import contextlib

import tensorflow as tf


def _is_dense_batch(tensor):
    return (isinstance(tensor, tf.Tensor) and tensor.shape.rank is not None
            and tensor.shape.rank > 0)


def _zero_row(tensor):
    """One row of zeros shaped like a row of `tensor`, with a static shape where it is known
    (a graph traced on a stand-in row is then the graph of a one-row slice: the same
    collectives in the same order as a rank whose slice has one row)."""
    if tensor.shape[1:].is_fully_defined():
        return tf.zeros([1] + tensor.shape[1:].as_list(), dtype=tensor.dtype)
    return tf.zeros(tf.concat([[1], tf.shape(tensor)[1:]], axis=0), dtype=tensor.dtype)


def _empty_row(tensor):
    """One row with no values of a `tf.SparseTensor` or `tf.RaggedTensor`."""
    if isinstance(tensor, tf.SparseTensor):
        shape = tf.shape(tensor, out_type=tf.int64)
        return tf.SparseTensor(tf.zeros([0, shape.shape[0]], tf.int64), tensor.values[:0],
                               tf.concat([[1], shape[1:]], axis=0))
    return tf.RaggedTensor.from_row_splits(tensor.values[:0],
                                           tf.zeros([2], tensor.row_splits.dtype))


def stand_in_for_empty_slice(data, has_rows):
    """`data` itself when it has rows, else one row of zeros of the same structure.

    Dense tensors get a zero row (empty strings for strings); a sparse or
    ragged tensor gets one row with no values; placeholders are kept as
    they are.
    """

    def one(tensor):
        if isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)):
            return tf.cond(has_rows, lambda: tensor, lambda: _empty_row(tensor))
        if not _is_dense_batch(tensor):
            return tensor
        return tf.cond(has_rows, lambda: tensor, lambda: _zero_row(tensor))

    return tf.nest.map_structure(one, data)


def _may_be_empty(tensor):
    """False when the tensor's batch dimension is known and non-zero (it cannot be empty)."""
    rows = tensor.shape[0]
    return rows is None or rows == 0


def call_on_rows(call, args, kwargs, mask_of=None, set_mask=None, stand_in_scope=None):
    """`call(*args, **kwargs)`, on a stand-in row when its first batch tensor has zero rows.

    Every dense input tensor with zero rows is replaced by one row of zeros
    (its Keras mask with it, through `mask_of` / `set_mask`); every dense
    output (and its mask) is then cut back to zero rows. With rows, the
    call is unchanged. In a graph the choice is made at run time; eagerly,
    in Python. The call runs inside `stand_in_scope(is_stand_in)` (a bool
    tensor) when given: what it sums across replicas from a stand-in row
    counts zero (`cross_replica_sum`).
    """
    tensors = [t for t in tf.nest.flatten((args, kwargs)) if _is_dense_batch(t)]
    if not tensors or not _may_be_empty(tensors[0]):
        return call(*args, **kwargs)
    static_rows = tensors[0].shape[0]  # known when eager, or traced for one shape
    if static_rows is not None and static_rows > 0:
        return call(*args, **kwargs)
    has_rows = tf.shape(tensors[0])[0] > 0

    def stand_in(tensor):
        if not _is_dense_batch(tensor) or not _may_be_empty(tensor):
            return tensor
        if static_rows is not None:  # eager, and empty
            replaced = _zero_row(tensor) if tensor.shape[0] == 0 else tensor
        else:
            replaced = tf.cond(tf.shape(tensor)[0] > 0, lambda: tensor,
                               lambda: _zero_row(tensor))
        mask = mask_of(tensor) if mask_of is not None else None
        if mask is not None and _is_dense_batch(mask):
            set_mask(replaced, stand_in(mask))
        return replaced

    def cut(tensor):
        if not _is_dense_batch(tensor):
            return tensor
        if static_rows is not None:
            kept = tensor[:0]
        else:
            kept = tensor[:tf.shape(tensor)[0] * tf.cast(has_rows, tf.int32)]
        mask = mask_of(tensor) if mask_of is not None else None
        if mask is not None and _is_dense_batch(mask):
            set_mask(kept, cut(mask))
        return kept

    args, kwargs = tf.nest.map_structure(stand_in, (args, kwargs))
    with (stand_in_scope(tf.logical_not(has_rows)) if stand_in_scope is not None
          else contextlib.nullcontext()):
        outputs = call(*args, **kwargs)
    return tf.nest.map_structure(cut, outputs)
