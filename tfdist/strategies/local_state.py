"""Keep per-step local state (metrics, BatchNorm statistics) identical on all ranks.

Inside a training or evaluation step each process updates non-trainable
variables from its own shard of the batch: metric accumulators (Keras creates
them `synchronization=ON_READ, aggregation=SUM`) and layer statistics such as
BatchNormalization's moving mean. tfdist records which of them a step
assigned and, when the step's replica function returns, makes them global in
the step's fused all-reduce (`step_sum.StepSum`, with the gradients when
the update is deferred):

* SUM-aggregated on-read variables (metrics): value = value before the step
  + sum over ranks of this step's change. Per-example state (counts,
  weighted sums) adds up as it is; state updated once per batch (a scalar
  given to a `Mean` without weights, see `replica_step`) is weighted by
  each rank's share of the global batch. Metric state is then exactly the
  state a single process would hold after the whole global batch, so the
  logged loss and metrics equal a single-process run.
* other float variables (moving statistics): value = share-weighted mean
  over ranks (for BatchNormalization's moving mean this is exactly the
  single-process update; the moving variance averages per-slice variances).

A rank whose slice is empty (it ran on a stand-in row) contributes nothing.

Integer variables that are not sums (random-seed states) stay local, so
dropout masks still differ between ranks.

Cost per step: (number of scalars in the assigned variables) elements -
a few bytes for metrics - added to the step's fused all-reduce, whatever
the number of metrics, plus one read per variable.
"""

import contextlib
import threading

import tensorflow as tf

from tfdist import _tf

SUM = "sum"
MEAN = "mean"


class _TrackedAssignments:
    """Mixin for tf.Variable: report assignments made inside a tfdist step."""

    def _tfdist_note_assignment(self):
        self._tfdist_tracker.note(self)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        self._tfdist_note_assignment()
        return super().assign(value, use_locking=use_locking, name=name, read_value=read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        self._tfdist_note_assignment()
        return super().assign_add(delta, use_locking=use_locking, name=name,
                                  read_value=read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        self._tfdist_note_assignment()
        return super().assign_sub(delta, use_locking=use_locking, name=name,
                                  read_value=read_value)


_tracked_classes = {}


def _tracked_class(base):
    if base not in _tracked_classes:
        _tracked_classes[base] = type(f"TfdistTracked{base.__name__}",
                                      (_TrackedAssignments, base), {})
    return _tracked_classes[base]


def sync_kind(variable):
    """How `variable` is made global after a step: SUM, MEAN or None (local)."""
    on_read = variable.synchronization == tf.VariableSynchronization.ON_READ
    if on_read and variable.aggregation == tf.VariableAggregation.SUM:
        return SUM
    if variable.dtype.is_floating:
        return MEAN
    return None


class LocalStateSync:
    """Tracks local-state assignments during steps; makes them global in the step's sum.

    Args:
        extended: the strategy's extended object (assignments count only in
            its replica context).
    """

    def __init__(self, extended):
        self._extended = extended
        self._local = threading.local()

    def track(self, variable):
        """Make `variable` report its assignments (if it is local state at all)."""
        if (variable.trainable or sync_kind(variable) is None
                or getattr(self._local, "rank_own", False)):
            return variable
        variable.__class__ = _tracked_class(type(variable))
        variable._tfdist_tracker = self  # pylint: disable=protected-access
        return variable

    @contextlib.contextmanager
    def rank_own_variables(self):
        """Variables created inside are this rank's own: never made global (a compressor's
        residual is this rank's compression error)."""
        previous = getattr(self._local, "rank_own", False)
        self._local.rank_own = True
        try:
            yield
        finally:
            self._local.rank_own = previous

    def note(self, variable):
        step = getattr(self._local, "step", None)
        if step is None or not _tf.in_replica_context_of(self._extended):
            return
        key = id(variable)
        if key not in step:
            before = variable.read_value() if sync_kind(variable) == SUM else None
            step[key] = (variable, before)

    def begin_step(self):
        self._local.step = {}

    def end_step(self):
        """Stop recording; the step's assigned variables as [(variable, value before or None)]."""
        step, self._local.step = getattr(self._local, "step", None), None
        return list(step.values()) if step else []

    @staticmethod
    def contribute(assigned, replica_step, step_sum):
        """Add what each assigned variable contributes to `step_sum`; return the slots.

        `replica_step` (a `replica_step.ReplicaStep`) tells whether this
        rank's slice has rows and which metric variables were updated per batch.
        """
        slots = []
        for variable, before in assigned:
            current = variable.read_value()
            if sync_kind(variable) == SUM:
                change = current - before
                if replica_step.is_batch_level(variable):
                    slots.append(step_sum.add_share_weighted(change))
                else:
                    slots.append(step_sum.add_sum(replica_step.counted_if_rows(change)))
            else:
                slots.append(step_sum.add_share_weighted(current))
        return slots

    @staticmethod
    def assign(assigned, slots, step_sum):
        """Set each assigned variable to its global value (after `step_sum.run`); the ops."""
        updates = []
        for (variable, before), slot in zip(assigned, slots):
            total = step_sum.result(slot)
            new_value = before + total if before is not None else total
            updates.append(tf.raw_ops.AssignVariableOp(resource=variable.handle, value=new_value))
        return updates
