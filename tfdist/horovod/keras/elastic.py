"""`hvd.elastic` of Horovod's Keras API: `run`, `KerasState` and the state callbacks.

Under `tfdist-run --min-np A --max-np B [--host-discovery-script S]` a
Horovod elastic script runs with its import changed: the state is committed
as Horovod commits it, a change of the job's processes stops every rank at
the same commit, and tfdist-run starts the job at its new size, where
`run` restores the last commit (`tfdist.horovod.elastic_state` has the
mapping and what differs: the processes are new, so reset callbacks are not
called - the script's start runs again instead).
"""

import keras

from tfdist.horovod.elastic_state import (HorovodInternalError, HostsUpdatedInterrupt,
                                          KerasState, State, arm_if_running, run)

__all__ = ["CommitStateCallback", "HorovodInternalError", "HostsUpdatedInterrupt", "KerasState",
           "State", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class CommitStateCallback(keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at each epoch's end (Horovod's);
    a commit is where every rank stops when the job's processes change."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit
        arm_if_running()

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """`state.batch`: the last finished batch of the epoch (0 at an epoch's end), as Horovod's.
    (Horovod's also shortens the first epoch after a reset through `params["steps"]`, which
    Keras 3's loop does not read: the epoch runs its `steps_per_epoch`.)"""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """`state.epoch`: the epochs finished over every run of the job (Horovod's: `fit`'s epoch
    counts from 0 in each call, offset by the state's epoch when it began)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
