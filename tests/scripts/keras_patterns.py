"""Worker script: real-world Keras patterns, written the way keras.io examples are.

Usage: python keras_patterns.py OUT [--cases a,b,...] [--strategy ring|tree|ps]
                                     [--backend auto|collective|horovod]
Every rank writes OUT.rank<R>.npz with, per case, the final weights, the
logged history, evaluate results and predictions (keys "<case>/<name>"), so
tests can compare N processes with one and the ranks with each other.

The data sizes are chosen so that global batches do NOT split evenly over 2
or 3 processes, and the last batch of several cases has fewer rows than
processes (empty slices). Every case seeds Keras the way keras.io examples
do (`keras.utils.set_random_seed`), except `pydataset_unseeded`.
"""

import argparse
import os
import random

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from case_runner import STRATEGIES, cases_of, make_strategy, results, run_cases  # noqa: E402

VOCAB = 40


def token_data(rows, length=12, seed=0):
    """Token sequences whose label depends on which tokens occur (tokens repeat a lot)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(rows, length)).astype("int32")
    x[:, -3:] = 0  # padding, for mask_zero
    y = ((x == 3).sum(axis=1) + (x == 7).sum(axis=1) > 1).astype("int32")
    return x, y


def dense_data(rows, features=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


# ---------------------------------------------------------------- text + sparse
def case_text_adam(strategy):
    """Text classification with an Embedding and Adam: IndexedSlices gradients.

    101 rows with Keras' default batch_size=32: the last batch (5 rows) splits
    unevenly over 2 or 3 processes.
    """
    keras.utils.set_random_seed(1)
    x, y = token_data(101)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((12,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 8),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                      metrics=["accuracy", keras.metrics.AUC(name="auc")])
    history = model.fit(x, y, epochs=3, verbose=0, validation_split=0.2)
    return results(model, history, model.evaluate(x, y, verbose=0, return_dict=True),
                   model.predict(x, verbose=0))


def case_text_rmsprop_masked(strategy):
    """Embedding(mask_zero=True) with RMSprop on a tf.data pipeline, batch 20 of 77 rows."""
    keras.utils.set_random_seed(2)
    x, y = token_data(77, seed=1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(77, seed=3).batch(20)
    with strategy.scope():
        inputs = keras.Input((12,), dtype="int32")
        hidden = keras.layers.Embedding(VOCAB, 6, mask_zero=True)(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
        outputs = keras.layers.Dense(2)(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.RMSprop(0.02),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["sparse_categorical_accuracy"])
    history = model.fit(data, epochs=3, verbose=0)
    return results(model, history, model.evaluate(data, verbose=0, return_dict=True),
                   model.predict(x, batch_size=20, verbose=0))


# --------------------------------------------------- multi-input / multi-output
def case_multi_io_weights(strategy):
    """Two inputs, two outputs, loss_weights, sample weights per output.

    65 rows in batches of 16: the last global batch has ONE row, so on 2 or
    3 processes some ranks get empty slices (per-output loss trackers and
    every metric must not count them).
    """
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(4)
    rows = 65
    numbers = rng.normal(size=(rows, 5)).astype("float32")
    tokens, labels = token_data(rows, seed=5)
    target = (numbers.sum(axis=1, keepdims=True) * 0.5).astype("float32")
    weights = {"score": rng.uniform(0.5, 2.0, size=rows).astype("float32"),
               "label": rng.uniform(0.5, 2.0, size=rows).astype("float32")}
    with strategy.scope():
        number_input = keras.Input((5,), name="numbers")
        token_input = keras.Input((12,), dtype="int32", name="tokens")
        embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 4)(token_input))
        hidden = keras.layers.Dense(8, activation="relu")(
            keras.layers.Concatenate()([number_input, embedded]))
        score = keras.layers.Dense(1, name="score")(hidden)
        label = keras.layers.Dense(1, activation="sigmoid", name="label")(hidden)
        model = keras.Model([number_input, token_input], {"score": score, "label": label})
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss={"score": "mse", "label": "binary_crossentropy"},
                      loss_weights={"score": 1.0, "label": 0.5},
                      metrics={"score": ["mae"], "label": ["accuracy"]})
    inputs = {"numbers": numbers, "tokens": tokens}
    targets = {"score": target, "label": labels}
    history = model.fit(inputs, targets, sample_weight=weights, batch_size=16, epochs=3,
                        verbose=0, validation_data=(inputs, targets))
    predictions = model.predict(inputs, batch_size=16, verbose=0)
    return results(model, history, model.evaluate(inputs, targets, batch_size=16, verbose=0,
                                                  return_dict=True),
                    np.concatenate([predictions["score"], predictions["label"]], axis=1))


def case_class_weight(strategy):
    """Imbalanced classification with class_weight, batch 24 of 70 rows (last batch 22)."""
    keras.utils.set_random_seed(6)
    x, y = dense_data(70, seed=7)
    labels = (y[:, 0] > 0.8).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy",
                               keras.metrics.SparseTopKCategoricalAccuracy(k=1, name="top1")])
    history = model.fit(x, labels, batch_size=24, epochs=4, verbose=0,
                        class_weight={0: 1.0, 1: 4.0})
    return results(model, history, model.evaluate(x, labels, batch_size=24, verbose=0,
                                                  return_dict=True))


# -------------------------------------------- clipping, loss scaling, accumulation
def case_clipping(strategy):
    """clipnorm, clipvalue and global_clipnorm on a large rate, so clipping is active."""
    out = {}
    for kind in ("clipnorm", "clipvalue", "global_clipnorm"):
        keras.utils.set_random_seed(7)
        x, y = dense_data(83, seed=8)
        y = y * 30.0  # large errors: gradients far above the clip thresholds
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.05, **{kind: 0.5}), loss="mse")
        history = model.fit(x, y, batch_size=20, epochs=3, verbose=0)
        out.update({f"{kind}/{k}": v for k, v in results(model, history).items()})
    return out


def case_mixed_precision(strategy):
    """mixed_float16 with a LossScaleOptimizer: its finite check sees the global gradient.

    The initial scale is one at which no float16 sum overflows, on one process
    or on a slice (see docs/guarantees.md on loss scaling).
    """
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(9)
        x, y = dense_data(58, seed=10)
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(1, dtype="float32")])
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.Adam(0.01), initial_scale=256.0, dynamic_growth_steps=4)
            model.compile(optimizer=optimizer, loss="mse")
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
        scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
        return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                      return_dict=True), loss_scale=scale)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def case_gradient_accumulation(strategy):
    """gradient_accumulation_steps=2 with Adam."""
    keras.utils.set_random_seed(11)
    x, y = dense_data(70, seed=12)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02, gradient_accumulation_steps=2),
                      loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    return results(model, history)


# -------------------------------------------------------------- custom train_step
class ComputeLossModel(keras.Model):
    """keras.io "Customizing what happens in fit()": compute_loss + self.metrics."""

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


class LowLevelModel(keras.Model):
    """keras.io "Going lower-level": own loss function, loss tracker and metric."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.loss_fn(y, y_pred)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class StopOnLastRank(keras.callbacks.Callback):
    """Stops training at one batch, decided on the last rank only (a rank-local decision)."""

    def __init__(self, world_size, rank, at_batch):
        super().__init__()
        self.decides = rank == world_size - 1
        self.at_batch = at_batch
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.decides and self.batches == self.at_batch:
            self.model.stop_training = True


def custom_inputs():
    inputs = keras.Input((6,))
    return inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs))


def case_custom_compute_loss(strategy):
    """compute_loss + metrics; EarlyStopping on the logged loss."""
    keras.utils.set_random_seed(13)
    x, y = dense_data(75, seed=14)
    with strategy.scope():
        model = ComputeLossModel(*custom_inputs())
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=0.05)
    history = model.fit(x, y, batch_size=32, epochs=8, verbose=0, callbacks=[stop])
    return results(model, history, model.evaluate(x, y, batch_size=32, verbose=0,
                                                  return_dict=True),
                   model.predict(x, verbose=0), epochs_run=len(history.history["loss"]))


def case_custom_low_level(strategy):
    """Fully manual loss and metrics in train_step and test_step; a rank-local stop."""
    keras.utils.set_random_seed(15)
    x, y = dense_data(75, seed=16)
    with strategy.scope():
        model = LowLevelModel(*custom_inputs())
        model.compile(optimizer=keras.optimizers.Adam(0.02))
    stop = StopOnLastRank(strategy.world_size, strategy.rank, at_batch=7)
    history = model.fit(x, y, batch_size=32, epochs=5, verbose=0, callbacks=[stop],
                        validation_data=(x[:31], y[:31]))
    return results(model, history, model.evaluate(x, y, batch_size=32, verbose=0,
                                                  return_dict=True),
                   epochs_run=len(history.history["loss"]))


class StopAtEpochOnLastRank(keras.callbacks.Callback):
    """Stops training at the end of one epoch, decided on the last rank only (no batch hook)."""

    def __init__(self, world_size, rank, at_epoch):
        super().__init__()
        self.decides = rank == world_size - 1
        self.at_epoch = at_epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.decides and epoch + 1 == self.at_epoch:
            self.model.stop_training = True


class BatchLogger(keras.callbacks.Callback):
    """A per-batch logger a script adds on the chief only (it never stops anything)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float((logs or {}).get("loss", 0.0)))


def small_regressor(strategy, hidden, make_optimizer):
    """Dense(hidden, relu) -> Dense(1) on 6 features, compiled in the scope with mse and mae."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(hidden, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=make_optimizer(), loss="mse", metrics=["mae"])
    return model


def case_rank_local_epoch_stop(strategy):
    """A rank-local stop at an epoch's end, and callback lists that differ between ranks."""
    keras.utils.set_random_seed(27)
    x, y = dense_data(70, seed=28)
    model = small_regressor(strategy, 8, lambda: keras.optimizers.Adam(0.02))
    callbacks = [StopAtEpochOnLastRank(strategy.world_size, strategy.rank, at_epoch=2)]
    if strategy.rank == 0:
        callbacks.append(BatchLogger())
    history = model.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=callbacks,
                        validation_data=(x[:20], y[:20]))
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True),
                   epochs_run=len(history.history["loss"]))


# ---------------------------------------------------- predict / *_on_batch sequences
def case_predict_sequences(strategy):
    """Any sequence of predict/evaluate calls with any batch sizes; *_on_batch."""
    keras.utils.set_random_seed(17)
    x, y = dense_data(101, seed=18)
    model = small_regressor(strategy, 4, lambda: keras.optimizers.SGD(0.05))
    out = {"p12": model.predict(x, batch_size=12, verbose=0),
           "p_default": model.predict(x, verbose=0),
           "p7": model.predict(x, batch_size=7, verbose=0),
           "p2": model.predict(x[:5], batch_size=2, verbose=0),
           "e5": np.array(model.evaluate(x, y, batch_size=5, verbose=0)),
           "p_on_batch": model.predict_on_batch(x[:5]),
           "p_on_batch_1": model.predict_on_batch(x[:1])}
    out["train_on_batch"] = np.array(model.train_on_batch(x[:10], y[:10]))
    out["train_on_batch_2"] = np.array(model.train_on_batch(x[10:13], y[10:13]))
    out["test_on_batch"] = np.array(model.test_on_batch(x[:9], y[:9]))
    out.update({f"w{i}": w for i, w in enumerate(model.get_weights())})
    return out


# ------------------------------------------------------- Python-side data pipelines
class ShuffledRows(keras.utils.PyDataset):
    """A keras.utils.PyDataset of global batches; fit(shuffle=True) orders them with `random`."""

    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


def train_on_pydataset(strategy):
    x, y = dense_data(90, seed=19)
    data = ShuffledRows(x, y, batch_size=16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    history = model.fit(data, epochs=3, verbose=0)  # shuffle=True by default
    order = np.array([random.random(), np.random.rand()])  # the host generators' next draws
    return results(model, history, next_draws=order)


def case_pydataset(strategy):
    """PyDataset + a Python-side shuffle, seeded like keras.io examples: matches one process."""
    keras.utils.set_random_seed(20)
    return train_on_pydataset(strategy)


def case_pydataset_unseeded(strategy):
    """No seed at all: every rank must still draw the same batch order."""
    return train_on_pydataset(strategy)


def case_generator(strategy):
    """A Python generator of global batches with steps_per_epoch (no known length)."""
    keras.utils.set_random_seed(21)
    x, y = dense_data(64, seed=22)

    def batches():
        while True:
            for start in range(0, 64, 24):  # 24, 24, 16
                yield x[start:start + 24], y[start:start + 24]

    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    history = model.fit(batches(), steps_per_epoch=3, epochs=3, verbose=0)
    return results(model, history)


def case_batchnorm_empty_slices(strategy):
    """BatchNormalization with empty slices (33 rows, batch 16: last batch has 1 row).

    Batch statistics are per rank by construction (see docs/guarantees.md), so this case
    is compared across ranks, not with one process.
    """
    keras.utils.set_random_seed(23)
    x, y = dense_data(33, seed=24)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(), keras.layers.Activation("relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x, y))
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True))


def case_per_output_loss_trackers(strategy):
    """Two outputs, 70 rows in batches of 16 (last batch 6), then of 20 (last 10), evaluated in
    batches of 32: Keras 3.16 weights each output's loss tracker by the batch's static size,
    which only batches of the compiled step's first size have (`keras_patches.metrics`)."""
    keras.utils.set_random_seed(25)
    x, y = dense_data(70, seed=26)
    targets = {"first": y, "second": y * 2.0 - 1.0}
    with strategy.scope():
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        model = keras.Model(inputs, {"first": keras.layers.Dense(1, name="first")(hidden),
                                     "second": keras.layers.Dense(1, name="second")(hidden)})
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss={"first": "mse", "second": "mae"}, loss_weights={"first": 1.0,
                                                                             "second": 0.3})
    history = model.fit(x, targets, batch_size=16, epochs=2, verbose=0,
                        validation_data=(x, targets))
    again = model.fit(x, targets, batch_size=20, epochs=1, verbose=0)
    return results(model, history, model.evaluate(x, targets, batch_size=32, verbose=0,
                                                  return_dict=True),
                   **{f"again_{k}": v for k, v in again.history.items()})



class RetypedKerasStepModel(keras.Model):
    """Keras' own TensorFlow `train_step` retyped by a user, who gives the loss tracker the
    value `optimizer.scale_loss` returned (the loss itself on one process with a plain Adam)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            loss = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


class ClippedByHandModel(keras.Model):
    """A custom `train_step` that clips its gradients by their global norm before `apply`:
    on one process that is the whole batch's gradient (DDP's and Horovod's
    DistributedGradientTape's semantics); the norm it logs is the gradient's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.norm_tracker = keras.metrics.Mean(name="norm")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        gradients, norm = tf.clip_by_global_norm(gradients, 0.2)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.norm_tracker.update_state(norm)
        return {"loss": self.loss_tracker.result(), "norm": self.norm_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.norm_tracker]


def fit_custom_step(strategy, model_class, make_optimizer, seed):
    """`model_class` on custom_inputs(), mse, 75 rows in batches of 32 for 3 epochs."""
    keras.utils.set_random_seed(seed)
    x, y = dense_data(75, seed=seed + 1)
    with strategy.scope():
        model = model_class(*custom_inputs())
        model.compile(optimizer=make_optimizer(), loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    return results(model, history)


def case_retyped_keras_step(strategy):
    """Keras' own train_step retyped, the tracker given what scale_loss returned (75 rows)."""
    return fit_custom_step(strategy, RetypedKerasStepModel,
                           lambda: keras.optimizers.Adam(0.02), seed=27)


def case_clipped_by_hand(strategy):
    """clip_by_global_norm(gradients, 0.2) in a custom train_step, SGD (75 rows, batch 32)."""
    return fit_custom_step(strategy, ClippedByHandModel, lambda: keras.optimizers.SGD(0.1),
                           seed=29)


def case_custom_loop_clipped_by_hand(strategy):
    """The TensorFlow guide's custom loop on strategy.run (compute_average_loss with the global
    batch), gradients clipped by their global norm before apply_gradients."""
    keras.utils.set_random_seed(31)
    x, y = dense_data(75, seed=32)
    global_batch = 32
    with strategy.scope():
        inputs, outputs = custom_inputs()
        model = keras.Model(inputs, outputs)
        optimizer = keras.optimizers.SGD(0.1)
        loss_fn = keras.losses.MeanSquaredError(reduction="none")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))

    def step(features, labels):
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        gradients, norm = tf.clip_by_global_norm(gradients, 0.2)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return norm

    @tf.function
    def train(features, labels):
        return strategy.run(step, args=(features, labels))

    norms = []
    for _ in range(2):
        for features, labels in dataset:
            norms.append(float(strategy.reduce("MEAN", train(features, labels), axis=None)))
    return results(model, norms=np.asarray(norms))


CASES = cases_of(globals())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", help="output prefix; writes <out>.rank<R>.npz")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--strategy", choices=STRATEGIES[1:], default="ring")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    strategy = make_strategy(args.strategy, args.backend)
    run_cases(CASES, args.cases.split(","), strategy, args.out)

if __name__ == "__main__":
    main()
