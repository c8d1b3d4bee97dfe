"""Worker script: train a small Conv+Dense model; rank 0 writes weights and history.

Usage: python train_equivalence.py OUT [--configs adam,sgd_shuffle,adam_tfdata]
                                        [--strategy ring|tree|ps --fanouts 2,3]
                                        [--bucket-bytes B --first-bucket-bytes F]
Every rank writes OUT.rank<R>.npz (weights, history, evaluate and predict
results per configuration, keys "<config>/<name>"; for the tree, one run per
fanout in the same processes, keys "fanout<k>/<config>/<name>") so tests can
compare world sizes and ranks.
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


def build_model(optimizer, steps_per_execution=1):
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
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


CONFIGS = {
    # name: (optimizer, shuffle, input, steps_per_execution)
    "adam": ("adam", False, "numpy", 1),
    "sgd_shuffle": ("sgd", True, "numpy", 1),
    "adam_tfdata": ("adam", True, "tfdata", 2),
}


def train(strategy, optimizer, shuffle, input_kind, steps_per_execution, epochs, batch, rows):
    """Train one configuration from the same seed; return arrays to compare."""
    keras.utils.set_random_seed(1234)
    x, y = make_data(rows)
    n_train = rows * 5 // 6
    with strategy.scope():
        model = build_model(optimizer, steps_per_execution)
    if input_kind == "tfdata":
        train_data = tf.data.Dataset.from_tensor_slices((x[:n_train], y[:n_train]))
        if shuffle:
            train_data = train_data.shuffle(n_train, seed=7)
        val_data = tf.data.Dataset.from_tensor_slices((x[n_train:], y[n_train:])).batch(batch)
        history = model.fit(train_data.batch(batch), epochs=epochs, verbose=0,
                            validation_data=val_data)
    else:
        history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=shuffle,
                            verbose=0, validation_split=1 / 6)
    evaluation = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    predictions = model.predict(x[:100], batch_size=batch, verbose=0)
    result = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    result.update({f"h_{k}": np.array(v) for k, v in history.history.items()})
    result.update({f"e_{k}": np.array(v) for k, v in evaluation.items()})
    result["predictions"] = predictions
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", help="output prefix; writes <out>.rank<R>.npz")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--rows", type=int, default=288, help="examples (5/6 train, 1/6 val)")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--compression", default=None)
    parser.add_argument("--strategy", choices=["ring", "tree", "ps"], default="ring")
    parser.add_argument("--fanouts", default="2", help="tree fanouts, one training each")
    parser.add_argument("--bucket-bytes", type=int, default=None,
                        help="ring/tree gradient bucket size (fusion_threshold_bytes)")
    parser.add_argument("--first-bucket-bytes", type=int, default=None)
    args = parser.parse_args()

    buckets = {}
    if args.bucket_bytes is not None:
        buckets["fusion_threshold_bytes"] = args.bucket_bytes
    if args.first_bucket_bytes is not None:
        buckets["first_bucket_bytes"] = args.first_bucket_bytes
    if args.strategy == "ring":
        strategies = {"": tfdist.strategies.RingAllReduceStrategy(
            backend=args.backend, compression=args.compression, **buckets)}
        if strategies[""].is_chief:
            print("backend", strategies[""].backend, flush=True)
    elif args.strategy == "ps":
        strategies = {"": tfdist.strategies.ParameterServerStrategy(compression=args.compression)}
    else:
        strategies = {f"fanout{k}/": tfdist.strategies.ReductionTreeStrategy(
            fanout=int(k), compression=args.compression, **buckets)
            for k in args.fanouts.split(",")}
    arrays = {}
    for prefix, strategy in strategies.items():
        for name in args.configs.split(","):
            result = train(strategy, *CONFIGS[name], args.epochs, args.batch,
                           args.rows)
            arrays.update({f"{prefix}{name}/{k}": v for k, v in result.items()})
            print(prefix + name, "loss", [round(float(a), 5) for a in result["h_loss"]],
                  flush=True)
        gradients = [tf.zeros(v.shape, v.dtype) for v in build_model("sgd").trainable_variables]
        print(prefix + "gradient buckets per step:",
              len(strategy.extended.aggregator.bucket_positions(gradients)), flush=True)
    np.savez(f"{args.out}.rank{strategy.rank}.npz", **arrays)


if __name__ == "__main__":
    main()
