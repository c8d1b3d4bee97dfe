"""`LearningRateWarmup`: gradual warmup of the learning rate (Goyal et al. 2017)."""

from typing import Optional

from tfdist.callbacks.learning_rate_control import LearningRateTerm, check_positive
from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class LearningRateWarmup(LearningRateTerm):
    """Ramp the learning rate linearly, batch by batch, over the first epochs.

    A large batch with a linearly scaled rate diverges early in training,
    when the weights change fast; starting from a small rate and raising it
    by a constant amount every step until it reaches the target after a few
    epochs avoids that (Goyal et al. 2017, "gradual warmup": ResNet-50 at
    batch 8192 with 5 epochs of warmup matches batch 256). For the step t
    about to run, with T = `warmup_epochs` x steps per epoch:

        rate(t) = initial_lr + (target_lr - initial_lr) * t / T   for t < T,
        rate(t) = target_lr                                       after.

    The target defaults to the rate at train begin after
    `LearningRateScaling`. The initial rate defaults to `LearningRateScaling`'s
    `base_lr` when that callback is present (Goyal et al.: from the rate of
    the base batch to the scaled rate), else to target / 3 (PyTorch's
    `LinearLR` default). It never depends on the number of processes: the
    same global batch follows the same rates on 1 or N processes.
    `LearningRateSchedule` multipliers apply on top; see
    `tfdist.callbacks.learning_rate_control` for the composition.

    Args:
        warmup_epochs: length of the ramp in epochs (fractions allowed).
        initial_lr: rate of the first step; default `LearningRateScaling`'s
            `base_lr` if present, else target_lr / 3.
        target_lr: rate at the end of the ramp; default the rate at train
            begin, after scaling.
        momentum_correction: when the tfdist callbacks change the rate from
            lr to lr', scale the momentum buffer by lr' / lr (Goyal et al.
            section 2.2). For optimizers whose velocity includes the rate:
            `keras.optimizers.SGD` and `tfdist.optimizers.LARS`.
        steps_per_epoch: steps in one epoch; default the `steps` of `fit`.

    Example:

    ```python
    model.fit(x, y, batch_size=2048, epochs=30, callbacks=[
        tfdist.callbacks.LearningRateScaling(base_lr=0.1, base_batch_size=256),
        tfdist.callbacks.LearningRateWarmup(warmup_epochs=5, initial_lr=0.1),
    ])
    ```
    """

    kind = "warmup"

    def __init__(self, warmup_epochs: float = 5, initial_lr: Optional[float] = None,
                 target_lr: Optional[float] = None, momentum_correction: bool = False,
                 steps_per_epoch: Optional[int] = None):
        super().__init__()
        check_positive("warmup_epochs", warmup_epochs)
        check_positive("initial_lr", initial_lr, allow_none=True)
        check_positive("target_lr", target_lr, allow_none=True)
        check_positive("steps_per_epoch", steps_per_epoch, allow_none=True, integer=True)
        if not isinstance(momentum_correction, bool):
            raise ValueError(f"`momentum_correction` must be True or False. "
                             f"Got: momentum_correction={momentum_correction!r}")
        self.warmup_epochs = float(warmup_epochs)
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        self.target_lr = None if target_lr is None else float(target_lr)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
