"""What a model's tfdist strategy is, for the patches and the callbacks layer.

The small, stable API the rest of tfdist uses to ask about a Keras model
or callback: the tfdist strategy a model was built under
(`tfdist_strategy`), whether this rank is the chief of a multi-process job,
the asynchronous parameter-server client, an optimizer's learning-rate
setting, the global batch size the latest `fit` received
(`latest_data_batch_size`), and which callback classes decide their stop
flags alike on every rank (`agrees_across_ranks`). It imports nothing of
the strategies, so any layer above may use it without a cycle.
"""

import threading

import keras
import tensorflow as tf

from tfdist import _tf
from tfdist import runtime
from tfdist.errors import NotDistributedError
from tfdist.strategies.keras_surface import fit_session, patch_points
from tfdist.strategies.keras_surface.keras_internals import TFDatasetAdapter


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


def agrees(callback):
    """True if `callback`'s exact class is marked `agrees_across_ranks` (its class before tfdist
    gave it tfdist's hooks, `patch_points.adopt`)."""
    return patch_points.keras_class(callback) in _AGREEING_CALLBACKS


def learning_rate_setting(optimizer):
    """What `optimizer` was created with as its learning rate (a float, variable or schedule)."""
    return getattr(optimizer, "_learning_rate", None)


def tfdist_strategy(model):
    """The tfdist strategy `model` was built under, or None."""
    strategy = getattr(model, "_distribute_strategy", None)  # pylint: disable=protected-access
    return strategy if is_tfdist_strategy(strategy) else None


def staleness_source(model):
    """What the staleness callbacks read of `model`'s strategy (its update mode's
    `staleness_source`: the asynchronous parameter server's client), or None."""
    strategy = tfdist_strategy(model)
    return strategy.extended.updates.staleness_source() if strategy is not None else None


def is_tfdist_strategy(strategy):
    """True for a tfdist strategy (`DataParallelStrategy` marks itself; no import of it here)."""
    return getattr(type(strategy), "is_tfdist_data_parallel", False) is True


# The multi-process tfdist strategy this process created ("" if none), as "Name (rank r of P)";
# a simulated rank (a thread bound to its communicator) keeps its own. `_any`: one was created by
# any thread of the process.
_process_strategy = [""]
HOROVOD_API = " under tfdist.horovod"  # the strategy hvd.init() makes the process default
_thread_strategy = threading.local()
_any = [False]


def note_multi_process_strategy(strategy, horovod_api=False):
    """`strategy`, with more than one worker, was created by this process (or simulated rank);
    `horovod_api`: by `hvd.init()` (`tfdist.horovod`), which makes it the process default."""
    described = (f"{type(strategy).__name__} (rank {strategy.rank} of {strategy.world_size} "
                 "processes)")
    if horovod_api:
        described += HOROVOD_API
    _any[0] = True
    if runtime.bound_to_communicator():
        _thread_strategy.described = described
    else:
        _process_strategy[0] = described


def any_multi_process_strategy():
    """True once any thread of this process created a tfdist strategy with more than one worker."""
    return _any[0]


def multi_process_strategy_created():
    """The multi-process tfdist strategy this process (or simulated rank) created, described,
    or "" if none."""
    if runtime.bound_to_communicator():
        return getattr(_thread_strategy, "described", "")
    return _process_strategy[0]


def refuse_training_outside_scope(model, call):
    """`NotDistributedError` if `model`, built outside any tfdist strategy's scope, is about to
    be trained (`call`: "fit", "train_on_batch") in a process that created a multi-process one.

    Keras ties a model to the strategy whose scope it was created in; a model
    created outside it trains on this process alone, and P processes train P
    independent copies, each printing its own progress, with exit code 0.
    """
    created = multi_process_strategy_created()
    if not created or tfdist_strategy(model) is not None:
        return
    if created.endswith(HOROVOD_API):
        raise NotDistributedError(
            f"tfdist: model {model.name!r} was created before hvd.init(), outside the "
            f"strategy tfdist.horovod sets there, so `{call}` would train it on this process "
            f"alone - every process an independent copy - though this process created "
            f"{created[:-len(HOROVOD_API)]}. Call hvd.init() before creating the model (and "
            "its optimizer), as Horovod's examples do.")
    raise NotDistributedError(
        f"tfdist: model {model.name!r} was created outside the strategy's scope, so `{call}` "
        f"would train it on this process alone - every process an independent copy - though "
        f"this process created {created}. Create and compile the model under the strategy's "
        "scope:\n"
        "    strategy = tfdist.strategies.RingAllReduceStrategy()\n"
        "    with strategy.scope():\n"
        "        model = build_model()\n"
        "        model.compile(...)\n"
        "    model.fit(...)\n"
        "(a model loaded with keras.models.load_model: load it under the scope too).")


def is_non_chief_model(model):
    strategy = tfdist_strategy(model)
    return strategy is not None and not strategy.is_chief


def in_multi_process_strategy():
    """True inside the scope of a tfdist strategy with more than one worker."""
    strategy = tf.distribute.get_strategy()
    return is_tfdist_strategy(strategy) and strategy.world_size > 1


def latest_data_batch_size():
    """Rows per batch of the data given to this thread's latest fit/evaluate/predict, or None.

    `fit` builds its training epoch iterator just before its callbacks'
    `on_train_begin`, so there it is the global batch size of the training
    data: the `batch_size` argument for arrays, the batch dimension for a
    batched `tf.data.Dataset` (read from the pipeline when not static).
    """
    adapter = fit_session.latest_data_adapter()
    if adapter is None:
        return None
    size = adapter.batch_size
    if size is None and isinstance(adapter, TFDatasetAdapter):
        size = int(_tf.static_batch_size(adapter.get_tf_dataset()))
    return int(size) if size is not None and size > 0 else None
