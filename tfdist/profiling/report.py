"""Communication measurements for Keras: the report behind the `tfdist/` scalars.

`CommunicationReport` turns a strategy's in-graph counters
(`tfdist.profiling.counters`) into numbers per training step over an
interval: it enables the counters (the training step is traced again once,
with the timing ops in it) and reads them only when asked, so the steps
between two reports add no host sync. `tfdist.callbacks.CommunicationMonitor`
puts the numbers in the logs; `TensorBoardScalars`, which tfdist adds next
to every `keras.callbacks.TensorBoard` (`keras_patches`), writes them into
that callback's run directory as `tfdist/...` scalars at its `update_freq`.
"""

import time

import keras
import tensorflow as tf

from tfdist.profiling.counters import measurements
from tfdist.profiling.names import CONFIGURATION_TAG, scalar_tag


class CommunicationReport:
    """Communication per training step since the previous `take()` (see the module docstring).

    Args:
        strategy: the model's tfdist strategy.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.counters = strategy.extended.communication_counters
        self._start = None

    @property
    def world_size(self):
        return self.strategy.world_size

    def start(self, model):
        """Enable the counters (tracing `model`'s train step again if it was traced without)."""
        if not self.counters.enabled:
            self.counters.enabled = True
            if model.train_function is not None:
                model.make_train_function(force=True)
        self._start = self._read()

    def take(self):
        """{name: value} per training step since the last `start`/`take`; {} if no step ran."""
        now = self._read()
        before, self._start = self._start, now
        if before is None:
            return {}
        counters_before, servers_before, clock_before = before
        counters_now, _, clock_now = now
        result = measurements(counters_before, counters_now, self.world_size,
                              clock_now - clock_before)
        for key in [k for k in result if k.startswith("server_")]:
            result[f"ps/{key}"] = result.pop(key)
        if result:  # the update mode's: staleness and gate waits of the asynchronous servers
            result.update(self.strategy.extended.updates.statistics(since=servers_before))
        return result

    def _read(self):
        return (self.counters.snapshot(), self.strategy.extended.updates.statistics_snapshot(),
                time.perf_counter())

    def describe(self):
        """One line: algorithm, engine, processes and servers (for a text summary)."""
        extended = self.strategy.extended
        cluster = self.strategy.cluster
        line = (f"{type(self.strategy).__name__}: aggregator {extended.aggregator.name} "
                f"on {extended.communicator.engine}, {cluster.world_size} processes")
        if extended.aggregator.num_servers:
            line += f", {extended.aggregator.num_servers} parameter servers"
        return line + f", launched by {cluster.launcher}"


class TensorBoardScalars(keras.callbacks.Callback):
    """Writes the `CommunicationReport` into a `TensorBoard` callback's run as `tfdist/...` scalars.

    Added by tfdist next to the user's `TensorBoard` on every rank (every
    rank must time its steps for the slowest-peer numbers); only the chief
    writes, into the same `train` run and at the same `update_freq` as
    Keras' own scalars: per batch N (step = the batch number) or per epoch
    (step = the epoch). Also writes one text summary, `tfdist/configuration`
    (`names.CONFIGURATION_TAG`).

    Args:
        strategy: the model's tfdist strategy.
        writer: a callable returning the `tf.summary` writer of the run.
        update_freq: the TensorBoard callback's `update_freq` ("epoch" or
            an integer number of batches).
    """

    def __init__(self, strategy, writer, update_freq):
        super().__init__()
        self._report = CommunicationReport(strategy)
        self._writes = strategy.is_chief
        self._writer = writer
        self._update_freq = update_freq
        self._batch = 0

    def on_train_begin(self, logs=None):
        self._report.start(self.model)
        self._batch = 0
        if self._writes:
            with self._writer().as_default(), tf.summary.record_if(True):
                tf.summary.text(CONFIGURATION_TAG, self._report.describe(), step=0)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch += 1

    def on_train_batch_end(self, batch, logs=None):
        if self._update_freq != "epoch" and self._batch % int(self._update_freq) == 0:
            self._write(self._batch)

    def on_epoch_end(self, epoch, logs=None):
        if self._update_freq == "epoch":
            self._write(epoch)

    def _write(self, step):
        values = self._report.take()
        if not self._writes or not values:
            return
        # Keras' own record_if (batch-level update_freq) must not drop these.
        with self._writer().as_default(), tf.summary.record_if(True):
            tf.summary.experimental.write_raw_pb(scalars_summary(values), step=step)


_DATA_CLASS_SCALAR = 1  # tensorflow/core/framework/summary.proto: DataClass.DATA_CLASS_SCALAR


def scalars_summary(values):
    """One serialized `Summary` with every value as a `tfdist/<name>` TensorBoard scalar.

    The same records `tf.summary.scalar` writes, written by one op instead of
    one op per value (0.2 ms instead of 1.5 ms for ten values).
    """
    metadata = tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=_DATA_CLASS_SCALAR)
    scalar = tf.make_tensor_proto(0.0, dtype=tf.float32)  # a float32 scalar's TensorProto
    return tf.compat.v1.Summary(value=[
        tf.compat.v1.Summary.Value(
            tag=scalar_tag(name), metadata=metadata,
            tensor=type(scalar)(dtype=scalar.dtype, tensor_shape=scalar.tensor_shape,
                                float_val=[value]))
        for name, value in values.items()]).SerializeToString()
