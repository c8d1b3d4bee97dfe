"""The default input mode: every rank passes the same global data and takes its slice.

`fit`'s `batch_size` is the global batch, as in tf.distribute. Each step,
rank r of P takes rows [r B / P, (r + 1) B / P) of the global batch of B rows
(`batch_slicing.shard_global_batch`; uneven and empty slices are weighted by their
rows, so the update is one process's on the whole batch), or with the
`FILE` auto-shard policy 1/P of the files in batches of B / P. A variable
created under the scope starts from rank 0's value (one broadcast at its
creation), so every rank starts alike; predictions are gathered in rank
order, so every rank returns all rows; random state is aligned with rank 0
at the strategy's construction, so shuffles agree.

Guarantee: training, evaluation and prediction equal one process's on the
same script, for any split (`docs/guarantees.md`). Cost: per step, nothing
beyond the strategy's all-reduce; one broadcast per created variable; one
all-gather of a predict step's rows.
"""

import keras
import tensorflow as tf

from tfdist import _tf
from tfdist.profiling.names import communication_scope
from tfdist.strategies.inputs.local_input import LocalSliceDataset, derives_from_local_slice
from tfdist.strategies.state.random_state import align_random_state
from tfdist.strategies.inputs.batch_slicing import shard_global_batch, slice_rows


class GlobalBatchInput:
    """Every rank's data is the same global data, sliced by tfdist; see the module docstring."""

    random_state_is_rank_own = False  # seed states start alike and must advance alike

    def start(self, extended):
        # Shuffles (TensorFlow's, Python's, NumPy's) must draw the same order on every rank.
        align_random_state(extended.communicator)

    def summary(self):
        return ""

    def describe_split(self, batch_size, world_size):
        sizes = sorted({slice_rows(batch_size, rank, world_size) for rank in range(world_size)})
        per_process = "-".join(str(size) for size in sizes)
        note = "" if len(sizes) == 1 else " (uneven slices are weighted by their rows: exact)"
        return (f"global batch {batch_size} = {per_process} per process x {world_size}{note}; "
                "fit's batch_size is the global batch, as in tf.distribute")

    def global_batch_size(self, batch_size, world_size):
        del world_size
        return batch_size

    def expected_step_rows(self, batch_size):
        """`fit`'s batch size: the global batch, the same on every rank (the ranks' data and
        batch sizes are compared at `fit`'s start)."""
        return batch_size

    def creating_variable(self, kwargs, communicator):
        """The initial value broadcast from rank 0 (ON_READ variables, each rank's own state,
        as created), checked to have the same shape and dtype on every rank."""
        if kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ:
            kwargs["initial_value"] = _from_rank_zero(kwargs, communicator)
        return kwargs

    def distribute_dataset(self, dataset, cluster):
        if derives_from_local_slice(dataset):
            # Distributed already (a user's call before model.fit, perhaps mapped by Keras).
            return dataset if isinstance(dataset, LocalSliceDataset) else LocalSliceDataset(dataset)
        policy = dataset.options().experimental_distribute.auto_shard_policy
        if cluster.world_size > 1 and policy == tf.data.experimental.AutoShardPolicy.FILE:
            context = tf.distribute.InputContext(cluster.world_size, cluster.rank,
                                                 cluster.world_size)
            return LocalSliceDataset(_shard_files(dataset, context))
        return LocalSliceDataset(shard_global_batch(dataset, cluster.rank, cluster.world_size))

    def on_batch_arguments(self, args, kwargs, rank, world_size):
        """A global batch: this rank's slice of every array (`class_weight` and `return_dict`
        as given), so the update, logs and gathered predictions match one process."""
        def slicer(value):
            return _rank_slice(value, rank, world_size)

        args = keras.tree.map_structure(slicer, args)
        kwargs = {key: (value if key in ("class_weight", "return_dict")
                        else keras.tree.map_structure(slicer, value))
                  for key, value in kwargs.items()}
        return args, kwargs

    def local_predictions(self, outputs, local_rows, communicator):
        with tf.name_scope(communication_scope("all_gather", "predictions")):
            return tf.nest.map_structure(
                lambda t: communicator.all_gather(t[:local_rows]), outputs)

    def check_batch_counts(self, counts, rank):
        if len({c for c in counts if c >= 0}) > 1:
            raise ValueError(
                f"tfdist rank {rank}: the ranks were given different amounts of data (batches "
                f"per epoch by rank: {counts}). Pass the same full data set on every rank; "
                "tfdist gives each rank its slice of every global batch.")

    def check_fingerprints(self, rows, fingerprints, rank):
        known = [f for f in fingerprints if f[0] >= 0]
        if len(known) == len(fingerprints) and len(set(known)) > 1:
            raise ValueError(
                f"tfdist rank {rank}: the ranks were given different data (rows by rank: "
                f"{rows}; the arrays differ in content). Pass the same full data set on every "
                "rank, with the same order: tfdist gives each rank its slice of every global "
                "batch, so a rank that keeps only its own shard (x[rank::world]) trains on a "
                "fraction of the data. For a per-rank input pipeline, build it in "
                "strategy.distribute_datasets_from_function(dataset_fn) and pass the result to "
                "fit, or give each rank its own batches on purpose with "
                "RingAllReduceStrategy(per_rank_input=True) (Horovod's semantics; batch_size is "
                "then each rank's).")

    def batch_size_rule(self):
        return "batch_size is the global batch, which tfdist splits across the ranks."

    def compile_arguments(self, kwargs, strategy):
        del strategy
        return kwargs

    def fit_callbacks(self, strategy):
        del strategy
        return []

    def apply_outside_run(self, optimizer, apply, grads, variables, strategy):
        """Such gradients would be this rank's alone: refused, naming the way."""
        del apply, grads, variables
        raise ValueError(
            f"tfdist rank {strategy.rank}: {optimizer.name}.apply_gradients was called outside "
            "strategy.run(...), with this rank's gradients only: the ranks would drift apart. "
            "Compute and apply the gradients inside strategy.run(step_fn, args=...) (the "
            "TensorFlow guide's custom loop), where they are summed over the ranks, or use "
            "tfdist.horovod.tensorflow's DistributedGradientTape.")


def _rank_slice(value, rank, world_size):
    """This rank's rows of an array-like batch (unchanged if it has no rows)."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0:
        return value
    rows = int(shape[0])
    return value[(rank * rows) // world_size:((rank + 1) * rows) // world_size]


def _shard_files(dataset, context):
    """Per-file sharding (policy FILE): this rank reads 1/P of the files in batches of B/P."""
    global_batch = _tf.static_batch_size(dataset)
    sharded = _tf.auto_shard_dataset(dataset, context)
    return sharded.rebatch(global_batch // context.num_input_pipelines)


def _from_rank_zero(kwargs, communicator):
    """An initial value (for `kwargs` of a variable's creation) that is rank 0's."""
    initial_value = kwargs["initial_value"]
    dtype = kwargs.get("dtype")
    name = kwargs.get("name")

    def from_rank_zero():
        # A variable created inside a tf.function (an optimizer's slots built by the first
        # `apply_gradients` in `strategy.run`) is initialized by calling this in the
        # function's graph; an initializer callable is evaluated eagerly instead, so the
        # broadcast (eager, once, when every rank traces the function) can use its value.
        with tf.init_scope():
            value = initial_value() if callable(initial_value) else initial_value
            value = getattr(value, "wrapped_value", value)  # CheckpointInitialValue
            if not tf.is_symbolic_tensor(value):
                return _checked_broadcast(communicator, tf.convert_to_tensor(value, dtype=dtype),
                                          name)
        # A tensor of the function being traced: broadcast inside it.
        return _checked_broadcast(communicator, tf.convert_to_tensor(value, dtype=dtype), name)

    return from_rank_zero


def _checked_broadcast(communicator, value, name):
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
            f"{root_signature.numpy().tolist()}): every rank must build the same model.")
    return communicator.broadcast(value)
