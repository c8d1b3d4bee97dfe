"""A process killed while saving leaves the previous or the new checkpoint, never a torn one.

(What checkpoints hold of the aggregator's state: test_checkpoints_in_process.py.)
"""

import os
import random
import subprocess
import sys
import time

import keras
import numpy as np

from helpers import script

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
