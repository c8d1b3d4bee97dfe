"""The one fused all-reduce that ends a synchronous step.

Everything a step must sum across ranks - the gradients (when the update is
deferred to the end of the step, or at the optimizer's `apply`), metric
state and layer statistics (`local_state`), raw float logs, the
communication counters' exchange vector - is registered here and summed in
a single call of the strategy's aggregator, instead of one collective each.

Share-weighted values (sum over ranks of share_r * v_r, share_r = n_r / n)
need the global row count n, which is itself a sum over ranks. They are
contributed as n_r * v_r next to n_r, and divided by the summed n after the
all-reduce: sum_r n_r v_r / n = sum_r share_r v_r, in one collective. This
holds for float32/float64 values; a half-precision value (n_r * v could
overflow), and a gradient when the aggregator must see the global gradient's
values (`Aggregator.weights_gradients_first`: a compressor), is weighted by
the share directly, which asks the step for n first
(`ReplicaStep.global_rows`, one small all-reduce).

Every contribution carries its role (`aggregation.base.ROLES`): gradients
`GRADIENT`, the row count `ROWS`, everything else `EXACT`, so a lossy hook
only ever changes gradients.

The gradients of an optimizer whose state is sharded over the ranks, on an
engine that reduce-scatters (`scatter_to`: its `OptimizerShards`), are not
all-reduced: each rank needs only the sum of its own slice of them, which a
reduce-scatter per gradient bucket delivers (`OptimizerShards.reduce_scatter`)
next to the all-reduce of everything else; their results are this rank's
slices, weighted as the others.

Cost: one all-reduce of (gradient bytes + state bytes + 4 (P + 1)) bytes per
step, where the unfused step made three: the row count, the gradients and
the state; one element-wise multiply per value and one divide per
share-weighted value. Scattered gradients leave the all-reduce for a
reduce-scatter: (P - 1) / P of their bytes instead of 2 (P - 1) / P.
"""

import tensorflow as tf

from tfdist.aggregation.base import EXACT, GRADIENT, ROWS

_WEIGHT_AFTER_SUM = (tf.float32, tf.float64)


class StepSum:
    """Contributions to one fused all-reduce of a step; `run` sums them.

    Each `add_*` method returns a slot; after `run`, `result(slot)` is the
    sum over ranks (divided by n for share-weighted values).

    Args:
        step: the `replica_step.ReplicaStep` being traced.
        weights_gradients_first: gradients are weighted by the share before
            the sum (the aggregator's `weights_gradients_first`).
    """

    def __init__(self, step, weights_gradients_first=False):
        self.step = step
        self._weights_gradients_first = weights_gradients_first
        self._tensors = []
        self._variables = []
        self._roles = []
        self._divide_by_rows = []
        self._corrected = []  # per contribution: weighted provisionally (`provisional_weight`)
        self._scatter = []  # per contribution: (OptimizerShards, variable index) or None
        self._results = None

    def _add(self, tensor, variable, divide_by_rows, is_gradient, scatter, corrected=False):
        self._tensors.append(tensor)
        self._variables.append(variable)
        self._roles.append(GRADIENT if is_gradient else EXACT)
        self._divide_by_rows.append(divide_by_rows)
        self._corrected.append(corrected)
        self._scatter.append(scatter)
        return len(self._tensors) - 1

    def add_sum(self, value, variable=None, is_gradient=False, scatter=None,
                provisional=False):
        """sum_r value_r (the value is already weighted: zero where it must not count).

        `variable`: the variable `value` is the gradient of (for the
        aggregation hook), if known; `is_gradient`: it is a gradient;
        `scatter`: (OptimizerShards, index of the variable): the result is
        this rank's slice of the sum (reduce-scattered); `provisional`: the
        value carries n_r / B instead of the share (`RowAccounting.
        provisional_weight`): the sum is corrected once n is known.
        """
        return self._add(value, variable, False, is_gradient, scatter, provisional)

    def add_share_weighted(self, value, variable=None, is_gradient=False, scatter=None):
        """sum_r share_r value_r: a per-slice mean's value over the global batch (`scatter`:
        as `add_sum`'s)."""
        weight_after_sum = (value.dtype in _WEIGHT_AFTER_SUM and not self.step.rows_known
                            and not (is_gradient and self._weights_gradients_first))
        if weight_after_sum:
            return self._add(tf.math.multiply_no_nan(value, self.step.rows_weight(value.dtype)),
                             variable, True, is_gradient, scatter)
        return self._add(tf.math.multiply_no_nan(value, self.step.weight(value.dtype)),
                         variable, False, is_gradient, scatter)

    def run(self, all_reduce):
        """Sum every contribution with `all_reduce(tensors, variables, roles)` (one call), and
        those to scatter with their `OptimizerShards.reduce_scatter` (one per optimizer).

        The slice's row count joins the bucket when a value waits for n;
        the step then knows n (`ReplicaStep.learn_global_rows`).
        """
        reduced = [p for p, scatter in enumerate(self._scatter) if scatter is None]
        tensors = [self._tensors[p] for p in reduced]
        variables = [self._variables[p] for p in reduced]
        roles = [self._roles[p] for p in reduced]
        needs_rows = (any(self._divide_by_rows) or any(self._corrected)) and not (
            self.step.rows_known)
        if needs_rows:
            tensors.append(tf.reshape(self.step.rows_weight(tf.float32), [1]))
            variables.append(None)
            roles.append(ROWS)
        totals = [None] * len(self._tensors)
        for shards, positions in _by_owner(self._scatter).items():
            slices = shards.reduce_scatter({index: self._tensors[p] for p, index in positions})
            for p, index in positions:
                totals[p] = slices[index]
        summed = all_reduce(tensors, variables, roles) if tensors else []
        if needs_rows:
            rows = summed.pop()[0]
            self.step.learn_global_rows(rows)
        for p, total in zip(reduced, summed):
            totals[p] = total
        self._results = [
            tf.math.divide_no_nan(total, tf.cast(self.step.global_rows, total.dtype))
            if divide else self.step.provisional_correction(total) if corrected else total
            for total, divide, corrected in zip(totals, self._divide_by_rows, self._corrected)]

    def result(self, slot):
        """The summed value of `slot` (after `run`)."""
        return self._results[slot]


def _by_owner(scatter):
    """{OptimizerShards: [(position, variable index)]} of the contributions to scatter, in
    order of first contribution (the same on every rank)."""
    owners = {}
    for position, target in enumerate(scatter):
        if target is not None:
            owners.setdefault(target[0], []).append((position, target[1]))
    return owners
