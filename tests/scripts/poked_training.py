"""A job for strangers to poke: trains slowly enough that every port it opens is reachable.

    python poked_training.py OUT_PREFIX [--strategy ring|ps|ps-async] [--backend B]

Seeded; each batch ends with a short pause so that training lasts a few seconds; every rank
writes OUT_PREFIX.rank<R>.npz with its final weights (one process: the reference).
"""

import argparse
import time

import keras
import numpy as np

import tfdist


class Pause(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("--strategy", default="ring", choices=("ring", "ps", "ps-async"))
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    if args.strategy == "ring":
        strategy = tfdist.strategies.RingAllReduceStrategy(backend=args.backend)
    else:
        strategy = tfdist.strategies.ParameterServerStrategy(
            mode="async" if args.strategy == "ps-async" else "sync")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 12)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=32, epochs=6, verbose=0, callbacks=[Pause()])
    np.savez(f"{args.prefix}.rank{strategy.rank}.npz",
             **{f"w{i}": w for i, w in enumerate(model.get_weights())})


if __name__ == "__main__":
    main()
