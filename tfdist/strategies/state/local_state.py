"""Keep per-step local state (metrics, BatchNorm statistics, layer state) identical on all ranks.

Inside a training or evaluation step each process updates non-trainable
variables from its own shard of the batch: metric accumulators (Keras creates
them `synchronization=ON_READ, aggregation=SUM`), layer statistics such as
BatchNormalization's moving mean, and a layer's own state
(`add_weight(trainable=False, aggregation=...)`, updated in `call`). tfdist
records which of them a step assigned and, when the step's replica function
returns, makes them global in the step's fused all-reduce (`step_sum.StepSum`,
with the gradients when the update is deferred), honouring the aggregation
each variable declares, as MirroredStrategy does:

* `SUM` (metrics, a counter declared `aggregation="sum"`, float or integer):
  value = value before the step + sum over ranks of this step's change.
  Per-example state (counts, weighted sums) adds up as it is; state updated
  once per batch (a scalar given to a `Mean` without weights, see
  `replica_step`) is weighted by each rank's share of the global batch.
  Metric state is then exactly the state a single process would hold after
  the whole global batch, so the logged loss and metrics equal a
  single-process run.
* `MEAN` (declared `"mean"`, and float variables that declare nothing, such
  as BatchNormalization's moving statistics): value = share-weighted mean
  over ranks (for BatchNormalization's moving mean this is exactly the
  single-process update; the moving variance averages per-slice variances).
  An integer is rounded back.
* `FIRST` (declared `"only_first_replica"`): rank 0's value.
* `CHECKED` (integer or boolean state that declares nothing: random-seed
  states, a user's counter): each rank keeps its own value, and the step
  fails with an error naming the variable if it ends with a value different
  from rank 0's (random-seed states advance alike on every rank; a counter
  of rows does not, and must declare how to aggregate).

A rank whose slice is empty (it ran on a stand-in row) contributes nothing.

Cost per step: (number of scalars in the assigned variables) elements -
a few bytes for metrics - added to the step's fused all-reduce, whatever
the number of metrics, plus one read per variable; a CHECKED integer adds 48
float32 per element (a Dropout layer's seed state: 96), in the step's float32
buffer, so no collective is added.
"""

import contextlib
import threading

import tensorflow as tf

from tfdist import _tf

SUM = "sum"
MEAN = "mean"
FIRST = "only_first_replica"
CHECKED = "checked"

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
    """How `variable` is made global after a step: SUM, MEAN, FIRST, CHECKED or None (untracked)."""
    dtype = tf.as_dtype(variable.dtype)
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool or dtype.is_complex):
        return None  # strings, resources
    aggregation = variable.aggregation
    if aggregation == tf.VariableAggregation.SUM:
        return SUM
    if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
        return FIRST
    if aggregation == tf.VariableAggregation.MEAN or dtype.is_floating or dtype.is_complex:
        return MEAN
    return CHECKED


class LocalStateSync:
    """Tracks local-state assignments during steps; makes them global in the step's sum.

    Args:
        extended: the strategy's extended object (assignments count only in
            its replica context).
        rank: this process's rank (rank 0's value wins for FIRST state).
        world_size: the number of ranks (CHECKED state is compared across them).
    """

    def __init__(self, extended, rank=0, world_size=1):
        self._extended = extended
        self._rank = rank
        self._world_size = world_size
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

    def contribute(self, assigned, replica_step, step_sum):
        """Add what each assigned variable contributes to `step_sum`; return the slots.

        `replica_step` (a `replica_step.ReplicaStep`) tells whether this
        rank's slice has rows and which metric variables were updated per batch.
        """
        slots = []
        for variable, before in assigned:
            current = variable.read_value()
            kind = sync_kind(variable)
            if kind == SUM:
                change = current - before
                if replica_step.is_batch_level(variable):
                    slots.append(step_sum.add_share_weighted(change))
                else:
                    slots.append(step_sum.add_sum(replica_step.counted_if_rows(change)))
            elif kind == MEAN:
                if not current.dtype.is_floating:
                    current = tf.cast(current, tf.float64)
                slots.append(step_sum.add_share_weighted(current))
            elif kind == FIRST:
                slots.append(step_sum.add_sum(self._rank_zero_only(current)))
            else:  # CHECKED
                chunks = _chunks(current)
                slots.append(step_sum.add_sum(tf.stack(
                    [chunks, chunks * chunks, self._rank_zero_only(chunks)])))
        return slots

    def _rank_zero_only(self, value):
        """`value` on rank 0, zeros elsewhere (integers as int64: summed exactly)."""
        if value.dtype.is_integer or value.dtype.is_bool:
            value = tf.cast(value, tf.int64)
        if self._rank == 0:
            return value
        return tf.zeros_like(value)

    def assign(self, assigned, slots, step_sum):
        """Set each assigned variable to its global value (after `step_sum.run`); the ops."""
        updates = []
        for (variable, before), slot in zip(assigned, slots):
            total = step_sum.result(slot)
            kind = sync_kind(variable)
            if kind == CHECKED:
                updates.append(_check_same_on_every_rank(variable, total, self._world_size))
                continue
            new_value = before + total if before is not None else total
            if new_value.dtype != variable.dtype:
                if new_value.dtype.is_floating and not variable.dtype.is_floating:
                    new_value = tf.round(new_value)
                new_value = tf.cast(new_value, variable.dtype)
            updates.append(tf.raw_ops.AssignVariableOp(resource=variable.handle, value=new_value))
        return updates


CHUNK_BITS = 4  # p < 16: sum_r p^2 < 256 P, exact in float32 for P < 65536 ranks


def _chunks(value):
    """An integer tensor's int64 bits as 16 chunks of 4 bits, float32 (last axis): their sums
    and sums of squares over ranks are exact in float32, so the check joins the step's float32
    buffer instead of adding an integer all-reduce to every step."""
    wide = tf.cast(value, tf.int64)
    mask = (1 << CHUNK_BITS) - 1
    return tf.cast(tf.stack([tf.bitwise.bitwise_and(tf.bitwise.right_shift(wide, CHUNK_BITS * k),
                                                    mask)
                             for k in range(64 // CHUNK_BITS)], axis=-1), tf.float32)


def _check_same_on_every_rank(variable, summed, world_size):
    """An op failing on every rank alike, naming `variable`, unless every rank holds rank 0's
    value: from the sums over ranks of each chunk p, of p * p and of rank 0's p0, the spread
    sum_r (p_r - p0)^2 = sum p^2 - 2 p0 sum p + P p0^2 is zero exactly when all are equal."""
    total, squares, first = summed[0], summed[1], summed[2]
    spread = squares - 2.0 * first * total + float(world_size) * first * first
    message = (f"tfdist: the {variable.dtype.name} variable {variable.name!r} declares no "
               "aggregation and ends this step with different values on the ranks (each rank "
               "updated it from its own slice). Declare how the ranks combine it: "
               "add_weight(..., aggregation='sum') for a count, 'mean' or 'only_first_replica'.")
    return tf.debugging.Assert(tf.equal(tf.reduce_max(spread), 0.0),
                               [message, "Its value on this rank:", variable.read_value()],
                               summarize=16)
