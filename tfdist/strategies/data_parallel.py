"""`DataParallelStrategy`: one replica per process, gradients summed by an aggregator.

This is the base of every tfdist strategy. It is a `tf.distribute.Strategy`
(a `OneDeviceStrategy` whose replica count is the number of processes), so
Keras 3's `model.fit`, `evaluate` and `predict` run on it unchanged:

* Three modes, each one object chosen at construction (`modes`): the input
  (`GlobalBatchInput`: `experimental_distribute_dataset` gives each process
  its slice of every global batch, of any size, as a plain `tf.data`
  dataset - `local_input`, no `MultiDeviceIterator`; or `PerRankInput`,
  Horovod's semantics), the optimizer's state (replicated or sharded) and
  the update (synchronous or asynchronous parameter servers).
* Each step computes its losses as means over its slice and weights what it
  contributes by its share of the global batch (`replica_step`); the
  optimizer receives the share-weighted sum of every rank's gradients,
  summed by the pluggable `Aggregator` (dense) or gathered (IndexedSlices),
  *before* clipping, loss-scale checks or accumulation, so the update equals
  single-process training on the global batch for any split.
* Variables created under `scope()` start from rank 0's value (broadcast;
  per-rank input: the creating rank's own until synchronized).
* Metric state and layer statistics are made global after every step
  (`local_state.LocalStateSync`), so logs are global and identical on all ranks.
* `predict` outputs are gathered in rank order, so every rank gets all rows.
* Communication runs under `tfdist/...` name scopes and, when a
  `CommunicationMonitor` or a Keras `TensorBoard` callback asks for it,
  is timed and counted inside the training step (`communication_counters`).
* One process (and no dedicated parameter server) runs Keras' own step with
  the `SingleProcessCommunicator` and `SingleProcessAggregator` (identities):
  the same code, nothing added to the step.

Subclasses choose the aggregation hook (`make_aggregator`) and the modes
(`optimizer_state`, `updates`).
"""

from tfdist import _tf
from tfdist import chief_log, runtime
from tfdist.fault_tolerance.checkpoint_files import install_private_checkpoint_writes
from tfdist.process_setup import joined_strategy
from tfdist.strategies import keras_patches, modes
from tfdist.strategies.core import job_summary
from tfdist.strategies.core.extended import DataParallelExtended
from tfdist.strategies.keras_surface import model_strategy
from tfdist.strategies.state import chief_saves, save_records
from tfdist.strategies.step import average_loss


class DataParallelStrategy(_tf.OneDeviceStrategy):
    """Synchronous data parallelism across processes with a pluggable aggregator.

    One replica per process; `num_replicas_in_sync` is the number of training
    processes. Use a concrete subclass (`RingAllReduceStrategy`,
    `ReductionTreeStrategy`, `ParameterServerStrategy`) or pass
    `make_aggregator`, a callable taking the process's communicator and
    returning a `tfdist.aggregation.Aggregator`.

    Args:
        make_aggregator: communicator -> `tfdist.aggregation.Aggregator`.
        engine: the communicator's engine, "collective" (TensorFlow
            collectives) or "horovod" (see `tfdist.runtime`).
        engine_options: keyword arguments for `tfdist.runtime.communicator`.
        compression: gradient compression on the wire: None, "none", a
            name of `tfdist.aggregation.compressors.COMPRESSORS` ("fp16",
            "powersgd", "topk", "signsgd") or a `tfdist.compression` object
            (e.g. `tfdist.compression.TopK(ratio=0.001)`).
        per_rank_input: each rank's data is its own (Horovod's semantics): `fit`'s
            `batch_size` and a dataset's batches are per rank, the global batch is every
            rank's together (weighted by rows, so equal to one process on the concatenated
            batches), nothing is sliced, predictions stay on their rank; a variable is the
            creating rank's own until synchronized (`fit` starts from rank 0's; a custom loop
            broadcasts them itself, as Horovod's scripts do). Default False: every rank
            passes the same global data and takes its slice, and every variable starts from
            rank 0's value when it is created.
        engine_reason: why the engine was chosen, for the start-up line
            (`RingAllReduceStrategy(backend="auto")` gives it).
        optimizer_state: the `tfdist.strategies.modes.Placement` (a subclass's
            choice; default: the whole state on every rank).
        updates: the `tfdist.strategies.modes.UpdateMode` (a subclass's choice; default:
            every rank in every step).

    Example:

    ```python
    strategy = tfdist.strategies.RingAllReduceStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=256, epochs=3)   # 256 = global batch size
    ```
    """

    is_tfdist_data_parallel = True  # how `keras_surface.model_strategy` tells it (no import)

    def __init__(self, make_aggregator, engine="collective", engine_options=None,
                 compression=None, per_rank_input=False, engine_reason=None, *,
                 optimizer_state=None, updates=None):
        keras_patches.install()
        chosen = modes.choose(per_rank_input, optimizer_state, updates)
        extended = DataParallelExtended(self, make_aggregator, engine, engine_options or {},
                                        compression, chosen)
        # Bypass OneDeviceStrategy.__init__ (it builds its own extended object).
        super(_tf.OneDeviceStrategy, self).__init__(extended)  # pylint: disable=bad-super-call
        if self.world_size > 1:
            model_strategy.note_multi_process_strategy(self)
            joined_strategy.note_joined(self.rank)
            install_private_checkpoint_writes()
            average_loss.install(lambda step: step.scaled_by_user)
            extended.input_mode.start(extended)
            extended.save_log = save_records.JobSaveLog.agreed(extended.communicator)
            extended.chief_saves = chief_saves.agreed(self.cluster, extended.communicator)
            if extended.chief_saves is not None:
                runtime.close_at_exit(extended.chief_saves)
        chief_log.info(self.is_chief, "%s", job_summary.start_up_line(self, engine_reason),
                       once=True)

    @property
    def rank(self):
        """Index of this training process (0 is the chief)."""
        return self.extended._cluster.rank  # pylint: disable=protected-access

    @property
    def world_size(self):
        """Number of training processes (= `num_replicas_in_sync`)."""
        return self.extended._cluster.world_size  # pylint: disable=protected-access

    @property
    def is_chief(self):
        """True on the process that prints progress and writes checkpoints."""
        return self.extended._cluster.is_chief  # pylint: disable=protected-access

    @property
    def cluster(self):
        """This process's `tfdist.process_setup.cluster.Cluster`."""
        return self.extended._cluster  # pylint: disable=protected-access
