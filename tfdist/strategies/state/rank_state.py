"""Each rank's own optimizer state (a compressor's residuals) kept beside a checkpoint.

A checkpoint is written by the chief (`keras_patches.saving`), so it holds
the chief's copy of every optimizer variable. That is every rank's copy,
except for the state a compressor keeps per rank (`Aggregator.build` under
`LocalStateSync.rank_own_variables`: residuals, momentum): restored from the
chief's file alone, every rank would hold the chief's residual - its
pending error counted P times, the others' lost. So whenever the chief
writes a checkpoint, every other rank (at the same callback, the same step)
writes its own state to `<checkpoint>.tfdist-rank<r>.npz` (atomically, on
its own filesystem, any `tf.io.gfile` path), with the optimizer's step
count; a write that fails only warns; after every restore
(`Model.load_weights`, `keras.saving.load_model`, `BackupAndRestore`) each
rank reads its file and assigns its own state if the step count and shapes
match the restored optimizer's. A rank without a matching file (the
checkpoint was written by the chief alone, or by a job of another size)
sets its state to zero and says so: its pending error is dropped rather
than the chief's duplicated. The chief needs no file: the checkpoint holds
its own state.

Cost: one file per rank per checkpoint, the size of the compressed
gradients' residuals; nothing when the strategy keeps no per-rank state.
"""

import io
import os
import weakref

import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.fault_tolerance.checkpoint_files import write_atomically

_RANK_OWN = weakref.WeakKeyDictionary()  # optimizer -> its rank-own variables, in build order


def keeps_rank_state(strategy) -> bool:
    """Whether the strategy's compressor keeps state of each rank's own (residuals)."""
    compressor = getattr(strategy.extended.aggregator, "compressor", None)
    return getattr(compressor, "keeps_rank_state", False)


def remember(optimizer, variables):
    """Record `variables` (built by the aggregation hook, `Aggregator.rank_variables`) as
    `optimizer`'s rank-own state."""
    if variables:
        _RANK_OWN.setdefault(optimizer, []).extend(variables)


def rank_own_variables(model):
    """The rank-own state of `model`'s optimizer (and of the optimizer it wraps)."""
    optimizer = getattr(model, "optimizer", None)
    found = []
    while optimizer is not None:
        found += _RANK_OWN.get(optimizer, [])
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found


def is_rank_own(variable) -> bool:
    """True if `variable` is some optimizer's rank-own state (`remember`)."""
    return any(v is variable for variables in list(_RANK_OWN.values()) for v in variables)


def state_path(filepath, rank):
    """Where rank `rank` keeps its own state for the checkpoint at `filepath`."""
    return f"{os.fspath(filepath)}.tfdist-rank{rank}.npz"


def _iterations(model):
    return int(model.optimizer.iterations.numpy())


def _applies_to(filepath, strategy):
    return not strategy.is_chief and isinstance(filepath, (str, os.PathLike))


def _applies(model, filepath, strategy):
    return _applies_to(filepath, strategy) and bool(rank_own_variables(model))


def save(model, filepath, strategy):
    """Write this rank's own state for the checkpoint `filepath` (the chief's: in it)."""
    if not _applies(model, filepath, strategy):
        return
    variables, rank = rank_own_variables(model), strategy.rank
    # float32 on file: NumPy stores bfloat16 as raw records it cannot cast back.
    arrays = {f"v{i}": np.asarray(tf.cast(v, tf.float32)) for i, v in enumerate(variables)}
    path = state_path(filepath, rank)

    def write(temporary):
        buffer = io.BytesIO()
        np.savez(buffer, iterations=np.int64(_iterations(model)), **arrays)
        with tf.io.gfile.GFile(temporary, "wb") as f:
            f.write(buffer.getvalue())

    try:
        directory = os.path.dirname(path)
        if directory and not tf.io.gfile.exists(directory):
            tf.io.gfile.makedirs(directory)
        write_atomically(write, path)
    except (OSError, tf.errors.OpError) as error:
        logging.warning("tfdist: rank %d could not write its own compression residuals to %s "
                        "(%s): a restore from this checkpoint starts them from zero.",
                        rank, path, error)


def remove(filepath, strategy):
    """Delete this rank's state file for `filepath` (a backup removed at the end of fit)."""
    if not _applies_to(filepath, strategy):
        return
    path = state_path(filepath, strategy.rank)
    try:
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    except (OSError, tf.errors.OpError) as error:
        logging.warning("tfdist: rank %d could not remove %s (%s)", strategy.rank, path, error)


def restore(model, filepath, strategy):
    """Assign this rank's own state from its file for the checkpoint `filepath` (just
    restored); zeros, with a warning, where no file matches (the chief: nothing to do)."""
    if not _applies(model, filepath, strategy):
        return
    variables, rank = rank_own_variables(model), strategy.rank
    path = state_path(filepath, rank)
    problem = None
    if not tf.io.gfile.exists(path):
        problem = f"no {os.path.basename(path)} beside the checkpoint"
    else:
        with tf.io.gfile.GFile(path, "rb") as f, np.load(io.BytesIO(f.read())) as saved:
            arrays = [saved[f"v{i}"] for i in range(len(variables)) if f"v{i}" in saved]
            step = int(saved["iterations"])
        if step != _iterations(model):
            problem = (f"{os.path.basename(path)} is from step {step}, the checkpoint from "
                       f"step {_iterations(model)}")
        elif [a.shape for a in arrays] != [tuple(v.shape) for v in variables]:
            problem = f"{os.path.basename(path)} holds state of other shapes"
    if problem is None:
        for variable, array in zip(variables, arrays):
            variable.assign(tf.cast(array, variable.dtype))
        return
    logging.warning("tfdist: rank %d restored %s without its own compression residuals (%s): "
                    "they start from zero.", rank, os.fspath(filepath), problem)
    for variable in variables:
        variable.assign(tf.zeros(variable.shape, variable.dtype))
