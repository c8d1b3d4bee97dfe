"""Worker script: Keras features under tfdist on several processes.

Trains a model with BatchNormalization and Dropout, steps_per_execution=2,
ModelCheckpoint, CSVLogger and the progress bar, then calls model.save on every
rank, trains a model compiled with jit_compile=True, and resumes a run
interrupted under BackupAndRestore. Each rank writes
OUT.rank<R>.npz with its final weights (moving statistics included).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402


class InterruptAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.at = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("interrupted on purpose")


def build(strategy):
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((6,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                      metrics=["mae"], steps_per_execution=2)
    return model


def main():
    out, workdir = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(3)
    strategy = tfdist.strategies.RingAllReduceStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(192, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")

    rank = strategy.rank
    model = build(strategy)
    history = model.fit(
        x, y, batch_size=32, epochs=2, verbose=1,
        callbacks=[
            # Per-rank paths: a rank that writes is seen, not hidden by the chief's file.
            keras.callbacks.ModelCheckpoint(os.path.join(workdir, f"ckpt.rank{rank}.keras")),
            keras.callbacks.CSVLogger(os.path.join(workdir, f"log.rank{rank}.csv")),
        ],
    )
    model.save(os.path.join(workdir, f"final.rank{rank}.keras"))  # every rank calls it
    np.savez(f"{out}.rank{strategy.rank}.npz", *model.get_weights(),
             loss=np.array(history.history["loss"]))

    with strategy.scope():  # XLA cannot compile collectives: tfdist must turn jit off
        jitted = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        jitted.compile(optimizer="sgd", loss="mse", jit_compile=True)
    jitted.fit(x, y, batch_size=32, epochs=1, verbose=0)
    # Many steps must not pile up threads (TensorFlow parks threads per timed op).
    threads_before = len(os.listdir("/proc/self/task"))
    jitted.fit(x, y, batch_size=8, epochs=10, verbose=0)
    threads_added = len(os.listdir("/proc/self/task")) - threads_before
    np.savez(f"{out}.jit.rank{strategy.rank}.npz", *jitted.get_weights(),
             threads_added=np.array(threads_added))

    backup = os.path.join(workdir, "backup")
    interrupted = build(strategy)
    try:
        interrupted.fit(x, y, batch_size=32, epochs=4, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(backup), InterruptAt(2)])
    except RuntimeError:
        pass
    resumed = build(strategy)
    resumed_history = resumed.fit(x, y, batch_size=32, epochs=4, verbose=0,
                                  callbacks=[keras.callbacks.BackupAndRestore(backup)])
    np.savez(f"{out}.resumed.rank{strategy.rank}.npz", *resumed.get_weights(),
             epochs_run=np.array(len(resumed_history.history["loss"])))
    print("done", flush=True)


if __name__ == "__main__":
    main()
