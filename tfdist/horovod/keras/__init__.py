"""Horovod's Keras API (`horovod.tensorflow.keras`) for Keras 3 on TensorFlow, on tfdist.

A Horovod script runs with its import changed::

    import tfdist.horovod.keras as hvd       # was: import horovod.tensorflow.keras as hvd

    hvd.init()
    model = keras.Sequential([...])          # no strategy scope, as in Horovod
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(loss=..., optimizer=opt, metrics=["accuracy"],
                  experimental_run_tf_function=False)   # accepted, ignored
    model.fit(dataset_of_this_rank, steps_per_epoch=500 // hvd.size(),
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

launched by horovodrun, mpirun, srun or `tfdist-run`. Semantics (Horovod's):
each rank's data and `batch_size` are its own, the gradients are averaged
over every rank's rows before the optimizer applies them, the variables
start from rank 0's values. With tfdist's guarantees besides: logged
metrics are global, every wait is bounded and names a missing peer, saving
on rank 0 only (or on every rank) works, weights never drift apart. See
the docs' "Migrating from Horovod" for what differs and the step to a
tfdist strategy (global batch, uneven data, exact resume).
"""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.horovod.collectives import (Adasum, Average, Max, Min, Product, ProcessSet, Sum,
                                        add_process_set, allgather, allreduce, broadcast,
                                        broadcast_global_variables, broadcast_variables,
                                        global_process_set, grouped_allreduce, reducescatter,
                                        remove_process_set)
from tfdist.horovod.compression import Compression
from tfdist.horovod.engine_queries import (ccl_built, cuda_built, ddl_built, gloo_built,
                                           gloo_enabled, mpi_built, mpi_enabled,
                                           mpi_threads_supported, nccl_built, rocm_built)
from tfdist.horovod.keras import callbacks, elastic
from tfdist.horovod.optimizer import DistributedOptimizer, load_model
from tfdist.horovod.process import (cross_rank, cross_size, init, is_initialized, local_rank,
                                    local_size, rank, shutdown, size)

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Max", "Min", "ProcessSet",
    "Product", "Sum", "add_process_set", "allgather", "allreduce", "broadcast",
    "broadcast_global_variables", "broadcast_variables", "callbacks", "ccl_built", "cross_rank",
    "elastic",
    "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allreduce", "init", "is_initialized", "load_model", "local_rank", "local_size",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter",
    "remove_process_set", "rocm_built", "shutdown", "size",
]

# Horovod names tfdist does not offer, and what to use instead.
_NOT_OFFERED = {
    "start_timeline": "use tfdist's profiling (tfdist-run --profile, or a Keras TensorBoard "
                      "callback with profile_batch): it records the engine's timeline",
    "stop_timeline": "use tfdist's profiling (tfdist-run --profile)",
    "PartialDistributedOptimizer": "per-rank (local) gradients are not offered: every "
                                   "trainable variable is averaged over the ranks",
}


def __getattr__(name):
    if name in _NOT_OFFERED:
        raise AttributeError(f"tfdist.horovod.keras has no {name!r}: {_NOT_OFFERED[name]}.")
    raise AttributeError(f"module 'tfdist.horovod.keras' has no attribute {name!r}")
