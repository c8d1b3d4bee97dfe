"""Top-k sparsification with error feedback: each rank sends only its k largest gradient entries.

Algorithm, per gradient tensor of n elements (ratio r, k = max(1, ceil(r n))):

    a = g + e               e: this rank's residual (what earlier steps did not send)
    I = the k indices of the largest |a_i|
    send (I, a_I);  e <- a with a_I set to 0
    gather every rank's (I, a_I) (`Wire.gather`: P k int32 indices and P k values)
    sum = the scatter-add of all P k pairs into n zeros (the same on every rank)

Guarantee: one step's sum is biased (entries below the k-th are withheld),
but nothing is lost: sent + new residual = g + old residual on every rank
(error feedback: Stich et al. 2018; Deep Gradient Compression, Lin et al.
2018, without its momentum correction), so the sum of all updates equals
the sum of all gradients less the residuals still held, which restores
SGD's rate for this biased compressor. With r = 1 the sum is exact (the
residual stays 0). The residual is each rank's own: it is built with the
optimizer (`Compressor.build`: saved and restored with its slots, never
averaged across ranks). Gradients of no known variable and non-float
tensors are summed exactly.

Cost model (all-gather of 8 k bytes per rank, int32 index + float32 value,
in a ring): (P - 1) alpha + (P - 1) 8 k beta per tensor, against the ring
all-reduce's 2 (P - 1) alpha + 2 (P - 1) / P 4 n beta: fewer bytes when
k / n < 1 / P, plus top-k's O(n log k) on the device. The parameter
server cannot run it (its servers only sum): `check_supported` says so.
"""

import math

import tensorflow as tf

from tfdist.aggregation.compression import Compressor

DEFAULT_RATIO = 0.01


class TopK(Compressor):
    """Send each rank's `ratio` largest gradient entries, keep the rest for later (module
    docstring).

    Args:
        ratio: fraction of each gradient's entries a rank sends, in (0, 1].
    """

    name = "topk"

    def __init__(self, ratio=DEFAULT_RATIO):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"TopK ratio must be a number in (0, 1]. Got: {ratio!r}")
        self.ratio = float(ratio)
        self._residuals = {}  # id(variable) -> this rank's residual for its gradient

    @property
    def variables(self):
        return list(self._residuals.values())

    def check_supported(self, aggregator):
        if getattr(aggregator, "communicator", None) is None:
            raise ValueError(
                f"tfdist: the {self.name} compressor gathers every rank's indices and values "
                f"among the training processes; the {aggregator.name!r} algorithm only sums "
                "(through its servers). Use RingAllReduceStrategy or ReductionTreeStrategy.")

    def build(self, optimizer, variables):
        for variable in variables:
            if tf.as_dtype(variable.dtype).is_floating:
                self._residuals[id(variable)] = optimizer.add_variable_from_reference(
                    variable, "tfdist_topk_residual")

    def entries_sent(self, num_elements):
        """k: the entries a rank sends of a tensor of `num_elements`."""
        return max(1, min(num_elements, math.ceil(self.ratio * num_elements)))

    def wire_ratio(self, dtype):
        del dtype
        return min(1.0, 2.0 * self.ratio)  # index + value per sent entry, of 4-byte elements

    def reduce(self, gradients, variables, wire):
        results = [None] * len(gradients)
        exact = []
        for position, (gradient, variable) in enumerate(zip(gradients, variables)):
            residual = self._residuals.get(id(variable)) if variable is not None else None
            if residual is None or not gradient.dtype.is_floating:
                exact.append(position)
            else:
                results[position] = self._sparse_sum(gradient, residual, wire)
        if exact:
            for position, total in zip(exact, wire.sum([gradients[p] for p in exact])):
                results[position] = total
        return results

    def _sparse_sum(self, gradient, residual, wire):
        size = gradient.shape.num_elements()
        accumulated = tf.reshape(gradient, [-1]) + tf.cast(tf.reshape(residual, [-1]),
                                                           gradient.dtype)
        _, indices = tf.math.top_k(tf.abs(accumulated), self.entries_sent(size), sorted=False)
        values = tf.gather(accumulated, indices)
        sent = tf.scatter_nd(indices[:, None], values, [size])
        kept = residual.assign(tf.cast(tf.reshape(accumulated - sent, residual.shape),
                                       residual.dtype))
        with tf.control_dependencies([kept]):
            every_index = wire.gather(indices)
            every_value = wire.gather(values)
        total = tf.scatter_nd(tf.reshape(every_index, [-1, 1]), tf.reshape(every_value, [-1]),
                              [size])
        return tf.reshape(total, gradient.shape)
