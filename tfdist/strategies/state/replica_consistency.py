"""Every rank holds the same weights: checked, and a rank that drifts is named loudly.

A synchronous tfdist step ends with the same weights on every rank; so does
every save (`keras_patches.saving`). A rank whose weights differ from the
others' - a bug, a user's rank-dependent update, a kernel that is not
deterministic - would otherwise train on silently, and a checkpoint written
by the chief would not be what the other ranks hold. So the weights are
compared across ranks where it is cheap, and a difference stops every rank
with an error naming the variables that differ and the ranks that differ
from rank 0 (`ReplicasDiverged`):

* at every epoch end of `fit`: each rank posts a 32-bit fingerprint of its
  weights into the flags the next training step sums anyway
  (`AgreedFlags.post_fingerprint`: two floats per rank in the step's fused
  all-reduce, no collective added); after that step every rank reads every
  rank's fingerprint, so all of them find a difference at the same time and
  then exchange the per-variable fingerprints (one all-gather, only then)
  to name the variables;
* at the end of `fit`: the barrier that ends `fit` is an all-gather of the
  per-variable fingerprints (`check_now`);
* at a save: the chief's completion record holds its per-variable
  fingerprints, which every other rank that saves compares with its own
  (`keras_patches.saving`).

What is compared: the model's weights (trainable and not) and its
optimizer's variables, less the state each rank keeps for itself by design
(a compressor's residuals: `rank_state`). A fingerprint is the CRC-32 of a
variable's bytes: any bit that differs is found (two different values with
the same CRC-32 are missed with probability 2^-32 per variable).

Cost: reading every weight to the host and hashing it (about 25 ms for 23 MB
here) once per epoch and once per save; the step's all-reduce carries 2 P
floats more.
"""

import zlib
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdist.strategies.state import rank_state
from tfdist.strategies.keras_surface.model_strategy import tfdist_strategy

_SHOWN = 5  # variables named in an error


class ReplicasDiverged(RuntimeError):
    """Ranks that should hold the same weights do not; the message names the variables."""


def compared_variables(model) -> list:
    """The variables every rank must hold alike: the model's weights and its optimizer's
    variables, less each rank's own state (`rank_state`) and the optimizer-state mode's
    rank-local slots (a sharded state's slices)."""
    own = {id(v) for v in rank_state.rank_own_variables(model)}
    strategy = tfdist_strategy(model)
    if strategy is not None:
        own |= {id(v) for v in strategy.extended.placement.rank_local_slots(model)}
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.weights)
    if optimizer is not None and getattr(optimizer, "built", False):
        variables += list(optimizer.variables)
    seen, kept = set(), []
    for variable in variables:
        if id(variable) not in seen and id(variable) not in own:
            seen.add(id(variable))
            kept.append(variable)
    return kept


def variable_fingerprints(variables: Sequence) -> List[int]:
    """The CRC-32 of each variable's bytes (on the host)."""
    return [zlib.crc32(np.ascontiguousarray(np.asarray(v)).tobytes()) for v in variables]


def whole_fingerprint(fingerprints: Sequence[int]) -> int:
    """One 32-bit fingerprint of a list of variable fingerprints."""
    return zlib.crc32(np.asarray(fingerprints, np.uint32).tobytes())


def variable_name(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", "?")


def describe_differences(names: Sequence[str], mine: Sequence[int], others: Sequence[int]) -> str:
    """'a/kernel, b/bias (+3 more)': the variables whose fingerprints differ."""
    differing = [name for name, a, b in zip(names, mine, others) if a != b]
    if len(mine) != len(others):
        return f"a different number of variables ({len(mine)} here, {len(others)} there)"
    shown = ", ".join(differing[:_SHOWN])
    more = f" (+{len(differing) - _SHOWN} more)" if len(differing) > _SHOWN else ""
    return shown + more


def _halves(value: int) -> List[float]:
    """A 32-bit value as two 16-bit floats (exact in float32 sums of one value and zeros)."""
    return [float(value >> 16), float(value & 0xFFFF)]


def _joined(high: float, low: float) -> int:
    return (int(round(high)) << 16) | int(round(low))


def check_now(communicator, variables: Sequence, where: str) -> None:
    """Compare every variable across ranks now (one all-gather; a barrier too).

    Raises `ReplicasDiverged` on every rank when any rank's variables
    differ from rank 0's, naming the variables and those ranks.
    """
    fingerprints = variable_fingerprints(variables)
    flat = [half for value in fingerprints for half in _halves(value)]
    gathered = communicator.all_gather(tf.constant([flat], tf.float32)).numpy()
    by_rank = [[_joined(row[2 * i], row[2 * i + 1]) for i in range(len(fingerprints))]
               for row in gathered]
    differing_ranks = [rank for rank, row in enumerate(by_rank) if row != by_rank[0]]
    if not differing_ranks:
        return
    names = [variable_name(v) for v in variables]
    detail = "; ".join(f"rank {rank}: {describe_differences(names, by_rank[0], by_rank[rank])}"
                       for rank in differing_ranks)
    raise ReplicasDiverged(
        f"tfdist rank {communicator.rank}: the ranks' weights differ {where} - variables that "
        f"differ from rank 0's: {detail}. A synchronous step ends with the same weights on "
        "every rank: something changed them on some ranks only (a rank-dependent assignment "
        "in a callback or a custom step, a variable updated outside the step), or a bug in "
        "tfdist. Training stops rather than go on with ranks that disagree.")


class EpochEndCheck:
    """The epoch-end comparison of the module docstring, riding the next step's all-reduce.

    Args:
        flags: the strategy's `AgreedFlags` (the step vector the fingerprints ride).
        communicator: for the per-variable exchange once a difference is seen.
    """

    def __init__(self, flags, communicator):
        self._flags = flags
        self._communicator = communicator
        self._posted: Optional[str] = None  # where the posted fingerprints were taken

    def post(self, variables: Sequence, where: str) -> None:
        """This rank's fingerprint of `variables` joins the next training step."""
        self._flags.post_fingerprint(_halves(whole_fingerprint(variable_fingerprints(variables))))
        self._posted = where

    @property
    def posted(self) -> bool:
        """True while posted fingerprints wait for a step to carry them (`verify` then
        compares them; every other step has nothing to do)."""
        return self._posted is not None

    def verify(self, variables: Sequence) -> None:
        """After a training step: compare the fingerprints it carried, if any were posted."""
        if self._posted is None:
            return
        where, self._posted = self._posted, None
        summed = self._flags.fingerprints()
        pairs = [(_joined(high, low)) for high, low in zip(summed[::2], summed[1::2])]
        if len(set(pairs)) > 1:
            check_now(self._communicator, variables, where)  # every rank saw it: name them
