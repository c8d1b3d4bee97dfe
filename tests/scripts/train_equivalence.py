"""Worker script: train a small Conv+Dense model; rank 0 writes weights and history.

Usage: python train_equivalence.py OUT.npz [--optimizer adam|sgd] [--shuffle]
       [--input numpy|tfdata] [--epochs N] [--batch B]
Every rank also writes OUT.rank<R>.npz so tests can check ranks agree.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402


def make_data(n=288, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 1)).astype("float32")
    w = rng.normal(size=(64, 3)).astype("float32")
    y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype("int32")
    return x, y


def build_model(optimizer):
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3),
    ])
    opt = (keras.optimizers.Adam(1e-2) if optimizer == "adam"
           else keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--input", default="numpy")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=48)
    args = parser.parse_args()

    keras.utils.set_random_seed(1234)
    strategy = tfdist.strategies.RingAllReduceStrategy()
    x, y = make_data()
    with strategy.scope():
        model = build_model(args.optimizer)
    if args.input == "tfdata":
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
        history = model.fit(data, epochs=args.epochs, verbose=0)
    else:
        history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs,
                            shuffle=args.shuffle, verbose=0, validation_split=1 / 6)
    evaluation = model.evaluate(x, y, batch_size=args.batch, verbose=0, return_dict=True)
    predictions = model.predict(x[:100], batch_size=args.batch, verbose=0)
    result = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    result.update({f"h_{k}": np.array(v) for k, v in history.history.items()})
    result.update({f"e_{k}": np.array(v) for k, v in evaluation.items()})
    result["predictions"] = predictions
    np.savez(f"{args.out}.rank{strategy.rank}.npz", **result)
    print("history", {k: [round(float(a), 5) for a in v] for k, v in history.history.items()})


if __name__ == "__main__":
    main()
