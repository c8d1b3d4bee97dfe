"""`tfdist.aggregation.recommend`: the cost model's choice of algorithm (no processes)."""

import dataclasses

import keras
import pytest

import tfdist
from tfdist.aggregation import recommend
from tfdist.aggregation.cost_model import predict_all_reduce_seconds
from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES
from tfdist.aggregation.recommend import Recommendation, search_space

GBIT = 1e9


def test_large_gradients_on_a_fast_network_take_the_ring():
    pick = recommend(100e6, processes=8, bandwidth=10 * GBIT, latency=50e-6)
    assert isinstance(pick, Recommendation)
    assert (pick.algorithm, pick.options) == ("ring", {})
    assert pick.predicted_seconds == pytest.approx(
        predict_all_reduce_seconds("ring", 100e6, 8, 50e-6, 8 / (10 * GBIT)))
    assert (pick.n_bytes, pick.processes, pick.bandwidth, pick.latency) == (
        100_000_000, 8, 10 * GBIT, 50e-6)


def test_alternatives_are_every_candidate_ranked_with_the_pick_first():
    pick = recommend(4 << 20, processes=6, bandwidth=GBIT, latency=1e-4)
    seconds = [c.predicted_seconds for c in pick.alternatives]
    assert seconds == sorted(seconds)
    assert len(pick.alternatives) == len(search_space(4 << 20, 6))
    first = pick.alternatives[0]
    assert (first.algorithm, first.options, first.predicted_seconds) == (
        pick.algorithm, pick.options, pick.predicted_seconds)
    for candidate in pick.alternatives:
        assert candidate.predicted_seconds == pytest.approx(predict_all_reduce_seconds(
            candidate.algorithm, 4 << 20, 6, 1e-4, 8 / GBIT, **candidate.options))


def test_small_gradients_with_high_latency_avoid_the_rings_many_messages():
    # 2 (P - 1) = 30 latencies for the ring; the servers need 2 each.
    pick = recommend(4096, processes=16, bandwidth=10 * GBIT, latency=1e-3)
    assert pick.algorithm == "ps" and pick.options["num_servers"] == 16
    ring = next(c for c in pick.alternatives if c.algorithm == "ring")
    assert ring.predicted_seconds > 10 * pick.predicted_seconds


def test_bandwidth_is_in_bits_per_second_and_latency_in_seconds():
    slow = recommend(8e6, processes=4, bandwidth=GBIT, latency=0.0, candidates=[("ring", {})])
    fast = recommend(8e6, processes=4, bandwidth=2 * GBIT, latency=0.0,
                     candidates=[("ring", {})])
    # 2 (P - 1) / P n bytes at 1 Gbit/s = 125 MB/s: 1.5 * 8e6 / 125e6 s.
    assert slow.predicted_seconds == pytest.approx(1.5 * 8e6 * 8 / GBIT)
    assert fast.predicted_seconds == pytest.approx(slow.predicted_seconds / 2)
    delayed = recommend(8e6, processes=4, bandwidth=GBIT, latency=1e-3,
                        candidates=[("ring", {})])
    assert delayed.predicted_seconds - slow.predicted_seconds == pytest.approx(6e-3)


def test_the_search_covers_fanouts_chunks_servers_and_pieces():
    pairs = search_space(3 << 20, 5)
    trees = [o for a, o in pairs if a == "tree"]
    assert {o["fanout"] for o in trees} == {2, 3, 4}
    chunks = {o["chunk_bytes"] for o in trees}
    assert min(chunks) == 64 << 10 and max(chunks) >= 3 << 20
    servers = [o for a, o in pairs if a == "ps"]
    assert {o["num_servers"] for o in servers} == {1, 2, 3, 4, 5}
    assert {o["piece_bytes"] for o in servers} >= {DEFAULT_PIECE_BYTES}
    assert search_space(100, 2).count(("ring", {})) == 1
    assert {o["fanout"] for a, o in search_space(100, 2) if a == "tree"} == {2}


def test_without_latency_the_tree_pipelines_in_the_smallest_chunks():
    pick = recommend(64 << 20, processes=8, bandwidth=GBIT, latency=0.0,
                     candidates=[(a, o) for a, o in search_space(64 << 20, 8) if a == "tree"])
    assert pick.options["chunk_bytes"] == 64 << 10


def test_on_a_tie_the_default_settings_win():
    # n / K fits in one piece of any size: every piece size costs the same.
    pick = recommend(256 << 10, processes=4, bandwidth=GBIT, latency=1e-3,
                     candidates=[(a, o) for a, o in search_space(256 << 10, 4) if a == "ps"])
    assert pick.options["piece_bytes"] == DEFAULT_PIECE_BYTES


def test_candidates_restrict_the_choice():
    only = [("tree", {"fanout": 2}), ("ps", {"num_servers": 1})]
    pick = recommend(1 << 20, processes=4, bandwidth=GBIT, latency=1e-4, candidates=only)
    assert [(c.algorithm, c.options) for c in pick.alternatives] == sorted(
        only, key=lambda pair: predict_all_reduce_seconds(pair[0], 1 << 20, 4, 1e-4, 8 / GBIT,
                                                          **pair[1]))


def test_a_keras_model_counts_its_trainable_variables_only():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(10),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    # Dense 5x10 + 10, BatchNormalization gamma + beta (moving statistics are not
    # trained), Dense 10x3 + 3: float32.
    expected = 4 * (5 * 10 + 10 + 2 * 10 + 10 * 3 + 3)
    assert recommend(model, processes=2, bandwidth=GBIT, latency=1e-4).n_bytes == expected


def test_the_recommendation_is_frozen():
    pick = recommend(1 << 20, processes=4, bandwidth=GBIT, latency=1e-4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pick.algorithm = "ring"


@pytest.mark.parametrize("algorithm,options,class_name", [
    ("ring", {}, "RingAllReduceStrategy"),
    ("tree", {"fanout": 3, "chunk_bytes": 1 << 20}, "ReductionTreeStrategy"),
    ("ps", {"num_servers": 2, "piece_bytes": DEFAULT_PIECE_BYTES}, "ParameterServerStrategy"),
])
def test_strategy_builds_the_recommended_strategy(monkeypatch, algorithm, options, class_name):
    built = []
    monkeypatch.setattr(tfdist.strategies, class_name,
                        lambda **kwargs: built.append(kwargs) or "strategy")
    pick = recommend(1 << 20, processes=4, bandwidth=GBIT, latency=1e-4,
                     candidates=[(algorithm, options)])
    assert pick.strategy(compression="fp16") == "strategy"
    assert built == [dict(options, compression="fp16")]


@pytest.mark.parametrize("kwargs,message", [
    ({"model_or_bytes": 0}, "model_or_bytes must be a Keras model or a positive number of "
                            "bytes. Got: 0"),
    ({"model_or_bytes": -5}, "model_or_bytes must be .* Got: -5"),
    ({"model_or_bytes": "1MB"}, "model_or_bytes must be .* Got: '1MB'"),
    ({"model_or_bytes": True}, "model_or_bytes must be .* Got: True"),
    ({"processes": 1}, r"processes must be an integer >= 2. Got: 1"),
    ({"processes": 2.5}, r"processes must be an integer >= 2. Got: 2.5"),
    ({"processes": True}, r"processes must be an integer >= 2. Got: True"),
    ({"bandwidth": 0}, r"bandwidth must be a number > 0. Got: 0"),
    ({"bandwidth": "10G"}, r"bandwidth must be a number > 0. Got: '10G'"),
    ({"bandwidth": float("inf")}, r"bandwidth must be a number > 0. Got: inf"),
    ({"latency": -1e-3}, r"latency must be a number >= 0. Got: -0.001"),
    ({"latency": float("nan")}, r"latency must be a number >= 0. Got: nan"),
    ({"candidates": []}, "candidates must list at least one"),
    ({"candidates": [("butterfly", {})]}, "algorithm must be one of"),
])
def test_bad_inputs_are_clear_errors(kwargs, message):
    arguments = dict(model_or_bytes=1 << 20, processes=4, bandwidth=GBIT, latency=1e-4)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        recommend(**arguments)


def test_an_unbuilt_model_is_a_clear_error():
    model = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="no trainable variables"):
        recommend(model, processes=2, bandwidth=GBIT, latency=1e-4)


ALL = ["fp16", "powersgd", "topk", "signsgd"]


def test_a_lossy_compressor_is_picked_only_where_it_makes_the_step_twice_as_fast():
    """A 4.4 MB model on 4 processes with 50 ms of computation per step: over 100 Mbit/s the
    gradient takes ~0.5 s on the ring and PowerSGD's factors a few ms; over 100 Gbit/s
    nothing beats the uncompressed ring by 2x on the whole step."""
    slow = recommend(4.4e6, processes=4, bandwidth=100e6, latency=1e-4, compression=ALL,
                     compute_seconds=0.05)
    assert slow.compression is not None and slow.compression.name != "fp16", slow
    assert slow.step_speedup >= 2.0
    fast = recommend(4.4e6, processes=4, bandwidth=100e9, latency=1e-5, compression=ALL,
                     compute_seconds=0.05)
    assert fast.compression is None or fast.compression.name == "fp16", fast
    assert any(c.compression is not None and c.compression.name == "topk"
               for c in fast.alternatives)  # considered, not picked
    assert all(c.compression is None or c.compression.runs_on(c.algorithm)
               for c in slow.alternatives + fast.alternatives)


def test_the_recommended_compression_goes_to_the_strategy(monkeypatch):
    built = []
    monkeypatch.setattr(tfdist.strategies, "RingAllReduceStrategy",
                        lambda **kwargs: built.append(kwargs) or "strategy")
    pick = recommend(4.4e6, processes=4, bandwidth=100e6, latency=1e-4, candidates=[("ring", {})],
                     compression=["topk"])
    assert pick.compression.name == "topk"
    assert pick.strategy() == "strategy" and built == [{"compression": pick.compression}]


def test_one_compressor_may_be_named_alone():
    pick = recommend(4.4e6, processes=4, bandwidth=100e6, latency=1e-4, compression="signsgd")
    assert {repr(c.compression) for c in pick.alternatives} == {"None", "SignSGD()"}


def test_by_default_only_compressors_that_kept_accuracy_are_considered():
    pick = recommend(4.4e6, processes=4, bandwidth=100e6, latency=1e-4, compression=True,
                     compute_seconds=0.05)
    assert repr(pick.compression) == "PowerSGD(rank=4, start_step=0, min_compression_rate=2)"
    assert {repr(c.compression) for c in pick.alternatives} == {
        "None", "FP16()", "PowerSGD(rank=4, start_step=0, min_compression_rate=2)"}


def test_a_memory_budget_picks_the_ring_with_the_optimizer_state_sharded():
    """Adam's state (2 n) replicated does not fit 3 n per process; sharded over 8 it does
    (2 n + (2 n + n) / 8), at the cost of the parameters' all-gather."""
    n = 100e6
    free = recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6,
                     optimizer_state_bytes=2 * n)
    assert (free.algorithm, free.options) == ("ring", {})  # sharding is never faster
    assert free.memory_bytes == 4 * n
    tight = recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6,
                      optimizer_state_bytes=2 * n, memory_budget_bytes=3 * n,
                      candidates=[("ring", {}), ("ring", {"shard_optimizer_state": True}),
                                  ("tree", {"fanout": 2, "chunk_bytes": 1 << 20})])
    assert (tight.algorithm, tight.options) == ("ring", {"shard_optimizer_state": True})
    assert tight.memory_bytes == int(2 * n + 3 * n / 8)
    alpha, beta = 50e-6, 8 / (10 * GBIT)
    assert tight.predicted_seconds == pytest.approx(
        predict_all_reduce_seconds("ring", n, 8, alpha, beta) + 7 * alpha + 7 / 8 * n * beta)
    with pytest.raises(ValueError, match="no candidate fits memory_budget_bytes"):
        recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6,
                  optimizer_state_bytes=2 * n, memory_budget_bytes=n)
    # Horovod's engine reduce-scatters the gradients: the sharded ring costs the unsharded.
    horovod = recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6,
                        optimizer_state_bytes=2 * n, memory_budget_bytes=3 * n,
                        backend="horovod")
    assert horovod.options == {"shard_optimizer_state": True, "backend": "horovod"}
    assert horovod.predicted_seconds == pytest.approx(
        predict_all_reduce_seconds("ring", n, 8, alpha, beta))
    # ... as Open MPI's does (MPI_Reduce_scatter_block).
    mpi = recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6,
                    optimizer_state_bytes=2 * n, memory_budget_bytes=3 * n, backend="mpi")
    assert mpi.options == {"shard_optimizer_state": True, "backend": "mpi"}
    assert mpi.predicted_seconds == pytest.approx(horovod.predicted_seconds)
    with pytest.raises(ValueError, match="backend must be one of"):
        recommend(n, processes=8, bandwidth=10 * GBIT, latency=50e-6, backend="nccl")
