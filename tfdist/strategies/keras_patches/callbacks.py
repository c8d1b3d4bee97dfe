"""Callbacks: the multi-process policy every `fit` / `evaluate` / `predict` gets.

Added to (or removed from) each callback list Keras builds for a model under
a tfdist strategy, without changes to the user's script:

* non-chief ranks get no progress bar, and their `TensorBoard`,
  `ModelCheckpoint` and `CSVLogger` callbacks are dropped (the chief writes
  them); `BackupAndRestore` writes, deletes and reads backups on the chief
  only and resumes every rank at the next batch (`backup`);
* `jit_compile` is turned off for multi-process models (XLA cannot compile
  the cross-process collectives inside the step);
* every call of the compiled train/test/predict step is bounded by the job
  timeout (`_StepTimeout`): its collectives carry no op-level timeout;
* every rank's weights are compared at each epoch end and at the end of
  `fit`, which ends with a barrier (`_ReplicaConsistency`); with the asynchronous
  parameter server, the model follows the servers' parameters
  (`_ServerParameters`);
* next to a `TensorBoard` callback, tfdist's communication scalars are
  written into its run (`report.TensorBoardScalars`), and in a
  multi-process job its `profile_batch` profiles every rank, each into its
  own run `rank_<k>` (`rank_profiler.RankProfiler`), as does
  `tfdist-run --profile`.
"""


import keras

from tfdist import chief_log
from tfdist.profiling import rank_profiler, report
from tfdist.strategies import replica_consistency, variable_broadcast
from tfdist.fault_tolerance import backup_state
from tfdist.strategies.keras_patches import backup, callback_list
from tfdist.strategies.keras_patches.model_strategy import (agrees_across_ranks,
                                                            is_non_chief_model, tfdist_strategy)
from tfdist.strategies.keras_patches import patch_points


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


@agrees_across_ranks
class _ReplicaConsistency(keras.callbacks.Callback):
    """Every rank's weights compared at each epoch end and at the end of `fit`, which ends with
    the comparison's all-gather, a barrier: `fit` returns once the chief has written.

    The comparison (`replica_consistency`): at an epoch end each rank's
    fingerprint rides the next training step's all-reduce and is verified
    after it; at the end of `fit`, per-variable fingerprints are gathered.
    A difference stops every rank with `ReplicasDiverged`, naming the
    variables.

    The barrier: only the chief writes checkpoints (`ModelCheckpoint`,
    `BackupAndRestore`, `Model.save` in a callback). During training the
    next step's collective orders a rank after the chief's writes of the
    epoch before; after the last epoch nothing would, and a rank that reads
    the chief's file right after `fit` (`keras.models.load_model(best_path)`)
    could read the previous one. Runs last, after every other callback's
    hooks.

    Cost: one small all-gather per `fit`; per epoch, hashing the weights and
    2 P floats in the next step's all-reduce (`replica_consistency`).
    """

    def __init__(self, strategy):
        super().__init__()
        self._strategy = strategy
        self._epoch_end = replica_consistency.EpochEndCheck(
            strategy.extended.agreed_flags, strategy.extended.communicator)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch_end.post(replica_consistency.compared_variables(self.model),
                             f"at the end of epoch {epoch + 1}")

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_end.verify(replica_consistency.compared_variables(self.model))

    def on_train_end(self, logs=None):
        communicator = self._strategy.extended.communicator
        with communicator.expect_progress("the check of every rank's weights at the end of fit"):
            replica_consistency.check_now(
                communicator, replica_consistency.compared_variables(self.model),
                "at the end of fit")


@agrees_across_ranks
class _StartFromRankZero(keras.callbacks.Callback):
    """Per-rank input (Horovod's semantics): `fit` starts from rank 0's weights and optimizer
    state.

    Under per-rank input a variable is the rank's own from its creation
    (`DataParallelExtended._create_variable`), as in Horovod; every rank calls
    `fit`, so its start is where they are made alike - before the first step,
    so the first update is the one one process makes. It runs after the
    script's own callbacks' `on_train_begin`: Horovod's
    `BroadcastGlobalVariablesCallback(root_rank, local_variables=...)` has
    then made every rank hold `root_rank`'s values (this broadcast changes
    nothing) and declared its local variables each rank's own (left out here).
    Cost: one broadcast per dtype of the model and its optimizer's variables
    per `fit` (`variable_broadcast`).
    """

    def __init__(self, strategy):
        super().__init__()
        self._communicator = strategy.extended.communicator

    def on_train_begin(self, logs=None):
        with self._communicator.expect_progress("fit's start from rank 0's variables"):
            variable_broadcast.broadcast_variables(
                self._communicator, replica_consistency.compared_variables(self.model))


def _starting_from_rank_zero(model, callbacks):
    strategy = tfdist_strategy(model)
    if strategy is None or strategy.world_size == 1 or not strategy.extended.per_rank_input:
        return callbacks
    return list(callbacks) + [_StartFromRankZero(strategy)]


def _with_replica_consistency(model, callbacks):
    strategy = tfdist_strategy(model)
    if (strategy is None or strategy.world_size == 1
            or strategy.extended.remote_updates is not None):  # async: _ServerParameters
        return callbacks
    return list(callbacks) + [_ReplicaConsistency(strategy)]


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
    compressor keeps per-rank state (its `model.save` writes only that, `rank_state`) or the
    optimizer state is sharded (its `model.save` gives the chief this rank's slices)."""
    own_state = (backup_state.keeps_rank_state(strategy)
                 or strategy.extended.shard_optimizer_state)
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
            callbacks = _with_server_parameters(model, callbacks)
            callbacks = _with_communication_profiling(model, callbacks)
            callbacks = _with_replica_consistency(model, callbacks)
            callbacks = _starting_from_rank_zero(model, callbacks)
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
