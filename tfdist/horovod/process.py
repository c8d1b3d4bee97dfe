"""Horovod's process API (`init`, `rank`, `size`, ...) on a tfdist strategy.

`init()` does what `hvd.init()` does for a Horovod script, and what tfdist
needs for Horovod's semantics:

1. the job is discovered from any launcher (`tfdist.runtime.cluster`:
   horovodrun, mpirun, srun, tfdist-run, TF_CONFIG, Kubernetes), and this
   process's GPU is chosen by its local rank with memory growth on; memory
   growth is also set on every other GPU the process sees, so the lines
   every Horovod script runs next (memory growth on each GPU, then
   `set_visible_devices(gpus[hvd.local_rank()])`) find their settings made
   and succeed after TensorFlow's runtime started;
2. a `RingAllReduceStrategy(backend="auto", per_rank_input=True)` is created
   (the engine `auto` picks: Horovod's on Gloo or MPI when the launcher set
   it up, else TensorFlow's collectives) and made TensorFlow's default
   strategy (`tf.distribute.experimental_set_strategy`), so a model built
   after `init()` is a tfdist model without a `strategy.scope()`: each rank
   feeds its own batches, the gradients are averaged over the ranks' rows
   inside Keras' own step, metrics are global.

Everything else (`rank()`, `size()`, ...) reads the discovered job. Calling
them before `init()` is Horovod's ValueError. `init()` again is a no-op, as
in Horovod. Process sets and an MPI communicator are refused: tfdist has
one group per job.

Cost: one strategy start-up (the engine's rendezvous, the initial broadcast
of the random seed); nothing per step.
"""

import threading

import tensorflow as tf

from tfdist import runtime
from tfdist.strategies.keras_surface import model_strategy
from tfdist.env_vars import Foreign
from tfdist.process_setup import gpu_placement

_lock = threading.Lock()
_strategy = [None]  # the strategy `init()` made TensorFlow's default


def init(comm=None, process_sets=None):
    """Start the job's engine and make a per-rank-input tfdist strategy TensorFlow's default.

    Args:
        comm: Horovod's MPI communicator argument; only None (the launcher's
            whole job) is offered.
        process_sets: Horovod's process sets; only None / [] (the global set).
    """
    if comm is not None:
        raise ValueError("tfdist.horovod: init(comm=...) is not offered: a tfdist job is every "
                         "process the launcher started. Got: comm=%r" % (comm,))
    if process_sets:
        raise ValueError("tfdist.horovod: process sets are not offered (one group per job: "
                         "every rank takes part in every collective). Got: process_sets=%r"
                         % (process_sets,))
    with _lock:
        if _strategy[0] is not None:
            return
        # pylint: disable-next=import-outside-toplevel
        from tfdist.strategies.ring import RingAllReduceStrategy

        runtime.cluster()  # places the GPU before TensorFlow's runtime starts
        _every_gpu_grows()
        options = {}
        fusion = Foreign.HOROVOD_FUSION_THRESHOLD.get()
        if fusion:
            options["fusion_threshold_bytes"] = int(fusion)
        strategy = RingAllReduceStrategy(backend="auto", per_rank_input=True, **options)
        tf.distribute.experimental_set_strategy(strategy)
        _strategy[0] = strategy
        if strategy.world_size > 1:  # a model built before hvd.init() is refused, saying so
            model_strategy.note_multi_process_strategy(strategy, horovod_api=True)


def _every_gpu_grows():
    """Memory growth on every GPU this process sees (Horovod's scripts set it on each)."""
    if gpu_placement.turned_off():
        return
    from tfdist import _tf  # pylint: disable=import-outside-toplevel

    if _tf.runtime_started():
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)


def shutdown():
    """Stop using the strategy (TensorFlow's default is restored) and close the engine."""
    with _lock:
        if _strategy[0] is None:
            return
        tf.distribute.experimental_set_strategy(None)
        _strategy[0] = None
    runtime.shutdown()


def is_initialized():
    """True between `init()` and `shutdown()`."""
    return _strategy[0] is not None


def strategy():
    """The strategy `init()` created; ValueError (Horovod's) before `init()`."""
    current = _strategy[0]
    if current is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return current


def _cluster():
    return strategy().cluster


def size():
    """Number of processes (Horovod's ranks): the job's training processes."""
    return _cluster().world_size


def rank():
    """This process's rank, 0 .. size() - 1."""
    return _cluster().rank


def local_rank():
    """This process's index among the processes on its host."""
    return _cluster().local_rank


def local_size():
    """Number of processes on this host."""
    return _cluster().local_size


def _hosts():
    """The hosts in order of their first rank, where the job's addresses are known."""
    cluster = _cluster()
    hosts = []
    for address in cluster.worker_addresses:
        host = address.rsplit(":", 1)[0]
        if host not in hosts:
            hosts.append(host)
    return hosts if len(cluster.worker_addresses) == cluster.world_size else None


def cross_rank():
    """This host's index among the job's hosts (Horovod: the rank among processes of the same
    local rank)."""
    cluster = _cluster()
    hosts = _hosts()
    if hosts is not None:
        return hosts.index(cluster.worker_addresses[cluster.rank].rsplit(":", 1)[0])
    return cluster.rank // max(cluster.local_size, 1)


def cross_size():
    """Number of hosts with a process of this local rank (the number of hosts when every host
    runs as many processes)."""
    cluster = _cluster()
    hosts = _hosts()
    if hosts is not None:
        local_ranks = {}
        for address in cluster.worker_addresses:
            host = address.rsplit(":", 1)[0]
            local_ranks[host] = local_ranks.get(host, 0) + 1
        return sum(count > cluster.local_rank for count in local_ranks.values())
    return -(-cluster.world_size // max(cluster.local_size, 1))
