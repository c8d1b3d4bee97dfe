"""Saving: `Model.save` / `save_weights` write on the chief only, atomically.

Every rank holds the same weights; one writer avoids clobbered files, and
the chief's file replaces the old one atomically (`checkpoint_files`): a
process killed mid-save leaves no torn file.
"""

import keras
from absl import logging

from tfdist.strategies.checkpoint_files import save_model_atomically
from tfdist.strategies.keras_patches.model_strategy import is_non_chief_model, tfdist_strategy


def install():
    """`Model.save` / `save_weights`: skipped off the chief, atomic on it."""
    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            if is_non_chief_model(self):
                logging.log_first_n(
                    logging.INFO, "tfdist: Model.%s skipped on non-chief rank", 1, _name
                )
                return None
            if tfdist_strategy(self) is not None:
                return save_model_atomically(_original, self, *args, **kwargs)
            return _original(self, *args, **kwargs)

        setattr(keras.Model, method_name, chief_only)
