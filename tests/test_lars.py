"""LARS: the update matches a NumPy reference of You et al.'s algorithm; serialization."""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.optimizers import LARS


def reference_lars(weights, gradients, rate, momentum, decay, eta, epsilon, adapted, nesterov):
    """One LARS step per variable, in NumPy (float64); returns new weights and velocities."""
    new_weights, velocities = [], []
    for (w, v), g, adapt in zip(weights, gradients, adapted):
        local = rate
        if adapt:
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            trust = eta * w_norm / (g_norm + decay * w_norm + epsilon) if w_norm > 0 and g_norm > 0 \
                else 1.0
            g = g + decay * w
            local = rate * trust
        v = momentum * v + local * g
        step = momentum * v + local * g if nesterov else v
        new_weights.append(w - step)
        velocities.append(v)
    return new_weights, velocities


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_numpy_reference_for_a_few_steps(nesterov):
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,), (3, 2), (2,), (4, 4)]  # kernels (adapted), biases (excluded)
    initial = [rng.normal(size=s).astype("float32") for s in shapes]
    initial[4] = np.zeros((4, 4), "float32")  # ||w|| = 0: trust ratio 1
    variables = [keras.Variable(w, name=f"v{i}") for i, w in enumerate(initial)]
    optimizer = LARS(learning_rate=0.5, momentum=0.9, weight_decay=0.01, trust_coefficient=0.02,
                     epsilon=1e-6, nesterov=nesterov)
    state = [(w.astype("float64"), np.zeros(w.shape)) for w in initial]
    adapted = [len(s) > 1 for s in shapes]
    for step in range(4):
        gradients = [rng.normal(size=s).astype("float32") for s in shapes]
        optimizer.apply_gradients(zip([keras.ops.convert_to_tensor(g) for g in gradients],
                                      variables))
        new, velocities = reference_lars(state, gradients, 0.5, 0.9, 0.01, 0.02, 1e-6, adapted,
                                         nesterov)
        state = list(zip(new, velocities))
        for variable, want in zip(variables, new):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), want,
                                       rtol=2e-5, atol=1e-6, err_msg=f"step {step}")
    assert [optimizer.adapts(v) for v in variables] == adapted


def test_exclusion_by_name_and_trust_ratio_effect():
    kernel = keras.Variable(np.full((2, 2), 3.0, "float32"), name="kernel")
    bias = keras.Variable(np.ones((2,), "float32"), name="bias")
    optimizer = LARS(learning_rate=1.0, momentum=0.0, trust_coefficient=0.1,
                     exclude_from_adaptation=["kernel"])
    gradient = np.full((2, 2), 10.0, "float32")
    optimizer.apply_gradients([(keras.ops.convert_to_tensor(gradient), kernel),
                               (keras.ops.convert_to_tensor(np.ones(2, "float32")), bias)])
    # The kernel is excluded: plain SGD. The bias is adapted: ||w|| = ||g|| = sqrt(2), trust 0.1.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(kernel), 3.0 - 10.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(bias), 1.0 - 0.1, rtol=1e-6)


def test_lars_serializes_and_a_saved_model_loads(tmp_path):
    optimizer = LARS(learning_rate=0.3, momentum=0.8, weight_decay=1e-4, trust_coefficient=0.01,
                     epsilon=1e-9, nesterov=True, exclude_from_adaptation=["bias"])
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, LARS)
    assert restored.get_config() == optimizer.get_config()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    x = np.ones((8, 3), "float32")
    model.fit(x, x[:, :2], epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, tfdist.optimizers.LARS)
    assert loaded.optimizer.get_config() == optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
