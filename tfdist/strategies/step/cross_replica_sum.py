"""Cross-replica sums in a step's forward pass: exact for uneven and empty slices.

A layer may sum over replicas inside its forward pass:
`BatchNormalization(synchronized=True)` all-reduces its slice's sum, sum of
squares and row count (`tf.distribute.get_replica_context().all_reduce`), and
a user's layer or step may do the same. TensorFlow's `ReplicaContext.all_reduce`
gives the sum a backward pass that sums every rank's upstream gradient as it
is. tfdist weights each rank's gradients *after* the backward pass (by its
share n_r / n of the global batch: `row_accounting`), so that plain backward
sum is exact only when the slices are equal, and a rank running on a stand-in
row (an empty slice: `empty_slice`) would add the stand-in's statistics to
everyone's.

`StepReplicaContext` (the replica context of a tfdist step) sums differently,
with one rule for any such op:

* forward: a rank whose data is a stand-in row contributes zeros, so the sum
  is what the ranks' real rows give (SyncBN's mean and variance over the
  global batch's rows, as on one process);
* backward: every rank's upstream gradient dy_r is weighted by the weight w_r
  its gradients get after the backward pass (n_r in a Keras step whose loss
  is a per-slice mean; 1 where the loss already carries the share, as in a
  custom loop's `compute_average_loss(..., global_batch_size)` or under loss
  scaling), summed, and divided by this rank's w: rank r receives
  B_r = sum_s w_s dy_s / w_r. Its gradients, weighted by w_r and summed over
  ranks, then hold (sum_s w_s dy_s) times the sum of every rank's dS_r/dtheta:
  the chain rule through the global sum, as on one process.

Guarantee: a step with cross-replica sums in its forward pass gives the
gradients of the global batch's loss for any split of the rows, empty slices
included. `ReduceOp.MEAN` is the sum divided by the number of processes.
Cost: the same collectives as TensorFlow's (one all-reduce per call forward,
one backward), through the strategy's aggregator, never compressed.
"""

import tensorflow as tf

from tfdist import _tf
from tfdist.aggregation.base import EXACT
from tfdist.strategies.step import replica_step


def _is_mean(reduce_op):
    if isinstance(reduce_op, str):
        return reduce_op.upper() == "MEAN"
    return reduce_op == _tf.ReduceOp.MEAN


class StepReplicaContext(_tf.ReplicaContext):
    """The replica context of a tfdist step: `all_reduce` as the module docstring says.

    Args:
        strategy: the tfdist strategy.
        replica_id_in_sync_group: this process's rank.
        sum_over_ranks: list of tensors -> their sums over ranks (exact).
    """

    def __init__(self, strategy, replica_id_in_sync_group, sum_over_ranks):
        super().__init__(strategy, replica_id_in_sync_group=replica_id_in_sync_group)
        self._sum_over_ranks = sum_over_ranks

    def all_reduce(self, reduce_op, value, options=None):
        step = replica_step.current()
        flat = tf.nest.flatten(value)
        if (step is None or self.num_replicas_in_sync == 1
                or any(isinstance(v, tf.IndexedSlices) for v in flat)):
            return super().all_reduce(reduce_op, value, options)
        flat = [tf.convert_to_tensor(v) for v in flat]
        scale = 1.0 / self.num_replicas_in_sync if _is_mean(reduce_op) else 1.0
        sum_over_ranks = self._sum_over_ranks

        @tf.custom_gradient
        def summed(*values):
            totals = sum_over_ranks([step.counted_unless_stand_in(v) for v in values])

            def backward(*upstream):
                weight = step.backward_weight()
                upstream = [tf.zeros_like(v) if dy is None else dy
                            for v, dy in zip(values, upstream)]
                totals = sum_over_ranks([_scaled(dy, weight) for dy in upstream])
                return [_scaled(_divided(t, weight), scale) for t in totals]

            return [_scaled(t, scale) for t in totals], backward

        differentiable = [i for i, v in enumerate(flat)
                          if v.dtype.is_floating and _may_have_gradient(v)]
        results = list(flat)
        if differentiable:
            for i, total in zip(differentiable, summed(*[flat[i] for i in differentiable])):
                results[i] = total
        others = [i for i in range(len(flat)) if i not in differentiable]
        if others:
            totals = sum_over_ranks([step.counted_unless_stand_in(tf.stop_gradient(flat[i]))
                                     for i in others])
            for i, total in zip(others, totals):
                results[i] = total // self.num_replicas_in_sync if scale != 1.0 else total
        return tf.nest.pack_sequence_as(value, results)


def _may_have_gradient(tensor):
    """False for a graph tensor that no gradient can reach: every path back from it ends in
    a constant or passes an op without a gradient (`OnesLike`, `Shape`: a row count).

    The tape of a rank whose batch shape is static turns `tf.ones_like(x)` into a constant,
    while a rank tracing for any batch size keeps an `OnesLike` op that the tape records: a
    backward collective for such a sum would then run on some ranks only. Such sums get
    none on any rank.
    """
    if not hasattr(tensor, "op") or tf.executing_eagerly():
        return True
    pending, seen = [tensor.op], set()
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in ("Placeholder", "ReadVariableOp", "VarHandleOp", "ResourceGather"):
            return True  # an input or a variable: a gradient may reach it
        if op.type != "Const" and _tf.has_gradient(op):
            pending.extend(t.op for t in op.inputs)
    return False


def _scaled(tensor, factor):
    if isinstance(factor, float) and factor == 1.0:
        return tensor
    if not tensor.dtype.is_floating:
        return tensor
    return tf.math.multiply_no_nan(tensor, tf.cast(factor, tensor.dtype))


def _divided(tensor, weight):
    if not tensor.dtype.is_floating:
        return tensor
    return tf.math.divide_no_nan(tensor, tf.cast(weight, tensor.dtype))


def sum_exactly(aggregator_all_reduce):
    """`sum_over_ranks` for `StepReplicaContext` from `GlobalGradients.all_reduce`."""
    return lambda tensors: aggregator_all_reduce(list(tensors), EXACT)
