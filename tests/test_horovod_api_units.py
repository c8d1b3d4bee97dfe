"""`tfdist.horovod.keras` in-process: Horovod's learning-rate formulas, the refusals, the optimizer
left saveable as Keras' own, compile's Keras 2 argument only for Horovod-API models."""

import keras
import numpy as np
import pytest

import tfdist.horovod.keras as hvd
from tfdist.horovod import collectives, process
from tfdist.strategies import keras_patches
from tfdist.strategies.keras_patches import gradient_options


def _model(optimizer):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _horovod_warmup_rate(initial_lr, size, warmup, epoch, batch, steps):
    """Horovod 0.28.1's formula (horovod/_keras/callbacks.py), written out."""
    epoch = epoch + batch / steps + 1.0 / steps
    return initial_lr / size * (epoch * (size - 1) / warmup + 1)


def test_warmup_follows_horovods_formula_and_corrects_sgd_momentum(monkeypatch):
    monkeypatch.setattr(process, "size", lambda: 4)
    monkeypatch.setattr(process, "rank", lambda: 0)
    model = _model(keras.optimizers.SGD(0.4, momentum=0.9))
    velocity = model.optimizer.momentums[0]
    velocity.assign(np.ones(velocity.shape, "float32"))
    callback = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    callback.set_model(model)
    callback.set_params({"steps": 5, "epochs": 3})
    callback.on_train_begin()
    previous, scale = 0.4, 1.0
    for epoch in range(3):
        callback.on_epoch_begin(epoch)
        for batch in range(5):
            callback.on_train_batch_begin(batch)
            rate = float(model.optimizer.learning_rate.numpy())
            expected = (_horovod_warmup_rate(0.4, 4, 2, epoch, batch, 5) if epoch < 2
                        else _horovod_warmup_rate(0.4, 4, 2, 1, 4, 5))
            assert rate == pytest.approx(expected, rel=1e-6)
            scale *= rate / previous  # Horovod: momentum x lr'/lr for the batch
            previous = rate
        logs = {}
        callback.on_epoch_end(epoch, logs)
        assert logs["lr"] == pytest.approx(rate)
    assert rate == pytest.approx(0.4)  # the warmup ends at initial_lr
    np.testing.assert_allclose(velocity.numpy(), scale, rtol=1e-5)


def test_schedule_with_a_constant_multiplier_decays_per_epoch_and_leaves_adam_alone():
    model = _model(keras.optimizers.Adam(0.1))
    callback = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.1, multiplier=0.5, start_epoch=1, end_epoch=3)
    callback.set_model(model)
    callback.set_params({"steps": 2})
    callback.on_train_begin()
    rates = []
    for epoch in range(4):
        callback.on_epoch_begin(epoch)
        callback.on_train_batch_begin(0)
        rates.append(float(model.optimizer.learning_rate.numpy()))
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05])


def test_what_tfdist_cannot_do_is_refused_by_name():
    optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="Adasum is not offered"):
        hvd.DistributedOptimizer(optimizer, op=hvd.Adasum)
    with pytest.raises(ValueError, match="process sets are not offered"):
        hvd.DistributedOptimizer(optimizer, process_set=hvd.ProcessSet([0, 1]))
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op"):
        hvd.DistributedOptimizer(optimizer, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="wraps a Keras 3 optimizer"):
        hvd.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match="positive integer"):
        hvd.DistributedOptimizer(optimizer, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="process sets are not offered"):
        hvd.init(process_sets=[hvd.ProcessSet([0])])
    with pytest.raises(ValueError, match="Keras 3 has no legacy optimizers"):
        hvd.load_model("unused.keras", legacy_opts=True)
    with pytest.raises(ValueError, match="op must be one of"):
        collectives.check_op("Average", (hvd.Average, hvd.Sum))
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(AttributeError, match="per-rank .local. gradients are not offered"):
        hvd.PartialDistributedOptimizer  # pylint: disable=pointless-statement


def test_before_init_the_queries_raise_horovods_error():
    assert not hvd.is_initialized()
    for query in (hvd.size, hvd.rank, hvd.local_rank, hvd.local_size, hvd.cross_rank):
        with pytest.raises(ValueError, match="Horovod has not been initialized"):
            query()


def test_the_optimizer_keeps_its_keras_class_name_and_config():
    plain, distributed = keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01)
    gradient_options.apply_to(distributed, factor=2.0, sparse_as_dense=True)
    assert type(distributed) is type(plain) and gradient_options.options_of(distributed)
    config, plain_config = (keras.optimizers.serialize(o) for o in (distributed, plain))
    config["config"].pop("name"), plain_config["config"].pop("name")  # adam_1, adam_2
    assert config == plain_config


def test_the_gradient_factor_and_dense_slices_reach_apply():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    variable = keras.Variable(np.zeros((4, 2), "float32"))
    optimizer = gradient_options.apply_to(keras.optimizers.SGD(1.0), factor=3.0,
                                          sparse_as_dense=True)
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([2]), tf.constant([4, 2]))
    optimizer.apply([sparse], [variable])
    expected = np.zeros((4, 2), "float32")
    expected[2] = -3.0
    np.testing.assert_allclose(variable.numpy(), expected)


def test_compile_refuses_keras_2_arguments_for_other_models():
    keras_patches.install()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(TypeError, match="experimental_run_tf_function"):
        model.compile(optimizer="sgd", loss="mse", experimental_run_tf_function=False)


def test_fp16_compression_travels_as_float16_and_comes_back():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    value = tf.constant([1.0, 2.5], tf.float32)
    compressed, context = hvd.Compression.fp16.compress(value)
    assert compressed.dtype == tf.float16
    restored = hvd.Compression.fp16.decompress(compressed, context)
    assert restored.dtype == tf.float32
    np.testing.assert_allclose(restored.numpy(), [1.0, 2.5])
    from tfdist.horovod.compression import tfdist_compression  # pylint: disable=C0415

    with pytest.raises(ValueError, match="Compression.none or"):
        tfdist_compression("bf16")


def test_the_elastic_state_callbacks_count_as_horovods_and_the_state_file_round_trips(tmp_path):
    from tfdist.horovod import elastic_state  # pylint: disable=import-outside-toplevel

    class Counted:  # a state whose commits are counted (no process group needed)
        epoch, batch, commits = 2, 0, 0

        def commit(self):
            self.commits += 1

    state = Counted()
    epochs = hvd.elastic.UpdateEpochStateCallback(state)
    batches = hvd.elastic.UpdateBatchStateCallback(state)
    commits = hvd.elastic.CommitStateCallback(state, batches_per_commit=3)
    for callback in (epochs, batches, commits):
        callback.on_train_begin()
    for batch in range(7):
        batches.on_train_batch_end(batch)
        commits.on_train_batch_end(batch)
    assert (state.batch, state.commits) == (6, 2)  # after batches 3 and 6
    for callback in (epochs, batches, commits):
        callback.on_epoch_end(0)
    assert (state.epoch, state.batch, state.commits) == (3, 0, 3)  # fit's epoch 0 = the 3rd
    epochs.on_epoch_end(1)
    assert state.epoch == 4
    values = [np.arange(6, dtype="float32").reshape(2, 3), np.array(7, dtype="int64")]
    path = str(tmp_path / "state.npz")
    elastic_state._write_state(path, values, {"epoch": 3, "batch": 5})  # pylint: disable=protected-access
    read_values, attributes = elastic_state._read_state(path)  # pylint: disable=protected-access
    assert attributes == {"epoch": 3, "batch": 5}
    assert [v.tolist() for v in read_values] == [v.tolist() for v in values]
