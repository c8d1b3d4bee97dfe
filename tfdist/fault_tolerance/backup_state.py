"""One object that gathers, saves, restores and shares everything a backup holds.

`BackupState(callback, job)` is, for one `keras.callbacks.BackupAndRestore`
under a tfdist strategy, what Horovod's `TensorFlowKerasState` is for an
elastic job (`save` / `restore` / `sync`), on files instead of memory so that
it survives the process. As Horovod's `State` takes its collectives injected,
it takes what it needs of the job as a `BackupJob` (the ranks, a
communicator, the job's state that differs by rank), which the strategy's
layer gives it (`keras_patches.backup`): it imports nothing above it.

* **save** (at the callback's save points and at the step every rank agreed
  to stop at, `keras_patches.backup`): the chief gathers the model's and the
  optimizer's variables (with parameter servers that hold state, first their
  parameters, optimizer slots and step counts: `BackupJob.server_state`;
  a sharded optimizer state whole: `BackupJob.whole_optimizer_state`), the `training_state.TrainingState` of the
  moment (position, seed and metric state, the steering callbacks' state) and
  `EarlyStopping`'s best weights when they changed, and writes them: the best
  weights first, then the weights file and the metadata, each atomically
  (`checkpoint_files`). Every other rank writes only its own compression
  residuals beside it (`BackupJob.save_rank_files`);
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
from zero with a warning (`BackupJob.restore_rank_files`).

Cost: a backup writes the weights file, a metadata file of a few kB, the
best weights only when they improve and, per non-chief rank, its residuals;
with parameter servers that hold the state, one state pull per server. A resume
costs the broadcasts above.
"""

import contextlib
import io
import json
import os
import weakref
from typing import Any, Dict, List, Optional, Protocol, Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.fault_tolerance import elastic_channel
from tfdist.fault_tolerance.restarts import restart_count
from tfdist.fault_tolerance.checkpoint_files import save_backup, write_atomically
from tfdist.fault_tolerance.training_state import TrainingState, callback_key


class BackupFiles(Protocol):
    """Where one `BackupAndRestore` keeps its backup (Keras' own paths), read as needed."""

    weights_path: str
    metadata_path: str
    previous_weights_path: str
    previous_metadata_path: str
    last_batch_seen: int


class BackupJob(Protocol):
    """What a backup needs of the job it belongs to, given by the strategy's layer (as
    Horovod's elastic `State` is given its collectives): the ranks, a communicator, and the
    job's ways with state that is not the same on every rank."""

    rank: int
    world_size: int
    is_chief: bool
    communicator: Any
    """`tfdist.comm.base.Communicator`: broadcasts of the chief's restored state."""

    def files(self, callback: Any) -> BackupFiles:
        """The backup's paths and Keras' position of `callback`."""

    def initial_epoch(self, model: Any) -> Optional[int]:
        """The epoch Keras' restore set `model` to start from (None: the first)."""

    def set_initial_epoch(self, model: Any, epoch: Optional[int]) -> None:
        """Start `model`'s fit at `epoch` (None: the first)."""

    def steering_state(self, callbacks: Sequence) -> Dict[str, Dict[str, Any]]:
        """The state of the callbacks that steer training (EarlyStopping, ...), by key."""

    def whole_optimizer_state(self, model: Any) -> contextlib.AbstractContextManager:
        """Inside: `model`'s whole optimizer state is on this rank (every rank enters)."""

    def keeping_loaded_state(self, model: Any) -> contextlib.AbstractContextManager:
        """Inside: a load on the chief keeps the whole optimizer state it read."""

    def share_loaded_state(self, model: Any) -> None:
        """After the chief alone loaded: every rank takes its part of the optimizer state."""

    def rank_local_variables(self, model: Any) -> list:
        """Variables of `model` (or its optimizer) that hold this rank's part only."""

    def server_state(self, optimizer: Any) -> Optional[dict]:
        """Parameter servers' state for the backup (None: none)."""

    def unrecorded_saves(self) -> contextlib.AbstractContextManager:
        """Inside: saves are not recorded for other ranks to wait for."""

    def save_rank_files(self, model: Any, path: str) -> None:
        """A non-chief rank's own state, beside the chief's file at `path`."""

    def restore_rank_files(self, model: Any, path: str) -> None:
        """This rank's own state, from beside `path`."""

    def remove_rank_files(self, path: str) -> None:
        """This rank's own files beside `path`, removed."""


class BackupState:
    """The state behind one `BackupAndRestore` callback; see the module docstring.

    Args:
        callback: the user's `keras.callbacks.BackupAndRestore`.
        job: the `BackupJob` of the model's strategy.
    """

    def __init__(self, callback, job: BackupJob):
        self.callback = callback
        self.job = job
        self.callbacks: List[Any] = [callback]  # the fit's callback list (`prepare`)
        # EarlyStopping callback -> the best weights last written beside the backup
        self._best_written: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    @property
    def model(self):
        return self.callback.model

    # ------------------------------------------------------------------ save
    def save(self, epoch: int, steps_done: int) -> None:
        """Write the backup of the moment: `steps_done` steps of `epoch` trained."""
        with self.job.whole_optimizer_state(self.model):  # every rank: a sharded state
            self._save(epoch, steps_done)

    def _save(self, epoch: int, steps_done: int) -> None:
        files = self.job.files(self.callback)
        if not self.job.is_chief:
            self.job.save_rank_files(self.model, files.weights_path)
            return
        # With parameter servers, their state, pulled into the weights file's variables.
        servers = self.job.server_state(self.model.optimizer)
        state = TrainingState.capture(self.model, epoch, steps_done, self.job.world_size,
                                      self.job.steering_state(self.callbacks), servers)
        self._save_best_weights()
        previous = ((files.previous_weights_path, files.previous_metadata_path)
                    if self.callback.double_checkpoint else None)
        with self.job.unrecorded_saves():  # written and read by the chief only
            save_backup(self.model, (files.weights_path, files.metadata_path),
                        previous, {"epoch": epoch, "batch": files.last_batch_seen,
                                   "tfdist": state.to_json()})
        elastic_channel.record_backup(dict(state.position))  # an elastic launcher's resize line

    def remove(self) -> None:
        """End of fit, every rank: its own residual file (the chief's callback deletes the
        directory)."""
        self.job.remove_rank_files(self.job.files(self.callback).weights_path)

    # --------------------------------------------------------------- restore
    def restore(self, keras_restore, logs=None) -> Optional[TrainingState]:
        """Read the backup on the chief (`keras_restore`: the callback's own `on_train_begin`),
        then `sync` it to every rank; the training state to resume from (None: nothing to
        resume, or a backup plain Keras wrote)."""
        restored, state = False, None
        if self._backup_exists():
            _build_optimizer(self.model)  # its state is in the backup (built on every rank)
        if self.job.is_chief:
            restored = tf.io.gfile.exists(self.job.files(self.callback).weights_path)
            with self.job.keeping_loaded_state(self.model):  # shared by `sync`
                keras_restore(logs)  # Keras' own: the weights, and the epoch to start from
            state = self._read_training_state() if restored else None
            if not restored and restart_count():
                print(f"tfdist: restart {restart_count()}: no backup in "
                      f"{self.callback.backup_dir}: training starts from the beginning",
                      flush=True)
        if self.job.world_size > 1:
            restored, state = self.sync(restored, state)
        return state if restored else None

    def _backup_exists(self) -> bool:
        """Whether the chief sees a backup to restore (told to every rank)."""
        exists = (self.job.is_chief
                  and tf.io.gfile.exists(self.job.files(self.callback).weights_path))
        if self.job.world_size == 1:
            return exists
        communicator = self.job.communicator
        return bool(communicator.broadcast(tf.constant([int(exists)], tf.int64)).numpy()[0])

    def sync(self, restored: bool, state: Optional[TrainingState]):
        """The chief's (restored, state), weights and optimizer on every rank; each rank's own
        residuals."""
        model, communicator = self.model, self.job.communicator
        restored, epoch = communicator.broadcast(tf.constant(
            [int(restored), self.job.initial_epoch(model) or 0], tf.int64)).numpy()
        if not restored:
            return False, None
        self.job.set_initial_epoch(model, int(epoch) or None)
        state = TrainingState.share(communicator, state)
        _build_optimizer(model)
        sliced = {id(v) for v in self.job.rank_local_variables(model)}
        variables = list(model.weights) + list(model.optimizer.variables
                                                if model.optimizer else [])
        for variable in variables:
            if id(variable) not in sliced:
                variable.assign(communicator.broadcast(variable.value))
        self.job.share_loaded_state(model)  # each rank its slices of the chief's
        self.job.restore_rank_files(model, self.job.files(self.callback).weights_path)
        return True, state

    def _read_training_state(self) -> Optional[TrainingState]:
        path = self.job.files(self.callback).metadata_path
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path, "r") as f:
            return TrainingState.from_json(json.loads(f.read()).get("tfdist"))

    def load(self, keras_load):
        """The chief's read of the backup (`keras_load`: Keras' `_load_model`): an unreadable
        backup is named; Keras then falls back to the previous one (`double_checkpoint=True`),
        or fails with what to do."""
        callback = self.callback
        try:
            return keras_load()
        except OSError as error:
            if tf.io.gfile.exists(self.job.files(callback).previous_weights_path):
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
                       if self.job.is_chief else None)
            if self.job.world_size > 1:
                weights = self._shared(weights)
            if weights is None:
                if self.job.is_chief:
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
        communicator = self.job.communicator
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
