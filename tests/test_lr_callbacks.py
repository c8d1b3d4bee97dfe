"""Learning-rate callbacks: the exact rate of every batch, alone and composed (in any
order), at world sizes 1 and 2, through BackupAndRestore, with every Keras optimizer;
momentum correction; clear errors."""

import json
import math
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from helpers import failure_report, script, tfdist_run
from tfdist.callbacks import LearningRateScaling, LearningRateSchedule, LearningRateWarmup

ROWS, BATCH = 200, 20  # 10 steps per epoch


def reference_rate(step, steps_per_epoch, base, warmup=None, schedules=()):
    """The documented formula, written out independently of tfdist.

    warmup: (epochs, initial, target or None); schedules: (multiplier, start, end, staircase).
    """
    rate = base
    if warmup is not None:
        epochs, initial, target = warmup
        target = base if target is None else target
        ramp = epochs * steps_per_epoch
        rate = initial + (target - initial) * step / ramp if step < ramp else target
    epoch = step / steps_per_epoch
    for multiplier, start, end, staircase in schedules:
        e = math.floor(epoch) if staircase else epoch
        if e >= start and (end is None or e < end):
            rate *= multiplier(e) if callable(multiplier) else multiplier
    return np.float32(rate)


class RecordRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_end(self, batch, logs=None):
        self.rates.append(np.float32(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def data(rows=ROWS):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def make_model(optimizer=None):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer or keras.optimizers.SGD(0.2, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit_rates(callbacks, model=None, epochs=3, x=None, **fit_kwargs):
    recorder = RecordRates()
    model = model or make_model()
    if x is None:
        x, y = data()
        fit_kwargs = {"y": y, "batch_size": BATCH, **fit_kwargs}
    history = model.fit(x, epochs=epochs, verbose=0, shuffle=False,
                        callbacks=[recorder] + list(callbacks), **fit_kwargs)
    return np.array(recorder.rates), history


def expected(steps, **formula):
    return np.array([reference_rate(t, ROWS // BATCH, **formula) for t in range(steps)])


@pytest.mark.parametrize("rule,factor", [("linear", 4.0), ("sqrt", 2.0)])
def test_scaling_uses_the_global_batch_of_the_data(rule, factor):
    rates, _ = fit_rates([LearningRateScaling(0.05, base_batch_size=5, rule=rule)])
    np.testing.assert_array_equal(rates, np.float32(0.05 * factor))  # batch 20 = 4 x 5


def test_scaling_reads_a_tf_data_batch_and_an_explicit_batch_wins():
    x, y = data()
    batched = tf.data.Dataset.from_tensor_slices((x, y)).batch(40)  # last batch partial
    rates, _ = fit_rates([LearningRateScaling(0.01, base_batch_size=10)], x=batched, epochs=1)
    np.testing.assert_array_equal(rates, np.float32(0.04))
    rates, _ = fit_rates([LearningRateScaling(0.01, 10, global_batch_size=80)], epochs=1)
    np.testing.assert_array_equal(rates, np.float32(0.08))


def test_warmup_ramps_batch_by_batch_over_fractional_epochs():
    rates, _ = fit_rates([LearningRateWarmup(warmup_epochs=1.5, initial_lr=0.02)])
    np.testing.assert_allclose(rates, expected(30, base=0.2, warmup=(1.5, 0.02, None)), rtol=1e-6)
    assert rates[0] == np.float32(0.02) and rates[15] == np.float32(0.2)


def test_warmup_starts_from_a_third_of_the_target_by_default():
    rates, _ = fit_rates([LearningRateWarmup(warmup_epochs=1, target_lr=0.3)])
    np.testing.assert_allclose(rates, expected(30, base=0.3, warmup=(1, 0.1, None)), rtol=1e-6)


def test_warmup_starts_from_the_base_rate_under_scaling_by_default():
    # Goyal et al.: from the base batch's rate to the scaled rate.
    rates, _ = fit_rates([LearningRateScaling(0.05, 10), LearningRateWarmup(warmup_epochs=1)])
    scaled = rates[-1]
    np.testing.assert_allclose(rates, expected(30, base=scaled, warmup=(1, 0.05, None)), rtol=1e-6)
    assert scaled > 0.05


def test_schedules_multiply_in_their_windows():
    cosine = (lambda e: 0.5 * (1 + math.cos(math.pi * (e - 1) / 2)), 1, 3, False)
    steps = [(0.1, 2, None, True), (0.5, 2.5, None, True)]  # 2.5 with staircase: from epoch 3
    rates, _ = fit_rates([LearningRateSchedule(*cosine)], epochs=4)
    np.testing.assert_allclose(rates, expected(40, base=0.2, schedules=[cosine]), rtol=1e-6)
    rates, _ = fit_rates([LearningRateSchedule(*s) for s in steps], epochs=4)
    np.testing.assert_allclose(rates, expected(40, base=0.2, schedules=steps), rtol=1e-6)
    assert rates[19] == np.float32(0.2) and rates[20] == np.float32(0.02)
    assert rates[30] == np.float32(0.01)


def test_composition_is_the_same_in_every_listed_order():
    schedules = [(lambda e: 1.0 / (1 + e), 1, None, False), (0.25, 2, 3, True)]
    formula = dict(base=0.05 * 2, warmup=(1.2, 0.01, None), schedules=schedules)
    want = expected(30, **formula)
    terms = [LearningRateScaling(0.05, 10), LearningRateWarmup(1.2, initial_lr=0.01)] + [
        LearningRateSchedule(*s) for s in schedules]
    rotations = [[(i + k) % 4 for i in range(4)] for k in range(4)]
    for order in rotations + [r[::-1] for r in rotations]:  # each term first and last
        rates, history = fit_rates([terms[i] for i in order])
        np.testing.assert_allclose(rates, want, rtol=1e-6, err_msg=f"order {order}")
        np.testing.assert_allclose(history.history["learning_rate"], want[9::10], rtol=1e-6)


def test_steps_per_execution_sets_the_rate_once_per_call():
    model = make_model()
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy",
                  steps_per_execution=4)
    rates, _ = fit_rates([LearningRateWarmup(1, initial_lr=0.1)], model=model, epochs=1)
    # Calls start at steps 0, 4, 8 (the last call runs 2 steps).
    np.testing.assert_allclose(rates, [reference_rate(t, 10, 0.2, (1, 0.1, None))
                                       for t in (0, 4, 8)], rtol=1e-6)


def test_a_second_fit_does_not_compound_and_a_user_change_is_the_new_base():
    model = make_model()
    halve = [LearningRateSchedule(0.5)]
    first, _ = fit_rates(halve, model=model, epochs=1)
    second, _ = fit_rates([LearningRateSchedule(0.5)], model=model, epochs=1)
    np.testing.assert_array_equal(np.concatenate([first, second]), np.float32(0.1))
    model.optimizer.learning_rate = 0.6
    third, _ = fit_rates(halve, model=model, epochs=1)
    np.testing.assert_array_equal(third, np.float32(0.3))


def test_momentum_correction_rescales_the_sgd_velocity():
    """Loss = mean(w x) with x = 1: gradient 1, so the weight follows the velocity exactly."""
    def final_weight(correction):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            1, use_bias=False, kernel_initializer="zeros")])
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), lambda _, pred: keras.ops.mean(pred))
        x = np.ones((40, 1), "float32")
        model.fit(x, x, batch_size=4, epochs=2, verbose=0, callbacks=[
            LearningRateWarmup(1, initial_lr=0.01, momentum_correction=correction)])
        return float(model.get_weights()[0][0, 0])

    def reference(correction):
        w, v, previous = 0.0, 0.0, 0.1  # the rate before the first step is the optimizer's
        for t in range(20):
            rate = float(reference_rate(t, 10, 0.1, (1, 0.01, None)))
            if correction:
                v *= np.float32(rate) / np.float32(previous)
            v = 0.9 * v - rate * 1.0
            w, previous = w + v, rate
        return w

    for correction in (False, True):
        assert final_weight(correction) == pytest.approx(reference(correction), rel=1e-5)
    assert abs(reference(True) - reference(False)) > 0.1  # the test can tell them apart


def test_momentum_correction_needs_a_velocity_that_includes_the_rate():
    with pytest.raises(ValueError, match="SGD and tfdist.optimizers.LARS. Got: Adam"):
        fit_rates([LearningRateWarmup(1, momentum_correction=True)],
                  model=make_model(keras.optimizers.Adam(0.01)), epochs=1)


OPTIMIZERS = {
    "SGD": lambda: keras.optimizers.SGD(0.1), "Adam": lambda: keras.optimizers.Adam(0.1),
    "AdamW": lambda: keras.optimizers.AdamW(0.1), "RMSprop": lambda: keras.optimizers.RMSprop(0.1),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.1), "Adadelta": lambda: keras.optimizers.Adadelta(0.1),
    "Adamax": lambda: keras.optimizers.Adamax(0.1), "Nadam": lambda: keras.optimizers.Nadam(0.1),
    "Ftrl": lambda: keras.optimizers.Ftrl(0.1), "Lion": lambda: keras.optimizers.Lion(0.1),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.1), "Lamb": lambda: keras.optimizers.Lamb(0.1),
    "LARS": lambda: tfdist.optimizers.LARS(0.1),
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_keras_optimizer_with_a_float_rate_follows_the_trajectory(name):
    schedule = (0.5, 1, None, True)
    rates, history = fit_rates([LearningRateSchedule(*schedule[:2]),
                                LearningRateWarmup(0.5, initial_lr=0.01)],
                               model=make_model(OPTIMIZERS[name]()), epochs=2)
    np.testing.assert_allclose(rates, expected(20, base=0.1, warmup=(0.5, 0.01, None),
                                               schedules=[schedule]), rtol=1e-6)
    assert np.isfinite(history.history["loss"]).all()


def test_a_schedule_object_in_the_optimizer_is_a_clear_error():
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    with pytest.raises(ValueError, match="created with a learning-rate schedule "
                                         r"\(ExponentialDecay\).*float learning rate"):
        fit_rates([LearningRateWarmup(1)], model=make_model(keras.optimizers.SGD(decay)), epochs=1)


def test_unknown_epoch_length_and_duplicates_are_clear_errors():
    x, y = data()
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(BATCH)
    with pytest.raises(ValueError, match="Pass steps_per_epoch= to fit or to the callbacks"):
        fit_rates([LearningRateWarmup(1)], x=unknown, epochs=1)
    rates, _ = fit_rates([LearningRateWarmup(1, initial_lr=0.1, steps_per_epoch=10)],
                         x=unknown, epochs=1)
    np.testing.assert_allclose(rates, expected(10, base=0.2, warmup=(1, 0.1, None)), rtol=1e-6)
    with pytest.raises(ValueError, match="2 LearningRateWarmup callbacks; use one"):
        fit_rates([LearningRateWarmup(1), LearningRateWarmup(2)], epochs=1)


@pytest.mark.parametrize("make,message", [
    (lambda: LearningRateScaling(0, 32), "base_lr=0"),
    (lambda: LearningRateScaling(0.1, 32.5), "base_batch_size=32.5"),
    (lambda: LearningRateScaling(0.1, 32, rule="cubic"), "rule='cubic'"),
    (lambda: LearningRateWarmup(-1), "warmup_epochs=-1"),
    (lambda: LearningRateWarmup(1, initial_lr="0.1"), "initial_lr='0.1'"),
    (lambda: LearningRateSchedule(-0.1), "multiplier=-0.1"),
    (lambda: LearningRateSchedule(0.1, start_epoch=5, end_epoch=5), "end_epoch=5"),
    (lambda: tfdist.optimizers.LARS(momentum=1.0), "momentum=1.0"),
    (lambda: tfdist.optimizers.LARS(exclude_from_adaptation="bias"), "exclude_from_adaptation='bias'"),
])
def test_bad_arguments_show_the_value(make, message):
    with pytest.raises(ValueError, match=f"Got: {message}".replace("(", r"\(").replace(".", r"\.")):
        make()


@pytest.mark.launches
@pytest.mark.parametrize("world", [1, 2])
def test_trajectory_and_resume_in_real_training(tmp_path, world):
    """tests/scripts/lr_callbacks.py: 4 epochs of 5 global batches of 64, SGD momentum."""
    out = str(tmp_path / "lr")
    args = [script("lr_callbacks.py"), out]
    if world == 1:
        done = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=300)
    else:
        done = tfdist_run(world, args, timeout=300)
    assert done.returncode == 0, failure_report(done)
    results = [json.load(open(f"{out}.rank{r}.json")) for r in range(world)]
    schedules = [(lambda e: 1.0 - 0.1 * e, 1, None, False), (0.5, 3, None, True)]
    base = 0.05 * 64 / 32  # the global batch, not the per-process one
    # Warmup starts from LearningRateScaling's base_lr, whatever the number of processes.
    want = [reference_rate(t, 5, base, (1.4, 0.05, None), schedules) for t in range(20)]
    for result in results:
        assert result["world_size"] == world
        np.testing.assert_allclose(result["rates"], want, rtol=1e-6)
        np.testing.assert_allclose(result["logged"], want[4::5], rtol=1e-6)
        # Interrupted at epoch 2 and resumed by a fresh model: the same rates and weights.
        np.testing.assert_allclose(result["resumed_rates"], want, rtol=1e-6)
        for straight, resumed in zip(result["weights"], result["resumed_weights"]):
            np.testing.assert_allclose(straight, resumed, atol=1e-6)
    assert results[-1]["rates"] == results[0]["rates"]
