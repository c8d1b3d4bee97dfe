"""Losses: each rank's loss is a mean over its slice, each term over its own denominator.

Two patches of `keras.src.losses.loss` (see `replica_step` for the rule; a
hand-written ratio differentiated directly is `gradient_tape`'s):
Keras' 1 / num_replicas loss scaling is off in a multi-process tfdist
strategy (tfdist weights by each rank's share instead), and a loss term whose
denominator is not proportional to the rows (a mask, sample weights,
`reduction="sum"`, a hand-written ratio of batch sums) is rescaled for its
global denominator, and so is a scalar loss the user wrote as a ratio of batch
sums wherever it is reduced or differentiated.
"""

import functools

import keras
import tensorflow as tf

from tfdist.strategies.step import replica_step
from tfdist.strategies.keras_surface.model_strategy import in_multi_process_strategy
from tfdist.strategies.keras_surface import keras_internals
from tfdist.strategies.keras_surface import patch_points


def _install_loss_scaling():
    """Losses stay means over the rank's slice (see `replica_step`), as on one process.

    Keras divides mean losses by num_replicas_in_sync so that a plain sum of
    gradients is the mean - right only when every replica holds the same
    number of rows. tfdist weights each rank's gradients and batch-level
    metrics by its share of the global batch instead.
    """
    scale = keras_internals.loss_module.scale_loss_for_distribution
    unscale = keras_internals.loss_module.unscale_loss_for_distribution

    def scale_loss_for_distribution(value):
        return value if in_multi_process_strategy() else scale(value)

    def unscale_loss_for_distribution(value):
        if not in_multi_process_strategy():
            return unscale(value)
        return _global_if_ratio(value)  # what Keras' steps give their loss tracker

    patch_points.replace("keras.src.losses.loss", "scale_loss_for_distribution",
                         scale_loss_for_distribution)
    patch_points.replace("keras.src.losses.loss", "unscale_loss_for_distribution",
                         unscale_loss_for_distribution)


def _install_global_loss_denominators():
    """Each loss term averages over what one process would average over (`replica_step`).

    Keras reduces a loss term over a rank's slice by its own denominator -
    the slice's elements, but also the valid tokens of a mask (a sequence
    model with `mask_zero=True`), the sum of the sample weights
    (`reduction="mean_with_sample_weight"`) or nothing (`reduction="sum"`) -
    where tfdist weights per-slice values by rows. The terms whose
    denominator is not proportional to the rows are rescaled here
    (`ReplicaStep.weight_for_global_denominator`), so that the step's
    share weighting gives each term's global value. So is a `Loss` whose
    `call` returns its own ratio of batch sums (keras.io's NER loss,
    `ops.sum(loss * mask) / ops.sum(mask)`; `BatchLineage.ratio_denominator`).
    Keras' own steps and custom `train_step`s that call a `keras.losses.Loss`
    get this; a user's function in `strategy.run` scales its losses itself.
    """
    reduce_weighted_values = keras_internals.loss_module.reduce_weighted_values

    @functools.wraps(reduce_weighted_values)
    def globally_reduced(values, sample_weight=None, mask=None,
                         reduction="sum_over_batch_size", dtype=None):
        loss = reduce_weighted_values(values, sample_weight=sample_weight, mask=mask,
                                      reduction=reduction, dtype=dtype)
        step = replica_step.current()
        if (step is None or step.scaled_by_user or step.plan.is_remote
                or not in_multi_process_strategy()):
            return loss
        reduction = keras_internals.loss_module.standardize_reduction(reduction)
        values = keras.ops.convert_to_tensor(values, dtype=dtype)
        if values.shape.rank == 0:  # reduced by the loss itself: a hand-written mean?
            denominator = step.lineage.ratio_denominator(values)
            if denominator is None or sample_weight is not None or mask is not None:
                return loss
            return step.weight_for_global_denominator(loss, denominator.local, denominator.inner,
                                                      denominator.outer)
        if reduction in (None, "none") or len(loss.shape) != 0:
            return loss  # no reduction: the caller reduces (and is weighted by rows)
        if reduction == "sum":
            return step.weight_for_global_denominator(loss, None)
        if reduction in ("mean", "sum_over_batch_size"):
            if mask is None:
                return loss  # divided by its elements: proportional to the rows
            denominator = keras.ops.sum(keras.ops.cast(
                keras.ops.convert_to_tensor(mask, dtype=dtype), values.dtype))
            return step.weight_for_global_denominator(loss, denominator)
        # "mean_with_sample_weight": divided by the sum of the (masked) sample weights.
        if sample_weight is not None:
            sample_weight = keras.ops.convert_to_tensor(sample_weight, dtype=dtype)
        if mask is not None:
            mask = keras.ops.convert_to_tensor(mask, dtype=dtype)
        weights = keras_internals.loss_module.apply_mask(sample_weight, mask, dtype=values.dtype,
                                               reduction=reduction)
        if weights is None:
            return loss
        _, weights = keras_internals.loss_module.squeeze_or_expand_to_same_rank(
            values, keras.ops.cast(weights, values.dtype))
        return step.weight_for_global_denominator(loss, keras.ops.sum(weights))

    patch_points.replace("keras.src.losses.loss", "reduce_weighted_values", globally_reduced)


def _global_if_ratio(value):
    """`value`, made global if it is a hand-written ratio of batch sums in a tfdist step
    (`ReplicaStep.global_ratio_value`)."""
    step = replica_step.current()
    if step is None or not isinstance(value, tf.Tensor) or not in_multi_process_strategy():
        return value
    return step.global_ratio_value(value)


def install():
    """The loss patches."""
    _install_loss_scaling()
    _install_global_loss_denominators()
