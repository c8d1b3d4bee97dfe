"""The Keras surface: every place tfdist replaces a Keras attribute, and why Keras has no hook.

Where Keras has an override point - a method its own code calls on an
object tfdist can choose the class of (the fit's callback list, the user's
`BackupAndRestore`) - tfdist subclasses: `adopt` gives that one object a
class with tfdist's methods before Keras' (declared in `OVERRIDES`, Keras'
methods called through `super()`). Elsewhere each family module (`losses`,
`optimizer`, ...) replaces attributes only through `replace` (a class or
module attribute, once per process) or `replace_on_instance` (one object's
attribute), and only at a point declared in `POINTS` with the reason Keras
offers no override point there. So these two lists are the whole surface the
next Keras can break, each entry is checked at import (`compat.check_keras`,
through `keras_internals`) and tests/test_structure.py checks that no family
assigns a Keras attribute any other way and that installing applies exactly
the class-level points.

Every replacement calls the original for models (and callbacks, optimizers)
outside a tfdist strategy: Keras is unchanged for them.
"""

import dataclasses
from typing import Any, Dict, Set, Tuple

import keras
import tensorflow as tf

from tfdist.strategies.keras_surface import keras_internals


@dataclasses.dataclass(frozen=True)
class PatchPoint:
    """One replaced attribute: `owner` (a label of `_owners()`), its attribute `names`, the family
    module that replaces it, why Keras has no hook there, whether per instance, and whether
    on demand (replaced when the first step that needs it runs, not by `install()`)."""

    owner: str
    names: Tuple[str, ...]
    family: str
    why: str
    per_instance: bool = False
    on_demand: bool = False


POINTS = (
    # losses
    PatchPoint("keras.src.losses.loss", ("scale_loss_for_distribution",
                                         "unscale_loss_for_distribution"), "losses",
               "Keras divides every loss by num_replicas_in_sync in these module functions, "
               "called from Loss.__call__ and the trainer; no argument turns it off"),
    PatchPoint("keras.src.losses.loss", ("reduce_weighted_values",), "losses",
               "a loss term's denominator (mask, sample weights) is computed inside this "
               "function; Loss has no hook to give it the global batch's denominator"),
    # gradient_tape
    PatchPoint("tf.GradientTape", ("gradient",), "gradient_tape",
               "a custom step reads its gradients between the tape and apply (clipping by "
               "global norm) and may differentiate a hand-written ratio of batch sums "
               "directly; nothing else sits between the backward pass and that code"),
    # metrics
    PatchPoint("keras.metrics.Mean", ("update_state",), "metrics",
               "a Mean updated once per batch (loss trackers, a custom step's metrics) must be "
               "share-weighted; Metric has no aggregation hook for a per-batch update"),
    # optimizer
    PatchPoint("BaseOptimizer", ("apply", "scale_loss"), "optimizer",
               "clipping, accumulation and the finite check run inside apply before Keras' "
               "all-reduce; the gradient must be global at apply's entry"),
    PatchPoint("LossScaleOptimizer", ("apply", "scale_loss"), "optimizer",
               "overrides BaseOptimizer's apply and scale_loss: patched alike"),
    PatchPoint("BaseOptimizer", ("build",), "optimizer",
               "the aggregation hook's state (error feedback, ...) is built with the optimizer's "
               "variables; build has no extension point"),
    PatchPoint("TFOptimizer", ("_all_reduce_sum_gradients",), "optimizer",
               "Keras' own all-reduce would sum gradients tfdist already made global"),
    # data
    PatchPoint("Trainer", ("_maybe_symbolic_build",), "data",
               "the symbolic build draws a batch from a new iterator (one more shuffle than "
               "one process); the model must be built from the dataset's spec"),
    PatchPoint("Trainer", ("fit", "evaluate", "predict"), "data",
               "the epoch iterator needs the call's arguments to compare them across ranks"),
    PatchPoint("keras.Model", ("train_on_batch", "test_on_batch", "predict_on_batch"), "data",
               "a *_on_batch call takes a global batch that each rank must slice"),
    PatchPoint("GeneratorDataAdapter", ("get_tf_dataset",), "data",
               "a generator read ahead by prefetch would be drawn in another order per rank"),
    PatchPoint("TFEpochIterator", ("__init__",), "data",
               "every epoch iterator is recorded (global batch size) and compared across ranks"),
    # backup
    PatchPoint("TFEpochIterator", ("_enumerate_iterator",), "backup",
               "a resume replays the input's consumption to the backed-up batch"),
    # callbacks
    PatchPoint("keras.callbacks.CallbackList", ("__init__",), "callbacks",
               "the multi-process policy (chief-only writers, watchdog, consistency check, "
               "profiling) applies to every callback list a fit builds, and a tfdist model's "
               "list takes the hooks of OVERRIDES; Keras builds the list inside fit, with no "
               "argument to choose its class"),
    # saving
    PatchPoint("keras.Model", ("save", "save_weights", "export", "load_weights"), "saving",
               "the chief writes atomically and every rank's own state goes beside; saving has "
               "no hook for where or when a file is written"),
    PatchPoint("keras.saving", ("save_model", "load_model"), "saving",
               "module functions that bypass Model.save / carry no rank state"),
    PatchPoint("keras.models", ("save_model", "load_model"), "saving",
               "the same functions under keras.models"),
    # empty_slices
    PatchPoint("keras.layers.Layer", ("__call__",), "empty_slices",
               "in a custom loop a model called on an empty slice must run on a stand-in row; "
               "replaced at the first custom-loop step of a tfdist strategy, never by fit",
               on_demand=True),
    # sharded_layer_calls
    PatchPoint("keras.layers.Layer", ("__call__",), "sharded_layer_calls",
               "with sharding='parameters' a layer owning sharded parameters must recompute "
               "its call in the backward pass (its gathered parameters would otherwise live "
               "until then: TensorFlow's tape keeps an op's inputs); Keras has no hook around "
               "a layer's call; replaced when the first sharded parameter is created",
               on_demand=True),
    # compile_arguments
    PatchPoint("BaseTrainer", ("compile",), "compile_arguments",
               "Horovod's scripts pass compile(experimental_run_tf_function=False), a Keras 2 "
               "argument Keras 3's compile refuses; compile takes no extra arguments and no "
               "hook sees them before the TypeError (replaced where Keras defines it: "
               "compile_from_config treats a compile defined lower as a user's own)"),
    # gradient_options (one optimizer, on request of tfdist.horovod.keras)
    PatchPoint("BaseOptimizer", ("apply",), "gradient_options",
               "Horovod's DistributedOptimizer options (op=Sum, summed accumulation, "
               "sparse_as_dense) change the gradients one optimizer applies before Keras' apply; "
               "a subclass would change the optimizer's saved form (Keras serializes a class "
               "by its public name), an attribute of the one object does not",
               per_instance=True),
    # modes.sharded_optimizer_methods (one optimizer, built under the sharded optimizer-state mode)
    PatchPoint("BaseOptimizer", ("add_variable_from_reference", "_clip_gradients",
                                 "_update_model_variables_moving_average",
                                 "_overwrite_model_variables_with_average_value",
                                 "finalize_variable_values", "save_own_variables",
                                 "load_own_variables"), "sharded_optimizer_methods",
               "a sharded optimizer's slots hold one rank's slices: their shapes, the norms of "
               "clipping, EMA and the saved whole state differ from Keras' per-variable code, "
               "which has no hook for a slot's shape or a variable's part; a subclass would "
               "change the optimizer's saved form (Keras serializes a class it exports by its "
               "public path, keras.optimizers.Adam, and any other class by its module, "
               "keras.src.optimizers.adam: measured), attributes of the one object do not; "
               "the shards themselves are in optimizer_shards' weak registry, not on it",
               per_instance=True),
    PatchPoint("BaseOptimizer", ("_backend_apply_gradients",), "sharded_optimizer_methods",
               "with the parameters sharded (sharding='parameters') the update must read the "
               "stored slices, where every other read gathers the whole parameter; Keras' "
               "update (clipping, weight decay, the rule, EMA) is this one method",
               per_instance=True),
    PatchPoint("LossScaleOptimizer", ("check_finite",), "sharded_optimizer_methods",
               "with reduce-scattered gradients each rank holds its slices only, and "
               "apply's skip-or-update decision (and the loss scale's change) is taken from "
               "this method's answer on them; every rank must take the same one",
               per_instance=True),
    PatchPoint("TFOptimizer", ("_all_reduce_sum_gradients",), "sharded_optimizer_methods",
               "the last point before Keras' update steps: each pair's variable becomes the "
               "rank's shard variable, after weight decay", per_instance=True),
    # data (during the symbolic build only)
    PatchPoint("BaseOptimizer", ("assign", "assign_add", "assign_sub"), "data",
               "the optimizer built after the symbolic build drops its build-time assignments, "
               "as one process's first trace leaves them", per_instance=True),
)



@dataclasses.dataclass(frozen=True)
class OverridePoint:
    """Methods of a Keras class that tfdist overrides in a subclass placed before the class of
    one object (`adopt`): Keras' own override point, called through `super()`."""

    owner: str
    names: Tuple[str, ...]
    family: str
    why: str


OVERRIDES = (
    OverridePoint("CallbackList", ("on_train_begin", "on_epoch_begin", "on_epoch_end",
                                   "on_train_batch_begin", "on_train_batch_end", "on_test_begin",
                                   "on_test_batch_end", "on_predict_begin",
                                   "on_predict_batch_end"), "callback_list",
                  "the loops read their stop flags right after these calls (agreed by every "
                  "rank); the backup's callbacks' state after on_train_begin, a resumed "
                  "epoch's logs, a preemption notice's flag before a training batch and the "
                  "backup at the agreed step after it"),
    OverridePoint("BackupAndRestore", ("on_train_begin", "on_train_end", "on_epoch_begin",
                                       "on_train_batch_end", "on_epoch_end", "_save_model",
                                       "_load_model"), "backup",
                  "the backup is written and read on the chief with the training state, the "
                  "resume restores every rank at the next batch"),
)

_adopted: Dict[Tuple[type, type], type] = {}


def _override_point(owner: str) -> OverridePoint:
    for point in OVERRIDES:
        if point.owner == owner:
            return point
    raise RuntimeError(f"tfdist: {owner} is overridden but not declared in "
                       "keras_surface/patch_points.OVERRIDES")


def adopt(instance: Any, owner: str, overrides: type) -> None:
    """Give `instance` (a `owner`, maybe a user's subclass) the methods of `overrides` first:
    its class becomes `type(instance)` with `overrides` before it (one class per pair, same
    name). `overrides` may define only the declared methods of `owner`."""
    point = _override_point(owner)
    defined = {name for name, value in vars(overrides).items()
               if callable(value) and not name.startswith("__")}
    if not defined <= set(point.names):
        raise RuntimeError(f"tfdist: {overrides.__name__} overrides {sorted(defined - set(point.names))} "
                           f"of {owner}, not declared in patch_points.OVERRIDES")
    base = type(instance)
    if not isinstance(instance, _owners()[owner]):
        raise TypeError(f"tfdist: {base.__name__} is not a {owner}")
    if issubclass(base, overrides):
        return
    key = (overrides, base)
    if key not in _adopted:
        _adopted[key] = type(base.__name__, (overrides, base),
                             {"__module__": base.__module__, "__qualname__": base.__qualname__,
                              "_tfdist_keras_class": base})
    instance.__class__ = _adopted[key]


def keras_class(instance: Any) -> type:
    """The class `instance` had before `adopt` (its own class if it was not adopted)."""
    return getattr(type(instance), "_tfdist_keras_class", type(instance))


_applied: Set[Tuple[str, str]] = set()


def _owners() -> Dict[str, Any]:
    return {
        "keras.src.losses.loss": keras_internals.loss_module,
        "tf.GradientTape": tf.GradientTape,
        "keras.metrics.Mean": keras.metrics.Mean,
        "BaseOptimizer": keras_internals.BaseOptimizer,
        "LossScaleOptimizer": keras_internals.LossScaleOptimizer,
        "TFOptimizer": keras_internals.TFOptimizer,
        "Trainer": keras_internals.Trainer,
        "BaseTrainer": keras_internals.BaseTrainer,
        "keras.Model": keras.Model,
        "GeneratorDataAdapter": keras_internals.GeneratorDataAdapter,
        "TFEpochIterator": keras_internals.TFEpochIterator,
        "BackupAndRestore": keras.callbacks.BackupAndRestore,
        "CallbackList": keras.callbacks.CallbackList,
        "keras.callbacks.CallbackList": keras.callbacks.CallbackList,
        "keras.saving": keras.saving,
        "keras.models": keras.models,
        "keras.layers.Layer": keras.layers.Layer,
    }


def owner_class(owner: str) -> Any:
    """The class (or module) a declared point's `owner` label names."""
    return _owners()[owner]


def _declared(owner: str, name: str, per_instance: bool) -> PatchPoint:
    for point in POINTS:
        if point.owner == owner and name in point.names and point.per_instance == per_instance:
            return point
    raise RuntimeError(f"tfdist: {owner}.{name} is replaced but not declared in "
                       "keras_surface/patch_points.POINTS (declare it, with why Keras has no "
                       "hook there)")


def original(owner: str, name: str) -> Any:
    """The current value of a declared class-level point (what `replace` will wrap)."""
    _declared(owner, name, per_instance=False)
    return getattr(_owners()[owner], name)


def replace(owner: str, name: str, replacement: Any) -> None:
    """Set `owner`'s attribute `name` to `replacement` (a declared class or module point)."""
    _declared(owner, name, per_instance=False)
    setattr(_owners()[owner], name, replacement)
    _applied.add((owner, name))


def replace_on_instance(instance: Any, owner: str, name: str, replacement: Any) -> None:
    """Set one object's attribute `name` (a declared per-instance point of class `owner`)."""
    _declared(owner, name, per_instance=True)
    if not isinstance(instance, _owners()[owner]):
        raise TypeError(f"tfdist: {type(instance).__name__} is not a {owner}")
    setattr(instance, name, replacement)


def applied() -> Set[Tuple[str, str]]:
    """The class-level points replaced so far, as (owner, name)."""
    return set(_applied)


def class_level() -> Set[Tuple[str, str]]:
    """Every declared class-level point `install()` replaces, as (owner, name)."""
    return {(point.owner, name) for point in POINTS
            if not point.per_instance and not point.on_demand for name in point.names}


def on_demand() -> Set[Tuple[str, str]]:
    """The declared class-level points replaced when a step first needs them."""
    return {(point.owner, name) for point in POINTS if point.on_demand for name in point.names}
