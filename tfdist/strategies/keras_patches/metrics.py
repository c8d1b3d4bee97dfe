"""Metrics: a `Mean` updated once per batch is weighted by each rank's share (a hand-written
ratio of batch sums made global first: `ReplicaStep.global_ratio_value`), and a per-output
loss tracker by what the plain script's step would weight it by.

Keras updates each output's loss tracker with `sample_weight=` the batch's *static* size
(`y_pred.shape[0]`), None when the traced step does not know it. A tfdist step never knows
it (every rank's slice has its own size, so its steps are traced with none), while the
plain script's does whenever Keras traces its step on eager batches (Keras 3.16 with
`steps_per_execution=1`, `keras_internals.STEPS_TRACED_ON_EAGER_BATCHES`): there the first
batch's size is static and a batch of another size runs a relaxed trace (`reduce_retracing`)
whose size is unknown. So the plain tracker counts a batch of the first batch's size by its
rows, any other batch once. `_plain_tracker_weight` gives the same weight: the global batch's
rows when they equal the first global batch's of this compiled function, else 1; the first
is held in a variable per compiled function (a recompile, like the plain script's, starts
again). Cost: the global row count before the metrics (one small all-reduce when the step
has not needed it already), for models with several outputs on Keras 3.16 only.
"""

import weakref

import keras
import tensorflow as tf

from tfdist.strategies.step import replica_step
from tfdist.strategies.keras_surface import keras_internals
from tfdist.strategies.keras_surface import patch_points

_first_rows = weakref.WeakKeyDictionary()  # a model's compiled step function -> tf.Variable


def _is_per_output_loss_tracker(model, metric):
    compile_loss = getattr(model, "_compile_loss", None)
    return compile_loss is not None and any(m is metric for m in compile_loss.metrics)


def _first_rows_of(function):
    """The variable holding the first global batch's rows seen by `function` (-1: none yet)."""
    if function not in _first_rows:
        with tf.init_scope():
            _first_rows[function] = tf.Variable(-1.0, trainable=False, name="tfdist_first_rows",
                                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    return _first_rows[function]


def _plain_tracker_weight(metric, step):
    """The plain script's weight of `metric`'s update in this step (see the module docstring),
    or None where it passes none."""
    if not keras_internals.STEPS_TRACED_ON_EAGER_BATCHES or step.keras_step is None:
        return None
    model, phase = step.keras_step
    if (getattr(model, "steps_per_execution", 1) != 1
            or not _is_per_output_loss_tracker(model, metric)):
        return None
    function = model.train_function if phase == "train" else model.test_function
    if function is None:
        return None
    first = _first_rows_of(function)
    rows = step.global_rows
    first_rows = first.assign(tf.where(first < 0, rows, first))
    return tf.where(tf.equal(rows, first_rows), rows, tf.ones_like(rows))


def install():
    """Mark `Mean` updates with one unweighted scalar as batch-level (see `replica_step`)."""
    update_state = keras.metrics.Mean.update_state

    def mean_update_state(self, values, sample_weight=None):
        step = replica_step.current()
        if step is not None and sample_weight is None and len(getattr(values, "shape", ())) == 0:
            step.note_batch_level_update(
                getattr(v, "_value", v) for v in self.variables)  # Keras -> tf.Variable
            if isinstance(values, tf.Tensor):
                values = step.global_ratio_value(values)  # a hand-written ratio of batch sums
            sample_weight = _plain_tracker_weight(self, step)
        return update_state(self, values, sample_weight=sample_weight)

    patch_points.replace("keras.metrics.Mean", "update_state", mean_update_state)
