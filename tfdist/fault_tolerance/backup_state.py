"""One object that gathers, saves, restores and shares everything a backup holds.

`BackupState(callback, strategy)` is, for one `keras.callbacks.BackupAndRestore`
under a tfdist strategy, what Horovod's `TensorFlowKerasState` is for an
elastic job (`save` / `restore` / `sync`), on files instead of memory so that
it survives the process:

* **save** (at the callback's save points and at the step every rank agreed
  to stop at, `keras_patches.backup`): the chief gathers the model's and the
  optimizer's variables (with the asynchronous parameter server, first the
  servers' parameters, optimizer slots and step counts:
  `async_client.fetch_state`), the `training_state.TrainingState` of the
  moment (position, seed and metric state, the steering callbacks' state) and
  `EarlyStopping`'s best weights when they changed, and writes them: the best
  weights first, then the weights file and the metadata, each atomically
  (`checkpoint_files`). Every other rank writes only its own compression
  residuals beside it (`rank_state`);
* **restore** (the callback's `on_train_begin`): the chief reads - Keras'
  own load, which sets the weights and the epoch, then the metadata's
  training state; an unreadable backup is named;
* **sync**: the chief's restored state on every rank: one broadcast of
  (restored, epoch), two for the training state, one per variable for the
  weights and optimizer; each rank then reads its own residuals;
* **apply** (after every callback's `on_train_begin`, which resets them): the
  steering callbacks' attributes, and `EarlyStopping`'s best weights (the
  chief reads the file tagged with the backup's `best_epoch`, one broadcast
  per array);
* **remove** (end of fit): each rank its own residual file, after which the
  chief's `BackupAndRestore` deletes the directory.

The world size that wrote a backup does not matter: everything but the
residuals is the same on every rank, and residuals that do not match start
from zero with a warning (`rank_state`).

Cost: a backup writes the weights file, a metadata file of a few kB, the
best weights only when they improve and, per non-chief rank, its residuals;
with the asynchronous parameter server one state pull per server. A resume
costs the broadcasts above.
"""

import io
import json
import os
import weakref
from typing import Any, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.fault_tolerance import elastic_channel
from tfdist.fault_tolerance.restarts import restart_count
from tfdist.strategies import rank_state, save_records, sharded_optimizer_state
from tfdist.fault_tolerance.checkpoint_files import save_backup, write_atomically
from tfdist.fault_tolerance.training_state import TrainingState, callback_key

# The callbacks whose state steers training or its checkpoints, and that state.
STEERING_STATE = (
    (keras.callbacks.EarlyStopping, ("wait", "stopped_epoch", "best", "best_epoch")),
    (keras.callbacks.ReduceLROnPlateau, ("wait", "cooldown_counter", "best")),
    (keras.callbacks.ModelCheckpoint, ("best", "_batches_seen_since_last_saving",
                                       "_last_batch_seen", "_current_epoch")),
    (keras.callbacks.BackupAndRestore, ("_batches_seen_since_last_saving", "_last_batch_seen",
                                        "_current_epoch")),
)


def steering_state(callbacks) -> Dict[str, Dict[str, Any]]:
    state = {}
    for callback in callbacks:
        for kind, names in STEERING_STATE:
            if isinstance(callback, kind):
                state[callback_key(callback, callbacks)] = TrainingState.attributes_of(
                    callback, names)
    return state


def keeps_rank_state(strategy) -> bool:
    """Whether the strategy's compressor keeps state of each rank's own (residuals)."""
    compressor = getattr(strategy.extended.aggregator, "compressor", None)
    return getattr(compressor, "keeps_rank_state", False)


class BackupState:
    """The state behind one `BackupAndRestore` callback; see the module docstring.

    Args:
        callback: the user's `keras.callbacks.BackupAndRestore`.
        strategy: the model's tfdist strategy.
    """

    def __init__(self, callback, strategy):
        self.callback = callback
        self.strategy = strategy
        self.callbacks: List[Any] = [callback]  # the fit's callback list (`prepare`)
        # EarlyStopping callback -> the best weights last written beside the backup
        self._best_written: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    @property
    def model(self):
        return self.callback.model

    # ------------------------------------------------------------------ save
    def save(self, epoch: int, steps_done: int) -> None:
        """Write the backup of the moment: `steps_done` steps of `epoch` trained."""
        # pylint: disable=protected-access
        with sharded_optimizer_state.consolidated(self.model):  # every rank: a sharded state
            self._save(epoch, steps_done)

    def _save(self, epoch: int, steps_done: int) -> None:
        # pylint: disable=protected-access
        callback = self.callback
        if not self.strategy.is_chief:
            rank_state.save(self.model, callback._weights_path, self.strategy)
            return
        remote = self.strategy.extended.remote_updates
        servers = (remote.fetch_state(self.model.optimizer)  # into the weights file's variables
                   if remote is not None and self.model.optimizer is not None else None)
        state = TrainingState.capture(self.model, epoch, steps_done, self.strategy.world_size,
                                      steering_state(self.callbacks), servers)
        self._save_best_weights()
        previous = ((callback._prev_weights_path, callback._prev_training_metadata_path)
                    if callback.double_checkpoint else None)
        with save_records.unrecorded():  # written and read by the chief only
            save_backup(self.model, (callback._weights_path, callback._training_metadata_path),
                        previous, {"epoch": epoch, "batch": callback._last_batch_seen,
                                   "tfdist": state.to_json()})
        elastic_channel.record_backup(dict(state.position))  # an elastic launcher's resize line

    def remove(self) -> None:
        """End of fit, every rank: its own residual file (the chief's callback deletes the
        directory)."""
        rank_state.remove(self.callback._weights_path, self.strategy)  # pylint: disable=protected-access

    # --------------------------------------------------------------- restore
    def restore(self, keras_restore, logs=None) -> Optional[TrainingState]:
        """Read the backup on the chief (`keras_restore`: the callback's own `on_train_begin`),
        then `sync` it to every rank; the training state to resume from (None: nothing to
        resume, or a backup plain Keras wrote)."""
        # pylint: disable=protected-access
        restored, state = False, None
        if self._backup_exists():
            _build_optimizer(self.model)  # its state is in the backup (built on every rank)
        if self.strategy.is_chief:
            restored = tf.io.gfile.exists(self.callback._weights_path)
            with sharded_optimizer_state.keeping_loaded(self.model):  # shared by `sync`
                keras_restore(logs)  # Keras' own: the weights, the epoch into model._initial_epoch
            state = self._read_training_state() if restored else None
            if not restored and restart_count():
                print(f"tfdist: restart {restart_count()}: no backup in "
                      f"{self.callback.backup_dir}: training starts from the beginning",
                      flush=True)
        if self.strategy.world_size > 1:
            restored, state = self.sync(restored, state)
        return state if restored else None

    def _backup_exists(self) -> bool:
        """Whether the chief sees a backup to restore (told to every rank)."""
        exists = (self.strategy.is_chief
                  and tf.io.gfile.exists(self.callback._weights_path))  # pylint: disable=protected-access
        if self.strategy.world_size == 1:
            return exists
        communicator = self.strategy.extended.communicator
        return bool(communicator.broadcast(tf.constant([int(exists)], tf.int64)).numpy()[0])

    def sync(self, restored: bool, state: Optional[TrainingState]):
        """The chief's (restored, state), weights and optimizer on every rank; each rank's own
        residuals."""
        model, communicator = self.model, self.strategy.extended.communicator
        restored, epoch = communicator.broadcast(tf.constant(
            [int(restored), model._initial_epoch or 0], tf.int64)).numpy()  # pylint: disable=protected-access
        if not restored:
            return False, None
        model._initial_epoch = int(epoch) or None  # pylint: disable=protected-access
        state = TrainingState.share(communicator, state)
        _build_optimizer(model)
        sliced = {id(v) for v in sharded_optimizer_state.sharded_slots(model)}
        variables = list(model.weights) + list(model.optimizer.variables
                                                if model.optimizer else [])
        for variable in variables:
            if id(variable) not in sliced:
                variable.assign(communicator.broadcast(variable.value))
        sharded_optimizer_state.share_loaded_state(model)  # each rank its slices of the chief's
        rank_state.restore(model, self.callback._weights_path, self.strategy)  # pylint: disable=protected-access
        return True, state

    def _read_training_state(self) -> Optional[TrainingState]:
        path = self.callback._training_metadata_path  # pylint: disable=protected-access
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path, "r") as f:
            return TrainingState.from_json(json.loads(f.read()).get("tfdist"))

    def load(self, keras_load):
        """The chief's read of the backup (`keras_load`: Keras' `_load_model`): an unreadable
        backup is named; Keras then falls back to the previous one (`double_checkpoint=True`),
        or fails with what to do."""
        # pylint: disable=protected-access
        callback = self.callback
        try:
            return keras_load()
        except OSError as error:
            if tf.io.gfile.exists(callback._prev_weights_path):
                print(f"tfdist: the backup in {callback.backup_dir} cannot be read ({error}): "
                      "resuming from the previous one", flush=True)
                raise
            raise OSError(f"tfdist: the backup in {callback.backup_dir} cannot be read "
                          f"({error}), and there is no previous one to resume from "
                          "(BackupAndRestore(double_checkpoint=True) keeps one)") from error

    # ------------------------------------------------------------------ apply
    def apply(self, state: TrainingState, callbacks) -> None:
        """After every `on_train_begin` of a resumed fit (every rank): the callbacks' state."""
        state.apply_callbacks(callbacks)
        for callback in _keeping_best_weights(callbacks):
            key = callback_key(callback, callbacks)
            recorded = state.callbacks.get(key)
            if recorded is None or "best_epoch" not in recorded:
                continue
            weights = (_read_best_weights(self._best_weights_path(key), recorded["best_epoch"])
                       if self.strategy.is_chief else None)
            if self.strategy.world_size > 1:
                weights = self._shared(weights)
            if weights is None:
                if self.strategy.is_chief:
                    logging.warning("tfdist: EarlyStopping(restore_best_weights=True) resumed "
                                    "without its best weights (no file of epoch %d beside the "
                                    "backup): it restores the best weights seen since the "
                                    "resume.", recorded["best_epoch"] + 1)
                continue
            callback.best_weights = weights

    # ------------------------------------------------------ EarlyStopping's best weights
    def _best_weights_path(self, key: str) -> str:
        return os.path.join(self.callback.backup_dir,
                            f"tfdist-best-weights-{key.split('#')[1]}.npz")

    def _save_best_weights(self) -> None:
        """Each such callback's best weights, tagged with its `best_epoch`, if new since the
        last backup (they change only when the monitored value improves)."""
        # pylint: disable=protected-access
        for callback in _keeping_best_weights(self.callbacks):
            weights = callback.best_weights
            if weights is None or weights is self._best_written.get(callback):
                continue
            buffer = io.BytesIO()
            np.savez(buffer, *weights, best_epoch=np.asarray(callback.best_epoch))

            def write(path, data=buffer.getvalue()):
                with tf.io.gfile.GFile(path, "wb") as f:
                    f.write(data)

            if not tf.io.gfile.exists(self.callback.backup_dir):
                tf.io.gfile.makedirs(self.callback.backup_dir)
            write_atomically(write, self._best_weights_path(callback_key(callback,
                                                                         self.callbacks)))
            self._best_written[callback] = weights

    def _shared(self, weights):
        """The chief's `weights` (or None) on every rank."""
        communicator = self.strategy.extended.communicator
        found = int(communicator.broadcast(tf.constant([int(weights is not None)], tf.int64))
                    .numpy()[0])
        if not found:
            return None
        mine = weights if weights is not None else [np.zeros(w.shape, w.dtype)
                                                   for w in self.model.get_weights()]
        return [communicator.broadcast(tf.constant(array)).numpy() for array in mine]


def _keeping_best_weights(callbacks):
    """The `EarlyStopping` callbacks of the list that restore their best weights."""
    return [c for c in callbacks
            if isinstance(c, keras.callbacks.EarlyStopping) and c.restore_best_weights]


def _read_best_weights(path, best_epoch):
    """The weights in `path` if it exists and is tagged `best_epoch` (a file written after
    the backup, by a process killed before the next one, is not), else None."""
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        arrays = np.load(io.BytesIO(f.read()))
        if int(arrays["best_epoch"]) != int(best_epoch):
            return None
        names = sorted((n for n in arrays.files if n.startswith("arr_")),
                       key=lambda n: int(n.split("_")[1]))
        return [arrays[name] for name in names]


def _build_optimizer(model) -> None:
    """Build the model's optimizer before its state is restored (one process builds it when
    its first step is traced: `keras_patches.data`)."""
    if model.optimizer is not None and not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
