"""Horovod's `DistributedGradientTape`: a `tf.GradientTape` whose gradients are averaged over the ranks.

The custom-loop half of Horovod's TensorFlow 2 API (`horovod.tensorflow`):

    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # the ranks' average
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

Algorithm: `gradient` asks the wrapped tape for this rank's gradients, then
reduces them over the ranks, eagerly or inside a `tf.function`: the dense
ones (and sparse ones with `sparse_as_dense=True`) in one fused all-reduce
per call (`Communicator.grouped_all_reduce`, the engine's own fusion), each
compressed on the wire by `compression` and cast back after the sum; an
`IndexedSlices` gradient by gathering every rank's slices (values and
indices), as Horovod does. `op=Average` (default) divides the sum by the
number of ranks - with `gradient_predivide_factor` f, as Horovod, by f
before the sum and by size / f after; `op=Sum` keeps the sum. A `None`
gradient (an unconnected source) stays None.

Guarantee: Horovod's - every rank gets the mean over ranks of the ranks'
gradients; with equal per-rank batches and a mean loss, that is the
gradient of one process on the concatenated batches (exact up to float
summation order). Cost: one all-reduce of the dense gradients per call,
2 (P - 1) alpha + 2 (P - 1) / P n beta, and an all-gather per sparse one.
"""

import tensorflow as tf

from tfdist.horovod import collectives, process
from tfdist.horovod.compression import Compression, tfdist_compression
from tfdist.horovod.optimizer import check_averaging_options
from tfdist.strategies.keras_patches.gradient_tape import reducing_itself


class DistributedGradientTape:
    """Wraps `gradtape` (a `tf.GradientTape`): `gradient()` returns the gradients averaged (or
    summed) over the ranks; everything else is the wrapped tape's.

    Args:
        gradtape: the `tf.GradientTape` that recorded the forward pass.
        device_dense: Horovod's device for dense gradients (accepted; tfdist places the
            collectives itself).
        device_sparse: Horovod's device for sparse gradients (accepted, as `device_dense`).
        compression: `hvd.Compression.none` or `hvd.Compression.fp16` (float16 on the wire).
        sparse_as_dense: reduce `IndexedSlices` gradients as dense tensors.
        op: `hvd.Average` (default) or `hvd.Sum`.
        gradient_predivide_factor: Horovod's split of the averaging before and after the
            sum (op=Average only).
        num_groups: Horovod's number of fusion groups (accepted; one fused all-reduce per
            call).
        groups: Horovod's fusion groups (accepted, as `num_groups`).
        process_set: only `hvd.global_process_set`.
        scale_local_gradients: accepted (no local gradients in tfdist).

    Example:

    ```python
    import tfdist.horovod.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
    grads = tape.gradient(loss, model.trainable_variables)
    ```
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=collectives.Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=collectives.global_process_set, scale_local_gradients=True):
        del device_dense, device_sparse, scale_local_gradients
        if not isinstance(gradtape, tf.GradientTape):
            raise ValueError("tfdist.horovod: DistributedGradientTape wraps a tf.GradientTape. "
                             f"Got: {type(gradtape).__name__}")
        check_averaging_options(op, gradient_predivide_factor, num_groups, groups, process_set)
        tfdist_compression(compression)  # refused by name if not Horovod's
        process.strategy()  # init() first: Horovod's ValueError otherwise
        self._tape = gradtape
        self._compression = compression
        self._sparse_as_dense = bool(sparse_as_dense)
        self._op = op
        self._predivide = float(gradient_predivide_factor)

    def __getattr__(self, name):  # watch, watched_variables, reset, stop_recording, ...
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients of `target` w.r.t. `sources`, reduced over the ranks
        (the same structure as `sources`)."""
        with reducing_itself():  # inside a tfdist step too: this tape reduces, as Horovod's
            grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                        unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, self.reduce(flat), expand_composites=False)

    def reduce(self, grads):
        """`grads` (a list; None entries kept) reduced over the ranks as `op` says."""
        if self._sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        size = process.size()
        dense = [i for i, g in enumerate(grads) if g is not None
                 and not isinstance(g, tf.IndexedSlices)]
        reduced = list(grads)
        with collectives.bounded("DistributedGradientTape.gradient"):
            if dense:
                for i, value in zip(dense, self._all_reduce([grads[i] for i in dense], size)):
                    reduced[i] = value
            for i, grad in enumerate(grads):
                if isinstance(grad, tf.IndexedSlices):
                    reduced[i] = collectives.allreduce(grad, op=self._op)
        return reduced

    def _all_reduce(self, tensors, size):
        average = self._op is collectives.Average
        pre = 1.0 / self._predivide if average and self._predivide != 1.0 else None
        wire, contexts = [], []
        for tensor in tensors:
            compressed, context = self._compression.compress(tf.convert_to_tensor(tensor))
            if pre is not None:
                compressed = compressed * tf.cast(pre, compressed.dtype)
            wire.append(compressed)
            contexts.append(context)
        summed = process.strategy().extended.communicator.grouped_all_reduce(wire)
        out = []
        for value, context in zip(summed, contexts):
            if average and value.dtype.is_integer:
                value = value // size
            elif average and pre is not None:
                value = value * tf.cast(self._predivide / size, value.dtype)
            elif average:
                value = value / tf.cast(size, value.dtype)
            out.append(self._compression.decompress(value, context))
        return out
