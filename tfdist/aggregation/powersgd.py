"""PowerSGD: each gradient matrix summed as a rank-r product of two small sums, with error feedback.

Algorithm (Vogels, Karimireddy and Jaggi, NeurIPS 2019; as PyTorch DDP's
`powerSGD_hook`), per gradient viewed as an n x m matrix (a kernel's
leading dimensions x its last: a Dense kernel as it is, a convolution's
(h w c_in) x c_out), rank r, this rank's residual E and the shared,
warm-started m x r factor Q:

    M = G + E                               (error feedback)
    P = sum over ranks of M Q               (first sum: n x r per matrix)
    P = orthonormal basis of P's columns    (QR; the same on every rank)
    Q' = M^T P;   Q = sum over ranks of Q'  (second sum: m x r per matrix)
    sum = P Q^T;   E <- M - P Q'^T;   Q kept for the next step (warm start)

Every rank's contribution P P^T M_i is what it "sent", so sent + new
residual = G + old residual on every rank and the ranks' contributions add
up to the sum returned (error feedback: nothing is lost, only delayed).
One step's sum is the projection of the true sum onto an r-dimensional
column space (biased); error feedback and the warm start (one step of
subspace iteration per training step) restore SGD's rate in practice
(Vogels et al.: rank 2 matches full-precision accuracy on ResNet-18/CIFAR-10
and a 2-layer LSTM). With r >= min(n, m) the sum is exact up to rounding.

Only matrices are compressed, and only where it pays: a matrix is sent as
factors when (n + m) r x `min_compression_rate` < n m (PyTorch's rule);
vectors (biases, normalisation scales), small matrices and gradients of no
known variable ride exactly in the first sum. For the first `start_step`
optimizer steps every gradient is summed exactly (a plain all-reduce, no
residual), as PyTorch's `start_powerSGD_iter` (it suggests about 10% of
training; the default here, 0, compresses from the first step).

State (built with the optimizer, saved and restored with its slots; updated
only in steps whose sums are finite): E per compressed matrix, this rank's
own; Q per compressed matrix, identical on every rank (broadcast from rank 0
when created, then the sum of Q').

Cost model (`predict_seconds`): two sums through the inner algorithm (ring
or tree), of 4 (sum n r + exact elements) bytes and of 4 sum m r bytes:
twice the inner algorithm's latency term, and (n + m) r / (n m) of its
bandwidth term per matrix; on the device two matrix products per matrix
(O(n m r)) and a QR of n x r (O(n r^2)), not modelled.
"""

import math

import keras
import tensorflow as tf

from tfdist.aggregation.compression import ErrorFeedbackCompressor, split_by_state

DEFAULT_RANK = 1
DEFAULT_MIN_COMPRESSION_RATE = 2.0
Q_SEED = 1789  # the first Q's initializer (rank 0's value is broadcast anyway)


def matrix_shape(shape):
    """(n, m): a gradient of `shape` viewed as a matrix, or None for a scalar or vector."""
    if len(shape) < 2:
        return None
    return math.prod(shape[:-1]), shape[-1]


class PowerSGD(ErrorFeedbackCompressor):
    """Sum gradient matrices as rank-`rank` factors with error feedback (module docstring).

    Args:
        rank: r, the factors' rank (1-4 is usual; larger is closer to exact).
        start_step: optimizer steps summed exactly before compression starts.
        min_compression_rate: compress a matrix only where its factors are at
            least this many times smaller than it (0: every matrix).
    """

    name = "powersgd"

    def __init__(self, rank: int = DEFAULT_RANK, start_step: int = 0,
                 min_compression_rate: float = DEFAULT_MIN_COMPRESSION_RATE):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1. Got: {rank!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"PowerSGD start_step must be an integer >= 0. Got: {start_step!r}")
        if (isinstance(min_compression_rate, bool)
                or not isinstance(min_compression_rate, (int, float))
                or not math.isfinite(min_compression_rate) or min_compression_rate < 0):
            raise ValueError("PowerSGD min_compression_rate must be a number >= 0. "
                             f"Got: {min_compression_rate!r}")
        super().__init__()
        self.rank = rank
        self.start_step = start_step
        self.min_compression_rate = float(min_compression_rate)
        self._factors = {}  # id(variable) -> the warm-started Q
        self._iterations = None  # the optimizer's step counter (for start_step)

    def __repr__(self):
        return (f"PowerSGD(rank={self.rank}, start_step={self.start_step}, "
                f"min_compression_rate={self.min_compression_rate:g})")

    @property
    def variables(self):
        return super().variables + list(self._factors.values())

    def factor_rank(self, shape):
        """The rank of the factors `shape`'s gradient is sent as, or None: sent exactly."""
        matrix = matrix_shape(tuple(shape))
        if matrix is None:
            return None
        n, m = matrix
        rank = min(self.rank, n, m)
        return rank if (n + m) * rank * self.min_compression_rate < n * m else None

    def build(self, optimizer, variables):
        self._iterations = optimizer.iterations  # the latest optimizer's (a recompiled model)
        for variable in variables:
            rank = self.factor_rank(variable.shape)
            if rank is None or not tf.as_dtype(variable.dtype).is_floating:
                continue
            self.add_residual(optimizer, variable)
            self._factors[id(variable)] = optimizer.add_variable(
                (matrix_shape(tuple(variable.shape))[1], rank),
                initializer=keras.initializers.RandomNormal(seed=Q_SEED), dtype="float32",
                name=f"{variable.name}_tfdist_powersgd_q")

    def predict_seconds(self, shapes, world_size, alpha, beta, inner, **options):
        first = second = 0
        for shape in shapes:
            rank = self.factor_rank(shape)
            if rank is None:
                first += 4 * math.prod(shape)
            else:
                n, m = matrix_shape(tuple(shape))
                first, second = first + 4 * n * rank, second + 4 * m * rank
        seconds = inner.predict_seconds(first, world_size, alpha, beta, **options)
        if second:
            seconds += inner.predict_seconds(second, world_size, alpha, beta, **options)
        return seconds

    def reduce(self, gradients, variables, wire):
        low_rank, exact = split_by_state(gradients, variables, self._factors)
        if not low_rank:
            return wire.sum(gradients)
        matrices = [gradients[p] for p in low_rank]
        owners = [variables[p] for p in low_rank]
        results = [None] * len(gradients)
        if self.start_step == 0:
            totals, exact_sums = self._low_rank_sums(matrices, owners, wire,
                                                     [gradients[p] for p in exact])
        else:
            # The exact part (and the bucket's exact state) summed first, outside the branch.
            exact_sums = wire.sum([gradients[p] for p in exact])
            totals = tf.cond(
                self._iterations < self.start_step, lambda: wire.sum(matrices),
                lambda: self._low_rank_sums(matrices, owners, wire, [])[0])
        for position, total in zip(low_rank + exact, list(totals) + list(exact_sums)):
            results[position] = total
        return results

    def _low_rank_sums(self, gradients, variables, wire, carried):
        """The sums of `gradients` through their factors, and of `carried` exactly (first sum)."""
        matrices = []
        for gradient, variable in zip(gradients, variables):
            n, m = matrix_shape(tuple(gradient.shape))
            residual = self._residuals[id(variable)]
            matrices.append(tf.reshape(tf.cast(gradient, tf.float32), [n, m])
                            + tf.reshape(tf.cast(residual, tf.float32), [n, m]))
        factors = [self._factors[id(v)] for v in variables]
        first = wire.sum([tf.matmul(matrix, tf.cast(q, tf.float32))
                          for matrix, q in zip(matrices, factors)] + list(carried))
        bases = [tf.linalg.qr(p)[0] for p in first[:len(matrices)]]
        mine = [tf.matmul(matrix, basis, transpose_a=True)
                for matrix, basis in zip(matrices, bases)]
        second = wire.sum(mine)
        state, totals = [], []
        for gradient, variable, matrix, basis, q_mine, q_sum, q in zip(
                gradients, variables, matrices, bases, mine, second, factors):
            residual = self._residuals[id(variable)]
            kept = matrix - tf.matmul(basis, q_mine, transpose_b=True)
            state += [(residual, tf.reshape(kept, residual.shape)), (q, q_sum)]
            totals.append(tf.cast(tf.reshape(tf.matmul(basis, q_sum, transpose_b=True),
                                             gradient.shape), gradient.dtype))
        return self.assign_if_finite(state, totals), first[len(matrices):]
