"""Cross-process collectives over TensorFlow's collective ops (gRPC runtime).

Each training process runs one TensorFlow gRPC server (task `/job:worker/task:R`);
`CollectiveReduceV2`, `CollectiveGatherV2` and `CollectiveBcastSend/RecvV2`
then move tensors between processes, in eager mode and inside `tf.function`
alike.

Where and how (`collective_placement`): a collective runs on the device of
its input - a host tensor on this task's CPU, a GPU tensor on this task's
GPU, so GPU gradients make no round trip through host memory - with
TensorFlow's implementation chosen per kind: an all-reduce of GPU tensors
with NCCL (as MultiWorkerMirroredStrategy does), everything else (host
tensors, all-gather, broadcast, point-to-point) with TensorFlow's ring. The
choice is the communicator's `implementation`: "auto" (that rule), "ring"
(ring everywhere) or "nccl" (the same as "auto": NCCL exists only for GPU
tensors); `RingAllReduceStrategy(implementation=...)` sets it. A host
all-reduce of at least `SUBDIVIDE_FROM_BYTES` runs the ring in
`RING_SUBDIVISIONS` pieces per device (`ring_subdivisions`): TensorFlow's
gRPC ring moves one chunk at a time per peer, and more, smaller chunks keep
more of them in flight (experiments/results/tf_ring_knobs.json: +15% at
23 MB, +45-60% at 64 MB, nothing at 4 MB on loopback).

Instance keys (which op on one rank matches which op on another) come from
a per-process counter as collectives are created - eagerly, or when a
function is traced - so ranks agree as long as they create the same
collectives in the same order, which ranks running the same script do; a
function traced again draws the same keys as its first trace
(`trace_counter`), so ranks that trace it a different number of times
(slices that differ in rows) still agree.

Failure handling, all bounded by the job timeout (`tfdist.comm.liveness`):
* a monitor thread probes every peer's port (plain TCP, no TensorFlow call
  beside training) and, when one is gone while this process waits on its
  peers, aborts all pending collectives of this process with a message naming
  that peer, so a dead peer shows up in seconds. A peer that is gone while
  nobody waits on it may just have finished first (the end of a job): that is
  not reported;
* eager collectives (start-up, broadcasts, checks) carry the timeout as an op
  attribute, and count as waiting on the peers while they run;
* collectives inside compiled functions do not: TensorFlow parks two threads
  for the whole timeout on every op that has one (300 ops with a 300 s timeout
  hold 600 threads; a long training run exhausts the process's threads).
  Instead, callers wrap each call of such a function in `expect_progress()`,
  and the monitor aborts the collectives of a call that exceeds the timeout
  (peers alive but out of step: different data, a rank stuck elsewhere).
"""

import contextlib
import functools
import math
import time

import tensorflow as tf
from absl import logging

from tfdist import _tf
from tfdist.comm.base import Communicator, checked_static_shape
from tfdist.comm.liveness import PROBE_FAILURES, PeerMonitor
from tfdist.comm.ports import port_is_free
from tfdist.comm.trace_counter import TraceStableCounter
from tfdist.errors import ClusterError, explain_uncaught
from tfdist.process_setup import quiet_output

WORLD_GROUP_KEY = 1
FIRST_PAIR_GROUP_KEY = 1000  # group keys of the two-rank groups used for point-to-point
FIRST_INSTANCE_KEY = 100
GATHER_CAPACITY_BUCKETS = 32  # instance keys per all_gather call site: capacities 2**0..2**31
SUBDIVIDE_FROM_BYTES = 16 * 1024 * 1024
RING_SUBDIVISIONS = 16
_ABORT_CODES = {"unavailable": tf.errors.UNAVAILABLE, "deadline": tf.errors.DEADLINE_EXCEEDED}
_UNREACHABLE = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.FailedPreconditionError)


def task_name(rank):
    return f"/job:worker/replica:0/task:{rank}"


def _waits_on_peers(method):
    """Run a collective method as a wait on the peers when it executes eagerly.

    While tracing a function nothing waits: the compiled call is registered
    by its caller (`expect_progress`). Eager collectives carry their own op
    timeout, so the registration only makes a dead peer fail them at once.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._monitor is None or not tf.executing_eagerly():  # start-up, or tracing
            return method(self, *args, **kwargs)
        with self._monitor.waiting(f"{method.__name__} (eager)", deadline=False):
            return method(self, *args, **kwargs)

    return wrapper


IMPLEMENTATIONS = ("auto", "ring", "nccl")


def check_implementation(implementation):
    """`implementation` if it is one of IMPLEMENTATIONS, else a ValueError naming them."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}. "
                         f"Got: {implementation!r}")
    return implementation


def collective_placement(rank, tensor_device, kind, implementation="auto"):
    """(device, TensorFlow communication hint) of a collective of `kind` ("all_reduce",
    "all_gather", "broadcast") whose input lives on `tensor_device` (a device string,
    possibly empty: the host)."""
    check_implementation(implementation)
    on_gpu = "GPU" in (tensor_device or "").upper()
    device = task_name(rank) + ("/device:GPU:0" if on_gpu else "/device:CPU:0")
    nccl = on_gpu and kind == "all_reduce" and implementation != "ring"
    return device, ("nccl" if nccl else "ring")


def ring_subdivisions(tensor, hint):
    """`max_subdivs_per_device` for an all-reduce of `tensor` with `hint`: RING_SUBDIVISIONS
    for a ring all-reduce of a tensor of known size >= SUBDIVIDE_FROM_BYTES, else -1
    (TensorFlow's default: subdivisions by its own rule). Ranks choose alike: the shape
    and dtype of one collective are the same on every rank."""
    shape = tensor.shape
    if hint != "ring" or not shape.is_fully_defined():
        return -1
    nbytes = shape.num_elements() * tensor.dtype.size
    return RING_SUBDIVISIONS if nbytes >= SUBDIVIDE_FROM_BYTES else -1


# What TensorFlow's all-gather kernel takes; other dtypes travel as int32 words.
_GATHER_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)

class CollectiveCommunicator(Communicator):
    """The `Communicator` on TensorFlow's collective ops, with point-to-point transfers.

    Create at most one per process (see `tfdist.runtime`): it starts this
    process's TensorFlow server, waits up to `cluster.timeout` seconds for
    every peer, and then keeps watching them. `held_port`: the
    `tfdist.comm.ports.PortReservation` that held this rank's port until the
    server binds it. TensorFlow's server listens on every interface (its
    `GrpcServer` binds "0.0.0.0", whatever the address) and authenticates no
    one: the Security page of the docs says how to isolate such a job.
    """

    engine = "collective"
    supports_point_to_point = True

    def __init__(self, cluster, held_port=None, implementation="auto"):
        self.rank = cluster.rank
        self.world_size = cluster.world_size
        self.addresses = tuple(cluster.worker_addresses)
        self.timeout = float(cluster.timeout)
        self.device = task_name(self.rank) + "/device:CPU:0"  # start-up and host collectives
        self.implementation = check_implementation(implementation)
        self._keys = TraceStableCounter(FIRST_INSTANCE_KEY)
        self._monitor = None  # watching starts once every peer has answered
        if len(self.addresses) != self.world_size:
            raise ClusterError(
                f"tfdist rank {self.rank}: {len(self.addresses)} worker addresses for "
                f"{self.world_size} processes; cannot form the group."
            )
        try:
            self._start_server()
        finally:
            if held_port is not None:  # TensorFlow's server now holds the port itself
                held_port.release()
        self._rendezvous()
        self._monitor = PeerMonitor(self.rank, self.addresses, self.timeout, self._abort)
        explain_uncaught(self._explain_failure)

    # ------------------------------------------------------------------ setup
    def _start_server(self):
        address = self.addresses[self.rank]
        port = int(address.rsplit(":", 1)[1])
        if not port_is_free(port, host=""):
            raise ClusterError(
                f"tfdist rank {self.rank}: cannot listen on {address}: port {port} is already "
                "in use (another job, or a stale process?)."
            )
        try:
            # gRPC's "Started server" line is a start-up notice: held and left out
            with contextlib.nullcontext() if quiet_output.verbose() else \
                    quiet_output.without_startup_notices():
                _tf.start_collective_server(self.addresses, self.rank)
        except Exception as e:  # TF raises bare UnknownError/RuntimeError here
            if "at program startup" in str(e):
                raise ClusterError(
                    f"tfdist rank {self.rank}: TensorFlow's runtime was already initialized in "
                    "this process (a TensorFlow op, or the Horovod backend, ran before the first "
                    "tfdist strategy using TensorFlow collectives was created); create that "
                    "strategy at program start, before any TensorFlow op."
                ) from e
            raise ClusterError(
                f"tfdist rank {self.rank}: could not start the TensorFlow server on {address}: {e}"
            ) from e

    def _rendezvous(self):
        """Wait until every peer's server answers, then pass one barrier."""
        deadline = time.monotonic() + self.timeout
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            while True:
                try:
                    _tf.check_peer_health(task_name(peer), timeout_seconds=2.0)
                    break
                except _UNREACHABLE:
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"tfdist rank {self.rank}: rank {peer} ({self.addresses[peer]}) did "
                            f"not come up within the {self.timeout:g} s timeout."
                        ) from None
                    time.sleep(0.2)
        try:
            self.barrier()
        except tf.errors.OpError as e:
            raise ClusterError(
                f"tfdist rank {self.rank}: the start-up barrier failed: {e.message}"
            ) from None
        logging.info("tfdist rank %d: %d processes connected", self.rank, self.world_size)

    def _abort(self, kind, message):
        """Fail every pending and future collective of this process with `message`."""
        _tf.abort_collectives(_ABORT_CODES[kind], message)

    def expect_progress(self, description):
        """Bound one call of a compiled function with collectives by the job timeout."""
        return self._monitor.waiting(description)

    def _op_timeout(self):
        """The op-level timeout: only for eager collectives (see the module doc)."""
        return 0.0 if tf.inside_function() else self.timeout

    def gone_peers(self):
        """Ranks whose process is gone now (used to explain a failure)."""
        return self._monitor.gone_peers()

    def _explain_failure(self, error):
        """One line naming this rank and the gone peer(s), after a collective's traceback.

        TensorFlow reports a lost peer as a gRPC error deep in a traceback.
        """
        if not (isinstance(error, tf.errors.OpError) and "ollective" in str(error)):
            return None
        self.stop_watching()
        failures = self._monitor.peer_failures()
        if failures:
            names = "; ".join(f"peer rank {p} ({self.addresses[p]}): {PROBE_FAILURES[kind]}"
                              for p, kind in sorted(failures.items()))
            return (f"tfdist rank {self.rank}: training failed because a peer is gone or "
                    f"unreachable - {names} (see its output).")
        return (f"tfdist rank {self.rank}: a collective operation failed: "
                f"{error.message.splitlines()[0]}")

    def stop_watching(self):
        """Stop watching peers (at exit: peers finishing first is not a failure)."""
        self._monitor.stop()

    # ------------------------------------------------------------------ keys
    def instance_key(self):
        """The next instance key (at trace time inside a `tf.function`).

        Keys are baked into traced functions and reused by every call, so all
        ranks must trace their collectives in the same order - true when they
        run the same script, since tfdist issues no rank-dependent collectives
        - and a function traced again (on some ranks only: slices differ in
        rows) must get the same keys again (`trace_counter`).
        (Drawing keys at call time, as MultiWorkerMirroredStrategy does, breaks
        inside Keras' `steps_per_execution` loop: deferred captures cannot
        cross `tf.cond` / `tf.while_loop` graphs.)
        """
        return self.reserve_instance_keys(1)

    def reserve_instance_keys(self, count):
        """The first of `count` consecutive instance keys, all reserved.

        Algorithms whose collectives differ per rank (a tree: leaves only
        send, inner nodes receive too) reserve the same block on every rank
        and index into it, which keeps the counter in step across ranks.
        """
        return self._keys.take(count)

    # ------------------------------------------------------------ collectives
    @_waits_on_peers
    def all_reduce(self, tensor, group_size=None, group_key=WORLD_GROUP_KEY):
        """Element-wise sum of `tensor` over the group (every rank gets it); of a bool tensor,
        the logical or (TensorFlow's all-reduce takes no bool: summed as int32)."""
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype == tf.bool:
            return self.all_reduce(tf.cast(tensor, tf.int32), group_size, group_key) > 0
        device, hint = self._placement(tensor, "all_reduce")
        with tf.device(device):
            return _tf.all_reduce_v2(
                tensor, group_size or self.world_size, group_key, self.instance_key(),
                communication_hint=hint, timeout=self._op_timeout(),
                max_subdivs_per_device=ring_subdivisions(tensor, hint),
            )

    def _placement(self, tensor, kind):
        return collective_placement(self.rank, getattr(tensor, "device", ""), kind,
                                    self.implementation)

    @_waits_on_peers
    def all_gather(self, tensor):
        """Concatenate every rank's `tensor` along axis 0, in rank order.

        Ranks may hold different numbers of rows, and one call site (a traced
        step) may see different shapes from call to call (predict with another
        batch size, a partial last batch, sparse gradients). TensorFlow fixes
        the shape of a collective instance at its first use, so the data is
        flattened and padded to a power-of-two capacity, and each capacity has
        its own instance key, reserved per call site: shapes of one instance
        never change, and padding costs at most 2x. First the shapes are
        gathered (fixed size), then the padded data.
        """
        tensor = tf.convert_to_tensor(tensor)
        device, hint = self._placement(tensor, "all_gather")
        with tf.device(device):
            shape = tf.shape(tensor, out_type=tf.int32)
            shapes = self._gather_equal(shape[None])  # [P, rank]
            sizes = tf.reduce_prod(shapes, axis=1)
            largest = tf.maximum(tf.reduce_max(sizes), 1)
            bucket = tf.cast(tf.math.ceil(
                tf.math.log(tf.cast(largest, tf.float64)) / math.log(2.0) - 1e-9), tf.int32)
            bucket = tf.maximum(bucket, 0)
            capacity = tf.bitwise.left_shift(1, bucket)
            base_key = self.reserve_instance_keys(GATHER_CAPACITY_BUCKETS)
            flat = tf.reshape(tensor, [-1])
            padded = tf.pad(flat, [[0, capacity - tf.size(flat)]])
            gathered = _tf.all_gather_v2(
                padded, self.world_size, WORLD_GROUP_KEY, base_key + bucket,
                communication_hint=hint, timeout=self._op_timeout(),
            )
            starts = tf.range(self.world_size, dtype=tf.int32) * capacity
            keep = tf.ragged.range(starts, starts + sizes).flat_values
            rows = tf.reduce_sum(shapes[:, 0])
            return tf.reshape(tf.gather(gathered, keep), tf.concat([[rows], shape[1:]], 0))

    @_waits_on_peers
    def all_gather_equal(self, tensor):
        """Every rank's `tensor` (one static shape on all ranks) stacked: [P] + its shape;
        one all-gather, no padding."""
        tensor = checked_static_shape(tensor, "all_gather_equal")
        with tf.device(self._placement(tensor, "all_gather")[0]):
            if tensor.dtype in _GATHER_DTYPES:
                return self._gather_equal(tensor[None])
            return self._gather_as_words(tensor)

    def _gather_as_words(self, tensor):
        """`all_gather_equal` of a dtype TensorFlow's all-gather lacks (bool, 8- and 16-bit):
        its bytes packed into int32 words (bitcast, no widening), gathered, unpacked."""
        as_bits = tf.cast(tensor, tf.uint8) if tensor.dtype == tf.bool else tensor
        per_word = 4 // as_bits.dtype.size
        elements = tensor.shape.num_elements()
        flat = tf.reshape(as_bits, [-1])
        flat = tf.pad(flat, [[0, -elements % per_word]])
        words = tf.bitcast(tf.reshape(flat, [-1, per_word]), tf.int32)
        gathered = tf.bitcast(self._gather_equal(words[None]), as_bits.dtype)  # [P, words, k]
        values = tf.reshape(tf.reshape(gathered, [self.world_size, -1])[:, :elements],
                            [self.world_size] + tensor.shape.as_list())
        return tf.cast(values, tf.bool) if tensor.dtype == tf.bool else values

    def _gather_equal(self, tensor):
        return _tf.all_gather_v2(
            tensor, self.world_size, WORLD_GROUP_KEY, self.instance_key(),
            communication_hint=self._placement(tensor, "all_gather")[1],
            timeout=self._op_timeout(),
        )

    @_waits_on_peers
    def broadcast(self, tensor, root=0):
        """Every rank gets `root`'s `tensor` (same shape and dtype on all ranks)."""
        tensor = tf.convert_to_tensor(tensor)
        key = self.instance_key()
        device, hint = self._placement(tensor, "broadcast")
        with tf.device(device):
            if self.rank == root:
                send = _tf.broadcast_send_v2(
                    tensor, self.world_size, WORLD_GROUP_KEY, key,
                    communication_hint=hint, timeout=self._op_timeout(),
                )
                with tf.control_dependencies([send]):
                    return tf.identity(tensor)
            return _tf.broadcast_recv_v2(
                tf.shape(tensor), tensor.dtype, self.world_size, WORLD_GROUP_KEY, key,
                communication_hint=hint, timeout=self._op_timeout(),
            )

    def pair_group_key(self, peer):
        """The group key of the two-rank group {this rank, peer}, same on both sides."""
        low, high = sorted((self.rank, peer))
        return FIRST_PAIR_GROUP_KEY + low * self.world_size + high

    @_waits_on_peers
    def send(self, tensor, peer, instance_key):
        """Send `tensor` to rank `peer`, which calls `recv` with the same instance key.

        A broadcast in the two-rank group {this rank, peer}: TensorFlow's
        in-graph point-to-point transfer across processes. Returns the send op
        (it completes when the peer has received).
        """
        with tf.device(self.device):  # host memory on both ends (`recv` cannot see the sender's)
            return _tf.broadcast_send_v2(
                tensor, 2, self.pair_group_key(peer), instance_key,
                communication_hint="ring", timeout=self._op_timeout(),
            )

    @_waits_on_peers
    def recv(self, shape, dtype, peer, instance_key):
        """Receive the tensor that rank `peer` sends with the same instance key."""
        with tf.device(self.device):  # host memory, as the sender's (`send`)
            tensor = _tf.broadcast_recv_v2(
                tf.constant(shape.as_list() if isinstance(shape, tf.TensorShape) else shape,
                            dtype=tf.int32),
                dtype, 2, self.pair_group_key(peer), instance_key,
                communication_hint="ring", timeout=self._op_timeout(),
            )
        return tf.ensure_shape(tensor, shape)
