"""`CommunicationMonitor`: where the step time goes - communication, bandwidth, stragglers - in the logs."""

from typing import Union

import keras

from tfdist.profiling.report import CommunicationReport
from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class CommunicationMonitor(keras.callbacks.Callback):
    """Add this rank's communication per training step to the logs (and so to `History`).

    Every communication of the training step (the aggregation algorithm's
    buckets, gathered sparse gradients, parameter-server pulls and pushes,
    the stop-flag exchange) is timed inside the compiled step, with no host
    sync per step (`tfdist.profiling.counters`); this callback reads the
    counters at the end of every epoch (or every `update_freq` batches) and
    adds the means per step since its previous read:

    * `comm_ms`: time in communication; `step_ms`: wall time of a step;
      `comm_share`: their ratio;
    * `sent_mb`: megabytes this rank put on the wire;
    * `algbw_gbps`, `busbw_gbps`: algorithm and bus bandwidth in GB/s, as
      nccl-tests reports them (bytes aggregated / time; x 2 (P - 1) / P);
    * `wait_ms`: time this rank waited for the slowest rank, and
      `slowest_rank`: the rank that was slowest most often (when every rank
      times its steps, i.e. every rank has this callback or a `TensorBoard`);
    * parameter server: `ps/server_<k>_mb`, megabytes sent to server k; in
      asynchronous mode also `ps/staleness_mean`, `ps/staleness_max`,
      `ps/wait_ms` (see `StalenessMonitor`).

    A `keras.callbacks.TensorBoard` in the callbacks gets the same numbers as
    `tfdist/...` scalars in its run without this callback. On one process
    nothing communicates and nothing is added. Enabling the counters traces
    the training step once more, with two timestamps per communication.

    Args:
        update_freq: "epoch" (add epoch means to the epoch logs) or an integer
            N (also add the means of the last N batches to every Nth batch's logs).

    Example:

    ```python
    history = model.fit(x, y, batch_size=256, epochs=5,
                        callbacks=[tfdist.callbacks.CommunicationMonitor()])
    history.history["comm_ms"], history.history["wait_ms"]
    ```
    """

    def __init__(self, update_freq: Union[str, int] = "epoch"):
        super().__init__()
        if update_freq != "epoch" and (isinstance(update_freq, bool) or not isinstance(
                update_freq, int) or update_freq < 1):
            raise ValueError(f"update_freq must be 'epoch' or a positive integer. "
                             f"Got: update_freq={update_freq!r}")
        self.update_freq = update_freq
        self._batches = None  # a report since the last Nth batch
        self._epoch = None  # a report since the epoch began

    def on_train_begin(self, logs=None):
        strategy = model_strategy.tfdist_strategy(self.model)
        if strategy is None or not strategy.extended.aggregator.communicates:
            self._epoch = self._batches = None
            return
        self._epoch = CommunicationReport(strategy)
        self._epoch.start(self.model)
        if self.update_freq != "epoch":
            self._batches = CommunicationReport(strategy)
            self._batches.start(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        if self._epoch is not None:
            self._epoch.take()  # the epoch's numbers start here

    def on_train_batch_end(self, batch, logs=None):
        if self._batches is not None and logs is not None and (batch + 1) % self.update_freq == 0:
            logs.update(_log_names(self._batches.take()))

    def on_epoch_end(self, epoch, logs=None):
        if self._epoch is not None and logs is not None:
            logs.update(_log_names(self._epoch.take()))


def _log_names(values):
    return {name.replace("/", "_"): value for name, value in values.items()}
