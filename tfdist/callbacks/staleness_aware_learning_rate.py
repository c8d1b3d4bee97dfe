"""`StalenessAwareLearningRate`: each asynchronous update's rate divided by its staleness."""

import keras

from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class StalenessAwareLearningRate(keras.callbacks.Callback):
    """Divide the learning rate of every asynchronous update by its staleness (Zhang et al. 2016).

    An update computed from parameters that are s steps behind the worker's
    own (see `StalenessMonitor`) is applied with rate lr / max(1, s): stale
    gradients move the parameters less, which keeps asynchronous SGD stable
    with many workers ("Staleness-aware Async-SGD for Distributed Deep
    Learning", IJCAI 2016). lr is the optimizer's rate for the step as the
    other tfdist callbacks set it (`LearningRateScaling`, `LearningRateWarmup`,
    `LearningRateSchedule`, in any order): the division is the last term of
    the same formula, done per update when the worker pushes it.

    Applies to `ParameterServerStrategy(mode="async")`; under a synchronous
    strategy every update has staleness 0 and the rate is unchanged.

    Example:

    ```python
    strategy = tfdist.strategies.ParameterServerStrategy(mode="async")
    ...
    model.fit(x, y, epochs=10, callbacks=[
        tfdist.callbacks.LearningRateWarmup(warmup_epochs=2),
        tfdist.callbacks.StalenessAwareLearningRate(),
    ])
    ```
    """

    def on_train_begin(self, logs=None):
        self._set(True)

    def on_train_end(self, logs=None):
        self._set(False)

    def _set(self, on):
        remote = model_strategy.staleness_source(self.model)
        if remote is not None:
            remote.staleness_aware_rate.assign(on)
