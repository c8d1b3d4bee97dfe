"""What does Open MPI's all-reduce cost when a TensorFlow graph calls it through mpi4py?

A first measurement for issue 65 (a big model's step within 1.25x of the
no-communication floor): Open MPI's own `MPI_Allreduce` moves the 5.8 M MLP's
23.2 MB gradient between 2 processes of this machine in about 5 ms, 3-14x faster
than tfdist's engines. An engine built on it must call it from the training
step's graph. This script times, in one job of `mpirun -np 2`, the same sum of
23.2 MB float32:

* `memcpy`: one copy of the buffer (`np.copyto`), the unit of what a bridge costs;
* `mpi4py`: `comm.Allreduce(x, out)` on NumPy buffers, alone;
* `mpi4py_in_place`: the same with `MPI.IN_PLACE`;
* `numpy_function`: a `tf.function` calling it through `tf.numpy_function`
  (TensorFlow hands the input as an array, takes the returned array back);
* `numpy_function_in_place`: the same on a copy of the input, summed with
  `MPI.IN_PLACE`;
* `numpy_function_copy_alone`: the bridge without MPI (the input copied and
  returned): what calling out of the graph costs by itself;
* `py_function`: the same through `tf.py_function` (the input read with
  `.numpy()`, the result returned as an array);
* `numpy_function_6_buckets`: six 3.9 MB buckets, each a `numpy_function`
  ordered after the previous one (MPI's collectives must be called in the
  same order on every rank), as a ring strategy's buckets would be;
* `compiled_op`: a compiled TensorFlow op (`mpi_allreduce_op.cc`, built here
  with g++, `tf.sysconfig`'s flags and `mpicxx`'s) calling `MPI_Allreduce` on
  the tensor's own buffer, meant to be in place on a fresh tensor (`t * 1.0`, whose
  copy `tf_copy_alone` times by itself; TensorFlow did not forward it in this run's
  graphs, so the op summed out of place); `compiled_op_6_buckets`: the six buckets
  through it, chained as above.

Each: the median of 25 calls after 5 warm-up calls, every call started by a
barrier. Rank 0 writes `experiments/results/mpi4py_in_graph.json`.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        mpirun --oversubscribe -np 2 .venv/bin/python experiments/mpi4py_in_graph.py
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.harness import environment  # noqa: E402

ELEMENTS = 5_800_000  # the 5.8 M MLP's gradient, float32: 23.2 MB
BUCKETS = 6
WARMUP, CALLS = 5, 25
COMM = MPI.COMM_WORLD


def timed(call):
    times = []
    for i in range(WARMUP + CALLS):
        COMM.Barrier()
        start = time.perf_counter()
        call()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def summed(array):
    out = np.empty_like(array)
    COMM.Allreduce(array, out, op=MPI.SUM)
    return out


def summed_in_place(array):
    out = np.array(array, copy=True)
    COMM.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
    return out


def copied(array):
    return np.array(array, copy=True)


def compiled_op(directory):
    """The op of `mpi_allreduce_op.cc` built into `directory` and loaded, or None (no g++ or
    mpicxx here)."""
    if shutil.which("g++") is None or shutil.which("mpicxx") is None:
        return None
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_allreduce_op.cc")
    library = os.path.join(directory, "mpi_allreduce_op.so")
    mpi = [subprocess.run(["mpicxx", f"--showme:{part}"], capture_output=True, text=True,
                          check=True).stdout.split() for part in ("compile", "link")]
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O2", source, "-o", library,
                    *tf.sysconfig.get_compile_flags(), *mpi[0], *tf.sysconfig.get_link_flags(),
                    *mpi[1]], check=True, capture_output=True)
    return tf.load_op_library(library)


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x = np.ones(ELEMENTS, np.float32)
    out = np.empty_like(x)
    scratch = x.copy()
    tensor = tf.constant(x)
    buckets = [tf.constant(np.ones(ELEMENTS // BUCKETS, np.float32)) for _ in range(BUCKETS)]

    @tf.function
    def through_numpy_function(t):
        return tf.numpy_function(summed, [t], tf.float32, stateful=True)

    @tf.function
    def through_numpy_function_in_place(t):
        return tf.numpy_function(summed_in_place, [t], tf.float32, stateful=True)

    @tf.function
    def bridge_alone(t):
        return tf.numpy_function(copied, [t], tf.float32, stateful=True)

    @tf.function
    def through_py_function(t):
        return tf.py_function(lambda v: summed(v.numpy()), [t], tf.float32)

    @tf.function
    def chained(parts):
        results, previous = [], []
        for part in parts:
            with tf.control_dependencies(previous):
                result = tf.numpy_function(summed, [part], tf.float32, stateful=True)
            results.append(result)
            previous = [result]
        return results

    directory = tempfile.mkdtemp()
    op = compiled_op(directory)

    @tf.function
    def tf_copy_alone(t):
        return t * 1.0

    @tf.function
    def through_compiled_op(t):
        return op.mpi_allreduce_sum(t * 1.0)  # a fresh buffer: summed in place

    @tf.function
    def compiled_chained(parts):
        results, previous = [], []
        for part in parts:
            with tf.control_dependencies(previous):
                result = op.mpi_allreduce_sum(part * 1.0)
            results.append(result)
            previous = [result]
        return results

    ms = {
        "memcpy": timed(lambda: np.copyto(scratch, x)),
        "mpi4py": timed(lambda: COMM.Allreduce(x, out, op=MPI.SUM)),
        "mpi4py_in_place": timed(lambda: COMM.Allreduce(MPI.IN_PLACE, scratch, op=MPI.SUM)),
        "numpy_function": timed(lambda: through_numpy_function(tensor).numpy()),
        "numpy_function_in_place": timed(
            lambda: through_numpy_function_in_place(tensor).numpy()),
        "numpy_function_copy_alone": timed(lambda: bridge_alone(tensor).numpy()),
        "py_function": timed(lambda: through_py_function(tensor).numpy()),
        f"numpy_function_{BUCKETS}_buckets": timed(
            lambda: [r.numpy() for r in chained(buckets)]),
    }
    if op is not None:
        ms.update({
            "tf_copy_alone": timed(lambda: tf_copy_alone(tensor).numpy()),
            "compiled_op": timed(lambda: through_compiled_op(tensor).numpy()),
            f"compiled_op_{BUCKETS}_buckets": timed(
                lambda: [r.numpy() for r in compiled_chained(buckets)]),
        })
        check = through_compiled_op(tf.fill([8], float(COMM.rank + 1))).numpy()
        assert np.all(check == COMM.size * (COMM.size + 1) / 2), check
    shutil.rmtree(directory, ignore_errors=True)
    if COMM.rank == 0:
        nbytes = x.nbytes
        world = COMM.size
        result = {
            "environment": environment(),
            "processes": world,
            "bytes": nbytes,
            "median_ms": {k: round(v, 2) for k, v in ms.items()},
            "bus_bandwidth_gb_s": {k: round(2 * (world - 1) / world * nbytes / (v / 1e3) / 1e9, 2)
                                   for k, v in ms.items()
                                   if k not in ("memcpy", "numpy_function_copy_alone",
                                                "tf_copy_alone")},
            "note": "mpirun --oversubscribe -np 2 on this 2-core machine; bus bandwidth "
                    "2 (P - 1) / P n / t (the copies alone excluded; compiled_op's time "
                    "includes the t * 1.0 copy that tf_copy_alone times).",
        }
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                            "mpi4py_in_graph.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["median_ms"]))


if __name__ == "__main__":
    main()
