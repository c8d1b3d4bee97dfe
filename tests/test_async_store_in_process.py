"""The asynchronous parameter server's store, in one process: updates, clocks, gates, barriers.

`AsyncParameterStore` is what a shard server runs; its RPC methods are
tf.functions, called here directly (the RPC runtime only carries them). So
the store's guarantees are checked in seconds: every push applied once with
the rate it carried, a pull's version the slowest worker's clock, the SSP
gate opening exactly when the slowest worker is within tau, a worker that
left or died no longer waited for, barriers releasing every live worker, a
backup's optimizer state read and set by slot name, a worker's flag reaching
every other worker's pulls.
"""

import json
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.aggregation.parameter_server.async_store import AsyncParameterStore

SET = 3
INITIAL = np.array([1.0, 2.0, 3.0, 4.0, 5.0], "float32")
SPEC = {"variables": [[[2, 2], "float32"], [[1], "float32"]],
        "optimizer": keras.optimizers.serialize(keras.optimizers.SGD(learning_rate=0.5))}


@pytest.fixture
def store():
    store = AsyncParameterStore("server 0", num_workers=3)
    store.start()
    calls = store.methods()
    # The chief sets the parameters up in two pieces (as large sets travel).
    calls["async_setup"](tf.constant(SET), tf.constant(0), tf.constant(json.dumps(SPEC)),
                         tf.constant(INITIAL[:2]), tf.constant(False))
    calls["async_setup"](tf.constant(SET), tf.constant(0), tf.constant(json.dumps(SPEC)),
                         tf.constant(INITIAL[2:]), tf.constant(True))
    store.calls = calls
    yield store
    assert store.error is None, store.error
    store.stop(timeout=10)


def push(store, worker, step, gradients, rate, pieces=1, flags=0):
    parts = np.array_split(np.asarray(gradients, "float32"), pieces)
    for index, part in enumerate(parts):
        store.calls["async_push"](tf.constant(SET), tf.constant(worker), tf.constant(step, tf.int64),
                                  tf.constant(rate), tf.constant(part),
                                  tf.constant(index == len(parts) - 1),
                                  tf.constant(flags, tf.int64))


def pull(store, worker, piece_elements=1 << 20, with_flags=False, method="async_pull",
         extra=(), size=len(INITIAL)):
    version, values, flags = store.calls[method](tf.constant(SET), tf.constant(worker),
                                                 tf.constant(piece_elements, tf.int64), *extra)
    pieces = [values.numpy()]
    while sum(len(p) for p in pieces) < size:
        pieces.append(store.calls["async_pull_more"](tf.constant(worker))[1].numpy())
    if with_flags:
        return int(version), np.concatenate(pieces), int(flags)
    return int(version), np.concatenate(pieces)


def in_background(fn):
    """Start `fn` in a thread; returns a function telling whether it finished, and its result."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("value", fn()), daemon=True)
    thread.start()

    def finished(within=0.5):
        thread.join(within)
        return not thread.is_alive(), outcome.get("value")

    return finished


def test_every_push_is_applied_once_with_its_own_rate_and_pulls_carry_the_slowest_clock(store):
    assert pull(store, 1) == (0, pytest.approx(INITIAL))
    push(store, 0, 0, [1, 1, 1, 1, 1], rate=0.5, pieces=2)  # applied once, when whole
    push(store, 1, 0, [0, 0, 0, 0, 2], rate=0.25)
    push(store, 0, 1, [2, 0, 0, 0, 0], rate=0.5)
    version, values = pull(store, 2, piece_elements=2)  # answered in three pieces
    np.testing.assert_allclose(values, INITIAL - [0.5 + 1.0, 0.5, 0.5, 0.5, 0.5 + 0.5])
    assert version == 0  # worker 2 has pushed nothing yet
    assert int(store.applied.numpy()) == 3
    push(store, 2, 0, [0] * 5, rate=0.5)
    assert pull(store, 0)[0] == 1  # every worker's first push is in


def gate(store, worker, step, tau):
    return lambda: int(store.calls["async_gate"](tf.constant(worker), tf.constant(step, tf.int64),
                                                 tf.constant(tau, tf.int64)))


def test_ssp_gate_opens_when_the_slowest_worker_is_within_tau(store):
    zeros = [0] * 5
    for step in range(2):
        push(store, 0, step, zeros, 0.5)
    push(store, 1, 0, zeros, 0.5)
    # Worker 0 is about to make push 2 with tau 1: the slowest (worker 2, clock 0) is too far.
    finished = in_background(gate(store, 0, 2, 1))
    assert not finished()[0]
    push(store, 2, 0, zeros, 0.5)  # slowest clock now 1 >= 2 - 1
    done, permit = finished(within=10)
    assert done and permit == 1
    # tau 0 for worker 1 at push 1: every clock is >= 1 now, so it passes at once.
    assert in_background(gate(store, 1, 1, 0))(within=10) == (True, 1)


def test_the_gate_stops_waiting_for_a_worker_that_left_or_died(store):
    zeros = [0] * 5
    push(store, 0, 0, zeros, 0.5)
    push(store, 0, 1, zeros, 0.5)
    finished = in_background(gate(store, 0, 2, 0))
    assert not finished()[0]
    store.calls["async_leave"](tf.constant(1))  # worker 1's fit ended
    assert not finished()[0]  # worker 2 still at clock 0
    store.worker_gone(2)
    assert finished(within=10)[0]


def test_a_barrier_releases_every_live_worker_at_once(store):
    barriers = [in_background(lambda w=w: int(store.calls["async_barrier"](tf.constant(w))))
                for w in (0, 1)]
    time.sleep(0.3)
    assert not any(finished()[0] for finished in barriers)
    store.worker_gone(2)  # the last worker died: nobody waits for it
    assert [finished(within=10) for finished in barriers] == [(True, 1), (True, 1)]


def test_a_push_to_a_set_nobody_set_up_is_a_named_error():
    store = AsyncParameterStore("server 1", num_workers=1)
    store.start()
    store.methods()["async_push"](tf.constant(9), tf.constant(0), tf.constant(0, tf.int64),
                                  tf.constant(0.1), tf.constant([1.0]), tf.constant(True),
                                  tf.constant(0, tf.int64))
    deadline = time.monotonic() + 10
    while store.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "worker rank 0 used parameter set 9 before the chief set it up" in store.error
    store.stop(timeout=10)


MOMENTUM_SPEC = {"variables": [[[2, 2], "float32", "dense_kernel"], [[1], "float32", "dense_bias"]],
                 "optimizer": keras.optimizers.serialize(
                     keras.optimizers.SGD(learning_rate=0.5, momentum=0.9))}
SLOTS = ["dense_kernel_momentum", "dense_bias_momentum"]


def set_up(store, spec, values):
    store.calls["async_setup"](tf.constant(SET), tf.constant(0), tf.constant(json.dumps(spec)),
                               tf.constant(np.asarray(values, "float32")), tf.constant(True))


def test_a_backup_reads_the_optimizer_state_by_slot_name_and_a_resume_sets_it():
    """The chief's backup reads the parameters, the named slots and the step count at one
    moment (in pieces); a resuming chief's set-up - on fresh servers or on servers that kept
    running - sets them, so the next push continues the momentum; a slot the server lacks
    is answered with NO_STATE, not an error."""
    from tfdist.aggregation.parameter_server.async_store import NO_STATE

    store = AsyncParameterStore("server 0", num_workers=1)
    store.start()
    store.calls = store.methods()
    set_up(store, MOMENTUM_SPEC, INITIAL)
    push(store, 0, 0, [1, 1, 1, 1, 1], rate=0.5)
    push(store, 0, 1, [1, 1, 1, 1, 1], rate=0.5)
    names = tf.constant(json.dumps({"slots": SLOTS}))
    steps, state = pull(store, 0, piece_elements=3, method="async_state", extra=[names],
                        size=10)
    assert steps == 2
    velocity = -0.5 - 0.9 * 0.5  # two pushes of 1 at rate 0.5, momentum 0.9
    np.testing.assert_allclose(state[:5], INITIAL - 0.5 - 0.95, rtol=1e-6)
    np.testing.assert_allclose(state[5:], [velocity] * 5, rtol=1e-6)
    missing = tf.constant(json.dumps({"slots": ["no_such_slot"]}))
    assert pull(store, 0, method="async_state", extra=[missing])[0] == NO_STATE
    push(store, 0, 2, [1, 1, 1, 1, 1], rate=0.5)
    after_three = pull(store, 0)[1]
    assert store.error is None, store.error
    store.stop(timeout=10)

    resumed_spec = dict(MOMENTUM_SPEC, state={"iterations": steps, "slots": SLOTS})
    for fresh in (True, False):
        again = AsyncParameterStore("server 0", num_workers=1)
        again.start()
        again.calls = again.methods()
        if not fresh:  # servers that kept running: the set exists, the chief sets it again
            set_up(again, MOMENTUM_SPEC, np.zeros(5))
        set_up(again, resumed_spec, state)
        push(again, 0, 0, [1, 1, 1, 1, 1], rate=0.5)
        np.testing.assert_allclose(pull(again, 0)[1], after_three, rtol=1e-6)
        assert pull(again, 0, method="async_state", extra=[names], size=10)[0] == steps + 1
        assert again.error is None, again.error
        again.stop(timeout=10)


def test_a_flag_one_worker_pushes_reaches_every_workers_pulls(store):
    assert pull(store, 1, with_flags=True)[2] == 0
    push(store, 0, 0, [0] * 5, rate=0.5, flags=1)  # worker 0 had the preemption notice
    assert [pull(store, w, with_flags=True)[2] for w in range(3)] == [1, 1, 1]
    push(store, 1, 0, [0] * 5, rate=0.5)  # a later push without it does not lower it
    assert pull(store, 2, piece_elements=2, with_flags=True)[2] == 1
