"""The `BackupJob` a tfdist strategy gives the `BackupState` of each `BackupAndRestore`.

`fault_tolerance.backup_state` imports nothing above it: what it needs of
the job (the ranks, a communicator, the state that is not the same on every
rank, and Keras' own backup paths) comes through this object, as Horovod's
elastic `State` gets its collectives. Each member hands the call to the
strategy's part that knows it: its optimizer-state mode (a sharded state,
whole for a save), its update mode (parameter servers' state), `rank_state`
(each rank's compression residuals) and `save_records`; the Keras callbacks'
private attributes read and written here are declared in
`tfdist.private_surface.PRIVATE_ATTRIBUTES`.
"""

import dataclasses

import keras

from tfdist.fault_tolerance.training_state import TrainingState, callback_key
from tfdist.strategies.state import rank_state, save_records

# The callbacks whose state steers training or its checkpoints, and that state.
STEERING_STATE = (
    (keras.callbacks.EarlyStopping, ("wait", "stopped_epoch", "best", "best_epoch")),
    (keras.callbacks.ReduceLROnPlateau, ("wait", "cooldown_counter", "best")),
    (keras.callbacks.ModelCheckpoint, ("best", "_batches_seen_since_last_saving",
                                       "_last_batch_seen", "_current_epoch")),
    (keras.callbacks.BackupAndRestore, ("_batches_seen_since_last_saving", "_last_batch_seen",
                                        "_current_epoch")),
)


@dataclasses.dataclass(frozen=True)
class KerasBackupFiles:
    """`BackupAndRestore`'s own paths and position, read when asked (`BackupFiles`)."""

    weights_path: str
    metadata_path: str
    previous_weights_path: str
    previous_metadata_path: str
    last_batch_seen: int


class StrategyBackupJob:
    """A tfdist strategy as `fault_tolerance.backup_state.BackupJob`."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.rank = strategy.rank
        self.world_size = strategy.world_size
        self.is_chief = strategy.is_chief
        self.communicator = strategy.extended.communicator

    # pylint: disable=protected-access
    def files(self, callback):
        return KerasBackupFiles(callback._weights_path, callback._training_metadata_path,
                                callback._prev_weights_path,
                                callback._prev_training_metadata_path, callback._last_batch_seen)

    def initial_epoch(self, model):
        return model._initial_epoch

    def set_initial_epoch(self, model, epoch):
        model._initial_epoch = epoch
    # pylint: enable=protected-access

    def steering_state(self, callbacks):
        state = {}
        for callback in callbacks:
            for kind, names in STEERING_STATE:
                if isinstance(callback, kind):
                    state[callback_key(callback, callbacks)] = TrainingState.attributes_of(
                        callback, names)
        return state

    def whole_optimizer_state(self, model):
        return self.strategy.extended.placement.consolidated(model)

    def keeping_loaded_state(self, model):
        return self.strategy.extended.placement.keeping_loaded(model)

    def share_loaded_state(self, model):
        self.strategy.extended.placement.share_loaded(model)

    def rank_local_variables(self, model):
        return self.strategy.extended.placement.rank_local_slots(model)

    def server_state(self, optimizer):
        return self.strategy.extended.updates.server_state(optimizer)

    def unrecorded_saves(self):
        return save_records.unrecorded()

    def save_rank_files(self, model, path):
        rank_state.save(model, path, self.strategy)

    def restore_rank_files(self, model, path):
        rank_state.restore(model, path, self.strategy)

    def remove_rank_files(self, path):
        rank_state.remove(path, self.strategy)
