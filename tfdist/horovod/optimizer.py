"""Horovod's `DistributedOptimizer` and `load_model` on a Keras 3 optimizer.

Under `tfdist.horovod.keras` the gradients are already averaged over the
ranks inside Keras' own step (the strategy `init()` made the default:
`apply` receives the global gradient before clipping, loss scaling's
finite check or accumulation). `DistributedOptimizer(optimizer, ...)`
therefore returns the same optimizer object - its class, name, config and
saved form stay Keras' own, so `model.save` writes what the plain script
writes and `keras.models.load_model` reads it without tfdist - with
Horovod's arguments mapped onto it:

* `compression`: the strategy's gradient compression on the wire
  (`Compression.fp16`: float16, half the bytes; `Compression.none`);
* `op=Average` (default): the mean over every rank's rows - with equal
  per-rank batches exactly Horovod's mean of the ranks' means, and equal to
  one process on the concatenated batches for any split; `op=Sum`: that
  times `size()` (Horovod's sum of the ranks' means);
* `backward_passes_per_step=N`: Keras 3's `gradient_accumulation_steps=N`
  (the update every N batches, with the mean of their global gradients;
  `average_aggregated_gradients=False`, Horovod's default, their sum);
* `sparse_as_dense=True`: embedding gradients travel dense;
* outside `fit` (a custom loop's `apply_gradients` in or out of a
  `tf.function`, no `strategy.run`): the gradients are averaged over the
  ranks through the strategy's gradient path before Keras applies them, as
  Horovod's `apply_gradients` averages;
* `gradient_predivide_factor`: Horovod splits the averaging before and after
  the sum; the sum here is exact, so the result is the same average (only
  `op=Average` takes it, as in Horovod);
* `device_dense`, `device_sparse`, `groups` / `num_groups`, `name`,
  `scale_local_gradients`: accepted; tfdist places and fuses gradients
  itself (`fusion_threshold_bytes`; `HOROVOD_FUSION_THRESHOLD` is read).

Refused with the reason: `op=Adasum`, a process set other than the global
one, an optimizer already built with other accumulation steps.
`load_model` is `keras.models.load_model` (under the strategy, so the model
is a tfdist model) with the loaded optimizer made distributed; Keras 3 has
no legacy optimizers (`legacy_opts=True` is refused).
"""

import keras

from tfdist.horovod import collectives, process
from tfdist.horovod.compression import Compression, tfdist_compression
from tfdist.strategies.keras_patches import gradient_options


# pylint: disable-next=invalid-name
def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=collectives.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None,
                         process_set=collectives.global_process_set,
                         scale_local_gradients=True):
    """`optimizer` with Horovod's gradient averaging and options (see the module docstring).

    Returns the same object (its class and config unchanged for saving).
    """
    del name, device_dense, device_sparse, scale_local_gradients
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("tfdist.horovod: DistributedOptimizer wraps a Keras 3 optimizer "
                         f"(keras.optimizers.*). Got: {type(optimizer).__name__}")
    check_averaging_options(op, gradient_predivide_factor, num_groups, groups, process_set)
    if isinstance(backward_passes_per_step, bool) or not isinstance(
            backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be a positive integer. "
                         f"Got: {backward_passes_per_step!r}")
    strategy = process.strategy()
    strategy.extended.set_compression(tfdist_compression(compression))
    factor = float(process.size()) if op is collectives.Sum else 1.0
    if backward_passes_per_step > 1:
        _accumulate(optimizer, backward_passes_per_step)
        if not average_aggregated_gradients:
            factor *= backward_passes_per_step
    return gradient_options.apply_to(optimizer, factor=factor, sparse_as_dense=sparse_as_dense,
                                     averaged_outside_steps=True)


def check_averaging_options(op, gradient_predivide_factor, num_groups, groups, process_set):
    """Horovod's checks of the averaging options `DistributedOptimizer` and
    `DistributedGradientTape` share (its messages); tfdist's refusals (Adasum, process sets)."""
    collectives.check_op(op, (collectives.Average, collectives.Sum))
    collectives.check_process_set(process_set)
    if gradient_predivide_factor != 1.0 and op is not collectives.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average. "
                         f"Got: op={op!r}, gradient_predivide_factor={gradient_predivide_factor}")
    if not gradient_predivide_factor > 0:
        raise ValueError("gradient_predivide_factor must be positive. "
                         f"Got: {gradient_predivide_factor!r}")
    groups = num_groups if groups is None and num_groups else groups
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         f"tf.Variable. Got: groups={groups!r}")


def _accumulate(optimizer, steps):
    """Keras 3's gradient accumulation over `steps` batches (before the optimizer is built)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    current = inner.gradient_accumulation_steps
    if current == steps:
        return
    if inner.built or current:
        raise ValueError(
            "tfdist.horovod: backward_passes_per_step becomes the optimizer's "
            "gradient_accumulation_steps, which must be set before the optimizer is built and "
            f"not set otherwise. Got: backward_passes_per_step={steps}, "
            f"gradient_accumulation_steps={current}, built={inner.built}")
    inner.gradient_accumulation_steps = steps


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """`keras.models.load_model(filepath)` with its optimizer made a `DistributedOptimizer`.

    Args:
        filepath: a `.keras` or `.h5` file Keras 3 reads.
        custom_optimizers: optimizer classes of the saved model that Keras does not know.
        custom_objects: other custom classes or functions, by name.
        compression: as `DistributedOptimizer`'s.
        legacy_opts: Keras 3 has no legacy optimizers: only False.
    """
    if legacy_opts:
        raise ValueError("tfdist.horovod: load_model(legacy_opts=True): Keras 3 has no legacy "
                         "optimizers (tf.keras.optimizers.legacy).")
    process.strategy()  # the model is built under the strategy: init() first
    objects = dict(custom_objects or {})
    objects.update({cls.__name__: cls for cls in custom_optimizers or ()})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
