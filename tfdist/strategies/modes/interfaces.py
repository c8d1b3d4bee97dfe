"""The three mode interfaces of a tfdist strategy: what the core calls, never asking which mode.

A strategy is built from one object of each interface, chosen once at
construction (`tfdist.strategies.modes.choose`) and fixed for its life:

| interface | implementations | chosen by |
|---|---|---|
| `InputMode`: what a rank's data is | `GlobalBatchInput` (default), `PerRankInput` | `per_rank_input` |
| `Placement`: where every variable lives (`layout`) | `ReplicatedOptimizerState` (default), `ShardedOptimizerState`, `ShardedGradients`, `ShardedParameters` | `RingAllReduceStrategy(sharding=...)` |
| `UpdateMode`: how a step's gradients reach the weights | `SynchronousUpdates` (default), `AsynchronousUpdates` | `ParameterServerStrategy(mode="async")` |

The strategy's core (`DataParallelExtended`), the Keras patches, the
callbacks, saving and backups call these members; only the implementing
modules know which mode they are in. `tests/test_structure.py` checks that
every implementation provides every member declared here and that no module
outside the implementations names a mode's flag.
"""

import contextlib
import dataclasses
from typing import (Any, Callable, ContextManager, List, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

from tfdist.strategies.modes.layout import Layout


@runtime_checkable
class InputMode(Protocol):
    """What each rank's data is: its slice of the same global batch, or batches of its own."""

    random_state_is_rank_own: bool
    """A Keras seed generator's state (Dropout's masks, random augmentation) is each rank's
    own: not broadcast, not made global, not compared (Horovod's ranks draw their own masks).
    Otherwise it starts from rank 0's and must advance alike on every rank."""

    def start(self, extended: Any) -> None:
        """At the strategy's construction, several processes: the random state the mode needs
        (the same shuffles on every rank for sliced global batches)."""

    def summary(self) -> str:
        """Words for the start-up line ("" when nothing is to be said)."""

    def describe_split(self, batch_size: int, world_size: int) -> str:
        """How `fit`'s `batch_size` becomes each step's rows, in words."""

    def global_batch_size(self, batch_size: int, world_size: int) -> int:
        """The rows of one step when `fit` was given `batch_size`."""

    def expected_step_rows(self, batch_size: Optional[int]) -> Optional[int]:
        """The rows a full step of `fit` (given `batch_size`, None if unknown) has, known
        alike on every rank before the step - or None where the ranks' batches need not
        agree (the step then learns them by a collective: `row_accounting`)."""

    def creating_variable(self, kwargs: dict, communicator: Any) -> dict:
        """A variable's creation arguments: its initial value rank 0's (broadcast by
        `communicator`), or the creating rank's own."""

    def distribute_dataset(self, dataset: Any, cluster: Any) -> Any:
        """This rank's `LocalSliceDataset` of `dataset`."""

    def on_batch_arguments(self, args: tuple, kwargs: dict, rank: int,
                           world_size: int) -> tuple:
        """`train_on_batch`'s (and the others') (args, kwargs) as this rank takes them."""

    def local_predictions(self, outputs: Any, local_rows: Any, communicator: Any) -> Any:
        """A predict step's outputs as `predict` returns them on this rank."""

    def check_batch_counts(self, counts: List[int], rank: int) -> None:
        """Fail clearly when ranks' epochs have different numbers of batches."""

    def check_fingerprints(self, rows: List[int], fingerprints: List[tuple], rank: int) -> None:
        """Fail clearly when ranks' in-memory arrays differ where they must not."""

    def batch_size_rule(self) -> str:
        """The rule a different `batch_size` across ranks breaks, in words."""

    def compile_arguments(self, kwargs: dict, strategy: Any) -> dict:
        """`compile`'s keyword arguments as this mode accepts them."""

    def fit_callbacks(self, strategy: Any) -> list:
        """Callbacks every `fit` / `evaluate` / `predict` of the strategy's models gets."""

    def apply_outside_run(self, optimizer: Any, apply: Callable, grads: Sequence,
                          variables: Any, strategy: Any) -> Any:
        """An optimizer's `apply_gradients` in the cross-replica context (outside
        `strategy.run`): applied as given, or refused."""


@dataclasses.dataclass(frozen=True)
class PlacementContext:
    """What a placement reads of its strategy when an optimizer is built: a narrow view of the
    strategy's core, not the core (`DataParallelExtended.placement_context`)."""

    communicator: Any
    """The strategy's `tfdist.comm.base.Communicator`."""
    bucket_bytes: Optional[Tuple[int, int]]
    """The aggregator's (gradient bucket, first bucket) in bytes: a sharded state's partition
    follows the buckets the step reduces (None: one group per dtype)."""
    rank_local_variables: Callable[[], ContextManager]
    """A scope in which variables are created with this rank's own initial value."""
    counters: Any
    """The process's `CommunicationCounters` (what a sharded update moves is counted)."""


@runtime_checkable
class Placement(Protocol):
    """Where every variable lives - whole on every rank, a slice of it on this rank, or the
    rank's own (`layout`) - decided where it is created and consulted where its gradient is
    reduced, where it is applied, compared across ranks, saved, loaded and backed up. One
    object per strategy, from `RingAllReduceStrategy(sharding=...)`, as FSDP's one
    `ShardingStrategy` value; its answer per variable is Keras' `TensorLayout`'s role."""

    every_rank_saves: bool
    """A checkpoint needs every rank (each holds a part of the state): non-chief ranks keep
    their checkpoint callbacks, and ranks must have the same ones."""

    sharding: Optional[str]
    """The public name (`RingAllReduceStrategy(sharding=...)`): None, "optimizer",
    "gradients" or "parameters"."""

    def create(self, create: Callable, kwargs: dict, communicator: Any) -> Any:
        """Where a variable being created lives: `create(kwargs)` makes it whole; a
        placement that shards parameters creates this rank's slice of a parameter."""

    def layout(self, variable: Any) -> Layout:
        """Where `variable` lives on this rank (`modes.layout`): `WHOLE`, `SLICE` (which
        elements of the flattened whole) or `OWN`."""

    def reduced_in_backward(self, variable: Any) -> bool:
        """True if `variable`'s gradient is global when the backward pass produced it (a
        sharded parameter's, reduce-scattered there): the step sums it no more."""

    def check_compression(self, compression_name: str, rank: int) -> None:
        """A clear error for a gradient compression this mode cannot go with."""

    def begin_build(self, optimizer: Any, variables: Sequence,
                    context: PlacementContext) -> None:
        """Keras is building `optimizer` for `variables` (before any slot exists)."""

    def end_build(self, optimizer: Any) -> None:
        """Keras built `optimizer`."""

    def scatter_target(self, optimizer: Any) -> Optional[Any]:
        """The object that reduce-scatters `optimizer`'s gradients in the step (each rank
        receives only its slices), or None: gradients are all-reduced whole."""

    def apply(self, optimizer: Any, apply: Callable, grads: Sequence, variables: Any) -> Any:
        """Keras' `apply` (`apply(optimizer, grads, variables)`) of the global gradients."""

    def refuse_local_gradients(self, optimizer: Any) -> None:
        """A clear error if `optimizer` cannot apply gradients outside a step."""

    def rank_local_slots(self, model: Any) -> list:
        """Optimizer variables of `model` laid out as this rank's `SLICE` (`layout.sliced`):
        not compared, not broadcast, backed up per rank."""

    def consolidated(self, model: Any) -> contextlib.AbstractContextManager:
        """Inside: `model`'s whole optimizer state is on this rank, for a save (every rank
        enters together)."""

    def keeping_loaded(self, model: Any) -> contextlib.AbstractContextManager:
        """Inside: a load on this rank keeps the whole state it read (`share_loaded`)."""

    def share_loaded(self, model: Any, root: int = 0) -> None:
        """After rank `root` alone loaded `model`'s state: every rank takes its part."""

    def state_savers(self, callbacks: Any) -> Optional[int]:
        """How many of `callbacks` save the optimizer state, where every rank must have the
        same (None: not compared)."""

    def different_savers_error(self, savers_by_rank: list, rank: int) -> Exception:
        """The error of ranks with different numbers of state-saving callbacks."""


@runtime_checkable
class UpdateMode(Protocol):
    """How a training step's gradients reach the weights: all ranks in step, or pushed to
    parameter servers that apply them as they arrive."""

    ranks_hold_the_same_weights: bool
    """After every step every rank holds the same weights (saves are the chief's)."""

    def attach(self, extended: Any) -> None:
        """Once, as the strategy's core is built: the mode's view of it."""

    def plan_step(self, *, one_process: bool, is_keras_train_step: bool, is_train_step: bool,
                  is_user_function: bool) -> Any:
        """The `step_plan.StepPlan` of a step."""

    def run_step(self, fn: Callable, args: tuple, kwargs: dict, plan: Any) -> Any:
        """A multi-process step of `plan` running `fn`."""

    def push_gradients(self, optimizer: Any, gradients: Sequence, variables: Sequence,
                       weighted_in_loss: bool) -> Any:
        """Inside a `REMOTE` step: send the gradients to where they are applied."""

    def any_rank_each(self, flags: Sequence[bool], training: bool = False) -> list:
        """Each flag true on every rank if true on any rank."""

    def barrier(self, what: str) -> None:
        """Every rank (worker) waits for the others, bounded by the job timeout."""

    def check_same_data(self, num_batches: Optional[int], fingerprint: Optional[tuple] = None,
                        signature: Optional[Sequence[int]] = None) -> None:
        """Fail clearly when ranks were given different data or arguments."""

    def epoch_data_scope(self, training: bool) -> contextlib.AbstractContextManager:
        """Context in which Keras builds an epoch iterator (`training`: fit's own)."""

    def distribute_dataset(self, dataset: Any, sliced: Callable[[Any], Any]) -> Any:
        """The dataset this rank iterates (`sliced(dataset)`: the input mode's)."""

    def fit_callbacks(self, strategy: Any) -> list:
        """Callbacks every `fit` / `evaluate` / `predict` of the strategy's models gets."""

    def server_state(self, optimizer: Any) -> Optional[dict]:
        """The servers' parameters, slots and step counts for a backup (None: no servers
        hold state)."""

    def resume_servers_from(self, servers: Optional[dict]) -> None:
        """A resumed backup's server state, back on the servers."""

    def before_preemption_backup(self) -> None:
        """Every rank agreed to back up now: what must happen first."""

    def statistics_snapshot(self) -> Any:
        """The servers' statistics now (None: none kept), for `statistics`."""

    def statistics(self, since: Any) -> dict:
        """Staleness and gate waits since `since` ({}: none kept)."""

    def staleness_source(self) -> Optional[Any]:
        """What the staleness callbacks read (the asynchronous client), or None."""


INTERFACES = (InputMode, Placement, UpdateMode)


def members(interface) -> tuple:
    """The declared members of a `Protocol` (one of `INTERFACES`, or `StrategyExtended`): its
    annotated attributes, methods and properties."""
    return tuple(list(getattr(interface, "__annotations__", {}))
                 + [name for name, value in vars(interface).items()
                    if not name.startswith("_") and (callable(value)
                                                     or isinstance(value, property))])
