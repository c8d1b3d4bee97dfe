"""Optimizers: the global gradient reaches `apply` before anything else touches it."""

import functools
import threading

import tensorflow as tf

from tfdist.strategies import replica_step
from tfdist.strategies.keras_patches.steps import scales_loss
from tfdist.strategies.step_plan import DEFERRED, REMOTE
from tfdist.strategies.keras_patches import keras_internals
from tfdist.strategies.keras_patches.keras_internals import (BaseOptimizer, LossScaleOptimizer,
                                                              TFOptimizer)
from tfdist.strategies.keras_patches import optimizer_sharding, patch_points
from tfdist.strategies.sharded_optimizer_state import shards_of


def _build_as_apply_does(optimizer, variables):
    """Build `optimizer` (and the aggregation hook's state) where Keras' `apply` would, in the
    step that first applies: before the gradients are aggregated, which may use that state."""
    with keras_internals.backend.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)
    optimizer.built = True


def _refuse_local_gradients_if_sharded(optimizer):
    """A sharded optimizer applies global gradients only: inside a step of its strategy."""
    shards = shards_of(optimizer)
    if shards is not None:
        raise ValueError(
            f"tfdist rank {shards.rank}: {optimizer.name}'s state is sharded across the ranks "
            "(shard_optimizer_state=True): apply its gradients inside strategy.run(...) (or "
            "fit), where they are summed over the ranks first.")


_as_given = threading.local()  # .active: an apply of gradients the script reduced itself


def _apply_as_given(optimizer, original, grads, trainable_variables, strategy):
    """`apply_gradients` of a custom loop outside `strategy.run`, in the cross-replica context
    of a tfdist strategy (TensorFlow's default since `hvd.init()`).

    Under Horovod's semantics (a per-rank-input strategy: `tfdist.horovod`) the optimizer
    applies what it is given, as Horovod's does: the script reduced the gradients itself
    (`DistributedGradientTape`, `hvd.allreduce`) or keeps them local. Keras' TF optimizer
    needs a replica context there; it gets this rank's, with its all-reduce skipped. Under a
    global-batch strategy such gradients would be this rank's alone: refused, naming the way.
    """
    if not strategy.extended.per_rank_input:
        raise ValueError(
            f"tfdist rank {strategy.rank}: {optimizer.name}.apply_gradients was called outside "
            "strategy.run(...), with this rank's gradients only: the ranks would drift apart. "
            "Compute and apply the gradients inside strategy.run(step_fn, args=...) (the "
            "TensorFlow guide's custom loop), where they are summed over the ranks, or use "
            "tfdist.horovod.tensorflow's DistributedGradientTape.")
    _as_given.active = True
    try:
        with strategy.extended.replica_context():
            return original(optimizer, grads, trainable_variables)
    finally:
        _as_given.active = False


def install():
    """Optimizers see the global gradient before anything else touches it.

    Keras' TF optimizer all-reduces inside `apply`, after clipping
    (`clipnorm`, `clipvalue`, `global_clipnorm`), gradient accumulation and
    LossScaleOptimizer's finite check - all of which must see the whole
    batch's gradient to match one process. tfdist aggregates at the entry of
    the outermost `apply` and marks the step so the inner all-reduce is skipped.
    In Keras' own `train_step` the whole `apply` waits for the end of the
    step (a `DEFERRED` `StepPlan`), where the gradients join the step's
    one fused all-reduce. When Keras builds an optimizer, the strategy's
    aggregation hook builds its state for the same variables, as variables
    of that optimizer (`Aggregator.build`).
    """

    def aggregating(original):
        def apply(self, grads, trainable_variables=None):
            step = replica_step.current()
            if step is not None and step.gradients_aggregated:
                return _apply_global(self, grads, trainable_variables)
            if step is None:
                _refuse_local_gradients_if_sharded(self)
                strategy = tf.distribute.get_strategy()
                if (getattr(strategy, "is_tfdist_data_parallel", False)
                        and tf.distribute.in_cross_replica_context()):
                    return _apply_as_given(self, original, grads, trainable_variables, strategy)
                return original(self, grads, trainable_variables)
            strategy = tf.distribute.get_strategy()
            grads = list(grads)
            if trainable_variables is not None and grads and not self.built:
                _build_as_apply_does(self, list(trainable_variables))
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)  # pylint: disable=protected-access
            if step.plan.updates == REMOTE:  # asynchronous: the servers apply
                return strategy.extended.push_gradients(
                    self, grads, variables, weighted_in_loss=step.loss_was_weighted_for(self))
            scatter_to = optimizer_sharding.scatter_target(self)
            if step.plan.updates == DEFERRED:  # summed with the step's state at its end
                step.defer_update(replica_step.DeferredUpdate(
                    tuple(grads),
                    tuple(variables) if len(variables) == len(grads) else None,
                    step.loss_was_weighted_for(self),
                    lambda global_grads: _apply_global(self, global_grads, trainable_variables),
                    scatter_to))
                return None
            grads = strategy.extended.aggregate_gradients(
                grads, variables=variables if len(variables) == len(grads) else None,
                weighted_in_loss=step.loss_was_weighted_for(self), scatter_to=scatter_to)
            with step.aggregated_gradients():
                return _apply_global(self, grads, trainable_variables)

        def _apply_global(self, grads, trainable_variables):
            """Keras' apply of the global gradients (on this rank's shards if sharded)."""
            if shards_of(self) is not None:
                return optimizer_sharding.apply_sharded(self, original, grads,
                                                        trainable_variables)
            return original(self, grads, trainable_variables)

        return apply

    def share_weighted(original):
        def scale_loss(self, loss):
            step = replica_step.current()
            if step is not None and isinstance(loss, tf.Tensor):
                loss = step.global_ratio_value(loss)  # a hand-written ratio made global
            loss = original(self, loss)
            if step is None or step.scaled_by_user or not scales_loss(self):
                return loss
            return step.weight_loss(self, loss)

        return scale_loss

    def with_aggregator_state(original):
        @functools.wraps(original)  # check_keras reads the original through it
        def build(self, variables):
            strategy = tf.distribute.get_strategy()
            tfdist = getattr(strategy, "is_tfdist_data_parallel", False)
            if tfdist:  # before any slot exists: a sharded optimizer's slots are slices
                optimizer_sharding.begin_build(self, list(variables), strategy.extended)
            original(self, variables)
            if tfdist:
                optimizer_sharding.end_build(self)
                strategy.extended.build_aggregator_state(self, list(variables))

        return build

    for owner in ("BaseOptimizer", "LossScaleOptimizer"):
        patch_points.replace(owner, "apply", aggregating(patch_points.original(owner, "apply")))
        patch_points.replace(owner, "scale_loss",
                             share_weighted(patch_points.original(owner, "scale_loss")))
    # The aggregation hook's state is built with the optimizer's (Aggregator.build).
    patch_points.replace("BaseOptimizer", "build", with_aggregator_state(BaseOptimizer.build))

    all_reduce_sum_gradients = TFOptimizer._all_reduce_sum_gradients  # pylint: disable=protected-access

    def _all_reduce_sum_gradients(self, grads_and_vars):
        step = replica_step.current()
        if (step is not None and step.gradients_aggregated) or getattr(_as_given, "active",
                                                                        False):
            return list(grads_and_vars)
        return all_reduce_sum_gradients(self, grads_and_vars)

    patch_points.replace("TFOptimizer", "_all_reduce_sum_gradients", _all_reduce_sum_gradients)
