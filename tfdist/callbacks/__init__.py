"""Keras 3 callbacks for distributed and large-batch training, asynchronous updates and profiling.

The learning-rate callbacks compose in one order, whatever order they are
listed in: `LearningRateScaling` -> `LearningRateWarmup` ->
`LearningRateSchedule` (see `learning_rate_control`).

`agrees_across_ranks` marks a callback class that sets no stop flag, or sets
it from the (global) logs only: with only such callbacks, Keras' loop reads
`stop_training` without exchanging it between ranks after every batch.
"""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.callbacks.communication_monitor import CommunicationMonitor
from tfdist.callbacks.learning_rate_scaling import LearningRateScaling
from tfdist.callbacks.learning_rate_schedule import LearningRateSchedule
from tfdist.callbacks.learning_rate_warmup import LearningRateWarmup
from tfdist.callbacks.staleness_aware_learning_rate import StalenessAwareLearningRate
from tfdist.callbacks.staleness_monitor import StalenessMonitor
from tfdist.strategies.keras_surface.model_strategy import agrees_across_ranks

__all__ = ["LearningRateScaling", "LearningRateWarmup", "LearningRateSchedule",
           "StalenessMonitor", "StalenessAwareLearningRate", "CommunicationMonitor",
           "agrees_across_ranks"]
