"""The core promise: 1, 2, 3 and 4 processes train identically.

One worker script trains three configurations (Adam without shuffling,
SGD+momentum with shuffle=True, Adam on a shuffled tf.data pipeline), then
evaluates and predicts; every world size must reproduce the single-process
weights, loss/metric history, evaluation and predictions within 1e-4, and all
ranks of a run must agree with each other. Two processes run with TensorFlow's
oneDNN kernels forced on, three with them forced off (`helpers.onednn`), so
both kernel families are checked on any CPU. Three processes also sum in
buckets far smaller than the gradients (test_buckets.py: several
collectives per step, issued last layer first), which changes when
gradients are summed, never what.
"""

import re

import pytest

from helpers import failure_report, load_ranks, max_abs_difference, onednn, script, tfdist_run
from test_buckets import BUCKETS

ONEDNN_BY_WORLD = {2: "1", 3: "0"}  # 4 (make test-all): the machine's default
OPTIONS_BY_WORLD = {3: BUCKETS}

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_process_run):
    """world size -> every rank's results, each world size launched once, when first needed."""
    out = tmp_path_factory.mktemp("equivalence")
    results = {1: [one_process_run()]}

    def get(world):
        if world not in results:
            env = onednn(ONEDNN_BY_WORLD[world]) if world in ONEDNN_BY_WORLD else None
            prefix = str(out / f"np{world}")
            done = tfdist_run(world, [script("train_equivalence.py"), prefix,
                                      *OPTIONS_BY_WORLD.get(world, ())],
                              timeout=900, extra_env=env)
            assert done.returncode == 0, failure_report(done)
            output = done.stdout + done.stderr
            # the chief's start-up lines, once per job; no "not distributed" notice
            assert output.count(f"tfdist: RingAllReduceStrategy on {world} processes launched "
                                "by tfdist-run: aggregator ring on") == 1, output[-3000:]
            assert f"per process x {world}" in output and "ran independently" not in output
            buckets = [int(n) for n in re.findall(r"gradient buckets per step: (\d+)",
                                                  done.stdout)]
            if world in OPTIONS_BY_WORLD:
                assert buckets and min(buckets) >= 3, done.stdout[-2000:]
            results[world] = load_ranks(prefix, world)
        return results[world]

    return get


# make test: 3 processes (oneDNN off, small buckets); 2 (oneDNN on) and 4: make test-all
# (test_real_world.py runs 2 processes with oneDNN on in make test).
WORLDS = [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("world", WORLDS)
def test_same_training_as_one_process(runs, world):
    reference = runs(1)[0]
    result = runs(world)[0]
    for config in ("adam", "sgd_shuffle", "adam_tfdata"):
        keys = [k for k in reference if k.startswith(config + "/")]
        assert any(k.endswith("/h_loss") for k in keys)
        assert any(k.endswith("/h_val_accuracy") for k in keys)
        assert any(k.endswith("/predictions") for k in keys)
        diff = max_abs_difference({k: reference[k] for k in keys}, {k: result[k] for k in keys})
        assert diff <= TOLERANCE, f"{config}: {world} processes differ from 1 by {diff}"


@pytest.mark.parametrize("world", WORLDS)
def test_all_ranks_agree(runs, world):
    for rank in range(1, world):
        assert max_abs_difference(runs(world)[0], runs(world)[rank]) <= 1e-6


def test_training_actually_learns(runs):
    reference = runs(1)[0]
    loss = reference["adam/h_loss"]
    assert loss[-1] < loss[0] * 0.9
    assert reference["adam/predictions"].shape == (100, 3)
