"""`LearningRateScaling`: scale the learning rate with the global batch size."""

import math
from typing import Optional

from tfdist.callbacks.learning_rate_control import LearningRateTerm, check_positive
from tfdist.strategies.keras_surface import model_strategy

RULES = {"linear": lambda k: k, "sqrt": math.sqrt}


@model_strategy.agrees_across_ranks
class LearningRateScaling(LearningRateTerm):
    """Set the learning rate to `base_lr * f(global_batch / base_batch_size)` at train begin.

    The linear rule (f(k) = k; Goyal et al. 2017) keeps the expected update
    per example constant when the batch grows k-fold: with the same number
    of epochs, k times fewer steps each take a k times larger step. The
    square-root rule (f(k) = sqrt(k); Krizhevsky 2014, Hoffer et al. 2017)
    keeps the variance of the update constant instead, and is safer for
    adaptive optimizers such as Adam.

    The global batch size is the batch size of the data `fit` receives (with
    a tfdist strategy, `batch_size` is already global; for a batched
    `tf.data.Dataset`, its batch dimension), or `global_batch_size` when
    given. The scaled rate is the base of `LearningRateWarmup` and
    `LearningRateSchedule`, whatever order the callbacks are listed in; see
    `tfdist.callbacks.learning_rate_control` for the composition.

    Args:
        base_lr: learning rate tuned for `base_batch_size` (a positive float).
        base_batch_size: the batch size `base_lr` was tuned for.
        rule: `"linear"` or `"sqrt"`.
        global_batch_size: overrides the batch size inferred from the data.
        verbose: 1 prints the scaled rate at train begin (on the chief only).

    Example:

    ```python
    strategy = tfdist.strategies.RingAllReduceStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss=...)
    # 64 examples per process: the global batch grows with the processes.
    model.fit(x, y, batch_size=64 * strategy.world_size, epochs=90, callbacks=[
        tfdist.callbacks.LearningRateScaling(base_lr=0.1, base_batch_size=256),
        tfdist.callbacks.LearningRateWarmup(warmup_epochs=5),
    ])
    ```
    """

    kind = "scaling"

    def __init__(self, base_lr: float, base_batch_size: int, rule: str = "linear",
                 global_batch_size: Optional[int] = None, verbose: int = 0):
        super().__init__()
        check_positive("base_lr", base_lr)
        check_positive("base_batch_size", base_batch_size, integer=True)
        check_positive("global_batch_size", global_batch_size, allow_none=True, integer=True)
        if rule not in RULES:
            raise ValueError(f"`rule` must be one of {sorted(RULES)}. Got: rule={rule!r}")
        self.base_lr = float(base_lr)
        self.base_batch_size = int(base_batch_size)
        self.rule = rule
        self.global_batch_size = global_batch_size
        self.verbose = verbose
        self.resolved_batch_size = self.scaled_lr = None

    def scaled_rate(self, inferred_batch_size):
        """base_lr * f(B / base_batch_size), B explicit or inferred from the data."""
        batch = self.global_batch_size or inferred_batch_size
        if not batch:
            raise ValueError(
                "LearningRateScaling could not infer the global batch size from the data given "
                "to fit (it has no static batch size). Pass global_batch_size=.")
        self.resolved_batch_size = int(batch)
        self.scaled_lr = self.base_lr * RULES[self.rule](batch / self.base_batch_size)
        return self.scaled_lr

    def describe(self):
        batch = self.resolved_batch_size
        return (f"LearningRateScaling: global batch {batch} = {batch / self.base_batch_size:g} x "
                f"{self.base_batch_size}; {self.rule} rule: learning rate {self.base_lr:g} -> "
                f"{self.scaled_lr:g}")
