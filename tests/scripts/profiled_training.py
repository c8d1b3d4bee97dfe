"""Worker script: a keras.io-style text classifier, profiled by an unchanged Keras TensorBoard.

  python profiled_training.py OUT LOG_DIR [--strategy ring|tree|ps|async]
      [--backend collective|horovod] [--update-freq N] [--profile-batch A:B]
      [--rows N] [--custom-step] [--clipnorm C]

Bag-of-embeddings text classification (as in keras.io's "text classification
from scratch", on synthetic token sequences): an Embedding (sparse
gradients), pooling and two Dense layers, Adam. The callbacks are the ones a
user writes - `keras.callbacks.TensorBoard(LOG_DIR, update_freq=N,
profile_batch=(A, B))` and `tfdist.callbacks.CommunicationMonitor()` - and
nothing else. Each rank writes OUT.rank<R>.json: its history and final weights.
Simulated ranks (test_profiling_in_process.py) call `main(argv)`.
--rows: the data set's size (the last global batch may leave a rank an empty
slice); --custom-step: keras_patterns.py's keras.io-style `train_step`
override (GradientTape, `compute_loss`, `optimizer.apply`, metrics);
--clipnorm: Adam's clipnorm.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from keras_patterns import ComputeLossModel  # noqa: E402  (the keras.io train_step; this directory)

VOCABULARY, LENGTH, BATCH, EPOCHS = 500, 20, 32, 2


def make_strategy(name, backend):
    if name == "ring":
        return tfdist.strategies.RingAllReduceStrategy(backend=backend)
    if name == "tree":
        return tfdist.strategies.ReductionTreeStrategy()
    if name == "ps":
        return tfdist.strategies.ParameterServerStrategy()
    return tfdist.strategies.ParameterServerStrategy(mode="async", staleness=2)


def synthetic_reviews(rows, seed=0):
    """Token sequences whose label is whether 'positive' tokens outnumber 'negative' ones."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCABULARY, size=(rows, LENGTH)).astype("int32")
    labels = ((tokens < VOCABULARY // 2).sum(axis=1) > LENGTH // 2).astype("int32")
    return tokens, labels


def main(argv=None):
    """Train as the command line (or `argv`: a simulated rank's arguments) says."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("log_dir")
    parser.add_argument("--strategy", default="ring", choices=["ring", "tree", "ps", "async"])
    parser.add_argument("--backend", default="collective")
    parser.add_argument("--update-freq", type=int, default=4)
    parser.add_argument("--profile-batch", default="3:5")
    parser.add_argument("--rows", type=int, default=384)
    parser.add_argument("--custom-step", action="store_true")
    parser.add_argument("--clipnorm", type=float, default=None)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(1)
    strategy = make_strategy(args.strategy, args.backend)
    x, y = synthetic_reviews(args.rows)
    with strategy.scope():
        inputs = keras.Input((LENGTH,), dtype="int32")
        embedded = keras.layers.Embedding(VOCABULARY, 16)(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(embedded)
        outputs = keras.layers.Dense(1, activation="sigmoid")(
            keras.layers.Dense(64, activation="relu")(hidden))
        model = (ComputeLossModel if args.custom_step else keras.Model)(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(1e-2, clipnorm=args.clipnorm),
                      loss="binary_crossentropy",
                      metrics=["accuracy"])
    first, _, last = args.profile_batch.partition(":")
    profile_batch = (int(first), int(last)) if int(first) else 0
    history = model.fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, validation_split=0.25, verbose=0,
        callbacks=[keras.callbacks.TensorBoard(args.log_dir, update_freq=args.update_freq,
                                               profile_batch=profile_batch),
                   tfdist.callbacks.CommunicationMonitor()])
    result = {"rank": strategy.rank, "world_size": strategy.world_size,
              "history": {k: [float(v) for v in values] for k, values in history.history.items()},
              "weights": [w.tolist() for w in model.get_weights()],
              "gradient_bytes": sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)}
    with open(f"{args.out}.rank{strategy.rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
