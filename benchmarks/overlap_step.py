"""Overlap benchmark worker: a bandwidth-bound model's `fit` step (rank 0 writes JSON).

The model has about 19 MB of float32 gradients, most of them in one dense
layer near the output (its gradient exists early in the backward pass), and
most of its computation in two convolutions near the input (their backward
pass comes last): with gradients all-reduced in reverse-order buckets, the
big gradient's all-reduce can run while the convolutions' backward pass
computes. Per-process batch fixed (weak scaling), one intra-op thread per
process; steps of the first epoch (tracing, warm-up) are discarded.

Usage: overlap_step.py OUT.json STRATEGY BUCKET_BYTES FIRST_BUCKET_BYTES
  STRATEGY: ring_collective, ring_horovod, tree, or alone (no strategy: one
  process by itself, the independent-process baseline)
"""

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from harness import StepTimer  # noqa: E402  (this directory, run as a script)

EPOCHS = 3
STEPS_PER_EPOCH = 12
PER_PROCESS_BATCH = 64


def build_model(dense_units=512):
    """Conv 32, conv 64 (the computation), dense 9216 -> `dense_units` (the bytes), dense 10."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(dense_units, activation="relu"),
        keras.layers.Dense(10),
    ])


def synthetic_data(world):
    """Images and labels: STEPS_PER_EPOCH global batches of PER_PROCESS_BATCH rows per process."""
    n = PER_PROCESS_BATCH * world * STEPS_PER_EPOCH
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 28, 28, 1)).astype("float32"),
            rng.integers(0, 10, size=n).astype("int32"))


def compiled_model(strategy):
    """`build_model()` under `strategy`, compiled with SGD + momentum."""
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def make_strategy(name, bucket_bytes, first_bucket_bytes):
    buckets = {"fusion_threshold_bytes": bucket_bytes, "first_bucket_bytes": first_bucket_bytes}
    if name == "ring_collective":
        return tfdist.strategies.RingAllReduceStrategy(backend="collective", **buckets)
    if name == "ring_horovod":
        return tfdist.strategies.RingAllReduceStrategy(backend="horovod", **buckets)
    if name == "tree":
        return tfdist.strategies.ReductionTreeStrategy(fanout=2, **buckets)
    if name == "alone":
        return tf.distribute.get_strategy()
    raise SystemExit(f"unknown strategy {name!r}")


def main():
    out, name = sys.argv[1], sys.argv[2]
    tf.config.threading.set_intra_op_parallelism_threads(1)  # before the runtime starts
    strategy = make_strategy(name, int(sys.argv[3]), int(sys.argv[4]))
    world = strategy.num_replicas_in_sync
    keras.utils.set_random_seed(0)
    x, y = synthetic_data(world)
    model = compiled_model(strategy)
    timer = StepTimer()
    model.fit(x, y, batch_size=PER_PROCESS_BATCH * world, epochs=EPOCHS, verbose=0, callbacks=[timer])
    if getattr(strategy, "is_chief", True):
        result = {
            "strategy": name, "processes": world, "per_process_batch": PER_PROCESS_BATCH,
            "bucket_bytes": int(sys.argv[3]), "first_bucket_bytes": int(sys.argv[4]),
            "gradient_bytes": int(sum(np.prod(w.shape) * 4 for w in model.trainable_weights)),
            "median_step_ms": statistics.median(timer.times) * 1e3,
            "steps_timed": len(timer.times),
        }
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
