"""How the tfdist learning-rate callbacks compose: one controller per model sets the rate.

`LearningRateScaling`, `LearningRateWarmup` and `LearningRateSchedule` are
terms of one formula. Before every call of the train function, for the step
t about to run (t = `optimizer.iterations`; the fractional epoch is
e = t / S with S steps per epoch), the optimizer's learning rate becomes

    rate(t) = W(t) * M_1(e) * ... * M_n(e)

* the *base* rate: `LearningRateScaling`'s `base_lr * f(global batch /
  base_batch_size)` if it is present, else the optimizer's learning rate as
  the callbacks first found it (not the value they last wrote, so a second
  `fit` does not compound);
* W(t): `LearningRateWarmup`'s linear ramp from its initial to its target
  rate over its warmup steps, then the target (the base rate by default);
  without a warmup, W(t) is the base rate;
* M_i(e): the multiplier of each `LearningRateSchedule` inside its window,
  1 outside it.

So scaling comes first, then warmup, then the schedules, whatever order the
callbacks are listed in; the first of them in the callback list does the
work for all. The rate depends only on the optimizer's step counter, which
`keras.callbacks.BackupAndRestore` restores: a resumed run follows the same
trajectory. Cost: one read of the step counter and at most one variable
assignment per train-function call (plus the momentum buffers, when
momentum correction is on).
"""

import math
import sys
import weakref

import keras
import numpy as np

from tfdist.strategies.keras_patches import data as keras_data
from tfdist.strategies.keras_surface import model_strategy

# Without LearningRateScaling, warmup starts from target x 1/3 (PyTorch's LinearLR default).
DEFAULT_WARMUP_START_FACTOR = 1.0 / 3.0

_controllers = weakref.WeakKeyDictionary()  # model -> LearningRateController
_first_seen_rates = weakref.WeakKeyDictionary()  # optimizer -> _FirstSeenRate


class _FirstSeenRate:
    """An optimizer's own learning rate, and the last value the callbacks wrote."""

    def __init__(self, rate):
        self.rate = rate
        self.last_written = None


def _float32(value):
    return float(np.float32(value))


def _current_rate(optimizer):
    return _float32(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _check_float_rate(optimizer, who):
    rate = model_strategy.learning_rate_setting(optimizer)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or (
            callable(rate) and not isinstance(rate, keras.Variable)):
        raise ValueError(
            f"{who} sets the optimizer's learning rate, but {type(optimizer).__name__} was "
            f"created with a learning-rate schedule ({type(rate).__name__}), which cannot be "
            "set. Compile with a float learning rate and express the schedule with "
            "tfdist.callbacks.LearningRateSchedule (and LearningRateWarmup). "
            f"Got: learning_rate={rate!r}")


def velocity_buffers(optimizer):
    """The momentum buffers of an optimizer whose velocity includes the learning rate.

    Keras' SGD (v <- m v - lr g) and tfdist's LARS keep lr inside the
    velocity, so when lr changes by a factor r, scaling v by r keeps the
    update consistent (Goyal et al. 2017, section 2.2). Other optimizers
    (Adam, RMSprop, ...) apply lr outside their moments: this raises.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    if not (isinstance(inner, keras.optimizers.SGD)
            or getattr(inner, "velocity_includes_learning_rate", False)):
        raise ValueError(
            "momentum_correction rescales a velocity that includes the learning rate: it "
            "applies to keras.optimizers.SGD and tfdist.optimizers.LARS. "
            f"Got: {type(inner).__name__}")
    return list(getattr(inner, "momentums", None) or [])


class LearningRateTerm(keras.callbacks.Callback):
    """Base of the tfdist learning-rate callbacks: each is one term of the model's rate.

    Subclasses set `kind` ("scaling", "warmup" or "schedule") and
    `steps_per_epoch` (None: from `fit`); the controller reads their
    settings. Users do not subclass this.
    """

    kind = None
    steps_per_epoch = None

    def __init__(self):
        super().__init__()
        # The global batch size comes from the data `fit` receives, also without a tfdist
        # strategy: from now on, epoch iterators record their data (nothing else is patched).
        keras_data.install_data_recording()

    def set_model(self, model):
        super().set_model(model)
        self._controller = controller_for(model)
        self._controller.register(self)

    def on_train_begin(self, logs=None):
        self._controller.train_begin(self)

    def on_train_batch_begin(self, batch, logs=None):
        self._controller.batch_begin(self)

    def on_train_batch_end(self, batch, logs=None):
        self._controller.write_rate(self, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._controller.write_rate(self, logs)


def controller_for(model):
    controller = _controllers.get(model)
    if controller is None:
        controller = _controllers[model] = LearningRateController(model)
    return controller


class RatePlan:
    """The rate formula of one `fit`: which terms take part, and their resolved values."""

    def __init__(self, terms, optimizer, first_seen_rate, params, world_size, global_batch_size):
        self.leader = terms[0]
        self.optimizer = optimizer
        by_kind = {"scaling": [], "warmup": [], "schedule": []}
        for term in terms:
            by_kind[term.kind].append(term)
        for kind in ("scaling", "warmup"):
            if len(by_kind[kind]) > 1:
                raise ValueError(f"fit received {len(by_kind[kind])} {type(by_kind[kind][0]).__name__}"
                                 " callbacks; use one.")
        self.scaling = by_kind["scaling"][0] if by_kind["scaling"] else None
        self.warmup = by_kind["warmup"][0] if by_kind["warmup"] else None
        self.schedules = by_kind["schedule"]
        self.world_size = world_size
        self.steps_per_epoch = self._resolve_steps_per_epoch(terms, params)
        self.base_rate = (self.scaling.scaled_rate(global_batch_size) if self.scaling
                          else first_seen_rate)
        if self.warmup:
            self.target_rate = (self.base_rate if self.warmup.target_lr is None
                                else self.warmup.target_lr)
            self.initial_rate = (self.warmup.initial_lr if self.warmup.initial_lr is not None
                                 else self.scaling.base_lr if self.scaling
                                 else self.target_rate * DEFAULT_WARMUP_START_FACTOR)
            self.warmup_steps = self.warmup.warmup_epochs * self.steps_per_epoch
        self.momentum_correction = bool(self.warmup and self.warmup.momentum_correction)
        if self.momentum_correction:
            velocity_buffers(optimizer)  # raises now for an unsuitable optimizer

    @staticmethod
    def _resolve_steps_per_epoch(terms, params):
        explicit = {t.steps_per_epoch for t in terms if t.steps_per_epoch is not None}
        if len(explicit) > 1:
            raise ValueError(f"the learning-rate callbacks disagree on steps_per_epoch. "
                             f"Got: {sorted(explicit)}")
        steps = explicit.pop() if explicit else (params or {}).get("steps")
        needs_epochs = any(t.kind != "scaling" for t in terms)
        if needs_epochs and not steps:
            raise ValueError(
                "LearningRateWarmup and LearningRateSchedule count epochs in steps, but fit does "
                "not know the number of steps per epoch (the data has no known length). Pass "
                "steps_per_epoch= to fit or to the callbacks.")
        return steps

    def rate_at(self, step):
        """rate(t) for the step `step` about to run."""
        if self.warmup is None:
            rate = self.base_rate
        elif step < self.warmup_steps:
            rate = self.initial_rate + (self.target_rate - self.initial_rate) * (
                step / self.warmup_steps)
        else:
            rate = self.target_rate
        epoch = step / self.steps_per_epoch if self.steps_per_epoch else 0.0
        for schedule in self.schedules:
            rate *= schedule.multiplier_at(epoch)
        return rate


class LearningRateController:
    """Sets the learning rate of one model's optimizer from the rate terms of the current `fit`.

    The terms of a `fit` are the registered callbacks that share its params
    dict (Keras gives the same dict to every callback of one `fit`), so the
    callbacks of an earlier `fit` do not take part.
    """

    def __init__(self, model):
        self._model = weakref.ref(model)
        self._terms = []  # weak references, in callback-list order
        self._plan = None
        self._plan_params = None

    def register(self, term):
        self._terms = [ref for ref in self._terms if ref() is not None and ref() is not term]
        self._terms.append(weakref.ref(term))
        optimizer = getattr(self._model(), "optimizer", None)
        if optimizer is None:
            return  # not compiled yet: checked at train begin
        # Recorded before any on_train_begin, i.e. before BackupAndRestore
        # loads a saved rate; a rate the user set since our last write is new.
        current = _current_rate(optimizer)
        seen = _first_seen_rates.get(optimizer)
        if seen is None or current != seen.last_written:
            _first_seen_rates[optimizer] = _FirstSeenRate(current)

    def train_begin(self, term):
        if self._plan is not None and self._plan_params is term.params:
            return
        model = self._model()
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(f"{type(term).__name__} sets the optimizer's learning rate, but "
                             f"model {model.name!r} has no optimizer: compile it first.")
        _check_float_rate(optimizer, type(term).__name__)
        terms = [ref() for ref in self._terms]
        terms = [t for t in terms if t is not None and t.params is term.params]
        strategy = model_strategy.tfdist_strategy(model)
        seen = _first_seen_rates.get(optimizer) or _FirstSeenRate(_current_rate(optimizer))
        batch_size = model_strategy.latest_data_batch_size()
        if batch_size is not None and strategy is not None:
            batch_size = strategy.extended.input_mode.global_batch_size(batch_size,
                                                                        strategy.world_size)
        self._plan = RatePlan(
            terms, optimizer, seen.rate, term.params,
            world_size=strategy.world_size if strategy is not None else 1,
            global_batch_size=batch_size)
        self._plan_params = term.params
        if self._plan.scaling is not None and self._plan.scaling.verbose and (
                strategy is None or strategy.is_chief):
            print(self._plan.scaling.describe(), file=sys.stdout, flush=True)

    def batch_begin(self, term):
        plan = self._plan
        if plan is None or term is not plan.leader:
            return
        optimizer = plan.optimizer
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        new = _float32(plan.rate_at(step))
        current = _current_rate(optimizer)
        if new == current:
            return
        if plan.momentum_correction and current > 0:
            ratio = new / current
            for buffer in velocity_buffers(optimizer):  # created when the optimizer is built
                buffer.assign(buffer * ratio)
        optimizer.learning_rate = new
        seen = _first_seen_rates.get(optimizer)
        if seen is not None:
            seen.last_written = new

    def write_rate(self, term, logs):
        plan = self._plan
        if plan is not None and term is plan.leader and logs is not None:
            logs["learning_rate"] = _current_rate(plan.optimizer)


def check_positive(name, value, allow_none=False, integer=False):
    """Raise a ValueError showing `value` unless it is a positive number (or None if allowed)."""
    if value is None and allow_none:
        return
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0 or (
            not integer and not math.isfinite(value)):
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"`{name}` must be {what}{' or None' if allow_none else ''}. "
                         f"Got: {name}={value!r}")
