"""Checkpoint files that are never torn: write to a temporary name, then rename.

Keras writes a `.keras` or `.weights.h5` file in place, so a process killed
while saving (a preempted machine, a dead peer's launcher killing the job)
leaves a truncated file that cannot be loaded - and `BackupAndRestore` then
has nothing to resume from. Under a tfdist strategy the chief therefore
writes every such file as `.<name>.<pid>.tmp<ext>` in the same directory and
renames it over the target with `os.replace`, which POSIX makes atomic: a
reader sees the previous complete file or the new complete file, never a
part of one. The extension is kept at the end of the temporary name because
Keras chooses the format from it.

`BackupAndRestore` also keeps a small JSON file with the epoch and batch of
its backup, written by Keras after the weights (a torn one fails the resume,
and one that lags the weights repeats an epoch). `save_backup` writes both
files to temporary names first and renames them back to back, weights first,
so the pair on disk is consistent except for the microseconds between two
renames.

Cost: the same bytes written once, plus one rename per file.
"""

import glob
import json
import os

import tensorflow as tf
from absl import logging

from tfdist import _tf


def _is_local(path):
    return "://" not in path  # gs://, s3://, hdfs://: the filesystem's own semantics apply


def _temporary_name(path):
    directory, name = os.path.split(path)
    extension = ".weights.h5" if name.endswith(".weights.h5") else os.path.splitext(name)[1]
    return os.path.join(directory, f".{name}.{os.getpid()}.tmp{extension}")


def _remove_leftovers(path):
    """Remove temporary files of `path` left by writers that were killed mid-save."""
    directory, name = os.path.split(path)
    for leftover in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.*.tmp*")):
        pid = leftover[len(os.path.join(directory, f".{name}.")):].split(".", 1)[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            try:
                os.remove(leftover)
            except FileNotFoundError:
                pass


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomically(write, path):
    """Call `write(temporary_path)`, then rename the result to `path` (atomic, local files).

    Non-local paths are written in place. If `write` fails, `path` is untouched
    and the temporary file is removed; temporary files of killed writers
    are removed by the next write of the same path.
    """
    path = os.fspath(path)
    if not _is_local(path):
        return write(path)
    _remove_leftovers(path)
    temporary = _temporary_name(path)
    try:
        result = write(temporary)
        os.replace(temporary, path)
        return result
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_model_atomically(save, model, filepath, *args, **kwargs):
    """`Model.save` / `Model.save_weights` (the original `save`) without a torn file.

    Saves Keras does not write as one file (a directory with `zipped=False`,
    sharded weights) and saves that may ask before overwriting
    (`overwrite=False` with an existing file) are passed through unchanged.
    """
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    single_file = (kwargs.get("zipped", True) is not False
                   and kwargs.get("max_shard_size") is None)
    asks = kwargs.get("overwrite", True) is False and path is not None and os.path.exists(path)
    if path is None or args or not single_file or asks:
        return save(model, filepath, *args, **kwargs)
    return write_atomically(lambda temporary: save(model, temporary, **kwargs), path)


def save_backup(model, paths, previous_paths, training_state):
    """Write a `BackupAndRestore` backup: both files replaced atomically, weights first.

    Args:
        model: the model whose weights are saved.
        paths: (weights path, training-metadata path).
        previous_paths: the same pair for the previous backup (Keras'
            `double_checkpoint`), which the current files are copied to
            first; None to keep no previous backup.
        training_state: {"epoch": ..., "batch": ...}, the metadata's content.
    """
    weights, metadata = paths
    directory = os.path.dirname(weights)
    if directory and not tf.io.gfile.exists(directory):
        tf.io.gfile.makedirs(directory)
    for current, previous in zip(paths, previous_paths or ()):
        if tf.io.gfile.exists(current):
            write_atomically(lambda temporary, src=current: tf.io.gfile.copy(
                src, temporary, overwrite=True), previous)
    if not (_is_local(weights) and _is_local(metadata)):
        model.save_weights(filepath=weights, overwrite=True)
        with tf.io.gfile.GFile(metadata, "w") as f:
            f.write(json.dumps(training_state))
        return
    weights_temporary, metadata_temporary = _temporary_name(weights), _temporary_name(metadata)
    try:
        # Both files are complete under their temporary names before either is renamed.
        model.save_weights(filepath=weights_temporary, overwrite=True)
        with open(metadata_temporary, "w", encoding="utf-8") as f:
            json.dump(training_state, f)
        os.replace(weights_temporary, weights)
        os.replace(metadata_temporary, metadata)
    finally:
        for temporary in (weights_temporary, metadata_temporary):
            if os.path.exists(temporary):
                os.remove(temporary)


_chief_only_checkpoints = [False]


def install_chief_only_checkpoint_writes(is_chief):
    """`tf.train.Checkpoint` writes files on the chief only (once per process).

    In a multi-process job every rank runs the same custom loop, so every
    rank calls `checkpoint.save(prefix)` with the same prefix; TensorFlow's
    writers of one checkpoint from several processes share temporary names
    and fail or tear each other's files. As `Model.save` does, the chief
    writes and the other ranks write nothing: their save counter still
    counts, and `save`/`write` return the path the chief writes. A rank
    reads the chief's file safely after any later collective (the next
    step) or barrier, which orders it after the write.
    """
    if _chief_only_checkpoints[0]:
        return
    _chief_only_checkpoints[0] = True
    if is_chief:
        return

    def chief_only(write, checkpoint, file_prefix, options):
        del write, checkpoint, options
        logging.log_first_n(logging.INFO, "tfdist: tf.train.Checkpoint writes skipped on "
                            "non-chief rank (the chief writes them)", 1)
        return file_prefix

    _tf.wrap_checkpoint_writes(chief_only)
