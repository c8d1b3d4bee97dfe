"""Processes that share a host's CPUs split TensorFlow's intra-op threads between them.

Why: TensorFlow sizes each process's intra-op thread pool to every CPU the
process may run on. One process per host uses them all; P processes on one
host (tfdist-run, `mpirun -np P` without binding, several tasks of an srun
step on a node) each start that many threads, P times more runnable threads
than CPUs, and each step waits for the slowest, descheduled thread. torchrun
sets `OMP_NUM_THREADS=1` for the same reason. Measured on the digits job on 2
CPUs, 2 processes (median train-function call over one process's): 1.5-1.7x
with TensorFlow's default pools, 1.25-1.3x with one intra-op thread each;
two independent processes at half the batch, the floor, 0.9-1.0x.

What: when `local_size` > 1 processes run on this host and they may all run
on every CPU of it (no launcher binding: this process's CPU affinity is the
whole machine), the intra-op pool gets max(1, CPUs // local_size) threads.
Left alone: a process whose affinity is already a subset (mpirun
`--bind-to`, srun `--cpu-bind`, a container's cpuset: the launcher has
divided the CPUs), a user's choice (`TF_NUM_INTRAOP_THREADS`,
`tf.config.threading.set_intra_op_parallelism_threads` before the strategy),
and a process whose TensorFlow runtime started before the strategy was made
(the pools exist then). `TFDIST_INTRA_OP_THREADS=N` sets N instead; 0 keeps
TensorFlow's default.

Cost: none; the inter-op pool (which runs independent ops concurrently) is
not changed.

Results: the number of threads changes how an op splits its sums, so float32
results move by rounding, as they do between 1 and N processes anyway. A
model that amplifies rounding shows it: the TensorFlow guide's custom loop
(Adam on ReLU units that are nearly dead) ends 1e-7 to 3e-3 away from one
process depending on the seed, with or without the split (seed 1234: 1.4e-3
with one thread each, 3e-7 with the default pools; seed 7: 1.2e-7 and 6e-4),
and one process alone moves 6e-4 between 1 and 2 threads. The same script in
float64 at 3 processes with one thread each equals one process to 1.8e-16.
"""

import os

from tfdist.env_vars import Foreign
from tfdist import env_vars

ENV_INTRA_OP_THREADS = env_vars.INTRA_OP_THREADS.name


def machine_cpus():
    """CPUs online on this machine (os.cpu_count)."""
    return os.cpu_count() or 1


def usable_cpus():
    """CPUs this process may run on (its affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return machine_cpus()


def intra_op_threads(local_size, environ=None, usable=None, machine=None):
    """Threads per process for `local_size` processes on this host; None to keep TensorFlow's.

    Raises:
        ValueError: TFDIST_INTRA_OP_THREADS is not a non-negative integer.
    """
    environ = os.environ if environ is None else environ
    usable = usable_cpus() if usable is None else usable
    machine = machine_cpus() if machine is None else machine
    chosen = env_vars.INTRA_OP_THREADS.get(environ)
    if chosen is not None:
        try:
            threads = int(chosen)
        except ValueError:
            threads = -1
        if threads < 0:
            raise ValueError(f"{ENV_INTRA_OP_THREADS} must be an integer >= 0. Got: {chosen!r}")
        return threads or None
    if local_size <= 1 or Foreign.TF_NUM_INTRAOP_THREADS.is_set(environ) or usable < machine:
        return None
    return max(1, usable // local_size)


def share_cpus(cluster):
    """Set this process's intra-op threads for its host's `cluster.local_size` (see module).

    Returns the number set, or None when TensorFlow's own choice stands.
    """
    threads = intra_op_threads(cluster.local_size)
    if threads is None:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if tf.config.threading.get_intra_op_parallelism_threads() != 0:
        return None  # the user chose before making the strategy
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # TensorFlow's runtime already started: its pools exist
        return None
    _threads_set[0] = threads  # the strategy's start-up line says it (`threads_set`)
    return threads


_threads_set = [None]


def threads_set():
    """The intra-op threads `share_cpus` set in this process, or None (TensorFlow's default)."""
    return _threads_set[0]
