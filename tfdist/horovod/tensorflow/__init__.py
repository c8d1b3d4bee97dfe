"""Horovod's TensorFlow 2 API (`horovod.tensorflow`) for custom training loops, on tfdist.

A Horovod custom-loop script runs with its import changed::

    import tfdist.horovod.tensorflow as hvd   # was: import horovod.tensorflow as hvd

    hvd.init()
    model = keras.Sequential([...])
    opt = keras.optimizers.Adam(0.001 * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)   # Keras 3: a property
        return loss_value

launched by horovodrun, mpirun, srun or `tfdist-run`. The names are
Horovod's: the process queries (`init`, `rank`, `size`, `local_rank`, ...),
the collectives (`allreduce`, `grouped_allreduce`, `allgather`, `broadcast`,
`reducescatter`, `broadcast_variables`, `broadcast_object`,
`allgather_object`), `Compression`, `DistributedGradientTape`,
`DistributedOptimizer` (a Keras optimizer whose `apply_gradients` averages
over the ranks) and `elastic` (`run`, `TensorFlowKerasState`,
`TensorFlowState`). Semantics are Horovod's: each rank feeds its own
batches, gradients are averaged over the ranks, a variable is the creating
rank's own until the script broadcasts it. The same module objects as
`tfdist.horovod.keras`: a script may use both.
"""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.horovod.collectives import (Adasum, Average, Max, Min, Product, ProcessSet, Sum,
                                        add_process_set, allgather, allgather_object, allreduce,
                                        broadcast, broadcast_global_variables, broadcast_object,
                                        broadcast_variables, global_process_set,
                                        grouped_allreduce, reducescatter, remove_process_set)
from tfdist.horovod.compression import Compression
from tfdist.horovod.engine_queries import (ccl_built, cuda_built, ddl_built, gloo_built,
                                           gloo_enabled, mpi_built, mpi_enabled,
                                           mpi_threads_supported, nccl_built, rocm_built)
from tfdist.horovod.gradient_tape import DistributedGradientTape
from tfdist.horovod.optimizer import DistributedOptimizer
from tfdist.horovod.process import (cross_rank, cross_size, init, is_initialized, local_rank,
                                    local_size, rank, shutdown, size)
from tfdist.horovod.tensorflow import elastic

__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer",
    "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_global_variables",
    "broadcast_object", "broadcast_variables", "ccl_built", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allreduce", "init", "is_initialized", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter",
    "remove_process_set", "rocm_built", "shutdown", "size",
]

# Horovod names tfdist does not offer, and what to use instead.
_NOT_OFFERED = {
    "PartialDistributedGradientTape": "per-rank (local) gradients are not offered: wrap the "
                                      "tape in DistributedGradientTape and keep the variables "
                                      "you want local out of its sources",
    "join": "uneven per-rank data needs no join in tfdist: give every rank the same number of "
            "steps, or use a tfdist strategy, whose global batches may be uneven",
    "alltoall": "not offered: use allgather and take your rows",
    "start_timeline": "use tfdist's profiling (tfdist-run --profile): it records the engine's "
                      "timeline",
    "stop_timeline": "use tfdist's profiling (tfdist-run --profile)",
}


def __getattr__(name):
    if name in _NOT_OFFERED:
        raise AttributeError(f"tfdist.horovod.tensorflow has no {name!r}: "
                             f"{_NOT_OFFERED[name]}.")
    raise AttributeError(f"module 'tfdist.horovod.tensorflow' has no attribute {name!r}")
