"""Saving: `Model.save` / `save_weights` / `export` write on the chief only, atomically, and
return on every rank once the file is complete; each rank's own state beside them.

Every rank holds the same weights; one writer avoids clobbered files, and
the chief's file replaces the old one atomically (`checkpoint_files`): a
process killed mid-save leaves no torn file. `export` (a SavedModel
directory) is written into a staging directory and moved into place. The
state each rank keeps for itself (a compressor's residuals) is written by
every other rank beside the chief's file and read back by `load_weights` /
`keras.saving.load_model` (`rank_state`).

Called outside `fit`/`evaluate`/`predict` (keras.io's "save, then load the
model back" on every rank), a save is a collective, as under
MultiWorkerMirroredStrategy: every rank calls it, and every rank returns only
once the chief's file is complete (one barrier after the write), so a rank
that loads the file right after saving reads the new one. A save only the
chief calls (`if strategy.is_chief: model.save(...)`) therefore waits for
its peers and fails after the job's timeout with a message saying so. Inside
`fit`, a callback's save (`ModelCheckpoint`, on the chief only) is ordered
by the next step's collective and by the barrier that ends `fit`
(`callbacks`). `keras.saving.save_model(model, ...)` is `model.save(...)`.
"""

import os
import shutil

import keras
from absl import logging

from tfdist.strategies import rank_state
from tfdist.strategies.checkpoint_files import save_model_atomically, writer_tag
from tfdist.strategies.keras_patches.data import in_keras_loop
from tfdist.strategies.keras_patches.model_strategy import is_non_chief_model, tfdist_strategy


def _filepath(args, kwargs):
    return kwargs.get("filepath", args[0] if args else None)


def _complete_on_every_rank(model, what):
    """Outside fit/evaluate/predict: return once every rank got here (the chief has written)."""
    strategy = tfdist_strategy(model)
    if (strategy is None or strategy.world_size == 1 or strategy.extended.asynchronous
            or in_keras_loop()):
        return
    communicator = strategy.extended.communicator
    with communicator.expect_progress(
            f"{what} (a collective: every rank calls it and returns once the chief's file is "
            "complete; call it on every rank, not only on the chief)"):
        communicator.barrier()


def _export_atomically(export, model, filepath, *args, **kwargs):
    """`Model.export` into a staging directory beside `filepath`, then moved into place."""
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if path is None or "://" in path:
        return export(model, filepath, *args, **kwargs)
    directory, name = os.path.split(os.path.abspath(path))
    staging = os.path.join(directory, f".{name}.tfdist-{writer_tag()}")
    previous = os.path.join(directory, f".{name}.tfdist-{writer_tag()}-previous")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        result = export(model, staging, *args, **kwargs)
        if os.path.lexists(path):
            os.replace(path, previous)  # a directory is not replaced in one rename
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(previous, ignore_errors=True)
    return result


def install():
    """`Model.save` / `save_weights` / `export`: written on the chief, atomically, complete on
    every rank when they return; every rank's own state beside; `load_weights` /
    `load_model`: each rank's own state restored."""
    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            strategy = tfdist_strategy(self)
            if strategy is None:
                return _original(self, *args, **kwargs)
            rank_state.save(self, _filepath(args, kwargs), strategy)
            result = None
            if is_non_chief_model(self):
                logging.log_first_n(
                    logging.INFO, "tfdist: Model.%s skipped on non-chief rank", 1, _name)
            else:
                result = save_model_atomically(_original, self, *args, **kwargs)
            _complete_on_every_rank(self, f"Model.{_name}")
            return result

        setattr(keras.Model, method_name, chief_only)

    export = keras.Model.export

    def export_on_the_chief(self, *args, **kwargs):
        if tfdist_strategy(self) is None:
            return export(self, *args, **kwargs)
        result = None
        if is_non_chief_model(self):
            logging.log_first_n(logging.INFO, "tfdist: Model.export skipped on non-chief rank", 1)
        else:
            result = _export_atomically(export, self, *args, **kwargs)
        _complete_on_every_rank(self, "Model.export")
        return result

    keras.Model.export = export_on_the_chief

    save_model = keras.saving.save_model

    def save_model_through_the_model(model, *args, **kwargs):
        if tfdist_strategy(model) is None:
            return save_model(model, *args, **kwargs)
        return model.save(*args, **kwargs)

    for module in (keras.saving, keras.models):
        if getattr(module, "save_model", None) is save_model:
            module.save_model = save_model_through_the_model

    load_weights = keras.Model.load_weights

    def load_weights_with_rank_state(self, *args, **kwargs):
        result = load_weights(self, *args, **kwargs)
        strategy = tfdist_strategy(self)
        if strategy is not None:
            rank_state.restore(self, _filepath(args, kwargs), strategy)
        return result

    keras.Model.load_weights = load_weights_with_rank_state

    load_model = keras.saving.load_model

    def load_model_with_rank_state(*args, **kwargs):
        model = load_model(*args, **kwargs)
        strategy = tfdist_strategy(model)
        filepath = _filepath(args, kwargs)
        if strategy is not None and isinstance(filepath, (str, os.PathLike)):
            rank_state.restore(model, filepath, strategy)
        return model

    for module in (keras.saving, keras.models):
        if getattr(module, "load_model", None) is load_model:
            module.load_model = load_model_with_rank_state
