"""`DataParallelStrategy`: one replica per process, gradients summed by an aggregator.

This is the base of every tfdist strategy. It is a `tf.distribute.Strategy`
(a `OneDeviceStrategy` whose replica count is the number of processes), so
Keras 3's `model.fit`, `evaluate` and `predict` run on it unchanged:

* `experimental_distribute_dataset` gives each process its slice of every
  global batch (`sharding.shard_global_batch`), of any size, as a plain
  `tf.data` dataset (`local_input`: no `MultiDeviceIterator`); with
  `per_rank_input` (Horovod's semantics, `tfdist.horovod.keras`) each
  process's data is its own and the global batch is every rank's batches
  together: nothing is sliced, arrays are not compared across ranks,
  predictions stay on their rank, and random state is each rank's own.
* Each step computes its losses as means over its slice and weights what it
  contributes by its share of the global batch (`replica_step`); the
  optimizer receives the share-weighted sum of every rank's gradients,
  summed by the pluggable `Aggregator` (dense) or gathered (IndexedSlices),
  *before* clipping, loss-scale checks or accumulation, so the update equals
  single-process training on the global batch for any split.
* Variables created under `scope()` start from rank 0's value (broadcast).
* Metric state and layer statistics are made global after every step
  (`local_state.LocalStateSync`), so logs are global and identical on all ranks.
* `predict` outputs are gathered in rank order, so every rank gets all rows.
* Communication runs under `tfdist/...` name scopes and, when a
  `CommunicationMonitor` or a Keras `TensorBoard` callback asks for it,
  is timed and counted inside the training step (`communication_counters`).
* One process (and no dedicated parameter server) runs Keras' own step with
  the `SingleProcessCommunicator` and `SingleProcessAggregator` (identities):
  the same code, nothing added to the step.

Subclasses choose the aggregation hook (`make_aggregator`); the asynchronous
parameter server also its own step (`extended_class`, `asynchronous`).
"""

import contextlib
import threading
import time

import tensorflow as tf

from tfdist import _tf
from tfdist import chief_log
from tfdist import runtime
from tfdist.aggregation.base import EXACT, GRADIENT
from tfdist.aggregation.compressors import with_compression
from tfdist.aggregation.single_process import SingleProcessAggregator
from tfdist.errors import ClusterError
from tfdist.profiling.counters import CommunicationCounters
from tfdist.profiling.names import communication_scope
from tfdist.strategies import average_loss, call_arguments, rank_state, save_records
from tfdist.strategies import keras_patches
from tfdist.strategies.keras_patches import empty_slices
from tfdist.strategies.keras_patches import steps as keras_steps
from tfdist.strategies.keras_patches import model_strategy
from tfdist.process_setup import joined_strategy
from tfdist.strategies import empty_slice, job_summary, replica_step, step_plan
from tfdist.fault_tolerance.agreed_flags import AgreedFlags
from tfdist.strategies.batch_dependence import BatchLineage
from tfdist.fault_tolerance.checkpoint_files import install_private_checkpoint_writes
from tfdist.strategies.cross_replica_sum import StepReplicaContext, sum_exactly
from tfdist.strategies.global_gradients import GlobalGradients
from tfdist.strategies.local_input import LocalSliceDataset, derives_from_local_slice
from tfdist.strategies.local_state import LocalStateSync
from tfdist.fault_tolerance.preemption import PreemptionNotice
from tfdist.strategies.random_state import align_random_state
from tfdist.strategies.sharded_optimizer_state import check_shardable_compression
from tfdist.strategies.sharding import batch_rows, leading_rows, shard_global_batch


def _local_device(cluster):
    """This process's device: its one visible GPU (`gpu_placement` left only that one), or of
    several a script made visible itself, the one of its local rank; else the CPU."""
    gpus = tf.config.get_visible_devices("GPU")
    if gpus:
        return f"/device:GPU:{cluster.local_rank % len(gpus) if len(gpus) > 1 else 0}"
    return "/device:CPU:0"


class DataParallelExtended(_tf.OneDeviceExtended):
    """The strategy's implementation (`strategy.extended`); what other layers may use of it is
    declared by `extended_interface.StrategyExtended`."""

    # Training steps go to asynchronous parameter servers, through `remote_updates` (the
    # worker's client): `asynchronous.AsynchronousExtended`.
    asynchronous = False
    remote_updates = None
    _aggregator_built = False  # an optimizer built the aggregation hook's state
    # Optimizer state sharded across the ranks (ZeRO stage 1, `sharded_optimizer_state`);
    # set by `RingAllReduceStrategy(shard_optimizer_state=True)`.
    shard_optimizer_state = False
    per_rank_input = False  # each rank's data is its own (Horovod's semantics); set in __init__
    communication_counters: CommunicationCounters  # set in __init__
    agreed_flags: AgreedFlags  # set in __init__
    preemption: PreemptionNotice  # set in __init__
    save_log: "save_records.JobSaveLog | None"  # set in __init__ and by the strategy

    def __init__(self, container_strategy, make_aggregator, engine, engine_options, compression,
                 per_rank_input=False):
        self.per_rank_input = bool(per_rank_input)
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
        self._local_state = LocalStateSync(self, self._cluster.rank,
                                           self._cluster.world_size)
        self._cluster_resolver = _cluster_resolver(self._cluster)
        self._any_rank_functions = {}  # number of flags -> compiled exchange
        self.agreed_flags = AgreedFlags(self._cluster.world_size, self._cluster.rank)
        self.save_log = None  # the job's log of the chief's saves (several processes)
        self.preemption = PreemptionNotice(self.agreed_flags, self._cluster.rank,
                                           self._cluster.timeout)
        self._rank_local = threading.local()

    def _use_aggregator(self, aggregator):
        self._aggregator = aggregator
        if aggregator.communicates:
            aggregator.counters = self.communication_counters
        self._gradients = GlobalGradients(aggregator, self._communicator,
                                          self.communication_counters)

    def set_compression(self, compression):
        """Compress gradients on the wire with `compression` from now on (a name or a
        `tfdist.compression` object; None: none): Horovod's `DistributedOptimizer(compression=...)`
        chooses it after the strategy exists. Once an optimizer of this strategy was built, only
        stateless compressions ("none", "fp16") may replace each other: a stateful one's error
        feedback would be lost."""
        aggregator = with_compression(self._plain_aggregator, compression)
        if self.shard_optimizer_state:
            check_shardable_compression(getattr(aggregator, "compression_name", "none"),
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
        with self._local_state.rank_own_variables():
            self._aggregator.build(optimizer, variables)
        own = {id(v) for v in self._aggregator.rank_variables}
        rank_state.remember(optimizer, [v for v in optimizer.variables
                                        if id(v) not in before and id(v) in own])

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
            with self._local_state.rank_own_variables():
                yield
        finally:
            self._rank_local.active = previous

    def _create_variable(self, next_creator, **kwargs):
        """A variable of this strategy: broadcast from rank 0 when created, so every rank
        starts alike; under per-rank input (Horovod's semantics) the creating rank's own
        until synchronized (`fit`'s start, Horovod's `broadcast_variables`), so a variable
        one rank creates alone (an optimizer, a checkpoint's counter, a model saved or loaded
        on rank 0) waits for no other rank."""
        if self._one_process or getattr(self._rank_local, "active", False):
            return super()._create_variable(next_creator, **kwargs)
        if (not self.per_rank_input
                and kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ):
            kwargs["initial_value"] = self._broadcast_initial_value(kwargs)
        variable = super()._create_variable(next_creator, **kwargs)
        return self._local_state.track(variable)

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
    def _all_reduce_sum(self, values):
        return self._aggregator.all_reduce(values)

    def _reduce_to(self, reduce_op, value, destinations, options):
        del destinations, options
        return self._gradients.all_reduce([value], EXACT, reduce_op)[0]

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        # Gradients reduced outside a tfdist step (a user's own loop) arrive here.
        del options
        values = [v for v, _ in value_destination_pairs]
        step = replica_step.current()
        if step is not None and step.gradients_aggregated:
            return values  # already summed by aggregate_gradients
        return self._gradients.all_reduce(values, GRADIENT, reduce_op)

    def push_gradients(self, optimizer, gradients, variables, weighted_in_loss):
        """Only the asynchronous parameter server's steps push (`AsynchronousExtended`)."""
        raise NotImplementedError(
            f"{type(self).__name__} sums gradients in its step; only the asynchronous parameter "
            "server pushes them to servers")

    def aggregate_gradients(self, gradients, variables=None, weighted_in_loss=False,
                            scatter_to=None):
        """The global batch's gradients from this rank's, now (`global_gradients`)."""
        return self._gradients.aggregate(gradients, variables, weighted_in_loss, scatter_to)

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
        """This process's slice of every global batch, iterated directly (`local_input`).

        `options` (`tf.distribute.InputOptions`) are about per-device buffers,
        which a one-device process does not create; they are ignored.
        """
        del options
        if self.per_rank_input:  # each rank's data is its own (Horovod's semantics)
            return dataset if isinstance(dataset, LocalSliceDataset) else LocalSliceDataset(dataset)
        if derives_from_local_slice(dataset):
            # Distributed already (a user's call before model.fit, perhaps mapped by Keras).
            return dataset if isinstance(dataset, LocalSliceDataset) else LocalSliceDataset(dataset)
        cluster = self._cluster
        policy = dataset.options().experimental_distribute.auto_shard_policy
        if cluster.world_size > 1 and policy == tf.data.experimental.AutoShardPolicy.FILE:
            context = tf.distribute.InputContext(cluster.world_size, cluster.rank,
                                                 cluster.world_size)
            return LocalSliceDataset(_shard_files(dataset, context))
        return LocalSliceDataset(shard_global_batch(dataset, cluster.rank, cluster.world_size))

    def check_same_data(self, num_batches, fingerprint=None, signature=None):
        """Fail clearly when ranks were given different data or arguments (a silent mismatch
        otherwise).

        Each rank must pass the same global data, with the same arguments, to
        fit/evaluate/predict. If their epochs have different known lengths,
        steps would pair up wrongly and the longer rank would wait on a peer
        that has finished; if their in-memory arrays differ (each rank passed
        its own shard), every rank would train on a slice of its shard: 1/P
        of the rows; if their batch sizes differ, each would take its slice
        of a different global batch. `num_batches`: this rank's batches per
        epoch (None: unknown); `fingerprint`: (rows, hash) of its arrays
        (`data_fingerprint`), or None; `signature`: the call's arguments
        (`call_arguments.call_signature`), or None. One all-gather of a few
        integers.
        """
        rows, digest = fingerprint if fingerprint is not None else (-1, -1)
        signature = list(signature) if signature is not None else []
        width = 5 + len(call_arguments.ARGUMENTS)  # the four above, the call, its arguments
        mine = [-1 if num_batches is None else num_batches, rows, digest, len(signature)]
        mine = tf.constant([(mine + signature + [0] * width)[:width]], tf.int64)
        every_rank = self._communicator.all_gather(mine).numpy().tolist()
        rank = self._cluster.rank
        signatures = [row[4:4 + row[3]] for row in every_rank]
        if all(signatures) and len({len(s) for s in signatures}) == 1:
            difference = call_arguments.first_difference(signatures)
            if difference is not None:
                name, values = difference
                if name == call_arguments.STATE_SAVERS:
                    raise ValueError(
                        f"tfdist rank {rank}: the optimizer state is sharded across the ranks "
                        "(shard_optimizer_state=True) and the ranks have different "
                        "ModelCheckpoint / BackupAndRestore callbacks (how many, by rank: "
                        f"{values}): a save of the whole state needs every rank's slices. Give "
                        "every rank the same checkpoint callbacks (the chief writes the file; "
                        "the others hand over their slices), or shard_optimizer_state=False "
                        "for Horovod's save-on-rank-0 convention.")
                if name == "call":
                    raise ValueError(
                        f"tfdist rank {rank}: the ranks are in different calls (by rank: "
                        f"{values}). Every rank must run the same fit/evaluate/predict calls "
                        "in the same order.")
                raise ValueError(
                    f"tfdist rank {rank}: the ranks passed different {name!r} (by rank: "
                    f"{values}). Every rank must call fit/evaluate/predict with the same "
                    "arguments" + (": each rank's batch_size is its own part of every step, "
                                   "the same on every rank." if self.per_rank_input else
                                   ": batch_size is the global batch, which tfdist splits "
                                   "across the ranks."))
        known = [row[0] for row in every_rank if row[0] >= 0]
        if len(set(known)) > 1 and self.per_rank_input:
            raise ValueError(
                f"tfdist rank {rank}: the ranks' data give different numbers of batches per "
                f"epoch (by rank: {[row[0] for row in every_rank]}); every rank takes part in "
                "every step. Pass steps_per_epoch (Horovod's scripts: N // hvd.size()) or give "
                "every rank as many batches.")
        if len(set(known)) > 1:
            raise ValueError(
                f"tfdist rank {rank}: the ranks were given different amounts of data (batches "
                f"per epoch by rank: {[row[0] for row in every_rank]}). Pass the same "
                "full data set on every rank; tfdist gives each rank its slice of every global "
                "batch.")
        fingerprinted = [(row[1], row[2]) for row in every_rank if row[1] >= 0]
        if (not self.per_rank_input and len(fingerprinted) == len(every_rank)
                and len(set(fingerprinted)) > 1):
            raise ValueError(
                f"tfdist rank {rank}: the ranks were given different data (rows by rank: "
                f"{[row[1] for row in every_rank]}; the arrays differ in content). Pass "
                "the same full data set on every rank, with the same order: tfdist gives each "
                "rank its slice of every global batch, so a rank that keeps only its own shard "
                "(x[rank::world]) trains on a fraction of the data. For a per-rank input "
                "pipeline, build it in strategy.distribute_datasets_from_function(dataset_fn) "
                "and pass the result to fit, or give each rank its own batches on purpose "
                "with RingAllReduceStrategy(per_rank_input=True) (Horovod's semantics; "
                "batch_size is then each rank's).")

    def any_rank(self, flag, training=False):
        """True on every rank if `flag` is true on any rank (eager; one tiny all-reduce).

        `training`: the exchange belongs to training (fit's `stop_training`):
        its time counts as training communication (`communication_counters`).
        """
        return self.any_rank_each([flag], training)[0]

    def any_rank_each(self, flags, training=False):
        """`any_rank` of each of several flags, in one tiny all-reduce."""
        flags = list(flags)
        if len(flags) not in self._any_rank_functions:
            # Compiled once per length (a function's traces share their collective keys, which
            # TensorFlow ties to one shape): an eager collective would carry an op timeout, for
            # which TensorFlow parks two threads per call; the call is bounded by the watchdog.
            self._any_rank_functions[len(flags)] = tf.function(
                lambda value: self._all_reduce_sum([value])[0])
        start = time.perf_counter()
        with self._communicator.expect_progress("stop-flag exchange"):
            total = self._any_rank_functions[len(flags)](
                tf.constant([1.0 if flag else 0.0 for flag in flags]))
            stops = [bool(value > 0) for value in total.numpy()]
        if training:
            self.communication_counters.add_host_seconds(time.perf_counter() - start)
        return stops

    def barrier(self, what):
        """Every rank waits for the others, bounded by the job timeout (a late rank is named,
        with `what` it was waited for)."""
        with self._communicator.expect_progress(f"the barrier {what}"):
            self._communicator.barrier()

    def _distribute_datasets_from_function(self, dataset_fn, options):
        """`dataset_fn(input_context)`: the user's own per-process pipeline, iterated directly."""
        del options
        cluster = self._cluster
        context = tf.distribute.InputContext(cluster.world_size, cluster.rank, cluster.world_size)
        return LocalSliceDataset(dataset_fn(context))

    # ---------------------------------------------------------------- steps
    def _call_for_each_replica(self, fn, args, kwargs):
        if replica_step.current() is not None:
            # A merge_call inside a step (LossScaleOptimizer's apply) returning to the
            # replica: part of the step being traced.
            return self._in_replica_context(fn, args, kwargs)
        plan = self.plan_step(fn)
        if plan.updates == step_plan.LOCAL:
            return self._in_replica_context(fn, args, kwargs)
        with (self.communication_counters.recording() if plan.training
              else contextlib.nullcontext()):
            return self._run_planned_step(fn, args, kwargs, plan)

    def plan_step(self, fn):
        """The `step_plan.StepPlan` of a step running `fn`, decided once as it is traced."""
        return step_plan.plan_step(
            one_process=self._one_process,
            is_keras_train_step=keras_steps.is_keras_train_step(fn),
            is_train_step=keras_steps.is_train_step(fn),
            # A user's own function (a custom loop's `strategy.run(train_step)`) scales its
            # loss itself, as MultiWorkerMirroredStrategy's contract has it, and sees its
            # slice as it is; Keras' steps compute per-slice means that tfdist weights.
            is_user_function=(keras_steps.model_of_step(fn) is None
                              and not keras_steps.is_predict_step(fn)),
            asynchronous=self.asynchronous)

    def _run_planned_step(self, fn, args, kwargs, plan):
        """A `DEFERRED` or `IMMEDIATE` step: every rank together (`_synchronous_step`)."""
        return self._synchronous_step(fn, args, kwargs, plan)

    def epoch_data_scope(self, training):
        """Context in which Keras builds an epoch iterator (`training`: fit's own)."""
        del training
        return contextlib.nullcontext()

    def _in_replica_context(self, fn, args, kwargs):
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
                sum_exactly(self._gradients.all_reduce)):
            yield

    def _get_local_replica_id(self, replica_id_in_sync_group):
        del replica_id_in_sync_group
        return 0  # one replica per process

    def _experimental_distribute_values_from_function(self, value_fn):
        """`value_fn(ValueContext)` for this process's replica (its rank of the world size)."""
        return value_fn(tf.distribute.experimental.ValueContext(
            replica_id_in_sync_group=self._cluster.rank,
            num_replicas_in_sync=self._cluster.world_size))

    def _synchronous_step(self, fn, args, kwargs, plan):
        """A step of every rank together: slices weighted by share, state made global.

        The step ends with one fused all-reduce (`_end_replica_step`). In a
        `DEFERRED` plan (Keras' own `train_step`, which reads no variable
        after its update) the optimizer update waits for it too, so
        gradients, the row count and metric state travel in one collective;
        an `IMMEDIATE` step's gradients are summed where it applies them.
        """
        model = keras_steps.model_of_step(fn)
        step = self._begin_replica_step(args, model, plan)
        if model is not None:
            step.keras_step = (model, "train" if keras_steps.is_train_step(fn) else "test")

        def step_then_sum(*step_args, **step_kwargs):
            outputs = fn(*step_args, **step_kwargs)
            return self._end_replica_step(fn, model, outputs, step)

        with replica_step.active(step), contextlib.ExitStack() as scopes:
            if not step.scaled_by_user:
                args = empty_slice.stand_in_for_empty_slice(args, step.has_rows)
                scopes.enter_context(step.stand_in_scope(tf.logical_not(step.has_rows)))
            step.lineage = BatchLineage((args, kwargs))
            scopes.enter_context(step.lineage.recording())  # eager: lineage followed as it runs
            self._local_state.begin_step()
            try:
                return self._in_replica_context(step_then_sum, args, kwargs)
            finally:
                self._local_state.end_step()  # stop recording, also when tracing failed

    def _end_replica_step(self, fn, model, outputs, step):
        """Sum what the step must share in one all-reduce, then update and return global logs.

        In the step's replica context: the deferred optimizer updates run
        here, where Keras' own step would have run them.
        """
        assigned = self._local_state.end_step()
        total = self._gradients.step_sum(step)
        updates = step.take_deferred_updates()
        finish_gradients = [self._gradients.add_to(total, u.gradients, u.variables,
                                                   u.weighted_in_loss, u.scatter_to)
                            for u in updates]
        state_slots = self._local_state.contribute(assigned, step, total)
        raw_keys = (keras_steps.raw_log_keys(model, outputs)
                    if model is not None and isinstance(outputs, dict) else [])
        raw_slots = [total.add_share_weighted(outputs[key]) for key in raw_keys]
        counters = self.communication_counters
        # A train step carries the counters' exchange (zeros unless counted: same shape on
        # every rank, whichever ranks measure).
        exchange_slot = (total.add_sum(counters.exchange_vector())
                         if keras_steps.is_train_step(fn) else None)
        # ... and the flags ranks raise between steps (a preemption notice), agreed here.
        flags_slot = (total.add_sum(self.agreed_flags.step_vector())
                      if keras_steps.is_train_step(fn) else None)
        total.run(self._aggregator.all_reduce)
        if exchange_slot is not None:
            counters.absorb_exchange(total.result(exchange_slot))
        flag_updates = ([self.agreed_flags.absorb(total.result(flags_slot))]
                        if flags_slot is not None else [])
        applied = []
        for update, finish in zip(updates, finish_gradients):
            with step.aggregated_gradients():
                applied.append(update.apply(finish()))
        state_updates = self._local_state.assign(assigned, state_slots, total)
        dependencies = state_updates + flag_updates + [op for op in tf.nest.flatten(applied)
                                        if isinstance(op, (tf.Tensor, tf.Operation))]
        with tf.control_dependencies(dependencies):
            return self._globalize_outputs(
                fn, model, outputs, step,
                {key: total.result(slot) for key, slot in zip(raw_keys, raw_slots)})

    def _begin_replica_step(self, args, model, plan):
        """This step's `ReplicaStep`: its rows; the global batch's when they are needed.

        The global row count comes with the step's fused all-reduce
        (`step_sum`), except when the model's optimizer scales its loss
        (float16 loss scaling): the share then weights the loss before the
        backward pass, and the rows are all-reduced first. A user's function
        (`plan.scaled_by_user`) may take no batch at all: it then counts one row.
        """
        if plan.scaled_by_user:
            empty_slices.install()  # a custom loop: its model may be called on an empty slice
            local_rows = leading_rows(args)
            if local_rows is None:
                local_rows = tf.constant(1, tf.int32)
        else:
            local_rows = batch_rows(args)

        # Through the aggregator: the step's only transport is the strategy's own algorithm.
        step = replica_step.ReplicaStep(local_rows, sum_over_ranks=self._all_reduce_sum,
                                        plan=plan)
        if model is not None and keras_steps.scales_loss(model.optimizer):
            step.learn_global_rows(step.global_rows)
        return step

    def _globalize_outputs(self, fn, model, outputs, step, summed_raw_logs):
        """Make a Keras step's outputs global: metric logs re-read, predictions gathered."""
        if keras_steps.is_predict_step(fn) and self.per_rank_input:
            return tf.nest.map_structure(lambda t: t[:step.local_rows], outputs)  # its own rows
        if keras_steps.is_predict_step(fn):
            with tf.name_scope(communication_scope("all_gather", "predictions")):
                return tf.nest.map_structure(
                    lambda t: self._communicator.all_gather(t[:step.local_rows]), outputs)
        if model is not None and isinstance(outputs, dict):
            return keras_steps.global_step_logs(model, outputs, summed_raw_logs)
        return tf.nest.map_structure(
            lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, outputs
        )


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


def _shard_files(dataset, context):
    """Per-file sharding (policy FILE): this rank reads 1/P of the files in batches of B/P."""
    global_batch = _tf.static_batch_size(dataset)
    sharded = _tf.auto_shard_dataset(dataset, context)
    return sharded.rebatch(global_batch // context.num_input_pipelines)


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
    extended_class = DataParallelExtended  # what `strategy.extended` is

    def __init__(self, make_aggregator, engine="collective", engine_options=None,
                 compression=None, per_rank_input=False, engine_reason=None):
        keras_patches.install()
        extended = self.extended_class(self, make_aggregator, engine, engine_options or {},
                                       compression, per_rank_input)
        # Bypass OneDeviceStrategy.__init__ (it builds its own extended object).
        super(_tf.OneDeviceStrategy, self).__init__(extended)  # pylint: disable=bad-super-call
        if self.world_size > 1:
            model_strategy.note_multi_process_strategy(self)
            joined_strategy.note_joined(self.rank)
            install_private_checkpoint_writes()
            average_loss.install(lambda step: step.scaled_by_user)
            if not extended.per_rank_input:
                # Shuffles (TensorFlow's, Python's, NumPy's) must draw the same order on every
                # rank; per-rank input keeps each rank's own (Horovod's ranks shuffle apart).
                align_random_state(extended.communicator)
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
