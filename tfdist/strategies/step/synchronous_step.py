"""A step of every rank together: slices weighted by share, one fused all-reduce, state global.

The step of `SynchronousUpdates` (every synchronous strategy with several
processes). In a `DEFERRED` plan (Keras' own `train_step`, which reads no
variable after its update) the optimizer update waits for the end of the
step, so gradients, the global row count, metric state, the communication
counters' exchange and the agreed flags travel in one collective
(`step_sum.StepSum`); an `IMMEDIATE` step's gradients are summed where it
applies them (`global_gradients`). Each step's losses are means over its
slice, weighted by its share of the global batch (`replica_step`), so the
update equals one process's on the whole batch for any split, empty slices
included (`empty_slice`).
"""

import contextlib

import tensorflow as tf

from tfdist.strategies.step import empty_slice, replica_step
from tfdist.strategies.step.batch_dependence import BatchLineage
from tfdist.strategies.keras_surface import model_strategy
from tfdist.strategies.keras_surface import steps as keras_steps
from tfdist.strategies.inputs.batch_slicing import batch_rows, leading_rows


# Called as a user's function (a custom loop's step) begins: what the Keras adapter above
# registers (`keras_patches.install`), so this layer imports nothing of it.
FIRST_USER_FUNCTION_HOOKS = []


def run(extended, fn, args, kwargs, plan):
    """`fn` (a step of `plan`) on this rank's slice, ending in the step's all-reduce."""
    model = keras_steps.model_of_step(fn)
    step = _begin(extended, args, model, plan)
    if model is not None:
        step.keras_step = (model, "train" if keras_steps.is_train_step(fn) else "test")

    def step_then_sum(*step_args, **step_kwargs):
        outputs = fn(*step_args, **step_kwargs)
        return _end(extended, fn, model, outputs, step)

    local_state = extended.local_state
    with replica_step.active(step), contextlib.ExitStack() as scopes:
        if not step.scaled_by_user:
            args = empty_slice.stand_in_for_empty_slice(args, step.has_rows)
            scopes.enter_context(step.stand_in_scope(tf.logical_not(step.has_rows)))
        step.lineage = BatchLineage((args, kwargs))
        scopes.enter_context(step.lineage.recording())  # eager: lineage followed as it runs
        local_state.begin_step()
        try:
            return extended.in_replica_context(step_then_sum, args, kwargs)
        finally:
            local_state.end_step()  # stop recording, also when tracing failed


def _begin(extended, args, model, plan):
    """This step's `ReplicaStep`: its rows; the global batch's when they are needed.

    In Keras' own step, when the global batch's rows B are known alike on
    every rank before it (`InputMode.expected_step_rows`: `fit`'s batch size),
    the aggregator does not compress and the optimizer does not scale its loss
    (float16's backward pass must carry one process's magnitudes, from the
    exact share), the loss is weighted provisionally
    by n_r / B and the sums corrected once the step's fused all-reduce gave n
    (`row_accounting`): no collective before the backward pass, no pass over
    the gradients. Otherwise the global row count comes with the step's fused
    all-reduce (`step_sum`), except when the model's optimizer scales its loss
    (float16 loss scaling), or when the aggregator's small all-reduce is
    cheap (`Aggregator.learns_rows_first`: the MPI engine) in Keras' own
    step (`StepPlan.weights_losses_for_rows_first`): the share then weights
    the loss before the backward pass, and the rows are all-reduced first. A user's function (`plan.scaled_by_user`) may take no batch at all:
    it then counts one row.
    """
    if plan.scaled_by_user:
        for hook in FIRST_USER_FUNCTION_HOOKS:  # the adapter's (keras_patches.empty_slices)
            hook()  # a custom loop: its model may be called on an empty slice
        local_rows = leading_rows(args)
        if local_rows is None:
            local_rows = tf.constant(1, tf.int32)
    else:
        local_rows = batch_rows(args)

    # Through the aggregator: the step's only transport is the strategy's own algorithm.
    aggregator = extended.aggregator
    scaled = model is not None and keras_steps.scales_loss(model.optimizer)
    expected = None
    if plan.weights_losses_for_rows_first and not (aggregator.weights_gradients_first
                                                   or scaled):
        with tf.init_scope():  # the data's batch size as fit recorded it, read eagerly
            expected = extended.input_mode.expected_step_rows(
                model_strategy.latest_data_batch_size())
    rows_first = expected is None and (aggregator.learns_rows_first
                                       and plan.weights_losses_for_rows_first)
    step = replica_step.ReplicaStep(local_rows, sum_over_ranks=extended.all_reduce_sum,
                                    plan=plan, weights_every_loss=rows_first or bool(expected),
                                    expected_rows=expected)
    if expected is None and (rows_first or scaled):
        step.learn_global_rows(step.global_rows)
    return step


def _end(extended, fn, model, outputs, step):
    """Sum what the step must share in one all-reduce, then update and return global logs.

    In the step's replica context: the deferred optimizer updates run
    here, where Keras' own step would have run them.
    """
    local_state, gradients = extended.local_state, extended.gradients
    assigned = local_state.end_step()
    total = gradients.step_sum(step)
    updates = step.take_deferred_updates()
    finish_gradients = [gradients.add_to(total, u.gradients, u.variables,
                                         u.weighted_in_loss, u.scatter_to, u.global_already)
                        for u in updates]
    state_slots = local_state.contribute(assigned, step, total)
    raw_keys = (keras_steps.raw_log_keys(model, outputs)
                if model is not None and isinstance(outputs, dict) else [])
    raw_slots = [total.add_share_weighted(outputs[key]) for key in raw_keys]
    counters = extended.communication_counters
    training = keras_steps.is_train_step(fn)
    # A train step carries the counters' exchange (zeros unless counted: same shape on every
    # rank, whichever ranks measure) and the flags ranks raise between steps (a preemption
    # notice), agreed here.
    exchange_slot = total.add_sum(counters.exchange_vector()) if training else None
    flags_slot = total.add_sum(extended.agreed_flags.step_vector()) if training else None
    total.run(extended.aggregator.all_reduce)
    if exchange_slot is not None:
        counters.absorb_exchange(total.result(exchange_slot))
    flag_updates = ([extended.agreed_flags.absorb(total.result(flags_slot))]
                    if flags_slot is not None else [])
    applied = []
    for update, finish in zip(updates, finish_gradients):
        with step.aggregated_gradients():
            applied.append(update.apply(finish()))
    state_updates = local_state.assign(assigned, state_slots, total)
    dependencies = state_updates + flag_updates + [op for op in tf.nest.flatten(applied)
                                                   if isinstance(op, (tf.Tensor, tf.Operation))]
    with tf.control_dependencies(dependencies):
        return _global_outputs(
            extended, fn, model, outputs, step,
            {key: total.result(slot) for key, slot in zip(raw_keys, raw_slots)})


def _global_outputs(extended, fn, model, outputs, step, summed_raw_logs):
    """A Keras step's outputs made global: metric logs re-read, predictions as the input mode
    returns them."""
    if keras_steps.is_predict_step(fn):
        return extended.input_mode.local_predictions(outputs, step.local_rows,
                                                     extended.communicator)
    if model is not None and isinstance(outputs, dict):
        return keras_steps.global_step_logs(model, outputs, summed_raw_logs)
    return tf.nest.map_structure(
        lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, outputs
    )
