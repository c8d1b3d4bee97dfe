"""A process killed while saving leaves the previous or the new checkpoint, never a torn one."""

import os
import random
import subprocess
import sys
import time

import keras
import numpy as np

from helpers import failure_report, script, tfdist_run

KILLS = 3


def values_in(model):
    return {float(v) for w in model.get_weights() for v in np.unique(w)}


def saved_values(directory):
    """The values in the saved model and in the saved weights (each save is a uniform model)."""
    model = keras.saving.load_model(os.path.join(directory, "model.keras"), compile=False)
    weights_only = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024),
                                     keras.layers.Dense(1024)])
    weights_only.load_weights(os.path.join(directory, "model.weights.h5"))
    return values_in(model), values_in(weights_only)


def kill_while_saving(directory, seed, plain=False):
    """Start the save loop; SIGKILL it at a random moment after its second save."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for stale in ("TF_CONFIG", "TFDIST_RANK", "TFDIST_ROLE", "HOROVOD_RANK"):
        env.pop(stale, None)
    command = [sys.executable, script("save_loop.py"), str(directory)] + (["--plain"] * plain)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:  # the loop saves until it is killed
            seen.append(line)
            if line.startswith("saved 2"):
                break
        assert seen and seen[-1].startswith("saved 2"), "".join(seen)[-3000:]
        # One save of this model takes a few hundred ms: the kill lands anywhere in one.
        time.sleep(random.Random(seed).uniform(0.0, 0.5))
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_kill_mid_save_never_leaves_a_torn_file(tmp_path):
    for attempt in range(KILLS):
        kill_while_saving(tmp_path, seed=attempt)
        in_model, in_weights = saved_values(tmp_path)  # a torn file fails to load
        assert len(in_model) == 1 and len(in_weights) == 1, (in_model, in_weights)
        assert min(in_model | in_weights) >= 2
    # A killed writer's temporary file is removed by the next writer of the same path.
    leftovers = [name for name in os.listdir(tmp_path) if ".tmp" in name]
    assert len(leftovers) <= 2, leftovers


def test_a_compressors_state_starts_from_rank_zero_and_is_saved_with_the_model(tmp_path):
    """`Aggregator.build`: state created with the optimizer's variables (broadcast from rank
    0 although each rank initialises it differently), saved by ModelCheckpoint and
    save_weights (what BackupAndRestore calls) and restored by load_model and load_weights
    under the strategy, the same on every rank."""
    for mode in ("train", "load", "load_weights"):
        done = tfdist_run(2, [script("aggregator_state.py"), str(tmp_path), mode], timeout=300)
        assert done.returncode == 0, failure_report(done)
        assert "aggregator state: 4 variables" in done.stdout
    trained = [np.load(tmp_path / f"train.rank{r}.npz") for r in range(2)]
    loaded = [np.load(tmp_path / f"{mode}.rank{r}.npz") for mode in ("load", "load_weights")
              for r in range(2)]
    for rank in range(2):
        np.testing.assert_array_equal(trained[rank]["built"], [1.0] * 4)  # rank 0's value
        np.testing.assert_array_equal(trained[rank]["after_fit"], trained[0]["after_fit"])
    for restored in loaded:
        np.testing.assert_array_equal(restored["built"], [1.0] * 4)
        np.testing.assert_array_equal(restored["loaded"], trained[0]["after_fit"])
    assert not np.allclose(trained[0]["after_fit"], 1.0)  # training changed the state


def test_each_ranks_residuals_survive_checkpoints_and_a_resume(tmp_path):
    """Top-k's residuals are each rank's own: a ModelCheckpoint, save_weights and a
    BackupAndRestore keep every rank's (beside the chief's file), and a job stopped after its
    second epoch resumes to the same weights and residuals as one never stopped. A rank with
    no state file of its own starts from zero residuals (not the chief's), and says so."""
    def run(mode):
        done = tfdist_run(2, [script("residual_checkpoints.py"), str(tmp_path), mode],
                          timeout=300)
        assert done.returncode == 0, failure_report(done)
        return done

    for mode in ("straight", "interrupted", "resumed", "load"):
        run(mode)
    os.remove(tmp_path / "model.weights.h5.tfdist-rank1.npz")
    fallback = run("load_weights")
    assert "rank 1 restored" in fallback.stdout + fallback.stderr
    assert "without its own compression residuals" in fallback.stdout + fallback.stderr
    straight = [np.load(tmp_path / f"straight.rank{r}.npz") for r in range(2)]
    assert not np.allclose(straight[0]["residuals"], straight[1]["residuals"])
    for mode in ("resumed", "load"):
        for rank in range(2):
            restored = np.load(tmp_path / f"{mode}.rank{rank}.npz")
            np.testing.assert_array_equal(restored["weights"], straight[rank]["weights"])
            np.testing.assert_array_equal(restored["residuals"], straight[rank]["residuals"])
    chief, other = (np.load(tmp_path / f"load_weights.rank{r}.npz") for r in range(2))
    np.testing.assert_array_equal(chief["residuals"], straight[0]["residuals"])
    assert not np.any(other["residuals"])
