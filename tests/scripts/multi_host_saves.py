"""Saving and resuming where each host has its own disk: keras.io's conventions on every rank.

    python multi_host_saves.py DIR EPOCHS [--stop-after EPOCH]

DIR is a path on each host's own disk (the same path, a different disk per host). Every
rank: trains a seeded model with `BackupAndRestore(DIR/backup)` and a
`ModelCheckpoint(DIR/ckpt-{epoch}.keras)`, both on every rank; `--stop-after E` makes the
run exit (code 3) at the end of epoch E, as a preempted job would, leaving its backup. At the
end every rank saves `DIR/final.keras` and `DIR/final.weights.h5` (an older file of the same
name is already there on each host: a stale save must not survive), loads both back, and
writes DIR/result.rank<R>.json: its host name, local rank, final weights' sum, how far what
it loaded is from what it holds, and each checkpoint's weights' sum as it reads it from its
own disk.
"""

import argparse
import json
import os
import socket

import keras
import numpy as np

import tfdist


class StopAfter(keras.callbacks.Callback):
    """End the run after an epoch (exit code 3), as if the job had been stopped there."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epoch:
            raise SystemExit(3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    strategy = tfdist.strategies.RingAllReduceStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("float32")
    keras.utils.set_random_seed(4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(args.dir, "backup")),
                 keras.callbacks.ModelCheckpoint(os.path.join(args.dir, "ckpt-{epoch}.keras"))]
    if args.stop_after:
        callbacks.append(StopAfter(args.stop_after))
    stale = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    for name in ("final.keras", "final.weights.h5"):
        path = os.path.join(args.dir, name)
        if not os.path.exists(path):  # this host's older save of the same name
            (stale.save if name.endswith(".keras") else stale.save_weights)(path)
    model.fit(x, y, batch_size=40, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=callbacks)
    final = os.path.join(args.dir, "final.keras")
    model.save(final)
    model.save_weights(os.path.join(args.dir, "final.weights.h5"))
    mine = model.get_weights()
    loaded = keras.models.load_model(final).get_weights()
    with strategy.scope():
        again = keras.models.clone_model(model)
        again.load_weights(os.path.join(args.dir, "final.weights.h5"))
    checkpoints = {name: float(sum(np.sum(w) for w in
                                   keras.models.load_model(os.path.join(args.dir, name))
                                   .get_weights()))
                   for name in sorted(os.listdir(args.dir)) if name.startswith("ckpt-")}
    result = {
        "host": socket.gethostname(), "rank": strategy.rank,
        "local_rank": strategy.cluster.local_rank,
        "sum": float(sum(np.sum(w) for w in mine)),
        "loaded_keras": max(float(np.abs(a - b).max()) for a, b in zip(loaded, mine)),
        "loaded_h5": max(float(np.abs(a - b).max()) for a, b in zip(again.get_weights(), mine)),
        "checkpoints": checkpoints,
    }
    with open(os.path.join(args.dir, f"result.rank{strategy.rank}.json"), "w") as f:
        json.dump(result, f)
    print("tfdist-multi-host", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
