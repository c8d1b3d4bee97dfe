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
from tfdist.aggregation.compressors import get_compressor, with_compression
from tfdist.aggregation.powersgd import PowerSGD
from tfdist.aggregation.signsgd import SignSGD, pack_bits, unpack_bits
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

    with pytest.raises(SimulationError, match="rank 0: all_reduce 0 waited .* without progress"):
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


def compressed_steps(comm, make_compressor, steps, algorithm="ring_one_bucket", optimizer=None,
                     overflow_step=None):
    """`steps` all-reduces of rank-dependent gradients through `make_compressor()` on
    `algorithm`: each step's sums, this rank's gradients, and its residual per tensor after
    the last step (zeros where the tensor is sent exactly). At `overflow_step` rank 0's
    gradients hold an inf (a loss-scaled step that overflowed)."""
    import keras  # pylint: disable=import-outside-toplevel

    compressor = make_compressor()
    aggregator = with_compression(ALGORITHMS[algorithm](comm), compressor)
    variables = [keras.Variable(np.zeros(shape, "float32"), name=f"v{i}")
                 for i, shape in enumerate(SHAPES)]
    optimizer = optimizer or keras.optimizers.SGD()
    aggregator.build(optimizer, variables)
    sums, gradients = [], []
    for step in range(steps):
        mine = [tf.constant(t) for t in rank_tensors(comm.rank + 10 * step)]
        if step == overflow_step and comm.rank == 0:
            mine = [t + tf.constant(np.inf, t.dtype) if t.shape.rank else t for t in mine]
        gradients.append(mine)
        sums.append(aggregator.all_reduce(mine, variables, roles=GRADIENT))
        optimizer.iterations.assign_add(1)
    residuals = [compressor.residual(v) for v in variables]
    return sums, gradients, [np.zeros(v.shape) if r is None else r.numpy()
                             for r, v in zip(residuals, variables)]


ERROR_FEEDBACK = {
    "topk_10": lambda: TopK(0.1),
    "topk_50": lambda: TopK(0.5),
    "signsgd": SignSGD,
    "powersgd_rank1_every_matrix": lambda: PowerSGD(rank=1, min_compression_rate=0),
    "powersgd_rank2": lambda: PowerSGD(rank=2),
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(ERROR_FEEDBACK))
def test_error_feedback_loses_nothing_sent_plus_residuals_is_every_gradient(name, world_size):
    """Error feedback's invariant: over any number of steps, the sums received plus the
    residuals every rank still holds equal the sum of every gradient; ranks agree bit for bit,
    and the compressor did withhold something."""
    results = simulate(world_size, lambda comm: compressed_steps(comm, ERROR_FEEDBACK[name], 3))
    withheld = 0.0
    for position, shape in enumerate(SHAPES):
        received = sum(np.asarray(s[position], "float64") for s in results[0][0])
        held = sum(np.asarray(r[2][position], "float64") for r in results)
        every = sum(np.asarray(g[position], "float64") for r in results for g in r[1])
        np.testing.assert_allclose(received + held, every, rtol=1e-5, atol=1e-5)
        withheld += float(np.abs(held).sum())
        for rank in range(world_size):
            for step in range(3):
                np.testing.assert_array_equal(results[rank][0][step][position],
                                              results[0][0][step][position])
    assert withheld > 0.1, name


@pytest.mark.parametrize("name", sorted(ERROR_FEEDBACK))
def test_a_step_that_overflows_leaves_the_compressors_state_as_it_was(name):
    """A LossScaleOptimizer skips a step whose gradients overflow; the residuals (and
    PowerSGD's Q) must then not take in the inf, or every later step would be inf too."""
    results = simulate(2, lambda comm: compressed_steps(comm, ERROR_FEEDBACK[name], 3,
                                                        overflow_step=1))
    assert not all(np.all(np.isfinite(s)) for s in results[0][0][1])  # step 1 overflowed
    for position in range(len(SHAPES)):  # error feedback's invariant, without step 1
        received = sum(np.asarray(results[0][0][step][position], "float64") for step in (0, 2))
        held = sum(np.asarray(r[2][position], "float64") for r in results)
        every = sum(np.asarray(r[1][step][position], "float64") for r in results for step in (0, 2))
        assert np.all(np.isfinite(held))
        np.testing.assert_allclose(received + held, every, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_topk_withholds_all_but_k_entries(world_size, ratio):
    results = simulate(world_size, lambda comm: compressed_steps(comm, lambda: TopK(ratio), 3))
    for position, shape in enumerate(SHAPES):
        size = int(np.prod(shape))
        sent = TopK(ratio).entries_sent(size)
        for _, _, residuals in results:  # after its last step a rank holds back the rest
            assert np.count_nonzero(residuals[position]) <= size - sent


EXACT_SETTINGS = {
    "topk_ratio_one_ring": (lambda: TopK(1.0), "ring"),
    "powersgd_full_rank_ring": (lambda: PowerSGD(rank=64, min_compression_rate=0), "ring"),
    "powersgd_full_rank_tree": (lambda: PowerSGD(rank=64, min_compression_rate=0),
                                "tree_fanout2"),
    # Warm-up: the first start_step steps are plain sums.
    "powersgd_before_start_step": (lambda: PowerSGD(rank=1, start_step=5,
                                                    min_compression_rate=0), "ring"),
}


@pytest.mark.parametrize("name", sorted(EXACT_SETTINGS))
def test_lossless_settings_give_the_exact_sum(name):
    make_compressor, algorithm = EXACT_SETTINGS[name]
    results = simulate(3, lambda comm: compressed_steps(comm, make_compressor, 2, algorithm))
    for step in range(2):
        want = [sum(np.asarray(rank_tensors(r + 10 * step)[i], "float64") for r in range(3))
                for i in range(len(SHAPES))]
        for sums, _, _ in results:
            for got, expected in zip(sums[step], want):
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


def test_powersgd_compresses_after_start_step_and_only_matrices_that_pay():
    compressor = PowerSGD(rank=2)  # (n + m) r 2 < n m
    assert [compressor.factor_rank(s) for s in SHAPES] == [None, None, None, None, None, 2]
    assert compressor.factor_rank((3, 3, 16, 32)) == 2  # a convolution: (3 3 16) x 32
    results = simulate(2, lambda comm: compressed_steps(
        comm, lambda: PowerSGD(rank=1, start_step=1, min_compression_rate=0), 2))
    want = sum(np.asarray(rank_tensors(r + 10)[5], "float64") for r in range(2))
    assert np.abs(np.asarray(results[0][0][1][5]) - want).max() > 1e-2  # step 1: rank 1 only
    assert np.linalg.matrix_rank(np.asarray(results[0][0][1][5]), tol=1e-4) == 1


@pytest.mark.parametrize("size", [1, 7, 8, 9, 64, 1001])
def test_sign_bits_pack_eight_to_a_byte_and_unpack(size):
    bits = np.random.default_rng(size).random(size) > 0.5
    packed = pack_bits(tf.constant(bits))
    assert packed.dtype == tf.uint8 and packed.shape == (-(-size // 8),)
    np.testing.assert_array_equal(unpack_bits(packed[None], size).numpy()[0], bits)


@pytest.mark.parametrize("compressor", [TopK(0.01), SignSGD()], ids=repr)
def test_a_gathering_compressor_on_the_tree_is_a_clear_error(compressor):
    with pytest.raises(SimulationError, match="gathers every rank's message.*'tree' algorithm"):
        simulate(2, lambda comm: with_compression(ALGORITHMS["tree_fanout2"](comm), compressor))


def test_bad_compressor_settings_are_clear_errors():
    for ratio in (0, 1.5, -0.1, True, "1%"):
        with pytest.raises(ValueError, match="TopK ratio must be a number in"):
            TopK(ratio)
    with pytest.raises(ValueError, match="TopK momentum must be None or a number in"):
        TopK(0.1, momentum=1.0)
    for rank in (0, 1.5, True):
        with pytest.raises(ValueError, match="PowerSGD rank must be an integer >= 1"):
            PowerSGD(rank=rank)
    with pytest.raises(ValueError, match="start_step must be an integer >= 0"):
        PowerSGD(start_step=-1)
    with pytest.raises(ValueError, match="min_compression_rate must be a number >= 0"):
        PowerSGD(min_compression_rate=float("nan"))
    with pytest.raises(ValueError, match="compression must be one of"):
        get_compressor("powersgd2")
    with pytest.raises(ValueError, match="not its class: PowerSGD()"):
        get_compressor(PowerSGD)


class _ServersOnly:
    """What `check_supported` reads of a parameter server's aggregator: its name, no
    communicator among the workers."""

    name = "ps"
    communicator = None


@pytest.mark.parametrize("compressor", [PowerSGD(), TopK(), SignSGD()], ids=repr)
def test_a_lossy_compressor_on_the_parameter_server_is_a_clear_error(compressor):
    assert not compressor.runs_on("ps") and compressor.runs_on("ring")
    with pytest.raises(ValueError, match=f"'{compressor.name}' compressor cannot run on the 'ps'"):
        compressor.check_supported(_ServersOnly())
    get_compressor("fp16").check_supported(_ServersOnly())  # the servers sum float16 fine
