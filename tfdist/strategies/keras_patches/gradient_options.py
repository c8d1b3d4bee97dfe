"""Per-optimizer gradient options: a factor on the global gradient, sparse gradients made dense.

Horovod's `DistributedOptimizer` takes arguments that change the gradient
an optimizer applies: `op=Sum` (the sum of the ranks' mean gradients, P
times their average), `backward_passes_per_step=N` with
`average_aggregated_gradients=False` (the sum of N accumulated gradients,
where Keras' `gradient_accumulation_steps` applies their mean) and
`sparse_as_dense` (an embedding's `IndexedSlices` travel as a dense
tensor). `tfdist.horovod.keras` expresses them on one optimizer object with
`apply_to`: that object's `apply` (an attribute of the object: its class,
config and saved form stay Keras' own) multiplies the rank's gradients by
`factor` and densifies sparse ones, then calls its class's `apply` - where
tfdist makes them global inside a step; outside one (a custom loop's
`apply_gradients`), on request, they are averaged over the ranks. The
global gradient is a weighted sum of the ranks', so scaling each rank's by
`factor` scales the sum by exactly `factor`.

Cost: one multiplication per gradient when `factor` is not 1; a dense
gradient of the embedding's full shape when `sparse_as_dense`.
"""

import tensorflow as tf

from tfdist.strategies.step import replica_step
from tfdist.strategies.keras_surface import patch_points


def _adjusted(gradient, factor, dense):
    if gradient is None:
        return None
    if dense and isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
    if factor == 1.0:
        return gradient
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def apply_to(optimizer, factor=1.0, sparse_as_dense=False, averaged_outside_steps=False):
    """Give `optimizer` (a Keras optimizer, maybe a `LossScaleOptimizer`) these options; the
    same object is returned. Called again, the new options replace the old.

    `averaged_outside_steps`: when `apply` is called outside a step of its tfdist strategy,
    in the cross-replica context (a custom loop's `apply_gradients` without `strategy.run`),
    the gradients are averaged over the ranks - divided by the number of ranks and applied in
    the strategy's replica context, whose all-reduce Keras' TF optimizer calls sums them
    through the strategy's gradient path (Horovod's `DistributedOptimizer` averages there
    too). Inside a step tfdist makes them global itself.
    """
    factor, dense = float(factor), bool(sparse_as_dense)
    keras_apply = type(optimizer).apply

    def apply(grads, trainable_variables=None):
        grads = [_adjusted(g, factor, dense) for g in grads]
        strategy = getattr(optimizer, "_distribution_strategy", None)  # Keras' TF optimizer
        if (not averaged_outside_steps or replica_step.current() is not None
                or not getattr(strategy, "is_tfdist_data_parallel", False)
                or not tf.distribute.in_cross_replica_context()):
            return keras_apply(optimizer, grads, trainable_variables)
        grads = [_adjusted(g, 1.0 / strategy.num_replicas_in_sync, False) for g in grads]
        with strategy.extended.replica_context():
            return keras_apply(optimizer, grads, trainable_variables)

    if factor != 1.0 or dense or averaged_outside_steps:
        patch_points.replace_on_instance(optimizer, "BaseOptimizer", "apply", apply)
    elif "apply" in vars(optimizer):
        del optimizer.apply  # back to Keras' own
    return optimizer


def options_of(optimizer):
    """Whether `optimizer` has gradient options (its own `apply`)."""
    return "apply" in vars(optimizer)
