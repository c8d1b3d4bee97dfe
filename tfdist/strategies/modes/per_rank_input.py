"""Per-rank input (Horovod's semantics): each rank feeds batches of its own.

`RingAllReduceStrategy(per_rank_input=True)`, the strategy `tfdist.horovod`'s
`hvd.init()` makes: `fit`'s `batch_size` and a dataset's batches are each
rank's own; a step's global batch is every rank's batches together, weighted
by rows, so the update equals one process's on the concatenated batches.
Nothing is sliced, arrays are not compared across ranks, predictions stay
on their rank and random state is each rank's own (Horovod's ranks shuffle
apart and draw their own Dropout masks: a Keras seed generator's state is the
rank's own, never compared across ranks). A variable is the creating rank's own until synchronized, as in
Horovod: a variable one rank creates alone (an optimizer, a checkpoint's
counter, a model saved or loaded on rank 0) waits for no other rank; `fit`
starts from rank 0's variables (`_StartFromRankZero`), and a custom loop
broadcasts them itself (`hvd.broadcast_variables`). An optimizer applied
outside `strategy.run` applies what it is given: the script reduced the
gradients itself (`DistributedGradientTape`, `hvd.allreduce`) or keeps them
local, as Horovod's optimizers do.

Cost: one broadcast per dtype of the model's and optimizer's variables per
`fit` (`variable_broadcast`); nothing per step beyond the strategy's.
"""

import keras
import tensorflow as tf

from tfdist import chief_log
from tfdist.strategies.state import replica_consistency, variable_broadcast
from tfdist.strategies.keras_surface.compat import KERAS_2_ARGUMENT
from tfdist.strategies.keras_surface.model_strategy import agrees_across_ranks
from tfdist.strategies.inputs.local_input import LocalSliceDataset

# Keras 2's compile argument every Horovod Keras script passes (Keras 3 has none).


class PerRankInput:
    """Each rank's data is its own; see the module docstring."""

    random_state_is_rank_own = True  # each rank its own Dropout masks, as in Horovod

    def start(self, extended):
        del extended  # each rank keeps its own random state, as Horovod's ranks do

    def summary(self):
        return ", each process feeding its own batches (Horovod's semantics)"

    def describe_split(self, batch_size, world_size):
        return (f"batch {batch_size} per process x {world_size} = {batch_size * world_size} "
                "rows per step (each process feeds its own batches, as in Horovod)")

    def global_batch_size(self, batch_size, world_size):
        return batch_size * world_size  # each rank's batch is its part of the step

    def expected_step_rows(self, batch_size):
        del batch_size  # each rank's own: the step's rows are learned by a collective
        return None

    def creating_variable(self, kwargs, communicator):
        del communicator  # the creating rank's own until synchronized
        return kwargs

    def distribute_dataset(self, dataset, cluster):
        del cluster
        return dataset if isinstance(dataset, LocalSliceDataset) else LocalSliceDataset(dataset)

    def on_batch_arguments(self, args, kwargs, rank, world_size):
        del rank, world_size
        return args, kwargs

    def local_predictions(self, outputs, local_rows, communicator):
        del communicator
        return tf.nest.map_structure(lambda t: t[:local_rows], outputs)  # its own rows

    def check_batch_counts(self, counts, rank):
        if len({c for c in counts if c >= 0}) > 1:
            raise ValueError(
                f"tfdist rank {rank}: the ranks' data give different numbers of batches per "
                f"epoch (by rank: {counts}); every rank takes part in every step. Pass "
                "steps_per_epoch (Horovod's scripts: N // hvd.size()) or give every rank as "
                "many batches.")

    def check_fingerprints(self, rows, fingerprints, rank):
        del rows, fingerprints, rank  # each rank's arrays are its own

    def batch_size_rule(self):
        return "each rank's batch_size is its own part of every step, the same on every rank."

    def compile_arguments(self, kwargs, strategy):
        """Keras 2's `experimental_run_tf_function` accepted and ignored (said once): tfdist
        makes the gradients global inside Keras 3's own step, compiled or eager."""
        if KERAS_2_ARGUMENT in kwargs:
            kwargs = dict(kwargs)
            value = kwargs.pop(KERAS_2_ARGUMENT)
            chief_log.info(strategy.is_chief,
                           "tfdist.horovod.keras: compile(%s=%r) ignored: Keras 3 has no such "
                           "argument; the gradients are averaged inside Keras' own step",
                           KERAS_2_ARGUMENT, value, once=True)
        return kwargs

    def fit_callbacks(self, strategy):
        return [_StartFromRankZero(strategy)] if strategy.world_size > 1 else []

    def apply_outside_run(self, optimizer, apply, grads, variables, strategy):
        del strategy
        return apply(optimizer, grads, variables)


@agrees_across_ranks
class _StartFromRankZero(keras.callbacks.Callback):
    """`fit` starts from rank 0's weights and optimizer state.

    Every rank calls `fit`, so its start is where the ranks' own variables
    are made alike - before the first step, so the first update is the one
    one process makes. It runs after the script's own callbacks'
    `on_train_begin`: Horovod's `BroadcastGlobalVariablesCallback(root_rank,
    local_variables=...)` has then made every rank hold `root_rank`'s values
    (this broadcast changes nothing) and declared its local variables each
    rank's own (left out here). Cost: one broadcast per dtype of the model and
    its optimizer's variables per `fit` (`variable_broadcast`).
    """

    def __init__(self, strategy):
        super().__init__()
        self._communicator = strategy.extended.communicator

    def on_train_begin(self, logs=None):
        with self._communicator.expect_progress("fit's start from rank 0's variables"):
            variable_broadcast.broadcast_variables(
                self._communicator, replica_consistency.compared_variables(self.model))
