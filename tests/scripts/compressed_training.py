"""Worker script: every lossy compressor inside Keras' fit, on real processes.

Usage: python compressed_training.py OUT_DIR [SETTING,...]   (under `tfdist-run -np P`)

Fits the same small CNN-free model (two Dense layers with matrices worth
compressing) on the same data, once per compression setting: uncompressed;
the lossless settings `TopK(1.0)` and full-rank `PowerSGD` (must give the
uncompressed weights); and the lossy `PowerSGD(rank=2)`, `TopK(0.01)`,
`TopK(0.05, momentum=0.9)` with a momentum-free SGD, PowerSGD rank 1 after 16
exact steps (two epochs), `SignSGD()` and "fp16",
each with `tfdist.callbacks.CommunicationMonitor`. Writes
OUT_DIR/compressed.rank<r>.npz: per setting the weights, the loss per epoch,
the monitor's `sent_mb` per epoch, and this rank's residuals.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402

SETTINGS = {
    "plain": lambda: None,
    "topk_full": lambda: tfdist.compression.TopK(1.0),
    "powersgd_full": lambda: tfdist.compression.PowerSGD(rank=64, min_compression_rate=0),
    "powersgd": lambda: tfdist.compression.PowerSGD(rank=2),
    "powersgd_warmup": lambda: tfdist.compression.PowerSGD(rank=1, start_step=16),
    "topk": lambda: tfdist.compression.TopK(ratio=0.01),
    "topk_momentum": lambda: tfdist.compression.TopK(0.05, momentum=0.9),
    "signsgd": lambda: tfdist.compression.SignSGD(),
    "fp16": lambda: "fp16",
}


def fit(name, x, y):
    strategy = tfdist.strategies.RingAllReduceStrategy(compression=SETTINGS[name]())
    keras.utils.set_random_seed(7)
    momentum = 0.0 if name == "topk_momentum" else 0.9  # DGC: momentum in the compressor
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(64, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.02, momentum=momentum), loss="mse")
    history = model.fit(x, y, batch_size=40, epochs=6, shuffle=False, verbose=0,
                        callbacks=[tfdist.callbacks.CommunicationMonitor()])
    aggregator = strategy.extended.aggregator
    residuals = [np.ravel(aggregator.compressor.residual(v))
                 for v in model.trainable_variables
                 if getattr(getattr(aggregator, "compressor", None), "residual", None)
                 and aggregator.compressor.residual(v) is not None]
    return (strategy.rank, np.concatenate([w.ravel() for w in model.get_weights()]),
            np.float32(history.history["loss"]), np.float32(history.history.get("sent_mb", [0.0])),
            np.concatenate(residuals) if residuals else np.zeros(0, "float32"))


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 32)).astype("float32")  # 8 batches, the last one uneven per rank
    y = np.sin(x[:, :1]) + 0.3 * x[:, 1:2] * x[:, 2:3]
    arrays = {}
    for name in sys.argv[2].split(",") if len(sys.argv) > 2 else SETTINGS:
        rank, weights, loss, sent_mb, residuals = fit(name, x, y)
        arrays.update({f"{name}_weights": weights, f"{name}_loss": loss,
                       f"{name}_sent_mb": sent_mb, f"{name}_residuals": residuals})
    np.savez(os.path.join(out, f"compressed.rank{rank}.npz"), **arrays)
    print(f"rank {rank} compressed training done", flush=True)


if __name__ == "__main__":
    main()
