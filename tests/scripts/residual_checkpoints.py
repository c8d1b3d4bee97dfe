"""Worker script: each rank's compression residuals survive checkpoints and a resume.

Usage: python residual_checkpoints.py OUT_DIR MODE   (under `tfdist-run -np P`), or
`run(OUT_DIR, MODE)` on each simulated rank (test_checkpoints_in_process.py).

MODE:
  straight     fit 3 epochs with TopK(0.05) (error feedback), a ModelCheckpoint
               (.keras) and a BackupAndRestore; then save_weights;
  interrupted  the same fit into another backup directory, ended by an exception
               on every rank after the second epoch's backup (as a kill would);
  resumed      the same fit again: BackupAndRestore resumes at the third epoch;
  load         keras.saving.load_model of the straight run's checkpoint;
  load_weights a new model's optimizer built, then load_weights of its weights.
Each writes OUT_DIR/<mode>.rank<r>.npz: the weights and this rank's residuals.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402


class Interrupted(Exception):
    pass


class InterruptAfter(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Interrupted(f"stopped after epoch {epoch}")


def build():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(24, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    return model


def run(out, mode):
    strategy = tfdist.strategies.RingAllReduceStrategy(
        compression=tfdist.compression.TopK(0.05))
    checkpoint = os.path.join(out, "model.keras")
    weights = os.path.join(out, "model.weights.h5")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 10)).astype("float32")
    y = np.tanh(x[:, :1] - x[:, 1:2])
    with strategy.scope():
        model = keras.saving.load_model(checkpoint) if mode == "load" else build()
        if mode == "load_weights":
            model.optimizer.build(model.trainable_variables)
            model.load_weights(weights)
    if mode in ("straight", "interrupted", "resumed"):
        backup = os.path.join(out, "backup_straight" if mode == "straight" else "backup_resume")
        callbacks = [keras.callbacks.BackupAndRestore(backup)]
        if mode == "straight":
            callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint))
        if mode == "interrupted":
            callbacks.append(InterruptAfter(1))
        try:
            model.fit(x, y, batch_size=25, epochs=3, shuffle=False, verbose=0,
                      callbacks=callbacks)
        except Interrupted as stop:
            print(f"rank {strategy.rank} {stop}", flush=True)
            return
        if mode == "straight":
            model.save_weights(weights)
    aggregator = strategy.extended.aggregator
    residuals = [aggregator.compressor.residual(v) for v in model.trainable_variables]
    np.savez(os.path.join(out, f"{mode}.rank{strategy.rank}.npz"),
             weights=np.concatenate([w.ravel() for w in model.get_weights()]),
             residuals=np.concatenate([r.numpy().ravel() for r in residuals]))
    print(f"rank {strategy.rank} {mode} done", flush=True)


def main():
    run(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
