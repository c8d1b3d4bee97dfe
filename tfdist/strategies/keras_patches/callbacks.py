"""Callbacks: the multi-process policy every `fit` / `evaluate` / `predict` gets.

Added to (or removed from) each callback list Keras builds for a model under
a tfdist strategy, without changes to the user's script:

* non-chief ranks get no progress bar, and their `TensorBoard`,
  `ModelCheckpoint` and `CSVLogger` callbacks are dropped (the chief writes
  them; a `ModelCheckpoint` is kept in a job across hosts, where its saves
  give each host the chief's file); `BackupAndRestore` writes, deletes and reads backups on the chief
  only and resumes every rank at the next batch (`backup`);
* `jit_compile` is turned off for multi-process models (XLA cannot compile
  the cross-process collectives inside the step);
* every call of the compiled train/test/predict step is bounded by the job
  timeout (`_StepTimeout`): its collectives carry no op-level timeout;
* the strategy's modes add theirs (`extended.fit_callbacks`): every rank's
  weights compared at each epoch end and at the end of `fit`, which ends
  with a barrier (synchronous updates), the model following the servers'
  parameters (asynchronous updates), `fit` starting from rank 0's variables
  (per-rank input);
* next to a `TensorBoard` callback, tfdist's communication scalars are
  written into its run (`report.TensorBoardScalars`), and in a
  multi-process job its `profile_batch` profiles every rank, each into its
  own run `rank_<k>` (`rank_profiler.RankProfiler`), as does
  `tfdist-run --profile`.
"""


import keras

from tfdist import chief_log
from tfdist.profiling import rank_profiler, report
from tfdist.strategies.state import rank_state
from tfdist.strategies.keras_patches import backup, callback_list
from tfdist.strategies.keras_surface.model_strategy import (agrees_across_ranks,
                                                            is_non_chief_model, tfdist_strategy)
from tfdist.strategies.keras_surface import patch_points


agrees_across_ranks(report.TensorBoardScalars)
agrees_across_ranks(rank_profiler.RankProfiler)


_CHIEF_ONLY_WRITERS = (
    keras.callbacks.TensorBoard,
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.ProgbarLogger,
)


def _keep_collectives_out_of_xla(model):
    """XLA cannot compile TensorFlow's cross-process collective ops: run the step unjitted."""
    strategy = tfdist_strategy(model)
    if strategy is not None and strategy.world_size > 1 and model.jit_compile:
        chief_log.warning(strategy.is_chief, "tfdist: jit_compile disabled for %s: the step "
                          "contains cross-process collectives, which XLA cannot compile.",
                          model.name)
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


def _with_mode_callbacks(model, callbacks):
    """The strategy's modes' callbacks (`extended.fit_callbacks`): the weights check at each
    epoch end and a barrier at the end of fit (synchronous), the servers' parameters
    (asynchronous), fit's start from rank 0's variables (per-rank input)."""
    strategy = tfdist_strategy(model)
    if strategy is None:
        return callbacks
    callbacks = keras.tree.flatten(callbacks) if callbacks else []
    return callbacks + strategy.extended.fit_callbacks()


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
        added.append(report.TensorBoardScalars(
            strategy, lambda board=board: board._train_writer, board.update_freq))
        if board._should_trace:  # profile_batch: each rank profiles into its own run instead
            board._tfdist_profile_batches = (board._start_batch, board._stop_batch)
            board._should_trace = False
        batches = getattr(board, "_tfdist_profile_batches", None)
        if batches is not None:
            added.append(rank_profiler.RankProfiler(board.log_dir, *batches, strategy.rank,
                                                    strategy.extended.communicator))
    requested = rank_profiler.profiler_from_environment(strategy.rank,
                                                        strategy.extended.communicator)
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


def _for_non_chief(callbacks, strategy):
    """A non-chief rank's callbacks: no writers, except `ModelCheckpoint` where the gradient
    compressor keeps per-rank state (its `model.save` writes only that, `rank_state`), the
    optimizer state is sharded (its `model.save` gives the chief this rank's slices), or the
    job spans hosts (its `model.save` gives this host the chief's file: `chief_saves`)."""
    own_state = (rank_state.keeps_rank_state(strategy)
                 or strategy.extended.placement.every_rank_saves
                 or strategy.extended.chief_saves is not None)
    return [callback for callback in (keras.tree.flatten(callbacks) if callbacks else [])
            if not isinstance(callback, _CHIEF_ONLY_WRITERS)
            or (own_state and isinstance(callback, keras.callbacks.ModelCheckpoint))]


def install():
    """Every `CallbackList` of a tfdist model gets the multi-process policy above."""
    callback_list_init = keras.callbacks.CallbackList.__init__

    def init(self, callbacks=None, add_history=False, add_progbar=False, model=None, **params):
        if model is not None:
            _keep_collectives_out_of_xla(model)
            callbacks = _with_step_timeout(model, callbacks)
            callbacks = _with_communication_profiling(model, callbacks)
            callbacks = _with_mode_callbacks(model, callbacks)
        if model is not None and is_non_chief_model(model):
            callbacks = _for_non_chief(callbacks, tfdist_strategy(model))
            add_progbar = False
        if model is not None:
            backup.prepare(callbacks, model)
        callback_list_init(self, callbacks, add_history=add_history,
                           add_progbar=add_progbar, model=model, **params)
        if tfdist_strategy(model) is not None:
            callback_list.adopt(self)

    patch_points.replace("keras.callbacks.CallbackList", "__init__", init)
