"""Worker script: training with the optimizer state sharded across the ranks (ZeRO stage 1).

Usage: python sharded_optimizer.py OUT [--cases a,b,...] [--strategy plain|sharded|ring]
                                       [--backend auto|collective|horovod|mpi] [--workdir DIR]
                                       [--bucket-bytes N] [--save-on-rank-zero-only]

`plain` is the script without tfdist (the reference), `sharded` is
`RingAllReduceStrategy(shard_optimizer_state=True)`, `ring` the same strategy
unsharded. Each case trains a small model with `fit` (101 rows in global batches
of 32: the last batch has 5 rows, so 4 ranks get slices of 2, 1, 1, 1 and more
ranks empty ones), evaluates and predicts, and returns its arrays; the saving
case also saves the model and its weights (on every rank, keras.io's way) into
the work directory. Every rank writes OUT.rank<R>.npz ("<case>/<name>" keys) and
the bytes of its optimizer's variables ("<case>/optimizer_bytes").

Cases: SGD with Nesterov momentum and clipnorm and a max-norm constraint;
Adam on a cosine-decay schedule with global_clipnorm; an Embedding (sparse
gradients) with Adam and clipnorm; AdamW with weight decay
excluding the biases by name; a LossScaleOptimizer around Adam with EMA
(overwritten every 3 steps) and gradient accumulation; RMSprop with clipvalue
in a custom `train_step`; a custom loop over `strategy.run` with Adam; and
saving (model.save, save_weights) then loading back; run_eagerly with a masked
GRU over an Embedding; a tf.SparseTensor input with Nadam.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from case_runner import cases_of, results, run_cases  # noqa: E402
from keras_patterns import ComputeLossModel  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

ROWS, FEATURES, CLASSES, BATCH, EPOCHS = 101, 12, 3, 32, 3
WORKDIR = ["."]


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (np.abs(x[:, :CLASSES]).argmax(axis=1)).astype("int32")
    return x, y


def build(strategy, optimizer_fn, constraint=None, model_class=keras.Sequential):
    with strategy.scope():
        keras.utils.set_random_seed(7)
        layers = [keras.Input((FEATURES,)),
                  keras.layers.Dense(17, activation="relu", kernel_constraint=constraint),
                  keras.layers.Dense(9, activation="tanh"),
                  keras.layers.Dense(CLASSES)]
        model = model_class(layers)
        model.compile(optimizer=optimizer_fn(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def optimizer_bytes(model):
    return sum(int(np.prod(v.shape)) * v.dtype_size if hasattr(v, "dtype_size") else
               int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
               for v in model.optimizer.variables)


def fit_and_report(model, callbacks=(), **extra):
    x, y = data()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    evaluation = model.evaluate(x, y, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(x[:37], batch_size=16, verbose=0)
    return results(model, history, evaluation, predictions,
                   optimizer_bytes=optimizer_bytes(model), **extra)


def case_sgd_nesterov_clipnorm(strategy):
    model = build(strategy, lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True,
                                                         clipnorm=0.5),
                  constraint=keras.constraints.MaxNorm(0.8))
    return fit_and_report(model)


def case_adam_schedule_global_clipnorm(strategy):
    model = build(strategy, lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.CosineDecay(0.02, 8), global_clipnorm=0.3))
    return fit_and_report(model)


def case_adamw_decay_excluding_biases(strategy):
    def adamw():
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        return optimizer

    return fit_and_report(build(strategy, adamw))


def case_loss_scale_ema_accumulation(strategy):
    model = build(strategy, lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=3,
                              gradient_accumulation_steps=2)))
    arrays = fit_and_report(model)
    arrays["loss_scale"] = model.optimizer.dynamic_scale.numpy()
    return arrays


class CustomStep(keras.Sequential):
    """keras.io's "Customizing what happens in fit()": its own tape and apply (keras_patterns')."""

    train_step = ComputeLossModel.train_step


def case_embedding_adam_clipnorm(strategy):
    """keras.io's text models' shape: an Embedding (sparse gradients, tokens repeated within
    a batch) with Adam and clipnorm - Keras squares each occurrence of a repeated row,
    so the rank's part of a sparse gradient must stay sparse (densified, it drifted)."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, 40, (ROWS, 10)).astype("int32")
    labels = (tokens[:, 0] % CLASSES).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((10,), dtype="int32")
        hidden = keras.layers.Embedding(40, 8)(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.02, clipnorm=0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(tokens, labels, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0)
    evaluation = model.evaluate(tokens, labels, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(tokens[:37], batch_size=16, verbose=0)
    return results(model, history, evaluation, predictions,
                   optimizer_bytes=optimizer_bytes(model))


def case_eager_masked_sequence(strategy):
    """Eager debugging of a masked sequence model: run_eagerly=True, an Embedding with
    mask_zero (padded sequences of several lengths; sparse gradients) into a GRU, Adam."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, 30, (ROWS, 7)).astype("int32")
    for row, length in enumerate(rng.integers(2, 8, ROWS)):
        tokens[row, length:] = 0
    labels = (tokens[:, 0] % CLASSES).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((7,), dtype="int32")
        hidden = keras.layers.Embedding(30, 6, mask_zero=True)(inputs)
        hidden = keras.layers.GRU(5)(hidden)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=True)
    history = model.fit(tokens, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    evaluation = model.evaluate(tokens, labels, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(tokens[:37], batch_size=16, verbose=0)
    return results(model, history, evaluation, predictions,
                   optimizer_bytes=optimizer_bytes(model))


def stateful_layers_gru(strategy):
    """State a layer changes as it runs: BatchNormalization's moving statistics, a Dropout
    layer and a GRU with dropout (its masks drawn inside a layer that owns parameters, which
    sharding="parameters" recomputes in the backward pass: the same masks, the statistics
    updated once), seeded; Adam. Not a `case_`: data-parallel dropout draws each rank's
    masks for its slice, so it is compared with the unsharded strategy at the same size."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(ROWS, 6, 4)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((6, 4))
        hidden = keras.layers.GRU(8, dropout=0.3, seed=1)(inputs)
        hidden = keras.layers.Dense(12, use_bias=False)(hidden)  # BatchNorm's beta is the bias
        hidden = keras.layers.BatchNormalization()(hidden)
        hidden = keras.layers.Dropout(0.25, seed=2)(hidden)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    evaluation = model.evaluate(x, y, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(x[:37], batch_size=16, verbose=0)
    return results(model, history, evaluation, predictions,
                   optimizer_bytes=optimizer_bytes(model))


def case_sparse_input_nadam(strategy):
    """A tf.SparseTensor input (bag-of-words rows, most entries zero) into Dense, Nadam."""
    x, y = data()
    x = np.where(np.abs(x) > 1.0, x, 0.0).astype("float32")
    sparse = tf.sparse.from_dense(x)
    model = build(strategy, lambda: keras.optimizers.Nadam(0.01))
    history = model.fit(sparse, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    evaluation = model.evaluate(sparse, y, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(x[:37], batch_size=16, verbose=0)
    return results(model, history, evaluation, predictions,
                   optimizer_bytes=optimizer_bytes(model))


def case_custom_train_step_rmsprop(strategy):
    model = build(strategy, lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, clipvalue=0.2),
                  model_class=CustomStep)
    return fit_and_report(model)


def guide_loop(strategy):
    """The TF guide's custom loop: (model, optimizer, compiled step over `strategy.run`), a
    loss scaled by the global batch, the optimizer's slots created in the first step."""
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(13, "relu"),
                                  keras.layers.Dense(CLASSES)])
        optimizer = keras.optimizers.Adam(0.01, clipnorm=1.0)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction="none")

    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_step(inputs):
        losses = strategy.run(step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    return model, optimizer, train_step


def loop_results(model, optimizer, losses):
    return {**{f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())},
            "losses": np.asarray(losses),
            "optimizer_bytes": sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
                                   for v in optimizer.variables)}


def distributed_data(strategy):
    x, y = data()
    return strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))


def case_custom_loop_adam(strategy):
    """The TF guide's custom loop (`guide_loop`) on a distributed global batch."""
    dataset = distributed_data(strategy)
    model, optimizer, train_step = guide_loop(strategy)
    losses = [float(train_step(batch)) for _ in range(EPOCHS) for batch in dataset]
    return loop_results(model, optimizer, losses)


def case_custom_loop_checkpoint(strategy):
    """The TF guide's custom loop with `tf.train.Checkpoint(optimizer=..., model=...)`:
    an epoch, a save on every rank (the multi-worker guide's way: the chief to the
    directory, the others to their own), a new model and optimizer restored from the
    chief's checkpoint before their first step, another epoch."""
    rank = getattr(strategy, "rank", 0)
    dataset = distributed_data(strategy)
    model, optimizer, train_step = guide_loop(strategy)
    losses = [float(train_step(batch)) for batch in dataset]
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    directory = os.path.join(WORKDIR[0], "checkpoint" if rank == 0 else f"checkpoint_{rank}")
    path = checkpoint.save(os.path.join(directory, "ckpt"))
    chief_path = path.replace(directory, os.path.join(WORKDIR[0], "checkpoint"))
    model, optimizer, train_step = guide_loop(strategy)
    tf.train.Checkpoint(optimizer=optimizer, model=model).restore(chief_path)
    losses += [float(train_step(batch)) for batch in dataset]
    return loop_results(model, optimizer, losses)


def case_save_and_load(strategy):
    """ModelCheckpoint(save_best_only=True) in fit, model.save and save_weights on every rank
    after it (keras.io's way), read back: the files hold the whole optimizer state;
    load_model trains on."""
    model = build(strategy, lambda: keras.optimizers.Adam(0.01))
    checkpoint = keras.callbacks.ModelCheckpoint(os.path.join(WORKDIR[0], "best.keras"),
                                                 monitor="loss", save_best_only=True)
    arrays = fit_and_report(model, [checkpoint])
    path = os.path.join(WORKDIR[0], "model.keras")
    model.save(path)
    model.save_weights(os.path.join(WORKDIR[0], "model.weights.h5"))
    with strategy.scope():
        loaded = keras.saving.load_model(path)
    x, y = data(1)
    history = loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    arrays.update({f"loaded_{k}": v for k, v in results(loaded, history).items()})
    return arrays


CASES = cases_of(globals())


def make_strategy(kind, backend="auto", bucket_bytes=None):
    if kind == "plain":
        return tf.distribute.get_strategy()
    import tfdist  # pylint: disable=import-outside-toplevel

    buckets = {} if bucket_bytes is None else {"fusion_threshold_bytes": bucket_bytes,
                                               "first_bucket_bytes": bucket_bytes}
    sharding = {"sharded": "optimizer", "gradients": "gradients", "ring": None,
                "parameters": "parameters"}.get(kind)
    return tfdist.strategies.RingAllReduceStrategy(backend=backend, sharding=sharding, **buckets)


def save_on_rank_zero_only(strategy, workdir):
    """Horovod's convention, which a sharded state cannot serve: train, then rank 0 alone
    saves while the others finish (the chief must fail naming it, not wait)."""
    model = build(strategy, lambda: keras.optimizers.Adam(0.01))
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    if strategy.rank == 0:
        model.save(os.path.join(workdir, "rank_zero.keras"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--strategy", choices=("plain", "sharded", "gradients", "parameters",
                                               "ring"), default="sharded")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--bucket-bytes", type=int, default=None,
                        help="the ring's largest gradient bucket, the first's too (default the "
                             "strategy's)")
    parser.add_argument("--save-on-rank-zero-only", action="store_true",
                        help="train, then save on rank 0 alone (no cases)")
    args = parser.parse_args()
    WORKDIR[0] = args.workdir
    strategy = make_strategy(args.strategy, args.backend, args.bucket_bytes)
    if args.save_on_rank_zero_only:
        save_on_rank_zero_only(strategy, args.workdir)
        return
    run_cases(CASES, args.cases.split(","), strategy, args.out)


if __name__ == "__main__":
    main()
