"""Horovod's `*_built()` / `*_enabled()` queries, answered for the engine tfdist runs on.

Scripts branch on them (`if hvd.nccl_built(): ...`). The answers describe
what moves this job's bytes:

* on Horovod's engine (`RingAllReduceStrategy(backend="auto")` chose it:
  horovodrun, mpirun, tfdist-run with Horovod installed), Horovod's own answers;
* on TensorFlow's collectives, TensorFlow's: `gloo_*`, `mpi_*`, `ddl_built`,
  `ccl_built` are False, `cuda_built` / `nccl_built` / `rocm_built` say
  whether TensorFlow was built for CUDA (its collectives then use NCCL for
  GPU tensors) or ROCm.

`*_enabled()` (what this run uses) needs `init()`; `*_built()` does not.
"""

import tensorflow as tf

from tfdist import runtime
from tfdist.comm import engines
from tfdist.comm.horovod import horovod_available, import_horovod
from tfdist.horovod import process


def _on_horovod():
    return process.strategy().backend == "horovod"


def _horovod_says(name, default=False):
    if not horovod_available():
        return default
    return getattr(import_horovod(), name)()


def gloo_enabled():
    """True when Horovod on Gloo moves this job's bytes."""
    return _on_horovod() and engines.horovod_controller(runtime.cluster()) == "gloo"


def mpi_enabled():
    """True when Horovod on MPI moves this job's bytes."""
    return _on_horovod() and engines.horovod_controller(runtime.cluster()) == "mpi"


def gloo_built():
    """True when the installed Horovod was built with Gloo."""
    return bool(_horovod_says("gloo_built"))


def mpi_built():
    """True when the installed Horovod was built with MPI."""
    return bool(_horovod_says("mpi_built"))


def mpi_threads_supported():
    """Horovod's answer on its MPI engine; False otherwise."""
    return bool(mpi_enabled() and _horovod_says("mpi_threads_supported"))


def nccl_built():
    """Horovod's NCCL build on its engine; else whether TensorFlow's collectives have NCCL
    (a CUDA build of TensorFlow)."""
    if _started_on_horovod():
        return _horovod_says("nccl_built", 0)
    return int(tf.test.is_built_with_cuda())


def cuda_built():
    """Horovod's CUDA build on its engine; else TensorFlow's."""
    if _started_on_horovod():
        return bool(_horovod_says("cuda_built"))
    return tf.test.is_built_with_cuda()


def rocm_built():
    """Horovod's ROCm build on its engine; else TensorFlow's."""
    if _started_on_horovod():
        return bool(_horovod_says("rocm_built"))
    return tf.test.is_built_with_rocm()


def ddl_built():
    """IBM DDL: only through Horovod's engine."""
    return _started_on_horovod() and bool(_horovod_says("ddl_built"))


def ccl_built():
    """oneCCL: only through Horovod's engine."""
    return _started_on_horovod() and bool(_horovod_says("ccl_built"))


def _started_on_horovod():
    return process.is_initialized() and _on_horovod()
