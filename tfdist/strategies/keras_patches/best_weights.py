"""`EarlyStopping(restore_best_weights=True)`'s best weights, kept beside a backup.

Keras' `EarlyStopping` holds the weights of its best epoch in memory
(`best_weights`) and sets them at the end of training; a backup holds the
current weights only, so a resumed run would restore the weights of the
first epoch after the resume instead of the best one. Under a tfdist
strategy the chief therefore writes them beside the backup,
`<backup dir>/tfdist-best-weights-<n>.npz` for the n-th such callback
(atomically, `checkpoint_files.write_atomically`), tagged with the callback's
`best_epoch`; they change only when the monitored value improves, so a file
is written only then, before the backup that records that `best_epoch`
(`training_state`: the callback's state). On resume the chief reads the file
whose tag matches the backup's `best_epoch` (a file written after the
backup, by a process killed before its next backup, does not match and is
ignored with a warning) and every rank receives the weights (one broadcast
per array), so every rank restores the same best weights at the end.
`BackupAndRestore` deletes the directory, files included, when training
ends.

Cost: one write of the model's weights per improvement of the monitored
value (not per backup); on resume, one broadcast per weight array.
"""

import io
import os

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.strategies.checkpoint_files import write_atomically
from tfdist.strategies.training_state import callback_key


def _keeping(callbacks):
    """The `EarlyStopping` callbacks of the list that restore their best weights."""
    return [c for c in callbacks
            if isinstance(c, keras.callbacks.EarlyStopping) and c.restore_best_weights]


def _path(backup_dir, key):
    return os.path.join(backup_dir, f"tfdist-best-weights-{key.split('#')[1]}.npz")


def save_beside(backup_dir, callbacks):
    """The chief, before writing a backup: each callback's best weights, if new since the last."""
    # pylint: disable=protected-access
    for callback in _keeping(callbacks):
        weights = callback.best_weights
        if weights is None or weights is getattr(callback, "_tfdist_best_written", None):
            continue
        buffer = io.BytesIO()
        np.savez(buffer, best_epoch=np.asarray(callback.best_epoch), *weights)

        def write(path, data=buffer.getvalue()):
            with tf.io.gfile.GFile(path, "wb") as f:
                f.write(data)

        if not tf.io.gfile.exists(backup_dir):
            tf.io.gfile.makedirs(backup_dir)
        write_atomically(write, _path(backup_dir, callback_key(callback, callbacks)))
        callback._tfdist_best_written = weights


def _read(path, best_epoch):
    """The weights in `path` if it exists and is tagged `best_epoch`, else None."""
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        arrays = np.load(io.BytesIO(f.read()))
        if int(arrays["best_epoch"]) != int(best_epoch):
            return None
        names = sorted((n for n in arrays.files if n.startswith("arr_")),
                       key=lambda n: int(n.split("_")[1]))
        return [arrays[name] for name in names]


def restore(callbacks, state, strategy, backup_dir):
    """After `on_train_begin` of a resumed fit (every rank): each callback's best weights."""
    for callback in _keeping(callbacks):
        key = callback_key(callback, callbacks)
        recorded = state.callbacks.get(key)
        if recorded is None or "best_epoch" not in recorded:
            continue
        weights = _read(_path(backup_dir, key), recorded["best_epoch"]) if strategy.is_chief \
            else None
        if strategy.world_size > 1:
            weights = _shared(strategy.extended.communicator, weights, callback.model)
        if weights is None:
            if strategy.is_chief:
                logging.warning("tfdist: EarlyStopping(restore_best_weights=True) resumed "
                                "without its best weights (no file of epoch %d beside the "
                                "backup): it restores the best weights seen since the resume.",
                                recorded["best_epoch"] + 1)
            continue
        callback.best_weights = weights


def _shared(communicator, weights, model):
    """The chief's `weights` (or None) on every rank."""
    found = int(communicator.broadcast(tf.constant([int(weights is not None)], tf.int64))
                .numpy()[0])
    if not found:
        return None
    mine = weights if weights is not None else [np.zeros(w.shape, w.dtype)
                                               for w in model.get_weights()]
    return [communicator.broadcast(tf.constant(array)).numpy() for array in mine]
