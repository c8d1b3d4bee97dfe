"""Custom loops: a Keras model called on an empty slice runs on a stand-in row.

In a user's function run by `strategy.run` (a custom loop), the outermost
Keras layer call - the model, or a layer the function calls directly - on
zero rows runs on one row of zeros and its outputs are cut back to zero rows
(`empty_slice.call_on_rows`, which says why and what it guarantees). Layers
called inside it are not wrapped again; Keras' own steps give their inputs a
stand-in row before any layer sees them, so this patch does nothing there.

Installed at the first custom-loop step a tfdist strategy traces (or runs
eagerly), not with the other patches: a process that only calls `fit`, or
uses no tfdist strategy, keeps Keras' `Layer.__call__`. Cost once installed:
one thread-local read per layer call outside a custom-loop step.
"""

import threading

import keras

from tfdist.strategies.step import empty_slice, replica_step
from tfdist.strategies.keras_surface.keras_internals import get_keras_mask, set_keras_mask
from tfdist.strategies.keras_surface import patch_points

_local = threading.local()
_install_lock = threading.Lock()  # simulated ranks (threads) trace their first steps at once
_installed = []


def install():
    """Route the outermost layer call of a custom loop's step through `call_on_rows` (once per
    process; idempotent)."""
    with _install_lock:
        if not _installed:
            _install()
            _installed.append(True)


def _install():
    layer_call = keras.layers.Layer.__call__

    def call_on_rows_in_custom_loops(self, *args, **kwargs):
        step = replica_step.current()
        if step is None or not step.scaled_by_user or getattr(_local, "inside", False):
            return layer_call(self, *args, **kwargs)
        _local.inside = True
        try:
            return empty_slice.call_on_rows(
                lambda *a, **k: layer_call(self, *a, **k), args, kwargs,
                mask_of=get_keras_mask, set_mask=set_keras_mask,
                stand_in_scope=step.stand_in_scope)
        finally:
            _local.inside = False

    patch_points.replace("keras.layers.Layer", "__call__", call_on_rows_in_custom_loops)
