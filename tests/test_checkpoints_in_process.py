"""Aggregator state in checkpoints, at 2 simulated ranks (no process launched).

A compressor's state is built from rank 0 and saved with the model; each
rank's own compression residuals survive `ModelCheckpoint`, `save_weights`
and a `BackupAndRestore` resume. The ranks are threads of this process
(`tfdist.simulation`) running the worker scripts' `run`; the chief writes
the checkpoint and every other rank its own state file beside it, as
processes do (test_checkpoints.py has what needs a process: a kill in the
middle of a save).
"""

import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import aggregator_state  # noqa: E402  pylint: disable=wrong-import-position
import residual_checkpoints  # noqa: E402  pylint: disable=wrong-import-position

from tfdist.simulation import simulate_processes  # noqa: E402  pylint: disable=wrong-import-position

WORLD = 2


def test_a_compressors_state_starts_from_rank_zero_and_is_saved_with_the_model(tmp_path):
    """`Aggregator.build`: state created with the optimizer's variables (broadcast from rank
    0 although each rank initialises it differently), saved by ModelCheckpoint and
    save_weights (what BackupAndRestore calls) and restored by load_model and load_weights
    under the strategy, the same on every rank."""
    for mode in ("train", "load", "load_weights"):
        simulate_processes(WORLD, lambda rank, mode=mode: aggregator_state.run(str(tmp_path), mode))
    trained = [np.load(tmp_path / f"train.rank{r}.npz") for r in range(WORLD)]
    loaded = [np.load(tmp_path / f"{mode}.rank{r}.npz") for mode in ("load", "load_weights")
              for r in range(WORLD)]
    for rank in range(WORLD):
        np.testing.assert_array_equal(trained[rank]["built"], [1.0] * 4)  # rank 0's value
        np.testing.assert_array_equal(trained[rank]["after_fit"], trained[0]["after_fit"])
    for restored in loaded:
        np.testing.assert_array_equal(restored["built"], [1.0] * 4)
        np.testing.assert_array_equal(restored["loaded"], trained[0]["after_fit"])
    assert not np.allclose(trained[0]["after_fit"], 1.0)  # training changed the state


def test_each_ranks_residuals_survive_checkpoints_and_a_resume(tmp_path, caplog):
    """Top-k's residuals are each rank's own: a ModelCheckpoint, save_weights and a
    BackupAndRestore keep every rank's (beside the chief's file), and a job stopped after its
    second epoch resumes to the same weights and residuals as one never stopped. A rank with
    no state file of its own starts from zero residuals (not the chief's), and says so."""
    def run(mode):
        simulate_processes(WORLD, lambda rank: residual_checkpoints.run(str(tmp_path), mode))

    for mode in ("straight", "interrupted", "resumed", "load"):
        run(mode)
    os.remove(tmp_path / "model.weights.h5.tfdist-rank1.npz")
    with caplog.at_level(logging.WARNING):
        run("load_weights")
    assert "rank 1 restored" in caplog.text, caplog.text
    assert "without its own compression residuals" in caplog.text, caplog.text
    straight = [np.load(tmp_path / f"straight.rank{r}.npz") for r in range(WORLD)]
    assert not np.allclose(straight[0]["residuals"], straight[1]["residuals"])
    for mode in ("resumed", "load"):
        for rank in range(WORLD):
            restored = np.load(tmp_path / f"{mode}.rank{rank}.npz")
            np.testing.assert_array_equal(restored["weights"], straight[rank]["weights"])
            np.testing.assert_array_equal(restored["residuals"], straight[rank]["residuals"])
    chief, other = (np.load(tmp_path / f"load_weights.rank{r}.npz") for r in range(WORLD))
    np.testing.assert_array_equal(chief["residuals"], straight[0]["residuals"])
    assert not np.any(other["residuals"])
