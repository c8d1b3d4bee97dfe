"""Top-k sparsification with error feedback: each rank sends only its k largest gradient entries.

Algorithm, per gradient tensor of n elements (ratio r, k = max(1, ceil(r n))):

    a = g + e               e: this rank's residual (what earlier steps did not send)
    I = the k indices of the largest |a_i|
    send (I, a_I);  e <- a with a_I set to 0
    sum = the scatter-add of every rank's (I, a_I) into n zeros (the same on every rank)

The pairs of all the bucket's tensors travel in one message: K = sum of the
k's int32 indices into the bucket's flattened gradients, then the K values
as float32 bits, gathered from every rank in one `Wire.gather` ([P, 2 K]).

With momentum correction (`momentum=m`, Deep Gradient Compression, Lin et
al. 2018) the rank accumulates its own momentum before selecting:

    u <- m u + g;  a = e + u;  select as above;  e <- a with a_I = 0;  u_I <- 0

so that the momentum of the withheld entries is not lost (use the optimizer
without momentum then: `SGD(momentum=0)`); DGC's gradient clipping and
warm-up are left to the optimizer and the schedule.

Guarantee: one step's sum is biased (entries below the k-th are withheld),
but without momentum nothing is lost: sent + new residual = g + old residual
on every rank (error feedback: Stich et al. 2018), so the sum of all updates
equals the sum of all gradients less the residuals still held, which
restores SGD's rate for this biased compressor. With r = 1 the sum is exact
(the residual stays 0). The residual (and the velocity) is each rank's own:
built with the optimizer (`Compressor.build`: saved and restored with its
slots, never averaged across ranks). Gradients of no known variable and
non-float tensors are summed exactly.

Cost model (`predict_seconds`): an all-gather of 8 K bytes per rank in a
ring, (P - 1) alpha + (P - 1) 8 K beta, against the ring all-reduce's
2 (P - 1) alpha + 2 (P - 1) / P 4 n beta: fewer bytes when k / n < 1 / P
(top-k 1% pays up to P = 100 on the wire; the gathered pairs grow with P,
a sum does not), plus top-k's O(n log k) selection on the device. Runs on
the ring only (`Compressor.gathers`).
"""

import math
from typing import Optional

import tensorflow as tf

from tfdist.aggregation.compression import (ErrorFeedbackCompressor, all_gather_seconds,
                                            unflatten)

DEFAULT_RATIO = 0.01


class TopK(ErrorFeedbackCompressor):
    """Send each rank's `ratio` largest gradient entries, keep the rest for later (module
    docstring).

    Args:
        ratio: fraction of each gradient's entries a rank sends, in (0, 1].
        momentum: None, or DGC's momentum correction factor in [0, 1) (the
            momentum accumulated per rank before the selection).
    """

    name = "topk"
    gathers = True

    def __init__(self, ratio: float = DEFAULT_RATIO, momentum: Optional[float] = None):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"TopK ratio must be a number in (0, 1]. Got: {ratio!r}")
        if momentum is not None and (isinstance(momentum, bool) or not isinstance(
                momentum, (int, float)) or not 0 <= momentum < 1):
            raise ValueError(f"TopK momentum must be None or a number in [0, 1). "
                             f"Got: {momentum!r}")
        super().__init__()
        self.ratio = float(ratio)
        self.momentum = None if momentum is None else float(momentum)
        self._velocities = {}  # id(variable) -> this rank's momentum (momentum correction)

    def __repr__(self):
        momentum = "" if self.momentum is None else f", momentum={self.momentum}"
        return f"TopK(ratio={self.ratio}{momentum})"

    @property
    def variables(self):
        return super().variables + list(self._velocities.values())

    @property
    def rank_variables(self):
        return self.variables

    def build(self, optimizer, variables):
        for variable in variables:
            if tf.as_dtype(variable.dtype).is_floating:
                self.add_residual(optimizer, variable)
                if self.momentum is not None:
                    self._velocities[id(variable)] = optimizer.add_variable_from_reference(
                        variable, "tfdist_topk_velocity")

    def entries_sent(self, num_elements):
        """k: the entries a rank sends of a tensor of `num_elements`."""
        return max(1, min(num_elements, math.ceil(self.ratio * num_elements)))

    def wire_ratio(self, dtype):
        del dtype
        return min(1.0, 2.0 * self.ratio)  # index + value per sent entry, of 4-byte elements

    def predict_seconds(self, shapes, world_size, alpha, beta, inner, **options):
        pairs = sum(self.entries_sent(math.prod(shape)) for shape in shapes)
        del inner, options
        return all_gather_seconds(8 * pairs, world_size, alpha, beta)

    def _select(self, gradient, variable):
        """This rank's (indices, values) of `gradient`, and its new residual (and velocity)
        as (variable, value) pairs."""
        residual = self._residuals[id(variable)]
        flat = tf.reshape(tf.cast(gradient, tf.float32), [-1])
        if self.momentum is None:
            accumulated = flat + tf.reshape(tf.cast(residual, tf.float32), [-1])
        else:
            velocity = self._velocities[id(variable)]
            moved = self.momentum * tf.reshape(tf.cast(velocity, tf.float32), [-1]) + flat
            accumulated = tf.reshape(tf.cast(residual, tf.float32), [-1]) + moved
        size = flat.shape.num_elements()
        _, indices = tf.math.top_k(tf.abs(accumulated), self.entries_sent(size), sorted=False)
        values = tf.gather(accumulated, indices)
        kept = tf.tensor_scatter_nd_update(accumulated, indices[:, None], tf.zeros_like(values))
        state = [(residual, tf.reshape(kept, residual.shape))]
        if self.momentum is not None:
            masked = tf.tensor_scatter_nd_update(moved, indices[:, None], tf.zeros_like(values))
            state.append((velocity, tf.reshape(masked, velocity.shape)))
        return indices, values, state

    def compressed_sums(self, gradients, variables, wire):
        offset, all_indices, all_values, state = 0, [], [], []
        for gradient, variable in zip(gradients, variables):
            indices, values, new_state = self._select(gradient, variable)
            all_indices.append(indices + offset)
            all_values.append(values)
            state += new_state
            offset += gradient.shape.num_elements()
        indices, values = tf.concat(all_indices, 0), tf.concat(all_values, 0)
        pairs = indices.shape.num_elements()
        every = wire.gather(tf.concat([indices, tf.bitcast(values, tf.int32)], 0))
        # Each rank's pairs into a row of its own (no duplicate index within a row), then the
        # rows summed: the same order of additions on every rank and device.
        ranks = tf.broadcast_to(tf.range(tf.shape(every)[0])[:, None], tf.shape(every[:, :pairs]))
        positions = tf.stack([ranks, every[:, :pairs]], axis=-1)
        rows = tf.scatter_nd(tf.reshape(positions, [-1, 2]),
                             tf.reshape(tf.bitcast(every[:, pairs:], tf.float32), [-1]),
                             tf.stack([tf.shape(every)[0], offset]))
        totals = unflatten(tf.reduce_sum(rows, axis=0), gradients)
        return self.assign_if_finite(state, totals)
