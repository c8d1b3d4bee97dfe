"""Per-optimizer gradient options: a factor on the global gradient, sparse gradients made dense.

Horovod's `DistributedOptimizer` takes arguments that change the gradient
an optimizer applies: `op=Sum` (the sum of the ranks' mean gradients, P
times their average), `backward_passes_per_step=N` with
`average_aggregated_gradients=False` (the sum of N accumulated gradients,
where Keras' `gradient_accumulation_steps` applies their mean) and
`sparse_as_dense` (an embedding's `IndexedSlices` travel as a dense
tensor). `tfdist.horovod.keras` expresses them on one optimizer object with
`apply_to`: the optimizer's class becomes its own class with `GradientOptions`
before it (`patch_points.adopt`; same class name and module, so the model
saves and loads as the plain optimizer), whose `apply` multiplies the
rank's gradients by `factor` and densifies sparse ones, then calls Keras'
`apply` - where tfdist makes them global. The global gradient is a
weighted sum of the ranks', so scaling each rank's by `factor` scales the
sum by exactly `factor`.

Cost: one multiplication per gradient when `factor` is not 1; a dense
gradient of the embedding's full shape when `sparse_as_dense`.
"""

import tensorflow as tf

from tfdist.strategies.keras_patches import patch_points


class GradientOptions:
    """`apply` with this optimizer's gradient options first (see the module docstring)."""

    _tfdist_gradient_factor = 1.0
    _tfdist_sparse_as_dense = False

    def apply(self, grads, trainable_variables=None):
        factor = self._tfdist_gradient_factor
        dense = self._tfdist_sparse_as_dense

        def adjusted(gradient):
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

        return super().apply([adjusted(g) for g in grads], trainable_variables)


def apply_to(optimizer, factor=1.0, sparse_as_dense=False):
    """Give `optimizer` (a Keras optimizer, maybe a `LossScaleOptimizer`) these options."""
    patch_points.adopt(optimizer, "BaseOptimizer", GradientOptions)
    optimizer._tfdist_gradient_factor = float(factor)  # pylint: disable=protected-access
    optimizer._tfdist_sparse_as_dense = bool(sparse_as_dense)  # pylint: disable=protected-access
    return optimizer
