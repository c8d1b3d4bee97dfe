"""Horovod's Keras callbacks, with Horovod's arguments and Horovod's formulas, on Keras 3.

* `BroadcastGlobalVariablesCallback(root_rank)`: the model's weights and the
  optimizer's variables (what every rank must hold alike,
  `replica_consistency.compared_variables`) take `root_rank`'s values when
  training begins
  (Horovod: after the first batch). tfdist already starts every variable
  from rank 0's value; this matters after a rank loaded weights alone, or
  for another root. `local_variables` are left alone (and become rank-own
  state: not compared across ranks, saved per rank beside checkpoints), as
  is tfdist's per-rank aggregation state (error-feedback residuals).
* `MetricAverageCallback()`: each epoch's logs averaged over the ranks.
  tfdist's logged metrics are global already (identical on every rank,
  equal to one process), and stay exactly as they are; values a rank added
  itself (a timer, a custom log) are averaged as Horovod averages them.
* `LearningRateScheduleCallback(initial_lr, multiplier, start_epoch,
  end_epoch, staircase, momentum_correction, steps_per_epoch)` and
  `LearningRateWarmupCallback(initial_lr, warmup_epochs, ...)`: Horovod's
  rate, `initial_lr * multiplier(epoch)` (the warmup's multiplier goes from
  1 / size() to 1 over `warmup_epochs`: Goyal et al. 2017), set before each
  batch (or epoch, with `staircase`). Horovod's momentum correction (the
  momentum times lr' / lr for one batch) is applied where Keras 3 keeps
  the momentum: SGD's velocity, scaled by lr' / lr (the same update; a
  compiled step never rereads `optimizer.momentum`). Optimizers without a
  momentum are left alone, as in Horovod.
* `BestModelCheckpoint(monitor, ...)`: `keras.callbacks.ModelCheckpoint`
  with `save_best_only=True`; Horovod's has no path (its Spark estimator
  sets one), here `filepath` defaults to `best_model.keras` (or
  `best_model.weights.h5`).

Every callback here does the same on every rank (`agrees_across_ranks`).
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.callbacks.learning_rate_control import velocity_buffers
from tfdist.horovod import collectives, process
from tfdist.strategies.state import rank_state, replica_consistency
from tfdist.strategies.keras_surface import model_strategy


@model_strategy.agrees_across_ranks
class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Start training from `root_rank`'s model and optimizer variables.

    Args:
        root_rank: the rank whose values every rank takes.
        device: Horovod's device argument (accepted; tfdist places collectives itself).
        local_variables: variables (or one) each rank keeps as its own.
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        del device
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, tf.Variable):
            local_variables = [local_variables]
        elif not all(isinstance(v, (tf.Variable, keras.Variable)) for v in local_variables):
            raise ValueError("All local variables must be of tf.Variable type.")
        self.root_rank = root_rank
        self._local_variables = list(local_variables)
        self._local = {id(v) for v in local_variables}
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and self._local_variables:
            # Each rank's own by design: not compared across ranks, saved per rank.
            known = {id(v) for v in rank_state.rank_own_variables(self.model)}
            rank_state.remember(optimizer, [v for v in self._local_variables
                                            if id(v) not in known])
        # What every rank must hold alike (the local variables are rank-own now).
        chosen = [v for v in replica_consistency.compared_variables(self.model)
                  if id(v) not in self._local]
        collectives.broadcast_variables(chosen, self.root_rank)
        self.broadcast_done = True


@model_strategy.agrees_across_ranks
class MetricAverageCallback(keras.callbacks.Callback):
    """Average each epoch's logs over the ranks (place it before callbacks that read them).

    Args:
        device: Horovod's device argument (accepted).
    """

    def __init__(self, device=""):
        super().__init__()
        del device

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or process.size() == 1:
            return
        names = sorted(logs)
        communicator = process.strategy().extended.communicator
        every_rank = communicator.all_gather_strings(",".join(names), max_bytes=8192)
        if len(set(every_rank)) > 1:
            raise ValueError(
                f"tfdist rank {process.rank()}: MetricAverageCallback found different log "
                f"names on the ranks (by rank: {every_rank}); every rank must log the same "
                "values.")
        if not names:
            return
        mine = np.array([float(np.asarray(logs[name])) for name in names], np.float64)
        stacked = collectives.allgather(tf.constant(mine[None])).numpy()
        for index, name in enumerate(names):
            column = stacked[:, index]
            if not np.all(column == column[0]):  # global already: kept bit for bit
                logs[name] = float(np.mean(column))


@model_strategy.agrees_across_ranks
class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the rate to `initial_lr * multiplier(epoch)` from `start_epoch` to `end_epoch`.

    Args:
        initial_lr: the rate the multiplier applies to.
        multiplier: a number (then `multiplier ** (epoch - start_epoch)`) or a function of
            the epoch.
        start_epoch: first epoch adjusted.
        end_epoch: first epoch no longer adjusted (None: to the end).
        staircase: adjust at each epoch's first batch (integer epochs), else before every
            batch with the fractional epoch `epoch + batch / steps_per_epoch`.
        momentum_correction: scale SGD's velocity by lr' / lr when the rate changes.
        steps_per_epoch: batches per epoch (default: `fit`'s).
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        if not callable(multiplier):
            constant = multiplier
            multiplier = lambda epoch: constant ** (epoch - start_epoch)  # noqa: E731
        self.initial_lr = initial_lr
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        raise ValueError(
            "Could not autodetect the number of steps per epoch. Please specify the "
            f"steps_per_epoch parameter to the {type(self).__name__}().")

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch
                or (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if (self.momentum_correction and isinstance(inner, keras.optimizers.SGD)
                and inner.momentum and old > 0 and new != old):
            for velocity in velocity_buffers(optimizer):
                velocity.assign(velocity * (new / old))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))



@model_strategy.agrees_across_ranks
class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the rate from `initial_lr / size()` to `initial_lr` over `warmup_epochs`, batch by
    batch (Horovod's formula: lr'(epoch) = lr / size * (epoch * (size - 1) / warmup + 1),
    with the epoch counted at each batch's end).

    Args:
        initial_lr: the rate at the end of the warmup (Horovod's scripts: base rate x size()).
        warmup_epochs: length of the ramp in epochs.
        momentum_correction: scale SGD's velocity by lr' / lr when the rate changes.
        steps_per_epoch: batches per epoch (default: `fit`'s).
        verbose: 1: the chief says when the warmup ends.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            size = process.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and process.rank() == 0:
            rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            print("\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1, rate))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Save the model when `monitor` improves (`ModelCheckpoint(save_best_only=True)`).

    `monitor`, `verbose`, `save_weights_only`, `mode` and `save_freq` are
    `ModelCheckpoint`'s.

    Args:
        filepath: where (default `best_model.keras`, or `best_model.weights.h5` with
            `save_weights_only`); Horovod's has no path of its own.
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
