"""Saving: `Model.save` / `save_weights` / `export` write on the chief only, atomically; the
chief never waits, another rank that saves returns once the chief's file is complete.

Every rank holds the same weights; one writer avoids clobbered files, and
the chief's file replaces the old one atomically (`checkpoint_files`): a
process killed mid-save leaves no torn file. `export` (a SavedModel
directory) is written into a staging directory and moved into place.

Both conventions of saving in a multi-process script work, after `fit`,
inside callbacks and mid-fit (`save_records`):

* every rank calls the save (keras.io's scripts, MultiWorkerMirroredStrategy's
  habit, to the same path or to paths of their own): the chief writes; every
  other rank returns once the chief's file with the same weights is complete,
  so a rank that loads the file right after saving reads the new one;
  Where the job spans hosts, a rank whose disk does not hold the chief's file copies it
  from the chief (`chief_saves`): every host that asked for the file has the chief's bytes;
* only the chief calls it (Horovod's "save checkpoints only on worker 0",
  `if strategy.is_chief: model.save(...)`, a callback only rank 0 has): the
  chief writes and goes on; nobody waits for ranks that do not call.

The state each rank keeps for itself (a compressor's residuals) is written
by every other rank that saves, beside the chief's file, and read back by
`load_weights` / `keras.saving.load_model` (`rank_state`).
`keras.saving.save_model(model, ...)` is `model.save(...)`.
"""

import os
import shutil

import keras
from absl import logging

from tfdist.strategies.state import rank_state, save_records
from tfdist.fault_tolerance.checkpoint_files import save_model_atomically, writer_tag
from tfdist.strategies.keras_surface.model_strategy import is_non_chief_model, tfdist_strategy
from tfdist.strategies.keras_surface import patch_points


def _filepath(args, kwargs):
    return kwargs.get("filepath", args[0] if args else None)


def _recorded_path(model, filepath):
    """The local or remote path a save to `filepath` is recorded under, or None (no record:
    one process, an update mode whose ranks hold different weights - the asynchronous
    parameter server -, a backup, a path that is not a name)."""
    strategy = tfdist_strategy(model)
    if (strategy is None or strategy.world_size == 1
            or not strategy.extended.updates.ranks_hold_the_same_weights
            or not save_records.recorded() or not isinstance(filepath, (str, os.PathLike))):
        return None
    return os.fspath(filepath)


def _on_the_chief(model, what, filepath, write):
    """`write(before_rename)` on the chief (recording the save); on another rank, wait for
    the chief's file."""
    path = _recorded_path(model, filepath)
    if is_non_chief_model(model):
        logging.log_first_n(logging.INFO, "tfdist: %s writes on the chief only", 1, what)
        if path is not None:
            _wait_for_the_chief(model, what, path)
        return None
    if path is None:
        return write(None)
    saved = save_records.SavedWeights(model)
    result = write(lambda written: save_records.publish(path, saved, written))
    extended = tfdist_strategy(model).extended
    extended.save_log.completed(saved)
    if extended.chief_saves is not None:  # served to ranks on other hosts
        extended.chief_saves.completed(path, saved.whole, extended.save_log.saves)
    return result


def _wait_for_the_chief(model, what, path):
    """Return once `path` holds the chief's save of this rank's weights: seen through the
    file system on one host (`save_records`), fetched from the chief where the job spans
    hosts that need not share a disk (`chief_saves`)."""
    strategy = tfdist_strategy(model)
    communicator = strategy.extended.communicator
    saved = save_records.SavedWeights(model)
    chief_gone = lambda: 0 in communicator.gone_peers()  # noqa: E731
    across_hosts = strategy.extended.chief_saves
    if across_hosts is not None:
        across_hosts.fetch(path, saved, what, strategy.extended.save_log.requested(),
                           chief_gone)
        return
    save_records.wait_for(path, saved, what, strategy.rank, communicator.timeout, chief_gone,
                          strategy.extended.save_log)


def _export_atomically(export, model, filepath, *args, before_rename=None, **kwargs):
    """`Model.export` into a staging directory beside `filepath`, then moved into place."""
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if path is None or "://" in path:
        result = export(model, filepath, *args, **kwargs)
        if before_rename is not None:
            before_rename(None)
        return result
    directory, name = os.path.split(os.path.abspath(path))
    staging = os.path.join(directory, f".{name}.tfdist-{writer_tag()}")
    previous = os.path.join(directory, f".{name}.tfdist-{writer_tag()}-previous")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        result = export(model, staging, *args, **kwargs)
        if before_rename is not None:
            before_rename(staging)
        if os.path.lexists(path):
            os.replace(path, previous)  # a directory is not replaced in one rename
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(previous, ignore_errors=True)
    return result


def install():
    """`Model.save` / `save_weights` / `export`: written on the chief, atomically, recorded;
    other ranks that save wait for the chief's file; every rank's own state beside;
    `load_weights` / `load_model`: each rank's own state restored."""
    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            strategy = tfdist_strategy(self)
            if strategy is None:
                return _original(self, *args, **kwargs)
            filepath = _filepath(args, kwargs)
            rank_state.save(self, filepath, strategy)
            with strategy.extended.placement.consolidated(self):  # a sharded state, whole
                return _on_the_chief(self, f"Model.{_name}", filepath, lambda before_rename: (
                    save_model_atomically(_original, self, *args, before_rename=before_rename,
                                          **kwargs)))

        patch_points.replace("keras.Model", method_name, chief_only)

    export = keras.Model.export

    def export_on_the_chief(self, *args, **kwargs):
        if tfdist_strategy(self) is None:
            return export(self, *args, **kwargs)
        return _on_the_chief(self, "Model.export", _filepath(args, kwargs),
                             lambda before_rename: _export_atomically(
                                 export, self, *args, before_rename=before_rename, **kwargs))

    patch_points.replace("keras.Model", "export", export_on_the_chief)

    save_model = keras.saving.save_model

    def save_model_through_the_model(model, *args, **kwargs):
        if tfdist_strategy(model) is None:
            return save_model(model, *args, **kwargs)
        return model.save(*args, **kwargs)

    for module in ("keras.saving", "keras.models"):
        if patch_points.original(module, "save_model") is save_model:
            patch_points.replace(module, "save_model", save_model_through_the_model)

    load_weights = keras.Model.load_weights

    def load_weights_with_rank_state(self, *args, **kwargs):
        result = load_weights(self, *args, **kwargs)
        strategy = tfdist_strategy(self)
        if strategy is not None:
            rank_state.restore(self, _filepath(args, kwargs), strategy)
        return result

    patch_points.replace("keras.Model", "load_weights", load_weights_with_rank_state)

    load_model = keras.saving.load_model

    def load_model_with_rank_state(*args, **kwargs):
        model = load_model(*args, **kwargs)
        strategy = tfdist_strategy(model)
        filepath = _filepath(args, kwargs)
        if strategy is not None and isinstance(filepath, (str, os.PathLike)):
            rank_state.restore(model, filepath, strategy)
        return model

    for module in ("keras.saving", "keras.models"):
        if patch_points.original(module, "load_model") is load_model:
            patch_points.replace(module, "load_model", load_model_with_rank_state)
