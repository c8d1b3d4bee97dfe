"""Every place tfdist touches Keras internals, one module per family of patches.

Keras 3 has no hook where every rank builds its epoch iterator, where losses
are scaled for tf.distribute, where optimizers all-reduce, where a `Mean`
metric is updated or where the fit loop reads `stop_training`; it has no
notion of a chief process either. This package patches exactly those places,
each family in its own module:

* `losses`: losses stay means over the rank's slice, each term over its own
  global denominator;
* `gradient_tape`: in a custom step, `GradientTape.gradient` with respect to
  variables returns the global batch's gradients (DDP's semantics);
* `optimizer`: the global gradient reaches `apply` before clipping, loss
  scaling's finite check and accumulation;
* `metrics`: batch-level `Mean` updates are share-weighted;
* `callbacks`: the multi-process policy of every callback list (chief-only
  writers, the step watchdog, TensorBoard profiling, and the callbacks of the
  strategy's modes: the end-of-fit check and barrier, the asynchronous PS's
  parameter refresh, fit's start from rank 0's variables); a tfdist model's list becomes a
  `callback_list.MultiProcessHooks` subclass: the loop's stop flags agreed
  by every rank (`loop_flags`), the backup's hooks;
* `backup`: the user's `BackupAndRestore` (subclassed, `DistributedBackup`)
  writes and reads on the chief and resumes every rank exactly at the next
  batch (`tfdist.fault_tolerance`);
* `saving`: `Model.save` / `save_weights` on the chief, atomically;
* `empty_slices`: in a custom loop, a model called on an empty slice runs on
  a stand-in row, its outputs cut back to zero rows (installed at the first
  custom-loop step, not here);
* `data`: building from the data's spec, `*_on_batch` slicing, generators
  without read-ahead, the epoch iterators recorded and compared across ranks;
* `compile_arguments`: `compile`'s arguments as the strategy's input mode takes
  them (Keras 2's `experimental_run_tf_function` accepted in a Horovod-API
  model's `compile`);
* `gradient_options` (one optimizer, on request of `tfdist.horovod.keras`):
  a factor on its gradients and sparse gradients made dense;
* `sharded_layer_calls`: with the parameters sharded, a layer owning some
  recomputes its training call in the backward pass (installed when the
  first parameter is sharded).

Besides those, two modules patch nothing: `loop_flags` (the agreement, called
by the callback list) and `callback_list`'s base (`MultiProcessHooks`). What
reads Keras without changing it is below, in `tfdist.strategies.keras_surface`
(the private names, the declared patch points, the Keras check, which step a
function is, a model's strategy, a running fit's state); the backup's view of
the strategy is `tfdist.strategies.core.backup_job`. The layers below reach
this package only through hooks it registers (`install`): the step's
first-user-function hook (`empty_slices`) and the first sharded parameter's
(`sharded_layer_calls`). Nothing else in tfdist imports `keras.src`; every
private Keras attribute read or written anywhere in tfdist is declared in
`tfdist.private_surface`.

The patches apply only to models built under a tfdist strategy; everything
else is untouched. `install()` is called when the first tfdist strategy is
created (`data.install_data_recording()`, the epoch-iterator hook alone,
when a tfdist learning-rate callback is created); importing tfdist patches
nothing. Both are idempotent.
"""

import threading

from tfdist.strategies.keras_surface import compat  # noqa: F401  (checks this Keras at import)
from tfdist.strategies.keras_patches import (backup, callbacks, compile_arguments, data,
                                             empty_slices, gradient_tape, losses, metrics,
                                             optimizer, saving, sharded_layer_calls)
from tfdist.strategies.modes import parameter_shards
from tfdist.strategies.step import synchronous_step

_installed = False
_install_lock = threading.Lock()  # simulated ranks (threads) create their strategies at once


def install():
    """Patch Keras where multi-process training differs from one process (once per process;
    a thread calling it while another installs returns once every family is installed)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        # `compat` checked this Keras when it was imported, above
        for family in (losses, gradient_tape, data, optimizer, metrics, callbacks, backup,
                       saving, compile_arguments):
            family.install()
        # The families installed on demand, when the layers below first need them.
        synchronous_step.FIRST_USER_FUNCTION_HOOKS.append(empty_slices.install)
        parameter_shards.ON_FIRST_SHARD.append(sharded_layer_calls.install)
        _installed = True
