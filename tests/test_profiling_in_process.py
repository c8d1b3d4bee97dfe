"""Counting changes no training: the counted step on the hard path, at 3 simulated ranks.

The worker script's keras.io-style text classifier (tests/scripts/profiled_training.py)
with 386 rows in global batches of 32 (the last training batch leaves one
rank's slice empty), a keras.io-style `train_step` and Adam's clipnorm,
under an unchanged `keras.callbacks.TensorBoard` and `CommunicationMonitor`:
three ranks as threads of this process (`tfdist.simulation`) train as one
does, and the chief's TensorBoard run has every tfdist/ scalar.
test_profiling.py has the profiles and the engines' timelines, which need processes.
"""

import json
import os
import sys

import numpy as np

from test_profiling import COMMON_TAGS, check_equivalent, scalars

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import profiled_training  # noqa: E402  pylint: disable=wrong-import-position

from tfdist.simulation import simulate_processes  # noqa: E402  pylint: disable=wrong-import-position

OPTIONS = ["--rows", "386", "--custom-step", "--clipnorm", "0.05", "--profile-batch", "0"]


def train(directory, world):
    out, log_dir = str(directory / "out"), str(directory / "logs")
    simulate_processes(world, lambda rank: profiled_training.main(
        [out, log_dir, "--strategy", "ring", *OPTIONS]))
    ranks = []
    for rank in range(world):
        with open(f"{out}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks, log_dir


def test_counting_changes_no_training_with_3_ranks_empty_slices_custom_step_and_clipping(
        tmp_path):
    single = train(tmp_path / "one", 1)[0][0]
    ranks, log_dir = train(tmp_path / "three", 3)
    check_equivalent(ranks, single)
    written = scalars(os.path.join(log_dir, "train"))
    assert {f"tfdist/{t}" for t in COMMON_TAGS} <= set(written), sorted(written)
    assert all(value in (0, 1, 2) for _, value in written["tfdist/slowest_rank"])
    assert all(value > 0 for _, value in written["tfdist/comm_ms"])
    assert np.isfinite(ranks[0]["history"]["loss"]).all()
