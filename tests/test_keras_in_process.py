"""The in-process Keras tier: the case scripts at P = 2..5 ranks as threads of one process.

Each rank is a thread bound to a simulated communicator
(`tfdist.simulation.simulate_processes`), so the strategies it builds
are P ranks of one job and Keras' `fit`/`evaluate`/`predict`, custom
`train_step`s and custom loops run with tfdist's real patches and its real
aggregation algorithms (ring, reduction tree); only the transport is
simulated. No process is launched: a case takes seconds, and every change
to a patch is checked here first. The same script computes the reference
at one rank (the plain script for `real_world.py`, tfdist's one-process
path for `keras_patterns.py`) in the same process.

Each case runs at one (strategy, world size): the cases cycle through
ring and tree at 2, 3, 4 and 5 ranks, so every world size meets uneven and
empty slices somewhere. The real-world cases that take more than a few
seconds here (threads share the GIL while every rank traces its steps)
run in `make test-all`; `make test` runs them as processes
(test_real_world.py; `tiers.py` has the split). Left to the multi-process suites, which run them on
the real engines: cases drawing from TensorFlow's process-wide random state
(an unseeded `Dataset.shuffle`, a `PyDataset` shuffled by `random`), the
float16 case compared with P slices, and the parameter server (its servers
are processes). Inputs the ranks disagree on (data, shards, batch sizes,
integer layer state) are refused here too, alike on every rank.
"""

import itertools
import os
import sys

import numpy as np
import pytest

from helpers import assert_ranks_match_reference, max_abs_difference
from tiers import (KERAS_PATTERNS_IN_PROCESS_TEST_ALL_ONLY, KERAS_PATTERNS_PROCESSES_ONLY,
                   REAL_WORLD_CONVENTIONS, REAL_WORLD_IN_PROCESS,
                   REAL_WORLD_IN_PROCESS_TEST_ALL_ONLY, REAL_WORLD_PROCESSES_ONLY,
                   REAL_WORLD_TEST_ALL_ONLY)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import failure_modes  # noqa: E402  pylint: disable=wrong-import-position
import keras_patterns  # noqa: E402  pylint: disable=wrong-import-position
import real_world  # noqa: E402  pylint: disable=wrong-import-position
import train_equivalence  # noqa: E402  pylint: disable=wrong-import-position
from case_runner import make_strategy  # noqa: E402  pylint: disable=wrong-import-position

import tfdist  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.simulation import simulate_processes  # noqa: E402  pylint: disable=wrong-import-position

RTOL, ATOL = 1e-5, 1e-4
FLOAT16_RTOL, FLOAT16_ATOL = 2e-3, 1e-3  # keras_patterns' mixed_precision (test_keras_patterns)
CONFIGURATIONS = (("ring", 2), ("tree", 3), ("ring", 4), ("tree", 2), ("ring", 3), ("tree", 5))

PATTERN_CASES = [name for name in keras_patterns.CASES
                 if name not in KERAS_PATTERNS_PROCESSES_ONLY]
REAL_WORLD_CASES = [name for name in real_world.CASES if name not in REAL_WORLD_PROCESSES_ONLY]


def configured(cases, slow_unless=None):
    """pytest parameters: each case with the next (strategy, world) of the cycle; cases not
    in `slow_unless` (when given) run in make test-all only."""
    return [pytest.param(name, kind, world, id=f"{name}-{kind}{world}",
                         marks=() if slow_unless is None or name in slow_unless
                         else pytest.mark.slow)
            for name, (kind, world) in zip(cases, itertools.cycle(CONFIGURATIONS))]


def pattern_tolerance(key):
    if key.startswith("mixed_precision"):
        return FLOAT16_RTOL, FLOAT16_ATOL
    return RTOL, ATOL


def prefixed(name, arrays):
    return {f"{name}/{key}": np.asarray(value) for key, value in arrays.items()}


@pytest.mark.parametrize("name,kind,world", configured(
    PATTERN_CASES, [n for n in PATTERN_CASES if n not in KERAS_PATTERNS_IN_PROCESS_TEST_ALL_ONLY]))
def test_keras_pattern_trains_like_one_process(name, kind, world):
    case = keras_patterns.CASES[name]
    reference = simulate_processes(1, lambda rank: case(make_strategy("ring")))[0]
    ranks = simulate_processes(world, lambda rank: case(make_strategy(kind)))
    assert_ranks_match_reference(prefixed(name, reference), [prefixed(name, r) for r in ranks],
                                 pattern_tolerance, "one rank")


@pytest.mark.parametrize("name,kind,world", configured(
    REAL_WORLD_CASES, [n for n in REAL_WORLD_IN_PROCESS
                       if n not in REAL_WORLD_IN_PROCESS_TEST_ALL_ONLY]))
def test_real_world_script_trains_like_the_plain_script(name, kind, world, tmp_path):
    case = real_world.CASES[name]

    def in_directory(name):
        # The ranks share one directory, as processes on one host do.
        real_world.WORKDIR[0] = str(tmp_path / name)
        os.makedirs(real_world.WORKDIR[0])

    in_directory("plain")
    reference = case(make_strategy("plain"))
    in_directory("ranks")
    ranks = simulate_processes(world, lambda rank: case(make_strategy(kind)))
    assert_ranks_match_reference(prefixed(name, reference), [prefixed(name, r) for r in ranks],
                                 lambda key: (RTOL, ATOL), "the plain script")


OTHER_CONFIGURATION = {"ring": ("tree", 3), "tree": ("ring", 2)}


@pytest.mark.slow  # make test: each once above (ring or tree, 2-5 ranks) and as processes
@pytest.mark.parametrize("name", REAL_WORLD_CONVENTIONS)
def test_conventions_train_like_the_plain_script_on_the_other_aggregator(name, tmp_path):
    """Eager debugging, sparse inputs, hand-written ratios, ScheduleFreeAdamW: each also on
    the aggregator and world size the cycle above did not give it (ring 2 or tree 3)."""
    cycled = dict((case, kind) for case, kind, _ in (
        param.values for param in configured(REAL_WORLD_CASES, REAL_WORLD_IN_PROCESS)))
    kind, world = OTHER_CONFIGURATION[cycled[name]]
    test_real_world_script_trains_like_the_plain_script(name, kind, world, tmp_path)


@pytest.mark.slow  # 20-25 s each here; trees of 5 ranks meet keras_patterns above
@pytest.mark.parametrize("world", [4, 5])
def test_deeper_trees_train_like_one_process(world):
    """Fanout 2 and 3 at 4 ranks (full binary tree; star) and 5 (depth 2 for both), on
    NumPy input and on a shuffled tf.data pipeline with steps_per_execution=2."""
    def train(make):
        strategy = make()
        arrays = {}
        for config in ("adam", "adam_tfdata"):
            arrays.update(prefixed(config, train_equivalence.train(
                strategy, *train_equivalence.CONFIGS[config], epochs=2, batch=60, rows=360)))
        return arrays

    reference = simulate_processes(1, lambda rank: train(
        tfdist.strategies.RingAllReduceStrategy))[0]
    for fanout in (2, 3):
        ranks = simulate_processes(world, lambda rank: train(
            lambda: tfdist.strategies.ReductionTreeStrategy(fanout=fanout)))
        difference = max_abs_difference(reference, ranks[0])
        assert difference <= 1e-4, f"fanout {fanout}: {world} ranks differ from one by {difference}"
        for rank in range(1, world):
            assert max_abs_difference(ranks[0], ranks[rank]) == 0.0


# --------------------------------- inputs the ranks disagree on: refused alike on every rank
@pytest.fixture(scope="module")
def refusals():
    """Every rank-disagreeing input in turn, at 2 simulated ranks (each refused alike on every
    rank, so the job goes on; test_failures.py has the failures that end processes): rank 0's
    lines."""
    def run(rank):
        lines = []
        failure_modes.refusals(make_strategy("ring"), lines.append)
        return lines

    ranks = simulate_processes(2, run)
    assert all(lines[-1] == "finished" for lines in ranks), ranks
    return "\n".join(ranks[0])


def refusal(output, case):
    lines = [line for line in output.splitlines() if line.startswith(f"refused {case}:")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def test_ranks_given_different_data_is_a_clear_error(refusals):
    assert "batches per epoch by rank: [20, 18]" in refusal(refusals, "uneven")


def test_ranks_each_passing_their_own_shard_is_a_clear_error(refusals):
    """Same number of batches, other rows: caught by the data fingerprint, not trained on 1/P."""
    message = refusal(refusals, "own_shard")
    assert "the ranks were given different data (rows by rank: [240, 240]" in message
    assert "distribute_datasets_from_function" in message


def test_ranks_passing_different_batch_sizes_is_a_clear_error(refusals):
    """24 and 26 rows per global batch both make 20 batches of 480 rows: not trained silently."""
    assert "passed different 'batch_size' (by rank: ['24', '26'])" in refusal(refusals,
                                                                              "batch_size")


def test_integer_layer_state_that_diverges_is_a_clear_error(refusals):
    """A row counter declared without aggregation would hold each rank's own count."""
    message = refusal(refusals, "counter")
    assert "int32 variable" in message and "rows_seen" in message, message
    assert "declares no aggregation" in message and "add_weight(..., aggregation=" in message


def test_every_real_world_case_has_a_tier():
    """Each real_world.py case runs in make test (in-process or as processes) or is named as
    make test-all only: none falls out of both silently."""
    tiers = (set(REAL_WORLD_IN_PROCESS), set(REAL_WORLD_PROCESSES_ONLY),
             set(REAL_WORLD_TEST_ALL_ONLY))
    assert set.union(*tiers) == set(real_world.CASES)
    assert sum(len(t) for t in tiers) == len(real_world.CASES)  # disjoint


def _tiny_model():
    import keras  # pylint: disable=import-outside-toplevel

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_a_model_built_outside_the_scope_is_refused_at_fit_not_trained_alone():
    """The strategy line added, the model left outside `strategy.scope()`: Keras would train a
    copy per rank, silently; `fit` and `train_on_batch` refuse, naming the rank and the scope.
    A plain script (no strategy in this thread) is untouched."""
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")

    def rank_fn(rank):
        tfdist.strategies.RingAllReduceStrategy()
        model = _tiny_model()
        messages = []
        for call in (lambda: model.fit(x, y, batch_size=4, verbose=0),
                     lambda: model.train_on_batch(x, y)):
            with pytest.raises(tfdist.errors.NotDistributedError) as refused:
                call()
            messages.append(str(refused.value))
        model.predict(x, verbose=0)  # inference on one rank's own model stays allowed
        return messages

    for rank, messages in enumerate(simulate_processes(2, rank_fn)):
        assert "`fit` would train it on this process alone" in messages[0]
        assert f"RingAllReduceStrategy (rank {rank} of 2 processes)" in messages[0]
        assert "with strategy.scope():" in messages[0]
        assert "`train_on_batch` would train it" in messages[1]
    history = _tiny_model().fit(x, y, batch_size=4, verbose=0)  # this thread: no strategy
    assert len(history.history["loss"]) == 1

    def horovod_rank_fn(rank):  # what hvd.init() notes: the fix is to call it first
        from tfdist.strategies.keras_surface import model_strategy  # pylint: disable=C0415

        model = _tiny_model()
        strategy = tfdist.strategies.RingAllReduceStrategy(per_rank_input=True)
        model_strategy.note_multi_process_strategy(strategy, horovod_api=True)
        with pytest.raises(tfdist.errors.NotDistributedError) as refused:
            model.fit(x, y, batch_size=4, verbose=0)
        return str(refused.value)

    for message in simulate_processes(2, horovod_rank_fn):
        assert "was created before hvd.init()" in message
        assert "Call hvd.init() before creating the model" in message

    def horovod_keras_2_compile(rank):  # Horovod's usual compile says the same, not a TypeError
        import keras  # pylint: disable=import-outside-toplevel

        from tfdist.strategies.keras_surface import model_strategy  # pylint: disable=C0415

        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        strategy = tfdist.strategies.RingAllReduceStrategy(per_rank_input=True)
        model_strategy.note_multi_process_strategy(strategy, horovod_api=True)
        with pytest.raises(tfdist.errors.NotDistributedError) as refused:
            model.compile(optimizer="sgd", loss="mse", experimental_run_tf_function=False)
        return str(refused.value)

    for message in simulate_processes(2, horovod_keras_2_compile):
        assert "was created before hvd.init()" in message


def test_an_optimizer_created_outside_the_scope_is_named_with_the_fix():
    """Not TensorFlow's "Mixing different tf.distribute.Strategy objects": the optimizer, where
    it was created, and strategy.scope()."""
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")

    import keras  # pylint: disable=import-outside-toplevel

    def rank_fn(rank):
        optimizer = keras.optimizers.Adam(0.01)
        strategy = tfdist.strategies.RingAllReduceStrategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile(optimizer=optimizer, loss="mse")
        with pytest.raises(ValueError) as refused:
            model.fit(x, y, batch_size=4, verbose=0)
        return str(refused.value)

    for rank, message in enumerate(simulate_processes(2, rank_fn)):
        assert f"tfdist rank {rank}: the optimizer 'adam' was created outside strategy.scope()" \
            in message, message
        assert "with strategy.scope():" in message


def test_the_chief_states_the_job_and_the_batch_split_once(capsys, monkeypatch):
    """One start-up line for the job (rank 0's), and at fit how the global batch is split."""
    from tfdist import chief_log  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(chief_log, "_said_once", set())  # "once per process": from here
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")

    def rank_fn(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        with strategy.scope():
            model = _tiny_model()
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        return rank

    simulate_processes(3, rank_fn)
    err = capsys.readouterr().err
    assert err.count("tfdist: RingAllReduceStrategy on 3 processes launched by simulated: "
                     "aggregator ring on simulated, compression none; CPU only") == 1, err
    assert err.count("tfdist: global batch 8 = 2-3 per process x 3 (uneven slices are "
                     "weighted by their rows: exact); fit's batch_size is the global "
                     "batch") == 1, err
