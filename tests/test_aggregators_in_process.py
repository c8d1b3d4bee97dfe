"""Every aggregation algorithm sums exactly over P = 1..5 simulated ranks, in one process.

The ranks are threads with a `tfdist.comm.simulated` communicator each, so
the algorithms' own code (fusion into buffers, reverse-order buckets, the
tree's chunked pipeline over point-to-point transfers) runs unchanged
against P ranks without launching a process; the multi-process suites test
the engines and compiled steps.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.aggregation.base import EXACT, GRADIENT, ROWS
from tfdist.aggregation.compression import Compressor
from tfdist.aggregation.compressors import with_compression
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.topk import TopK
from tfdist.aggregation.tree import ReductionTreeAggregator
from tfdist.comm.simulated import SimulationError, as_numpy, simulate

WORLDS = [1, 2, 3, 4, 5]
SHAPES = [(3, 4), (7,), (), (2, 3, 5), (1,), (64, 9)]


def rank_tensors(rank, dtype="float32"):
    """Rank `rank`'s tensors: different values per rank, one tensor per shape in SHAPES."""
    rng = np.random.default_rng(100 + rank)
    return [rng.normal(size=shape).astype(dtype) for shape in SHAPES]


def exact_sums(world_size, dtype="float32"):
    per_rank = [rank_tensors(rank, dtype) for rank in range(world_size)]
    return [np.sum([np.asarray(ts[i], "float64") for ts in per_rank], axis=0)
            for i in range(len(SHAPES))]


ALGORITHMS = {
    # Tiny buckets and chunks: several buckets per call and several chunks per buffer.
    "ring": lambda comm: RingAllReduceAggregator(comm, bucket_bytes=256, first_bucket_bytes=64),
    "ring_one_bucket": lambda comm: RingAllReduceAggregator(comm, bucket_bytes=1 << 20),
    "tree_fanout2": lambda comm: ReductionTreeAggregator(comm, fanout=2, chunk_bytes=48,
                                                          bucket_bytes=256, first_bucket_bytes=64),
    "tree_fanout3": lambda comm: ReductionTreeAggregator(comm, fanout=3, chunk_bytes=100),
    "tree_star": lambda comm: ReductionTreeAggregator(comm, fanout=8),
}


@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_rank_gets_the_exact_sum(algorithm, world_size):
    def run(comm):
        aggregator = ALGORITHMS[algorithm](comm)
        tensors = [tf.constant(t) for t in rank_tensors(comm.rank)]
        return aggregator.all_reduce(tensors, variables=None, roles=GRADIENT)

    results = as_numpy(simulate(world_size, run))
    for rank, result in enumerate(results):
        for position, (got, want) in enumerate(zip(result, exact_sums(world_size))):
            assert got.shape == SHAPES[position]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{algorithm}, rank {rank}, tensor {position}")
            # Every rank holds the same bits (the weights must stay identical).
            np.testing.assert_array_equal(got, results[0][position])


@pytest.mark.parametrize("algorithm", ["ring", "tree_fanout2"])
def test_mixed_dtypes_and_consecutive_calls_keep_their_order(algorithm):
    """float32, float64 and int64 in one call, then a second call: each sum in place."""
    def run(comm):
        aggregator = ALGORITHMS[algorithm](comm)
        first = aggregator.all_reduce(
            [tf.constant([1.5, 2.0]), tf.constant([comm.rank], tf.int64),
             tf.constant(np.full((3, 3), comm.rank + 0.25))], roles=EXACT)
        second = aggregator.all_reduce([tf.fill([5], float(comm.rank))], roles=EXACT)
        return first + second

    for result in as_numpy(simulate(4, run)):
        np.testing.assert_allclose(result[0], [6.0, 8.0])
        assert result[1].dtype == np.int64 and result[1].tolist() == [6]
        assert result[2].dtype == np.float64
        np.testing.assert_allclose(result[2], np.full((3, 3), 7.0))
        np.testing.assert_allclose(result[3], np.full(5, 6.0))


def test_simulated_collectives_match_their_contract():
    def run(comm):
        gathered = comm.all_gather(tf.fill([comm.rank + 1, 2], float(comm.rank)))
        return (comm.all_reduce(tf.constant([comm.rank])), gathered,
                comm.broadcast(tf.constant([10 * comm.rank]), root=2),
                comm.all_gather_strings(f"rank-{comm.rank}"))

    for total, gathered, broadcast, names in simulate(3, run):
        assert total.numpy().tolist() == [3]
        assert gathered.shape == (6, 2)  # rows differ per rank: 1 + 2 + 3, in rank order
        assert gathered[:, 0].numpy().tolist() == [0, 1, 1, 2, 2, 2]
        assert broadcast.numpy().tolist() == [20]
        assert names == ["rank-0", "rank-1", "rank-2"]


def test_all_gather_equal_stacks_every_ranks_tensor_without_padding():
    def run(comm):
        return comm.all_gather_equal(tf.fill([2], comm.rank))

    for gathered in simulate(3, run):
        assert gathered.numpy().tolist() == [[0, 0], [1, 1], [2, 2]]
    with pytest.raises(SimulationError, match="all_gather_equal needs a tensor of fully known"):
        simulate(1, lambda comm: tf.function(comm.all_gather_equal).get_concrete_function(
            tf.TensorSpec([None], tf.float32)))


def test_a_failing_rank_ends_the_others_waits_with_its_name():
    def run(comm):
        if comm.rank == 1:
            raise ValueError("boom")
        return comm.all_reduce(tf.constant(1.0))

    with pytest.raises(SimulationError, match="rank 1 failed.*boom"):
        simulate(3, run, timeout=20)


def test_ranks_out_of_step_fail_instead_of_hanging():
    def run(comm):
        if comm.rank == 0:
            return comm.all_reduce(tf.constant(1.0))  # rank 1 never joins
        return None

    with pytest.raises(SimulationError, match="rank 0: all_reduce 0 waited more than"):
        simulate(2, run, timeout=1)


class SplitExchangeCompressor(Compressor):
    """Sums its gradients exactly, in two exchanges (as a low-rank scheme sends two factors);
    records what it was given, to show that only gradients reach a compressor."""

    name = "split-exchange"

    def __init__(self):
        self.seen = []

    def reduce(self, gradients, variables, wire):
        self.seen.append([tuple(g.shape) for g in gradients])
        half = len(gradients) // 2
        return wire.sum(gradients[:half]) + wire.sum(gradients[half:])


COMPRESSED = {
    "fp16_ring": (lambda: "fp16", ALGORITHMS["ring"]),
    "fp16_tree": (lambda: "fp16", ALGORITHMS["tree_fanout2"]),
    "split_exchange_ring": (SplitExchangeCompressor, ALGORITHMS["ring_one_bucket"]),
    "split_exchange_tree": (SplitExchangeCompressor, ALGORITHMS["tree_fanout3"]),
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_a_compressor_sees_only_gradients_and_state_stays_exact(name, world_size):
    """Roles per tensor: gradients through the compressor, exact state and row counts exact
    (values float16 cannot hold), every rank with the same bits."""
    make_compressor, make_algorithm = COMPRESSED[name]
    compressors = {}

    def run(comm):
        compressors[comm.rank] = compressor = make_compressor()
        aggregator = with_compression(make_algorithm(comm), compressor)
        gradients = [tf.constant(t) for t in rank_tensors(comm.rank)]
        state = [tf.constant([1.0 + 2.0 ** -20, 70000.0 + comm.rank]),
                 tf.constant([comm.rank + 1], tf.int64)]
        rows = [tf.constant([3.0 + comm.rank])]
        tensors = gradients[:3] + state + gradients[3:] + rows
        roles = [GRADIENT] * 3 + [EXACT] * 2 + [GRADIENT] * (len(SHAPES) - 3) + [ROWS]
        return aggregator.all_reduce(tensors, roles=roles)

    results = as_numpy(simulate(world_size, run))
    lossy = name.startswith("fp16")
    for rank, result in enumerate(results):
        gradients = result[:3] + result[5:-1]
        for got, want in zip(gradients, exact_sums(world_size)):
            np.testing.assert_allclose(got, want, rtol=5e-3 if lossy else 1e-5,
                                       atol=1e-2 if lossy else 1e-5)
        np.testing.assert_array_equal(
            result[3], np.float32([world_size * (1.0 + 2.0 ** -20),
                                   world_size * 70000.0 + sum(range(world_size))]))
        assert result[4].tolist() == [sum(range(1, world_size + 1))]
        np.testing.assert_array_equal(result[-1], [3.0 * world_size + sum(range(world_size))])
        for got, same in zip(result, results[0]):
            np.testing.assert_array_equal(got, same)
    if not lossy:
        for compressor in compressors.values():  # the gradients only, in every bucket
            assert sorted(sum(compressor.seen, [])) == sorted(SHAPES)


def test_an_unknown_compressor_object_is_a_clear_error():
    with pytest.raises(SimulationError, match="must be a name or a .*Compressor"):
        simulate(1, lambda comm: with_compression(ALGORITHMS["ring"](comm), object()))


def topk_step(comm, ratio, steps, algorithm="ring_one_bucket"):
    """`steps` all-reduces of rank-dependent gradients through TopK(ratio) on `algorithm`:
    each step's sums, and this rank's gradients and residuals."""
    import keras  # pylint: disable=import-outside-toplevel

    compressor = TopK(ratio)
    aggregator = with_compression(ALGORITHMS[algorithm](comm), compressor)
    variables = [keras.Variable(np.zeros(shape, "float32"), name=f"v{i}")
                 for i, shape in enumerate(SHAPES)]
    aggregator.build(keras.optimizers.SGD(), variables)
    sums, gradients = [], []
    for step in range(steps):
        mine = [tf.constant(t) for t in rank_tensors(comm.rank + 10 * step)]
        gradients.append(mine)
        sums.append(aggregator.all_reduce(mine, variables, roles=GRADIENT))
    return sums, gradients, [r.numpy() for r in compressor.variables]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_topk_loses_nothing_sent_plus_residuals_is_every_gradient(world_size, ratio):
    """Error feedback's invariant: over any number of steps, the sums received plus the
    residuals every rank still holds equal the sum of every gradient; ranks agree bit for bit."""
    results = simulate(world_size, lambda comm: topk_step(comm, ratio, steps=3))
    for position, shape in enumerate(SHAPES):
        received = sum(np.asarray(s[position], "float64") for s in results[0][0])
        held = sum(np.asarray(r[2][position], "float64") for r in results)
        every = sum(np.asarray(g[position], "float64") for r in results for g in r[1])
        np.testing.assert_allclose(received + held, every, rtol=1e-5, atol=1e-5)
        for rank in range(world_size):
            for step in range(3):
                np.testing.assert_array_equal(results[rank][0][step][position],
                                              results[0][0][step][position])
        size = int(np.prod(shape))
        sent = TopK(ratio).entries_sent(size)
        for _, _, residuals in results:  # after its last step a rank holds back the rest
            assert np.count_nonzero(residuals[position]) <= size - sent


@pytest.mark.parametrize("algorithm", ["ring", "tree_fanout2"])
def test_topk_with_ratio_one_is_the_exact_sum(algorithm):
    results = simulate(3, lambda comm: topk_step(comm, 1.0, steps=2, algorithm=algorithm))
    for step in range(2):
        want = exact_sums(3) if step == 0 else [
            sum(np.asarray(rank_tensors(r + 10)[i], "float64") for r in range(3))
            for i in range(len(SHAPES))]
        for sums, _, residuals in results:
            for got, expected in zip(sums[step], want):
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            assert all(not np.any(r) for r in residuals)


def test_a_ratio_outside_zero_one_is_a_clear_error():
    for ratio in (0, 1.5, -0.1, True, "1%"):
        with pytest.raises(ValueError, match="TopK ratio must be a number in"):
            TopK(ratio)
