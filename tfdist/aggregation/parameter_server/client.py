"""The worker side of the parameter server: the aggregation hook that pushes and pulls."""

import math
import sys
import threading
import time
import weakref

import tensorflow as tf

from tfdist import chief_log
from tfdist.aggregation.base import Aggregator, require_static_shapes
from tfdist.comm.trace_counter import TraceStableCounter
from tfdist.aggregation.fusion import FusionPlan, split_flat
from tfdist.aggregation.parameter_server import protocol
from tfdist.aggregation.parameter_server.shard_plan import DEFAULT_PIECE_BYTES, ShardPlan
from tfdist.comm.liveness import PROBE_INTERVAL_SECONDS, ProbeCounter, connection_refused
from tfdist.comm.tf_rpc import MAX_MESSAGE_BYTES, RpcClient
from tfdist.process_setup import job_secret
from tfdist.errors import explain_uncaught, tfdist_assertion

LOGGED_PLAN_MIN_BYTES = 256
GOODBYE_TIMEOUT_SECONDS = 5.0
_UNLIMITED_BUCKET = 1 << 62


class ParameterServerAggregator(Aggregator):
    """Synchronous sharded parameter server (DistBelief, Li et al. 2014; BytePS-style summation).

    Algorithm: the tensors are fused into one flat buffer per wire dtype and
    cut into pieces spread evenly over the K servers (`ShardPlan`). Each
    worker pushes every piece to its server and pulls back the piece's sum
    over all P workers; servers only add (in worker order, so the result is
    deterministic) - the Keras optimizer runs on the workers, so every
    optimizer works unchanged. Transfers are calls over TensorFlow's RPC
    runtime inside the compiled train step; a worker's calls to one server
    are chained (push after push, pull after pull) so that every server sees
    each worker's pieces in the same order, while calls to different servers
    run concurrently.

    Cost model (alpha: latency per message, beta: seconds per byte, n bytes
    per worker, P workers, K servers, pieces of at most b bytes): the busiest
    link is a server's, which receives n / K bytes from each of P workers and
    sends the sums back to each:
        T_ps(n, P, K) = 2 (m alpha + P n / K beta),  m = ceil(n / (K b))
    where m is the number of chained calls per server. One server
    (K = 1) grows linearly with P; K = P servers (co-located, one per worker)
    move 2 n beta per server link, like a ring's 2 (P - 1) / P n beta but with
    one latency term instead of 2 (P - 1).

    Guarantee: every worker receives the same sum, added in worker order; it
    equals the exact sum up to floating-point reassociation. Tensors other
    than float16 travel as float32 (integers are exact below 2^24).

    Args:
        rank: this worker's rank.
        world_size: number of workers P.
        server_addresses: "host:port" of each shard server.
        timeout: seconds any call may take (and servers may take to come up).
        piece_bytes: largest piece per message (at most 4 MiB, gRPC's limit).
    """

    name = "ps"

    def __init__(self, rank, world_size, server_addresses, timeout,
                 piece_bytes=DEFAULT_PIECE_BYTES):
        if not server_addresses:
            raise ValueError("the parameter server needs at least one server address.")
        if not 0 < int(piece_bytes) <= MAX_MESSAGE_BYTES - 64 * 1024:
            raise ValueError(f"piece_bytes must be in (0, {MAX_MESSAGE_BYTES - 64 * 1024}] "
                             f"(gRPC's message limit). Got: {piece_bytes!r}")
        super().__init__()
        self.rank = rank
        self.world_size = world_size
        self.piece_bytes = int(piece_bytes)
        self.server_addresses = tuple(server_addresses)
        self.timeout = float(timeout)
        token = job_secret.token(job_secret.job_secret(), protocol.TOKEN_PURPOSE)
        self.clients = [RpcClient(address, f"parameter server {k} ({address})",
                                  f"tfdist rank {rank}", timeout, token)
                        for k, address in enumerate(self.server_addresses)]
        with tf.init_scope():
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_ps_step")
        self._slots = TraceStableCounter(span=1024)
        self._chains = weakref.WeakKeyDictionary()  # graph -> {(server, "push"|"pull"): op}
        self._largest_logged = 0  # bytes of the largest buffer whose partition was printed
        self._stop = threading.Event()
        self._checkin(protocol.HELLO)
        threading.Thread(target=self._watch_servers, daemon=True, name="tfdist-ps-watch").start()
        explain_uncaught(self._explain_failure)

    # ------------------------------------------------------------ liveness
    def _checkin(self, state, timeout=None):
        for client in self.clients:
            client.call("checkin", [tf.constant(self.rank), tf.constant(state)],
                        tf.TensorSpec([], tf.int32), timeout=timeout)

    def _watch_servers(self):
        """Probe the servers' ports (no TensorFlow in this thread); say at once if one is gone.

        A call in flight to a server that dies fails as soon as its connection
        drops; a call made after that waits for the server up to the job's
        timeout and then fails (`tf_rpc`), and the step with it: the worker
        ends through its own error, never here. The watcher only names the
        cause while that wait lasts.
        """
        probes = ProbeCounter([client.address for client in self.clients], connection_refused)
        while not self._stop.wait(PROBE_INTERVAL_SECONDS):
            gone = probes.probe()
            if gone and not self._stop.is_set():
                print(self._dead_server_line(self.clients[gone[0]])
                      + f" A step waiting on it fails within the {self.timeout:g} s timeout.",
                      file=sys.stderr, flush=True)
                return

    def _dead_server_line(self, client):
        return (f"tfdist rank {self.rank}: {client.description} is unreachable "
                "(connection refused); it has probably died.")

    def _explain_failure(self, error):
        """When a call to a server fails and training stops, say which server is gone.

        A step blocked on a dead server fails either here (the call errors) or
        in the watcher (its probes are refused), whichever comes first; both
        end with the same line naming the server.
        """
        if "parameter server" not in str(error) or self._stop.is_set():
            return None
        self._stop.set()
        lines = [tfdist_assertion(error)]  # the step's own check, as one line
        # A call in flight fails ("Socket closed", or "Connection reset by peer" when the
        # kill lands mid-call) as the dying server's connections drop, which may be a moment
        # before its listening port refuses: probe for that moment.
        dropped = any(words in str(error) for words in _DROPPED_CALL)
        patience = DROPPED_CALL_PROBE_SECONDS if dropped else 0.0
        lines += [self._dead_server_line(client) for client in self.clients
                  if _refused_within(client.address, patience)]
        return "\n".join(line for line in lines if line) or None

    def server_stats(self):
        """Per server, since it started (eager): {"pid", "bytes_received", "pieces_received",
        "updates_applied"} (the last: asynchronous pushes applied, every worker's)."""
        stats = []
        for client in self.clients:
            pid, nbytes, pieces, applied = client.call(
                "stats", [], tf.TensorSpec([4], tf.int64)).numpy()
            stats.append({"pid": int(pid), "bytes_received": int(nbytes),
                          "pieces_received": int(pieces), "updates_applied": int(applied)})
        return stats

    def close(self):
        """Tell the servers this worker is done; they stop when all are. Idempotent.

        Called at the end of the process (`tfdist.runtime.shutdown`), or on
        leaving a `with` block around the aggregator.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._checkin(protocol.GOODBYE, timeout=GOODBYE_TIMEOUT_SECONDS)
        except Exception:  # pylint: disable=broad-except
            pass  # a server that is already gone needs no goodbye

    # ---------------------------------------------------------- reduction
    def _reserve_slots(self, count):
        return self._slots.take(count)

    def _chained(self, server, kind, make_call):
        """Run `make_call()` after this graph's previous call of `kind` to `server`."""
        if tf.executing_eagerly():
            return make_call()
        chains = self._chains.setdefault(tf.compat.v1.get_default_graph(), {})
        previous = chains.get((server, kind))
        with tf.control_dependencies([previous] if previous is not None else []):
            result = make_call()
        chains[(server, kind)] = tf.nest.flatten(result)[0]
        return result

    def reduce_bucket(self, bucket):
        require_static_shapes(bucket, "parameter server")
        tensors = list(bucket.tensors)
        wires = [protocol.wire_of(t.dtype) for t in tensors]
        on_wire = [tf.cast(t, dtype) if t.dtype != dtype else t
                   for t, (_, dtype) in zip(tensors, wires)]
        plan = FusionPlan(on_wire, _UNLIMITED_BUCKET)
        step = self._step.assign_add(1)
        summed = plan.unpack([self._reduce_flat(flat, step, bucket.index + offset)
                              for offset, flat in enumerate(plan.pack(on_wire))])
        return [tf.cast(s, t.dtype) if s.dtype != t.dtype else s for s, t in zip(summed, tensors)]

    @property
    def num_servers(self):
        return len(self.clients)

    def sent_bytes(self, n_bytes):
        """n: every piece is pushed once (the sums come back in the pulls)."""
        return n_bytes

    @classmethod
    def predict_seconds(cls, n_bytes, world_size, alpha, beta, num_servers=1,
                        piece_bytes=DEFAULT_PIECE_BYTES):
        """2 (m alpha + P n / K beta), m = ceil(n / (K b)) chained calls per server."""
        if world_size == 1:
            return 0.0
        pieces = max(1, math.ceil(n_bytes / (num_servers * piece_bytes)))
        return 2 * (pieces * alpha + world_size * n_bytes / num_servers * beta)

    def _reduce_flat(self, flat, step, first_server):
        wire, _ = protocol.wire_of(flat.dtype)
        # Successive buckets start at successive servers (balances small buffers).
        plan = ShardPlan(flat.shape.num_elements(), flat.dtype.size, len(self.clients),
                         self.piece_bytes, first_server=first_server)
        self._log_plan(plan, flat)
        if self.counters is not None:
            self.counters.count_server_bytes(plan.bytes_per_server())
        first_slot = self._reserve_slots(len(plan.sizes))
        pieces = split_flat(flat, plan.sizes)
        sums = []
        for index, (piece, server) in enumerate(zip(pieces, plan.servers)):
            client, slot = self.clients[server], tf.constant(first_slot + index, tf.int64)
            pushed = self._chained(server, "push", lambda: client.call(
                protocol.push_method(wire), [tf.constant(self.rank), slot, step, piece],
                tf.TensorSpec([], tf.int32)))
            pulled_slot, pulled_step, total = self._chained(server, "pull", lambda: client.call(
                protocol.pull_method(wire), [tf.constant(self.rank)],
                protocol.pull_specs(wire)))
            stopped = tf.debugging.Assert(
                tf.not_equal(pulled_slot, protocol.STOPPED_SLOT),
                [f"tfdist rank {self.rank}: {client.description} stopped because worker rank",
                 pulled_step, "is gone (it has probably died; see its output)."])
            with tf.control_dependencies([stopped]):
                in_order = tf.debugging.Assert(
                    tf.equal(pulled_slot, slot),
                    [f"tfdist rank {self.rank}: {client.description} returned piece",
                     pulled_slot, "instead of", slot])
            with tf.control_dependencies([in_order, pushed]):
                sums.append(tf.reshape(total, piece.shape))
        return tf.concat(sums, axis=0) if len(sums) > 1 else sums[0]

    def _log_plan(self, plan, flat):
        """Print how the gradient buffer is partitioned (on the chief, normally once).

        A step also sums a row count and metric state, a few values each: only
        a buffer of at least `LOGGED_PLAN_MIN_BYTES` that is larger than every
        buffer shown before is shown (the gradients of the first model, and
        of a later, larger one).
        """
        nbytes = flat.shape.num_elements() * flat.dtype.size
        if self.rank == 0 and nbytes >= max(LOGGED_PLAN_MIN_BYTES, self._largest_logged + 1):
            self._largest_logged = nbytes
            chief_log.info(True, "tfdist parameter server partition: %d %s values (%.3f MB) in %s",
                           flat.shape.num_elements(), flat.dtype.name, nbytes / 1e6,
                           plan.describe())


DROPPED_CALL_PROBE_SECONDS = 5.0
_DROPPED_CALL = ("Socket closed", "Connection reset by peer")  # a call cut by a death


def _refused_within(address, seconds):
    """`connection_refused(address)`, probed again for up to `seconds` (a process killed
    mid-call closes its connections before its listening port)."""
    deadline = time.monotonic() + seconds
    while True:
        if connection_refused(address):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
