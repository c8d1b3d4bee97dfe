"""The global batch's gradients from one rank's: the one place gradients are weighted and summed.

Each rank's gradient (of a loss that is a mean over its slice) is weighted
by its share of the global batch, n_r / n, and summed over ranks
(`replica_step`); what one process computes for the whole batch. How a
gradient travels depends on its kind, decided here for every path of the
step:

* dense: contributed to a `StepSum` (the step's one fused all-reduce) as a
  `GRADIENT`; the share weight is applied after the sum,
  sum_r n_r g_r / n, so n costs no collective of its own - or before it
  when the aggregator must see the global gradient's values (a compressor,
  `Aggregator.weights_gradients_first`: the step learns n first, one small
  all-reduce), or when n is known already (`Aggregator.learns_rows_first`);
* `tf.IndexedSlices` (`gather_slices`): the slices one process has for the
  global batch - every rank's weighted (index, value) pairs in rank order
  when the indices come from the batch, or the shared indices once with the
  values summed over ranks when they do not (`batch_dependence`);
* dense, of an optimizer whose state is sharded on an engine that
  reduce-scatters (`scatter_to`: its `OptimizerShards`): contributed to
  the `StepSum` to be reduce-scattered; the result is this rank's slice of
  the global gradient, all its sharded update reads;
* a gradient whose loss already carried the share (float16 loss scaling, or
  any loss on an aggregator that learns n first: `ReplicaStep.weight_loss`) or
  its provisional n_r / B (`RowAccounting.provisional_weight`: corrected after
  the sum),
  or a user's loop that scales its loss itself (`ReplicaStep.scaled_by_user`),
  is summed as it is - zeros for an empty slice (`ReplicaStep.counted_gradient`), no
  pass over it.

The deferred path (Keras' own `train_step`: the update waits for the step's
end) and the immediate one (a custom step's `apply`) both use `add_to`; only
when they run `StepSum.run` differs.

Cost: dense gradients add their bytes to the step's fused all-reduce; sparse
ones cost one all-gather of P k values (k lookups per rank) plus their
indices.
"""

import tensorflow as tf

from tfdist import _tf
from tfdist.aggregation.base import GRADIENT
from tfdist.profiling.names import communication_scope
from tfdist.strategies.step import replica_step
from tfdist.strategies.step.step_sum import StepSum


class GlobalGradients:
    """Gradients made global through one aggregator; see the module docstring.

    Args:
        aggregator: the strategy's `tfdist.aggregation.base.Aggregator`.
        communicator: the process's communicator (all-gathers of sparse gradients).
        counters: the process's `CommunicationCounters` (sparse gathers are counted).
    """

    def __init__(self, aggregator, communicator, counters):
        self._aggregator = aggregator
        self._communicator = communicator
        self._counters = counters

    def step_sum(self, step):
        """A `StepSum` of `step` for this aggregator (gradients weighted as it needs them)."""
        return StepSum(step, self._aggregator.weights_gradients_first)

    def aggregate(self, gradients, variables=None, weighted_in_loss=False, scatter_to=None):
        """The global gradients now (a custom step's `apply`); unchanged outside a step.

        `variables`: the variable of each gradient (for the aggregation hook),
        or None; None gradients stay None. `scatter_to`: see `add_to`.
        """
        step = replica_step.current()
        if step is None:
            return list(gradients)
        total = self.step_sum(step)
        finish = self.add_to(total, gradients, variables, weighted_in_loss, scatter_to)
        total.run(self._aggregator.all_reduce)
        return finish()

    def add_to(self, total, gradients, variables, weighted_in_loss, scatter_to=None,
               global_already=()):
        """Contribute the gradients to `total` (a `StepSum`); return `finish`.

        `finish()`, called after `total.run`, gives the global gradients in
        order: dense ones from the sum, sparse ones gathered. `scatter_to`:
        the `OptimizerShards` of a sharded optimizer that reduce-scatters
        (`OptimizerShards.scatters`): its variables' dense gradients come back
        as this rank's slices of the global gradients. `global_already`: per gradient,
        True if the backward pass made it global (a sharded parameter's): not summed again,
        only corrected by B / n when the loss carried the provisional share.
        """
        step = total.step
        provisional = weighted_in_loss and step.loss_weighted_provisionally
        variables = list(variables) if variables is not None else [None] * len(gradients)
        slots = {}
        done = {position for position, already in enumerate(global_already) if already}
        for position, gradient in enumerate(gradients):
            if gradient is None or isinstance(gradient, tf.IndexedSlices) or position in done:
                continue
            index = scatter_to.index_of(variables[position]) if (
                scatter_to is not None and variables[position] is not None) else None
            scatter = (scatter_to, index) if index is not None else None
            if weighted_in_loss:
                slots[position] = total.add_sum(step.counted_gradient(gradient),
                                                variables[position], is_gradient=True,
                                                scatter=scatter, provisional=provisional)
            else:
                slots[position] = total.add_share_weighted(gradient, variables[position],
                                                           is_gradient=True, scatter=scatter)

        def finish():
            weight = step.gradient_weight(weighted_in_loss)
            result = list(gradients)
            for position, gradient in enumerate(gradients):
                if position in done:
                    if provisional and gradient is not None:
                        gradient = _times(gradient, step.provisional_factor())
                    result[position] = gradient
                elif position in slots:
                    result[position] = total.result(slots[position])
                elif isinstance(gradient, tf.IndexedSlices):
                    gathered = self.gather_slices(gradient, step, weight)
                    if provisional:  # B / n: exactly 1 (x * 1.0 == x) but on a partial batch
                        gathered = tf.IndexedSlices(
                            gathered.values * tf.cast(step.provisional_factor(),
                                                      gathered.values.dtype),
                            gathered.indices, gathered.dense_shape)
                    result[position] = gathered
            return result

        return finish

    def all_reduce(self, values, roles=GRADIENT, reduce_op=_tf.ReduceOp.SUM):
        """Sum (or mean) over ranks of `values` through the aggregator (`roles`: what they are).

        What `strategy.reduce` (`EXACT`) and a user's `batch_reduce_to`
        (`GRADIENT`) use.
        """
        if not self._aggregator.communicates or not values:
            return list(values)
        summed = self._aggregator.all_reduce([tf.convert_to_tensor(v) for v in values],
                                             roles=roles)
        if reduce_op == _tf.ReduceOp.MEAN:
            summed = [s / tf.cast(self._communicator.world_size, s.dtype) for s in summed]
        return summed

    def gather_slices(self, slices, step, weight):
        """The `IndexedSlices` one process has for the global batch (`batch_dependence`).

        Indices looked up from the batch: every rank's weighted (index,
        value) pairs, in rank order. Indices that do not depend on the
        batch (the same on every rank): those indices once, with the
        weighted values summed over ranks - after checking that they are
        the same on every rank: indices whose lineage was lost (an eager
        step's `.numpy()`) or that no rank shares (drawn at random) are
        gathered as pairs, never summed position by position. Indices made
        unique before the lookup are made unique again over the ranks.
        """
        values = _weighted(slices.values, weight)
        if step.lineage.reads_batch(slices.indices):
            rows = tf.where(step.has_rows, tf.shape(slices.indices)[0], 0)
            values, indices = self._gathered([values[:rows], slices.indices[:rows]])
            gathered = tf.IndexedSlices(values, indices, slices.dense_shape)
        else:
            gathered = self._shared_indices_summed(slices, values, step)
        if step.lineage.looked_up_once(slices.indices):
            return _summed_per_index(gathered)
        return gathered

    def _shared_indices_summed(self, slices, values, step):
        """Slices whose indices every rank shares: their values summed over ranks.

        Every rank's indices, values and (pairs, has rows) are gathered;
        when every rank holds the same indices the values are summed
        position by position (any value shape), otherwise the ranks' pairs
        are concatenated, those of empty slices left out. k indices cost
        P k values and P k indices of traffic, few for a position embedding.
        """
        pairs = tf.shape(slices.indices, out_type=tf.int32)[0]
        counts = tf.stack([pairs, tf.cast(step.has_rows, tf.int32)])[None]
        values, indices, counts = self._gathered([values, slices.indices, counts])
        world = self._communicator.world_size
        first = counts[0, 0]

        def same_on_every_rank():
            per_rank = tf.reshape(indices, [world, -1])
            return tf.reduce_all(tf.equal(per_rank, per_rank[:1]))

        shared = tf.cond(tf.reduce_all(tf.equal(counts[:, 0], first)), same_on_every_rank,
                         lambda: tf.constant(False))

        def summed():
            per_rank = tf.reshape(values, tf.concat([[world, -1], tf.shape(values)[1:]], axis=0))
            return tf.reduce_sum(per_rank, axis=0), indices[:first]

        def concatenated():
            kept = tf.repeat(tf.cast(counts[:, 1], tf.bool), counts[:, 0])
            return tf.boolean_mask(values, kept), tf.boolean_mask(indices, kept)

        values, indices = tf.cond(shared, summed, concatenated)
        return tf.IndexedSlices(values, indices, slices.dense_shape)

    def _gathered(self, tensors):
        """Every rank's `tensors`, concatenated in rank order (named and counted)."""
        counters = self._counters
        mine = sum(tf.size(t, tf.int64) * t.dtype.size for t in tensors) if counters.active else 0
        with tf.name_scope(communication_scope("all_gather", "sparse_gradients")):
            return counters.timed(
                tensors, lambda: tuple(self._communicator.all_gather(t) for t in tensors),
                payload_bytes=mine,
                sent_bytes=mine * (self._communicator.world_size - 1))


def _summed_per_index(slices):
    """Each index once, its values summed, in order of first occurrence: what one process
    holds for indices made unique before their lookup (`BatchLineage.looked_up_once`)."""
    indices, position = tf.unique(slices.indices)
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.size(indices))
    return tf.IndexedSlices(values, indices, slices.dense_shape)


def _times(gradient, factor):
    """`gradient` (dense or sparse) times the scalar `factor`."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def _weighted(tensor, weight):
    """`tensor` times `weight(dtype)` (NaN from a stand-in row times 0 is 0)."""
    return tf.math.multiply_no_nan(tensor, weight(tensor.dtype))
