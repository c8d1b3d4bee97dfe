"""Worker script of the stress harness (`benchmarks/stress.py`): one short, complete job.

Every process of the job runs, under the strategy given on the command line:

1. a small CNN with Dropout on generated 8x8 images: `fit` (shuffled, with
   validation data), `evaluate`, `predict`, `model.save`;
2. a second model in the same process (an MLP with BatchNormalization) on a
   shuffled `tf.data` pipeline with `steps_per_execution=2`: `fit`;
3. a model with a custom `train_step` (the keras.io "customizing what happens
   in fit" pattern: GradientTape + `optimizer.apply`): `fit`;
4. uneven work after training, as real scripts have (the chief saves the final
   model, every rank spends a random 0..`--linger` seconds on its own), so ranks
   exit seconds apart: a peer that exits first is not a failure.

It exercises every lifecycle point where a multi-process job can break:
start-up, tracing and running compiled steps, a second strategy user in
the same process, saving, and interpreter exit. Each process first moves
into a directory of its own (named by role, rank and pid) under the
working directory, so that a core file of every crashing process is kept
(the kernel names them all "core").

    tfdist-run -np 3 python benchmarks/stress_worker.py --strategy ring --backend collective
    horovodrun --gloo -np 2 python benchmarks/stress_worker.py --strategy ring --backend horovod
"""

import argparse
import os
import random
import time


def _enter_own_directory():
    """cd into ./<role><rank>-<pid>: one core file per crashing process (before TF loads)."""
    if os.environ.get("TFDIST_ROLE") == "server":
        label = "s" + os.environ.get("TFDIST_SERVER_INDEX", "")
    else:
        label = "rank" + os.environ.get("TFDIST_RANK", os.environ.get("HOROVOD_RANK", "0"))
    path = f"{label}-{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    os.chdir(path)


_enter_own_directory()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

STRATEGIES = {
    "ring": lambda args: tfdist.strategies.RingAllReduceStrategy(backend=args.backend),
    "tree": lambda args: tfdist.strategies.ReductionTreeStrategy(fanout=2),
    "ps": lambda args: tfdist.strategies.ParameterServerStrategy(),
}


class CustomStepModel(keras.Model):
    """A model whose `train_step` is written by hand (keras.io's pattern for Keras 3 on TF)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def generated_images(n, seed):
    """8x8 one-channel images whose class is the brightest of 4 quadrants + 4 x (row parity)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    quadrants = x.reshape(n, 2, 4, 2, 4).mean(axis=(2, 4)).reshape(n, 4)
    y = (quadrants.argmax(axis=1) + 4 * (x[:, 0, 0, 0] > 0.5)).astype("int32")
    return x, y


def cnn():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(8, activation="softmax"),
    ])


def mlp_with_batch_norm():
    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.Dense(1),
    ])


def custom_step_model():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return CustomStepModel(inputs, keras.layers.Dense(1)(hidden))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--backend", choices=["auto", "collective", "horovod"], default="auto")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--linger", type=float, default=6.0,
                        help="most seconds of local work after training (default 6)")
    args = parser.parse_args()
    start = time.monotonic()
    strategy = STRATEGIES[args.strategy](args)
    batch = 12 * strategy.world_size  # global batch, divisible by any world size used

    x, y = generated_images(240, seed=0)
    with strategy.scope():
        model = cnn()
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x[:192], y[:192], batch_size=batch, epochs=args.epochs,
              validation_data=(x[192:], y[192:]), shuffle=True, verbose=0)
    model.evaluate(x[192:], y[192:], batch_size=batch, verbose=0)
    predictions = model.predict(x[192:], batch_size=batch, verbose=0)
    assert predictions.shape == (48, 8), predictions.shape
    model.save("cnn.keras")

    rng = np.random.default_rng(1)
    features = rng.normal(size=(192, 6)).astype("float32")
    targets = (features @ rng.normal(size=(6, 1))).astype("float32")
    with strategy.scope():
        second = mlp_with_batch_norm()
        second.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                       metrics=["mae"], steps_per_execution=2)
    pipeline = tf.data.Dataset.from_tensor_slices((features, targets)).shuffle(192, seed=7)
    second.fit(pipeline.batch(batch), epochs=args.epochs, shuffle=False, verbose=0)

    with strategy.scope():
        custom = custom_step_model()
        custom.compile(optimizer="adam", loss="mse", metrics=["mae"])
    custom.fit(features, targets, batch_size=batch, epochs=args.epochs, verbose=0)
    custom.save("custom.keras")  # the chief writes; other ranks go on at once
    time.sleep(random.Random(os.getpid()).uniform(0.0, args.linger))
    print(f"stress worker rank {strategy.rank}: done in {time.monotonic() - start:.1f} s",
          flush=True)


if __name__ == "__main__":
    main()
