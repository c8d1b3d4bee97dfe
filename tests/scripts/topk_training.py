"""Worker script: top-k with error feedback inside Keras' fit, on real processes.

Usage: python topk_training.py OUT_DIR   (under `tfdist-run -np P`)

Fits the same model three times on the same data: uncompressed, with
`TopK(1.0)` (every entry sent: must give the uncompressed weights) and with
`TopK(0.05)` (5% of each gradient per step, the rest carried in residuals).
Writes OUT_DIR/topk.rank<r>.npz: the three runs' weights and losses, and
the 5% run's residuals (this rank's own).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from tfdist.aggregation.topk import TopK  # noqa: E402


def fit(compression, x, y):
    strategy = tfdist.strategies.RingAllReduceStrategy(compression=compression)
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, y, batch_size=30, epochs=4, shuffle=False, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    residuals = [r.numpy().ravel() for r in strategy.extended.aggregator.variables]
    return strategy.rank, weights, np.float32(history.history["loss"]), residuals


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 12)).astype("float32")  # 5 batches, the last one uneven per rank
    y = np.sin(x[:, :1]) + 0.1 * x[:, 1:2]
    rank, plain, plain_loss, _ = fit(None, x, y)
    _, full, full_loss, _ = fit(TopK(1.0), x, y)
    _, sparse, sparse_loss, residuals = fit(TopK(0.05), x, y)
    np.savez(os.path.join(out, f"topk.rank{rank}.npz"), plain=plain, plain_loss=plain_loss,
             full=full, full_loss=full_loss, sparse=sparse, sparse_loss=sparse_loss,
             residuals=np.concatenate(residuals))
    print(f"rank {rank} topk done", flush=True)


if __name__ == "__main__":
    main()
