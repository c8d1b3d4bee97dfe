"""The callback list of a tfdist model: Keras' `CallbackList` with the multi-process hooks.

Keras' loops call the callback list, never a callback directly, so the list
is where tfdist runs what must happen around every callback's hook:

* `loop_flags`: right after the hooks after which a loop reads its stop
  flag (`on_train_begin`, `on_epoch_begin`, `on_train_batch_end`,
  `on_epoch_end`, `on_test_begin`, `on_test_batch_end`, `on_predict_begin`,
  `on_predict_batch_end`), the flag is agreed by every rank; the schedule of
  those agreements is agreed at each loop's start;
* `backup`: after `on_train_begin` (which resets the callbacks) a resumed
  fit's callbacks get the backup's state; a resumed epoch whose steps were
  all trained before the backup gets its logs from the restored metrics;
  before a training batch a preemption notice (or an epoch's weights
  fingerprint) joins the next step's all-reduce, and after it every rank
  backs up at the agreed step.

How: `callbacks.install`'s `CallbackList.__init__` hook gives a list built
for a model under a tfdist strategy a subclass of its own class with these
methods first (`adopt`, through `patch_points.adopt`); every other list,
and every model outside tfdist, keeps Keras' class untouched. The
overridden methods are declared in `patch_points.OVERRIDES` and checked at
import (`compat`): Keras' methods are called through `super()`, nothing is
replaced. Cost: one Python call per hook and batch, plus what the hooks do
(`loop_flags`, `backup` say).
"""

from tfdist.strategies.keras_patches import backup, loop_flags
from tfdist.strategies.keras_surface import patch_points


class MultiProcessHooks:
    """Placed before a `CallbackList` class: stop flags agreed, backups at agreed steps."""

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        loop_flags.agree_schedule(self, "train")
        loop_flags.agree_flag(self, "train", loop_flags.EDGES)
        backup.apply_steering_state(self)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        loop_flags.agree_flag(self, "train", loop_flags.EDGES)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, backup.epoch_logs(self, epoch, logs))
        loop_flags.agree_flag(self, "train", loop_flags.EDGES)

    def on_train_batch_begin(self, batch, logs=None):
        backup.before_train_batch(self)
        super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        loop_flags.agree_flag(self, "train", loop_flags.BATCHES)
        backup.back_up_if_preempted(self)

    def on_test_begin(self, logs=None):
        super().on_test_begin(logs)
        loop_flags.agree_schedule(self, "test")
        loop_flags.agree_flag(self, "test", loop_flags.EDGES)

    def on_test_batch_end(self, batch, logs=None):
        super().on_test_batch_end(batch, logs)
        loop_flags.agree_flag(self, "test", loop_flags.BATCHES)

    def on_predict_begin(self, logs=None):
        super().on_predict_begin(logs)
        loop_flags.agree_schedule(self, "predict")
        loop_flags.agree_flag(self, "predict", loop_flags.EDGES)

    def on_predict_batch_end(self, batch, logs=None):
        super().on_predict_batch_end(batch, logs)
        loop_flags.agree_flag(self, "predict", loop_flags.BATCHES)


def adopt(callback_list):
    """Give a tfdist model's freshly built callback list the hooks above."""
    patch_points.adopt(callback_list, "CallbackList", MultiProcessHooks)
