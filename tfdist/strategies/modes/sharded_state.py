"""Sharded optimizer state (ZeRO stage 1): each rank keeps the state of 1/P of the parameters.

`RingAllReduceStrategy(shard_optimizer_state=True)`. This object is the
mode's one door: the strategy's core, the Keras patches, saving and backups
call it as they call `ReplicatedOptimizerState`, never asking which it is.
Behind it:

* the algorithm, its guarantee and cost model: `optimizer_shards`
  (`OptimizerShards`: the partition into contiguous ranges per gradient
  bucket, the shard variables, the reduce-scatter and the all-gather);
* one Keras optimizer made sharded as Keras builds it:
  `sharded_optimizer_methods` (its slots take the rank's slice's
  shape; its apply runs on the rank's slices, then the parameters are
  gathered);
* consolidation for saving, as torch's `ZeroRedundancyOptimizer.
  consolidate_state_dict`: every rank enters `consolidated(model)` together,
  the chief writes the whole state in Keras' own format; a load on the chief
  is shared as slices (`keeping_loaded`, `share_loaded`).

Which optimizer is sharded is recorded in `optimizer_shards`' weak
registry (optimizer -> `OptimizerShards`), not on the optimizer.
"""

import keras

from tfdist.strategies.modes import layout, sharded_optimizer_methods
from tfdist.strategies.modes import optimizer_shards
from tfdist.strategies.keras_surface.keras_internals import LossScaleOptimizer

# Compressions a sharded optimizer takes: a stateless wire format. A compressor with error
# feedback keeps a residual per rank and gradient, which the sharding would have to follow.
SHARDABLE_COMPRESSIONS = ("none", "fp16")


class ShardedOptimizerState:
    """1/P of the optimizer state on each rank; see the module docstring."""

    every_rank_saves = True
    sharding = "optimizer"

    def create(self, create, kwargs, communicator):
        del communicator
        return create(kwargs)  # parameters whole

    def layout(self, variable):
        """An optimizer slot of a sharded optimizer: this rank's range of its parameter."""
        found = optimizer_shards.slot_range(variable)
        if found is None:
            return layout.whole_or_own(variable)
        shape, (start, stop) = found
        return layout.sliced_layout(shape, start, stop)

    def reduced_in_backward(self, variable):
        del variable
        return False  # summed by the step (reduce-scattered where the engine can)

    def check_compression(self, compression_name, rank):
        if compression_name not in SHARDABLE_COMPRESSIONS:
            raise ValueError(
                f"tfdist rank {rank}: shard_optimizer_state=True cannot go with "
                f"compression={compression_name!r}: a lossy compressor keeps each rank's error "
                "feedback for every whole gradient, and its approximation is no longer the "
                "update one process makes; use compression=None or 'fp16', or "
                "shard_optimizer_state=False.")

    def begin_build(self, optimizer, variables, context):
        """Shard `optimizer`'s state before Keras creates any slot (not a LossScaleOptimizer,
        whose inner optimizer is sharded; nothing with one process)."""
        if (context.communicator.world_size == 1 or isinstance(optimizer, LossScaleOptimizer)
                or optimizer_shards.shards_of(optimizer) is not None):
            return
        sharded_optimizer_methods.check_shardable(optimizer, variables, context.communicator.rank)
        shards = optimizer_shards.OptimizerShards(
            variables, context.communicator, context.rank_local_variables,
            buckets=context.bucket_bytes, counters=context.counters)
        optimizer_shards.register(optimizer, shards)
        sharded_optimizer_methods.install_on(optimizer, shards, context.rank_local_variables)

    def end_build(self, optimizer):
        sharded_optimizer_methods.end_build(optimizer)

    def scatter_target(self, optimizer):
        return sharded_optimizer_methods.scatter_target(optimizer)

    def apply(self, optimizer, apply, grads, variables):
        if optimizer_shards.shards_of(optimizer) is None:  # a LossScaleOptimizer: its inner is
            return apply(optimizer, grads, variables)
        return sharded_optimizer_methods.apply_sharded(optimizer, apply, grads, variables)

    def refuse_local_gradients(self, optimizer):
        shards = optimizer_shards.shards_of(optimizer)
        if shards is not None:
            raise ValueError(
                f"tfdist rank {shards.rank}: {optimizer.name}'s state is sharded across the "
                "ranks (shard_optimizer_state=True): apply its gradients inside "
                "strategy.run(...) (or fit), where they are summed over the ranks first.")

    def rank_local_slots(self, model):
        return layout.sliced(model, self)

    def consolidated(self, model):
        return optimizer_shards.consolidated(model)

    def keeping_loaded(self, model):
        return optimizer_shards.keeping_loaded(model)

    def share_loaded(self, model, root=0):
        optimizer_shards.share_loaded_state(model, root)

    def state_savers(self, callbacks):
        """ModelCheckpoint and BackupAndRestore callbacks: every rank's slices go into their
        file, so every rank must have them (Horovod's scripts give them to rank 0)."""
        flat = keras.tree.flatten(callbacks) if callbacks else []
        return sum(isinstance(c, (keras.callbacks.ModelCheckpoint,
                                  keras.callbacks.BackupAndRestore)) for c in flat)

    def different_savers_error(self, savers_by_rank, rank):
        return ValueError(
            f"tfdist rank {rank}: the optimizer state is sharded across the ranks "
            "(shard_optimizer_state=True) and the ranks have different ModelCheckpoint / "
            f"BackupAndRestore callbacks (how many, by rank: {savers_by_rank}): a save of the "
            "whole state needs every rank's slices. Give every rank the same checkpoint "
            "callbacks (the chief writes the file; the others hand over their slices), or "
            "shard_optimizer_state=False for Horovod's save-on-rank-0 convention.")


class ShardedGradients(ShardedOptimizerState):
    """ZeRO stage 2 (`sharding="gradients"`): stage 1's placement under stage 2's name.

    In PyTorch stage 2 saves the gradient buffers (`.grad`) that live from
    the backward pass to the optimizer's step. A TensorFlow step keeps no
    such buffers: its gradients are tensors of the step, and stage 1 here
    already reduce-scatters them where the engine can (each rank receives
    its slices only, bucket by bucket, as the backward pass produces them)
    and keeps gradient accumulators as slices (they are optimizer slots).
    So stage 2 is the same placement; the name is accepted so that a
    script written for the ladder keeps its meaning.
    """

    sharding = "gradients"
