"""Cross-process collectives on Open MPI itself: its all-reduce on the tensors' own buffers.

The job's processes are one MPI job (`MPI_COMM_WORLD`): started by mpirun,
`horovodrun --mpi`, srun with PMIx, or `tfdist-run --mpi`, which starts its ranks
through mpirun. Every collective is one compiled TensorFlow op
(`tfdist.comm.mpi_kernels`) that calls Open MPI's collective on the tensor's
buffer - in place when TensorFlow can forward the input (a fused gradient bucket
can), so the only copies are Open MPI's own, through its shared-memory transport
between the processes of a host and its TCP or InfiniBand transports between hosts
(`--mca btl` chooses; tfdist moves no bytes itself). MPI is initialized through
mpi4py with MPI_THREAD_MULTIPLE, within the job timeout (`tfdist.comm.mpi_init`), and
finalized by it at exit.

Cost (measured, `benchmarks/results/engine_curves.json`): the all-reduce of n bytes
over P processes is Open MPI's: on one host, its shared-memory algorithms
(recursive doubling for small messages, a ring for large ones; 2 (P - 1) / P n
bytes read and written per process), with no negotiation thread and no fusion
buffer - tfdist's aggregators already fuse gradients into buckets
(`fuses_tensors` False).

Order: MPI pairs collectives by their order on the communicator, not by name or key.
The ops are stateful without resources, so a `tf.function`'s automatic control
dependencies run them in program order - the same on every rank running the same
code, as for every engine (`tfdist.comm.base`); eager ones run in program order too,
and a process-wide lock keeps two threads from entering MPI at once.

Failure handling, bounded by the job timeout: a process that dies makes mpirun end
the whole job (Open MPI's default). What MPI cannot notice: a peer that exits normally
(in MPI_Finalize it waits for the others, while a rank waits for it in a collective -
a save on rank 0 alone), and a peer alive but out of step (not calling the matching
collective). For the first, every rank listens on its port of the job's worker
addresses (given by tfdist-run, exchanged through MPI under mpirun and srun), accepting
and closing connections (`tfdist.comm.liveness.LivenessPort`: the probes carry a token
of the job's secret, a stranger's bytes are logged), only so that
`tfdist.comm.liveness.PeerMonitor` can tell it is gone, as it does for TensorFlow's
collectives; for the second, `expect_progress`
bounds every compiled call (and each eager collective) by the timeout. Either ends
this process with a message naming the rank and the wait (MPI cannot cancel a pending
collective), after which the launcher stops the others. An error MPI returns fails the
op with MPI's text and the rank.
"""


import tensorflow as tf
from absl import logging

from tfdist.comm import mpi_kernels
from tfdist.comm.base import Communicator, checked_scatter
from tfdist.comm.liveness import LivenessPort, PeerMonitor, ending_the_process
from tfdist.comm.mpi_init import initialized_mpi
from tfdist.errors import ClusterError
from tfdist.process_setup import job_secret
from tfdist.process_setup.cluster import Cluster

LIVENESS_PURPOSE = "tfdist liveness"  # what the probes' token is derived for (`job_secret`)


def unavailable_reason(cluster=None):
    """None when this process can run the MPI engine (mpi4py imports and MPI initializes, the
    ops build and load), else why not. `cluster`: this process's, whose timeout bounds
    MPI's start-up (default: a single process's)."""
    cluster = cluster or Cluster()
    try:
        initialized_mpi(cluster.rank, cluster.timeout)
    except ImportError as error:
        return str(error)
    return mpi_kernels.unavailable_reason()


# Element types Open MPI sums through the ops (float16 and bfloat16 by the ops' own
# reduction); others are summed as float64 (bool, small ints: exact below 2^53).
SUMMABLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


class MpiCommunicator(Communicator):
    """The `Communicator` on Open MPI's collectives (no point-to-point transfers).

    Create at most one per process (see `tfdist.runtime`). The process must be part of
    an MPI job of `cluster.world_size` processes (mpirun, srun with PMIx, `tfdist-run
    --mpi`), in the same rank order.

    Args:
        cluster: this process's `tfdist.process_setup.cluster.Cluster`.
        held_port: the `tfdist.comm.ports.PortReservation` of this rank's port of
            `cluster.worker_addresses`, where its liveness port listens.
    """

    engine = "mpi"
    fuses_tensors = False  # tfdist's aggregators fuse buckets; Open MPI sums each as given
    reduces_scatter = True
    # Five 4-byte all-reduces added nothing measurable to a compiled call (under 0.02 ms;
    # the 23 MB all-reduce of the same run: 4.9 ms): `Communicator.small_all_reduce_is_cheap`.
    small_all_reduce_is_cheap = True

    def __init__(self, cluster, held_port):
        mpi = initialized_mpi(cluster.rank, cluster.timeout)
        self._ops = mpi_kernels.ops()
        self.timeout = float(cluster.timeout)
        world = mpi.COMM_WORLD
        self._take_rank("MPI", world.Get_rank(), world.Get_size(), cluster,
                        "the MPI engine needs the job's processes started as one MPI job "
                        "(mpirun, srun with PMIx, tfdist-run --mpi)")
        if mpi.Query_thread() < mpi.THREAD_SERIALIZED:
            raise ClusterError(
                f"tfdist rank {self.rank}: MPI was initialized with thread level "
                f"{mpi.Query_thread()}; the MPI engine calls it from TensorFlow's threads and "
                "needs MPI_THREAD_SERIALIZED or more (do not set mpi4py.rc.thread_level lower)")
        self.transport = "mpi"
        token = job_secret.token(job_secret.job_secret(), LIVENESS_PURPOSE).encode()
        self._listener = LivenessPort(held_port, token, f"rank {self.rank}'s liveness port")
        self._monitor = PeerMonitor(self.rank, cluster.worker_addresses, self.timeout,
                                    ending_the_process("MPI"), token)
        logging.info("tfdist rank %d: MPI engine on %s", self.rank,
                     mpi.Get_library_version().splitlines()[0])

    def expect_progress(self, description):
        """Bound one call of a compiled function (or a save's gathers) by the job timeout:
        a peer out of step leaves an MPI collective waiting for ever."""
        return self._monitor.waiting(description)

    def stop_watching(self):
        self._monitor.stop()

    def gone_peers(self):
        return self._monitor.gone_peers()

    def close(self):
        self.stop_watching()
        self._listener.close()

    def _run(self, kind, op, *args, **attrs):
        """`op(*args, **attrs)`; eagerly, bounded by the job timeout as a compiled call is
        (`expect_progress`): an eager collective (a barrier, a broadcast at start-up) whose
        peer never comes would otherwise wait for ever."""
        if not tf.executing_eagerly():
            return op(*args, **attrs)
        with self._monitor.waiting(f"an eager {kind} on the MPI engine"):
            return op(*args, **attrs)

    def all_reduce(self, tensor):
        """Element-wise sum of `tensor` over all ranks (Open MPI's MPI_Allreduce)."""
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype in SUMMABLE:
            return self._run("all-reduce", self._ops.tfdist_mpi_allreduce, tensor)
        total = self._run("all-reduce", self._ops.tfdist_mpi_allreduce,
                          tf.cast(tensor, tf.float64))
        return tf.cast(total, tensor.dtype)

    def reduce_scatter(self, tensor):
        """Rank r's c elements of the sum of 1-D `tensor` of P x c elements
        (MPI_Reduce_scatter_block)."""
        tensor, width = checked_scatter(tensor, self.world_size)
        if tensor.dtype not in SUMMABLE:
            raise TypeError(f"reduce_scatter sums {[d.name for d in SUMMABLE]}; got "
                            f"{tensor.dtype.name}")
        part = self._run("reduce-scatter", self._ops.tfdist_mpi_reduce_scatter, tensor,
                         world_size=self.world_size)
        return tf.ensure_shape(part, [width])

    def all_gather(self, tensor):
        """Concatenate every rank's `tensor` along axis 0 in rank order (rows may differ):
        the row counts first (MPI_Allgather), then the rows (MPI_Allgatherv)."""
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank == 0:
            raise ValueError("all_gather takes a tensor of rank >= 1; got a scalar")
        return self._run("all-gather", self._ops.tfdist_mpi_allgather, tensor)

    def broadcast(self, tensor, root=0):
        """Every rank gets `root`'s `tensor` (MPI_Bcast)."""
        return self._run("broadcast", self._ops.tfdist_mpi_broadcast,
                         tf.convert_to_tensor(tensor), root=int(root))
