"""What the layers above the strategy use of `strategy.extended`: the declared interface.

The Keras patches (`keras_patches`), the callbacks and the profiling report
reach a tfdist strategy's implementation through `strategy.extended`. These
are the only members they may use; `tests/test_structure.py` checks that
every `extended.<member>` read outside the strategy's own modules is
declared here and that the implementation (`DataParallelExtended`) provides
every member. Which input, optimizer state and update the strategy has is
not a flag here but three objects (`input_mode`, `placement`,
`updates`), called through their own declared interfaces
(`tfdist.strategies.modes.interfaces`). A new use starts with a line here.
"""

import contextlib
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, runtime_checkable

from tfdist.strategies.modes.interfaces import members

if TYPE_CHECKING:
    from tfdist.aggregation.base import Aggregator
    from tfdist.comm.base import Communicator
    from tfdist.profiling.counters import CommunicationCounters
    from tfdist.fault_tolerance.agreed_flags import AgreedFlags
    from tfdist.fault_tolerance.preemption import PreemptionNotice
    from tfdist.strategies.modes.interfaces import (  # noqa: F401
        InputMode, Placement, PlacementContext, UpdateMode)


@runtime_checkable
class StrategyExtended(Protocol):
    """The members of a tfdist strategy's `extended` object that other layers use."""

    # ------------------------------------------------------------ its modes
    input_mode: "InputMode"
    """What each rank's data is (`modes.interfaces.InputMode`)."""

    placement: "Placement"
    """Where every variable lives (`modes.interfaces.Placement`)."""

    updates: "UpdateMode"
    """How a step's gradients reach the weights (`modes.interfaces.UpdateMode`)."""

    communication_counters: "CommunicationCounters"
    """`tfdist.profiling.counters.CommunicationCounters` of this process's steps."""

    agreed_flags: "AgreedFlags"
    """`tfdist.fault_tolerance.agreed_flags.AgreedFlags`: flags (a preemption notice) that every
    rank sees after the same training step."""

    save_log: Optional[Any]
    """`tfdist.strategies.state.save_records.JobSaveLog`: the chief's completed saves, for ranks
    saving to paths of their own; None for one process."""

    chief_saves: Optional[Any]
    """`tfdist.strategies.state.chief_saves`: in a job across hosts, the chief's
    `ChiefSaveService` (on the chief) or a `ChiefSaveClient` (on another rank), which give a
    save's file to ranks whose disk is not the chief's; None on one host."""

    preemption: "PreemptionNotice"
    """`tfdist.fault_tolerance.preemption.PreemptionNotice` of this rank."""

    @property
    def communicator(self) -> "Communicator":
        """This process's `tfdist.comm.base.Communicator` (an identity for one process)."""

    @property
    def aggregator(self) -> "Aggregator":
        """The gradient-aggregation hook (`tfdist.aggregation.base.Aggregator`)."""

    @property
    def compression_name(self) -> str:
        """The compression of gradients on the wire ("none", "fp16", ...)."""

    # -------------------------------------------------------------- gradients
    def aggregate_gradients(self, gradients: Sequence[Any], variables: Optional[Sequence[Any]] = None,
                            weighted_in_loss: bool = False, scatter_to: Optional[Any] = None) -> list:
        """The global batch's gradients from this rank's, now (`scatter_to`: a sharded
        optimizer's `OptimizerShards` that reduce-scatters: its variables' dense gradients
        come back as this rank's slices)."""

    def push_gradients(self, optimizer: Any, gradients: Sequence[Any], variables: Sequence[Any],
                       weighted_in_loss: bool) -> Any:
        """Inside a `REMOTE` train step: send the gradients to the servers (`updates`)."""

    def fit_callbacks(self) -> list:
        """The modes' callbacks every fit / evaluate / predict of the strategy's models gets."""

    def set_compression(self, compression: Any) -> None:
        """Compress gradients on the wire with `compression` from now on (before an optimizer
        of the strategy is built)."""

    def replica_context(self) -> contextlib.AbstractContextManager:
        """This process's replica context (outside a step its `all_reduce` sums over the ranks
        through the strategy's gradient path)."""

    def placement_context(self) -> "PlacementContext":
        """The narrow view of this strategy a placement reads when an optimizer is built."""

    def rank_local_variables(self) -> contextlib.AbstractContextManager:
        """Variables created inside are this rank's own from the start (not broadcast: a
        sharded optimizer's slices differ in shape per rank)."""

    def build_aggregator_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """The hook's state for `variables`, as `optimizer`'s variables."""

    # -------------------------------------------------------------- agreement
    def any_rank(self, flag: bool, training: bool = False) -> bool:
        """True on every rank if `flag` is true on any rank."""

    def any_rank_each(self, flags: Sequence[bool], training: bool = False) -> list:
        """`any_rank` of each of several flags, in one exchange."""

    def barrier(self, what: str) -> None:
        """Every rank (worker) waits for the others, bounded by the job timeout; `what` names
        the barrier in the timeout's message."""

    def check_same_data(self, num_batches: Optional[int], fingerprint: Optional[tuple] = None,
                        signature: Optional[Sequence[int]] = None) -> None:
        """Fail clearly when ranks were given different data or arguments."""

    def epoch_data_scope(self, training: bool) -> contextlib.AbstractContextManager:
        """Context in which Keras builds an epoch iterator (`training`: fit's own)."""


MEMBERS = members(StrategyExtended)
