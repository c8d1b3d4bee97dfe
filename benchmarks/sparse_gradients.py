"""Worker script (run under tfdist-run): embedding gradients kept sparse vs made dense.

Usage: python sparse_gradients.py OUT.json VOCAB[,VOCAB...]

A text classifier (Embedding(VOCAB, 64) -> mean pooling -> Dense(1), Adam),
global batches of 256 sequences of 16 token ids, trained twice from the same
start in the same processes:

* "sparse": keras.io's custom `train_step` (tape, `optimizer.apply`). The
  embedding gradient is an `IndexedSlices` of at most 256 x 16 rows; tfdist
  all-gathers every rank's (index, value) pairs, so the bytes grow with the
  batch, not the vocabulary;
* "dense": the same step with the embedding gradient converted to a dense
  VOCAB x 64 tensor before `optimizer.apply` (what a strategy that cannot
  gather would all-reduce), so the bytes grow with the vocabulary.

For each, rank 0 records the median step time (the first epoch, tracing and
warm-up, is left out) and the loopback interface's bytes per step (every
process of the job is on this host, so that is all of the job's traffic),
plus the largest difference between the two runs' final weights. Read the
ratios dense/sparse, measured in the same run.
"""

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from harness import StepTimer  # noqa: E402  (this directory, run as a script)
from loopback import loopback_bytes  # noqa: E402

DIM, SEQUENCE, BATCH, STEPS, EPOCHS = 64, 16, 256, 8, 3


class TextModel(keras.Model):
    """Embedding -> mean pooling -> Dense, with keras.io's custom train_step.

    `densify`: convert every gradient to a dense tensor before `optimizer.apply`.
    """

    def __init__(self, vocab, densify):
        super().__init__()
        self.densify = densify
        self.embedding = keras.layers.Embedding(vocab, DIM)
        self.pooling = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(1)

    def call(self, tokens):
        return self.head(self.pooling(self.embedding(tokens)))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            scaled_loss = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, self.trainable_weights)
        if self.densify:
            gradients = [tf.convert_to_tensor(g) for g in gradients]
        self.optimizer.apply(gradients, self.trainable_weights)
        return {"loss": loss}


class StepMeter(StepTimer):
    """Step times and loopback bytes of every epoch after the first."""

    def __init__(self):
        super().__init__()
        self.bytes, self.steps = 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.epoch_start_bytes = loopback_bytes()

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.bytes += loopback_bytes() - self.epoch_start_bytes
            self.steps += STEPS


def train(strategy, mode, vocab, x, y):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = TextModel(vocab, densify=mode == "dense")
        model(x[:1])  # build
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    meter = StepMeter()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[meter])
    return model.get_weights(), {
        "median_step_ms": 1e3 * statistics.median(meter.times),
        "loopback_bytes_per_step": meter.bytes / meter.steps,
    }


def main():
    out, vocabs = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
    strategy = tfdist.strategies.RingAllReduceStrategy()
    rows = []
    for vocab in vocabs:
        rng = np.random.default_rng(vocab)
        x = rng.integers(0, vocab, size=(BATCH * STEPS, SEQUENCE)).astype("int32")
        y = rng.normal(size=(BATCH * STEPS, 1)).astype("float32")
        sparse_weights, sparse = train(strategy, "sparse", vocab, x, y)
        dense_weights, dense = train(strategy, "dense", vocab, x, y)
        rows.append({
            "processes": strategy.world_size, "vocabulary": vocab, "embedding_dim": DIM,
            "global_batch": BATCH, "tokens_per_batch": BATCH * SEQUENCE,
            "dense_gradient_bytes": vocab * DIM * 4, "sparse": sparse, "dense": dense,
            "dense_over_sparse_bytes": dense["loopback_bytes_per_step"]
            / sparse["loopback_bytes_per_step"],
            "dense_over_sparse_step_time": dense["median_step_ms"] / sparse["median_step_ms"],
            "max_weight_difference": max(float(np.max(np.abs(a - b)))
                                         for a, b in zip(sparse_weights, dense_weights)),
        })
    if strategy.is_chief:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
