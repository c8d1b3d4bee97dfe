"""The tree's shape, its chunking, and the alpha-beta cost model of every algorithm (no processes)."""

import pytest

from tfdist.aggregation.cost_model import predict_all_reduce_seconds
from tfdist.aggregation.tree import KaryTree, chunk_sizes, validate_fanout


@pytest.mark.parametrize("world", range(1, 12))
@pytest.mark.parametrize("fanout", [2, 3, 4])
def test_every_rank_but_the_root_has_one_parent_that_lists_it(world, fanout):
    tree = KaryTree(world, fanout)
    assert tree.parent(0) is None
    seen = []
    for rank in range(world):
        children = tree.children(rank)
        assert len(children) <= fanout
        for child in children:
            assert tree.parent(child) == rank
        seen += children
    assert sorted(seen) == list(range(1, world))


def test_shapes_and_depths():
    assert KaryTree(5, 2).children(0) == [1, 2] and KaryTree(5, 2).children(1) == [3, 4]
    assert KaryTree(5, 3).children(0) == [1, 2, 3] and KaryTree(5, 3).children(1) == [4]
    assert [KaryTree(p, 2).depth for p in (1, 2, 3, 4, 7, 8, 15, 16)] == [0, 1, 1, 2, 2, 3, 3, 4]
    star = KaryTree(6, 8)
    assert star.children(0) == [1, 2, 3, 4, 5] and star.depth == 1


@pytest.mark.parametrize("bad", [1, 0, -2, 2.0, "2", True, None])
def test_bad_fanout_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="fanout must be an integer >= 2. Got"):
        validate_fanout(bad)


@pytest.mark.parametrize("elements,chunk_bytes,expected_count", [
    (1000, 4000, 1), (1001, 4000, 2), (16 << 20, 4 << 20, 16), (3, 4, 3), (5, 1 << 30, 1)])
def test_chunks_are_near_equal_and_cover_the_buffer(elements, chunk_bytes, expected_count):
    sizes = chunk_sizes(elements, 4, chunk_bytes)
    assert len(sizes) == expected_count
    assert sum(sizes) == elements
    assert max(sizes) - min(sizes) <= 1
    assert max(sizes) * 4 <= max(chunk_bytes, 4)


def test_cost_model_formulas():
    alpha, beta, n = 1e-4, 1e-9, 8 << 20
    assert predict_all_reduce_seconds("ring", n, 4, alpha, beta) == pytest.approx(
        6 * alpha + 1.5 * n * beta)
    # A star (fanout >= P - 1, one chunk): 2 alpha + 2 (P - 1) n beta.
    assert predict_all_reduce_seconds("tree", n, 4, alpha, beta, fanout=3,
                                      chunk_bytes=n) == pytest.approx(2 * alpha + 6 * n * beta)
    # Binary tree over 4 (depth 2), 2 chunks: 2 (2 + 2 - 1) (alpha + 2 (n / 2) beta).
    assert predict_all_reduce_seconds("tree", n, 4, alpha, beta, fanout=2,
                                      chunk_bytes=n // 2) == pytest.approx(6 * (alpha + n * beta))
    # 8 MiB over 2 servers in 1 MiB pieces: 4 chained calls per server.
    assert predict_all_reduce_seconds("ps", n, 4, alpha, beta, num_servers=2) == pytest.approx(
        2 * (4 * alpha + 2 * n * beta))
    for algorithm in ("ring", "tree", "ps"):
        assert predict_all_reduce_seconds(algorithm, n, 1, alpha, beta) == 0.0


def test_tree_beats_ring_on_latency_and_loses_on_bandwidth():
    alpha, beta = 1e-3, 1e-9
    small, large = 4 << 10, 64 << 20
    for world in (4, 8, 16):
        assert (predict_all_reduce_seconds("tree", small, world, alpha, beta)
                < predict_all_reduce_seconds("ring", small, world, alpha, beta))
        assert (predict_all_reduce_seconds("tree", large, world, alpha, beta)
                > predict_all_reduce_seconds("ring", large, world, alpha, beta))


def test_unknown_algorithm_is_a_clear_error():
    with pytest.raises(ValueError, match="algorithm must be one of .* Got: 'butterfly'"):
        predict_all_reduce_seconds("butterfly", 1, 2, 1e-4, 1e-9)
