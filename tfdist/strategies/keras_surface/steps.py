"""Which Keras step a function is, and the step's logs (no patch: read-only helpers).

The strategy's `run` is handed a function; these helpers tell whether it is
a Keras model's `train_step` / `test_step` (and whether Keras' own or a
user's override), the predict step, or a user's function (a custom training
loop), and turn a step's returned logs into global ones. They also say
which optimizers scale their loss (float16) and what the asynchronous
parameter server cannot apply.
"""

import inspect

import keras
import tensorflow as tf

from tfdist.strategies.keras_surface import keras_internals
from tfdist.strategies.keras_surface.keras_internals import LossScaleOptimizer


def _unwrap(fn):
    return inspect.unwrap(fn, stop=lambda f: hasattr(f, "__self__"))


def model_of_step(fn):
    """The Keras model if `fn` is its train_step/test_step, else None."""
    fn = _unwrap(fn)
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, keras.Model) and getattr(fn, "__name__", "") in ("train_step",
                                                                           "test_step"):
        return owner
    return None


def _metric_results(model):
    results = {}
    for metric in model.metrics:
        result = metric.result()
        results[metric.name] = result
        if isinstance(result, dict):
            results.update(result)
    return results


def raw_log_keys(model, outputs):
    """The keys of a step's logs that are raw per-slice float scalars (not metric results).

    A custom `train_step` may return a loss it computed over its slice;
    its global value is the share-weighted sum over ranks.
    """
    metric_keys = _metric_results(model)
    return [key for key, value in outputs.items() if key not in metric_keys
            and isinstance(value, tf.Tensor) and value.dtype.is_floating
            and value.shape.rank == 0]


def global_step_logs(model, outputs, summed_raw_logs):
    """A train/test step's returned logs, made global and equal on every rank.

    Read after tfdist made the metric state global: a key naming one of the
    model's metrics (or one of their results, as `get_metrics_result()`
    flattens them) is replaced by that metric's result, so a custom
    `train_step` returning `{m.name: m.result() for m in self.metrics}` logs
    global values. The raw float scalars (`raw_log_keys`) are replaced by
    their share-weighted sums over ranks, `summed_raw_logs`, i.e. their
    value over the global batch when they are means over the slice. Other
    values are kept.
    """
    results = _metric_results(model)
    logs = dict(outputs)
    for key in logs:
        if key in results:
            logs[key] = results[key]
    logs.update(summed_raw_logs)
    return logs


def is_train_step(fn):
    """True for a Keras model's `train_step` (the function `fit` runs per batch)."""
    return model_of_step(fn) is not None and _unwrap(fn).__name__ == "train_step"


def is_keras_train_step(fn):
    """True for Keras' own `train_step` (not overridden): it reads no variable after its update."""
    return is_train_step(fn) and (type(model_of_step(fn)).train_step
                                  is keras_internals.Trainer.train_step)


def is_predict_step(fn):
    """True for the per-batch function of Keras' `predict`."""
    return "make_predict_function" in getattr(_unwrap(fn), "__qualname__", "")


def scales_loss(optimizer):
    """True if `optimizer.scale_loss` changes the loss (float16 loss scaling, a static factor).

    Its gradients then carry the loss scale, whose overflow behaviour
    depends on their magnitude: the share weights the loss itself
    (`ReplicaStep.weight_loss`), as one process's global mean would.
    """
    return isinstance(optimizer, LossScaleOptimizer) or (
        getattr(optimizer, "loss_scale_factor", None) is not None)


def check_asynchronous_optimizer(optimizer):
    """What the asynchronous parameter server cannot apply on its servers, as a clear error."""
    if isinstance(optimizer, LossScaleOptimizer):
        raise ValueError(
            "tfdist asynchronous parameter server: LossScaleOptimizer (mixed_float16) is not "
            "supported in mode='async' (each server would keep its own loss scale); train "
            "in float32 or bfloat16, or use mode='sync'.")
    if optimizer.global_clipnorm is not None:
        raise ValueError(
            "tfdist asynchronous parameter server: global_clipnorm spans the variables of "
            "every server; use clipnorm (per variable) in mode='async'. "
            f"Got: global_clipnorm={optimizer.global_clipnorm!r}")
