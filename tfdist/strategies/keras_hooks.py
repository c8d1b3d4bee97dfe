"""Where tfdist meets Keras internals: step recognition and chief-only output.

Keras 3 has no notion of a chief process, so tfdist adds it where a user
would expect it, without changes to their script:

* non-chief ranks get no progress bar, and their `TensorBoard`,
  `ModelCheckpoint` and `CSVLogger` callbacks are dropped (the chief writes
  them); `BackupAndRestore` still restores on every rank but only the chief
  writes and deletes backups;
* `Model.save` / `Model.save_weights` are no-ops on non-chief ranks (every
  rank holds the same weights; one writer avoids clobbered files);
* `jit_compile` is turned off for multi-process models (XLA cannot compile
  the cross-process collectives inside the step);
* every call of the compiled train/test/predict step is bounded by the job
  timeout (`_StepTimeout`): its collectives carry no op-level timeout;
* the data adapter of the latest epoch iterator is remembered, so that
  callbacks can read the global batch size `fit` received
  (`latest_data_batch_size`).

These apply only to models built under a tfdist strategy on a non-chief
rank; everything else is untouched. `install()` is idempotent.
"""

import inspect
import weakref

import keras
from absl import logging
# Keras has no public hook where every rank builds its epoch iterator.
from keras.src.backend.tensorflow.trainer import TFEpochIterator
from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

from tfdist import _tf

_installed = False
_latest_data_adapter = None  # weak reference to the latest epoch iterator's data adapter
_CHIEF_ONLY_WRITERS = (
    keras.callbacks.TensorBoard,
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.ProgbarLogger,
)


def tfdist_strategy(model):
    """The tfdist strategy `model` was built under, or None."""
    strategy = getattr(model, "_distribute_strategy", None)
    return strategy if hasattr(strategy, "world_size") and hasattr(strategy, "is_chief") else None


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


def _with_step_timeout(model, callbacks):
    strategy = tfdist_strategy(model)
    communicator = getattr(getattr(strategy, "extended", None), "communicator", None)
    if communicator is None or not hasattr(communicator, "expect_progress"):
        return callbacks
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


def metric_logs_like(model, outputs):
    """The model's metric results, if the step returned logs with the same keys.

    Read after tfdist made the metric state global, they are the global logs;
    a custom step returning other keys gets None (its logs are kept as is).
    """
    if not isinstance(outputs, dict):
        return None
    logs = model.get_metrics_result()
    return logs if set(logs) == set(outputs) else None


def is_predict_step(fn):
    """True for the per-batch function of Keras' `predict`."""
    return "make_predict_function" in getattr(_unwrap(fn), "__qualname__", "")


def _restore_only(callback):
    """BackupAndRestore for a non-chief rank: restore, never write or delete."""
    callback._save_model = lambda *args, **kwargs: None  # pylint: disable=protected-access
    callback.on_train_end = lambda logs=None: None
    return callback


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


def install():
    """Patch Keras' CallbackList, TFEpochIterator and Model.save/save_weights (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    callback_list_init = keras.callbacks.CallbackList.__init__

    def init(self, callbacks=None, add_history=False, add_progbar=False, model=None, **params):
        if model is not None:
            _keep_collectives_out_of_xla(model)
            callbacks = _with_step_timeout(model, callbacks)
        if model is not None and is_non_chief_model(model):
            callbacks = _for_non_chief(callbacks)
            add_progbar = False
        callback_list_init(self, callbacks, add_history=add_history,
                           add_progbar=add_progbar, model=model, **params)

    keras.callbacks.CallbackList.__init__ = init

    # Every fit/evaluate/predict (and fit's validation) builds one epoch
    # iterator on every rank in lockstep: the place to compare epoch lengths.
    epoch_iterator_init = TFEpochIterator.__init__

    def iterator_init(self, distribute_strategy=None, *args, **kwargs):
        global _latest_data_adapter
        epoch_iterator_init(self, distribute_strategy, *args, **kwargs)
        _latest_data_adapter = weakref.ref(self.data_adapter)
        if getattr(distribute_strategy, "world_size", 1) > 1:
            distribute_strategy.extended.check_same_number_of_batches(self.num_batches)

    TFEpochIterator.__init__ = iterator_init

    for method_name in ("save", "save_weights"):
        original = getattr(keras.Model, method_name)

        def chief_only(self, *args, _original=original, _name=method_name, **kwargs):
            if is_non_chief_model(self):
                logging.log_first_n(
                    logging.INFO, "tfdist: Model.%s skipped on non-chief rank", 1, _name
                )
                return None
            return _original(self, *args, **kwargs)

        setattr(keras.Model, method_name, chief_only)
