"""`benchmarks.cluster_costs`'s job: a synchronous parameter server's steps (rank 0 writes JSON).

    cluster_costs_worker.py OUT.json
"""

import json
import os
import statistics
import sys
import time

STARTED = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times, self.first, self.epoch, self.start = [], None, 0, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.first = self.first or time.time()
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch > 0:
            self.times.append(time.perf_counter() - self.start)


def main():
    started = STARTED  # this process's start (tfdist-run starts its ranks together)
    strategy = tfdist.strategies.ParameterServerStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * 20, 64)).astype("float32")
    y = rng.integers(0, 10, size=64 * 20).astype("int32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    steps = Steps()
    model.fit(x, y, batch_size=64, epochs=3, verbose=0, callbacks=[steps])
    if strategy.is_chief:
        with open(sys.argv[1], "w") as f:
            json.dump({"median_step_ms": statistics.median(steps.times) * 1e3,
                       "steps_timed": len(steps.times),
                       "seconds_to_first_step": steps.first - started}, f)


if __name__ == "__main__":
    main()
