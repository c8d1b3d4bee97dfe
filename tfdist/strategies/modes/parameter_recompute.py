"""A layer whose parameters are sharded, gathered again in the backward pass: resharding after forward.

With `sharding="parameters"` a layer reads its parameters whole, gathered
from every rank (`parameter_shards`). TensorFlow's tape keeps an op's
inputs until its backward pass: left alone, every layer's gathered
parameters would live from the forward pass to the backward pass, and the
step's peak would hold the whole model once more. FSDP frees the gathered
storage after the forward pass and refills it in the backward pass; a
TensorFlow tensor has no storage to free, so the layer's forward pass is
recomputed instead (activation checkpointing at the layer):

* forward (`recomputed`, a `tf.custom_gradient` around the layer's call):
  the call runs after its inputs exist (control dependencies: its gathers
  wait for them, so layers gather one after another, not all at the step's
  start), and nothing of it is kept but its inputs;
* backward: after the upstream gradients exist, the call runs again under a
  tape - the parameters gathered again - and the gradients of its inputs
  and its parameters (reduce-scattered by the gather's gradient) are taken
  from it. A layer with non-trainable state (moving statistics, a seed) is
  not recomputed (`sharded_layer_calls`).

Guarantee: the recomputed call computes what the forward pass computed
(same inputs and parameters; the layer has no state of its own), so the
gradients are the un-recomputed ones. Cost: one more forward pass of each
such layer and one more all-gather of its parameters per training step;
memory: a layer's inputs kept instead of its parameters and internal
activations.
"""

import tensorflow as tf

from tfdist.strategies.keras_surface.keras_internals import get_keras_mask, set_keras_mask
from tfdist.strategies.modes import parameter_shards


def call_recomputed(layer, layer_call, args, kwargs):
    """`layer_call(layer, *args, **kwargs)`, its backward pass recomputing it (see above)."""
    flat = tf.nest.flatten((args, kwargs))
    positions = [i for i, value in enumerate(flat)
                 if isinstance(value, tf.Tensor) and value.dtype.is_floating]
    if not positions:
        return layer_call(layer, *args, **kwargs)
    structure = []  # the call's output structure and masks, from the forward pass
    masks = []

    def run(inputs):
        values = list(flat)
        for position, tensor in zip(positions, inputs):
            values[position] = tensor
        call_args, call_kwargs = tf.nest.pack_sequence_as((args, kwargs), values)
        return layer_call(layer, *call_args, **call_kwargs)

    @tf.custom_gradient
    def recomputed(*inputs):
        with tf.control_dependencies(inputs):  # the layer's gathers wait for its inputs
            outputs = run(inputs)
        structure.append(outputs)
        flat_outputs = tf.nest.flatten(outputs)
        masks.extend(get_keras_mask(o) for o in flat_outputs)

        def backward(*upstream, variables=None):
            variables = list(variables or [])
            waits = [u for u in upstream if u is not None]
            with tf.control_dependencies(waits):  # gathered again once the gradient exists
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    again = tf.nest.flatten(run(inputs))
            gradients = tape.gradient(again, list(inputs) + variables,
                                      output_gradients=list(upstream))
            return gradients[:len(inputs)], gradients[len(inputs):]

        # TensorFlow records the call against the variables it read, converted to tensors
        # after this returns: the stored ranges (raw), not gathered whole values.
        raw.__enter__()
        entered.append(True)
        return flat_outputs, backward

    raw, entered = parameter_shards.raw_reads(), []
    try:
        flat_outputs = recomputed(*[flat[i] for i in positions])
    finally:
        if entered:
            raw.__exit__(None, None, None)
    flat_outputs = list(flat_outputs) if isinstance(flat_outputs, (list, tuple)) else [
        flat_outputs]
    for output, mask in zip(flat_outputs, masks):
        if mask is not None:
            set_keras_mask(output, mask)
    return tf.nest.pack_sequence_as(structure[0], flat_outputs)
