"""In-graph counters of one process's communication: time, bytes, and waiting for stragglers.

What `tfdist.callbacks.CommunicationMonitor` and the `tfdist/` TensorBoard
scalars report (`tfdist.profiling.report`). Every communication of a
training step (the aggregation hook's buckets, gathered sparse gradients,
the asynchronous parameter server's pulls and pushes) runs inside
`CommunicationCounters.timed`, which takes `tf.timestamp()` when the inputs
are ready and again when the outputs are, and adds the difference, the
bucket's size and the bytes this rank sends to variables - inside the
compiled step, with no host sync; a reader reads the variables (`snapshot`,
one sync) only when it logs. Steps traced while the counters are disabled
contain none of this.

Waiting for the slowest peer, without synchronized clocks: a collective
returns on rank k after the last rank arrived, so rank k's time in
communication during a step is d_k = (its wait for the last arrival) +
(the transfer), and the slowest rank waits for nobody. Hence the slowest
rank of a step is argmin_k d_k and rank k waited d_k - min_j d_j. Each rank's
d of the previous step travels, as its entry of a vector of P floats, in the
next step's first collective (the row count the strategy sums anyway): no
extra collective (`exchange_vector`, `absorb_exchange`).

Cost when enabled: per communication two timestamps and two variable
updates; per step a few scalar ops and P floats more in one all-reduce.
"""

import contextlib
import dataclasses
import threading

import numpy as np
import tensorflow as tf

from tfdist.profiling.names import COUNTERS_SCOPE


@dataclasses.dataclass(frozen=True)
class CounterSnapshot:
    """The counters' values at one moment (host copies; see `CommunicationCounters`)."""

    steps: int
    calls: int
    seconds: float
    payload_bytes: float
    sent_bytes: float
    compared_steps: int
    wait_seconds: float
    slowest_counts: tuple
    server_bytes: tuple
    host_seconds: float


class CommunicationCounters:
    """One process's communication counters (see the module docstring).

    Args:
        rank: this process's rank.
        world_size: the number of training processes.
        num_servers: parameter servers whose received bytes are counted per
            server (0: none).
    """

    def __init__(self, rank, world_size, num_servers=0):
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.num_servers = int(num_servers)
        self.enabled = False
        # (name scope, payload bytes or None when not static) of each communication a step
        # traced while active issues: what a step's collectives are (benchmarks' anatomy)
        self.traced_calls: list = []
        self._tracing = threading.local()
        self._host_seconds = 0.0
        with tf.init_scope():
            def counter(name, dtype, shape=()):
                return tf.Variable(tf.zeros(shape, dtype), trainable=False,
                                   name=f"tfdist_comm_{name}")

            # One vector per update site, so a call adds one update op, not four.
            self._per_call = counter("per_call", tf.float64, [4])  # seconds, calls, payload, sent
            self._per_step = counter("per_step", tf.float64, [3])  # steps, compared, wait seconds
            self._step_seconds = counter("step_seconds", tf.float64)  # this step so far
            self._slowest_counts = counter("slowest_counts", tf.int64, [self.world_size])
            self._server_bytes = counter("server_bytes", tf.float64, [max(self.num_servers, 1)])

    # ---------------------------------------------------------- tracing
    @contextlib.contextmanager
    def recording(self):
        """Inside: a training step is being traced; `timed` measures if the counters are enabled."""
        previous = self.active
        self._tracing.active = self.enabled
        try:
            yield self.enabled
        finally:
            self._tracing.active = previous

    @property
    def active(self):
        """True while a training step is traced with the counters enabled."""
        return getattr(self._tracing, "active", False)

    def timed(self, inputs, run, payload_bytes, sent_bytes):
        """`run()`, timed from when `inputs` are ready until its outputs are (when active).

        Args:
            inputs: the tensors the communication starts from.
            run: builds the communication; returns a nest of tensors.
            payload_bytes: bytes aggregated (the bucket's size: nccl-tests' "size").
            sent_bytes: bytes this rank puts on the wire for it.
        """
        if not self.active:
            return run()
        static = (payload_bytes if isinstance(payload_bytes, (int, float))
                  else tf.get_static_value(payload_bytes))
        self.traced_calls.append((tf.get_current_name_scope(),
                                  None if static is None else int(static)))
        # The counters' own ops run outside every `tfdist/...` scope, so traces never count
        # them as communication.
        ready = [t for t in tf.nest.flatten(inputs) if isinstance(t, (tf.Tensor, tf.Variable))]
        with tf.name_scope(COUNTERS_SCOPE), tf.control_dependencies(ready):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            outputs = run()  # in the caller's scope, tfdist/<algorithm>/...
        done = [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
        with tf.name_scope(COUNTERS_SCOPE):
            with tf.control_dependencies(done):
                elapsed = tf.timestamp() - start
            self._per_call.assign_add(tf.stack([
                elapsed, tf.ones([], tf.float64), tf.cast(payload_bytes, tf.float64),
                tf.cast(sent_bytes, tf.float64)]))
            self._step_seconds.assign_add(elapsed)
        return outputs

    def count_server_bytes(self, by_server):
        """Add the bytes this rank sends each parameter server (a list of K numbers; when active)."""
        if self.active and self.num_servers:
            with tf.name_scope(COUNTERS_SCOPE):
                self._server_bytes.assign_add(tf.constant(by_server, tf.float64))

    def add_host_seconds(self, seconds):
        """Time of a communication made eagerly from Python (timed on the host)."""
        if self.enabled:
            self._host_seconds += float(seconds)

    # ------------------------------------------------- slowest-peer exchange
    def exchange_vector(self):
        """P floats for the step's first all-reduce: this rank's previous-step seconds at `rank`.

        Starts the new step's total. Zeros when not active (the all-reduce
        keeps its shape whichever ranks measure).
        """
        if not self.active:
            return tf.zeros([self.world_size], tf.float32)
        with tf.name_scope(COUNTERS_SCOPE):
            previous = self._step_seconds.read_value()
            with tf.control_dependencies([previous]):
                self._step_seconds.assign(tf.zeros([], tf.float64))
            return tf.one_hot(self.rank, self.world_size, dtype=tf.float32) * tf.cast(
                previous, tf.float32)

    def absorb_exchange(self, summed):
        """Count the step, and the previous step's wait and slowest rank from every rank's seconds."""
        if not self.active:
            return
        with tf.name_scope(COUNTERS_SCOPE):
            self._absorb(summed)

    def _absorb(self, summed):
        every_rank_measured = tf.reduce_all(summed > 0)
        compared = tf.cast(every_rank_measured, tf.float64)
        wait = compared * tf.cast(summed[self.rank] - tf.reduce_min(summed), tf.float64)
        self._per_step.assign_add(tf.stack([tf.ones([], tf.float64), compared, wait]))
        self._slowest_counts.scatter_nd_add(
            [[tf.argmin(summed, output_type=tf.int32)]],
            tf.reshape(tf.cast(every_rank_measured, tf.int64), [1]))

    def count_step(self):
        """Count a training step that has no first all-reduce (asynchronous workers)."""
        if self.active:
            with tf.name_scope(COUNTERS_SCOPE):
                self._per_step.assign_add(tf.constant([1.0, 0.0, 0.0], tf.float64))

    # ----------------------------------------------------------- reading
    def snapshot(self):
        """The counters now (eager; one host sync)."""
        seconds, calls, payload, sent = self._per_call.numpy().tolist()
        steps, compared, wait = self._per_step.numpy().tolist()
        return CounterSnapshot(
            steps=int(steps), calls=int(calls), seconds=seconds, payload_bytes=payload,
            sent_bytes=sent, compared_steps=int(compared), wait_seconds=wait,
            slowest_counts=tuple(int(c) for c in self._slowest_counts.numpy()),
            server_bytes=tuple(float(b) for b in self._server_bytes.numpy()[:self.num_servers]),
            host_seconds=self._host_seconds)


def measurements(before, after, world_size, wall_seconds):
    """What happened between two snapshots, per training step, in reporting units.

    Keys (absent when no step was counted): `comm_ms` (time in communication
    per step: in-graph collectives and eager exchanges), `step_ms` (wall time
    per step), `comm_share` (comm_ms / step_ms), `sent_mb` (megabytes this
    rank sent per step), `algbw_gbps` (bytes aggregated per second in
    communication, GB/s), `busbw_gbps` (algbw x 2 (P - 1) / P: the nccl-tests
    bus bandwidth of an all-reduce, comparable across P), `wait_ms` (time
    this rank waited for the slowest rank, per step), `slowest_rank` (the
    rank that was slowest most often), and `server_{k}_mb` (megabytes this
    rank sent parameter server k per step).
    """
    steps = after.steps - before.steps
    if steps <= 0:
        return {}
    seconds = (after.seconds - before.seconds) + (after.host_seconds - before.host_seconds)
    payload = after.payload_bytes - before.payload_bytes
    result = {
        "comm_ms": 1e3 * seconds / steps,
        "step_ms": 1e3 * wall_seconds / steps,
        "comm_share": seconds / wall_seconds if wall_seconds > 0 else 0.0,
        "sent_mb": (after.sent_bytes - before.sent_bytes) / steps / 1e6,
    }
    in_graph_seconds = after.seconds - before.seconds
    if in_graph_seconds > 0:
        algbw = payload / in_graph_seconds / 1e9
        result["algbw_gbps"] = algbw
        result["busbw_gbps"] = algbw * 2 * (world_size - 1) / world_size
    compared = after.compared_steps - before.compared_steps
    if compared > 0:
        result["wait_ms"] = 1e3 * (after.wait_seconds - before.wait_seconds) / compared
        slowest = np.subtract(after.slowest_counts, before.slowest_counts)
        result["slowest_rank"] = int(np.argmax(slowest))
    for server, (b, a) in enumerate(zip(before.server_bytes, after.server_bytes)):
        result[f"server_{server}_mb"] = (a - b) / steps / 1e6
    return result
