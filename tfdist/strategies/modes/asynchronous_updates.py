"""The asynchronous parameter server's step: pull, compute, push; no rank waits for another.

`ParameterServerStrategy(mode="async")` builds its strategy with this update
mode. Every point where `SynchronousUpdates` works in step with the other
ranks is answered here (the optimizer's `apply` in a `REMOTE` step calls
`push_gradients`):

* a train step pulls the parameters from the servers, runs Keras' step on
  this worker's slice, and pushes its gradients, weighted by 1 / P, which the
  servers apply with the user's optimizer (`async_client`, `async_store`);
  logs and metric state stay this worker's own;
* evaluate and predict run every global batch on every worker (whole, not
  sliced; `epoch_data_scope`) on the servers' current parameters, alone: no
  collective a dead worker could block;
* stop flags stay each worker's own and ranks' data is not compared (both
  would be collectives between workers that are not in step);
* agreed flags (a preemption notice) ride the step's push and pull
  (`agreed_flags`): each worker acts on a notice after its next step, when
  the workers meet on server 0 before backing up;
* the model's variables follow the servers' parameters at the end of `fit`
  and before `evaluate` and `predict` (`_ServerParameters`), a backup holds
  the servers' state and a resume puts it back; saves are not recorded for
  other ranks (workers hold different weights during `fit`).

Cost per step: one pull and one push per server (n / K bytes each way for n
bytes of parameters over K servers), one gate message with SSP.
"""

import contextlib
import threading

import keras
import tensorflow as tf

from tfdist.aggregation.base import with_static_shape
from tfdist.aggregation.parameter_server.async_client import (AsyncParameterServerClient,
                                                              bytes_by_server, variable_bytes)
from tfdist.profiling.names import communication_scope
from tfdist.strategies.step import empty_slice, replica_step, step_plan
from tfdist.strategies.keras_surface import steps as keras_steps
from tfdist.strategies.keras_surface.model_strategy import agrees_across_ranks
from tfdist.strategies.inputs.local_input import LocalSliceDataset
from tfdist.strategies.inputs.batch_slicing import batch_rows


class AsynchronousUpdates:
    """Workers push gradients to parameter servers that apply them as they arrive; see the
    module docstring.

    Args:
        staleness: None (Downpour) or tau >= 0, the most steps a worker may run
            ahead of the slowest (SSP).
    """

    ranks_hold_the_same_weights = False

    def __init__(self, staleness=None):
        self.staleness = staleness
        self.client = None  # the worker's AsyncParameterServerClient (`connect`)
        self._extended = None
        self._whole_batches = threading.local()

    def connect(self, aggregator, rank, communicator):
        """As the strategy's aggregator is made: the worker's client of the servers, sharing
        the aggregator's connections to them."""
        self.client = AsyncParameterServerClient(rank, aggregator.clients, self.staleness,
                                                 communicator)

    def attach(self, extended):
        self._extended = extended

    def plan_step(self, *, one_process, is_keras_train_step, is_train_step, is_user_function):
        del is_keras_train_step
        return step_plan.plan_remote_step(one_process=one_process, is_train_step=is_train_step,
                                          is_user_function=is_user_function)

    def run_step(self, fn, args, kwargs, plan):
        return self._remote_train_step(fn, args, kwargs, plan)  # `REMOTE`: the only plan here

    def any_rank_each(self, flags, training=False):
        """Each flag as it is on this worker (workers are not in step)."""
        del training
        return [bool(flag) for flag in flags]

    def barrier(self, what):
        """The workers meet on server 0, which stops waiting for a dead one (workers share no
        collective: they are not in step)."""
        del what
        self.client.barrier()

    def check_same_data(self, num_batches, fingerprint=None, signature=None):
        """Not checked: a collective between workers not in step could wait on a dead one."""
        del num_batches, fingerprint, signature

    def epoch_data_scope(self, training):
        """Evaluate's and predict's iterators read whole global batches on every worker."""
        return contextlib.nullcontext() if training else self._whole_batches_scope()

    @contextlib.contextmanager
    def _whole_batches_scope(self):
        self._whole_batches.on = True
        try:
            yield
        finally:
            self._whole_batches.on = False

    def distribute_dataset(self, dataset, sliced):
        if getattr(self._whole_batches, "on", False):
            return LocalSliceDataset(dataset)  # every rank reads every global batch
        return sliced(dataset)

    def fit_callbacks(self, strategy):
        # One process without servers trains as Keras does: no server to follow.
        return [] if self.client is None else [_ServerParameters(self.client)]

    def server_state(self, optimizer):
        """The servers' parameters, optimizer slots and step counts, pulled into `optimizer`'s
        variables (`async_client.fetch_state`)."""
        return self.client.fetch_state(optimizer) if optimizer is not None else None

    def resume_servers_from(self, servers):
        if servers is not None:
            self.client.resume_servers_from(servers)

    def before_preemption_backup(self):
        if self._extended.communicator.world_size > 1:
            self.barrier("before the preemption backup")  # every worker's last push in

    def statistics_snapshot(self):
        return self.client.snapshot()

    def statistics(self, since):
        statistics = self.client.statistics(since=since)
        return {"ps/staleness_mean": statistics["staleness_mean"],
                "ps/staleness_max": statistics["staleness_max"],
                "ps/wait_ms": statistics["ps_wait_ms"]}

    def staleness_source(self):
        return self.client

    def _remote_train_step(self, fn, args, kwargs, plan):
        """An asynchronous worker's train step: pull, compute, push (no collective).

        Each worker weights its gradient by 1 / P (Keras' convention for P
        replicas), so P worker updates weigh one synchronous step; logs and
        metric state stay this worker's own.
        """
        extended, client = self._extended, self.client
        model = keras_steps.model_of_step(fn)
        if model.optimizer is None:
            raise ValueError("tfdist asynchronous parameter server: compile the model with an "
                             "optimizer before fit.")
        keras_steps.check_asynchronous_optimizer(model.optimizer)
        parameter_set = client.parameter_set(model.optimizer, model.trainable_variables)
        counters = extended.communication_counters
        counters.count_step()
        pull_bytes = sum(variable_bytes(v) for v in parameter_set[1])
        with tf.name_scope(communication_scope("ps_async", "pull")):
            pulls = counters.timed([], lambda: client.begin_step(*parameter_set),
                                   payload_bytes=pull_bytes, sent_bytes=0)
        with tf.control_dependencies(pulls):
            pulls = list(pulls) + [extended.agreed_flags.absorb_bits(client.pulled_flags)]
        local_rows = batch_rows(args)
        step = replica_step.ReplicaStep(
            local_rows, tf.cast(local_rows, tf.float32) * extended.communicator.world_size,
            plan=plan)
        step.remote_parameter_set = parameter_set
        with replica_step.active(step), tf.control_dependencies(pulls), \
                step.stand_in_scope(tf.logical_not(step.has_rows)):
            args = empty_slice.stand_in_for_empty_slice(args, step.has_rows)
            return extended.in_replica_context(fn, args, kwargs)

    def push_gradients(self, optimizer, gradients, variables, weighted_in_loss):
        """Inside an asynchronous train step: send the gradients to the servers.

        The servers apply them with the user's optimizer; the worker's own
        optimizer only counts the step (`iterations`, which the learning-rate
        callbacks read).
        """
        extended, client = self._extended, self.client
        step = replica_step.current()
        set_id, set_variables, servers = step.remote_parameter_set
        if not client.owns(optimizer):
            raise ValueError(
                "tfdist asynchronous parameter server: only the model's own optimizer "
                f"(model.compile) can update it; got another optimizer, {optimizer.name!r}.")
        by_variable = {id(v): g for g, v in zip(gradients, variables)}
        grads = []
        for variable in set_variables:
            gradient = by_variable.get(id(variable))
            if gradient is None:
                gradient = tf.zeros(variable.shape, variable.dtype)
            gradient = with_static_shape(tf.convert_to_tensor(gradient),  # IndexedSlices: dense
                                         variable)
            grads.append(tf.math.multiply_no_nan(
                gradient, step.gradient_weight(weighted_in_loss)(gradient.dtype)))
        counters = extended.communication_counters
        by_server = bytes_by_server(set_variables, servers, counters.num_servers)
        counters.count_server_bytes(by_server)
        with tf.name_scope(communication_scope("ps_async", "push")):
            pushed = counters.timed(grads, lambda: client.push(
                set_id, set_variables, servers, grads, optimizer.learning_rate,
                extended.agreed_flags.step_bits()),
                payload_bytes=sum(by_server), sent_bytes=sum(by_server))
        with tf.control_dependencies(pushed):
            return optimizer.iterations.assign_add(1)


@agrees_across_ranks
class _ServerParameters(keras.callbacks.Callback):
    """The model's variables follow the servers' parameters.

    At the end of `fit` the worker leaves the staleness gate, waits for every
    live worker to finish its `fit` (a barrier on server 0, which stops
    waiting for dead workers) and pulls the final parameters; `evaluate` and
    `predict` (fit's validation too) also start with a barrier and a pull, and
    a second barrier once every worker has pulled. So all workers hold, and
    evaluate (each the whole data), the same parameters, and `model.save`
    after `fit` saves every update.
    """

    def __init__(self, client):
        super().__init__()
        self._remote = client

    def _refresh(self, barrier):
        if barrier:
            self._remote.barrier()
        if self.model.optimizer is not None:
            self._remote.refresh(self.model.optimizer)
        if barrier:
            # Every worker has pulled before any goes on: a worker through the first barrier
            # sooner would otherwise push its next epoch's updates before a slower one's pull
            # (fit's validation then read different parameters on the workers).
            self._remote.barrier()

    def on_train_end(self, logs=None):
        self._remote.leave()
        self._refresh(barrier=True)

    def on_test_begin(self, logs=None):
        self._refresh(barrier=True)

    def on_predict_begin(self, logs=None):
        self._refresh(barrier=True)
