"""Which Keras tfdist supports, and a loud check of everything the patches rely on.

Supported Keras versions: `tfdist.versions.SUPPORTED` (also declared in
`pyproject.toml`); a version outside the range is refused with an
ImportError naming it. At import, `check_keras()` also verifies every
symbol, signature and step structure the patches (this package) and the
callbacks layer rely on, resolved by `keras_internals` under each supported
version's names, and raises an ImportError naming the Keras version and what
changed - a rename in Keras is a loud error, never an AttributeError in a
patch nor silently per-rank logs.
"""

import ast
import inspect
import textwrap

import keras
import tensorflow as tf

from tfdist import __version__ as tfdist_version
from tfdist import versions
from tfdist.strategies.keras_surface import keras_internals, patch_points
from tfdist.strategies.keras_surface.keras_internals import (ArrayDataAdapter, BaseOptimizer,
                                                              GeneratorDataAdapter,
                                                              LossScaleOptimizer, TFEpochIterator,
                                                              TFOptimizer, TFVariable)


# Keras 2's compile argument Horovod's scripts pass (accepted under per-rank input).
KERAS_2_ARGUMENT = "experimental_run_tf_function"

SUPPORTED_KERAS = versions.SUPPORTED["keras"]  # [lowest, highest) major.minor


def _parameters(function):
    return list(inspect.signature(inspect.unwrap(function)).parameters)


def _names_used(function):
    """Attribute and global names the code of `function` uses (nested functions included)."""
    names, codes = set(), [inspect.unwrap(function).__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return names


def _keywords_passed(function):
    """Keyword-argument names that the code of `function` passes in its calls."""
    return {name for const in inspect.unwrap(function).__code__.co_consts
            if isinstance(const, tuple) for name in const if isinstance(name, str)}


def _nested_function_names(function):
    return {c.co_name for c in inspect.unwrap(function).__code__.co_consts if inspect.iscode(c)}


def _keras_changes():
    """What the patches rely on that this Keras does not have (empty: all is there)."""
    # pylint: disable=protected-access
    trainer = keras_internals.Trainer
    backup = keras.callbacks.BackupAndRestore
    expectations = {
        "keras.src.losses.loss.(un)scale_loss_for_distribution": lambda: all(
            hasattr(keras_internals.loss_module, name)
            for name in ("scale_loss_for_distribution", "unscale_loss_for_distribution")),
        "keras.src.losses.loss: Loss.__call__ reduces through reduce_weighted_values(values, "
        "sample_weight, mask, reduction, dtype), apply_mask, squeeze_or_expand_to_same_rank, "
        "standardize_reduction": lambda: (
            "reduce_weighted_values" in _names_used(keras_internals.loss_module.Loss.__call__)
            and _parameters(keras_internals.loss_module.reduce_weighted_values) == [
                "values", "sample_weight", "mask", "reduction", "dtype"]
            and _parameters(keras_internals.loss_module.apply_mask) == [
                "sample_weight", "mask", "dtype", "reduction"]
            and callable(keras_internals.loss_module.squeeze_or_expand_to_same_rank)
            and callable(keras_internals.loss_module.standardize_reduction)),
        "BaseOptimizer.apply(grads, trainable_variables)": lambda: (
            _parameters(BaseOptimizer.apply)[:3] == ["self", "grads", "trainable_variables"]),
        "LossScaleOptimizer.apply(grads, trainable_variables)": lambda: (
            _parameters(LossScaleOptimizer.apply)[:3] == ["self", "grads",
                                                          "trainable_variables"]),
        "BaseOptimizer.build(variables) / add_variable_from_reference(reference_variable, "
        "name)": lambda: (
            _parameters(BaseOptimizer.build)[:2] == ["self", "variables"]
            and _parameters(BaseOptimizer.add_variable_from_reference)[:3] == [
                "self", "reference_variable", "name"]),
        "BaseOptimizer.assign / assign_add / assign_sub(variable, value)": lambda: all(
            _parameters(getattr(BaseOptimizer, name))[:3] == ["self", "variable", "value"]
            for name in ("assign", "assign_add", "assign_sub")),
        "BaseOptimizer.scale_loss(loss)": lambda: (
            _parameters(BaseOptimizer.scale_loss) == ["self", "loss"]),
        "BaseOptimizer._learning_rate / _trainable_variables": lambda: (
            {"_learning_rate", "_trainable_variables"}
            <= _names_used(BaseOptimizer.__init__) | _names_used(BaseOptimizer.build)),
        "TFOptimizer._all_reduce_sum_gradients(grads_and_vars)": lambda: (
            _parameters(TFOptimizer._all_reduce_sum_gradients) == ["self", "grads_and_vars"]),
        "keras.src.backend.Variable checkpoints through its TensorFlow variable "
        "(value._serialize_to_tensors / _restore_from_tensors: a sharded slot's own)": lambda: (
            "_serialize_to_tensors" in _names_used(TFVariable._serialize_to_tensors)
            and "_restore_from_tensors" in _names_used(TFVariable._restore_from_tensors)),
        "Layer.__call__(*args, **kwargs); keras.src.backend.common.masking.get_keras_mask / "
        "set_keras_mask": lambda: (
            _parameters(keras.layers.Layer.__call__) == ["self", "args", "kwargs"]
            and _parameters(keras_internals.masking.get_keras_mask) == ["x"]
            and _parameters(keras_internals.masking.set_keras_mask) == ["x", "mask"]),
        "keras.metrics.Mean.update_state(values, sample_weight)": lambda: (
            _parameters(keras.metrics.Mean.update_state)[:3] == ["self", "values",
                                                                 "sample_weight"]),
        "fit/evaluate/predict read stop_training/stop_evaluating/stop_predicting": lambda: all(
            flag in _names_used(loop) for loop, flag in (
                (trainer.fit, "stop_training"), (trainer.evaluate, "stop_evaluating"),
                (trainer.predict, "stop_predicting"))),
        "fit/evaluate run Model.train_step/test_step through distribute_strategy.run": lambda: (
            "train_step" in _names_used(trainer.make_train_function)
            and "test_step" in _names_used(trainer.make_test_function)
            and "run" in _names_used(trainer._make_function)),
        "Trainer.make_predict_function defines the predict step": lambda: (
            bool(_nested_function_names(trainer.make_predict_function))),
        "Model.train_on_batch/test_on_batch/predict_on_batch, save, save_weights, export; "
        "keras.saving.save_model": lambda: all(
            callable(getattr(keras.Model, name)) for name in (
                "train_on_batch", "test_on_batch", "predict_on_batch", "save", "save_weights",
                "export")) and callable(keras.saving.save_model),
        "Trainer.fit/evaluate/predict take batch_size, steps(_per_epoch), "
        "validation arguments by name": lambda: (
            {"batch_size", "epochs", "steps_per_epoch", "shuffle", "class_weight",
             "sample_weight", "initial_epoch", "validation_split", "validation_freq",
             "validation_batch_size", "validation_steps"} <= set(_parameters(trainer.fit))
            and {"batch_size", "steps", "sample_weight"} <= set(_parameters(trainer.evaluate))
            and {"batch_size", "steps"} <= set(_parameters(trainer.predict))),
        "ArrayDataAdapter._inputs (the arrays fit was given)": lambda: (
            "_inputs" in _names_used(ArrayDataAdapter.__init__)),
        "GeneratorDataAdapter.get_tf_dataset": lambda: (
            callable(vars(GeneratorDataAdapter)["get_tf_dataset"])),
        "CallbackList(callbacks, add_history, add_progbar, model)": lambda: (
            _parameters(keras.callbacks.CallbackList.__init__)[:5] == [
                "self", "callbacks", "add_history", "add_progbar", "model"]),
        "TFEpochIterator(distribute_strategy, ...) with data_adapter, num_batches": lambda: (
            _parameters(TFEpochIterator.__init__)[:2] == ["self", "distribute_strategy"]
            and {"data_adapter", "num_batches"} <= set(dir(TFEpochIterator)) | _names_used(
                TFEpochIterator.__mro__[1].__init__)),
        "BackupAndRestore paths, epoch and batch attributes, _save_model": lambda: (
            {"_weights_path", "_training_metadata_path", "_prev_weights_path",
             "_prev_training_metadata_path", "_current_epoch", "_last_batch_seen"}
            <= _names_used(backup.__init__) and callable(backup._save_model)
            and "_initial_epoch" in _names_used(backup._load_model)),
        "BackupAndRestore counts batches in _batches_seen_since_last_saving; fit resets the "
        "metrics before on_epoch_begin": lambda: (
            "_batches_seen_since_last_saving" in _names_used(backup.__init__)
            and {"reset_metrics", "on_epoch_begin"} <= _names_used(trainer.fit)),
        "EpochIterator._enumerate_iterator() yields (begin, end, iterator), reads "
        "steps_per_epoch, _num_batches; catch_stop_iteration": lambda: (
            _parameters(TFEpochIterator._enumerate_iterator) == ["self"]
            and {"steps_per_epoch", "_num_batches", "_get_iterator"}
            <= _names_used(TFEpochIterator._enumerate_iterator)
            and callable(TFEpochIterator.catch_stop_iteration)),
        "only fit's training TFEpochIterator takes class_weight": lambda: (
            "class_weight" in _keywords_passed(trainer.fit)
            and "class_weight" not in _keywords_passed(trainer.evaluate)
            and "class_weight" not in _keywords_passed(trainer.predict)),
        "Trainer._maybe_symbolic_build(iterator, data_batch) builds through "
        "_symbolic_build; TFEpochIterator._distributed_dataset": lambda: (
            _parameters(trainer._maybe_symbolic_build) == ["self", "iterator", "data_batch"]
            and "_symbolic_build" in _names_used(trainer._maybe_symbolic_build)
            and "_distributed_dataset" in _names_used(TFEpochIterator._get_iterator)),
        "Trainer._distribute_strategy": lambda: (
            "_distribute_strategy" in _names_used(trainer.__init__)),
        "Trainer.make_train_function(force), train_function": lambda: (
            "force" in _parameters(trainer.make_train_function)
            and "train_function" in _names_used(trainer.__init__)),
        "TensorBoard log_dir, update_freq, _train_writer, profile range (_should_trace, "
        "_start_batch, _stop_batch)": lambda: (
            {"log_dir", "update_freq"} <= _names_used(keras.callbacks.TensorBoard.__init__)
            and isinstance(vars(keras.callbacks.TensorBoard)["_train_writer"], property)
            and {"_should_trace", "_start_batch", "_stop_batch"}
            <= _names_used(keras.callbacks.TensorBoard._init_profile_batch)),
        "the methods tfdist overrides (patch_points.OVERRIDES): CallbackList's hooks; "
        "BackupAndRestore's hooks, _save_model(), _load_model()": lambda: all(
            callable(getattr(patch_points.owner_class(point.owner), name, None))
            for point in patch_points.OVERRIDES for name in point.names),
        "Callback's default hooks are marked _is_default (loop_flags)": lambda: all(
            getattr(getattr(keras.callbacks.Callback, hook), "_is_default", False)
            for hook in ("on_train_batch_end", "on_test_batch_end", "on_predict_batch_end",
                         "on_train_batch_begin", "on_batch_end")),
        # The callbacks layer: one `params` dict per fit, shared by all its callbacks
        # (`callbacks.learning_rate_control` finds the terms of one fit by it).
        "CallbackList.set_params hands every callback the same params dict": _params_shared,
        # `data._install_generator_without_prefetch` takes the dataset before the prefetch.
        "GeneratorDataAdapter.get_tf_dataset ends with prefetch": lambda: (
            _last_call_before_return(GeneratorDataAdapter.get_tf_dataset) == "prefetch"),
    }
    return [what for what, present in expectations.items() if not _holds(present)]


def _params_shared():
    first, second = keras.callbacks.Callback(), keras.callbacks.Callback()
    params = {"epochs": 1, "steps": 1, "verbose": 0}
    keras.callbacks.CallbackList([first, second]).set_params(params)
    return first.params is params and second.params is params


def _last_call_before_return(function):
    """The method name called in the last statement before `function`'s final `return`."""
    body = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function)))).body[0].body
    if len(body) < 2 or not isinstance(body[-1], ast.Return):
        return None
    value = getattr(body[-2], "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        return value.func.attr
    return None


def _holds(expectation):
    try:
        return bool(expectation())
    except Exception:  # pylint: disable=broad-except  (gone or changed)
        return False


def check_keras():
    """Refuse a Keras (or TensorFlow) outside the supported range, or one that lacks what the
    patches rely on (ImportError naming what changed)."""
    versions.refuse_unsupported("keras", keras.__version__, tfdist_version)
    versions.refuse_unsupported("tensorflow", tf.__version__, tfdist_version)
    changes = keras_internals.missing() or _keras_changes()
    if changes:
        raise ImportError(
            f"tfdist {tfdist_version} supports Keras {versions.describe_range('keras')}; "
            f"Keras {keras.__version__} is installed and has changed what tfdist patches: "
            f"{'; '.join(changes)}. Install a supported Keras "
            f"(pip install '{versions.PIP_REQUIREMENT['keras']}')."
        )


check_keras()
