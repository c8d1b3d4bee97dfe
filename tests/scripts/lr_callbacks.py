"""Worker script: the tfdist learning-rate callbacks in a real fit, and a resumed fit.

Usage: python lr_callbacks.py OUT
Trains SGD with momentum for 4 epochs of 5 global batches under
LearningRateScaling (global batch inferred), LearningRateWarmup (default
initial rate: the scaling's base_lr; momentum correction) and two
LearningRateSchedules, listed out of order. Then trains the same model
again, interrupted at the start of epoch 2 and resumed by a fresh model
through keras.callbacks.BackupAndRestore. Every rank writes OUT.rank<R>.json
with the rate of every batch, the logged rates and the final weights.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402

GLOBAL_BATCH = 64
ROWS = 320  # 5 steps per epoch
EPOCHS = 4
INTERRUPT_EPOCH = 2


class RecordRates(keras.callbacks.Callback):
    """The learning rate each train step ran with."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_end(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


class Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == INTERRUPT_EPOCH:
            raise RuntimeError("interrupted on purpose")


def rate_callbacks():
    c = tfdist.callbacks
    return [c.LearningRateSchedule(lambda epoch: 1.0 - 0.1 * epoch, start_epoch=1, staircase=False),
            c.LearningRateWarmup(warmup_epochs=1.4, momentum_correction=True),
            c.LearningRateSchedule(0.5, start_epoch=3),
            c.LearningRateScaling(base_lr=0.05, base_batch_size=32)]


def build(strategy):
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(model, x, y, callbacks):
    recorder = RecordRates()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, verbose=0, shuffle=False,
                        callbacks=[recorder] + callbacks)
    return recorder.rates, history.history["learning_rate"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    strategy = tfdist.strategies.RingAllReduceStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 6)).astype("float32")
    y = (x[:, 0] * x[:, 1] > 0).astype("int32")

    straight = build(strategy)
    rates, logged = fit(straight, x, y, rate_callbacks())

    backup_dir = f"{args.out}.backup"  # shared by the ranks; the chief writes it
    first = build(strategy)
    recorder = RecordRates()
    try:
        first.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, verbose=0, shuffle=False,
                  callbacks=[keras.callbacks.BackupAndRestore(backup_dir), recorder, Interrupt()]
                  + rate_callbacks())
        raise SystemExit("the interruption did not happen")
    except RuntimeError as error:
        assert "on purpose" in str(error)
    resumed = build(strategy)
    rest, _ = fit(resumed, x, y, [keras.callbacks.BackupAndRestore(backup_dir)] + rate_callbacks())

    with open(f"{args.out}.rank{strategy.rank}.json", "w") as f:
        json.dump({"world_size": strategy.world_size, "rates": rates, "logged": logged,
                   "resumed_rates": recorder.rates + rest,
                   "weights": [w.tolist() for w in straight.get_weights()],
                   "resumed_weights": [w.tolist() for w in resumed.get_weights()]}, f)


if __name__ == "__main__":
    main()
