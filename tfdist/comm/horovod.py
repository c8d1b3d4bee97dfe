"""Cross-process collectives over Horovod (Gloo, or MPI when built with it).

Horovod's TensorFlow ops (`HorovodAllreduce`, `HorovodGroupedAllreduce`,
`HorovodReducescatter`, `HorovodAllgather`, `HorovodBroadcast`) run in eager mode and inside
`tf.function`; a background thread per process negotiates which tensors all
ranks have submitted (matched by op name, so ranks must issue the same
collectives, as ranks running the same script do) and executes them on the
engine, fusing small tensors into one buffer of up to HOROVOD_FUSION_THRESHOLD
bytes. Only Horovod's low-level ops are used: its Keras layer is broken on
Keras 3 (horovod/horovod#4290) and tfdist's strategies replace it.

Failure handling, bounded by the job timeout: tfdist sets
HOROVOD_GLOO_TIMEOUT_SECONDS (a peer that stops answering) and
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (peers alive but not submitting the same
tensors) to the timeout unless the user set them; either ends the pending ops
with an error.

Profiling: the TensorFlow profiler does not record Horovod's ops (they run
on Horovod's threads), so a rank profiling its steps also starts Horovod's
own timeline (`start_engine_timeline`): the coordinator, rank 0, writes
every tensor's negotiation and execution to
`names.HOROVOD_TIMELINE_FILE`, which `tfdist.profiling.timeline` merges. Horovod
allows that only with HOROVOD_TIMELINE=DYNAMIC set before it starts; tfdist
sets it when `tfdist-run --profile` asked for profiles.
"""

import importlib
import os

import tensorflow as tf
from absl import logging

from tfdist.env_vars import Foreign
from tfdist import _tf
from tfdist.comm.base import Communicator, checked_scatter
from tfdist.comm.liveness import PeerMonitor, ending_the_process
from tfdist.comm.trace_counter import TraceStableCounter
from tfdist.errors import explain_uncaught
from tfdist.process_setup import startup_deadline
from tfdist.profiling import names

_INSTALL_HINT = (
    "Horovod is not installed in this environment. It is optional (tfdist-run and every "
    "strategy work on TensorFlow's collectives without it); to add it, from a clone of "
    "tfdist: scripts/install_horovod.sh \"$(which python)\" (needs cmake and g++, about 4 "
    "minutes once), or `make install` in the clone."
)


def import_horovod():
    """`horovod.tensorflow`, or an ImportError that says how to get it."""
    try:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(f"tfdist: {_INSTALL_HINT} ({e})") from e
    return hvd


def horovod_available():
    try:
        import_horovod()
    except ImportError:
        return False
    return True


def horovod_mpi_built():
    """True when Horovod is installed and built with MPI (it can run under plain mpirun)."""
    try:
        return bool(import_horovod().mpi_built())
    except ImportError:
        return False


# What can keep hvd.init() from returning, said when it times out.
HOROVOD_INIT_CAUSES = (
    "it waits for every rank in Gloo's rendezvous (the launcher's key-value store) or in "
    "MPI's start-up; a rank that never starts, a rank that chose another engine, or a "
    "store answering another job's ranks keeps it waiting")
STALL_CHECK_SECONDS = 60  # Horovod's default HOROVOD_STALL_CHECK_TIME_SECONDS
DEFAULT_CYCLE_TIME_MS = "0.1"  # unless HOROVOD_CYCLE_TIME (horovodrun --cycle-time-ms) is set


class HorovodCommunicator(Communicator):
    """The `Communicator` on Horovod's collectives (no point-to-point transfers).

    Create at most one per process (see `tfdist.runtime`). The process must
    have been started by `horovodrun`, mpirun or tfdist-run (Horovod installed), which tell
    Horovod where its peers are.

    Args:
        cluster: this process's `tfdist.process_setup.cluster.Cluster`.
        fusion_threshold_bytes: Horovod's fusion buffer size (tensors submitted
            together are packed into buffers of at most this many bytes).
            Takes effect only if Horovod is not yet initialized in the process.
    """

    engine = "horovod"
    fuses_tensors = True  # the engine packs a group of tensors itself
    reduces_scatter = True

    def __init__(self, cluster, fusion_threshold_bytes=None):
        self._hvd = hvd = import_horovod()
        self._mpi_ops = importlib.import_module(f"{hvd.__name__}.mpi_ops")
        self._op_numbers = TraceStableCounter()
        self.timeout = float(cluster.timeout)
        if hvd.is_initialized():
            logging.info("tfdist: Horovod was already initialized; its settings are kept.")
        else:
            defaults = {
                Foreign.HOROVOD_GLOO_TIMEOUT_SECONDS.name: str(int(self.timeout)),
                Foreign.HOROVOD_STALL_SHUTDOWN_TIME_SECONDS.name: str(int(self.timeout)),
                # Horovod checks for stalls every 60 s by default and ignores a shutdown
                # time below that: a timeout under 60 s would never end a stalled job.
                Foreign.HOROVOD_STALL_CHECK_TIME_SECONDS.name: str(
                    max(1, min(STALL_CHECK_SECONDS, int(self.timeout)))),
                # The background thread's wake-up period (Horovod's default: 1 ms) is
                # latency every step pays: 0.1 ms took a tiny all-reduce from 1.1 to
                # 0.45 ms and the digits step from 8.8 to 6.3-7.2 ms (2 processes, 2 CPUs).
                Foreign.HOROVOD_CYCLE_TIME.name: DEFAULT_CYCLE_TIME_MS,
            }
            if os.environ.get(names.PROFILE_DIR_ENV):
                # started when the profile starts
                defaults[Foreign.HOROVOD_TIMELINE.name] = "DYNAMIC"
            if fusion_threshold_bytes is not None:
                os.environ[Foreign.HOROVOD_FUSION_THRESHOLD.name] = str(int(fusion_threshold_bytes))
            for name, value in defaults.items():
                os.environ.setdefault(name, value)
            with startup_deadline.bounded("hvd.init() (Horovod's start-up)", self.timeout,
                                          cluster.rank, HOROVOD_INIT_CAUSES):
                hvd.init()
        self._take_rank("Horovod", hvd.rank(), hvd.size(), cluster,
                        "was this process started by horovodrun or tfdist-run?")
        self.transport = "mpi" if hvd.mpi_enabled() else "gloo"
        explain_uncaught(self._explain_failure)
        # The waits' deadlines only: Horovod's peers listen on no port tfdist knows.
        self._monitor = PeerMonitor(self.rank, [], self.timeout, ending_the_process("Horovod"))
        with tf.init_scope():
            self._in_step = tf.Variable(0, trainable=False, name="tfdist_horovod_zero")

    def _kept_in_step(self, tensors):
        """`tensors`, each made to depend on a variable read if it is a constant of the graph.

        Horovod registers its ops as stateless, so TensorFlow's graph
        optimizer evaluates one whose input it can compute ahead (a slice's
        row count under a static shape) while optimizing the function, once,
        instead of in every step - and only on the ranks that optimize that
        function then. A rank that traced the step again (its slice changed
        shape) would wait for peers that summed that constant long ago.
        Adding a variable's value (0) makes such an input stateful to read.
        """
        if tf.executing_eagerly():
            return list(tensors)
        return [t + tf.cast(self._in_step.read_value(), t.dtype) if _tf.computable_ahead(t) else t
                for t in tensors]

    def expect_progress(self, description):
        """Bound one call of a compiled function (or a save's gathers) by the job timeout.

        Horovod's stall check (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, set to the timeout)
        should end such a wait, but on Gloo it can wait for ever itself (its negotiation
        blocks on a rank whose ops never come: measured on a rank sleeping in a callback);
        a wait that outlives the timeout ends this process with a message naming it.
        """
        return self._monitor.waiting(description)

    def stop_watching(self):
        self._monitor.stop()

    def _explain_failure(self, error):
        """One line naming this rank and the job timeout after Horovod's shutdown error.

        Horovod ends every pending and later op of a rank with the same message when its
        stall check finds ranks that did not submit a tensor within
        HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (tfdist: the job timeout), when a peer's
        connection broke (HOROVOD_GLOO_TIMEOUT_SECONDS) or when a rank raised; its log
        above names the missing ranks.
        """
        if not (isinstance(error, tf.errors.OpError)
                and "Horovod has been shut down" in str(error)):
            return None
        return (f"tfdist rank {self.rank}: Horovod stopped the job: a peer waited more than the "
                f"{self.timeout:g} s timeout for its peers (ranks alive but out of step: see "
                "Horovod's stall report above, naming the missing ranks), or a peer failed or "
                "exited (see its output).")

    def start_engine_timeline(self, directory):
        """Horovod's timeline into `directory`/`names.HOROVOD_TIMELINE_FILE` (rank 0 writes it)."""
        try:
            self._hvd.start_timeline(os.path.join(directory, names.HOROVOD_TIMELINE_FILE))
        except ValueError as error:  # HOROVOD_TIMELINE=DYNAMIC was not set before hvd.init()
            logging.log_first_n(logging.WARNING, "tfdist: no Horovod timeline in the profile: %s",
                                1, error)

    def stop_engine_timeline(self):
        self._hvd.stop_timeline()

    def _op_name(self, kind):
        """(name, ignore_name_scope) for a Horovod op of `kind` traced now, equal on every rank.

        Horovod matches a tensor across ranks by its op's node name. Its default
        name is made of the input tensor's name, which differs between ranks
        whose step graphs differ (the chief's has ops the others lack; an input
        computable ahead on one rank is kept in the step by an addition,
        `_kept_in_step`): each rank would wait for the others' name forever. So
        every traced op is named by its kind and a trace-stable number
        (`TraceStableCounter`), inside its name scope (`tfdist/<algorithm>/<phase>`,
        which the profiler reads). Inside a `tf.cond` branch TensorFlow also
        prefixes the node names of the inlined branch with a node number of the
        enclosing graph (`cond/then/_38/...`), which differs the same way: there
        the scope goes into the name, and Horovod is told to ignore the prefix.
        Eager ops keep Horovod's own naming (they run in program order).
        """
        if tf.executing_eagerly():
            return None, False
        number = self._op_numbers.take()
        if _tf.in_cond_branch():
            scope = tf.get_current_name_scope().replace("/", ".").strip(".")
            return f"{scope}.{kind}_{number}", True
        return f"tfdist_{kind}_{number}", False

    def all_reduce(self, tensor):
        """Element-wise sum of `tensor` over all ranks."""
        tensor = self._kept_in_step([tensor])[0]
        name, ignore_scope = self._op_name("allreduce")
        return self._mpi_ops._allreduce(  # pylint: disable=protected-access
            tensor, name=name, op=self._hvd.Sum, ignore_name_scope=ignore_scope)

    def grouped_all_reduce(self, tensors):
        """Element-wise sums of several tensors, negotiated and fused as one group per dtype.

        Horovod's group takes tensors of one dtype (metric state may hold
        int64 counts next to float32 gradients): one group per dtype, in
        order of first appearance, the same on every rank.
        """
        tensors = self._kept_in_step(tensors)
        by_dtype = {}
        for position, tensor in enumerate(tensors):
            by_dtype.setdefault(tensor.dtype, []).append(position)
        results = [None] * len(tensors)
        for positions in by_dtype.values():
            name, ignore_scope = self._op_name("grouped_allreduce")
            summed = self._mpi_ops._grouped_allreduce(  # pylint: disable=protected-access
                [tensors[p] for p in positions], name=name, op=self._hvd.Sum,
                ignore_name_scope=ignore_scope)
            for position, total in zip(positions, summed):
                results[position] = total
        return results

    def reduce_scatter(self, tensor):
        """Rank r's c elements of the sum of 1-D `tensor` of P x c elements (Horovod splits
        the first dimension evenly when P divides it)."""
        tensor, width = checked_scatter(tensor, self.world_size)
        tensor = self._kept_in_step([tensor])[0]
        name, ignore_scope = self._op_name("reducescatter")
        part = self._mpi_ops._reducescatter(  # pylint: disable=protected-access
            tensor, name=name, op=self._hvd.Sum, ignore_name_scope=ignore_scope)
        return tf.ensure_shape(part, [width])

    def all_gather(self, tensor):
        """Concatenate every rank's `tensor` along axis 0 in rank order (rows may differ)."""
        tensor = self._kept_in_step([tf.convert_to_tensor(tensor)])[0]
        name, ignore_scope = self._op_name("allgather")
        return self._mpi_ops.allgather(tensor, name=name, ignore_name_scope=ignore_scope)

    def broadcast(self, tensor, root=0):
        """Every rank gets `root`'s `tensor`."""
        tensor = self._kept_in_step([tf.convert_to_tensor(tensor)])[0]
        name, ignore_scope = self._op_name("broadcast")
        return self._mpi_ops.broadcast(tensor, root, name=name, ignore_name_scope=ignore_scope)
