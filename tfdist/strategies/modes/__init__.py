"""The modes of a tfdist strategy: three objects, each chosen once at construction.

* the input (`InputMode`): `GlobalBatchInput` - every rank passes the same
  global data and takes its slice - or `PerRankInput` - each rank's data is
  its own (Horovod's semantics: `tfdist.horovod`);
* the placement (`Placement`): where every variable lives (`layout`: whole,
  this rank's slice, or the rank's own) - `ReplicatedOptimizerState`
  (everything whole on every rank), `ShardedOptimizerState` and
  `ShardedGradients` (the optimizer state 1/P on each: ZeRO stages 1 and 2),
  `ShardedParameters` (the parameters too: stage 3);
* the update (`UpdateMode`): `SynchronousUpdates` - every rank in every
  step - or `AsynchronousUpdates` - workers push to parameter servers that
  apply as gradients arrive.

The public strategies' arguments (`per_rank_input`, `sharding`,
`ParameterServerStrategy(mode=...)`) choose them here and nowhere else; the
strategy's core holds them as `extended.input_mode`, `extended.placement`
and `extended.updates`, and everything else calls their declared members
(`modes.interfaces`) without asking which mode it is.
"""

import dataclasses

from tfdist.strategies.modes.asynchronous_updates import AsynchronousUpdates
from tfdist.strategies.modes.global_batch_input import GlobalBatchInput
from tfdist.strategies.modes.interfaces import InputMode, Placement, UpdateMode
from tfdist.strategies.modes.per_rank_input import PerRankInput
from tfdist.strategies.modes.replicated_state import ReplicatedOptimizerState
from tfdist.strategies.modes.sharded_parameters import ShardedParameters
from tfdist.strategies.modes.sharded_state import ShardedGradients, ShardedOptimizerState
from tfdist.strategies.modes.synchronous_updates import SynchronousUpdates


@dataclasses.dataclass(frozen=True)
class Modes:
    """The three mode objects of one strategy."""

    input: InputMode
    placement: Placement
    updates: UpdateMode


def input_mode(per_rank_input=False):
    """The `InputMode` of the strategies' `per_rank_input` argument."""
    return PerRankInput() if per_rank_input else GlobalBatchInput()


SHARDINGS = {None: ReplicatedOptimizerState, "optimizer": ShardedOptimizerState,
             "gradients": ShardedGradients, "parameters": ShardedParameters}


def placement(shard_optimizer_state=False, sharding=None, reshard_after_forward=None):
    """The placement (`Placement`) of `RingAllReduceStrategy(sharding=...)`: None
    (everything whole on every rank), "optimizer" (ZeRO stage 1), "gradients" (stage 2) or
    "parameters" (stage 3); `shard_optimizer_state=True` is `sharding="optimizer"`;
    `reshard_after_forward` (stage 3 only, default True) as FSDP's."""
    if reshard_after_forward is not None and sharding != "parameters":
        raise ValueError(f"reshard_after_forward applies to sharding='parameters' (the "
                         f"parameters gathered for a layer), not to sharding={sharding!r}.")
    if shard_optimizer_state:
        if sharding not in (None, "optimizer"):
            raise ValueError(f"shard_optimizer_state=True is sharding='optimizer'; it cannot "
                             f"go with sharding={sharding!r}: give sharding alone.")
        sharding = "optimizer"
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {tuple(SHARDINGS)}. Got: {sharding!r}")
    if sharding == "parameters":
        return ShardedParameters(reshard_after_forward is not False)
    return SHARDINGS[sharding]()


def choose(per_rank_input=False, optimizer_state_mode=None, updates=None):
    """The `Modes` of a strategy: the input of `per_rank_input`, and the optimizer-state and
    update modes given (default: replicated, synchronous)."""
    return Modes(input=input_mode(per_rank_input),
                 placement=(optimizer_state_mode if optimizer_state_mode is not None
                                  else ReplicatedOptimizerState()),
                 updates=updates if updates is not None else SynchronousUpdates())


__all__ = ["SHARDINGS", "ShardedGradients", "ShardedParameters", "AsynchronousUpdates", "GlobalBatchInput", "InputMode", "Modes", "Placement",
           "PerRankInput", "ReplicatedOptimizerState", "ShardedOptimizerState",
           "SynchronousUpdates", "UpdateMode", "choose", "input_mode", "placement",
           "replicated_state_only"]


def replicated_state_only(shard_optimizer_state, strategy_name, rank, why):
    """The `ReplicatedOptimizerState` of a strategy that cannot shard its optimizer state; a
    clear error, saying `why`, when `shard_optimizer_state` asks for it."""
    if shard_optimizer_state:
        raise ValueError(
            f"tfdist rank {rank}: {strategy_name} cannot shard the optimizer state "
            f"(shard_optimizer_state=True): {why}. Use "
            "RingAllReduceStrategy(shard_optimizer_state=True).")
    return ReplicatedOptimizerState()
