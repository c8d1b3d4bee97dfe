"""The tape: what `GradientTape.gradient` returns inside a tfdist step is what one process sees.

One patch of `tf.GradientTape.gradient`, active only inside a step of a
multi-process tfdist strategy (`replica_step.current()`); everywhere else the
tape is TensorFlow's. Two rules, in order:

* a hand-written ratio of batch sums (`sum(w * l) / max(sum(w), 1)`, which no
  `keras.losses.Loss` sees) differentiated directly by a custom step is scaled
  by the factor that makes it the global ratio (`ReplicaStep.ratio_factor`: a
  constant of the backward pass, d(c L) = c dL);
* in a step whose user code stands between the backward pass and the update
  (`StepPlan.gradients_global_at_tape`: a custom `train_step`, a function run
  by `strategy.run`), the gradients with respect to *variables* are made
  global here - each rank's weighted by its share and summed over the ranks
  (`GlobalGradients.aggregate`), the semantics of PyTorch's DDP and Horovod's
  `DistributedGradientTape`. What the user's code does with them (clipping by
  global norm, logging the norm, adding gradients of two losses) then gives
  one process's answer, and `apply` sums them no more
  (`ReplicaStep.global_at_tape`); the script's own all-reduce of them (the
  MultiWorkerMirroredStrategy habit) is an identity, as on one process.
  Gradients with respect to tensors (an input's, a gradient penalty's) stay
  the rank's own.

Left as the rank's own, where making them global could not be right: a
tape's gradient taken while another tape still records (a second-order
term: the all-reduce would be differentiated), `tfdist.horovod`'s
`DistributedGradientTape` (it reduces them itself, as Horovod), and the
asynchronous parameter server's workers (each pushes its own gradient).

Cost: one fused all-reduce of the gradients at the tape instead of at
`apply` - the same bytes; a custom step's metric state is summed at the
step's end in a second collective, as before.
"""

import functools
import threading

import keras
import tensorflow as tf

from tfdist import _tf
from tfdist.strategies.keras_surface import patch_points
from tfdist.strategies.keras_surface.model_strategy import (in_multi_process_strategy,
                                                            is_tfdist_strategy)
from tfdist.strategies.step import replica_step

_own_reduction = threading.local()  # .active: inside a tape that reduces its gradients itself


class reducing_itself:  # pylint: disable=invalid-name
    """Inside: tapes' gradients stay the rank's own (a tape that reduces them itself,
    `tfdist.horovod`'s `DistributedGradientTape`)."""

    def __enter__(self):
        self._previous = getattr(_own_reduction, "active", False)
        _own_reduction.active = True

    def __exit__(self, *exc):
        _own_reduction.active = self._previous


def _is_variable(source):
    return isinstance(source, (tf.Variable, keras.Variable))


def _scaled_gradient(gradient, factor):
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def _made_global(step, target, sources, gradients):
    """`gradients` (the structure of `sources`) with those of variables made global."""
    if (not step.plan.gradients_global_at_tape or step.gradients_aggregated
            or getattr(_own_reduction, "active", False) or _tf.a_tape_records()):
        return gradients
    strategy = tf.distribute.get_strategy()
    if not is_tfdist_strategy(strategy):
        return gradients
    flat_sources = tf.nest.flatten(sources)
    flat_gradients = tf.nest.flatten(gradients)
    if len(flat_sources) != len(flat_gradients):
        return gradients  # a composite source: left as TensorFlow gives it
    placement = strategy.extended.placement  # a sharded parameter's: global already
    chosen = [i for i, (s, g) in enumerate(zip(flat_sources, flat_gradients))
              if g is not None and _is_variable(s) and not placement.reduced_in_backward(s)]
    if not chosen:
        return gradients
    variables = [flat_sources[i] for i in chosen]
    summed = strategy.extended.aggregate_gradients(
        [flat_gradients[i] for i in chosen], variables=variables,
        weighted_in_loss=step.carries_share(target))
    step.note_global_at_tape(variables, summed)
    for i, gradient in zip(chosen, summed):
        flat_gradients[i] = gradient
    return tf.nest.pack_sequence_as(gradients, flat_gradients)


def install():
    """The tape patch (see the module docstring)."""
    gradient = tf.GradientTape.gradient

    @functools.wraps(gradient)
    def gradient_in_step(self, target, sources, *args, **kwargs):
        gradients = gradient(self, target, sources, *args, **kwargs)
        step = replica_step.current()
        if step is None or not in_multi_process_strategy():
            return gradients
        if isinstance(target, tf.Tensor) and target.shape.rank == 0:
            factor = step.ratio_factor(target)
            if factor is not None:
                gradients = tf.nest.map_structure(lambda g: _scaled_gradient(g, factor),
                                                  gradients)
        return _made_global(step, target, sources, gradients)

    patch_points.replace("tf.GradientTape", "gradient", gradient_in_step)
