"""Worker script: a compressor's state is built with the optimizer, from rank 0, and saved with it.

Usage: python aggregator_state.py OUT_DIR train|load|load_weights   (under `tfdist-run -np P`),
or `run(OUT_DIR, MODE)` on each simulated rank (test_checkpoints_in_process.py).

`ScaledFP16` sends each gradient as float16 after dividing it by a scale
per variable, the largest magnitude of that variable's previous global
gradient (the same on every rank): its state across steps. Each rank
initialises its scales to 1 + rank on purpose; built under the strategy
they must start as rank 0's value. `train` fits with a ModelCheckpoint
(.keras) and writes OUT_DIR/<mode>.rank<r>.npz with the scales right after
they were built and after fit, and saves the weights as BackupAndRestore
does (`save_weights`); `load` loads the checkpoint under the strategy, and
`load_weights` builds a new model's optimizer (as fit does before
BackupAndRestore restores) and loads the weights into it; both write the
scales they restored.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.aggregation.compression import Compressor  # noqa: E402


class ScaledFP16(Compressor):
    name = "scaled-fp16"

    def __init__(self, rank):
        self.rank = rank
        self.scales = {}  # id(variable) -> its scale (a variable of the optimizer)
        self.built_values = None

    @property
    def variables(self):
        return list(self.scales.values())

    def build(self, optimizer, variables):
        for variable in variables:
            self.scales[id(variable)] = optimizer.add_variable(
                (), initializer=keras.initializers.Constant(1.0 + self.rank),
                name=f"wire_scale_{len(self.scales)}")
        self.built_values = [float(s.numpy()) for s in self.scales.values()]

    def reduce(self, gradients, variables, wire):
        scales = [self.scales[id(v)] for v in variables]
        wire_values = [tf.cast(g / s, tf.float16) for g, s in zip(gradients, scales)]
        summed = [tf.cast(w, g.dtype) * s for w, g, s in zip(wire.sum(wire_values), gradients, scales)]
        updates = [s.assign(tf.maximum(tf.reduce_max(tf.abs(total)), 1e-6))
                   for s, total in zip(scales, summed)]
        with tf.control_dependencies(updates):
            return [tf.identity(total) for total in summed]


def run(out, mode):
    rank = tfdist.runtime.cluster().rank
    compressor = ScaledFP16(rank)
    strategy = tfdist.strategies.RingAllReduceStrategy(compression=compressor)
    checkpoint = os.path.join(out, "model.keras")
    weights = os.path.join(out, "model.weights.h5")
    with strategy.scope():
        if mode == "load":
            model = keras.saving.load_model(checkpoint)
        else:
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        if mode == "load_weights":
            model.optimizer.build(model.trainable_variables)
            model.load_weights(weights)
    if mode == "train":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(96, 6)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        model.fit(x, y, batch_size=32, epochs=2, verbose=0,
                  callbacks=[keras.callbacks.ModelCheckpoint(checkpoint)])
        model.save_weights(weights)
    state = strategy.extended.aggregator.variables
    if mode == "train":
        np.savez(os.path.join(out, f"train.rank{strategy.rank}.npz"),
                 built=np.float32(compressor.built_values),
                 after_fit=np.float32([s.numpy() for s in state]))
    else:  # load_model built the optimizer, and with it the state, then restored both
        np.savez(os.path.join(out, f"{mode}.rank{strategy.rank}.npz"),
                 built=np.float32(compressor.built_values),
                 loaded=np.float32([s.numpy() for s in state]))
    print(f"rank {strategy.rank} aggregator state: {len(state)} variables", flush=True)


def main():
    run(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
