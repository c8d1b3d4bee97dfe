"""Optimizers: the global gradient reaches `apply` before anything else touches it."""

import functools
import threading
import weakref

import tensorflow as tf

from tfdist.strategies.step import replica_step
from tfdist.strategies.keras_surface.steps import scales_loss
from tfdist.strategies.step.step_plan import DEFERRED, REMOTE
from tfdist.strategies.keras_surface import keras_internals
from tfdist.strategies.keras_surface.keras_internals import BaseOptimizer, TFOptimizer
from tfdist.strategies.keras_surface import patch_points
from tfdist.strategies.keras_surface.model_strategy import is_tfdist_strategy


def _build_as_apply_does(optimizer, variables):
    """Build `optimizer` (and the aggregation hook's state) where Keras' `apply` would, in the
    step that first applies: before the gradients are aggregated, which may use that state."""
    with keras_internals.backend.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)
    optimizer.built = True


_as_given = threading.local()  # .active: an apply of gradients the script reduced itself


def _applying_as_given(original, strategy):
    """Keras' `apply` of gradients the script reduced itself (or keeps local), in this rank's
    replica context (Keras' TF optimizer needs one) with its all-reduce skipped."""
    def apply(optimizer, grads, trainable_variables):
        _as_given.active = True
        try:
            with strategy.extended.replica_context():
                return original(optimizer, grads, trainable_variables)
        finally:
            _as_given.active = False

    return apply


# optimizer -> the tfdist strategy it was built under (weak: nothing kept alive)
_built_under: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tfdist_strategy():
    """The current strategy if it is a tfdist strategy, else None."""
    strategy = tf.distribute.get_strategy()
    return strategy if is_tfdist_strategy(strategy) else None


def _made_global(step, strategy, optimizer, grads, variables, scatter_to):
    """An immediate `apply`'s gradients made global: summed over the ranks now, but for those a
    tape of this step made global already (`gradient_tape`: passed as they are)."""
    paired = len(variables) == len(grads)
    placement = strategy.extended.placement

    def made_global(variable):  # by a tape of this step, or in the backward pass
        return step.global_at_tape(variable) or placement.reduced_in_backward(variable)

    if paired and any(made_global(v) for v in variables):
        pending = [i for i, (g, v) in enumerate(zip(grads, variables))
                   if g is not None and not made_global(v)]
        if not pending:
            return grads
        summed = strategy.extended.aggregate_gradients(
            [grads[i] for i in pending], variables=[variables[i] for i in pending],
            weighted_in_loss=step.loss_was_weighted_for(optimizer))
        grads = list(grads)
        for i, gradient in zip(pending, summed):
            grads[i] = gradient
        return grads
    return strategy.extended.aggregate_gradients(
        grads, variables=variables if paired else None,
        weighted_in_loss=step.loss_was_weighted_for(optimizer), scatter_to=scatter_to)


def _refuse_created_elsewhere(optimizer, strategy):
    """A clear error for an optimizer created outside `strategy.scope()` and built under it
    (TensorFlow would say only "Mixing different tf.distribute.Strategy objects")."""
    created_under = getattr(optimizer, "_distribution_strategy", strategy)  # Keras' TF optimizer
    if created_under is strategy:
        return
    default = type(created_under).__name__ == "_DefaultDistributionStrategy"
    where = ("outside strategy.scope()" if default
             else f"under another strategy ({type(created_under).__name__})")
    raise ValueError(
        f"tfdist rank {strategy.rank}: the optimizer {optimizer.name!r} was created {where}, "
        f"and is now built for variables of {type(strategy).__name__}: an optimizer's "
        "variables belong to the strategy it was created under. Create the optimizer inside "
        "strategy.scope(), with the model:\n"
        "    with strategy.scope():\n"
        "        model = build_model()\n"
        "        model.compile(optimizer=keras.optimizers.Adam(...), loss=...)")


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
            strategy = _tfdist_strategy()
            if step is None:
                builder = _built_under.get(self)  # in any scope: a sharded state is refused
                if builder is not None:
                    builder.extended.placement.refuse_local_gradients(self)
                if strategy is None:
                    return original(self, grads, trainable_variables)
                if tf.distribute.in_cross_replica_context():
                    # `apply_gradients` of a custom loop outside `strategy.run` (TensorFlow's
                    # default strategy since `hvd.init()`): applied as given, or refused.
                    return strategy.extended.input_mode.apply_outside_run(
                        self, _applying_as_given(original, strategy), grads,
                        trainable_variables, strategy)
                return original(self, grads, trainable_variables)
            grads = list(grads)
            if trainable_variables is not None and grads and not self.built:
                _build_as_apply_does(self, list(trainable_variables))
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)  # pylint: disable=protected-access
            if step.plan.updates == REMOTE:  # asynchronous: the servers apply
                return strategy.extended.push_gradients(
                    self, grads, variables, weighted_in_loss=step.loss_was_weighted_for(self))
            scatter_to = strategy.extended.placement.scatter_target(self)
            if step.plan.updates == DEFERRED:  # summed with the step's state at its end
                paired = len(variables) == len(grads)
                placement = strategy.extended.placement
                step.defer_update(replica_step.DeferredUpdate(
                    tuple(grads),
                    tuple(variables) if paired else None,
                    step.loss_was_weighted_for(self),
                    lambda global_grads: _apply_global(self, global_grads, trainable_variables),
                    scatter_to,
                    tuple(placement.reduced_in_backward(v) for v in variables) if paired
                    else ()))
                return None
            grads = _made_global(step, strategy, self, grads, variables, scatter_to)
            with step.aggregated_gradients():
                return _apply_global(self, grads, trainable_variables)

        def _apply_global(self, grads, trainable_variables):
            """Keras' apply of the global gradients, as the optimizer-state mode applies."""
            strategy = _tfdist_strategy()
            if strategy is None:
                return original(self, grads, trainable_variables)
            return strategy.extended.placement.apply(self, original, grads,
                                                           trainable_variables)

        return apply

    def share_weighted(original):
        def scale_loss(self, loss):
            step = replica_step.current()
            if step is not None and isinstance(loss, tf.Tensor):
                loss = step.global_ratio_value(loss)  # a hand-written ratio made global
            loss = original(self, loss)
            if step is None or step.scaled_by_user or not (
                    scales_loss(self) or step.weights_every_loss):
                return loss
            return step.weight_loss(self, loss)

        return scale_loss

    def with_aggregator_state(original):
        @functools.wraps(original)  # check_keras reads the original through it
        def build(self, variables):
            strategy = _tfdist_strategy()
            if strategy is None:
                return original(self, variables)
            _refuse_created_elsewhere(self, strategy)
            _built_under[self] = strategy
            state = strategy.extended.placement
            state.begin_build(self, list(variables),  # before any slot
                              strategy.extended.placement_context())
            original(self, variables)
            state.end_build(self)
            strategy.extended.build_aggregator_state(self, list(variables))
            return None

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
