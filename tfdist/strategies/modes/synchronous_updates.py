"""The default update mode: every rank takes part in every step, which sums its gradients.

Each training step ends in one fused all-reduce of the gradients and the
step's state (`synchronous_step`), after which every rank applies the same
update: ranks are in step, so stop flags are agreed by a tiny all-reduce,
barriers are the communicator's, ranks' data is compared once per epoch
iterator (`same_data_check`), and every rank's weights are compared at each
epoch end and at the end of `fit` (`_ReplicaConsistency`). The chief saves
for everyone.

Guarantee: every rank ends every step with the weights one process computes
on the global batch, or the job stops with `ReplicasDiverged`. Cost per
step: the strategy's all-reduce of the gradients (its aggregator's cost
model); per epoch, a fingerprint in the next step's all-reduce.
"""

import contextlib
import time

import keras
import tensorflow as tf

from tfdist.strategies.state import replica_consistency

from tfdist.strategies.step import step_plan, synchronous_step
from tfdist.strategies.keras_surface.model_strategy import agrees_across_ranks
from tfdist.strategies.inputs.same_data_check import check_same_data


class SynchronousUpdates:
    """Every rank in every step; see the module docstring."""

    ranks_hold_the_same_weights = True

    def __init__(self):
        self._extended = None
        self._any_rank_functions = {}  # number of flags -> compiled exchange

    def attach(self, extended):
        self._extended = extended

    def plan_step(self, *, one_process, is_keras_train_step, is_train_step, is_user_function):
        return step_plan.plan_step(one_process=one_process,
                                   is_keras_train_step=is_keras_train_step,
                                   is_train_step=is_train_step,
                                   is_user_function=is_user_function)

    def run_step(self, fn, args, kwargs, plan):
        return synchronous_step.run(self._extended, fn, args, kwargs, plan)

    def push_gradients(self, optimizer, gradients, variables, weighted_in_loss):
        del optimizer, gradients, variables, weighted_in_loss
        raise NotImplementedError(
            "the step sums gradients over the ranks; only the asynchronous parameter server "
            "pushes them to servers")

    def any_rank_each(self, flags, training=False):
        """Each flag true on every rank if true on any rank, in one tiny all-reduce (eager)."""
        extended = self._extended
        flags = list(flags)
        if len(flags) not in self._any_rank_functions:
            # Compiled once per length (a function's traces share their collective keys, which
            # TensorFlow ties to one shape): an eager collective would carry an op timeout, for
            # which TensorFlow parks two threads per call; the call is bounded by the watchdog.
            self._any_rank_functions[len(flags)] = tf.function(
                lambda value: extended.all_reduce_sum([value])[0])
        start = time.perf_counter()
        with extended.communicator.expect_progress("stop-flag exchange"):
            total = self._any_rank_functions[len(flags)](
                tf.constant([1.0 if flag else 0.0 for flag in flags]))
            stops = [bool(value > 0) for value in total.numpy()]
        if training:
            extended.communication_counters.add_host_seconds(time.perf_counter() - start)
        return stops

    def barrier(self, what):
        """Every rank waits for the others, bounded by the job timeout (a late rank is named,
        with `what` it was waited for)."""
        with self._extended.communicator.expect_progress(f"the barrier {what}"):
            self._extended.communicator.barrier()

    def check_same_data(self, num_batches, fingerprint=None, signature=None):
        extended = self._extended
        check_same_data(extended.communicator, extended.input_mode, extended.placement,
                        num_batches, fingerprint, signature)

    def epoch_data_scope(self, training):
        del training
        return contextlib.nullcontext()

    def distribute_dataset(self, dataset, sliced):
        return sliced(dataset)

    def fit_callbacks(self, strategy):
        return [_ReplicaConsistency(strategy)] if strategy.world_size > 1 else []

    def server_state(self, optimizer):
        del optimizer
        return None  # the weights file holds everything

    def resume_servers_from(self, servers):
        del servers

    def before_preemption_backup(self):
        pass  # the agreed step was every rank's last: nothing is in flight

    def statistics_snapshot(self):
        return None

    def statistics(self, since):
        del since
        return {}

    def staleness_source(self):
        return None


@agrees_across_ranks
class _ReplicaConsistency(keras.callbacks.Callback):
    """Every rank's weights compared at each epoch end and at the end of `fit`, which ends with
    the comparison's all-gather, a barrier: `fit` returns once the chief has written.

    The comparison (`replica_consistency`): at an epoch end each rank's
    fingerprint rides the next training step's all-reduce and is verified
    after it; at the end of `fit`, per-variable fingerprints are gathered.
    A difference stops every rank with `ReplicasDiverged`, naming the
    variables.

    The barrier: only the chief writes checkpoints (`ModelCheckpoint`,
    `BackupAndRestore`, `Model.save` in a callback). During training the
    next step's collective orders a rank after the chief's writes of the
    epoch before; after the last epoch nothing would, and a rank that reads
    the chief's file right after `fit` (`keras.models.load_model(best_path)`)
    could read the previous one. Runs after every other callback's hooks
    but the input mode's.

    Cost: one small all-gather per `fit`; per epoch, hashing the weights and
    2 P floats in the next step's all-reduce (`replica_consistency`).
    """

    def __init__(self, strategy):
        super().__init__()
        self._strategy = strategy
        self._epoch_end = replica_consistency.EpochEndCheck(
            strategy.extended.agreed_flags, strategy.extended.communicator)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_end.post(replica_consistency.compared_variables(self.model),
                             f"at the end of epoch {epoch + 1}")

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch_end.posted:  # the step after an epoch's end carried the fingerprints
            self._epoch_end.verify(replica_consistency.compared_variables(self.model))

    def on_train_end(self, logs=None):
        communicator = self._strategy.extended.communicator
        with communicator.expect_progress("the check of every rank's weights at the end of fit"):
            replica_consistency.check_now(
                communicator, replica_consistency.compared_variables(self.model),
                "at the end of fit")
