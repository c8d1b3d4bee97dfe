"""`DataParallelExtended`: the implementation of every tfdist strategy (`strategy.extended`).

One replica per process, as TensorFlow's `OneDeviceExtended` with the
process count as `num_replicas_in_sync`. It owns the process's communicator
and gradient aggregator (with its compression), the variables it creates
(broadcast from rank 0 or the creating rank's own, as the input mode has it;
their state made global by `LocalStateSync`), the reductions TensorFlow asks
of a strategy (`reduce`, `gather`, a replica context whose `all_reduce` is
exact for uneven and empty slices) and the dispatch of each step by its
`StepPlan`. What differs by mode it hands to the strategy's three mode
objects (`modes`), never asking which they are: the input mode cuts datasets
and creates variables, the optimizer-state mode checks compression, the
update mode plans and runs multi-process steps, agrees on flags, meets at
barriers and compares the ranks' data. What the layers above may use of it
is declared in `extended_interface.StrategyExtended`.
"""

import contextlib
import threading

import tensorflow as tf

from tfdist import _tf
from tfdist import runtime
from tfdist.aggregation.base import EXACT, GRADIENT
from tfdist.aggregation.compressors import with_compression
from tfdist.aggregation.single_process import SingleProcessAggregator
from tfdist.errors import ClusterError
from tfdist.fault_tolerance.agreed_flags import AgreedFlags
from tfdist.fault_tolerance.preemption import PreemptionNotice
from tfdist.profiling.counters import CommunicationCounters
from tfdist.strategies.state import rank_state
from tfdist.strategies.step import replica_step
from tfdist.strategies.state import save_records
from tfdist.strategies.step import step_plan
from tfdist.strategies.keras_surface import keras_internals, steps as keras_steps
from tfdist.strategies.step.cross_replica_sum import StepReplicaContext, sum_exactly
from tfdist.strategies.step.global_gradients import GlobalGradients
from tfdist.strategies.inputs.local_input import LocalSliceDataset
from tfdist.strategies.state.local_state import LocalStateSync
from tfdist.strategies.modes.interfaces import PlacementContext


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
    chief_saves: "object | None"  # a ChiefSaveService or ChiefSaveClient across hosts

    def __init__(self, container_strategy, make_aggregator, engine, engine_options, compression,
                 modes):
        self.input_mode = modes.input
        self.placement = modes.placement
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
        self.placement.check_compression(self.compression_name, self._cluster.rank)
        self.local_state = LocalStateSync(self, self._cluster.rank, self._cluster.world_size)
        self._cluster_resolver = _cluster_resolver(self._cluster)
        self.agreed_flags = AgreedFlags(self._cluster.world_size, self._cluster.rank)
        self.save_log = None  # the job's log of the chief's saves (several processes)
        self.chief_saves = None  # across hosts: the chief's saves served (`chief_saves`)
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
        self.placement.check_compression(getattr(aggregator, "compression_name", "none"),
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

    def placement_context(self):
        """What the placement reads of this strategy when an optimizer is built
        (`modes.interfaces.PlacementContext`)."""
        aggregator = self.aggregator
        buckets = getattr(aggregator, "bucket_bytes", None)
        return PlacementContext(
            communicator=self.communicator,
            bucket_bytes=(None if buckets is None
                          else (buckets, getattr(aggregator, "first_bucket_bytes", buckets))),
            rank_local_variables=self.rank_local_variables,
            counters=self.communication_counters)

    def _create_variable(self, next_creator, **kwargs):
        """A variable of this strategy, its initial value as the input mode has it (rank 0's,
        broadcast; or the creating rank's own until synchronized)."""
        if self._one_process or getattr(self._rank_local, "active", False):
            return super()._create_variable(next_creator, **kwargs)
        if (self.input_mode.random_state_is_rank_own
                and keras_internals.is_seed_generator_state(kwargs)):
            with self.rank_local_variables():  # each rank draws its own masks
                return super()._create_variable(next_creator, **kwargs)
        kwargs = self.input_mode.creating_variable(kwargs, self._communicator)
        variable = self.placement.create(
            lambda placed: super(DataParallelExtended, self)._create_variable(next_creator,
                                                                              **placed),
            kwargs, self._communicator)
        return self.local_state.track(variable)

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
        if step is not None and (step.gradients_aggregated or step.made_global_at_tape(values)):
            return values  # already summed by aggregate_gradients, or by the step's tape
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
