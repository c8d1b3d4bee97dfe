"""`model.fit` step-time benchmark worker (run under tfdist-run; rank 0 writes JSON).

Trains a CNN (28x28x1 synthetic images, ~1.2 M parameters, 4.8 MB of float32
gradients per step) with a fixed per-process batch, so the global batch grows
with the number of processes (weak scaling). Steps of the first epoch
(tracing, warm-up) are discarded; the median of the remaining step times is
reported.

Usage: fit_step.py OUT.json PER_PROCESS_BATCH INTRA_OP_THREADS [BACKEND]
"""

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[3]))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from harness import StepTimer  # noqa: E402  (this directory, run as a script)
from overlap_step import build_model  # noqa: E402

EPOCHS = 3
STEPS_PER_EPOCH = 15


def main():
    out, per_process_batch = sys.argv[1], int(sys.argv[2])
    keras.utils.set_random_seed(0)
    backend = sys.argv[4] if len(sys.argv) > 4 else "collective"
    strategy = tfdist.strategies.RingAllReduceStrategy(backend=backend)
    global_batch = per_process_batch * strategy.world_size
    n = global_batch * STEPS_PER_EPOCH
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")
    with strategy.scope():
        model = build_model(dense_units=128)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = StepTimer()
    model.fit(x, y, batch_size=global_batch, epochs=EPOCHS, verbose=0, callbacks=[timer])
    if strategy.is_chief:
        result = {
            "processes": strategy.world_size,
            "backend": backend,
            "per_process_batch": per_process_batch,
            "global_batch": global_batch,
            "parameters": int(model.count_params()),
            "gradient_bytes": int(sum(np.prod(w.shape) * 4 for w in model.trainable_weights)),
            "median_step_ms": statistics.median(timer.times) * 1e3,
            "steps_timed": len(timer.times),
        }
        print(json.dumps(result), flush=True)
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
