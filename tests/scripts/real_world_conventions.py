"""Cases of real_world.py: eager debugging, sparse inputs, hand-written losses, Horovod's saving.

Written the way users write them, each compared with the plain script:

* `compile(run_eagerly=True)` - the usual way to debug - with an `Embedding`
  (sparse gradients whose indices come from the batch), and a custom
  `train_step` under `run_eagerly` with a token and a position embedding (indices
  shared by every rank);
* sparse inputs: a CSR matrix (scikit-learn's TF-IDF output) into
  `Input(sparse=True)`, and a `tf.SparseTensor` in a `tf.data` pipeline, eager;
* a `compute_loss` override and a custom `train_step` (eager) that return
  their own ratio, `sum(w * l) / max(sum(w), 1)`;
* `keras.optimizers.ScheduleFreeAdamW` as documented (its `build` copies
  the weights);
* Horovod's convention: only rank 0 saves (a callback only rank 0 has, then
  `save`, `save_weights` and `export` after `fit`), the others go on; every
  rank then loads the files.

Row counts leave uneven slices and a last batch smaller than the ranks.
"""

import os

import keras
import numpy as np
import scipy.sparse
import tensorflow as tf
from keras import layers, ops

from case_runner import rank_of, results

WORKDIR = ["."]  # real_world.py sets it (--workdir): where saves go, shared by the ranks


def tokens(rows, length, vocab, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, vocab, size=(rows, length)).astype("int32")
    y = ((x == 3).sum(axis=1) + (x == 7).sum(axis=1) > 1).astype("float32")
    return x, y


class RatioStep(keras.Model):
    """A custom `train_step` (keras.io's) whose loss is a hand-written weighted ratio."""

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            predictions = self(x, training=True)
            loss = weighted_ratio(y, predictions, sample_weight)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, predictions)
        return {metric.name: metric.result() for metric in self.metrics}


class RatioLoss(keras.Model):
    """`compute_loss` overridden to return a hand-written weighted ratio."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return weighted_ratio(y, y_pred, sample_weight)


def weighted_ratio(y, predictions, sample_weight):
    per_row = keras.losses.binary_crossentropy(y, predictions)
    weights = ops.reshape(ops.cast(sample_weight, per_row.dtype), ops.shape(per_row))
    return ops.sum(weights * per_row) / ops.maximum(ops.sum(weights), 1.0)


class PositionStep(keras.Model):
    """keras.io's custom `train_step` on a token + position embedding model."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            predictions = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=predictions)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, predictions)
        return {metric.name: metric.result() for metric in self.metrics}


def case_eager_embedding(strategy):
    """`run_eagerly=True` with an Embedding (batch indices), then a custom step under
    `run_eagerly` with a position embedding (indices every rank shares)."""
    keras.utils.set_random_seed(41)
    x, y = tokens(101, 10, 30, seed=41)
    with strategy.scope():
        model = keras.Sequential([keras.Input((10,), dtype="int32"), layers.Embedding(30, 8),
                                  layers.GlobalAveragePooling1D(),
                                  layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                      metrics=["accuracy"], run_eagerly=True)
        inputs = keras.Input((10,), dtype="int32")
        positions = layers.Embedding(10, 8)(ops.arange(10))
        hidden = layers.GlobalAveragePooling1D()(layers.Embedding(30, 8)(inputs) + positions)
        stepped = PositionStep(inputs, layers.Dense(1, activation="sigmoid")(hidden))
        stepped.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                        metrics=["accuracy"], run_eagerly=True)
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    stepped_history = stepped.fit(x, y, batch_size=24, epochs=2, verbose=0)
    return results(model, history, model.evaluate(x, y, verbose=0, return_dict=True),
                   model.predict(x, verbose=0),
                   **{f"stepped_{k}": v for k, v in results(
                       stepped, stepped_history, predictions=stepped.predict(x, verbose=0)).items()})


def sparse_rows(rows, seed):
    """A sparse bag-of-words matrix (a TF-IDF-like CSR) and labels."""
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, 24)).astype("float32")
    dense[dense < 0.8] = 0.0
    return dense, (dense.sum(axis=1) > 1.0).astype("float32")


def case_sparse_inputs(strategy):
    """A CSR matrix into `Input(sparse=True)` (Keras multiplies it through
    `embedding_lookup_sparse`), then a `tf.SparseTensor` pipeline run eagerly; 97 rows."""
    keras.utils.set_random_seed(42)
    dense, y = sparse_rows(97, seed=42)
    csr = scipy.sparse.csr_matrix(dense)
    dataset = tf.data.Dataset.from_tensor_slices((tf.sparse.from_dense(dense), y)).batch(16)
    with strategy.scope():
        inputs = keras.Input((24,), sparse=True)
        hidden = layers.Dense(16, activation="relu")(inputs)
        model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                      metrics=["accuracy"])
        inputs = keras.Input((24,), sparse=True)
        eager = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(layers.Dense(8)(inputs)))
        eager.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                      run_eagerly=True)
    history = model.fit(csr, y, batch_size=32, epochs=2, verbose=0)
    eager_history = eager.fit(dataset, epochs=2, verbose=0)
    return results(model, history, model.evaluate(csr, y, verbose=0, return_dict=True),
                   model.predict(csr, verbose=0),
                   **{f"eager_{k}": v for k, v in results(
                       eager, eager_history, predictions=eager.predict(dataset, verbose=0)
                   ).items()})


def case_hand_written_ratio(strategy):
    """`sum(w * l) / max(sum(w), 1)` returned by a `compute_loss` override (traced) and by a
    custom `train_step` (eager), with sample weights that are 0 on some rows; 83 rows."""
    keras.utils.set_random_seed(43)
    rng = np.random.default_rng(43)
    x = rng.normal(size=(83, 5)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    weights = rng.integers(0, 3, size=(83,)).astype("float32")
    trained = {}
    for name, kind, eager in (("overridden", RatioLoss, False), ("stepped", RatioStep, True)):
        with strategy.scope():
            inputs = keras.Input((5,))
            hidden = layers.Dense(4, activation="tanh")(inputs)
            model = kind(inputs, layers.Dense(1, activation="sigmoid")(hidden))
            model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                          metrics=["accuracy"], run_eagerly=eager)
        history = model.fit(x, y, sample_weight=weights, batch_size=16, epochs=2, verbose=0)
        trained.update({f"{name}_{k}": v for k, v in results(
            model, history, model.evaluate(x, y, sample_weight=weights, verbose=0,
                                           return_dict=True)).items()})
    return trained


def case_schedule_free(strategy):
    """`ScheduleFreeAdamW` compiled and fit as its documentation shows; 70 rows."""
    keras.utils.set_random_seed(44)
    rng = np.random.default_rng(44)
    x = rng.normal(size=(70, 6)).astype("float32")
    y = x @ rng.normal(size=(6, 1)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"),
                                  layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.ScheduleFreeAdamW(0.01), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    return results(model, history, model.evaluate(x, y, verbose=0, return_dict=True),
                   model.predict(x, verbose=0))


class _SaveEachEpoch(keras.callbacks.Callback):
    """Horovod's examples: a callback only rank 0 has, saving the model every epoch."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        self.model.save(os.path.join(self.directory, f"epoch{epoch + 1}.keras"))


def case_saves_on_rank_zero(strategy):
    """Horovod's convention: `if rank == 0:` around every save (in a callback, after `fit`:
    `save`, `save_weights`, `export`); the other ranks never call one. After a collective
    (`evaluate`) every rank loads the chief's files."""
    keras.utils.set_random_seed(45)
    rank = rank_of(strategy)
    directory = os.path.join(WORKDIR[0], "saves_on_rank_zero")
    os.makedirs(directory, exist_ok=True)
    x, y = tokens(90, 6, 20, seed=45)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,), dtype="int32"), layers.Embedding(20, 4),
                                  layers.Flatten(), layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                      metrics=["accuracy"])
    callbacks = [_SaveEachEpoch(directory)] if rank == 0 else []
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=callbacks)
    if rank == 0:
        model.save(os.path.join(directory, "final.keras"))
        model.save_weights(os.path.join(directory, "final.weights.h5"))
        model.export(os.path.join(directory, "exported"), verbose=False)
    evaluation = model.evaluate(x, y, verbose=0, return_dict=True)  # after rank 0's saves
    loaded = keras.models.load_model(os.path.join(directory, "final.keras"))
    first = keras.models.load_model(os.path.join(directory, "epoch1.keras"))
    with strategy.scope():
        copy = keras.models.clone_model(model)
    copy.load_weights(os.path.join(directory, "final.weights.h5"))
    exported = tf.saved_model.load(os.path.join(directory, "exported"))  # held: its variables
    served = exported.serve(tf.constant(x)).numpy()
    return results(model, history, evaluation, model.predict(x, verbose=0),
                   loaded=loaded.predict(x, verbose=0), first=first.predict(x, verbose=0),
                   copy=copy.predict(x, verbose=0), served=served)
