"""Train a small CNN on scikit-learn's bundled 8x8 digits, on any number of processes.

    tfdist-run -np 2 python examples/digits.py                # ring all-reduce, 2 processes
    python examples/digits.py                                 # the same script, one process
    tfdist-run -np 2 python examples/digits.py --strategy ring --epochs 20
    horovodrun -np 2 python examples/digits.py --strategy ring   # Horovod's ring (auto backend)
    tfdist-run -np 3 python examples/digits.py --strategy tree   # reduction tree (fanout 2)
    tfdist-run -np 3 --num-servers 1 python examples/digits.py --strategy ps   # parameter server
    horovodrun -np 2 python examples/digits.py --strategy ps     # one server per worker
    tfdist-run -np 2 --profile prof python examples/digits.py --tensorboard logs
        # tfdist/ scalars in TensorBoard (logs), every rank profiled, merged timeline (prof)

The data set (1,797 images, 10 classes) ships with scikit-learn: nothing is
downloaded. `--batch-size` is the global batch, split across the processes.
Only the chief prints the per-epoch (global) metrics.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tfdist  # noqa: E402

STRATEGIES = {
    "ring": lambda args: tfdist.strategies.RingAllReduceStrategy(
        backend=args.backend, compression=args.compression),
    "tree": lambda args: tfdist.strategies.ReductionTreeStrategy(
        fanout=args.fanout, compression=args.compression),
    "ps": lambda args: tfdist.strategies.ParameterServerStrategy(compression=args.compression),
}


def load_data(validation_fraction=0.2, seed=0):
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_val = int(len(x) * validation_fraction)
    return (x[n_val:], y[n_val:]), (x[:n_val], y[:n_val])


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--backend", choices=["auto", "collective", "horovod"], default="auto",
                        help="ring all-reduce engine (ring strategy)")
    parser.add_argument("--fanout", type=int, default=2, help="tree fanout (tree strategy)")
    parser.add_argument("--compression", choices=["none", "fp16", "powersgd", "topk", "signsgd"],
                        default="none",
                        help="gradient compression on the wire (each with its defaults; see "
                             "tfdist.compression)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="global batch size (default: 64, rounded up to a multiple of the "
                             "number of processes)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--tensorboard", metavar="LOG_DIR", default=None,
                        help="add keras.callbacks.TensorBoard(LOG_DIR, update_freq=10): Keras' "
                             "scalars and tfdist's communication scalars (tfdist/...)")
    parser.add_argument("--backup", metavar="DIR", default=None,
                        help="add keras.callbacks.BackupAndRestore(DIR, save_freq=20): rerun "
                             "(or restarted, or preempted), the run resumes at the next batch")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    strategy = STRATEGIES[args.strategy](args)
    (x_train, y_train), (x_val, y_val) = load_data()
    if args.batch_size is None:
        args.batch_size = -(-64 // strategy.world_size) * strategy.world_size
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if strategy.is_chief:
        backend = getattr(strategy, "backend", None)
        engine = f" ({backend})" if backend else ""
        print(f"tfdist digits: {args.strategy} strategy{engine}, {strategy.world_size} process(es), "
              f"global batch {args.batch_size}, {len(x_train)} training images", flush=True)
    start = time.time()
    callbacks = ([keras.callbacks.TensorBoard(args.tensorboard, update_freq=10)]
                 if args.tensorboard else [])
    if args.backup:
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup, save_freq=20))
    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_val, y_val), verbose=2, callbacks=callbacks)
    seconds = time.time() - start
    if strategy.is_chief:
        accuracy = history.history["val_accuracy"][-1]
        print(f"tfdist digits: final validation accuracy {accuracy:.4f} "
              f"after {args.epochs} epochs in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
