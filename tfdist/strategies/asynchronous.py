"""The asynchronous parameter server's step: pull, compute, push; no rank waits for another.

`ParameterServerStrategy(mode="async")` uses `AsynchronousExtended` as its
`strategy.extended`. Every step-level point where the data-parallel base
works in step with the other ranks is replaced here (the Keras patches still
add the async callbacks and route the optimizer's `apply` to `push_gradients`):

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
  (`agreed_flags`): each worker acts on a notice after its next step.

Cost per step: one pull and one push per server (n / K bytes each way for n
bytes of parameters over K servers), one gate message with SSP.
"""

import contextlib
import threading

import tensorflow as tf

from tfdist.aggregation.base import with_static_shape
from tfdist.aggregation.parameter_server.async_client import bytes_by_server, variable_bytes
from tfdist.profiling.names import communication_scope
from tfdist.strategies import empty_slice, replica_step
from tfdist.strategies.data_parallel import DataParallelExtended
from tfdist.strategies.keras_patches import steps as keras_steps
from tfdist.strategies.local_input import LocalSliceDataset
from tfdist.strategies.sharding import batch_rows


class AsynchronousExtended(DataParallelExtended):
    """`strategy.extended` of the asynchronous parameter server; see the module docstring.

    `remote_updates` is the worker's `AsyncParameterServerClient`, set by the
    strategy once its aggregator (whose server clients it shares) exists.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._whole_batches = threading.local()

    asynchronous = True  # fit's steps are `REMOTE`; evaluate/predict `LOCAL` (whole batches)

    def _run_planned_step(self, fn, args, kwargs, plan):
        del plan  # `REMOTE`: the only plan of a multi-worker step here
        return self._remote_train_step(fn, args, kwargs)

    def any_rank_each(self, flags, training=False):
        """Each flag as it is on this worker (workers are not in step)."""
        del training
        return [bool(flag) for flag in flags]

    def barrier(self, what):
        """The workers meet on server 0, which stops waiting for a dead one (workers share no
        collective: they are not in step)."""
        del what
        self.remote_updates.barrier()

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

    def _experimental_distribute_dataset(self, dataset, options):
        if getattr(self._whole_batches, "on", False):
            return LocalSliceDataset(dataset)  # every rank reads every global batch
        return super()._experimental_distribute_dataset(dataset, options)

    def _remote_train_step(self, fn, args, kwargs):
        """An asynchronous worker's train step: pull, compute, push (no collective).

        Each worker weights its gradient by 1 / P (Keras' convention for P
        replicas), so P worker updates weigh one synchronous step; logs and
        metric state stay this worker's own.
        """
        model = keras_steps.model_of_step(fn)
        if model.optimizer is None:
            raise ValueError("tfdist asynchronous parameter server: compile the model with an "
                             "optimizer before fit.")
        keras_steps.check_asynchronous_optimizer(model.optimizer)
        parameter_set = self.remote_updates.parameter_set(model.optimizer,
                                                          model.trainable_variables)
        counters = self.communication_counters
        counters.count_step()
        pull_bytes = sum(variable_bytes(v) for v in parameter_set[1])
        with tf.name_scope(communication_scope("ps_async", "pull")):
            pulls = counters.timed([], lambda: self.remote_updates.begin_step(*parameter_set),
                                   payload_bytes=pull_bytes, sent_bytes=0)
        with tf.control_dependencies(pulls):
            pulls = list(pulls) + [self.agreed_flags.absorb_bits(self.remote_updates.pulled_flags)]
        local_rows = batch_rows(args)
        step = replica_step.ReplicaStep(
            local_rows, tf.cast(local_rows, tf.float32) * self._cluster.world_size,
            plan=self.plan_step(fn))
        step.remote_parameter_set = parameter_set
        with replica_step.active(step), tf.control_dependencies(pulls), \
                step.stand_in_scope(tf.logical_not(step.has_rows)):
            args = empty_slice.stand_in_for_empty_slice(args, step.has_rows)
            return self._in_replica_context(fn, args, kwargs)

    def push_gradients(self, optimizer, gradients, variables, weighted_in_loss):
        """Inside an asynchronous train step: send the gradients to the servers.

        The servers apply them with the user's optimizer; the worker's own
        optimizer only counts the step (`iterations`, which the learning-rate
        callbacks read).
        """
        step = replica_step.current()
        set_id, set_variables, servers = step.remote_parameter_set
        if not self.remote_updates.owns(optimizer):
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
        counters = self.communication_counters
        by_server = bytes_by_server(set_variables, servers, counters.num_servers)
        counters.count_server_bytes(by_server)
        with tf.name_scope(communication_scope("ps_async", "push")):
            pushed = counters.timed(grads, lambda: self.remote_updates.push(
                set_id, set_variables, servers, grads, optimizer.learning_rate,
                self.agreed_flags.step_bits()),
                payload_bytes=sum(by_server), sent_bytes=sum(by_server))
        with tf.control_dependencies(pushed):
            return optimizer.iterations.assign_add(1)
