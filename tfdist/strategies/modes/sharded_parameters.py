"""Sharded parameters (ZeRO stage 3): each rank stores 1/P of the parameters and of their state.

`RingAllReduceStrategy(sharding="parameters")`, the placement that keeps a
model that does not fit one process trainable. It is stage 1's placement
(`sharded_state.ShardedOptimizerState`: the optimizer's slots take the
rank's slice's shape, its update runs on the slices, saves consolidate)
with the parameters themselves placed as slices:

* where a variable is created (`create`): a trainable floating-point
  variable stores this rank's range only (`parameter_shards`); everything
  else (moving statistics, seed states, metrics, the optimizer's step count)
  is whole, as without sharding;
* where it is read: gathered whole (`parameter_shards`: reading gathers);
* where its gradient is reduced: in the backward pass, reduce-scattered
  (`reduced_in_backward`: the step adds it to no sum of its own);
* where it is updated: the optimizer's own update on the storage, which is
  the slice - stage 1's partition cut per variable
  (`OptimizerShards(parameter_storage=...)`), so no copy in and no gather
  after the update;
* where it is saved or loaded: Keras' own files read and assign whole
  values (every rank saves together; a load keeps this rank's range).

Guarantee and cost: `parameter_shards` (the storage) and `optimizer_shards`
(the update), measured in benchmarks/results/parameter_sharding.json.
"""

import contextlib

import tensorflow as tf

from tfdist.strategies.modes import layout, optimizer_shards
from tfdist.strategies.modes import parameter_shards
from tfdist.strategies.modes import sharded_optimizer_methods
from tfdist.strategies.modes.sharded_state import ShardedOptimizerState


class ShardedParameters(ShardedOptimizerState):
    """1/P of the parameters, of their gradients and of the optimizer state on each rank."""

    sharding = "parameters"

    def __init__(self, reshard_after_forward=True):
        # True: a layer owning sharded parameters (and no state) is recomputed in the backward
        # pass, so its gathered parameters do not live until then (FSDP's
        # `reshard_after_forward`); False: they live, and the backward pass is the forward's.
        self.reshard_after_forward = bool(reshard_after_forward)

    def create(self, create, kwargs, communicator):
        if communicator.world_size == 1 or not _is_parameter(kwargs):
            return create(kwargs)
        initial = kwargs["initial_value"]
        with tf.init_scope():
            whole = tf.convert_to_tensor(initial() if callable(initial) else initial,
                                         dtype=kwargs.get("dtype"))
        if whole.shape.rank == 0:  # one element, not cut: an optimizer's own trainable
            return create(dict(kwargs, initial_value=whole))  # scalar (Nadam's u_product)
        shard = parameter_shards.ParameterShard(whole.shape, whole.dtype, communicator,
                                                self.reshard_after_forward)
        kwargs = dict(kwargs, initial_value=shard.local_part(whole))
        kwargs.pop("shape", None)
        return parameter_shards.make_sharded(create(kwargs), shard)

    def layout(self, variable):
        """A sharded parameter (its Keras variable or its storage): this rank's range."""
        shard = parameter_shards.shard_of(variable)
        if shard is None:
            return super().layout(variable)
        return layout.sliced_layout(shard.shape.as_list(), shard.start, shard.stop)

    def reduced_in_backward(self, variable):
        return parameter_shards.shard_of(variable) is not None

    @contextlib.contextmanager
    def consolidated(self, model):
        with super().consolidated(model), parameter_shards.whole_values(model):
            yield

    @contextlib.contextmanager
    def keeping_loaded(self, model):
        with super().keeping_loaded(model), parameter_shards.keeping_loaded(model):
            yield

    def share_loaded(self, model, root=0):
        super().share_loaded(model, root)
        parameter_shards.share_loaded(model, root)

    def begin_build(self, optimizer, variables, context):
        storage = [parameter_shards.storage_of(v) for v in variables]
        if not parameter_shards.shards_placed(variables):
            super().begin_build(optimizer, variables, context)  # none placed: stage 1's
            return
        if optimizer_shards.shards_of(optimizer) is not None or _wraps_another(optimizer):
            return
        whole = [getattr(v, "path", v.name) for v in variables
                 if parameter_shards.shard_of(v) is None]
        if whole:
            raise ValueError(
                f"tfdist rank {context.communicator.rank}: sharding='parameters' applies "
                f"{optimizer.name} to variables that are not sharded parameters ({whole}): "
                "create the model's variables under strategy.scope(); a trainable scalar "
                "(one element, never cut) cannot be trained with the parameters sharded - "
                "give it shape (1,).")
        sharded_optimizer_methods.check_shardable(optimizer, variables,
                                                  context.communicator.rank)
        shards = optimizer_shards.OptimizerShards(
            variables, context.communicator, context.rank_local_variables,
            counters=context.counters, parameter_storage=storage)
        optimizer_shards.register(optimizer, shards)
        sharded_optimizer_methods.install_on(optimizer, shards, context.rank_local_variables)




def _is_parameter(kwargs) -> bool:
    """A trainable floating-point variable: a parameter (placed as a slice)."""
    if not kwargs.get("trainable", True):
        return False
    if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
        return False
    dtype = kwargs.get("dtype")
    if dtype is None:
        initial = kwargs.get("initial_value")
        dtype = getattr(initial, "dtype", None)
    return dtype is not None and tf.as_dtype(dtype).is_floating


def _wraps_another(optimizer) -> bool:
    return getattr(optimizer, "inner_optimizer", None) is not None
