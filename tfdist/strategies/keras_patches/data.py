"""Data: the batches every rank sees, as one process would see them.

Keras builds a model under a tfdist strategy from the data's element spec
(no peeked batch), `*_on_batch` take a global batch, a Python generator's
batches reach every rank in the same order, and every epoch iterator is
recorded (the global batch size for the callbacks) and compared across
ranks (the same number of batches, the same in-memory data and the same
arguments of the call: `call_arguments`).
"""

import contextlib
import functools
import inspect

import keras
import tensorflow as tf
from absl import logging

from tfdist import chief_log, errors
from tfdist.fault_tolerance.restarts import PREEMPTED_EXIT_CODE
from tfdist.strategies.inputs import call_arguments
from tfdist.strategies.keras_patches import backup
from tfdist.strategies.keras_surface import fit_session
from tfdist.strategies.inputs.data_fingerprint import array_fingerprint
from tfdist.strategies.keras_surface import keras_internals
from tfdist.strategies.keras_surface.keras_internals import (ArrayDataAdapter, GeneratorDataAdapter,
                                                              TFEpochIterator)
from tfdist.strategies.keras_surface.model_strategy import (any_multi_process_strategy,
                                                             latest_data_batch_size,
                                                             is_tfdist_strategy,
                                                             refuse_training_outside_scope,
                                                             tfdist_strategy)
from tfdist.strategies.keras_surface import patch_points


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
    trainer = keras_internals.Trainer
    maybe_symbolic_build = trainer._maybe_symbolic_build  # pylint: disable=protected-access

    @functools.wraps(maybe_symbolic_build)  # check_keras reads the original through it
    def build_from_spec(self, iterator=None, data_batch=None):
        dataset = getattr(iterator, "_distributed_dataset", None)
        if (data_batch is not None or dataset is None
                or not is_tfdist_strategy(self._distribute_strategy)):
            return maybe_symbolic_build(self, iterator=iterator, data_batch=data_batch)
        spec = tf.nest.map_structure(
            lambda s: None if isinstance(s, tf.OptionalSpec) else s, dataset.element_spec)
        with self.distribute_strategy.scope():
            with _optimizer_left_unbuilt(self):
                try:
                    self._symbolic_build(data_batch=spec)  # pylint: disable=protected-access
                except RuntimeError as error:
                    # A model Keras cannot build symbolically (keras.io's GAN has no `call`):
                    # built when its step is traced, as Keras does without a strategy.
                    logging.log_first_n(logging.INFO, "tfdist: %s is built when its step is "
                                        "traced (%s)", 1, self.name, str(error).split(".")[0])
                    return
            if fit_session.is_fit_iterator(iterator):
                _build_optimizer_as_in_a_step(self)

    patch_points.replace("Trainer", "_maybe_symbolic_build", build_from_spec)


def _build_optimizer_as_in_a_step(model):
    """`fit`: build the optimizer now, as one process does in its first step.

    One process (no strategy: no symbolic build) builds it while tracing its
    first training step: the variables are created and initialized, while
    the assignments `build` makes besides (`ScheduleFreeAdamW` copies the
    weights into its state) stay in a trace TensorFlow uses only to create
    variables, and never run; under `run_eagerly` its first step runs them.
    Built here, eagerly, with the optimizer's own assignments dropped in the
    traced case, the state is the same and the step is traced once (a
    function that creates variables is traced twice).
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or optimizer.built or not model.trainable_variables:
        return
    variables = list(model.trainable_variables)
    if model.run_eagerly:
        optimizer.build(variables)
        return
    with _assignments_dropped(optimizer):
        optimizer.build(variables)


@contextlib.contextmanager
def _assignments_dropped(optimizer):
    """Inside, `optimizer.assign` / `assign_add` / `assign_sub` (and those of the optimizers
    it wraps) do nothing."""
    optimizers = []
    while optimizer is not None:
        optimizers.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    for each in optimizers:
        for name in ("assign", "assign_add", "assign_sub"):
            patch_points.replace_on_instance(each, "BaseOptimizer", name,
                                             lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for each in optimizers:
            for name in ("assign", "assign_add", "assign_sub"):
                delattr(each, name)


@contextlib.contextmanager
def _optimizer_left_unbuilt(model):
    """Keras' symbolic build also builds the optimizer; inside, it does not.

    An optimizer whose `build` does more than create variables
    (`ScheduleFreeAdamW` copies the weights into its state) must start from
    the state one process's does. `fit` builds it after the symbolic build
    (`_build_optimizer_as_in_a_step`); an `evaluate` before any `fit` leaves it
    unbuilt, or a `load_weights` then restores optimizer state one process
    would not. A resume builds it before it restores the backup
    (`backup_state`).
    """
    optimizer = getattr(model, "optimizer", None)
    hide = optimizer is not None and not optimizer.built
    if hide:
        optimizer.built = True  # what _symbolic_build reads
    try:
        yield
    finally:
        if hide:
            optimizer.built = False


def _install_on_batch_slicing():
    """`train_on_batch`/`test_on_batch`/`predict_on_batch` take their batch as `fit` does:
    the input mode's (`on_batch_arguments`: under the global-batch mode each rank works on
    its slice, so the update, the logs and the gathered predictions match one process)."""
    for method_name in ("train_on_batch", "test_on_batch", "predict_on_batch"):
        original = getattr(keras.Model, method_name)

        def on_batch(self, *args, _original=original, _method_name=method_name, **kwargs):
            strategy = tfdist_strategy(self)
            if strategy is None and _method_name == "train_on_batch":
                refuse_training_outside_scope(self, _method_name)
            if strategy is not None and strategy.world_size > 1:
                args, kwargs = strategy.extended.input_mode.on_batch_arguments(
                    args, kwargs, strategy.rank, strategy.world_size)
            return _original(self, *args, **kwargs)

        patch_points.replace("keras.Model", method_name, on_batch)


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

    @functools.wraps(get_tf_dataset)  # check_keras reads the original through it
    def without_prefetch(self):
        dataset = get_tf_dataset(self)
        if any_multi_process_strategy() and hasattr(dataset, "_input_dataset"):
            return dataset._input_dataset.with_options(exact)  # pylint: disable=protected-access
        return dataset

    patch_points.replace("GeneratorDataAdapter", "get_tf_dataset", without_prefetch)


def _in_memory_fingerprint(adapter):
    """`data_fingerprint.array_fingerprint` of the arrays `fit` was given, or None."""
    if not isinstance(adapter, ArrayDataAdapter):
        return None
    return array_fingerprint(keras.tree.flatten(adapter._inputs))  # pylint: disable=protected-access


_data_recording_installed = False


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
        # Only fit's training iterator passes class_weight (checked by check_keras).
        training = "class_weight" in kwargs
        scope = (distribute_strategy.extended.epoch_data_scope(training)
                 if is_tfdist_strategy(distribute_strategy) else contextlib.nullcontext())
        with scope:
            epoch_iterator_init(self, distribute_strategy, *args, **kwargs)
        fit_session.record_data_adapter(self.data_adapter)
        call = fit_session.current()
        if training and call is not None and call.name == "fit":
            call.fit_iterator = self  # a resume replays its data to the backup
        if is_tfdist_strategy(distribute_strategy) and distribute_strategy.world_size > 1:
            if training:
                _state_the_split(distribute_strategy)
            distribute_strategy.extended.check_same_data(
                self.num_batches, _in_memory_fingerprint(self.data_adapter),
                call.signature if call is not None else None)

    patch_points.replace("TFEpochIterator", "__init__", iterator_init)
    _install_call_recording()


def _state_the_split(strategy):
    """The chief says once how fit's batches are split across the processes."""
    batch_size = latest_data_batch_size()
    if batch_size is not None:
        chief_log.info(strategy.is_chief, "tfdist: %s",
                       strategy.extended.input_mode.describe_split(batch_size,
                                                                   strategy.world_size),
                       once=True)


def _install_call_recording():
    """fit/evaluate/predict record their arguments for the epoch iterators they build."""
    trainer = keras_internals.Trainer
    for name in call_arguments.CALLS:
        original = getattr(trainer, name)
        signature = inspect.signature(original)

        @functools.wraps(original)  # check_keras reads the originals through them
        def recorded(self, *args, _original=original, _name=name, _signature=signature,
                     **kwargs):
            if not is_tfdist_strategy(getattr(self, "_distribute_strategy", None)):
                if _name == "fit":
                    refuse_training_outside_scope(self, _name)
                return _original(self, *args, **kwargs)
            bound = _signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments, steps_per_execution=self.steps_per_execution)
            arguments.pop("kwargs", None)
            arguments[call_arguments.STATE_SAVERS] = (
                self._distribute_strategy.extended.placement.state_savers(
                    arguments.get("callbacks")))
            try:
                with fit_session.running(self, _name,
                                         call_arguments.call_signature(_name, arguments)):
                    return _original(self, *args, **kwargs)
            except errors.Preempted:  # every rank backed up at the agreed step: a planned exit
                raise SystemExit(PREEMPTED_EXIT_CODE) from None
            finally:
                if _name == "fit":
                    backup.after_fit(self)  # also when fit raised: preemption disarmed

        patch_points.replace("Trainer", name, recorded)


def install():
    """The data patches above (`install_data_recording` may come earlier, alone)."""
    _install_build_without_peeking()
    _install_on_batch_slicing()
    _install_generator_without_prefetch()
    install_data_recording()
