"""The step's numerics in one process, P = 1..5 simulated ranks with uneven and empty slices.

`ReplicaStep` (a rank's view of the global batch), `StepSum` (the step's one
fused all-reduce, share weighting without a collective for n) and
`LocalStateSync` (metric state and layer statistics made global) are the
arithmetic that makes P processes train like one. Here each rank is a
thread with a simulated communicator (`tfdist.comm.simulated`) and the
results are compared with the single-process formulas directly, in seconds;
the multi-process suites check the same through Keras' `fit`.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.aggregation.base import EXACT, GRADIENT, ROWS
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.comm.simulated import simulate
from tfdist.strategies.state.local_state import LocalStateSync
from tfdist.strategies.step.replica_step import ReplicaStep
from tfdist.strategies.step.row_accounting import RowAccounting
from tfdist.strategies.step.step_plan import (DEFERRED, IMMEDIATE, LOCAL, REMOTE, StepPlan,
                                         plan_step)
from tfdist.strategies.step.step_sum import StepSum

# Rows per rank for each world size: uneven, with empty slices (more ranks than rows).
SPLITS = {1: [5], 2: [3, 2], 3: [2, 0, 1], 4: [1, 1, 1, 0], 5: [0, 2, 0, 1, 0]}
SPLIT_CASES = [pytest.param(split, id="-".join(map(str, split))) for split in SPLITS.values()]


def rank_value(rank, shape=(3,), dtype="float32"):
    return np.random.default_rng(rank).normal(size=shape).astype(dtype)


def run_step(split, fn):
    """`fn(step, aggregator, rank)` on every rank of `split`; each rank's result."""
    def run(comm):
        aggregator = RingAllReduceAggregator(comm)
        step = ReplicaStep(tf.constant(split[comm.rank]),
                           sum_over_ranks=lambda tensors: aggregator.all_reduce(tensors))
        return fn(step, aggregator, comm.rank)

    return simulate(len(split), run)


def shares(split):
    return np.asarray(split, "float64") / sum(split)


@pytest.mark.parametrize("split", SPLIT_CASES)
def test_step_sum_weights_by_each_slices_share_in_one_all_reduce(split):
    calls = []

    def fn(step, aggregator, rank):
        total = StepSum(step)
        weighted = total.add_share_weighted(tf.constant(rank_value(rank)), is_gradient=True)
        summed = total.add_sum(step.counted_if_rows(tf.constant(rank_value(rank + 10))))
        counted = total.add_sum(step.counted_if_rows(tf.constant([rank + 1], tf.int64)))

        def counting_all_reduce(tensors, variables, roles):
            calls.append(roles)
            return aggregator.all_reduce(tensors, variables, roles)

        total.run(counting_all_reduce)
        return [total.result(weighted), total.result(summed), total.result(counted),
                step.global_rows, step.share]

    want_weighted = sum(s * rank_value(r) for r, s in enumerate(shares(split)))
    want_summed = sum(rank_value(r + 10) for r, rows in enumerate(split) if rows)
    want_counted = sum(r + 1 for r, rows in enumerate(split) if rows)
    for rank, (weighted, summed, counted, rows, share) in enumerate(run_step(split, fn)):
        np.testing.assert_allclose(weighted, want_weighted, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(summed, want_summed, rtol=1e-6, atol=1e-7)
        assert counted.dtype == tf.int64 and counted.numpy().tolist() == [want_counted]
        assert float(rows) == sum(split)
        np.testing.assert_allclose(float(share), shares(split)[rank], rtol=1e-7)
    # One collective per rank: n travelled with the values.
    # One all-reduce per rank, each tensor with its role: the gradient, two exact sums and,
    # when the share waits for it, the row count.
    assert len(calls) == len(split)
    for roles in calls:
        assert roles[:3] == [GRADIENT, EXACT, EXACT] and roles[3:] in ([], [ROWS])


def test_half_precision_values_take_the_share_before_the_sum():
    """float16 n_r * v could overflow: the share is applied first (n asked for early)."""
    split = [3, 0, 1]

    def fn(step, aggregator, rank):
        total = StepSum(step)
        slot = total.add_share_weighted(tf.constant(rank_value(rank, dtype="float16")))
        total.run(aggregator.all_reduce)
        return total.result(slot)

    want = sum(s * rank_value(r, dtype="float16").astype("float64")
               for r, s in enumerate(shares(split)))
    for result in run_step(split, fn):
        assert result.dtype == tf.float16
        np.testing.assert_allclose(result.numpy().astype("float64"), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("split", SPLIT_CASES)
@pytest.mark.parametrize("denominator", ["mask", "sum"])
def test_a_loss_term_reweighted_for_its_global_denominator_equals_one_process(split, denominator):
    """Masked mean S_r / D_r (or a plain sum S_r): share-weighted over ranks it is S / D (or S)."""
    sums = [float(r + 1) * 1.5 for r in range(len(split))]
    valid = [2.0 * rows + r for r, rows in enumerate(split)]  # e.g. valid tokens of a mask
    valid = [v if rows else 0.0 for v, rows in zip(valid, split)]

    def fn(step, aggregator, rank):
        if denominator == "mask":
            term = tf.constant(sums[rank] / valid[rank] if valid[rank] else 0.0)
            term = step.weight_for_global_denominator(term, tf.constant(valid[rank]))
        else:
            term = step.weight_for_global_denominator(tf.constant(sums[rank]), None)
        total = StepSum(step)
        slot = total.add_share_weighted(step.counted_if_rows(term))
        total.run(aggregator.all_reduce)
        return total.result(slot)

    counted = [s for s, rows in zip(sums, split) if rows]
    want = sum(counted) / sum(valid) if denominator == "mask" else sum(counted)
    for result in run_step(split, fn):
        np.testing.assert_allclose(float(result), want, rtol=1e-6)


def test_a_users_own_loop_sums_its_gradients_unweighted():
    """`scaled_by_user` (strategy.run of the user's function): weight 1, empty slices included."""
    def fn(step, aggregator, rank):
        step.plan = StepPlan(IMMEDIATE, scaled_by_user=True)
        weight = step.gradient_weight(weighted_in_loss=False)(tf.float32)
        return aggregator.all_reduce([tf.constant(rank_value(rank)) * weight])[0]

    for result in run_step([2, 0, 1], fn):
        np.testing.assert_allclose(result, sum(rank_value(r) for r in range(3)), rtol=1e-6)


@pytest.mark.parametrize("split", SPLIT_CASES)
def test_local_state_becomes_what_one_process_holds(split):
    """Metric sums add up (empty slices count nothing), a per-batch Mean update is
    share-weighted, a moving statistic becomes the share-weighted mean."""
    def fn(step, aggregator, rank):
        def on_read_sum(value):
            return tf.Variable(value, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

        count, batch_mean = on_read_sum([10.0]), on_read_sum([4.0])
        moving = tf.Variable(rank_value(rank), trainable=False)
        assigned = [(count, count.read_value()), (batch_mean, batch_mean.read_value()),
                    (moving, None)]
        count.assign_add([float(split[rank] or 7)])  # 7 on the stand-in row: must not count
        batch_mean.assign_add([float(rank + 1)])
        step.note_batch_level_update([batch_mean])
        moving.assign(rank_value(rank + 20))
        total = StepSum(step)
        state = LocalStateSync(None, rank, len(split))
        slots = state.contribute(assigned, step, total)
        total.run(aggregator.all_reduce)
        state.assign(assigned, slots, total)
        return [count.numpy(), batch_mean.numpy(), moving.numpy()]

    want_mean_change = sum(s * (r + 1) for r, s in enumerate(shares(split)))
    want_moving = sum(s * rank_value(r + 20) for r, s in enumerate(shares(split)))
    for count, batch_mean, moving in run_step(split, fn):
        np.testing.assert_allclose(count, [10.0 + sum(split)])
        np.testing.assert_allclose(batch_mean, [4.0 + want_mean_change], rtol=1e-6)
        np.testing.assert_allclose(moving, want_moving, rtol=1e-6, atol=1e-7)


def _layer_state(value, aggregation, dtype="float32"):
    return tf.Variable(tf.constant(value, dtype), trainable=False,
                       aggregation=getattr(tf.VariableAggregation, aggregation))


@pytest.mark.parametrize("split", SPLIT_CASES)
def test_layer_state_follows_its_declared_aggregation(split):
    """A layer's own state (`add_weight(trainable=False, aggregation=...)`) as MirroredStrategy
    combines it: SUM adds every rank's change (float and int, an empty slice's stand-in row
    counting nothing), MEAN is share-weighted, ONLY_FIRST_REPLICA is rank 0's value, and an
    integer that declares nothing is left as it is when every rank agrees."""
    def fn(step, aggregator, rank):
        rows = split[rank] or 9  # 9 on the stand-in row: must not count
        variables = {
            "float_sum": _layer_state(100.0, "SUM"),
            "int_sum": _layer_state(100, "SUM", "int32"),
            "mean": _layer_state(rank_value(rank), "MEAN"),
            "first": _layer_state(1, "ONLY_FIRST_REPLICA", "int64"),
            "seed_state": _layer_state([3, 2 ** 40], "NONE", "int64"),
        }
        assigned = [(v, v.read_value() if name.endswith("sum") else None)
                    for name, v in variables.items()]
        variables["float_sum"].assign_add(float(rows))
        variables["int_sum"].assign_add(rows)
        variables["mean"].assign(rank_value(rank + 30))
        variables["first"].assign(10 + rank)
        variables["seed_state"].assign_add([1, 1])  # advances alike on every rank
        total = StepSum(step)
        state = LocalStateSync(None, rank, len(split))
        slots = state.contribute(assigned, step, total)
        total.run(aggregator.all_reduce)
        state.assign(assigned, slots, total)
        return {name: v.numpy() for name, v in variables.items()}

    want_mean = sum(s * rank_value(r + 30) for r, s in enumerate(shares(split)))
    for values in run_step(split, fn):
        assert values["float_sum"] == 100.0 + sum(split)
        assert values["int_sum"] == 100 + sum(split)
        np.testing.assert_allclose(values["mean"], want_mean, rtol=1e-6, atol=1e-7)
        assert values["first"] == 10
        assert values["seed_state"].tolist() == [4, 2 ** 40 + 1]


def test_integer_state_that_parts_between_ranks_fails_on_every_rank():
    """An integer that declares no aggregation and ends the step with different values is an
    error naming it on every rank alike (the ranks stay in step)."""
    def fn(step, aggregator, rank):
        counter = _layer_state(0, "NONE", "int32")
        counter.assign_add([3, 2, 2][rank])
        total = StepSum(step)
        state = LocalStateSync(None, rank, 3)
        slots = state.contribute([(counter, None)], step, total)
        total.run(aggregator.all_reduce)
        try:
            state.assign([(counter, None)], slots, total)
        except tf.errors.InvalidArgumentError as error:
            return str(error)
        return "accepted"

    for message in run_step([3, 2, 2], fn):
        assert "declares no aggregation" in message and "aggregation='sum'" in message, message


@pytest.mark.parametrize("split", SPLIT_CASES)
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_global_gradients_are_what_one_process_computes(split, compression):
    """Dense gradients share-weighted (fused, or compressed after weighting), sparse slices
    of indices every rank shares summed once, None kept - the one gradient path."""
    from tfdist.aggregation.compressors import with_compression  # pylint: disable=C0415
    from tfdist.profiling.counters import CommunicationCounters  # pylint: disable=C0415
    from tfdist.strategies.step import replica_step  # pylint: disable=C0415
    from tfdist.strategies.step.global_gradients import GlobalGradients  # pylint: disable=C0415

    def fn(step, aggregator, rank):
        comm = aggregator.communicator
        aggregator = with_compression(aggregator, compression)
        step = ReplicaStep(step.local_rows, sum_over_ranks=aggregator.all_reduce)
        gradients = GlobalGradients(aggregator, comm, CommunicationCounters(rank, comm.world_size))
        sparse = tf.IndexedSlices(tf.constant(rank_value(rank, shape=(2, 3))),
                                  tf.constant([4, 1]), tf.constant([6, 3]))
        with replica_step.active(step):
            dense, none, slices = gradients.aggregate(
                [tf.constant(rank_value(rank + 30)), None, sparse])
        return dense, none, slices

    weights = shares(split)
    want_dense = sum(s * rank_value(r + 30) for r, s in enumerate(weights))
    want_sparse = sum(s * rank_value(r, shape=(2, 3)) for r, s in enumerate(weights))
    tolerance = 2e-3 if compression == "fp16" else 1e-6
    for dense, none, slices in run_step(split, fn):
        np.testing.assert_allclose(dense, want_dense, rtol=tolerance, atol=tolerance)
        assert none is None
        assert slices.indices.numpy().tolist() == [4, 1]  # each shared index once
        np.testing.assert_allclose(slices.values, want_sparse, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("call, want", [
    # (one process, Keras' train_step, a train step, a user's function, asynchronous)
    ((True, True, True, False, False), StepPlan(LOCAL, training=True)),
    ((True, False, False, True, False), StepPlan(LOCAL)),  # a custom loop on one process
    ((False, True, True, False, False), StepPlan(DEFERRED, training=True)),
    ((False, False, True, False, False), StepPlan(IMMEDIATE, training=True)),  # custom step
    ((False, False, False, False, False), StepPlan(IMMEDIATE)),  # test/predict step
    ((False, False, False, True, False), StepPlan(IMMEDIATE, scaled_by_user=True)),
    ((False, True, True, False, True), StepPlan(REMOTE, training=True)),
    ((False, False, False, False, True), StepPlan(LOCAL)),  # async evaluate: whole batches
])
def test_every_step_is_planned_once_as_one_of_four_kinds(call, want):
    from tfdist.strategies.modes import (  # pylint: disable=C0415
        AsynchronousUpdates, SynchronousUpdates)

    *flags, asynchronous = call
    names = ("one_process", "is_keras_train_step", "is_train_step", "is_user_function")
    updates = AsynchronousUpdates() if asynchronous else SynchronousUpdates()
    assert updates.plan_step(**dict(zip(names, flags))) == want
    if not asynchronous:
        assert plan_step(**dict(zip(names, flags))) == want


def test_an_impossible_plan_is_refused():
    with pytest.raises(ValueError, match="updates must be one of"):
        StepPlan("fused")
    with pytest.raises(ValueError, match="not Keras' own train_step"):
        StepPlan(DEFERRED, scaled_by_user=True)


def _losses_weighted_in_fit(strategy_class, monkeypatch):
    """How many of each rank's `weight_loss` calls a 2-rank fit made (Adam: no loss scaling),
    and the ranks' kernels."""
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.simulation import simulate_processes  # pylint: disable=import-outside-toplevel

    calls = []
    original = ReplicaStep.weight_loss

    def counting(self, optimizer, loss):
        calls.append(type(optimizer).__name__)
        return original(self, optimizer, loss)

    monkeypatch.setattr(ReplicaStep, "weight_loss", counting)

    def run(rank):
        del rank
        x = np.random.default_rng(0).normal(size=(10, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        strategy = strategy_class()
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
        model.fit(x, y, batch_size=3, epochs=1, verbose=0, shuffle=False)  # a last slice 1+0
        return model.layers[0].kernel.numpy()

    return calls, simulate_processes(2, run)


def test_keras_own_step_weights_its_loss_provisionally_on_every_engine(monkeypatch):
    """fit's batch size is the global batch on every rank: Keras' own step weights its loss by
    n_r / B before the backward pass on the ring and the tree alike (no collective first, no
    gradient multiplied), and the last partial batch (1 + 0 rows of B = 3) is corrected after
    the sum: the kernels agree across ranks and aggregators."""
    import tfdist  # pylint: disable=import-outside-toplevel

    calls, kernels = _losses_weighted_in_fit(tfdist.strategies.RingAllReduceStrategy,
                                             monkeypatch)
    assert calls and set(calls) == {"Adam"}
    np.testing.assert_array_equal(kernels[0], kernels[1])
    tree_calls, tree_kernels = _losses_weighted_in_fit(
        tfdist.strategies.ReductionTreeStrategy, monkeypatch)
    assert tree_calls and set(tree_calls) == {"Adam"}
    np.testing.assert_allclose(kernels[0], tree_kernels[0], rtol=1e-5, atol=1e-6)


def test_a_gradient_whose_loss_carried_the_share_passes_as_it_is_or_as_zeros():
    gradient = tf.constant([1.0, np.nan, 3.0])
    kept = ReplicaStep(tf.constant(2)).counted_gradient(gradient)
    np.testing.assert_array_equal(kept.numpy(), gradient.numpy())
    empty = ReplicaStep(tf.constant(0))
    np.testing.assert_array_equal(empty.counted_gradient(gradient).numpy(), [0.0, 0.0, 0.0])

    @tf.function
    def traced(rows):
        return ReplicaStep(rows).counted_gradient(gradient * 2.0)

    np.testing.assert_array_equal(traced(tf.constant(0)).numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(traced(tf.constant(1)).numpy()[[0, 2]], [2.0, 6.0])
    user = ReplicaStep(tf.constant(0), plan=StepPlan(IMMEDIATE, scaled_by_user=True))
    assert user.counted_gradient(gradient) is gradient  # a user's function counts an empty slice


def test_a_provisionally_weighted_sum_is_corrected_only_on_a_partial_batch():
    """Values weighted by n_r / B and summed are n / B times the share-weighted sum: passed on
    as they are when n = B, times B / n otherwise."""
    total = tf.constant([3.0, 6.0])
    full = RowAccounting(tf.constant(2), global_rows=tf.constant(4.0), expected_rows=4)
    np.testing.assert_array_equal(full.provisional_correction(total).numpy(), [3.0, 6.0])
    partial = RowAccounting(tf.constant(2), global_rows=tf.constant(3.0), expected_rows=4)
    np.testing.assert_allclose(partial.provisional_correction(total).numpy(), [4.0, 8.0])
    unknown = RowAccounting(tf.constant(2), expected_rows=4)
    assert unknown.weighs_provisionally and not full.weighs_provisionally
    assert float(unknown.provisional_weight(tf.float32)) == 0.5
