"""Horovod's own Keras tests (test/parallel/test_tensorflow2_keras.py, Horovod 0.28.1), ported to
Keras 3 and `tfdist.horovod.keras`; run inside tests/scripts/horovod_api.py's job.

Ported (the Keras 2 spellings replaced by Keras 3's: `learning_rate=` for `lr=`,
`optimizer.learning_rate` for `optimizer.lr`, `ReLU(threshold=)` for the removed
`ThresholdedReLU`, no `input_length`, gradients from a `GradientTape` for the private
`_compute_gradients`):

* test_train_model_lr_schedule: warmup and three schedules, the loss history equal on every rank;
* test_sparse_as_dense: an embedding trained with `sparse_as_dense=True`;
* test_sparse_as_dense_with_grad_aggregation: with two backward passes per step, the weights
  change every second step (Horovod read its aggregation helper's counter);
* test_gradient_aggregation (average_aggregated_gradients True and False): a custom
  optimizer's `apply_gradients` in a `tf.function`, outside `fit`, averaged over the ranks
  and accumulated over 4 passes; the loss is scaled by rank + 1 (as Horovod's local-vars
  variant does), so the average is checked, not only the accumulation;
* test_from_config;
* test_broadcast_global_variables_callback_with_local_vars: root = the last rank, the first
  layer's variables local; each rank's values set by assignments after creation (Horovod
  uses per-rank initializers: the same, each variable being the creating rank's own).

Not ported: test_legacy_optimizer (Keras 3 has no legacy optimizers), test_grad_aggregation_
with_inf_grad (Horovod's aggregation helper zeroes an infinite accumulated gradient; Keras 3's
`gradient_accumulation_steps` applies it, as it does without Horovod), test_gradient_
aggregation_with_local_vars and test_partial_distributed_optimizer (`register_local_var` and
`PartialDistributedOptimizer`: per-rank gradients are not offered), test_elastic_state
(Horovod's elastic API: not offered yet).
"""

import numpy as np
import tensorflow as tf

import tfdist.horovod.keras as hvd


def test_train_model_lr_schedule():
    import keras  # pylint: disable=import-outside-toplevel

    initial_lr = 0.1 * hvd.size()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam())

    def linear_multiplier(epoch):
        return epoch

    model = keras.models.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                                     keras.layers.RepeatVector(3),
                                     keras.layers.ReLU(threshold=0.5)])
    model.compile(loss=keras.losses.mean_squared_error, optimizer=opt,
                  metrics=[keras.metrics.categorical_accuracy],
                  experimental_run_tf_function=False)
    x = np.random.random((10, 3))
    y = np.random.random((10, 3, 2))

    class StoreLearningRateCallback(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            lr = float(self.model.optimizer.learning_rate.numpy())
            if 0 <= epoch < 5:
                assert lr <= initial_lr or np.isclose(lr, initial_lr)
            if 5 < epoch < 10:
                assert lr <= initial_lr * 1e-1 or np.isclose(lr, initial_lr * 1e-1)
            if 10 < epoch < 15:
                assert lr < initial_lr * 1e-2 or np.isclose(lr, initial_lr * 1e-2)
            if 15 <= epoch < 20:
                assert np.isclose(lr, initial_lr * linear_multiplier(epoch))

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=5),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-1,
                                                   start_epoch=5, end_epoch=10),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-2,
                                                   start_epoch=10, end_epoch=15),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr,
                                                   multiplier=linear_multiplier,
                                                   start_epoch=15, end_epoch=20),
        StoreLearningRateCallback()]
    train_history = model.fit(x, y, steps_per_epoch=5, callbacks=callbacks, epochs=20,
                              verbose=0)
    loss_metrics = tf.convert_to_tensor(train_history.history["loss"], dtype=tf.float32)
    expected = hvd.broadcast(loss_metrics, root_rank=0)
    np.testing.assert_allclose(expected.numpy(), loss_metrics.numpy())


def _embedding_model(optimizer):
    import keras  # pylint: disable=import-outside-toplevel

    model = keras.models.Sequential([keras.Input((10,), dtype="int32"),
                                     keras.layers.Embedding(1000, 64)])
    model.compile(loss=keras.losses.mean_squared_error, optimizer=optimizer,
                  experimental_run_tf_function=False)
    return model


def test_sparse_as_dense():
    import keras  # pylint: disable=import-outside-toplevel

    opt = hvd.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.0001),
                                   sparse_as_dense=True)
    model = _embedding_model(opt)
    model.train_on_batch(np.random.randint(1000, size=(32, 10)), np.random.random((32, 10, 64)))


def test_sparse_as_dense_with_grad_aggregation():
    import keras  # pylint: disable=import-outside-toplevel

    backward_passes_per_step = 2
    opt = hvd.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.0001),
                                   sparse_as_dense=True,
                                   backward_passes_per_step=backward_passes_per_step)
    model = _embedding_model(opt)
    x = np.random.randint(1000, size=(32, 10))
    y = np.random.random((32, 10, 64))
    before = model.get_weights()[0]
    changed = []
    for _ in range(3):
        model.train_on_batch(x, y)
        after = model.get_weights()[0]
        changed.append(not np.array_equal(before, after))
        before = after
    # Horovod: its aggregation counter == 3 % 2; Keras 3: the update on the second step only.
    assert changed == [False, True, False], changed
    # Keras 3's `iterations` counts updates under accumulation (Horovod's counted batches).
    assert int(opt.iterations.numpy()) == 3 // backward_passes_per_step


def _gradient_aggregation(average_aggregated_gradients):
    import keras  # pylint: disable=import-outside-toplevel

    class TestingOptimizer(keras.optimizers.Optimizer):
        """Custom optimizer we use for testing gradient aggregation."""

        def __init__(self, name, **kwargs):
            super().__init__(learning_rate=0.1, name=name, **kwargs)

        def update_step(self, gradient, variable, learning_rate):
            variable.assign_add(gradient)

    backward_passes_per_step = 4
    hvd_optimizer = hvd.DistributedOptimizer(
        optimizer=TestingOptimizer("test"), backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, sparse_as_dense=True)
    x_0, y_0, y_1 = 0.0, 1.0, 2.0
    x = tf.Variable([x_0])
    y = tf.Variable([y_0, y_1])
    variables = [x, y]

    rank_factor = float(hvd.rank() + 1)  # rank-dependent gradients, averaged over the ranks

    def loss():
        return rank_factor * (x - tf.gather(y, [0]))  # an IndexedSlices gradient for y

    def expected_values(batch_id):
        steps = (batch_id + 1) // backward_passes_per_step
        mean_factor = (hvd.size() + 1) / 2.0
        gradient_of_x, gradient_of_y_0 = steps * mean_factor, steps * -mean_factor
        if not average_aggregated_gradients:
            gradient_of_x *= backward_passes_per_step
            gradient_of_y_0 *= backward_passes_per_step
        return np.array(x_0 + gradient_of_x), np.array([y_0 + gradient_of_y_0, y_1])

    @tf.function
    def compute_and_apply_gradients_in_tf_function():
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, variables)
        hvd_optimizer.apply_gradients(zip(grads, variables))

    for idx in range(10):
        compute_and_apply_gradients_in_tf_function()
        expected_x, expected_y = expected_values(idx)
        assert np.isclose(x.numpy(), expected_x), (idx, x.numpy(), expected_x)
        assert np.isclose(y.numpy(), expected_y).all(), (idx, y.numpy(), expected_y)
        # Keras 3's `iterations` counts updates (Horovod asserted idx + 1: batches).
        assert (idx + 1) // backward_passes_per_step == int(hvd_optimizer.iterations.numpy())


def test_gradient_aggregation_averaged():
    _gradient_aggregation(True)


def test_gradient_aggregation_summed():
    _gradient_aggregation(False)


def test_from_config():
    import keras  # pylint: disable=import-outside-toplevel

    hopt = hvd.DistributedOptimizer(keras.optimizers.Adam())
    cfg = hopt.get_config()
    assert cfg == hopt.from_config(cfg).get_config()
    assert cfg == hopt.__class__.from_config(cfg).get_config()


def test_broadcast_global_variables_callback_with_local_vars():
    if hvd.size() == 1:
        return
    root_rank = hvd.size() - 1
    x, y = np.random.random((1, 3)), np.random.random((1, 3, 3))
    model = tf.keras.models.Sequential([tf.keras.Input((3,))] + [
        tf.keras.layers.Dense(3, trainable=False) for _ in range(4)] + [
        tf.keras.layers.RepeatVector(3), tf.keras.layers.Dense(3, trainable=False)])
    model.compile(loss=tf.keras.losses.MSE, metrics=[tf.keras.metrics.categorical_accuracy])
    for variable in model.variables:  # each rank's own value (Horovod: per-rank initializers)
        variable.assign(tf.fill(variable.shape, float(hvd.rank())))
    local_variables = list(model.layers[0].variables)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(
        root_rank=root_rank, local_variables=local_variables)]
    model.fit(x, y, callbacks=callbacks, verbose=0)
    local = {id(v) for v in local_variables}
    for variable in model.variables:
        value = float(hvd.rank()) if id(variable) in local else float(root_rank)
        np.testing.assert_allclose(variable.numpy(), np.full(variable.shape, value))


TESTS = (test_train_model_lr_schedule, test_sparse_as_dense,
         test_sparse_as_dense_with_grad_aggregation, test_gradient_aggregation_averaged,
         test_gradient_aggregation_summed, test_from_config,
         test_broadcast_global_variables_callback_with_local_vars)


def run_all(tests=TESTS):
    """Run every ported test; the names that passed (an assertion error stops the job)."""
    passed = []
    for test in tests:
        test()
        passed.append(test.__name__)
    return passed
