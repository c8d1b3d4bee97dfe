"""1-bit gradients with a per-tensor scale and error feedback (EF-SignSGD / 1-bit SGD).

Algorithm (Karimireddy et al., ICML 2019, "Error Feedback Fixes SignSGD";
Seide et al. 2014's 1-bit SGD with a scale per tensor), per gradient tensor
of n elements on each rank:

    a = g + e                 e: this rank's residual
    s = |a|_1 / n             one float32 scale per tensor
    send s and sign(a) as n bits (1: a_i >= 0)
    e <- a - s sign(a)
    sum = the sum over ranks of s_rank sign_rank (decoded the same on every rank)

The bits of all the bucket's tensors are packed eight to a byte (uint8),
followed by the tensors' scales as bytes, into one message per rank,
gathered from every rank in one `Wire.gather` ([P, ceil(N / 8) + 4 T]).
The messages are gathered, not summed: a sum of signs (majority vote) is
not the sum of the gradients, so this compressor needs the ring's
all-gather and is refused on the tree and the parameter server
(`Compressor.gathers`).

Guarantee: each step's sum is biased (every entry of a tensor moves by the
same magnitude s), but error feedback keeps what was not sent: sent + new
residual = g + old residual on every rank, and EF-SignSGD converges at
SGD's rate (Karimireddy et al., Theorem II) where plain signSGD may not.
Non-float gradients and gradients of no known variable are summed exactly.

Cost model (`predict_seconds`): an all-gather of n / 8 + 4 bytes per tensor
from each rank in a ring, (P - 1) alpha + (P - 1) (N / 8 + 4 T) beta,
against the ring all-reduce's 2 (P - 1) / P 4 N beta: P / 64 of its bytes,
so the wire pays up to P = 64; decoding costs P N multiply-adds per rank.
"""

import math

import tensorflow as tf

from tfdist.aggregation.compression import (ErrorFeedbackCompressor, all_gather_seconds,
                                            flatten, unflatten)

BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_bits(bits):
    """A bool vector of N as ceil(N / 8) uint8 (bit j of byte i: element 8 i + j)."""
    size = bits.shape.num_elements()
    padded = tf.pad(tf.cast(bits, tf.int32), [[0, -size % 8]])
    return tf.cast(tf.reduce_sum(tf.reshape(padded, [-1, 8]) * BIT_WEIGHTS, axis=1), tf.uint8)


def unpack_bits(packed, size):
    """The bool [..., size] that `pack_bits` packed into `packed` [..., ceil(size / 8)]."""
    bits = tf.bitwise.bitwise_and(tf.cast(packed, tf.int32)[..., None], BIT_WEIGHTS) > 0
    flat = tf.reshape(bits, tf.concat([tf.shape(packed)[:-1], [-1]], 0))
    return flat[..., :size]


class SignSGD(ErrorFeedbackCompressor):
    """Send each gradient's signs (1 bit per entry) and one scale, keep the error (module
    docstring)."""

    name = "signsgd"
    gathers = True

    def __repr__(self):
        return "SignSGD()"

    def build(self, optimizer, variables):
        for variable in variables:
            if tf.as_dtype(variable.dtype).is_floating:
                self.add_residual(optimizer, variable)

    def wire_ratio(self, dtype):
        return 1.0 / (8 * dtype.size)

    def predict_seconds(self, shapes, world_size, alpha, beta, inner, **options):
        del inner, options
        message = sum(math.ceil(math.prod(s) / 8) for s in shapes) + 4 * len(shapes)
        return all_gather_seconds(message, world_size, alpha, beta)

    def compressed_sums(self, gradients, variables, wire):
        accumulated, scales, state = [], [], []
        for gradient, variable in zip(gradients, variables):
            residual = self._residuals[id(variable)]
            a = tf.reshape(tf.cast(gradient, tf.float32) + tf.cast(residual, tf.float32), [-1])
            scale = tf.reduce_mean(tf.abs(a))
            sent = tf.where(a >= 0, scale, -scale)
            state.append((residual, tf.reshape(a - sent, residual.shape)))
            accumulated.append(a)
            scales.append(scale)
        flat, sizes = flatten(accumulated)
        total_size, count = flat.shape.num_elements(), len(sizes)
        packed = pack_bits(flat >= 0)
        scale_bytes = tf.reshape(tf.bitcast(tf.stack(scales), tf.uint8), [-1])
        every = wire.gather(tf.concat([packed, scale_bytes], 0))  # [P, bytes]
        signs = tf.where(unpack_bits(every[:, :packed.shape[0]], total_size), 1.0, -1.0)
        every_scale = tf.bitcast(tf.reshape(every[:, packed.shape[0]:], [-1, count, 4]),
                                 tf.float32)  # [P, T]
        per_entry = tf.repeat(every_scale, sizes, axis=1)  # [P, N]
        totals = unflatten(tf.reduce_sum(signs * per_entry, axis=0), gradients)
        return self.assign_if_finite(state, totals)
