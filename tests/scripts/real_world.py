"""Worker script: scripts a new user brings, written the way keras.io and the TF guides write them.

Usage: python real_world.py OUT [--cases a,b,...] [--strategy plain|ring|tree|ps]
                                [--backend auto|collective|horovod] [--workdir DIR]

`--strategy plain` runs every case as the plain script would run without
tfdist: `tf.distribute.get_strategy()`, the default strategy, whose
`scope()` changes nothing and whose `run`/`reduce`/`experimental_distribute_dataset`
are the identity - the reference every tfdist run is compared with. Every
rank writes OUT.rank<R>.npz with, per case, its weights, logged history,
evaluate results and predictions (keys "<case>/<name>").

The cases are the paths the keras_patterns suite does not walk:

* the TensorFlow guide's custom training loop ("Custom training with
  tf.distribute.Strategy") on `experimental_distribute_dataset`, and the
  multi-worker guide's on `distribute_datasets_from_function` with an
  `InputContext`; optimizer slots are created inside `strategy.run`;
* a recurrent per-token sequence tagger (`Embedding(mask_zero=True)`, a
  bidirectional LSTM, `Dense` on a 3-D tensor: a masked per-token loss whose
  denominator is the slice's valid tokens, not its rows);
* keras.io's Transformer text classifier (`TokenAndPositionEmbedding`: a
  batch-independent `Embedding` lookup);
* reductions whose denominator is not the row count (`reduction="sum"`,
  `"mean_with_sample_weight"`);
* `BatchNormalization(synchronized=True)` on uneven and empty slices
  (`fit`, `evaluate`, `predict`, a custom loop), and a layer's own state
  declared with each `aggregation=` ("sum" float and int, "mean",
  "only_first_replica");
* keras.io's save-then-load on every rank (`save`, `load_model`,
  `save_weights`, `load_weights`, `export` and serving the SavedModel), and
  a fresh model evaluated, given trained weights and trained on;
* layers that fail on zero rows under oneDNN or eagerly (convolution,
  max pooling, LSTM) on empty slices, in a custom loop
  traced and eager, then `fit`, `evaluate` and `predict`;
* `keras.utils.set_random_seed` with unseeded, reshuffled `Dataset.shuffle`;
* `predict` on a list of inputs (multi-input models);
* metrics with integer state (`MeanIoU`, `IoU`, `OneHotMeanIoU`) and others;
* `ModelCheckpoint(save_best_only=True)` read back with `load_model` right
  after `fit`, on every rank, and training the reloaded model further;
  a `tf.train.Checkpoint` saved and restored in a custom loop;
* transfer learning (freeze, train the head, unfreeze, recompile, fine-tune);
* from `real_world_conventions.py`: `run_eagerly` with embeddings, sparse
  inputs, hand-written loss ratios, `ScheduleFreeAdamW`, and saves on rank 0
  only (Horovod's convention).

Global batches do not split evenly over 2, 3 or 4 processes, and the last
batch of several cases has fewer rows than processes (empty slices).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers, ops  # noqa: E402

from case_runner import STRATEGIES, cases_of, make_strategy, results, run_cases  # noqa: E402

VOCAB = 50
WORKDIR = ["."]  # --workdir: where checkpoint cases write (shared by the ranks)


# ------------------------------------------------------------- input order
def case_seeded_before_strategy(strategy):
    """The script seeds at its top (`main`, before the strategy line), shuffles unseeded.

    Run first: nothing between `set_random_seed` and this case's shuffle
    may draw an op seed that the plain script does not.
    """
    rng = np.random.default_rng(14)
    x = rng.normal(size=(60, 4)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), layers.Dense(4, activation="relu"),
                                  layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return results(model, model.fit(dataset, epochs=2, verbose=0))


def case_reshuffled_dataset(strategy):
    """`set_random_seed` with an unseeded `Dataset.shuffle` reshuffled every epoch.

    Keras peeks at a batch to build a model under a strategy; the peek
    must not advance the shuffle the epochs then draw.
    """
    keras.utils.set_random_seed(31)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(90, 4)).astype("float32")
    y = (x[:, :1] * 2.0 - x[:, 1:2]).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"),
                                  layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse", metrics=["mae"])
    history = model.fit(dataset, epochs=3, verbose=0)
    return results(model, history)


# ------------------------------------------------------------- custom loops
def images(rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6, 6, 1)).astype("float32")
    y = (x[:, :3].mean(axis=(1, 2, 3)) > x[:, 3:].mean(axis=(1, 2, 3))).astype("int64")
    return x, y


def guide_model():
    return keras.Sequential([
        keras.Input((6, 6, 1)),
        layers.Conv2D(4, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3)),
        layers.Dense(2),
    ])


def case_guide_custom_loop(strategy):
    """The TensorFlow guide "Custom training with tf.distribute.Strategy", unchanged in shape.

    193 rows in global batches of 32: the last batch has one row, so on
    2 or 3 processes some ranks get an empty slice, and 32 rows split
    10/11/11 on 3. The guide's `tf.nn.compute_average_loss(per_example_loss)`
    has no `global_batch_size`: TensorFlow would guess it as rows x replicas.
    """
    keras.utils.set_random_seed(11)
    GLOBAL_BATCH_SIZE = 32
    x, y = images(193, seed=1)
    x_test, y_test = images(70, seed=2)
    train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
    test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(GLOBAL_BATCH_SIZE)
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    with strategy.scope():
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction="none")

        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)  # as the guide has it now
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

        test_loss = keras.metrics.Mean(name="test_loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
        model = guide_model()
        optimizer = keras.optimizers.Adam(learning_rate=0.01)  # built inside strategy.run

    def train_step(inputs):
        images_, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images_, training=True)
            loss = compute_loss(labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images_, labels = inputs
        predictions = model(images_, training=False)
        t_loss = loss_object(labels, predictions)
        test_loss.update_state(t_loss)
        test_accuracy.update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    history = {"loss": [], "accuracy": [], "test_loss": [], "test_accuracy": []}
    for _ in range(3):
        total_loss, num_batches = 0.0, 0
        for batch in train_dist_dataset:
            total_loss += distributed_train_step(batch)
            num_batches += 1
        for batch in test_dist_dataset:
            distributed_test_step(batch)
        history["loss"].append(float(total_loss / num_batches))
        history["accuracy"].append(float(train_accuracy.result()))
        history["test_loss"].append(float(test_loss.result()))
        history["test_accuracy"].append(float(test_accuracy.result()))
        for metric in (test_loss, train_accuracy, test_accuracy):
            metric.reset_state()
    return results(model, **{f"h_{k}": v for k, v in history.items()})


def case_multi_worker_custom_loop(strategy):
    """The multi-worker guide's loop: `distribute_datasets_from_function` with an InputContext.

    Each process builds its own pipeline (`shard`, per-replica batch); the
    metric and the optimizer's slots are created inside `strategy.run`; the
    step returns per-replica predictions that are gathered and reduced.
    """
    keras.utils.set_random_seed(12)
    GLOBAL_BATCH_SIZE = 48
    x, y = images(192, seed=3)

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH_SIZE)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
        return dataset.batch(batch_size)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = guide_model()
        optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    state = {}

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            x_, y_ = inputs
            if "accuracy" not in state:  # a variable created inside strategy.run
                state["accuracy"] = keras.metrics.SparseCategoricalAccuracy()
            with tf.GradientTape() as tape:
                predictions = model(x_, training=True)
                per_batch_loss = keras.losses.sparse_categorical_crossentropy(
                    y_, predictions, from_logits=True)
                loss = tf.nn.compute_average_loss(per_batch_loss,
                                                  global_batch_size=GLOBAL_BATCH_SIZE)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            state["accuracy"].update_state(y_, predictions)
            return loss, tf.argmax(predictions, axis=1)

        per_replica_loss, per_replica_classes = strategy.run(step_fn, args=(next(iterator),))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        return loss, strategy.gather(per_replica_classes, axis=0)

    losses, classes = [], []
    for _ in range(3):
        iterator = iter(dist_dataset)
        for _ in range(192 // GLOBAL_BATCH_SIZE):
            loss, gathered = train_step(iterator)
            losses.append(float(loss))
            classes.append(np.sort(gathered.numpy()))  # gathered rows come in rank order
    local = strategy.experimental_local_results(
        strategy.run(lambda: tf.constant(1.0)))
    return results(model, h_loss=losses, classes=np.concatenate(classes),
                   accuracy=float(state["accuracy"].result()), local_results=len(local))


def zero_row_sensitive_model():
    """Layers that fail on zero rows (experiments/onednn_zero_rows.py): under oneDNN a
    convolution's shape and a max pool's gradient, on any CPU an eager LSTM. (Training-mode
    BatchNormalization normalizes by each slice's statistics, which differ by construction.)"""
    return keras.Sequential([
        keras.Input((8, 3)),
        layers.Conv1D(4, 3, padding="same", activation="relu"),
        layers.LayerNormalization(),
        layers.MaxPooling1D(2),
        layers.SeparableConv1D(4, 2, padding="same"),
        layers.LSTM(4, return_sequences=True),
        layers.GlobalAveragePooling1D(),
        layers.Dense(2, kernel_regularizer=keras.regularizers.L2(1e-2)),
    ])


def case_layers_on_empty_slices(strategy):
    """Convolution, max pooling, normalization and an LSTM where slices are empty.

    33 rows in global batches of 16: the last batch has one row, so ranks
    other than 0 get an empty slice. A custom loop traced (`tf.function`) for
    one epoch and run eagerly for the next, each evaluated in a custom loop;
    then `fit`, `evaluate` and `predict` on the same model.
    """
    keras.utils.set_random_seed(21)
    GLOBAL_BATCH_SIZE = 16
    rng = np.random.default_rng(21)
    x = rng.normal(size=(33, 8, 3)).astype("float32")
    y = (x[:, :4, 0].mean(axis=1) > x[:, 4:, 1].mean(axis=1)).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)
    with strategy.scope():
        model = zero_row_sensitive_model()
        optimizer = keras.optimizers.Adam(0.01)
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction="none")
        accuracy = keras.metrics.SparseCategoricalAccuracy()

    def train_step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, logits),
                                              global_batch_size=GLOBAL_BATCH_SIZE)
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def test_step(inputs):
        features, labels = inputs
        logits = model(features, training=False)
        accuracy.update_state(labels, logits)
        return tf.argmax(logits, axis=1)

    def distributed_train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(train_step, args=(batch,)), axis=None)

    def distributed_test_step(batch):
        return strategy.gather(strategy.run(test_step, args=(batch,)), axis=0)

    history = {"loss": [], "accuracy": []}
    classes = []
    traced_train, traced_test = tf.function(distributed_train_step), \
        tf.function(distributed_test_step)
    for train, test in ((traced_train, traced_test),
                        (distributed_train_step, distributed_test_step)):
        history["loss"].append(float(sum(float(train(batch)) for batch in dist_dataset)))
        classes.extend(np.sort(test(batch).numpy()) for batch in dist_dataset)
        history["accuracy"].append(float(accuracy.result()))
        accuracy.reset_state()
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    fitted = model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, verbose=0)
    evaluation = model.evaluate(x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0,
                                return_dict=True)
    predictions = model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0)
    return results(model, fitted, evaluation, predictions,
                   **{f"loop_{k}": v for k, v in history.items()},
                   loop_classes=np.concatenate(classes))


def case_sync_batchnorm(strategy):
    """`BatchNormalization(synchronized=True)` on uneven and empty slices: `fit`, `evaluate`,
    `predict`, then a custom loop.

    65 rows in global batches of 32 split 11/11/10 on 3 processes, and the
    last batch has one row (empty slices on 2 and 3). SyncBN normalizes by
    the global batch's statistics, so the plain script is the reference
    even in training mode; its backward pass sums across replicas.
    """
    keras.utils.set_random_seed(33)
    rng = np.random.default_rng(33)
    x = rng.normal(size=(65, 6)).astype("float32") * np.arange(1, 7, dtype="float32")
    y = (x[:, :1] - 0.5 * x[:, 1:2] + 0.1 * x[:, 2:3] ** 2).astype("float32")
    with strategy.scope():
        model = keras.Sequential([
            # No bias before BatchNormalization (keras.io's ResNets): its gradient is zero up
            # to rounding, which Adam would scale up to full steps on any run.
            keras.Input((6,)), layers.Dense(8, use_bias=False),
            layers.BatchNormalization(synchronized=True), layers.Activation("relu"),
            layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    evaluation = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=32, verbose=0)
    GLOBAL_BATCH_SIZE = 32
    dist_dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE))
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05)

    @tf.function
    def train_step(batch):
        def step_fn(inputs):
            features, targets = inputs
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean((model(features, training=True) - targets) ** 2,
                                             axis=1)
                loss = tf.nn.compute_average_loss(per_example,
                                                  global_batch_size=GLOBAL_BATCH_SIZE)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(step_fn, args=(batch,)), axis=None)

    loop_losses = [float(train_step(batch)) for _ in range(2) for batch in dist_dataset]
    return results(model, history, evaluation, predictions, loop_loss=loop_losses)


class RowStatistics(layers.Layer):
    """A layer with state it updates in `call` from its batch, one variable per aggregation
    (the "making new layers and models via subclassing" guide's pattern)."""

    def build(self, input_shape):
        width = input_shape[-1]
        self.rows_sum = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                        aggregation="sum", name="rows_sum")
        self.rows_count = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                          dtype="int32", aggregation="sum", name="rows_count")
        self.feature_mean = self.add_weight(shape=(width,), initializer="zeros",
                                            trainable=False, aggregation="mean",
                                            name="feature_mean")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     dtype="int32", aggregation="only_first_replica",
                                     name="calls")

    def call(self, inputs, training=None):
        if training:
            rows = ops.shape(inputs)[0]
            self.rows_sum.assign_add(ops.cast(rows, "float32"))
            self.rows_count.assign_add(ops.cast(rows, "int32"))
            self.feature_mean.assign(0.9 * self.feature_mean + 0.1 * ops.mean(inputs, axis=0))
            self.calls.assign_add(1)
        return inputs


def case_layer_state_aggregations(strategy):
    """Layer state declared with `aggregation=` ("sum" as float and int32, "mean",
    "only_first_replica") on uneven and empty slices: each must equal the plain script's."""
    keras.utils.set_random_seed(34)
    rng = np.random.default_rng(34)
    x = rng.normal(size=(67, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32")
    with strategy.scope():
        statistics = RowStatistics()
        model = keras.Sequential([keras.Input((4,)), statistics, layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    return results(model, history, rows_sum=float(statistics.rows_sum.numpy()),
                   rows_count=int(statistics.rows_count.numpy()),
                   calls=int(statistics.calls.numpy()))


def small_classifier(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), layers.Dense(8, activation="relu"),
                                  layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def trained_classifier(strategy, seed):
    """`small_classifier` trained 2 epochs on 65 rows in batches of 32 (empty slices);
    (model, x, y)."""
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(65, 5)).astype("float32")
    y = np.argmax(x[:, :3] + 0.3 * x[:, 3:4], axis=1).astype("int64")
    model = small_classifier(strategy)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    return model, x, y


def case_save_then_load(strategy):
    """keras.io's serialization guide on every rank: `save`, `load_model` right after, train
    the reloaded model on; `save_weights` / `load_weights`; `export` and serve the SavedModel."""
    model, x, y = trained_classifier(strategy, seed=35)
    path = os.path.join(WORKDIR[0], "save_then_load.keras")
    model.save(path)
    with strategy.scope():
        reloaded = keras.models.load_model(path)
    reloaded_predictions = reloaded.predict(x, batch_size=32, verbose=0)
    history = reloaded.fit(x, y, batch_size=32, epochs=1, verbose=0)
    weights_path = os.path.join(WORKDIR[0], "save_then_load.weights.h5")
    reloaded.save_weights(weights_path)
    copy = small_classifier(strategy)
    copy.load_weights(weights_path)
    export_dir = os.path.join(WORKDIR[0], "save_then_load_export")
    reloaded.export(export_dir, verbose=False)
    saved_model = tf.saved_model.load(export_dir)  # held: its variables live with it
    served = saved_model.serve(tf.constant(x)).numpy()
    return results(reloaded, history, predictions=reloaded_predictions,
                   copy_predictions=copy.predict(x, batch_size=32, verbose=0), served=served)


def case_evaluate_then_load_weights(strategy):
    """A fresh model is evaluated, then given trained weights, then trained: as on one
    process, `load_weights` finds no optimizer state to restore (none was built)."""
    trained, x, y = trained_classifier(strategy, seed=36)
    path = os.path.join(WORKDIR[0], "evaluate_then_load.weights.h5")
    trained.save_weights(path)
    model = small_classifier(strategy)
    before = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    model.load_weights(path)
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    return results(model, history, model.evaluate(x, y, batch_size=32, verbose=0,
                                                  return_dict=True),
                   fresh_loss=before["loss"])


def case_custom_loop_checkpoint(strategy):
    """A custom loop saves a `tf.train.Checkpoint` every epoch and restores it into a new model."""
    keras.utils.set_random_seed(13)
    GLOBAL_BATCH_SIZE = 20
    x, y = images(61, seed=4)
    dist_dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE))
    with strategy.scope():
        model = guide_model()
        optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)

    @tf.function
    def train_step(inputs):
        def step_fn(batch):
            x_, y_ = batch
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y_, model(x_, training=True), from_logits=True)
                loss = tf.nn.compute_average_loss(per_example,
                                                  global_batch_size=GLOBAL_BATCH_SIZE)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(step_fn, args=(inputs,)), axis=None)

    checkpoint_dir = os.path.join(WORKDIR[0], "custom_loop_checkpoints")
    for _ in range(2):
        for batch in dist_dataset:
            train_step(batch)
        checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
    with strategy.scope():
        restored_model = guide_model()
        restored = tf.train.Checkpoint(model=restored_model)
    restored.restore(tf.train.latest_checkpoint(checkpoint_dir)).expect_partial()
    return results(restored_model, predictions=restored_model.predict(x, verbose=0))


# ---------------------------------------------------------- sequence models
def tagged_sequences(rows, length=10, tags=4, seed=0):
    """Token sequences of varying length (0-padded) and one tag per token (0 at padding)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, length + 1, size=rows)
    tokens = rng.integers(1, VOCAB, size=(rows, length)).astype("int32")
    tokens[np.arange(length)[None, :] >= lengths[:, None]] = 0
    tag = (tokens % tags).astype("int32")
    tag[tokens == 0] = 0
    return tokens, tag


def case_sequence_tagger(strategy):
    """A per-token tagger: bidirectional LSTM, Dense on the 3-D sequence, masked loss.

    Keras' default loss reduction divides each slice's loss by its valid
    (unmasked) tokens; one process divides by the global batch's.
    89 rows in batches of 16 (last batch 9).
    """
    keras.utils.set_random_seed(21)
    x, y = tagged_sequences(89, seed=5)
    with strategy.scope():
        inputs = keras.Input((None,), dtype="int32")
        hidden = layers.Embedding(VOCAB, 8, mask_zero=True)(inputs)
        hidden = layers.Bidirectional(layers.LSTM(6, return_sequences=True))(hidden)
        hidden = layers.Dense(8, activation="relu")(hidden)
        outputs = layers.Dense(4, activation="softmax")(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, validation_split=0.25)
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True),
                   model.predict(x, batch_size=16, verbose=0))


class CustomNonPaddingTokenLoss(keras.losses.Loss):
    """keras.io's NER example loss, as written there: a mean over the non-padding tokens."""

    def __init__(self, name="custom_ner_loss"):
        super().__init__(name=name)

    def call(self, y_true, y_pred):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False, reduction=None)
        loss = loss_fn(y_true, y_pred)
        mask = ops.cast((y_true > 0), dtype="float32")
        loss = loss * mask
        return ops.sum(loss) / ops.sum(mask)


def case_ner_custom_loss(strategy):
    """keras.io's NER pattern: a per-token classifier whose `Loss.call` divides by the tokens.

    The loss is a ratio of two batch sums computed inside `call`; one
    process divides by the global batch's non-padding tokens.
    """
    keras.utils.set_random_seed(25)
    x, y = tagged_sequences(70, length=8, tags=5, seed=18)
    y = np.where(x > 0, y + 1, 0).astype("int32")  # tag 0 is padding, as in the example
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,), dtype="int32"), layers.Embedding(VOCAB, 8),
                                  layers.Dense(16, activation="relu"),
                                  layers.Dense(6, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss=CustomNonPaddingTokenLoss())
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, validation_data=(x, y))
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True),
                   model.predict(x, batch_size=16, verbose=0))


class TransformerBlock(layers.Layer):
    """keras.io "Text classification with Transformer", as written there."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    """keras.io's: the position lookup `arange(maxlen)` is the same for every example."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def case_transformer_classifier(strategy):
    """keras.io's Transformer text classifier (dropout 0: masks would differ per rank)."""
    keras.utils.set_random_seed(22)
    maxlen, embed_dim = 12, 8
    rng = np.random.default_rng(6)
    x = rng.integers(1, VOCAB, size=(75, maxlen)).astype("int32")
    y = ((x[:, :4] > VOCAB // 2).sum(axis=1) >= 2).astype("int32")
    with strategy.scope():
        inputs = layers.Input(shape=(maxlen,))
        embedding_layer = TokenAndPositionEmbedding(maxlen, VOCAB, embed_dim)
        hidden = embedding_layer(inputs)
        hidden = TransformerBlock(embed_dim, 2, 16, rate=0.0)(hidden)
        hidden = layers.GlobalAveragePooling1D()(hidden)
        hidden = layers.Dense(8, activation="relu")(hidden)
        outputs = layers.Dense(2, activation="softmax")(hidden)
        model = keras.Model(inputs=inputs, outputs=outputs)
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, validation_data=(x, y))
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True),
                   model.predict(x, batch_size=16, verbose=0))


def case_loss_reductions(strategy):
    """Loss reductions whose denominator is not the slice's rows.

    `reduction="sum"` (one process sums over the global batch),
    `"mean_with_sample_weight"` with sample weights (divides by their sum),
    and a temporal sample weight on a masked sequence loss.
    """
    out = {}
    rng = np.random.default_rng(7)
    x = rng.normal(size=(53, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    weights = rng.uniform(0.0, 3.0, size=53).astype("float32")
    for reduction in ("sum", "mean_with_sample_weight"):
        keras.utils.set_random_seed(23)
        with strategy.scope():
            model = keras.Sequential([keras.Input((5,)), layers.Dense(8, activation="tanh"),
                                      layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.002 if reduction == "sum" else 0.05),
                          loss=keras.losses.MeanSquaredError(reduction=reduction))
        history = model.fit(x, y, sample_weight=weights, batch_size=16, epochs=3, verbose=0)
        evaluation = model.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0,
                                    return_dict=True)
        out.update({f"{reduction}/{k}": v for k, v in results(model, history, evaluation).items()})
    keras.utils.set_random_seed(24)
    tokens, tags = tagged_sequences(45, seed=8)
    token_weights = np.where(tokens > 0, rng.uniform(0.5, 2.0, size=tokens.shape), 0.0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((None,), dtype="int32"),
                                  layers.Embedding(VOCAB, 6, mask_zero=True),
                                  layers.GRU(6, return_sequences=True),
                                  layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.RMSprop(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
    history = model.fit(tokens, tags, sample_weight=token_weights.astype("float32"),
                        batch_size=8, epochs=2, verbose=0)
    out.update({f"temporal/{k}": v for k, v in results(model, history).items()})
    return out


def case_fit_per_rank_pipeline(strategy):
    """`fit` on `distribute_datasets_from_function`: each process builds its own pipeline.

    The per-rank path for input that cannot be the same on every rank
    (files per worker): rank r reads every P-th example in batches of
    24 / P, so global batch k holds the rows of one process's batch k.
    """
    keras.utils.set_random_seed(34)
    rng = np.random.default_rng(16)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = (x[:, :2].sum(axis=1, keepdims=True) > 0).astype("float32")

    def dataset_fn(input_context):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.batch(input_context.get_per_replica_batch_size(24))

    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), layers.Dense(6, activation="relu"),
                                  layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.5),
                      loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=3,
                        verbose=0)
    return results(model, history)


def case_added_losses(strategy):
    """`add_loss` terms that are means over the batch, activity and weight regularizers.

    (keras.io's pattern `add_loss(rate * ops.sum(x))`, a sum over the batch,
    is weighted as a mean over each rank's slice: docs/guarantees.md.)
    """

    class ActivityRegularization(layers.Layer):
        def __init__(self, rate):
            super().__init__()
            self.rate = rate

        def call(self, inputs):
            self.add_loss(self.rate * ops.mean(ops.square(inputs)))
            return inputs

    keras.utils.set_random_seed(35)
    rng = np.random.default_rng(17)
    x = rng.normal(size=(43, 6)).astype("float32")
    y = (x[:, :3].sum(axis=1, keepdims=True)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((6,)),
            layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01),
                         activity_regularizer=keras.regularizers.L1(0.01)),
            ActivityRegularization(0.1),
            layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, validation_data=(x, y))
    return results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True))


# ------------------------------------------------------------ multi-input
def case_multi_input_predict(strategy):
    """A two-input functional model: fit, evaluate and predict on a list of arrays."""
    keras.utils.set_random_seed(41)
    rng = np.random.default_rng(10)
    title = rng.integers(1, VOCAB, size=(47, 6)).astype("int32")
    body = rng.normal(size=(47, 4)).astype("float32")
    y = (body.sum(axis=1, keepdims=True) > 0).astype("float32")
    with strategy.scope():
        title_input = keras.Input((6,), dtype="int32", name="title")
        body_input = keras.Input((4,), name="body")
        title_features = layers.GlobalAveragePooling1D()(layers.Embedding(VOCAB, 4)(title_input))
        merged = layers.concatenate([title_features, body_input])
        priority = layers.Dense(1, activation="sigmoid", name="priority")(merged)
        model = keras.Model([title_input, body_input], priority)
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                      metrics=["accuracy"])
    history = model.fit([title, body], y, batch_size=10, epochs=2, verbose=0)
    as_list = model.predict([title, body], batch_size=10, verbose=0)
    as_dict = model.predict({"title": title, "body": body}, batch_size=10, verbose=0)
    on_batch = model.predict_on_batch([title[:7], body[:7]])
    return results(model, history, model.evaluate([title, body], y, batch_size=10, verbose=0,
                                                  return_dict=True),
                   as_list, as_dict=as_dict, on_batch=on_batch)


def case_slices_that_retrace_on_some_ranks(strategy):
    """63 rows in batches of 32: slices 16/16 then 15/16 on 2 processes (10/11/11 then
    10/10/11 on 3, 8/8/8/8 then 7/8/8/8 on 4): some ranks trace their step again, others not.

    `predict` and a custom loop that hands each batch to a `tf.function`.
    """
    keras.utils.set_random_seed(42)
    x = np.random.default_rng(19).normal(size=(63, 4)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
    predictions = model.predict(x, batch_size=32, verbose=0)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(x).batch(32))

    @tf.function
    def step(batch):
        def replica_step(rows):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.reduce_sum(tf.square(model(rows)), axis=1))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_step, args=(batch,)), axis=None)

    losses = [float(step(batch)) for _ in range(2) for batch in dataset]
    return results(model, predictions=predictions, h_loss=losses)


# ------------------------------------------------------------------ metrics
def case_metric_dtypes(strategy):
    """Per-pixel segmentation with integer-state IoU metrics and a zoo of others."""
    keras.utils.set_random_seed(51)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(41, 6, 6, 2)).astype("float32")
    y = (x[..., :1] > 0).astype("int32") + (x[..., 1:] > 0.8).astype("int32")
    with strategy.scope():
        inputs = keras.Input((6, 6, 2))
        hidden = layers.Conv2D(6, 3, padding="same", activation="relu")(inputs)
        outputs = layers.Conv2D(3, 1, activation="softmax")(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy",
            metrics=[keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False),
                     keras.metrics.IoU(num_classes=3, target_class_ids=[1], sparse_y_pred=False),
                     "accuracy"])
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y))
    out = results(model, history, model.evaluate(x, y, batch_size=8, verbose=0,
                                                 return_dict=True))

    keras.utils.set_random_seed(52)
    z = rng.normal(size=(37, 5)).astype("float32")
    labels = (z[:, 0] + z[:, 1] > 0).astype("float32")[:, None]
    with strategy.scope():
        classifier = keras.Sequential([keras.Input((5,)), layers.Dense(6, activation="relu"),
                                       layers.Dense(1, activation="sigmoid")])
        classifier.compile(
            optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
            metrics=[keras.metrics.Precision(), keras.metrics.Recall(), keras.metrics.AUC(),
                     keras.metrics.F1Score(threshold=0.5), keras.metrics.R2Score(),
                     keras.metrics.TruePositives(), keras.metrics.BinaryIoU(),
                     keras.metrics.OneHotMeanIoU(num_classes=2, name="one_hot_iou"),
                     keras.metrics.PrecisionAtRecall(0.5)])
    history = classifier.fit(z, labels, batch_size=8, epochs=2, verbose=0)
    out.update({f"zoo/{k}": v for k, v in results(
        classifier, history, classifier.evaluate(z, labels, batch_size=8, verbose=0,
                                                 return_dict=True)).items()})
    return out


# -------------------------------------------------------------- checkpoints
def small_regressor():
    return keras.Sequential([keras.Input((5,)), layers.Dense(8, activation="relu"),
                             layers.Dense(1)])


def case_checkpoint_reload(strategy):
    """keras.io's checkpoint recipe: save the best model, load it right after fit, go on."""
    keras.utils.set_random_seed(61)
    rng = np.random.default_rng(12)
    x = rng.normal(size=(70, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.3 * rng.normal(size=(70, 1))).astype("float32")
    path = os.path.join(WORKDIR[0], "best.keras")
    with strategy.scope():
        model = small_regressor()
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    callbacks = [keras.callbacks.ModelCheckpoint(path, monitor="val_loss",
                                                 save_best_only=True)]
    model.fit(x, y, batch_size=16, epochs=6, verbose=0, validation_split=0.3,
              callbacks=callbacks)
    with strategy.scope():
        reloaded = keras.models.load_model(path)
    loaded_weights = [np.array(w) for w in reloaded.get_weights()]
    history = reloaded.fit(x, y, batch_size=16, epochs=2, verbose=0)
    out = results(reloaded, history, reloaded.evaluate(x, y, batch_size=16, verbose=0,
                                                       return_dict=True))
    out.update({f"loaded_w{i}": w for i, w in enumerate(loaded_weights)})
    return out


def case_transfer_learning(strategy):
    """keras.io's transfer-learning guide: frozen base (BatchNorm in inference), then fine-tune."""
    keras.utils.set_random_seed(71)
    rng = np.random.default_rng(13)
    x = rng.normal(size=(58, 8, 8, 3)).astype("float32")
    y = (x[..., 0].mean(axis=(1, 2)) > 0).astype("float32")
    with strategy.scope():
        base_model = keras.Sequential([
            keras.Input((8, 8, 3)),
            layers.Conv2D(6, 3, activation="relu"),
            layers.BatchNormalization(),
            layers.Conv2D(6, 3, activation="relu"),
        ], name="base")
        base_model.trainable = False
        inputs = keras.Input(shape=(8, 8, 3))
        hidden = base_model(inputs, training=False)
        hidden = layers.GlobalAveragePooling2D()(hidden)
        outputs = layers.Dense(1)(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy()])
    head = model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x, y))
    base_model.trainable = True
    # The guide keeps BatchNormalization in inference mode while fine-tuning (its batch
    # statistics are per rank by construction: docs/guarantees.md).
    base_model.layers[1].trainable = False
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy()])
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x, y))
    out = results(model, history, model.evaluate(x, y, batch_size=16, verbose=0,
                                                 return_dict=True))
    out.update({f"head_h_{k}": np.asarray(v) for k, v in head.history.items()})
    return out


# ---------------------------------------------------------- mixed precision
SLICES = [1]  # --slices: the plain reference of the float16 case computes P slices' gradients


class SlicedBatchRegressor(keras.Sequential):
    """One process computing each step's gradient as P processes do: slice by slice, summed.

    Rows [r n // P, (r + 1) n // P) are slice r (tfdist's split); each
    slice's loss is weighted by its share of the batch, scaled, and
    differentiated on its own in float16; the float32 gradients are summed
    and applied once. This is the float16 noise floor of data parallelism:
    the same arithmetic as P ranks, on one process.
    """

    def train_step(self, data):
        x, y = data
        n = tf.shape(x)[0]
        total, loss_sum = None, 0.0
        for r in range(SLICES[0]):
            lo, hi = (r * n) // SLICES[0], ((r + 1) * n) // SLICES[0]
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x[lo:hi], y=y[lo:hi], y_pred=self(x[lo:hi],
                                                                            training=True))
                share = tf.cast(hi - lo, tf.float32) / tf.cast(n, tf.float32)
                loss = tf.math.multiply_no_nan(loss, share)
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, self.trainable_variables)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            loss_sum += loss
        self.optimizer.apply(total, self.trainable_variables)
        return {"loss": loss_sum}


def case_mixed_float16_regression(strategy):
    """mixed_float16 regression (targets around 200, Adam, dynamic loss scale).

    Compared with the plain script run with `--slices P` (`SlicedBatchRegressor`):
    float16 rounds a gradient summed over P slices differently from one over
    the whole batch, and a slice's float16 partial sum may overflow where
    the whole batch's does not (or the reverse), so the loss scale may skip
    other steps. tfdist on P processes equals the sliced one process.
    """
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(81)
        rng = np.random.default_rng(15)
        x = rng.normal(size=(176, 8)).astype("float32")
        y = (200.0 + 20.0 * x @ rng.normal(size=(8, 1))).astype("float32")
        regressor = SlicedBatchRegressor if SLICES[0] > 1 else keras.Sequential
        with strategy.scope():
            model = regressor([keras.Input((8,)), layers.Dense(32, activation="relu"),
                               layers.Dense(32, activation="relu"),
                               layers.Dense(1, dtype="float32")])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        scales = []
        record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: (
            scales.append(float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)))))
        model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[record])
        return results(model, loss_scales=scales)
    finally:
        keras.mixed_precision.set_global_policy("float32")


import real_world_conventions  # noqa: E402  pylint: disable=wrong-import-position
# In this order: the in-process tier's cycle gives each its (strategy, ranks) by position.
from real_world_conventions import (  # noqa: E402,F401,I001  pylint: disable=wrong-import-position,unused-import
    case_eager_embedding, case_schedule_free, case_sparse_inputs, case_hand_written_ratio,
    case_saves_on_rank_zero)

real_world_conventions.WORKDIR = WORKDIR  # one list: --workdir and the tests set both
CASES = cases_of(globals())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", help="output prefix; writes <out>.rank<R>.npz")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--strategy", choices=STRATEGIES, default="ring")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--slices", type=int, default=1,
                        help="plain reference of mixed_float16_regression: P slices per step")
    parser.add_argument("--workdir", default=None,
                        help="directory the checkpoint cases write to (default: OUT's)")
    args = parser.parse_args()
    WORKDIR[0] = args.workdir or os.path.dirname(os.path.abspath(args.out))
    SLICES[0] = args.slices
    keras.utils.set_random_seed(0)  # at the top, as keras.io scripts do: before the strategy
    strategy = make_strategy(args.strategy, args.backend)
    run_cases(CASES, args.cases.split(","), strategy, args.out)

if __name__ == "__main__":
    main()
