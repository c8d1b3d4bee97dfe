"""Simulated ranks behave as processes where tfdist relies on it (`tfdist.simulation`).

Compiled collectives and transfers meet their peers' however TensorFlow
orders them, a function traced again on some ranks only keeps its
matches, each rank has its own Python and NumPy generators, and a thread
bound to a communicator is that rank for the runtime and the strategies.
"""

import gc
import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import runtime
from tfdist.comm import simulated
from tfdist.comm.simulated import SimulationError, simulate
from tfdist.simulation import simulate_processes


def test_compiled_collectives_meet_their_peers_in_any_order():
    """Two independent all-reduces of one shape in a function: TensorFlow may run them in
    either order on each rank; each must still be summed with its own peers."""
    def run(comm):
        @tf.function
        def step(a, b):
            return comm.all_reduce(a), comm.all_reduce(b), comm.all_gather(a[:comm.rank])

        return [step(tf.fill([3], float(comm.rank)), tf.fill([3], 10.0 * (comm.rank + 1)))
                for _ in range(3)]

    for results in simulate(3, run):
        for first, second, gathered in results:
            assert first.numpy().tolist() == [3.0] * 3
            assert second.numpy().tolist() == [60.0] * 3
            assert gathered.numpy().tolist() == [1.0, 2.0, 2.0]  # ranks 1 and 2's rows


def test_a_function_traced_again_on_one_rank_keeps_its_matches():
    """Slices differ by a row between ranks, so one rank traces a step again and the others
    do not (`trace_counter`): the collectives of both traces must still pair up."""
    def run(comm):
        step = tf.function(lambda x: comm.all_reduce(tf.reduce_sum(x)))
        rows = [2, 2, 1] if comm.rank == 0 else [2, 2, 2]
        return [float(step(tf.ones([n]))) for n in rows]

    assert simulate(2, run) == [[4.0, 4.0, 3.0]] * 2


def test_compiled_transfers_pair_by_key_and_run():
    def run(comm):
        key = comm.reserve_instance_keys(1)

        @tf.function
        def step(x):
            if comm.rank == 0:
                with tf.control_dependencies([comm.send(x, 1, key)]):
                    return tf.identity(x)
            return comm.recv([2], tf.float32, 0, key)

        return [step(tf.fill([2], float(i))).numpy().tolist() for i in range(3)]

    assert simulate(2, run)[1] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_a_rank_that_fails_in_a_compiled_step_names_itself():
    def run(comm):
        @tf.function
        def step(x):
            if comm.rank == 1:
                tf.debugging.assert_positive(x, message="rank one's own failure")
            return comm.all_reduce(x)

        return step(tf.constant(-1.0))

    with pytest.raises(SimulationError, match="rank 1"):
        simulate(2, run, timeout=20)


def _compute(seconds):
    """CPU-bound for `seconds`, every sample of this thread's Python stack the same (one line:
    the matrix products release the GIL, as a long native call of TensorFlow's does)."""
    a, end = np.random.default_rng(0).random((200, 200)), time.monotonic() + seconds
    while time.monotonic() < end: a = a @ a / np.abs(a @ a).max()  # noqa: E701


def test_a_late_peer_that_computes_is_waited_for_and_a_blocked_one_is_named():
    """A peer whose stack stays the same while its thread uses CPU time (one long native
    call) is late, not hung: its peers wait beyond the timeout; a blocked one (no CPU
    time) fails the wait within it, naming where it is."""
    release = threading.Event()

    def late(comm, keep_busy):
        if comm.rank == 0:
            if keep_busy:
                _compute(6.5)
            else:
                release.wait(60.0)
        return float(comm.all_reduce(tf.constant(1.0)))

    assert simulate(2, lambda comm: late(comm, True), timeout=3) == [2.0, 2.0]
    started = time.monotonic()
    try:
        with pytest.raises(SimulationError, match=r"rank 1: all_reduce .* without progress .*"
                                                  r"rank 0 is at .*in late .*CPU time"):
            simulate(2, lambda comm: late(comm, False), timeout=3)
    finally:
        release.set()
    assert time.monotonic() - started < 30


def test_every_rank_has_its_own_python_and_numpy_generators():
    def run(rank):
        random.seed(5)
        np.random.seed(5)
        draws = []
        for _ in range(200):  # other ranks draw in between, as the scheduler pleases
            draws.append((random.randint(0, 10**9), int(np.random.randint(0, 10**9))))
        return draws

    ranks = simulate_processes(4, run)
    assert all(draws == ranks[0] for draws in ranks)
    random.seed(5)
    assert ranks[0][0][0] == random.randint(0, 10**9)  # as one process draws
    assert random.randint.__self__ is random._inst  # restored  # pylint: disable=protected-access


def test_a_bound_thread_is_its_rank_for_the_runtime_and_the_strategies():
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        return (runtime.cluster().rank, runtime.cluster().world_size, strategy.rank,
                strategy.num_replicas_in_sync, strategy.extended.communicator.engine,
                runtime.bound_to_communicator())

    assert simulate_processes(3, run) == [(r, 3, r, 3, "simulated", True) for r in range(3)]
    assert not runtime.bound_to_communicator()
    assert runtime.cluster().launcher != "simulated"  # the process's own is untouched


def test_garbage_collections_run_on_the_waiting_thread_not_in_a_rank(monkeypatch):
    """A collection can block (a `tf.data` iterator in a cycle waits for its pipeline's
    threads); while ranks run, collections run on the thread that waits for them, so no rank
    stalls in one. Automatic collection is as it was afterwards."""
    monkeypatch.setattr(simulated, "COLLECT_EVERY_SECONDS", 0.05)
    finalized = []
    done = threading.Event()

    class InACycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            finalized.append(threading.current_thread().name)
            done.set()

    def run(comm):
        if comm.rank == 0:
            InACycle()
            _ = [[i] for i in range(100_000)]  # far past the youngest generation's threshold
            assert done.wait(20.0)
        comm.all_reduce(tf.ones([1]))

    enabled = gc.isenabled()
    simulate(2, run)
    assert finalized == ["MainThread"]
    assert gc.isenabled() == enabled
