"""The global batch's gradients from one rank's: the one place gradients are weighted and summed.

Each rank's gradient (of a loss that is a mean over its slice) is weighted
by its share of the global batch, n_r / n, and summed over ranks
(`replica_step`); what one process computes for the whole batch. How a
gradient travels depends on its kind, decided here for every path of the
step:

* dense, uncompressed: contributed to a `StepSum` (the step's one fused
  all-reduce; the share weight is applied after the sum, sum_r n_r g_r / n,
  so n costs no collective of its own);
* dense, compressed on the wire (`aggregation.compression`): weighted by the
  share first (the step learns n first: one small all-reduce), then summed
  through the compressor, which must see the final values;
* `tf.IndexedSlices` (`gather_slices`): the slices one process has for the
  global batch - every rank's weighted (index, value) pairs in rank order
  when the indices come from the batch, or the shared indices once with the
  values summed over ranks when they do not (`batch_dependence`);
* a gradient whose loss already carried the share (float16 loss scaling,
  `ReplicaStep.weight_loss`), or a user's loop that scales its loss itself
  (`ReplicaStep.scaled_by_user`), is summed with the weight
  `ReplicaStep.gradient_weight` gives: 1, or 0 for an empty slice.

The deferred path (Keras' own `train_step`: the update waits for the step's
end) and the immediate one (a custom step's `apply`) both use `add_to`; only
when they run `StepSum.run` differs.

Cost: dense gradients add their bytes to the step's fused all-reduce; sparse
ones cost one all-gather of P k values (k lookups per rank) plus their
indices; compression one extra all-reduce of the row count per step.
"""

import tensorflow as tf

from tfdist import _tf
from tfdist.aggregation.base import GRADIENTS
from tfdist.aggregation.compression import NoCompression
from tfdist.strategies import replica_step
from tfdist.strategies.batch_dependence import reads_batch
from tfdist.strategies.step_sum import StepSum


class GlobalGradients:
    """Gradients made global through one aggregator; see the module docstring.

    Args:
        aggregator: the strategy's `tfdist.aggregation.base.Aggregator`.
        communicator: the process's communicator (all-gathers of sparse gradients).
        compression: the wire compression of dense gradients (`NoCompression`: none).
        counters: the process's `CommunicationCounters` (sparse gathers are counted).
    """

    def __init__(self, aggregator, communicator, compression, counters):
        self._aggregator = aggregator
        self._communicator = communicator
        self.compression = compression
        self._counters = counters

    @property
    def compresses(self):
        """True if dense gradients are compressed on the wire (they then cannot be deferred)."""
        return self.compression.name != NoCompression.name

    def aggregate(self, gradients, variables=None, weighted_in_loss=False):
        """The global gradients now (a custom step's `apply`); unchanged outside a step.

        `variables`: the variable of each gradient (for the aggregation hook),
        or None; None gradients stay None.
        """
        step = replica_step.current()
        if step is None:
            return list(gradients)
        total = StepSum(step)
        finish = self.add_to(total, gradients, variables, weighted_in_loss)
        total.run(self._aggregator.all_reduce)
        return finish()

    def add_to(self, total, gradients, variables, weighted_in_loss):
        """Contribute the gradients to `total` (a `StepSum`); return `finish`.

        `finish()`, called after `total.run`, gives the global gradients in
        order: dense ones from the sum (or compressed and summed on their
        own), sparse ones gathered.
        """
        step = total.step
        variables = list(variables) if variables is not None else [None] * len(gradients)
        dense = [position for position, gradient in enumerate(gradients)
                 if gradient is not None and not isinstance(gradient, tf.IndexedSlices)]
        slots = {}
        if not self.compresses:
            for position in dense:
                gradient, variable = gradients[position], variables[position]
                if weighted_in_loss:
                    slots[position] = total.add_sum(
                        _weighted(gradient, step.gradient_weight(True)), variable,
                        is_gradient=True)
                else:
                    slots[position] = total.add_share_weighted(gradient, variable,
                                                               is_gradient=True)

        def finish():
            weight = step.gradient_weight(weighted_in_loss)
            result = list(gradients)
            if self.compresses:
                summed = self.all_reduce([_weighted(gradients[p], weight) for p in dense],
                                         self.compression, [variables[p] for p in dense])
            else:
                summed = [total.result(slots[p]) for p in dense]
            for position, value in zip(dense, summed):
                result[position] = value
            for position, gradient in enumerate(gradients):
                if isinstance(gradient, tf.IndexedSlices):
                    result[position] = self.gather_slices(gradient, step, weight)
            return result

        return finish

    def all_reduce(self, values, compression, variables=None, kind=GRADIENTS,
                   reduce_op=_tf.ReduceOp.SUM):
        """Sum (or mean) over ranks of `values`, through `compression` and the aggregator.

        Also what `strategy.reduce` and a user's `batch_reduce_to` use (`kind` STATE:
        not gradients).
        """
        if not self._aggregator.communicates or not values:
            return list(values)
        wire, contexts = zip(*[compression.compress(tf.convert_to_tensor(v)) for v in values])
        summed = self._aggregator.all_reduce(list(wire), variables, kind)
        summed = [compression.decompress(s, c) for s, c in zip(summed, contexts)]
        if reduce_op == _tf.ReduceOp.MEAN:
            summed = [s / tf.cast(self._communicator.world_size, s.dtype) for s in summed]
        return summed

    def gather_slices(self, slices, step, weight):
        """The `IndexedSlices` one process has for the global batch (`batch_dependence`).

        Indices looked up from the batch: every rank's weighted (index,
        value) pairs, in rank order. Indices that do not depend on the
        batch (the same on every rank): those indices once, with the
        weighted values summed over ranks.
        """
        if not reads_batch(slices.indices, step.inputs):
            return self._sum_slices_of_shared_indices(slices, weight)
        rows = tf.where(step.has_rows, tf.shape(slices.indices)[0], 0)
        values = _weighted(slices.values, weight)[:rows]
        values, indices = self._gathered([values, slices.indices[:rows]])
        return tf.IndexedSlices(values, indices, slices.dense_shape)

    def _sum_slices_of_shared_indices(self, slices, weight):
        """Sum over ranks of the weighted values of slices whose indices every rank shares.

        Gathered and summed (any shape; k indices cost P k values of traffic,
        few for a position embedding).
        """
        values = _weighted(slices.values, weight)
        gathered, = self._gathered([values])
        per_rank = tf.reshape(gathered, tf.concat(
            [[self._communicator.world_size, -1], tf.shape(values)[1:]], axis=0))
        summed = tf.ensure_shape(tf.reduce_sum(per_rank, axis=0), values.shape)
        return tf.IndexedSlices(summed, slices.indices, slices.dense_shape)

    def _gathered(self, tensors):
        """Every rank's `tensors`, concatenated in rank order (named and counted)."""
        counters = self._counters
        mine = sum(tf.size(t, tf.int64) * t.dtype.size for t in tensors) if counters.active else 0
        with tf.name_scope("tfdist/all_gather/sparse_gradients/"):
            return counters.timed(
                tensors, lambda: tuple(self._communicator.all_gather(t) for t in tensors),
                payload_bytes=mine,
                sent_bytes=mine * (self._communicator.world_size - 1))


def _weighted(tensor, weight):
    """`tensor` times `weight(dtype)` (NaN from a stand-in row times 0 is 0)."""
    return tf.math.multiply_no_nan(tensor, weight(tensor.dtype))
