"""The modes of a tfdist strategy: three objects, each chosen once at construction.

* the input (`InputMode`): `GlobalBatchInput` - every rank passes the same
  global data and takes its slice - or `PerRankInput` - each rank's data is
  its own (Horovod's semantics: `tfdist.horovod`);
* the optimizer's state (`OptimizerStateMode`): `ReplicatedOptimizerState`
  - whole on every rank - or `ShardedOptimizerState` - 1/P on each (ZeRO
  stage 1);
* the update (`UpdateMode`): `SynchronousUpdates` - every rank in every
  step - or `AsynchronousUpdates` - workers push to parameter servers that
  apply as gradients arrive.

The public strategies' arguments (`per_rank_input`, `shard_optimizer_state`,
`ParameterServerStrategy(mode=...)`) choose them here and nowhere else; the
strategy's core holds them as `extended.input_mode`, `extended.optimizer_state`
and `extended.updates`, and everything else calls their declared members
(`modes.interfaces`) without asking which mode it is.
"""

import dataclasses

from tfdist.strategies.modes.asynchronous_updates import AsynchronousUpdates
from tfdist.strategies.modes.global_batch_input import GlobalBatchInput
from tfdist.strategies.modes.interfaces import InputMode, OptimizerStateMode, UpdateMode
from tfdist.strategies.modes.per_rank_input import PerRankInput
from tfdist.strategies.modes.replicated_state import ReplicatedOptimizerState
from tfdist.strategies.modes.sharded_state import ShardedOptimizerState
from tfdist.strategies.modes.synchronous_updates import SynchronousUpdates


@dataclasses.dataclass(frozen=True)
class Modes:
    """The three mode objects of one strategy."""

    input: InputMode
    optimizer_state: OptimizerStateMode
    updates: UpdateMode


def input_mode(per_rank_input=False):
    """The `InputMode` of the strategies' `per_rank_input` argument."""
    return PerRankInput() if per_rank_input else GlobalBatchInput()


def optimizer_state(shard_optimizer_state=False):
    """The `OptimizerStateMode` of `RingAllReduceStrategy(shard_optimizer_state=...)`."""
    return ShardedOptimizerState() if shard_optimizer_state else ReplicatedOptimizerState()


def choose(per_rank_input=False, optimizer_state_mode=None, updates=None):
    """The `Modes` of a strategy: the input of `per_rank_input`, and the optimizer-state and
    update modes given (default: replicated, synchronous)."""
    return Modes(input=input_mode(per_rank_input),
                 optimizer_state=(optimizer_state_mode if optimizer_state_mode is not None
                                  else ReplicatedOptimizerState()),
                 updates=updates if updates is not None else SynchronousUpdates())


__all__ = ["AsynchronousUpdates", "GlobalBatchInput", "InputMode", "Modes", "OptimizerStateMode",
           "PerRankInput", "ReplicatedOptimizerState", "ShardedOptimizerState",
           "SynchronousUpdates", "UpdateMode", "choose", "input_mode", "optimizer_state",
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
