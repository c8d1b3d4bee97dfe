"""Reverse-order gradient buckets change when gradients are summed, never what.

With buckets far smaller than the model's gradients (a first bucket of 256
bytes, then 2 KiB), every step sums its gradients, metric state and row
count in several collectives, issued last layer first; the training
(weights, history, evaluate, predict) must still be the single-process one,
on both ring backends and on the tree, with a slice count that does not
divide the batch (3 processes). `make test` runs the TF-collectives ring
and the tree with these buckets in other launches (test_equivalence's
3 processes, test_tree's), `make test-all` here too.
"""

import re

import numpy as np
import pytest

from helpers import failure_report, max_abs_difference, only_configs, script, tfdist_run

TOLERANCE = 1e-4
CONFIGS = "adam,adam_tfdata"  # the latter: shuffled tf.data, steps_per_execution=2
BUCKETS = ("--bucket-bytes", "2048", "--first-bucket-bytes", "256")

CASES = {
    "ring_collective": (3, ["--strategy", "ring", "--backend", "collective"], []),
    "ring_horovod": (2, ["--strategy", "ring", "--backend", "horovod"], ["--horovod"]),
    "tree": (3, ["--strategy", "tree", "--fanouts", "2"], []),
}


@pytest.mark.parametrize("case", [
    pytest.param("ring_collective", marks=pytest.mark.slow),  # make test: test_equivalence
    pytest.param("ring_horovod", marks=[pytest.mark.horovod, pytest.mark.slow]),
    pytest.param("tree", marks=pytest.mark.slow),  # make test: test_tree
])
def test_small_buckets_train_like_one_process(one_process_run, tmp_path, case):
    world, options, launcher = CASES[case]
    prefix = str(tmp_path / "run")
    done = tfdist_run(world, [script("train_equivalence.py"), prefix, "--configs", CONFIGS,
                              *options, *BUCKETS], timeout=900, launcher=launcher)
    assert done.returncode == 0, failure_report(done)
    buckets = [int(n) for n in re.findall(r"gradient buckets per step: (\d+)", done.stdout)]
    assert buckets and min(buckets) >= 3, done.stdout[-2000:]
    reference = only_configs(one_process_run(), CONFIGS.split(","))
    ranks = [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]
    strip = "fanout2/" if case == "tree" else ""
    result = {key[len(strip):]: value for key, value in ranks[0].items()}
    assert set(reference) <= set(result)
    assert max_abs_difference(reference, {k: result[k] for k in reference}) <= TOLERANCE
    for other in ranks[1:]:
        assert max_abs_difference(ranks[0], other) <= 1e-6
