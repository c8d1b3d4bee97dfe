"""Every place tfdist touches Keras internals: the one module to update for a new Keras.

Keras 3 has no hook where every rank builds its epoch iterator, where losses
are scaled for tf.distribute, where optimizers all-reduce, where a `Mean`
metric is updated or where the fit loop reads `stop_training`; it has no
notion of a chief process either. This module patches exactly those places
(and reads the few private attributes tfdist needs: an optimizer's
learning-rate setting, `BackupAndRestore`'s paths, a `TensorBoard`
callback's writer and profiled batches). Nothing else in tfdist
imports `keras.src` or touches a private Keras attribute.

Supported Keras versions: `SUPPORTED_KERAS` (also declared in
`pyproject.toml`). At import, `check_keras()` verifies every symbol,
signature and step structure the patches rely on and raises an ImportError
naming the Keras version and what changed - a rename in Keras is a loud
error, never silently per-rank logs. A version outside the range that passes
the check only logs a warning.

Multi-process behaviour added where a user would expect it, without changes
to their script:

* non-chief ranks get no progress bar, and their `TensorBoard`,
  `ModelCheckpoint` and `CSVLogger` callbacks are dropped (the chief writes
  them); `BackupAndRestore` writes, deletes and reads backups on the chief
  only, and the state it restored is broadcast to every rank;
* `Model.save` / `Model.save_weights` are no-ops on non-chief ranks (every
  rank holds the same weights; one writer avoids clobbered files), and the
  chief's saves and `BackupAndRestore` backups replace their files
  atomically (`checkpoint_files`): a process killed mid-save leaves no torn file;
* `jit_compile` is turned off for multi-process models (XLA cannot compile
  the cross-process collectives inside the step);
* every call of the compiled train/test/predict step is bounded by the job
  timeout (`_StepTimeout`): its collectives carry no op-level timeout;
* next to a `TensorBoard` callback, tfdist's communication scalars are
  written into its run (`profiling.TensorBoardScalars`), and in a
  multi-process job its `profile_batch` profiles every rank, each into its
  own run `rank_<k>` (`profiling.RankProfiler`), as does
  `tfdist-run --profile`;
* the data adapter of the latest epoch iterator is remembered, so that
  callbacks can read the global batch size `fit` received
  (`latest_data_batch_size`).

These apply only to models built under a tfdist strategy (the chief-only
rules on non-chief ranks); everything else is untouched. `install()` is
called when the first tfdist strategy is created (`install_data_recording()`,
the epoch-iterator hook alone, when a tfdist learning-rate callback is
created); importing tfdist patches nothing. Both are idempotent.
"""

import functools
import inspect
import sys
import weakref

import keras
import tensorflow as tf
from absl import logging
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.backend.tensorflow import trainer as keras_tf_trainer_module
from keras.src.backend.tensorflow.trainer import TFEpochIterator
from keras.src.losses import loss as keras_loss_module
from keras.src.optimizers.base_optimizer import BaseOptimizer
from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
from keras.src.trainers import trainer as keras_trainer_module
from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter
from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

from tfdist import __version__ as tfdist_version
from tfdist import _tf
from tfdist.strategies import profiling
from tfdist.strategies import replica_step
from tfdist.strategies.batch_dependence import batch_ratio_denominator
from tfdist.strategies.checkpoint_files import save_backup, save_model_atomically
from tfdist.strategies.data_fingerprint import array_fingerprint

SUPPORTED_KERAS = ((3, 15), (3, 16))  # [lowest, highest) major.minor: pyproject's keras>=3.15,<3.16

_installed = False
_data_recording_installed = False
_latest_data_adapter = None  # weak reference to the latest epoch iterator's data adapter
_CHIEF_ONLY_WRITERS = (
    keras.callbacks.TensorBoard,
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.ProgbarLogger,
)


# Callbacks that never set a stop flag, or set it only from the logs (which are global:
# the same on every rank), so every rank decides alike (`agrees_across_ranks`).
_AGREEING_CALLBACKS = {
    keras.callbacks.History, keras.callbacks.ProgbarLogger, keras.callbacks.EarlyStopping,
    keras.callbacks.TerminateOnNaN, keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard,
    keras.callbacks.CSVLogger, keras.callbacks.BackupAndRestore,
    keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau,
}


def agrees_across_ranks(callback_class):
    """Class decorator: this callback sets no stop flag, or only from the (global) logs.

    Exact classes only: a subclass may decide differently, and is not trusted
    until it says so itself.
    """
    _AGREEING_CALLBACKS.add(callback_class)
    return callback_class


agrees_across_ranks(profiling.TensorBoardScalars)
agrees_across_ranks(profiling.RankProfiler)


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
    trainer = keras_tf_trainer_module.TensorFlowTrainer
    backup = keras.callbacks.BackupAndRestore
    expectations = {
        "keras.src.losses.loss.(un)scale_loss_for_distribution": lambda: all(
            hasattr(keras_loss_module, name)
            for name in ("scale_loss_for_distribution", "unscale_loss_for_distribution")),
        "keras.src.losses.loss: Loss.__call__ reduces through reduce_weighted_values(values, "
        "sample_weight, mask, reduction, dtype), apply_mask, squeeze_or_expand_to_same_rank, "
        "standardize_reduction": lambda: (
            "reduce_weighted_values" in _names_used(keras_loss_module.Loss.__call__)
            and _parameters(keras_loss_module.reduce_weighted_values) == [
                "values", "sample_weight", "mask", "reduction", "dtype"]
            and _parameters(keras_loss_module.apply_mask) == [
                "sample_weight", "mask", "dtype", "reduction"]
            and callable(keras_loss_module.squeeze_or_expand_to_same_rank)
            and callable(keras_loss_module.standardize_reduction)),
        "BaseOptimizer.apply(grads, trainable_variables)": lambda: (
            _parameters(BaseOptimizer.apply)[:3] == ["self", "grads", "trainable_variables"]),
        "LossScaleOptimizer.apply(grads, trainable_variables)": lambda: (
            _parameters(LossScaleOptimizer.apply)[:3] == ["self", "grads",
                                                          "trainable_variables"]),
        "BaseOptimizer.scale_loss(loss)": lambda: (
            _parameters(BaseOptimizer.scale_loss) == ["self", "loss"]),
        "BaseOptimizer._learning_rate / _trainable_variables": lambda: (
            {"_learning_rate", "_trainable_variables"}
            <= _names_used(BaseOptimizer.__init__) | _names_used(BaseOptimizer.build)),
        "TFOptimizer._all_reduce_sum_gradients(grads_and_vars)": lambda: (
            _parameters(TFOptimizer._all_reduce_sum_gradients) == ["self", "grads_and_vars"]),
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
        "TensorFlowTrainer.make_predict_function defines the predict step": lambda: (
            bool(_nested_function_names(trainer.make_predict_function))),
        "Model.train_on_batch/test_on_batch/predict_on_batch, save, save_weights": lambda: all(
            callable(getattr(keras.Model, name)) for name in (
                "train_on_batch", "test_on_batch", "predict_on_batch", "save", "save_weights")),
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
        "only fit's training TFEpochIterator takes class_weight": lambda: (
            "class_weight" in _keywords_passed(trainer.fit)
            and "class_weight" not in _keywords_passed(trainer.evaluate)
            and "class_weight" not in _keywords_passed(trainer.predict)),
        "TensorFlowTrainer._maybe_symbolic_build(iterator, data_batch) builds through "
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
    }
    return [what for what, present in expectations.items() if not _holds(present)]


def _holds(expectation):
    try:
        return bool(expectation())
    except (AttributeError, KeyError, TypeError, ValueError):  # a symbol is gone or changed
        return False


def check_keras():
    """Fail loudly if this Keras lacks what the patches rely on; warn if it is untested."""
    version = tuple(int(part) for part in keras.__version__.split(".")[:2])
    changes = _keras_changes()
    if changes:
        raise ImportError(
            f"tfdist {tfdist_version} supports Keras >={'.'.join(map(str, SUPPORTED_KERAS[0]))}"
            f",<{'.'.join(map(str, SUPPORTED_KERAS[1]))}; Keras {keras.__version__} is "
            f"installed and has changed what tfdist patches: {'; '.join(changes)}. Install a "
            "supported Keras (pip install 'keras>=3.15,<3.16')."
        )
    if not SUPPORTED_KERAS[0] <= version < SUPPORTED_KERAS[1]:
        logging.warning("tfdist: Keras %s is outside the tested range [%s, %s); the internals "
                        "tfdist patches are present, but results are not verified.",
                        keras.__version__, SUPPORTED_KERAS[0], SUPPORTED_KERAS[1])


check_keras()


def learning_rate_setting(optimizer):
    """What `optimizer` was created with as its learning rate (a float, variable or schedule)."""
    return getattr(optimizer, "_learning_rate", None)


def tfdist_strategy(model):
    """The tfdist strategy `model` was built under, or None."""
    strategy = getattr(model, "_distribute_strategy", None)  # pylint: disable=protected-access
    return strategy if _is_tfdist_strategy(strategy) else None


def asynchronous_updates(model):
    """The asynchronous parameter-server client of `model`'s strategy, or None (synchronous)."""
    strategy = tfdist_strategy(model)
    return strategy.extended.remote_updates if strategy is not None else None


def _is_tfdist_strategy(strategy):
    from tfdist.strategies.data_parallel import DataParallelStrategy  # it imports this module

    return isinstance(strategy, DataParallelStrategy)


def _is_multi_process(model):
    strategy = tfdist_strategy(model)
    return strategy is not None and strategy.world_size > 1


def is_non_chief_model(model):
    strategy = tfdist_strategy(model)
    return strategy is not None and not strategy.is_chief


def _keep_collectives_out_of_xla(model):
    """XLA cannot compile TensorFlow's cross-process collective ops: run the step unjitted."""
    strategy = tfdist_strategy(model)
    if strategy is not None and strategy.world_size > 1 and model.jit_compile:
        if strategy.is_chief:
            logging.warning("tfdist: jit_compile disabled for %s: the step contains "
                            "cross-process collectives, which XLA cannot compile.", model.name)
        model.jit_compile = False
        model.train_function = model.test_function = model.predict_function = None


@agrees_across_ranks
class _StepTimeout(keras.callbacks.Callback):
    """Registers each compiled step call with the communicator's progress watchdog.

    Keras calls `on_*_batch_begin` / `on_*_batch_end` around every call of the
    train/test/predict function (one call per `steps_per_execution` steps).
    """

    def __init__(self, communicator):
        super().__init__()
        self._communicator = communicator
        self._open = {}

    def _begin(self, mode, batch):
        self._end(mode)
        guard = self._communicator.expect_progress(f"{mode} step {batch}")
        guard.__enter__()
        self._open[mode] = guard

    def _end(self, mode):
        guard = self._open.pop(mode, None)
        if guard is not None:
            guard.__exit__(None, None, None)

    def on_train_batch_begin(self, batch, logs=None):
        self._begin("train", batch)

    def on_train_batch_end(self, batch, logs=None):
        self._end("train")

    def on_test_batch_begin(self, batch, logs=None):
        self._begin("test", batch)

    def on_test_batch_end(self, batch, logs=None):
        self._end("test")

    def on_predict_batch_begin(self, batch, logs=None):
        self._begin("predict", batch)

    def on_predict_batch_end(self, batch, logs=None):
        self._end("predict")


@agrees_across_ranks
class _EndOfFitBarrier(keras.callbacks.Callback):
    """`fit` returns on every rank once the chief has finished writing.

    Only the chief writes checkpoints (`ModelCheckpoint`, `BackupAndRestore`,
    `Model.save` in a callback). During training the next step's collective
    orders a rank after the chief's writes of the epoch before; after the
    last epoch nothing would, and a rank that reads the chief's file right
    after `fit` (`keras.models.load_model(best_path)`) could read the
    previous one. Runs last, after every other callback's `on_train_end`.

    Cost: one barrier (a tiny all-reduce) per `fit`.
    """

    def __init__(self, communicator):
        super().__init__()
        self._communicator = communicator

    def on_train_end(self, logs=None):
        with self._communicator.expect_progress("the barrier at the end of fit"):
            self._communicator.barrier()


def _with_end_of_fit_barrier(model, callbacks):
    strategy = tfdist_strategy(model)
    if (strategy is None or strategy.world_size == 1
            or strategy.extended.remote_updates is not None):  # async: _ServerParameters
        return callbacks
    return list(callbacks) + [_EndOfFitBarrier(strategy.extended.communicator)]


@agrees_across_ranks
class _ServerParameters(keras.callbacks.Callback):
    """Asynchronous parameter server: the model's variables follow the servers' parameters.

    At the end of `fit` the worker leaves the staleness gate, waits for every
    live worker to finish its `fit` (a barrier on server 0, which stops
    waiting for dead workers) and pulls the final parameters; `evaluate` and
    `predict` also start with a barrier and a pull. So all workers hold, and
    evaluate (each the whole data), the same parameters, and `model.save`
    after `fit` saves every update.
    """

    def __init__(self, strategy):
        super().__init__()
        self._remote = strategy.extended.remote_updates

    def _refresh(self, barrier):
        if barrier:
            self._remote.barrier()
        if self.model.optimizer is not None:
            self._remote.refresh(self.model.optimizer)

    def on_train_end(self, logs=None):
        self._remote.leave()
        self._refresh(barrier=True)

    def on_test_begin(self, logs=None):
        self._refresh(barrier=True)

    def on_predict_begin(self, logs=None):
        self._refresh(barrier=True)


def _with_server_parameters(model, callbacks):
    strategy = tfdist_strategy(model)
    if strategy is None or strategy.extended.remote_updates is None:
        return callbacks
    return list(callbacks or []) + [_ServerParameters(strategy)]


def _with_communication_profiling(model, callbacks):
    """`TensorBoard` callbacks get tfdist's scalars, and their profiles come from every rank.

    Added on every rank, before non-chief ranks drop their `TensorBoard`
    (they still time their steps and profile; only the chief writes scalars).
    """
    strategy = tfdist_strategy(model)
    if strategy is None or not strategy.extended.aggregator.communicates:
        return callbacks  # one process: Keras' own TensorBoard, untouched
    callbacks = keras.tree.flatten(callbacks) if callbacks else []
    added = []
    # pylint: disable=protected-access
    for board in [c for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)]:
        added.append(profiling.TensorBoardScalars(
            strategy, lambda board=board: board._train_writer, board.update_freq))
        if board._should_trace:  # profile_batch: each rank profiles into its own run instead
            board._tfdist_profile_batches = (board._start_batch, board._stop_batch)
            board._should_trace = False
        batches = getattr(board, "_tfdist_profile_batches", None)
        if batches is not None:
            added.append(profiling.RankProfiler(board.log_dir, *batches, strategy.rank,
                                                strategy.extended.communicator))
    requested = profiling.profiler_from_environment(strategy.rank, strategy.extended.communicator)
    if requested is not None:
        added.append(requested)
    return callbacks + added


def _with_step_timeout(model, callbacks):
    strategy = tfdist_strategy(model)
    if strategy is None or strategy.world_size == 1:
        return callbacks
    communicator = strategy.extended.communicator
    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    return list(callbacks) + [_StepTimeout(communicator)]


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
                                  is keras_tf_trainer_module.TensorFlowTrainer.train_step)


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


def is_predict_step(fn):
    """True for the per-batch function of Keras' `predict`."""
    return "make_predict_function" in getattr(_unwrap(fn), "__qualname__", "")


def _restore_only(callback):
    """BackupAndRestore for a non-chief rank: never write or delete (the chief restores)."""
    callback._save_model = lambda *args, **kwargs: None  # pylint: disable=protected-access
    callback.on_train_end = lambda logs=None: None
    return callback


def _save_backup_atomically(callback):
    """`BackupAndRestore._save_model`, through `checkpoint_files.save_backup`."""
    # pylint: disable=protected-access
    previous = ((callback._prev_weights_path, callback._prev_training_metadata_path)
                if callback.double_checkpoint else None)
    save_backup(callback.model, (callback._weights_path, callback._training_metadata_path),
                previous, {"epoch": callback._current_epoch, "batch": callback._last_batch_seen})


def _with_atomic_backups(callbacks):
    """The chief's BackupAndRestore callbacks write their files atomically (`checkpoint_files`)."""
    for callback in keras.tree.flatten(callbacks) if callbacks else []:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            callback._save_model = functools.partial(  # pylint: disable=protected-access
                _save_backup_atomically, callback)


def _restored_by_the_chief(callbacks, strategy):
    """BackupAndRestore in a multi-process job: the chief restores, every rank gets its state.

    Only the chief reads the backup: on several machines without a shared
    filesystem the other ranks do not see its files, and a rank that resumed
    from nothing would train out of step with the chief. After the chief's
    restore, one broadcast says whether it restored and from which epoch;
    if it did, the model's weights and the optimizer's state follow from
    rank 0 (one broadcast per variable, once per `fit`).
    """
    for callback in keras.tree.flatten(callbacks) if callbacks else []:
        if isinstance(callback, keras.callbacks.BackupAndRestore) and not getattr(
                callback, "_tfdist_restores_on_chief", False):
            callback._tfdist_restores_on_chief = True  # pylint: disable=protected-access
            restore = callback.on_train_begin
            callback.on_train_begin = functools.partial(_restore_then_broadcast, callback,
                                                        restore, strategy)


def _restore_then_broadcast(callback, restore, strategy, logs=None):
    # pylint: disable=protected-access
    model = callback.model
    restored = False
    if strategy.is_chief:
        restored = tf.io.gfile.exists(callback._weights_path)
        restore(logs)
    communicator = strategy.extended.communicator
    state = communicator.broadcast(
        tf.constant([int(restored), model._initial_epoch or 0], tf.int64)).numpy()
    if not state[0]:
        return
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = list(model.weights) + list(model.optimizer.variables if model.optimizer else [])
    for variable in variables:
        variable.assign(communicator.broadcast(variable.value))
    model._initial_epoch = int(state[1]) or None


def _for_non_chief(callbacks):
    kept = []
    for callback in keras.tree.flatten(callbacks) if callbacks else []:
        if isinstance(callback, _CHIEF_ONLY_WRITERS):
            continue
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            callback = _restore_only(callback)
        kept.append(callback)
    return kept


def latest_data_batch_size():
    """Rows per batch of the data given to the latest fit/evaluate/predict, or None.

    `fit` builds its training epoch iterator just before its callbacks'
    `on_train_begin`, so there it is the global batch size of the training
    data: the `batch_size` argument for arrays, the batch dimension for a
    batched `tf.data.Dataset` (read from the pipeline when not static).
    """
    adapter = _latest_data_adapter() if _latest_data_adapter is not None else None
    if adapter is None:
        return None
    size = adapter.batch_size
    if size is None and isinstance(adapter, TFDatasetAdapter):
        size = int(_tf.static_batch_size(adapter.get_tf_dataset()))
    return int(size) if size is not None and size > 0 else None


def _in_multi_process_strategy():
    strategy = tf.distribute.get_strategy()
    return _is_tfdist_strategy(strategy) and strategy.world_size > 1


def _install_loss_scaling():
    """Losses stay means over the rank's slice (see `replica_step`), as on one process.

    Keras divides mean losses by num_replicas_in_sync so that a plain sum of
    gradients is the mean - right only when every replica holds the same
    number of rows. tfdist weights each rank's gradients and batch-level
    metrics by its share of the global batch instead.
    """
    scale = keras_loss_module.scale_loss_for_distribution
    unscale = keras_loss_module.unscale_loss_for_distribution

    def scale_loss_for_distribution(value):
        return value if _in_multi_process_strategy() else scale(value)

    def unscale_loss_for_distribution(value):
        return value if _in_multi_process_strategy() else unscale(value)

    keras_loss_module.scale_loss_for_distribution = scale_loss_for_distribution
    keras_loss_module.unscale_loss_for_distribution = unscale_loss_for_distribution


def _install_global_loss_denominators():
    """Each loss term averages over what one process would average over (`replica_step`).

    Keras reduces a loss term over a rank's slice by its own denominator -
    the slice's elements, but also the valid tokens of a mask (a sequence
    model with `mask_zero=True`), the sum of the sample weights
    (`reduction="mean_with_sample_weight"`) or nothing (`reduction="sum"`) -
    where tfdist weights per-slice values by rows. The terms whose
    denominator is not proportional to the rows are rescaled here
    (`ReplicaStep.weight_for_global_denominator`), so that the step's
    share weighting gives each term's global value. So is a `Loss` whose
    `call` returns its own ratio of batch sums (keras.io's NER loss,
    `ops.sum(loss * mask) / ops.sum(mask)`; `batch_ratio_denominator`).
    Keras' own steps and custom `train_step`s that call a `keras.losses.Loss`
    get this; a user's function in `strategy.run` scales its losses itself.
    """
    reduce_weighted_values = keras_loss_module.reduce_weighted_values

    @functools.wraps(reduce_weighted_values)
    def globally_reduced(values, sample_weight=None, mask=None,
                         reduction="sum_over_batch_size", dtype=None):
        loss = reduce_weighted_values(values, sample_weight=sample_weight, mask=mask,
                                      reduction=reduction, dtype=dtype)
        step = replica_step.current()
        if (step is None or step.scaled_by_user or step.remote_parameter_set is not None
                or not _in_multi_process_strategy()):
            return loss
        reduction = keras_loss_module.standardize_reduction(reduction)
        values = keras.ops.convert_to_tensor(values, dtype=dtype)
        if values.shape.rank == 0:  # reduced by the loss itself: a hand-written mean?
            denominator = batch_ratio_denominator(values, step.inputs)
            if denominator is None or sample_weight is not None or mask is not None:
                return loss
            return step.weight_for_global_denominator(loss, denominator)
        if reduction in (None, "none") or len(loss.shape) != 0:
            return loss  # no reduction: the caller reduces (and is weighted by rows)
        if reduction == "sum":
            return step.weight_for_global_denominator(loss, None)
        if reduction in ("mean", "sum_over_batch_size"):
            if mask is None:
                return loss  # divided by its elements: proportional to the rows
            denominator = keras.ops.sum(keras.ops.cast(
                keras.ops.convert_to_tensor(mask, dtype=dtype), values.dtype))
            return step.weight_for_global_denominator(loss, denominator)
        # "mean_with_sample_weight": divided by the sum of the (masked) sample weights.
        if sample_weight is not None:
            sample_weight = keras.ops.convert_to_tensor(sample_weight, dtype=dtype)
        if mask is not None:
            mask = keras.ops.convert_to_tensor(mask, dtype=dtype)
        weights = keras_loss_module.apply_mask(sample_weight, mask, dtype=values.dtype,
                                               reduction=reduction)
        if weights is None:
            return loss
        _, weights = keras_loss_module.squeeze_or_expand_to_same_rank(
            values, keras.ops.cast(weights, values.dtype))
        return step.weight_for_global_denominator(loss, keras.ops.sum(weights))

    keras_loss_module.reduce_weighted_values = globally_reduced


def _install_build_without_peeking():
    """Under a tfdist strategy, Keras builds the model from the data's spec, not from a batch.

    With a strategy set, Keras' `fit` and `evaluate` build the model
    symbolically from a first batch, which they take from a new iterator of
    the data before the epoch's own. A `Dataset.shuffle` that reshuffles on
    every iteration (its default) then draws one more order than the same
    script without a strategy, and every epoch trains on other batches than
    one process does. tfdist builds from the dataset's element spec (shapes
    and dtypes are all a symbolic build reads); a model Keras cannot build
    symbolically is built when its step is traced, as without a strategy.
    """
    trainer = keras_tf_trainer_module.TensorFlowTrainer
    maybe_symbolic_build = trainer._maybe_symbolic_build  # pylint: disable=protected-access

    @functools.wraps(maybe_symbolic_build)  # check_keras reads the original through it
    def build_from_spec(self, iterator=None, data_batch=None):
        dataset = getattr(iterator, "_distributed_dataset", None)
        if (data_batch is not None or dataset is None
                or not _is_tfdist_strategy(self._distribute_strategy)):
            return maybe_symbolic_build(self, iterator=iterator, data_batch=data_batch)
        spec = tf.nest.map_structure(
            lambda s: None if isinstance(s, tf.OptionalSpec) else s, dataset.element_spec)
        with self.distribute_strategy.scope():
            try:
                self._symbolic_build(data_batch=spec)  # pylint: disable=protected-access
            except RuntimeError as error:
                # A model Keras cannot build symbolically (keras.io's GAN has no `call`):
                # built when its step is traced, as Keras does without a strategy.
                logging.log_first_n(logging.INFO, "tfdist: %s is built when its step is traced "
                                    "(%s)", 1, self.name, str(error).split(".")[0])

    trainer._maybe_symbolic_build = build_from_spec  # pylint: disable=protected-access


def _install_gradient_aggregation():
    """Optimizers see the global gradient before anything else touches it.

    Keras' TF optimizer all-reduces inside `apply`, after clipping
    (`clipnorm`, `clipvalue`, `global_clipnorm`), gradient accumulation and
    LossScaleOptimizer's finite check - all of which must see the whole
    batch's gradient to match one process. tfdist aggregates at the entry of
    the outermost `apply` and marks the step so the inner all-reduce is skipped.
    In Keras' own `train_step` the whole `apply` waits for the end of the
    step (`ReplicaStep.defers_updates`), where the gradients join the step's
    one fused all-reduce.
    """

    def aggregating(original):
        def apply(self, grads, trainable_variables=None):
            step = replica_step.current()
            if step is None or step.gradients_aggregated:
                return original(self, grads, trainable_variables)
            strategy = tf.distribute.get_strategy()
            grads = list(grads)
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)  # pylint: disable=protected-access
            if step.remote_parameter_set is not None:  # asynchronous: the servers apply
                return strategy.extended.push_gradients(
                    self, grads, variables, weighted_in_loss=step.loss_was_weighted_for(self))
            if step.defers_updates:  # summed with the step's state at its end
                step.defer_update(replica_step.DeferredUpdate(
                    tuple(grads),
                    tuple(variables) if len(variables) == len(grads) else None,
                    step.loss_was_weighted_for(self),
                    lambda global_grads: original(self, global_grads, trainable_variables)))
                return None
            grads = strategy.extended.aggregate_gradients(
                grads, variables=variables if len(variables) == len(grads) else None,
                weighted_in_loss=step.loss_was_weighted_for(self))
            with step.aggregated_gradients():
                return original(self, grads, trainable_variables)

        return apply

    def share_weighted(original):
        def scale_loss(self, loss):
            step = replica_step.current()
            loss = original(self, loss)
            if step is None or step.scaled_by_user or not scales_loss(self):
                return loss
            return step.weight_loss(self, loss)

        return scale_loss

    for optimizer_class in (BaseOptimizer, LossScaleOptimizer):
        optimizer_class.apply = aggregating(optimizer_class.apply)
        optimizer_class.scale_loss = share_weighted(optimizer_class.scale_loss)

    all_reduce_sum_gradients = TFOptimizer._all_reduce_sum_gradients  # pylint: disable=protected-access

    def _all_reduce_sum_gradients(self, grads_and_vars):
        step = replica_step.current()
        if step is not None and step.gradients_aggregated:
            return list(grads_and_vars)
        return all_reduce_sum_gradients(self, grads_and_vars)

    TFOptimizer._all_reduce_sum_gradients = _all_reduce_sum_gradients  # pylint: disable=protected-access


def _install_batch_level_metric_updates():
    """Mark `Mean` updates with one unweighted scalar as batch-level (see `replica_step`)."""
    update_state = keras.metrics.Mean.update_state

    def mean_update_state(self, values, sample_weight=None):
        step = replica_step.current()
        if step is not None and sample_weight is None and len(getattr(values, "shape", ())) == 0:
            step.note_batch_level_update(
                getattr(v, "_value", v) for v in self.variables)  # Keras -> tf.Variable
        return update_state(self, values, sample_weight=sample_weight)

    keras.metrics.Mean.update_state = mean_update_state


def _install_collective_stop_flags():
    """`stop_training` (and evaluate's/predict's flags) are decided by all ranks together.

    A callback may stop training on one rank only (its own clock, a local
    file); the others would then wait for it in the next step. When Keras'
    own fit/evaluate/predict loop reads a flag in a multi-process run (after
    every batch and epoch, on every rank alike), it is true if it is true on
    any rank, so all ranks stop after the same step. Any other read (a
    callback, TensorFlow's attribute tracking) sees this rank's own value.

    The exchange (one small all-reduce and a host sync per batch) is skipped
    while every callback list the model runs holds only callbacks that set
    no flag or set it from the global logs (`agrees_across_ranks`): then
    every rank decides the same.
    """
    trainer = keras_tf_trainer_module.TensorFlowTrainer
    loops = {inspect.unwrap(loop).__code__ for loop in (trainer.fit, trainer.evaluate,
                                                         trainer.predict)}
    loops = {code.co_filename for code in loops}, {code.co_name for code in loops}

    def read_by_keras_loop(frame):
        return frame.f_code.co_filename in loops[0] and frame.f_code.co_name in loops[1]

    for name in ("stop_training", "stop_evaluating", "stop_predicting"):
        attribute = f"_tfdist_{name}"

        def get(self, _attribute=attribute):
            local = bool(self.__dict__.get(_attribute, False))
            strategy = tfdist_strategy(self)
            frame = sys._getframe(1)  # pylint: disable=protected-access
            if (strategy is None or strategy.world_size == 1 or not read_by_keras_loop(frame)
                    or _stop_flags_agree(self)):
                return local
            return strategy.extended.any_rank(local, training=_attribute == "_tfdist_stop_training")

        def set_(self, value, _attribute=attribute):
            self.__dict__[_attribute] = value

        setattr(keras_trainer_module.Trainer, name, property(get, set_))


def _remember_callback_list(model, callback_list):
    lists = model.__dict__.setdefault("_tfdist_callback_lists", weakref.WeakSet())
    lists.add(callback_list)


def _stop_flags_agree(model):
    """True while every live callback list of `model` holds only agreeing callbacks."""
    lists = model.__dict__.get("_tfdist_callback_lists")
    return bool(lists) and all(type(callback) in _AGREEING_CALLBACKS
                               for callback_list in list(lists)
                               for callback in callback_list.callbacks)


def _rank_slice(value, rank, world_size):
    """This rank's rows of an array-like batch (unchanged if it has no rows)."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0:
        return value
    rows = int(shape[0])
    return value[(rank * rows) // world_size:((rank + 1) * rows) // world_size]


def _install_on_batch_sharding():
    """`train_on_batch`/`test_on_batch`/`predict_on_batch` take a global batch.

    As in `fit`, each rank works on its slice of the batch, so the update,
    the logs and the predictions (all rows, gathered) match one process.
    """
    for method_name in ("train_on_batch", "test_on_batch", "predict_on_batch"):
        original = getattr(keras.Model, method_name)

        def on_batch(self, *args, _original=original, **kwargs):
            strategy = tfdist_strategy(self)
            if strategy is not None and strategy.world_size > 1:
                slicer = lambda v: _rank_slice(v, strategy.rank, strategy.world_size)
                args = keras.tree.map_structure(slicer, args)
                kwargs = {key: (value if key in ("class_weight", "return_dict")
                                else keras.tree.map_structure(slicer, value))
                          for key, value in kwargs.items()}
            return _original(self, *args, **kwargs)

        setattr(keras.Model, method_name, on_batch)


def _install_generator_without_prefetch():
    """A Python generator's batches reach every rank in the same order.

    Keras' generator adapter builds a `tf.data` pipeline over ONE shared
    Python generator and prefetches it; Keras opens an extra iterator to
    peek at the first batch when it builds the model, and that iterator's
    prefetch thread pulls batches from the shared generator for as long as
    it lives - how many depends on timing, so ranks would train on slices of
    different batches. Under a multi-process strategy the pipeline is used
    without that prefetch and with tf.data's autotuning off (which otherwise
    reads ahead: `from_generator` pulls one element more than it is asked
    for, two behind a `map`), so each iterator takes exactly what it is asked
    for and the peeked batches are replayed, as Keras intends. A pipeline fed
    by a Python generator is bound by Python; nothing is lost.
    """
    get_tf_dataset = GeneratorDataAdapter.get_tf_dataset
    exact = tf.data.Options()
    exact.autotune.enabled = False

    def without_prefetch(self):
        dataset = get_tf_dataset(self)
        if _multi_process[0] and hasattr(dataset, "_input_dataset"):
            return dataset._input_dataset.with_options(exact)  # pylint: disable=protected-access
        return dataset

    GeneratorDataAdapter.get_tf_dataset = without_prefetch


_multi_process = [False]


def note_multi_process_strategy():
    """Called when this process creates a strategy with more than one worker."""
    _multi_process[0] = True


def _in_memory_fingerprint(adapter):
    """`data_fingerprint.array_fingerprint` of the arrays `fit` was given, or None."""
    if not isinstance(adapter, ArrayDataAdapter):
        return None
    return array_fingerprint(keras.tree.flatten(adapter._inputs))  # pylint: disable=protected-access


def install_data_recording():
    """Record the data of every epoch iterator, and compare epoch lengths across ranks.

    Every fit/evaluate/predict (and fit's validation) builds one epoch
    iterator on every rank in lockstep: the place to compare epoch lengths,
    and where `latest_data_batch_size` learns the global batch size.
    """
    global _data_recording_installed
    if _data_recording_installed:
        return
    _data_recording_installed = True
    epoch_iterator_init = TFEpochIterator.__init__

    def iterator_init(self, distribute_strategy=None, *args, **kwargs):
        global _latest_data_adapter
        # Only fit's training iterator passes class_weight (checked by check_keras).
        if (_is_tfdist_strategy(distribute_strategy) and "class_weight" not in kwargs
                and distribute_strategy.extended.remote_updates is not None):
            with distribute_strategy.extended.whole_batches():
                epoch_iterator_init(self, distribute_strategy, *args, **kwargs)
        else:
            epoch_iterator_init(self, distribute_strategy, *args, **kwargs)
        _latest_data_adapter = weakref.ref(self.data_adapter)
        if _is_tfdist_strategy(distribute_strategy) and distribute_strategy.world_size > 1:
            distribute_strategy.extended.check_same_data(
                self.num_batches, _in_memory_fingerprint(self.data_adapter))

    TFEpochIterator.__init__ = iterator_init


def install():
    """Patch Keras where multi-process training differs from one process (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    _install_loss_scaling()
    _install_global_loss_denominators()
    _install_build_without_peeking()
    _install_gradient_aggregation()
    _install_batch_level_metric_updates()
    _install_collective_stop_flags()
    _install_on_batch_sharding()
    _install_generator_without_prefetch()
    callback_list_init = keras.callbacks.CallbackList.__init__

    def init(self, callbacks=None, add_history=False, add_progbar=False, model=None, **params):
        if model is not None:
            _keep_collectives_out_of_xla(model)
            callbacks = _with_step_timeout(model, callbacks)
            callbacks = _with_server_parameters(model, callbacks)
            callbacks = _with_communication_profiling(model, callbacks)
            callbacks = _with_end_of_fit_barrier(model, callbacks)
        if model is not None and is_non_chief_model(model):
            callbacks = _for_non_chief(callbacks)
            add_progbar = False
        elif model is not None and tfdist_strategy(model) is not None:
            _with_atomic_backups(callbacks)
        if model is not None and _is_multi_process(model):
            _restored_by_the_chief(callbacks, tfdist_strategy(model))
        callback_list_init(self, callbacks, add_history=add_history,
                           add_progbar=add_progbar, model=model, **params)
        if model is not None and _is_multi_process(model):
            _remember_callback_list(model, self)

    keras.callbacks.CallbackList.__init__ = init

    install_data_recording()

    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            if is_non_chief_model(self):
                logging.log_first_n(
                    logging.INFO, "tfdist: Model.%s skipped on non-chief rank", 1, _name
                )
                return None
            if tfdist_strategy(self) is not None:
                return save_model_atomically(_original, self, *args, **kwargs)
            return _original(self, *args, **kwargs)

        setattr(keras.Model, method_name, chief_only)
