"""Layers that own sharded parameters: their training calls recomputed in the backward pass.

With `sharding="parameters"`, a layer call inside a training step (a tfdist
step while a gradient tape records) by a layer that itself owns sharded
parameters runs through `parameter_recompute.call_recomputed`, so its
gathered parameters do not live until its backward pass. Other calls
(evaluation, prediction, layers without parameters of their own, layers
with non-trainable state, one process) are Keras' own.

Installed when the first sharded parameter is created (on demand, like
`empty_slices`): a process that never shards parameters keeps Keras'
`Layer.__call__`. Cost once installed: a look at the layer's own
trainable variables per layer call.
"""

import threading

import keras

from tfdist import _tf
from tfdist.strategies.keras_surface import patch_points
from tfdist.strategies.modes import parameter_recompute, parameter_shards
from tfdist.strategies.step import replica_step

_install_lock = threading.Lock()
_installed = []


def install():
    """Route training calls of layers owning sharded parameters (once per process)."""
    with _install_lock:
        if not _installed:
            _install()
            _installed.append(True)


def _holds_state(layer) -> bool:
    """The layer has non-trainable variables its call reads or changes (BatchNorm's moving
    statistics, a GRU's dropout seed). Such a call is not recomputed: replaying its state
    from before the forward pass (Keras' `StatelessScope`) was exact on Keras 3.14 and not
    on 3.16's development build (BatchNorm), so its gathered parameters live until its
    backward pass instead - the small layers; Dense, convolutions, embeddings and
    attention's projections hold none."""
    return any(not v.trainable for v in getattr(layer, "variables", ()))


def _owns_sharded_parameters(layer) -> bool:
    """The layer's own trainable variables include sharded parameters placed to be resharded
    after the forward pass (`reshard_after_forward`, the default); a recurrent layer's
    cell counts as its own (the cell runs inside the recurrence's loop, where a recomputed
    call cannot be traced: the whole recurrence is recomputed instead)."""
    own = list(getattr(layer, "_trainable_variables", ()))
    if isinstance(layer, keras.layers.RNN):
        own += list(getattr(layer.cell, "trainable_variables", ()))
    return any(getattr(parameter_shards.shard_of(v), "reshard_after_forward", False)
               for v in own)


def _install():
    layer_call = keras.layers.Layer.__call__

    def call_resharding(self, *args, **kwargs):
        step = replica_step.current()
        if (step is None or not _tf.a_tape_records() or not step.in_step_body()
                or not _owns_sharded_parameters(self) or _holds_state(self)):
            return layer_call(self, *args, **kwargs)
        return parameter_recompute.call_recomputed(self, layer_call, args, kwargs)

    patch_points.replace("keras.layers.Layer", "__call__", call_resharding)
