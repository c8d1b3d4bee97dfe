"""Saving: `Model.save` / `save_weights` write on the chief only, atomically; each rank's own
state beside them.

Every rank holds the same weights; one writer avoids clobbered files, and
the chief's file replaces the old one atomically (`checkpoint_files`): a
process killed mid-save leaves no torn file. The state each rank keeps for
itself (a compressor's residuals) is written by every other rank beside the
chief's file and read back by `load_weights` / `keras.saving.load_model`
(`rank_state`).
"""

import os

import keras
from absl import logging

from tfdist.strategies import rank_state
from tfdist.strategies.checkpoint_files import save_model_atomically
from tfdist.strategies.keras_patches.model_strategy import is_non_chief_model, tfdist_strategy


def _filepath(args, kwargs):
    return kwargs.get("filepath", args[0] if args else None)


def install():
    """`Model.save` / `save_weights`: skipped off the chief, atomic on it, every rank's own
    state beside; `load_weights` / `load_model`: each rank's own state restored."""
    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            strategy = tfdist_strategy(self)
            if strategy is not None:
                rank_state.save(self, _filepath(args, kwargs), strategy)
            if is_non_chief_model(self):
                logging.log_first_n(
                    logging.INFO, "tfdist: Model.%s skipped on non-chief rank", 1, _name
                )
                return None
            if strategy is not None:
                return save_model_atomically(_original, self, *args, **kwargs)
            return _original(self, *args, **kwargs)

        setattr(keras.Model, method_name, chief_only)

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
