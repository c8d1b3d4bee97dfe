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

import copy
import glob
import json
import os
import shutil
import threading

import tensorflow as tf

from tfdist import _tf


def _is_local(path):
    return "://" not in path  # gs://, s3://, hdfs://: the filesystem's own semantics apply


def writer_tag():
    """What tells this writer's temporary files from another's: the process id, and the
    thread's when it is not the main thread (ranks simulated as threads share a process)."""
    if threading.current_thread() is threading.main_thread():
        return str(os.getpid())
    return f"{os.getpid()}-t{threading.get_native_id()}"


def _temporary_name(path):
    directory, name = os.path.split(path)
    extension = ".weights.h5" if name.endswith(".weights.h5") else os.path.splitext(name)[1]
    return os.path.join(directory, f".{name}.{writer_tag()}.tmp{extension}")


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


def write_atomically(write, path, before_rename=None):
    """Call `write(temporary_path)`, then rename the result to `path` (atomic, local files).

    Non-local paths are written in place. If `write` fails, `path` is untouched
    and the temporary file is removed; temporary files of killed writers
    are removed by the next write of the same path. `before_rename(temporary)`,
    if given, is called with the complete file just before the rename (with
    `path` itself once written, where nothing is renamed).
    """
    path = os.fspath(path)
    if not _is_local(path):
        result = write(path)
        if before_rename is not None:
            before_rename(None)
        return result
    _remove_leftovers(path)
    temporary = _temporary_name(path)
    try:
        result = write(temporary)
        if before_rename is not None:
            before_rename(temporary)
        os.replace(temporary, path)
        return result
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_model_atomically(save, model, filepath, *args, before_rename=None, **kwargs):
    """`Model.save` / `Model.save_weights` (the original `save`) without a torn file.

    Saves Keras does not write as one file (a directory with `zipped=False`,
    sharded weights) and saves that may ask before overwriting
    (`overwrite=False` with an existing file) are passed through unchanged
    (`before_rename(None)` follows them). `before_rename`: `write_atomically`'s.
    """
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    single_file = (kwargs.get("zipped", True) is not False
                   and kwargs.get("max_shard_size") is None)
    asks = kwargs.get("overwrite", True) is False and path is not None and os.path.exists(path)
    if path is None or args or not single_file or asks:
        result = save(model, filepath, *args, **kwargs)
        if before_rename is not None:
            before_rename(None)
        return result
    return write_atomically(lambda temporary: save(model, temporary, **kwargs), path,
                            before_rename)


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


_private_checkpoint_writes = [False]


def install_private_checkpoint_writes():
    """Several processes may write one `tf.train.Checkpoint` prefix at once (once per process).

    In a multi-process job every rank runs the same custom loop, so every
    rank calls `checkpoint.save(prefix)`, often with the same prefix (the
    TensorFlow guide's loop), sometimes with its own (the multi-worker
    guide's temporary directories, which each rank then deletes). TensorFlow
    writes a checkpoint through a temporary `<prefix>_temp` directory of
    fixed name, so writers of one prefix in several processes fail or tear
    each other's files. Here each process writes into a private staging
    directory beside the target (`.<name>.tfdist-<pid>`) and moves the
    finished files over the target with `os.replace`, data files first and
    the index last; every rank holds the same values, so whichever rank's
    file a reader sees is the same checkpoint. The `checkpoint` state file
    (`tf.train.latest_checkpoint`) is then updated for the real path, as
    `save` would; TensorFlow writes it atomically. Remote filesystems
    (gs://, ...) and asynchronous checkpoints are left to TensorFlow.

    Cost: one rename per file, per save.
    """
    if _private_checkpoint_writes[0]:
        return
    _private_checkpoint_writes[0] = True
    _tf.wrap_checkpoint_writes(_write_privately_then_move)


def _write_privately_then_move(write, checkpoint, file_prefix, options):
    file_prefix = os.fspath(file_prefix)
    if (not _is_local(file_prefix)
            or (options is not None and options.experimental_enable_async_checkpoint)):
        return write(checkpoint, file_prefix, options)
    directory, name = os.path.split(os.path.abspath(file_prefix))
    staging = os.path.join(directory, f".{name}.tfdist-{writer_tag()}")
    callbacks = list(options.experimental_write_callbacks or []) if options else []
    private = copy.copy(options) if options is not None else tf.train.CheckpointOptions()
    private.experimental_write_callbacks = None
    write(checkpoint, os.path.join(staging, name), private)
    written = sorted(glob.glob(os.path.join(glob.escape(staging), glob.escape(name) + ".*")),
                     key=lambda path: path.endswith(".index"))  # the index last
    for path in written:
        os.replace(path, os.path.join(directory, os.path.basename(path)))
    shutil.rmtree(staging, ignore_errors=True)
    _tf.run_checkpoint_write_callbacks(callbacks, file_prefix)
    return file_prefix
