"""Asynchronous PS experiment worker: held-out loss against wall time, with stragglers.

Run under `tfdist-run -np P --num-servers 1`; each worker trains the same
model on its slices. Every step is a simulated accelerator step: the worker
sleeps `COMPUTE_SECONDS` (the CPU work of this small model is a fraction of
it), so stragglers are controlled, not left to the shared machine's noise:

  none        every step takes COMPUTE_SECONDS;
  transient   each step is, with probability TRANSIENT_PROBABILITY, TRANSIENT_SECONDS
              longer (seeded per worker: different steps on different workers);
  persistent  the last worker's steps take 3x COMPUTE_SECONDS.

The chief records, every EVAL_EVERY of its steps, the wall time and the loss of
the parameters it holds on a fixed held-out set (computed locally: no
collective, so the measurement does not synchronize the workers). The clock
starts when the first step has finished: its tracing and compilation (longer
for the synchronous step, which has more collectives) is not training speed.
At the end each worker writes its staleness statistics.

Usage: async_ps.py OUT.json MODE STALENESS SCENARIO OPTIMIZER
  MODE sync|async, STALENESS none|tau, SCENARIO none|transient|persistent,
  OPTIMIZER sgd|adam
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

COMPUTE_SECONDS = 0.02
TRANSIENT_PROBABILITY, TRANSIENT_SECONDS = 0.1, 0.15
EPOCHS, BATCH, EVAL_EVERY, CLASSES = 8, 48, 4, 8
RATES = {"sgd": 0.02, "adam": 0.002}


class SimulatedDevice(keras.callbacks.Callback):
    """Sleeps the step's simulated compute time before each step."""

    def __init__(self, rank, world_size, scenario):
        super().__init__()
        self.rng = np.random.default_rng(100 + rank)
        self.seconds = COMPUTE_SECONDS * (3 if scenario == "persistent"
                                          and rank == world_size - 1 else 1)
        self.scenario = scenario

    def on_train_batch_begin(self, batch, logs=None):
        extra = (TRANSIENT_SECONDS if self.scenario == "transient"
                 and self.rng.random() < TRANSIENT_PROBABILITY else 0.0)
        time.sleep(self.seconds + extra)


class HeldOutLoss(keras.callbacks.Callback):
    """(seconds since the first step ended, held-out loss) every EVAL_EVERY steps."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = tf.constant(x), tf.constant(y)
        self.curve, self.steps = [], 0
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == 1:
            self.start = time.perf_counter()  # after the first step's compilation
            self._record()
        elif self.steps % EVAL_EVERY == 0:
            self._record()

    def on_train_end(self, logs=None):
        self._record()  # after fit: the servers' final parameters

    def _record(self):
        value = float(self.loss(self.y, self.model(self.x, training=False)))
        self.curve.append([time.perf_counter() - self.start, value])


def make_data():
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=0.45, size=(CLASSES, 16))  # overlapping: slow to fit
    labels = rng.integers(0, CLASSES, size=3072)
    x = (centers[labels] + rng.normal(size=(3072, 16))).astype("float32")
    return x[:2304], labels[:2304].astype("int32"), x[2304:], labels[2304:].astype("int32")


def main():
    out, mode, staleness, scenario, optimizer_name = sys.argv[1:6]
    strategy = tfdist.strategies.ParameterServerStrategy(
        mode=mode, staleness=None if staleness == "none" else int(staleness))
    x, y, x_held, y_held = make_data()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        optimizer = (keras.optimizers.SGD(RATES["sgd"], momentum=0.9)
                     if optimizer_name == "sgd" else keras.optimizers.Adam(RATES["adam"]))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    held_out = HeldOutLoss(x_held, y_held)
    model.fit(x, y, batch_size=BATCH * strategy.world_size, epochs=EPOCHS, verbose=0,
              callbacks=[SimulatedDevice(strategy.rank, strategy.world_size, scenario),
                         held_out])
    remote = strategy.extended.remote_updates
    statistics = remote.statistics() if remote is not None else None
    with open(f"{out}.rank{strategy.rank}.json", "w") as f:
        json.dump({"rank": strategy.rank, "curve": held_out.curve, "statistics": statistics,
                   "steps": held_out.steps}, f)


if __name__ == "__main__":
    main()
