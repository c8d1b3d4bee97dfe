"""What one rank's step knows about the global batch it is part of.

On one process a Keras step sees the whole global batch of n rows. Across P
processes rank r sees its slice of n_r rows (`sharding.shard_global_batch`),
and n_r may differ between ranks (a final partial batch) or be zero (fewer
rows than processes). Single-process results are recovered exactly by
weighting every rank's per-slice quantity by its *share* of the global
batch, n_r / n:

* the step's losses are means over the slice, as on one process (Keras'
  own 1 / num_replicas scaling is switched off by `keras_patches`), so the
  global gradient is sum_r (n_r / n) * grad_r - what one process computes
  for a mean loss over the global batch, for any split. When the step
  calls `optimizer.scale_loss` (Keras' own train_step does), the share is
  applied to the loss there instead, so every rank's backward pass carries
  the magnitudes one process would (this matters to float16 loss scaling);
* a batch-level metric update (a scalar passed to a `Mean` without
  weights, e.g. a per-output loss tracker or a custom train step's
  `loss_tracker.update_state(loss)`) counts once per global batch on one
  process, so its state change is weighted by the share as well;
* per-example metric state (accuracy counts, weighted sums) simply adds up.

A rank with an empty slice runs its step on a stand-in row of zeros (so
layers such as BatchNormalization see a valid batch) whose every effect is
weighted by zero.

`ReplicaStep` holds these facts for the step being traced; `current()` is
the step of the calling thread (None outside a tfdist step).

Cost: one all-reduce of a single scalar per step (the global row count),
independent of the forward pass, so it overlaps with computation.
"""

import contextlib
import threading

import tensorflow as tf

_local = threading.local()


class ReplicaStep:
    """One rank's view of one global batch, inside a traced step.

    Attributes:
        local_rows: int32 scalar, rows of this rank's slice (n_r).
        global_rows: float32 scalar, rows of the global batch (n).
        share: float32 scalar, n_r / n (0 for an empty slice).
        has_rows: bool scalar, n_r > 0.
    """

    def __init__(self, local_rows, global_rows):
        self.local_rows = local_rows
        self.global_rows = global_rows
        self.share = tf.math.divide_no_nan(tf.cast(local_rows, tf.float32), global_rows)
        self.has_rows = local_rows > 0
        self.gradients_aggregated = False
        self.remote_parameter_set = None  # asynchronous PS: (set id, variables, servers)
        self._batch_level_variables = {}
        self._share_in_loss = set()  # ids of optimizers whose scale_loss applied the share

    def weight(self, dtype):
        """The share as `dtype` (to weight a per-slice value)."""
        return tf.cast(self.share, dtype)

    def note_batch_level_update(self, variables):
        """Mark metric variables updated with one value per batch in this step."""
        for variable in variables:
            self._batch_level_variables[id(variable)] = variable

    def is_batch_level(self, variable):
        return id(variable) in self._batch_level_variables

    def weight_loss(self, optimizer, loss):
        """`optimizer.scale_loss` in this step: weight the loss by the share.

        Gradients of a loss weighted this way are per-example gradients
        divided by the *global* row count, as on one process, which keeps
        mixed-precision loss scaling's overflow behaviour identical; the
        optimizer's gradients then need no weighting at aggregation.
        """
        self._share_in_loss.add(id(optimizer))
        return tf.math.multiply_no_nan(loss, self.weight(loss.dtype))

    def loss_was_weighted_for(self, optimizer):
        return id(optimizer) in self._share_in_loss

    @contextlib.contextmanager
    def aggregated_gradients(self):
        """Inside: gradients were already summed across ranks (no second all-reduce)."""
        previous, self.gradients_aggregated = self.gradients_aggregated, True
        try:
            yield
        finally:
            self.gradients_aggregated = previous


def current():
    """The `ReplicaStep` being traced on this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def active(step):
    """Make `step` the current step for the duration of the block."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(step)
    try:
        yield step
    finally:
        stack.pop()


def stand_in_for_empty_slice(data, has_rows):
    """`data` itself when it has rows, else one row of zeros of the same structure.

    Dense tensors get a zero row (empty strings for strings); sparse, ragged
    and placeholder elements are kept as they are.
    """

    def one(tensor):
        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank is None \
                or tensor.shape.rank == 0:
            return tensor
        shape = tf.concat([[1], tf.shape(tensor)[1:]], axis=0)
        zeros = tf.zeros(shape, dtype=tensor.dtype)
        return tf.cond(has_rows, lambda: tensor, lambda: zeros)

    return tf.nest.map_structure(one, data)
