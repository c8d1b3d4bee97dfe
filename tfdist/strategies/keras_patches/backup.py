"""`keras.callbacks.BackupAndRestore` under a tfdist strategy: exact resume at the next batch.

The user's unchanged `BackupAndRestore(dir, save_freq=N | "epoch")` gets a
`backup_state.BackupState`, the one object that gathers, writes, reads and
shares what a backup holds; this module wires it into Keras' loop:

* **writes** at the callback's own save points (`_save_model`), and at the
  step every rank agreed on after a preemption notice (`preemption`): the
  chief the weights, metadata and training state, other ranks their own
  residuals;
* **restores** in the callback's `on_train_begin` (the chief reads, every
  rank receives), and applies the callbacks' state after every callback's
  `on_train_begin` (which resets them);
* **resumes at the next batch**: the fit loop starts at the backup's epoch,
  and its epoch iterator replays the data consumption of the interrupted
  run up to the backup (`_replay_to`) so the first batch trained is the one
  the uninterrupted run trained next, whatever the input: the finished
  epochs' iterators are created and their data-adapter hooks called, as the
  run did (a reshuffling `tf.data` pipeline draws its order from its
  iterator count; `PyDataset.on_epoch_end` reshuffles), without reading
  their batches unless the input carries over epochs (`steps_per_epoch`, an
  unknown length) or is made in Python (a generator, a `PyDataset`: its
  order may come from Python's state as it is read); the resumed epoch's
  trained batches are read and dropped. The seed and metric state and the callbacks' state are
  then those of the backup's moment: the resumed run's weights and
  post-resume history are the uninterrupted run's.

Cost of a resume: one broadcast per variable and two for the training
state (multi-process), reading the resumed epoch's first `steps_done`
batches (all of the finished epochs' only where the input carries over),
nothing per step. A backup written by plain Keras (no tfdist state)
resumes as Keras does, at its epoch's start.
"""

import functools
import time

import keras
from absl import logging

from tfdist import errors
from tfdist.fault_tolerance.backup_state import BackupState
from tfdist.strategies.state import rank_state
from tfdist.strategies.core.backup_job import StrategyBackupJob
from tfdist.strategies.keras_surface.model_strategy import tfdist_strategy
from tfdist.fault_tolerance.preemption import PREEMPTED_EXIT_CODE
from tfdist.strategies.keras_surface.keras_internals import (GeneratorDataAdapter, PyDatasetAdapter,
                                                              TFEpochIterator)
from tfdist.strategies.keras_surface import fit_session, patch_points

# Inputs made in Python: an epoch's order may come from Python's state as its batches are read
# (Keras shuffles a PyDataset's batches with `random` when its generator starts), so a replay
# reads their finished epochs too.
_PYTHON_INPUTS = (GeneratorDataAdapter, PyDatasetAdapter)


# ------------------------------------------------------------------- the callback
class DistributedBackup:
    """Placed before the user's `BackupAndRestore` class (`prepare`): its writes, reads and
    position go through the callback's `BackupState` (`_tfdist_state`).

    Keras' own methods run through `super()`: Keras reads the backup (on the
    chief), decides when to save (`save_freq`) and deletes the directory at
    the end (on the chief, after every rank removed its own file).
    `_tfdist_position` is (epoch in progress, its steps trained).
    """

    _tfdist_position = (0, 0)

    def on_train_begin(self, logs=None):
        """The chief restores; every rank gets its weights and training state
        (`BackupState.restore`), the fit resumes at the backup's position, and preemption
        notices are taken from here to `on_train_end`."""
        keeper = self._tfdist_state
        self._tfdist_position = (0, 0)
        state = keeper.restore(super().on_train_begin, logs)
        if state is not None:
            _resume(self, state, keeper.job.strategy)
        keeper.job.strategy.extended.preemption.arm()

    def on_epoch_begin(self, epoch, logs=None):
        position = self._tfdist_position
        self._tfdist_position = (epoch, position[1] if position[0] == epoch else 0)
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._tfdist_position = (self._tfdist_position[0], batch + 1)
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._tfdist_position = (epoch + 1, 0)
        super().on_epoch_end(epoch, logs)

    def _save_model(self):
        """At Keras' save points and the agreed preemption step: the chief writes the backup,
        another rank its own residuals (`BackupState.save`)."""
        self._tfdist_state.save(*self._tfdist_position)

    def _load_model(self):
        """The chief's read: an unreadable backup is named (`BackupState.load`)."""
        return self._tfdist_state.load(super()._load_model)

    def on_train_end(self, logs=None):
        """Notices are no longer taken. A non-chief rank removes only its own residual file;
        where ranks keep such files, the chief deletes the directory after every rank did
        (a barrier)."""
        keeper = self._tfdist_state
        strategy = keeper.job.strategy
        strategy.extended.preemption.disarm()
        own_files = strategy.world_size > 1 and rank_state.keeps_rank_state(strategy)
        if not strategy.is_chief:
            keeper.remove()
            if own_files:
                strategy.extended.barrier("before deleting the backup")
            return
        if own_files:
            strategy.extended.barrier("before deleting the backup")
        super().on_train_end(logs)


# ---------------------------------------------------------------------- restoring
def _resume(callback, state, strategy):
    """Continue at the backup's position (`_replay_to`), with its seed, metric and callbacks'
    state."""
    # pylint: disable=protected-access
    model, position = callback.model, dict(state.position)
    iterations = int(model.optimizer.iterations.numpy()) if model.optimizer is not None else 0
    if iterations != position["iterations"]:  # a weights file and metadata from two backups
        logging.warning("tfdist: the backup's weights are at optimizer step %d, its metadata at "
                        "%d: resuming at the start of epoch %d.", iterations,
                        position["iterations"], position["epoch"] + 1)
        position["steps_done"] = 0
    model._initial_epoch = position["epoch"] or None  # declared: patch_points.PRIVATE_ATTRIBUTES
    callback._tfdist_position = (position["epoch"], position["steps_done"])
    state.apply_random_state(model)
    call = fit_session.current_fit(model)
    if call is not None:  # the fit's iterator replays the input to the backup; its callbacks
        call.replay_to = (position["epoch"], position["steps_done"], state, model)
        call.resume_state = state  # get the backup's state after every on_train_begin
    strategy.extended.updates.resume_servers_from(state.servers)
    if strategy.is_chief:
        written_by = position["world_size"]
        print(f"tfdist: resuming from the backup in {callback.backup_dir}: epoch "
              f"{position['epoch'] + 1} after {position['steps_done']} of its steps (optimizer "
              f"step {iterations})" + ("" if written_by == strategy.world_size else
                                       f", written by {written_by} process(es)"), flush=True)


def apply_steering_state(callback_list):
    """After every callback's `on_train_begin` (which resets them): the backup's callbacks'
    state (`BackupState.apply`)."""
    call = fit_session.current_fit(getattr(callback_list, "model", None))
    state = call.resume_state if call is not None else None
    if state is None:
        return
    call.resume_state = None
    for callback in callback_list.callbacks:
        keeper = getattr(callback, "_tfdist_state", None)
        if isinstance(callback, keras.callbacks.BackupAndRestore) and keeper is not None:
            keeper.apply(state, callback_list.callbacks)
            return
    state.apply_callbacks(callback_list.callbacks)


# ---------------------------------------------------------------- the epoch iterator
def _pull(iterator, count):
    for _ in range(count):
        next(iterator)


def _replay_to(epoch_iterator, enumerate_epoch, epoch, steps_done, state, model):
    """Consume the data as the interrupted run did up to the backup, then yield the rest of
    the resumed epoch's steps (numbered as the uninterrupted run numbers them)."""
    # pylint: disable=protected-access
    carries_over = (bool(epoch_iterator.steps_per_epoch) or epoch_iterator._num_batches is None
                    or isinstance(epoch_iterator.data_adapter, _PYTHON_INPUTS))
    for _ in range(epoch):
        with epoch_iterator.catch_stop_iteration():
            for begin, end, iterator in enumerate_epoch(epoch_iterator):
                if carries_over:
                    _pull(iterator, end - begin + 1)
    state.apply_metrics(model)  # fit reset the metrics just before this epoch began
    trained = False
    for begin, end, iterator in enumerate_epoch(epoch_iterator):
        if begin < steps_done:
            _pull(iterator, end - begin + 1)
            continue
        trained = True
        yield begin, end, iterator
    call = fit_session.current_fit(model)
    if not trained and call is not None:  # the backup was at the epoch's last step: its
        call.epoch_without_steps = epoch   # logs are the metrics' (`epoch_logs`)


def epoch_logs(callback_list, epoch, logs=None):
    """A resumed epoch whose steps were all trained before the backup ran no step, so fit's
    epoch logs lack the loss and metrics: they are the metrics' (restored) results."""
    model = getattr(callback_list, "model", None)
    call = fit_session.current_fit(model) if model is not None else None
    if call is None or call.epoch_without_steps != epoch:
        return logs
    call.epoch_without_steps = None
    results = {name: float(value) for name, value in model.get_metrics_result().items()}
    return {**results, **(logs or {})}


def _install_replay():
    enumerate_epoch = TFEpochIterator._enumerate_iterator  # pylint: disable=protected-access

    @functools.wraps(enumerate_epoch)
    def enumerate_from_the_backup(self):
        call = fit_session.current_fit()
        if call is None or call.fit_iterator is not self or call.replay_to is None:
            return enumerate_epoch(self)
        replay, call.replay_to = call.replay_to, None
        return _replay_to(self, enumerate_epoch, *replay)

    patch_points.replace("TFEpochIterator", "_enumerate_iterator", enumerate_from_the_backup)


def _preemption_of(callback_list):
    """The armed preemption notice of the list's model, with the list's backup callback."""
    strategy = tfdist_strategy(getattr(callback_list, "model", None))
    if strategy is None or not strategy.extended.preemption.armed:
        return None, None
    backups = [c for c in callback_list.callbacks
               if isinstance(c, keras.callbacks.BackupAndRestore)]
    return (strategy, backups[0]) if backups else (None, None)


def before_train_batch(callback_list):
    strategy = tfdist_strategy(getattr(callback_list, "model", None))
    if strategy is not None:  # a notice, or an epoch's weights fingerprint, joins the next step
        strategy.extended.agreed_flags.before_step()


def back_up_if_preempted(callback_list):
    """After a training step: if any rank had the preemption notice by it, every rank backs
    up here (the step every rank agreed on), waits for the others and raises
    `errors.Preempted` (which `fit` turns into exit code 42, `data`)."""
    strategy, callback = _preemption_of(callback_list)
    if strategy is None or not strategy.extended.preemption.agreed():
        return
    started = time.monotonic()
    strategy.extended.updates.before_preemption_backup()
    callback._save_model()  # pylint: disable=protected-access
    if strategy.world_size > 1:
        strategy.extended.barrier("after the preemption backup")
    strategy.extended.preemption.taken()
    epoch, steps_done = callback._tfdist_position  # pylint: disable=protected-access
    if strategy.is_chief:
        print(f"tfdist: preempted: backed up at epoch {epoch + 1} after {steps_done} of its "
              f"steps (optimizer step {int(callback.model.optimizer.iterations.numpy())}) in "
              f"{callback.backup_dir} ({time.monotonic() - started:.2f} s, every rank done); "
              f"every rank exits with code {PREEMPTED_EXIT_CODE}", flush=True)
    raise errors.Preempted(epoch, steps_done)


def after_fit(model):
    """`fit` returned or raised: its preemption notices are no longer taken (a fit that raised
    skipped `on_train_end`)."""
    strategy = tfdist_strategy(model)
    if strategy is not None and strategy.extended.preemption.armed:
        strategy.extended.preemption.disarm()


# ----------------------------------------------------------------- the callback list
def prepare(callbacks, model):
    """The BackupAndRestore callbacks of a tfdist model's callback list get the policy above
    (once per callback object, whichever lists it joins): the callback's class becomes its
    own class with `DistributedBackup` first."""
    strategy = tfdist_strategy(model)
    if strategy is None:
        return
    callbacks = keras.tree.flatten(callbacks) if callbacks else []
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.BackupAndRestore):
            continue
        if getattr(callback, "_tfdist_state", None) is None:
            callback._tfdist_state = BackupState(  # pylint: disable=protected-access
                callback, StrategyBackupJob(strategy))
            patch_points.adopt(callback, "BackupAndRestore", DistributedBackup)
        callback._tfdist_state.callbacks = callbacks  # pylint: disable=protected-access


def install():
    _install_replay()
