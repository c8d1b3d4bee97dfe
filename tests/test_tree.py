"""ReductionTreeStrategy: same training as one process for any world size and fanout,
and a rank that dies in the middle of a reduction fails the others clearly.

One launch per world size trains with fanout 2 and fanout 3 in the same
processes. Tree shapes covered (heap order): P=3 is a star for both fanouts;
P=5 has depth 2 for both (fanout 2: 0-{1,2}, 1-{3,4}; fanout 3: 0-{1,2,3},
1-{4}); P=2, 4 and 5 (star for fanout 3, full binary tree for fanout 2) run in
`make test-all`; `make test` runs trees of 2-5 simulated ranks in-process
(test_keras_in_process.py, the tree's algorithm on the simulated transport).
"""


import re

import numpy as np
import pytest

from helpers import failure_report, max_abs_difference, script, tf_config_job, tfdist_run
from test_buckets import BUCKETS

TOLERANCE = 1e-4
FANOUTS = (2, 3)
CONFIGS = ("adam", "adam_tfdata")  # numpy input; shuffled tf.data with steps_per_execution=2
TRAINING = ["--batch", "60", "--rows", "360", "--configs", ",".join(CONFIGS)]


def train_tree(tmp_path, world):
    """Every rank's arrays; in buckets far smaller than the gradients (test_buckets.py)."""
    prefix = str(tmp_path / f"tree{world}")
    done = tfdist_run(world, [script("train_equivalence.py"), prefix, "--strategy", "tree",
                              "--fanouts", ",".join(map(str, FANOUTS))] + TRAINING
                      + list(BUCKETS), timeout=900, run_timeout=300)
    assert done.returncode == 0, failure_report(done)
    buckets = [int(n) for n in re.findall(r"gradient buckets per step: (\d+)", done.stdout)]
    assert buckets and min(buckets) >= 3, done.stdout[-2000:]
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]


@pytest.fixture(scope="module")
def one_process(one_process_run):
    return one_process_run(*TRAINING)


@pytest.mark.parametrize("world", [
    pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(4, marks=pytest.mark.slow),
    pytest.param(5, marks=pytest.mark.slow)])
def test_tree_trains_like_one_process(one_process, tmp_path, world):
    ranks = train_tree(tmp_path, world)
    for fanout in FANOUTS:
        for config in CONFIGS:
            names = [k.split("/", 1)[1] for k in one_process if k.startswith(f"{config}/")]
            assert "h_loss" in names and "predictions" in names
            diff = max_abs_difference(
                {n: one_process[f"{config}/{n}"] for n in names},
                {n: ranks[0][f"fanout{fanout}/{config}/{n}"] for n in names})
            assert diff <= TOLERANCE, (
                f"fanout {fanout}, {config}: {world} processes differ from 1 by {diff}")
    # The root's sum is sent to every rank: all ranks hold bit-identical weights.
    for rank in range(1, world):
        assert max_abs_difference(ranks[0], ranks[rank]) == 0.0


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_rank_dying_mid_reduction_fails_the_others_naming_it():
    """4 ranks, fanout 2: rank 1 is an inner node (parent of rank 3). When it dies, its
    parent (the root) and its child are both stuck in a transfer with it; each must fail
    by itself (no launcher to kill them) with a message naming rank 1."""
    procs, addresses, _ = tf_config_job(
        [0, 1, 2, 3], 4, [script("failure_modes.py"), "crash", "1", "--strategy", "tree"],
        timeout_s=300)  # far beyond the wait's ceiling: each survivor must notice by itself
    outputs = {rank: proc.communicate(timeout=200)[0] for rank, proc in procs.items()}
    assert procs[1].returncode == 3, outputs[1][-2000:]
    for rank in (0, 2, 3):
        assert procs[rank].returncode != 0, outputs[rank][-2000:]
        assert f"peer rank 1 ({addresses[1]})" in outputs[rank], outputs[rank][-3000:]
