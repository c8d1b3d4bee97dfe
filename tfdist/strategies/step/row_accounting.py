"""Row accounting: what one rank's step knows about the global batch it is part of.

On one process a Keras step sees the whole global batch of n rows. Across P
processes rank r sees its slice of n_r rows (`batch_slicing.shard_global_batch`),
and n_r may differ between ranks (a final partial batch) or be zero (fewer
rows than processes). Single-process results are recovered exactly by
weighting every rank's per-slice quantity by its *share* of the global
batch, n_r / n:

* the step's losses are means over the slice, as on one process (Keras'
  own 1 / num_replicas scaling is switched off by `keras_patches`), so the
  global gradient is sum_r (n_r / n) * grad_r - what one process computes
  for a mean loss over the global batch, for any split. When the step
  calls `optimizer.scale_loss` (Keras' own train_step does), the share is
  applied to the loss there instead, so every rank's backward pass carries
  the magnitudes one process would (this matters to float16 loss scaling);
* a batch-level metric update (a scalar passed to a `Mean` without
  weights, e.g. a per-output loss tracker or a custom train step's
  `loss_tracker.update_state(loss)`) counts once per global batch on one
  process, so its state change is weighted by the share as well;
* per-example metric state (accuracy counts, weighted sums) simply adds up.

A rank with an empty slice runs its step on a stand-in row of zeros (so
layers such as BatchNormalization see a valid batch) whose every effect is
weighted by zero.

`RowAccounting` holds these facts for the step being traced (the step's
`replica_step.ReplicaStep` is one).

The global row count n is known only after an all-reduce, and where it is
learned is a cost trade, decided per engine:

* after the sum (TensorFlow's collectives, Horovod: a small all-reduce costs
  about a millisecond there): share-weighted values are contributed as
  n_r * value, next to n_r, to the step's fused all-reduce (`StepSum`), and
  divided by the summed n afterwards - sum_r n_r v_r / n = sum_r share_r v_r.
  No collective of its own, but two element-wise passes over every gradient
  (the multiply, the divide). Only what needs the share before that point (a
  loss weighted for float16 loss scaling, a half-precision or compressed
  gradient) asks for n early (`RowAccounting.global_rows`: one small
  all-reduce, made once per step);
* provisionally (Keras' own step when the global batch's rows B are known
  alike on every rank - `fit`'s batch size - before the step: every engine
  but a compressing one, an optimizer that does not scale its loss): the loss
  is weighted by n_r / B, no collective
  before the backward pass and no pass over the gradients, which the step's
  fused all-reduce sums together with n_r; the sums are then n / B times the
  share-weighted ones, corrected by B / n through a `tf.cond` that leaves
  them untouched when n = B (`provisional_correction`: a pass only on an
  epoch's last, partial batch);
* first (Open MPI's engine, whose small all-reduce costs microseconds:
  `Aggregator.learns_rows_first`): one small all-reduce of n_r as the step
  begins; the share then weights the loss (`ReplicaStep.weight_loss`, a scalar
  multiply), so the gradients come out of the backward pass weighted and are
  summed as they are - no pass over them (a custom step that does not call
  `optimizer.scale_loss` weights each gradient once, before the sum).

Cost: after the sum, n_r adds one float to the step's fused all-reduce and
each gradient costs two element-wise passes; first, one small all-reduce and
no pass (2.3 ms a step less on 23 MB of gradients, in one measurement on 2
processes: `benchmarks/results/engine_step.json` has the steps).
"""


import tensorflow as tf


class RowAccounting:
    """One rank's rows of one global batch, and its share of it (see the module docstring).

    Attributes:
        local_rows: int32 scalar, rows of this rank's slice (n_r).
        has_rows: bool scalar, n_r > 0.

    The global batch's rows (`global_rows`, float32 n) and this rank's
    share n_r / n (`share`) are known once the step's fused all-reduce ran
    (`learn_global_rows`); read earlier, they cost one small all-reduce
    (`sum_over_ranks`, a callable summing a list of tensors over ranks).
    """

    def __init__(self, local_rows, global_rows=None, sum_over_ranks=None, expected_rows=None):
        self.local_rows = local_rows
        self.has_rows = local_rows > 0
        self.expected_rows = expected_rows
        self._global_rows = global_rows
        self._sum_over_ranks = sum_over_ranks
        self._share = None
        self._graph = tf.compat.v1.get_default_graph()

    @property
    def rows_known(self):
        """True once the global row count is a tensor of this step (no collective needed)."""
        return self._global_rows is not None

    @property
    def global_rows(self):
        """float32 scalar n, the global batch's rows (one small all-reduce if not known yet)."""
        if self._global_rows is not None:
            return self._global_rows
        rows = self._sum_over_ranks([tf.reshape(self.rows_weight(tf.float32), [1])])[0][0]
        self._remember_global_rows(rows)
        return rows

    def _remember_global_rows(self, rows):
        if tf.compat.v1.get_default_graph() is self._graph:
            self._global_rows = rows  # not inside a cond/loop branch: reusable for the step

    def sum_over_ranks(self, value):
        """float32 sum over ranks of the float32 scalar `value` (one small all-reduce)."""
        return self._sum_over_ranks([tf.reshape(value, [1])])[0][0]

    def sum_with_rows(self, value):
        """float32 sum over ranks of the float32 scalar `value`, before the step's end.

        One small all-reduce, which also carries this rank's row count if the
        global one is not known yet (then `global_rows` costs nothing more).
        """
        if self.rows_known:
            return self.sum_over_ranks(value)
        summed = self._sum_over_ranks([tf.stack([value, self.rows_weight(tf.float32)])])[0]
        self._remember_global_rows(summed[1])
        return summed[0]

    def weight_for_global_denominator(self, term, local_denominator, inner=None, outer=None):
        """A loss term over this slice, rescaled so that share weighting makes it exact.

        Keras reduces a loss term over a slice as S_r / D_r, and one process
        over the global batch as S / D, S = sum_r S_r, D = sum_r D_r, where D
        is what the term averages over: its elements (proportional to the
        rows: nothing to do), the valid tokens of a mask, the sum of the
        sample weights (`"mean_with_sample_weight"`), or nothing at all
        (`reduction="sum"`, `local_denominator` None: every rank's S_r counts
        whole). The step weights every per-slice value by its share n_r / n
        (the gradients, the loss tracker); so the term is returned times
        (D_r / D) (n / n_r), whose share-weighted sum over ranks is S / D.

        A denominator written as f(T_r), a guard around a batch sum (`max(T_r,
        1)`: `batch_dependence.RatioDenominator`), is global as f(sum_r T_r):
        `inner` is T_r and `outer` is f.

        Cost: one small all-reduce before the backward pass per such term
        (`sum_with_rows`); for a sum, the global row count only.
        """
        rows = self.rows_weight(tf.float32)
        if local_denominator is None:
            factor = tf.math.divide_no_nan(self.global_rows, rows)
        else:
            local = self.counted_if_rows(tf.cast(local_denominator, tf.float32))
            if inner is None:
                total = self.sum_with_rows(local)
            else:
                total = outer(self.sum_with_rows(
                    self.counted_if_rows(tf.cast(inner, tf.float32))))
            factor = tf.math.divide_no_nan(local, total) * tf.math.divide_no_nan(
                self.global_rows, rows)
        return term * tf.cast(factor, term.dtype)

    def learn_global_rows(self, rows):
        """The global row count, as summed by the step's fused all-reduce."""
        if self._global_rows is None:
            self._global_rows = rows

    @property
    def share(self):
        """float32 scalar n_r / n (0 for an empty slice)."""
        if self._share is not None:
            return self._share
        share = tf.math.divide_no_nan(tf.cast(self.local_rows, tf.float32), self.global_rows)
        if self.rows_known:
            self._share = share
        return share

    def weight(self, dtype):
        """The share as `dtype` (to weight a per-slice value)."""
        return tf.cast(self.share, dtype)

    @property
    def weighs_provisionally(self):
        """True where the loss is weighted by the provisional share n_r / B
        (`provisional_weight`): B known on every rank, n not yet."""
        return self.expected_rows is not None and not self.rows_known

    def provisional_weight(self, dtype):
        """n_r / B as `dtype`, B the global batch's expected rows, the same on every rank (the
        batch size `fit` was given). A sum over ranks of values weighted by it is n / B times
        the share-weighted sum: `provisional_correction` makes it exact once n is known."""
        return tf.cast(self.rows_weight(tf.float32) / float(self.expected_rows), dtype)

    def provisional_correction(self, total):
        """`total`, a sum over ranks of values weighted by `provisional_weight`, made the
        share-weighted sum: times B / n - through a `tf.cond` that passes the buffer on when
        n = B (every batch but an epoch's last partial one), so the usual step makes no pass
        over it. Needs n (after the step's fused all-reduce)."""
        rows = tf.cast(self.global_rows, tf.float32)
        return tf.cond(tf.equal(rows, float(self.expected_rows)), lambda: tf.identity(total),
                       lambda: total * tf.cast(self.provisional_factor(), total.dtype))

    def provisional_factor(self):
        """float32 B / n: what makes a sum weighted by `provisional_weight` share-weighted
        (exactly 1.0 when n = B). Needs n."""
        return tf.math.divide_no_nan(float(self.expected_rows),
                                     tf.cast(self.global_rows, tf.float32))

    def has_rows_weight(self, dtype):
        """1 if this rank's slice has rows, else 0, as `dtype` (an empty slice counts nothing)."""
        return tf.cast(self.has_rows, dtype)

    def counted_if_rows(self, value):
        """`value`, or zeros of its dtype when this rank's slice is empty (any dtype;
        a float NaN computed on the stand-in row becomes 0 too)."""
        return kept_or_zeros(value, self.has_rows)

    def rows_weight(self, dtype):
        """n_r as `dtype`: a per-slice mean times it is the slice's sum."""
        return tf.cast(self.local_rows, dtype)


def kept_or_zeros(value, keep):
    """`value` where the bool scalar `keep` is true, else zeros of its dtype (any dtype; a
    float NaN or infinity becomes 0 too)."""
    if value.dtype.is_floating or value.dtype.is_complex:
        return tf.math.multiply_no_nan(value, tf.cast(keep, value.dtype))
    return tf.where(keep, value, tf.zeros_like(value))
