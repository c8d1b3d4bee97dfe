"""`LARS`: layer-wise adaptive rate scaling with momentum (You, Gitman and Ginsburg, 2017)."""

import re

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tfdist")
class LARS(keras.optimizers.Optimizer):
    """SGD with momentum whose step is scaled per layer by a trust ratio ||w|| / ||g||.

    With a very large batch, a single global rate is too large for some
    layers (those whose gradient is large relative to their weights) and too
    small for others. LARS gives every layer (every variable) its own rate:
    for weights w with gradient g,

        d     = g + weight_decay * w
        trust = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + epsilon)
                (1 when ||w|| or ||g|| is 0)
        v     = momentum * v + learning_rate * trust * d
        w     = w - v                       (Nesterov: w - (momentum * v + learning_rate * trust * d))

    (You et al. 2017, Algorithm 1: AlexNet and ResNet-50 at batch 32k.)
    Variables excluded from adaptation - by default those of rank <= 1,
    i.e. biases and normalisation scales and offsets - get trust 1 and no
    weight decay: plain SGD with momentum. The velocity includes the rate,
    so `LearningRateWarmup(momentum_correction=True)` applies. Cost: two
    norms per variable per step on top of SGD with momentum.

    Args:
        learning_rate: the global rate (a float; with the tfdist callbacks,
            scaled and warmed up like any other).
        momentum: float in [0, 1).
        weight_decay: L2 coefficient added to the gradient of adapted
            variables before the trust ratio (not Keras' decoupled decay).
        trust_coefficient: eta in the trust ratio, typically 0.001.
        epsilon: added to the trust ratio's denominator.
        nesterov: use Nesterov momentum.
        exclude_from_adaptation: None (exclude variables of rank <= 1), or a
            list of regular expressions searched in variable paths (e.g.
            `["bias", "batch_normalization"]`); `[]` adapts every variable.
        name: the optimizer's name.
        **kwargs: Keras' common optimizer arguments (`clipnorm`, `use_ema`, ...).

    Example:

    ```python
    model.compile(optimizer=tfdist.optimizers.LARS(learning_rate=2.0, momentum=0.9,
                                                   weight_decay=5e-4),
                  loss="sparse_categorical_crossentropy")
    ```
    """

    velocity_includes_learning_rate = True

    def __init__(self, learning_rate=0.1, momentum=0.9, weight_decay=0.0,
                 trust_coefficient=0.001, epsilon=0.0, nesterov=False,
                 exclude_from_adaptation=None, name="lars", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, weight_decay=None, **kwargs)
        for arg, value, upper in (("momentum", momentum, 1.0), ("weight_decay", weight_decay, None),
                                  ("trust_coefficient", trust_coefficient, None),
                                  ("epsilon", epsilon, None)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                    upper is not None and value >= upper):
                bound = f" and below {upper}" if upper is not None else ""
                raise ValueError(f"`{arg}` must be a number >= 0{bound}. Got: {arg}={value!r}")
        if trust_coefficient == 0:
            raise ValueError("`trust_coefficient` must be positive. Got: trust_coefficient=0")
        if exclude_from_adaptation is not None and (
                isinstance(exclude_from_adaptation, str)
                or not all(isinstance(p, str) for p in exclude_from_adaptation)):
            raise ValueError("`exclude_from_adaptation` must be None or a list of regular "
                             f"expressions. Got: exclude_from_adaptation={exclude_from_adaptation!r}")
        self.momentum = float(momentum)
        self.layerwise_weight_decay = float(weight_decay)
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self.exclude_from_adaptation = (None if exclude_from_adaptation is None
                                        else list(exclude_from_adaptation))
        self._adapted = {}

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums = (self.add_optimizer_variables(variables, "momentum")
                          if self.momentum > 0 else [])

    def adapts(self, variable):
        """True if `variable` gets a trust ratio and weight decay."""
        key = self._var_key(variable)
        if key not in self._adapted:
            if self.exclude_from_adaptation is None:
                adapted = len(variable.shape) > 1
            else:
                path = getattr(variable, "path", variable.name)
                adapted = not any(re.search(p, path) for p in self.exclude_from_adaptation)
            self._adapted[key] = adapted
        return self._adapted[key]

    def update_step(self, gradient, variable, learning_rate):
        rate = ops.cast(learning_rate, variable.dtype)
        direction = ops.cast(gradient, variable.dtype)
        if self.adapts(variable):
            decay = ops.cast(self.layerwise_weight_decay, variable.dtype)
            weight_norm = ops.sqrt(ops.sum(ops.square(variable)))
            gradient_norm = ops.sqrt(ops.sum(ops.square(direction)))
            trust = ops.where(
                ops.logical_and(weight_norm > 0, gradient_norm > 0),
                self.trust_coefficient * weight_norm
                / (gradient_norm + decay * weight_norm + self.epsilon),
                ops.ones_like(weight_norm))
            direction = direction + decay * variable
            rate = rate * trust
        step = ops.multiply(direction, rate)
        if self.momentum > 0:
            velocity = self.momentums[self._get_variable_index(variable)]
            momentum = ops.cast(self.momentum, variable.dtype)
            self.assign(velocity, ops.add(ops.multiply(velocity, momentum), step))
            if self.nesterov:
                step = ops.add(ops.multiply(velocity, momentum), step)
            else:
                step = velocity
        self.assign_sub(variable, step)

    def get_config(self):
        config = super().get_config()
        config.update({
            "momentum": self.momentum,
            "weight_decay": self.layerwise_weight_decay,
            "trust_coefficient": self.trust_coefficient,
            "epsilon": self.epsilon,
            "nesterov": self.nesterov,
            "exclude_from_adaptation": self.exclude_from_adaptation,
        })
        return config
