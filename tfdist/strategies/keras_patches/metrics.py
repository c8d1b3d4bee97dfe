"""Metrics: a `Mean` updated once per batch is weighted by each rank's share (a hand-written
ratio of batch sums made global first: `ReplicaStep.global_ratio_value`)."""

import keras
import tensorflow as tf

from tfdist.strategies import replica_step


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
        return update_state(self, values, sample_weight=sample_weight)

    keras.metrics.Mean.update_state = mean_update_state
