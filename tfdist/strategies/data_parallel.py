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

import contextlib
import threading

import tensorflow as tf

from tfdist import _tf
from tfdist import chief_log
from tfdist import runtime
from tfdist.aggregation.base import EXACT, GRADIENT
from tfdist.aggregation.compressors import with_compression
from tfdist.aggregation.single_process import SingleProcessAggregator
from tfdist.errors import ClusterError
from tfdist.fault_tolerance.agreed_flags import AgreedFlags
from tfdist.fault_tolerance.checkpoint_files import install_private_checkpoint_writes
from tfdist.fault_tolerance.preemption import PreemptionNotice
from tfdist.process_setup import joined_strategy
from tfdist.profiling.counters import CommunicationCounters
from tfdist.strategies import average_loss, job_summary, modes, rank_state, replica_step
from tfdist.strategies import save_records, step_plan
from tfdist.strategies import keras_patches
from tfdist.strategies.keras_patches import model_strategy
from tfdist.strategies.keras_patches import steps as keras_steps
from tfdist.strategies.cross_replica_sum import StepReplicaContext, sum_exactly
from tfdist.strategies.global_gradients import GlobalGradients
from tfdist.strategies.local_input import LocalSliceDataset
from tfdist.strategies.local_state import LocalStateSync


def _local_device(cluster):
    """This process's device: its one visible GPU (`gpu_placement` left only that one), or of
    several a script made visible itself, the one of its local rank; else the CPU."""
    gpus = tf.config.get_visible_devices("GPU")
    if gpus:
        return f"/device:GPU:{cluster.local_rank % len(gpus) if len(gpus) > 1 else 0}"
    return "/device:CPU:0"


class DataParallelExtended(_tf.OneDeviceExtended):
    """The strategy's implementation (`strategy.extended`): the process's communicator and
    aggregator, its variables, reductions and steps, and the strategy's three modes
    (`modes`), which it calls without asking which they are. What other layers may use of it
    is declared by `extended_interface.StrategyExtended`.

    Args:
        container_strategy: the `DataParallelStrategy` this implements.
        make_aggregator: communicator -> `tfdist.aggregation.Aggregator`.
        engine, engine_options: the communicator's (`tfdist.runtime.communicator`).
        compression: gradient compression on the wire (`with_compression`).
        modes: the strategy's `tfdist.strategies.modes.Modes`.
    """

    _aggregator_built = False  # an optimizer built the aggregation hook's state
    communication_counters: CommunicationCounters  # set in __init__
    agreed_flags: AgreedFlags  # set in __init__
    preemption: PreemptionNotice  # set in __init__
    save_log: "save_records.JobSaveLog | None"  # set in __init__ and by the strategy

    def __init__(self, container_strategy, make_aggregator, engine, engine_options, compression,
                 modes):
        self.input_mode = modes.input
        self.optimizer_state = modes.optimizer_state
        self.updates = modes.updates
        self._cluster = runtime.cluster()
        if self._cluster.is_server:
            raise ClusterError(
                "tfdist: this process was started as a parameter server, not a worker; "
                "only training processes create a strategy."
            )
        self._communicator = runtime.communicator(engine, **engine_options)
        self._cluster = runtime.cluster()  # now with addresses exchanged, if they were
        super().__init__(container_strategy, _local_device(self._cluster))
        # One process runs Keras' own step: no share weighting, no state to make global.
        self._one_process = self._cluster.world_size == 1
        # Dedicated parameter servers take part even with one worker.
        if self._one_process and not self._cluster.server_addresses:
            self._plain_aggregator = SingleProcessAggregator()
        else:
            self._plain_aggregator = runtime.close_at_exit(make_aggregator(self._communicator))
        self.communication_counters = CommunicationCounters(
            self._cluster.rank, self._cluster.world_size, self._plain_aggregator.num_servers)
        self._use_aggregator(with_compression(self._plain_aggregator, compression))
        self.optimizer_state.check_compression(self.compression_name, self._cluster.rank)
        self.local_state = LocalStateSync(self, self._cluster.rank, self._cluster.world_size)
        self._cluster_resolver = _cluster_resolver(self._cluster)
        self.agreed_flags = AgreedFlags(self._cluster.world_size, self._cluster.rank)
        self.save_log = None  # the job's log of the chief's saves (several processes)
        self.preemption = PreemptionNotice(self.agreed_flags, self._cluster.rank,
                                           self._cluster.timeout)
        self._rank_local = threading.local()
        self.updates.attach(self)

    def _use_aggregator(self, aggregator):
        self._aggregator = aggregator
        if aggregator.communicates:
            aggregator.counters = self.communication_counters
        self.gradients = GlobalGradients(aggregator, self._communicator,
                                         self.communication_counters)

    def set_compression(self, compression):
        """Compress gradients on the wire with `compression` from now on (a name or a
        `tfdist.compression` object; None: none): Horovod's `DistributedOptimizer(compression=...)`
        chooses it after the strategy exists. Once an optimizer of this strategy was built, only
        stateless compressions ("none", "fp16") may replace each other: a stateful one's error
        feedback would be lost."""
        aggregator = with_compression(self._plain_aggregator, compression)
        self.optimizer_state.check_compression(getattr(aggregator, "compression_name", "none"),
                                               self._cluster.rank)
        stateless = {"none", "fp16"}
        names = {self.compression_name, getattr(aggregator, "compression_name", "none")}
        if self._aggregator_built and not names <= stateless:
            raise ValueError(
                f"tfdist rank {self._cluster.rank}: the gradient compression can change only "
                "before an optimizer of this strategy is built (create the optimizer, e.g. "
                "hvd.DistributedOptimizer(..., compression=...), before compile and fit). "
                f"Got: compression={compression!r} after training started with "
                f"{self.compression_name!r}.")
        self._use_aggregator(aggregator)

    @property
    def communicator(self):
        """This process's `tfdist.comm.base.Communicator` (an identity for one process)."""
        return self._communicator

    @property
    def compression_name(self):
        """The compression of gradients on the wire ("none", "fp16", ...)."""
        return getattr(self._aggregator, "compression_name", "none")

    @property
    def aggregator(self):
        """The gradient-aggregation hook (`tfdist.aggregation.base.Aggregator`)."""
        return self._aggregator

    def build_aggregator_state(self, optimizer, variables):
        """The hook's state for `variables`, as `optimizer`'s variables (`Aggregator.build`):
        created from rank 0's value, then each rank's own (never averaged across ranks)."""
        self._aggregator_built = True
        before = {id(v) for v in optimizer.variables}
        with self.local_state.rank_own_variables():
            self._aggregator.build(optimizer, variables)
        own = {id(v) for v in self._aggregator.rank_variables}
        rank_state.remember(optimizer, [v for v in optimizer.variables
                                        if id(v) not in before and id(v) in own])

    def fit_callbacks(self):
        """The modes' callbacks of every fit / evaluate / predict: the update mode's, then the
        input mode's (after every other callback's hooks)."""
        strategy = self._container_strategy()
        return self.updates.fit_callbacks(strategy) + self.input_mode.fit_callbacks(strategy)

    # ------------------------------------------------------------- topology
    @property
    def _num_replicas_in_sync(self):
        return self._cluster.world_size

    @property
    def should_checkpoint(self):
        return self._cluster.is_chief

    @property
    def should_save_summary(self):
        return self._cluster.is_chief

    # ------------------------------------------------------------ variables
    @contextlib.contextmanager
    def rank_local_variables(self):
        """Variables created inside are this rank's own from the start: not broadcast from
        rank 0 (their shapes may differ per rank: a sharded optimizer's slices) and never
        made global."""
        previous = getattr(self._rank_local, "active", False)
        self._rank_local.active = True
        try:
            with self.local_state.rank_own_variables():
                yield
        finally:
            self._rank_local.active = previous

    def _create_variable(self, next_creator, **kwargs):
        """A variable of this strategy, its initial value as the input mode has it (rank 0's,
        broadcast; or the creating rank's own until synchronized)."""
        if self._one_process or getattr(self._rank_local, "active", False):
            return super()._create_variable(next_creator, **kwargs)
        kwargs = self.input_mode.creating_variable(kwargs, self._broadcast_initial_value)
        variable = super()._create_variable(next_creator, **kwargs)
        return self.local_state.track(variable)

    def _broadcast_initial_value(self, kwargs):
        initial_value = kwargs["initial_value"]
        dtype = kwargs.get("dtype")
        name = kwargs.get("name")
        communicator = self._communicator

        def from_rank_zero():
            # A variable created inside a tf.function (an optimizer's slots built by the first
            # `apply_gradients` in `strategy.run`) is initialized by calling this in the
            # function's graph; an initializer callable is evaluated eagerly instead, so the
            # broadcast (eager, once, when every rank traces the function) can use its value.
            with tf.init_scope():
                value = initial_value() if callable(initial_value) else initial_value
                value = getattr(value, "wrapped_value", value)  # CheckpointInitialValue
                if not tf.is_symbolic_tensor(value):
                    return self._checked_broadcast(
                        communicator, tf.convert_to_tensor(value, dtype=dtype), name)
            # A tensor of the function being traced: broadcast inside it.
            return self._checked_broadcast(communicator, tf.convert_to_tensor(value, dtype=dtype),
                                           name)

        return from_rank_zero

    def _checked_broadcast(self, communicator, value, name):
        """Broadcast from rank 0, failing clearly if ranks built different variables."""
        rank = communicator.rank
        signature = tf.constant([value.shape.rank] + value.shape.as_list()
                                + [value.dtype.as_datatype_enum], dtype=tf.int64)
        signature = tf.pad(signature, [[0, 16 - tf.size(signature)]])
        root_signature = communicator.broadcast(signature)
        if not bool(tf.reduce_all(tf.equal(root_signature, signature))):
            raise ValueError(
                f"tfdist rank {rank}: variable {name!r} has shape {value.shape} and dtype "
                f"{value.dtype.name} here but a different shape or dtype on rank 0 "
                "(root signature "
                f"{root_signature.numpy().tolist()}): every rank must build the same model."
            )
        return communicator.broadcast(value)

    # ---------------------------------------------------------- reductions
    def all_reduce_sum(self, values):
        """The sum over the ranks of `values`, through the aggregator."""
        return self._aggregator.all_reduce(values)

    def _reduce_to(self, reduce_op, value, destinations, options):
        del destinations, options
        return self.gradients.all_reduce([value], EXACT, reduce_op)[0]

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        # Gradients reduced outside a tfdist step (a user's own loop) arrive here.
        del options
        values = [v for v, _ in value_destination_pairs]
        step = replica_step.current()
        if step is not None and step.gradients_aggregated:
            return values  # already summed by aggregate_gradients
        return self.gradients.all_reduce(values, GRADIENT, reduce_op)

    def push_gradients(self, optimizer, gradients, variables, weighted_in_loss):
        """In a `REMOTE` step: the gradients to the servers (the update mode's)."""
        return self.updates.push_gradients(optimizer, gradients, variables, weighted_in_loss)

    def aggregate_gradients(self, gradients, variables=None, weighted_in_loss=False,
                            scatter_to=None):
        """The global batch's gradients from this rank's, now (`global_gradients`)."""
        return self.gradients.aggregate(gradients, variables, weighted_in_loss, scatter_to)

    def _gather_to_implementation(self, value, destinations, axis, options):
        del destinations, options
        value = tf.convert_to_tensor(value)
        if axis == 0:
            return self._communicator.all_gather(value)
        perm = [axis] + [i for i in range(value.shape.rank) if i != axis]
        gathered = self._communicator.all_gather(tf.transpose(value, perm))
        inverse = [perm.index(i) for i in range(value.shape.rank)]
        return tf.transpose(gathered, inverse)

    # --------------------------------------------------------------- input
    def _experimental_distribute_dataset(self, dataset, options):
        """This process's part of every batch, iterated directly (`local_input`), as the input
        mode cuts it (and the update mode reads it).

        `options` (`tf.distribute.InputOptions`) are about per-device buffers,
        which a one-device process does not create; they are ignored.
        """
        del options
        return self.updates.distribute_dataset(
            dataset, lambda d: self.input_mode.distribute_dataset(d, self._cluster))

    def _distribute_datasets_from_function(self, dataset_fn, options):
        """`dataset_fn(input_context)`: the user's own per-process pipeline, iterated directly."""
        del options
        cluster = self._cluster
        context = tf.distribute.InputContext(cluster.world_size, cluster.rank, cluster.world_size)
        return LocalSliceDataset(dataset_fn(context))

    def check_same_data(self, num_batches, fingerprint=None, signature=None):
        """Fail clearly when ranks were given different data or arguments (`same_data_check`;
        the update mode's: workers not in step compare nothing)."""
        self.updates.check_same_data(num_batches, fingerprint, signature)

    def epoch_data_scope(self, training):
        """Context in which Keras builds an epoch iterator (`training`: fit's own)."""
        return self.updates.epoch_data_scope(training)

    # ------------------------------------------------------------ agreement
    def any_rank(self, flag, training=False):
        """True on every rank if `flag` is true on any rank (eager; one tiny all-reduce).

        `training`: the exchange belongs to training (fit's `stop_training`):
        its time counts as training communication (`communication_counters`).
        """
        return self.any_rank_each([flag], training)[0]

    def any_rank_each(self, flags, training=False):
        """`any_rank` of each of several flags, in one exchange (the update mode's)."""
        return self.updates.any_rank_each(flags, training)

    def barrier(self, what):
        """Every rank waits for the others, bounded by the job timeout (a late rank is named,
        with `what` it was waited for)."""
        self.updates.barrier(what)

    # ---------------------------------------------------------------- steps
    def _call_for_each_replica(self, fn, args, kwargs):
        if replica_step.current() is not None:
            # A merge_call inside a step (LossScaleOptimizer's apply) returning to the
            # replica: part of the step being traced.
            return self.in_replica_context(fn, args, kwargs)
        plan = self.plan_step(fn)
        if plan.updates == step_plan.LOCAL:
            return self.in_replica_context(fn, args, kwargs)
        with (self.communication_counters.recording() if plan.training
              else contextlib.nullcontext()):
            return self.updates.run_step(fn, args, kwargs, plan)

    def plan_step(self, fn):
        """The `step_plan.StepPlan` of a step running `fn`, decided once as it is traced."""
        return self.updates.plan_step(
            one_process=self._one_process,
            is_keras_train_step=keras_steps.is_keras_train_step(fn),
            is_train_step=keras_steps.is_train_step(fn),
            # A user's own function (a custom loop's `strategy.run(train_step)`) scales its
            # loss itself, as MultiWorkerMirroredStrategy's contract has it, and sees its
            # slice as it is; Keras' steps compute per-slice means that tfdist weights.
            is_user_function=(keras_steps.model_of_step(fn) is None
                              and not keras_steps.is_predict_step(fn)))

    def in_replica_context(self, fn, args, kwargs):
        """`fn` in this process's replica context (`replica_context`)."""
        with self.replica_context():
            return fn(*args, **kwargs)

    @contextlib.contextmanager
    def replica_context(self):
        """This process's replica context, numbered as MultiWorkerMirroredStrategy does.

        `tf.distribute.get_replica_context().replica_id_in_sync_group` is
        this process's rank (a custom loop may seed or shard by it); its
        `all_reduce` is exact for uneven and empty slices (`cross_replica_sum`),
        and outside a step sums over the ranks through the strategy's gradient
        path (Keras' optimizer applied in a custom loop without `strategy.run`).
        """
        with tf.device(self._device), StepReplicaContext(
                self._container_strategy(), self._cluster.rank,
                sum_exactly(self.gradients.all_reduce)):
            yield

    def _get_local_replica_id(self, replica_id_in_sync_group):
        del replica_id_in_sync_group
        return 0  # one replica per process

    def _experimental_distribute_values_from_function(self, value_fn):
        """`value_fn(ValueContext)` for this process's replica (its rank of the world size)."""
        return value_fn(tf.distribute.experimental.ValueContext(
            replica_id_in_sync_group=self._cluster.rank,
            num_replicas_in_sync=self._cluster.world_size))


def _cluster_resolver(cluster):
    """`strategy.cluster_resolver`: this process as MultiWorkerMirroredStrategy describes it.

    Task type "worker", task id = rank, and the job's workers (and
    parameter servers, as "ps") where their addresses are known; code
    written for MultiWorkerMirroredStrategy reads who is chief from it.
    """
    jobs = {}
    if len(cluster.worker_addresses) == cluster.world_size:
        jobs["worker"] = list(cluster.worker_addresses)
    if cluster.server_addresses:
        jobs["ps"] = list(cluster.server_addresses)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs), task_type="worker", task_id=cluster.rank, rpc_layer="grpc")


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
        optimizer_state: the `tfdist.strategies.modes.OptimizerStateMode` (a subclass's
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

    is_tfdist_data_parallel = True  # how `keras_patches.model_strategy` tells it (no import)

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
