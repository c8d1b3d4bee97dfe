"""Every private Keras name tfdist reads, resolved once for the supported Keras versions.

The rest of tfdist imports Keras internals from here and nowhere else, so a
rename in Keras is absorbed in one place (as `Trainer`, called
`TensorFlowTrainer` before Keras 3.16) and a removal becomes
`compat.check_keras`'s ImportError naming what is gone, never an
AttributeError in the middle of a patch.

Each name is looked up under every spelling the supported versions use,
newest first; `missing()` lists what this Keras has under none of them.
"""

import importlib
from typing import Any, List

from tfdist import versions

_missing: List[str] = []


def _module(path: str) -> Any:
    try:
        return importlib.import_module(path)
    except ImportError:
        _missing.append(path)
        return None


def _attribute(module: Any, path: str, *spellings: str) -> Any:
    """`module`'s attribute under the first of `spellings` it has (None, recorded, if none)."""
    for name in spellings:
        if module is not None and hasattr(module, name):
            return getattr(module, name)
    if module is not None:
        _missing.append(f"{path}.{' or '.join(spellings)}")
    return None


def missing() -> List[str]:
    """The internals this Keras lacks ("module" or "module.name or other name")."""
    return list(_missing)


backend = _module("keras.src.backend")
masking = _module("keras.src.backend.common.masking")
loss_module = _module("keras.src.losses.loss")
_tf_trainer = _module("keras.src.backend.tensorflow.trainer")
_tf_optimizer = _module("keras.src.backend.tensorflow.optimizer")
_base_optimizer = _module("keras.src.optimizers.base_optimizer")
_loss_scale_optimizer = _module("keras.src.optimizers.loss_scale_optimizer")
_array_adapter = _module("keras.src.trainers.data_adapters.array_data_adapter")
_generator_adapter = _module("keras.src.trainers.data_adapters.generator_data_adapter")
_py_dataset_adapter = _module("keras.src.trainers.data_adapters.py_dataset_adapter")
_tf_dataset_adapter = _module("keras.src.trainers.data_adapters.tf_dataset_adapter")

# The TensorFlow backend's trainer, the class every Keras model on TensorFlow derives from
# (Keras 3.16 renamed it from TensorFlowTrainer to Trainer).
Trainer = _attribute(_tf_trainer, "keras.src.backend.tensorflow.trainer",
                     "Trainer", "TensorFlowTrainer")
# The backend-independent trainer, where `compile` is defined (Keras 3.16: BaseTrainer).
BaseTrainer = _attribute(_module("keras.src.trainers.trainer"), "keras.src.trainers.trainer",
                         "BaseTrainer", "Trainer")
TFEpochIterator = _attribute(_tf_trainer, "keras.src.backend.tensorflow.trainer",
                             "TFEpochIterator")
TFOptimizer = _attribute(_tf_optimizer, "keras.src.backend.tensorflow.optimizer", "TFOptimizer")
# The backend's variable class, every Keras variable's: on TensorFlow what tf.train.Checkpoint
# saves and restores a variable through (`_serialize_to_tensors` / `_restore_from_tensors`,
# from keras.src.backend.tensorflow.core.Variable; Keras 3.16 moved that to .ops.core).
TFVariable = _attribute(backend, "keras.src.backend", "Variable")
BaseOptimizer = _attribute(_base_optimizer, "keras.src.optimizers.base_optimizer",
                           "BaseOptimizer")
LossScaleOptimizer = _attribute(_loss_scale_optimizer,
                                "keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer")
ArrayDataAdapter = _attribute(_array_adapter,
                              "keras.src.trainers.data_adapters.array_data_adapter",
                              "ArrayDataAdapter")
GeneratorDataAdapter = _attribute(_generator_adapter,
                                  "keras.src.trainers.data_adapters.generator_data_adapter",
                                  "GeneratorDataAdapter")
PyDatasetAdapter = _attribute(_py_dataset_adapter,
                              "keras.src.trainers.data_adapters.py_dataset_adapter",
                              "PyDatasetAdapter")
TFDatasetAdapter = _attribute(_tf_dataset_adapter,
                              "keras.src.trainers.data_adapters.tf_dataset_adapter",
                              "TFDatasetAdapter")
get_keras_mask = _attribute(masking, "keras.src.backend.common.masking", "get_keras_mask")
set_keras_mask = _attribute(masking, "keras.src.backend.common.masking", "set_keras_mask")

# The name `keras.random.SeedGenerator` gives its state variable (every supported version).
SEED_GENERATOR_STATE_NAME = "seed_generator_state"


def is_seed_generator_state(variable_kwargs: dict) -> bool:
    """Whether a variable created with `variable_kwargs` is a Keras seed generator's state."""
    name = variable_kwargs.get("name") or ""
    return name.rsplit("/", 1)[-1].split(":")[0] == SEED_GENERATOR_STATE_NAME


# Keras 3.16 calls a compiled step (steps_per_execution=1) on each eager batch, so the step is
# traced with the first batch's static size, and again with a relaxed one when a batch of
# another size comes (`reduce_retracing`); 3.15 and earlier trace the step on the iterator.
# What reads a static size (a per-output loss tracker's weight) differs: see `metrics`.
STEPS_TRACED_ON_EAGER_BATCHES = (
    versions.major_minor(importlib.import_module("keras").__version__) or (0, 0)) >= (3, 16)
