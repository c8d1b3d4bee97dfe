"""`StalenessMonitor`: staleness and gate time of the asynchronous parameter server, in the logs."""

import keras

from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class StalenessMonitor(keras.callbacks.Callback):
    """Add the staleness of this worker's updates and its time at the gate to the epoch logs.

    With `ParameterServerStrategy(mode="async")`, an update computed at the
    worker's step c from parameters of version v (every worker's first v
    updates are in them) has staleness c - v: 0 in lock-step, at most tau
    with `staleness=tau` (SSP), unbounded without a bound. At the end of
    every epoch this callback adds to the logs, so that `History`, the
    progress bar, `CSVLogger` and `TensorBoard` show them:

    * `staleness_mean`, `staleness_max`: over this worker's updates of the epoch;
    * `ps_wait_ms`: mean time per update this worker was blocked at the
      staleness gate, in milliseconds (0 without a bound).

    The numbers are counted inside the compiled step (no host sync per
    step) and are this worker's own; the chief's are the ones printed.
    Under a synchronous strategy every update has staleness 0 and nothing
    waits at a gate: the callback logs zeros, so runs compare side by side.

    Example:

    ```python
    strategy = tfdist.strategies.ParameterServerStrategy(mode="async", staleness=3)
    ...
    history = model.fit(x, y, epochs=5, callbacks=[tfdist.callbacks.StalenessMonitor()])
    history.history["staleness_max"]   # never above 3
    ```
    """

    def __init__(self):
        super().__init__()
        self._epoch_start = None

    def on_epoch_begin(self, epoch, logs=None):
        remote = model_strategy.staleness_source(self.model)
        if remote is not None:
            self._epoch_start = remote.snapshot()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        remote = model_strategy.staleness_source(self.model)
        statistics = (remote.statistics(since=self._epoch_start) if remote is not None else
                      {"staleness_mean": 0.0, "staleness_max": 0, "ps_wait_ms": 0.0})
        for key in ("staleness_mean", "staleness_max", "ps_wait_ms"):
            logs[key] = statistics[key]
