"""`LearningRateSchedule`: multiply the learning rate inside a window of epochs."""

import math
import numbers
from typing import Callable, Optional, Union

from tfdist.callbacks.learning_rate_control import LearningRateTerm, check_positive
from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class LearningRateSchedule(LearningRateTerm):
    """Multiply the (post-warmup) learning rate by `multiplier` from `start_epoch` to `end_epoch`.

    Inside the window [start_epoch, end_epoch) the rate is multiplied by
    `multiplier` (a number) or `multiplier(epoch)` (a function of the
    epoch, counted from the start of training); outside, by 1. Several
    instances compose by multiplication, so steps, exponential and cosine
    decays are all expressible. With `staircase=True` the epoch is read at
    epoch boundaries (floor), otherwise fractionally at every batch. The
    rate it multiplies is the scaled and warmed-up one; see
    `tfdist.callbacks.learning_rate_control` for the composition.

    Args:
        multiplier: a non-negative number, or a function of the epoch
            returning one.
        start_epoch: first epoch of the window (fractions allowed).
        end_epoch: end of the window (excluded); None: until the end.
        staircase: evaluate at whole epochs (True) or every batch (False).
        steps_per_epoch: steps in one epoch; default the `steps` of `fit`.

    Example:

    ```python
    callbacks = [
        tfdist.callbacks.LearningRateWarmup(warmup_epochs=5),
        # x0.1 at epochs 30, 60 and 80 (Goyal et al.'s ResNet-50 schedule)
        tfdist.callbacks.LearningRateSchedule(0.1, start_epoch=30),
        tfdist.callbacks.LearningRateSchedule(0.1, start_epoch=60),
        tfdist.callbacks.LearningRateSchedule(0.1, start_epoch=80),
    ]
    # or cosine decay to zero between epochs 5 and 90, batch by batch:
    cosine = tfdist.callbacks.LearningRateSchedule(
        lambda epoch: 0.5 * (1 + math.cos(math.pi * (epoch - 5) / 85)),
        start_epoch=5, end_epoch=90, staircase=False)
    ```
    """

    kind = "schedule"

    def __init__(self, multiplier: Union[float, Callable[[float], float]], start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True,
                 steps_per_epoch: Optional[int] = None):
        super().__init__()
        if not callable(multiplier) and not (
                isinstance(multiplier, numbers.Real) and not isinstance(multiplier, bool)
                and math.isfinite(multiplier) and multiplier >= 0):
            raise ValueError("`multiplier` must be a non-negative number or a function of the "
                             f"epoch. Got: multiplier={multiplier!r}")
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, numbers.Real) or \
                not 0 <= start_epoch < math.inf:
            raise ValueError(f"`start_epoch` must be a number >= 0. Got: start_epoch={start_epoch!r}")
        if end_epoch is not None and (isinstance(end_epoch, bool) or not isinstance(
                end_epoch, numbers.Real) or not end_epoch > start_epoch):
            raise ValueError("`end_epoch` must be None or a number greater than start_epoch "
                             f"({start_epoch}). Got: end_epoch={end_epoch!r}")
        check_positive("steps_per_epoch", steps_per_epoch, allow_none=True, integer=True)
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = bool(staircase)
        self.steps_per_epoch = steps_per_epoch

    def multiplier_at(self, epoch):
        """The factor for the (fractional) epoch `epoch`."""
        if self.staircase:
            epoch = math.floor(epoch)
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return 1.0
        factor = self.multiplier(epoch) if callable(self.multiplier) else self.multiplier
        factor = float(factor)
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"the multiplier of LearningRateSchedule returned {factor!r} at "
                             f"epoch {epoch}; it must be a non-negative number.")
        return factor
