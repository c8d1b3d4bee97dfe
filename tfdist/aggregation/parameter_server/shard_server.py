"""The server side of the parameter server: one shard server sums what the workers push.

Each worker sends the pieces it owns on this server in one fixed order
(`client.ParameterServerAggregator` chains its calls; `protocol`), so the server needs no
knowledge of the model: per worker it keeps an inbox and an outbox queue
(per wire dtype). A reducer thread takes the next piece from every inbox,
checks that all workers sent the same piece of the same step, adds them in
worker order (deterministic), and puts the sum into every outbox; a worker's
pull takes the next sum from its outbox.

Waits are queue operations: asynchronous TensorFlow kernels, so a pull that
waits for slower workers holds a gRPC thread but never a TensorFlow
inter-op thread (8 workers and 2 servers on 2 cores do not deadlock). The
per-worker clocks (last step pushed) and the queues serve the asynchronous
modes too: there a reducer applies each piece as it arrives.

Liveness: each worker checks in (`checkin`, HELLO) when it starts and says
goodbye at exit. The server probes the port of every checked-in worker
(`tfdist.comm.liveness`): a worker whose process is gone
(or one that never checks in within the job timeout) fails the server with
a message naming it; the server then closes its queues, so workers waiting
on it fail too instead of hanging. When every worker has said goodbye the
server stops cleanly. Probes use no TensorFlow: nothing runs beside the
served functions. In an asynchronous job (`async_store`) a dead worker does
not fail the server: the gate and barriers stop waiting for it, the other
workers finish, and the server then exits with code 1 naming it.
"""

import os
import threading
import time

import tensorflow as tf
from absl import logging

from tfdist.aggregation.parameter_server import protocol
from tfdist.aggregation.parameter_server.protocol import (GOODBYE, HELLO, QUEUE_CAPACITY,
                                                          STOPPED_SLOT, WIRE_DTYPES, pull_method,
                                                          push_method)
from tfdist.aggregation.parameter_server.async_store import AsyncParameterStore
from tfdist import env_vars
from tfdist.comm import tf_rpc
from tfdist.process_setup import job_secret
from tfdist.comm.liveness import PROBE_INTERVAL_SECONDS, ProbeCounter, connection_refused

REDUCER_EXIT_SECONDS = 30.0


class ShardServer:
    """Sums, step by step, the pieces pushed by `num_workers` workers.

    Args:
        address: "host:port" to serve on.
        num_workers: number of training processes P.
        name: how messages name this server, e.g. "parameter server 0 (host:port)".
        timeout: seconds to wait for a worker to show up.
        worker_addresses: "host:port" of each worker's TensorFlow server, probed
            to notice dead workers (empty: not probed).
        listen: the IP address to listen on, at `address`'s port ("": every interface).
    """

    def __init__(self, address, num_workers, name, timeout, worker_addresses=(), listen=""):
        self.address = address
        self.num_workers = int(num_workers)
        self.worker_addresses = tuple(worker_addresses)
        self.name = name
        self.timeout = float(timeout)
        self.error = None
        self.lost_workers = set()
        self.reducers_stopped = False
        self._stopped = threading.Event()
        workers = range(self.num_workers)
        self._inbox = {wire: [tf.queue.FIFOQueue(QUEUE_CAPACITY, [tf.int64, tf.int64, dtype])
                              for _ in workers] for wire, dtype in WIRE_DTYPES.items()}
        self._outbox = {wire: [tf.queue.FIFOQueue(QUEUE_CAPACITY, [tf.int64, tf.int64, dtype])
                               for _ in workers] for wire, dtype in WIRE_DTYPES.items()}
        self.clock = tf.Variable(tf.fill([self.num_workers], tf.constant(-1, tf.int64)))
        self._checkins = tf.Variable(tf.zeros([self.num_workers], tf.int32))
        self._received = tf.Variable(tf.zeros([2], tf.int64))  # bytes, pieces pushed here
        # The asynchronous modes' parameters, optimizer and gate (`async_store`).
        self.async_store = AsyncParameterStore(name, self.num_workers)
        methods = {"checkin": self._checkin_function(), "stats": self._stats_function(),
                   **self.async_store.methods()}
        for wire in WIRE_DTYPES:
            methods[push_method(wire)] = self._push_function(wire)
            methods[pull_method(wire)] = self._pull_function(wire)
        self._reducers = {wire: self._reduce_function(wire) for wire in WIRE_DTYPES}
        port = address.rsplit(":", 1)[1]
        self._server = tf_rpc.serve(f"{listen or '0.0.0.0'}:{port}", methods,
                                    job_secret.token(job_secret.job_secret(), protocol.TOKEN_PURPOSE))
        self._refused_seen = 0

    # ------------------------------------------------------------ methods
    def _push_function(self, wire):
        dtype = WIRE_DTYPES[wire]

        @tf.function(input_signature=[tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64),
                                      tf.TensorSpec([], tf.int64), tf.TensorSpec([None], dtype)])
        def push(worker, slot, step, values):
            def enqueue(w):
                with tf.control_dependencies([self._inbox[wire][w].enqueue((slot, step, values))]):
                    return tf.constant(0, tf.int32)
            done = protocol.by_worker(worker, self.num_workers, enqueue)
            nbytes = tf.cast(tf.size(values), tf.int64) * dtype.size
            with tf.control_dependencies([done]):
                updates = [self.clock.scatter_nd_max([[worker]], [step]),
                           self._received.assign_add(tf.stack([nbytes, 1]))]
            with tf.control_dependencies(updates):
                return tf.identity(done)

        return push

    def _stats_function(self):
        @tf.function(input_signature=[])
        def stats():
            """[process id, bytes received, pieces received, asynchronous updates applied]."""
            return tf.concat([tf.constant([os.getpid()], tf.int64), self._received.read_value(),
                              self.async_store.applied.read_value()[None]], axis=0)

        return stats

    def _pull_function(self, wire):
        @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
        def pull(worker):
            return protocol.by_worker(worker, self.num_workers,
                                      lambda w: tuple(self._outbox[wire][w].dequeue()))

        return pull

    def _checkin_function(self):
        @tf.function(input_signature=[tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])
        def checkin(worker, state):
            with tf.control_dependencies([self._checkins.scatter_nd_max([[worker]], [state])]):
                return tf.constant(0, tf.int32)

        return checkin

    def _reduce_function(self, wire):
        @tf.function
        def reduce_one():
            items = [inbox.dequeue() for inbox in self._inbox[wire]]
            slots = tf.stack([slot for slot, _, _ in items])
            steps = tf.stack([step for _, step, _ in items])
            tf.debugging.Assert(
                tf.logical_and(tf.reduce_all(tf.equal(slots, slots[0])),
                               tf.reduce_all(tf.equal(steps, steps[0]))),
                [f"tfdist {self.name}: the workers pushed different pieces (slot, step by "
                 "worker):", slots, steps, "- are all workers running the same model on the "
                 "same number of batches?"], summarize=64)
            total = tf.add_n([values for _, _, values in items])  # worker order: deterministic
            sent = [outbox.enqueue((slots[0], steps[0], total)) for outbox in self._outbox[wire]]
            with tf.control_dependencies(sent):
                return tf.constant(0)

        return reduce_one

    # ----------------------------------------------------------- lifecycle
    def _reduce_forever(self, wire):
        reduce_one = self._reducers[wire]
        while not self._stopped.is_set():
            try:
                reduce_one()
            except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
                return  # queues closed: shutting down
            except tf.errors.OpError as e:
                self._fail(e.message.splitlines()[0])
                return

    def _fail(self, message, dead_worker=None):
        if self.error is None:
            self.error = message
            logging.error("%s", message)
            if dead_worker is not None:
                self._tell_waiting_workers(dead_worker)
        self._stopped.set()

    def _tell_waiting_workers(self, dead_worker):
        """Answer every pending and future pull with STOPPED_SLOT and the dead worker's rank."""
        for wire, dtype in WIRE_DTYPES.items():
            for outbox in self._outbox[wire]:
                outbox.enqueue((tf.constant(STOPPED_SLOT, tf.int64),
                                tf.constant(dead_worker, tf.int64), tf.zeros([0], dtype)))

    def _close_queues(self):
        for boxes in (self._inbox, self._outbox):
            for queues in boxes.values():
                for queue in queues:
                    queue.close(cancel_pending_enqueues=True)

    def _check_workers(self, checkins, started, probes):
        connected = []
        for worker, state in enumerate(checkins):
            if state < HELLO and time.time() - started > self.timeout:
                self._fail(f"tfdist {self.name}: worker rank {worker} did not connect within "
                           f"the {self.timeout:g} s timeout.")
            elif state == HELLO:
                connected.append(worker)
        if probes is None:
            return
        for worker in probes.probe(connected):
            if checkins[worker] == HELLO and self.async_store.active:
                self._lose_worker(worker)
            elif checkins[worker] == HELLO:
                self._fail(f"tfdist {self.name}: worker rank {worker} "
                           f"({self.worker_addresses[worker]}) is gone (connection refused) "
                           "without saying goodbye; it has probably died (last step it pushed: "
                           f"{int(self.clock.numpy()[worker])}).", dead_worker=worker)
                return

    def _report_refused_calls(self):
        """Log calls refused for want of the job's secret since the last look: a stranger
        (or a process of another job) called this server; the job goes on."""
        refused = self._server.refused_calls()
        if refused > self._refused_seen:
            logging.warning("tfdist %s: refused %d call(s) without the job's secret (%s); "
                            "the job goes on", self.name, refused - self._refused_seen,
                            env_vars.SECRET.name)
            self._refused_seen = refused

    def _lose_worker(self, worker):
        """Asynchronous training: a dead worker is reported at the end; the others finish."""
        if worker in self.lost_workers:
            return
        self.lost_workers.add(worker)
        address = self.worker_addresses[worker]
        logging.error("tfdist %s: worker rank %d (%s) is gone (connection refused) without "
                      "saying goodbye; it has probably died. The other workers go on "
                      "(asynchronous training).", self.name, worker, address)
        self.async_store.worker_gone(worker)

    def serve(self):
        """Run until every worker has said goodbye (returns 0) or one fails (returns 1).

        On return the reducer threads have finished (`reducers_stopped`), unless
        one is still inside TensorFlow after `REDUCER_EXIT_SECONDS`: then the
        caller must not tear the interpreter down under it (`server_process`).
        """
        logging.info("tfdist %s: serving %d workers", self.name, self.num_workers)
        threads = [threading.Thread(target=self._reduce_forever, args=(wire,), daemon=True,
                                    name=f"tfdist-reducer-{wire}") for wire in WIRE_DTYPES]
        for thread in threads:
            thread.start()
        self.async_store.start()
        started = time.time()
        probes = (ProbeCounter(self.worker_addresses, connection_refused)
                  if self.worker_addresses else None)
        while not self._stopped.wait(PROBE_INTERVAL_SECONDS):
            checkins = self._checkins.numpy()
            if all(state == GOODBYE or worker in self.lost_workers
                   for worker, state in enumerate(checkins)):
                logging.info("tfdist %s: all workers finished; stopping", self.name)
                self._stopped.set()
                break
            self._check_workers(checkins, started, probes)
            self._report_refused_calls()
            if self.async_store.error:
                self._fail(self.async_store.error)
        self._close_queues()  # wakes the reducers: their dequeues fail
        store_stopped = self.async_store.stop(REDUCER_EXIT_SECONDS)
        deadline = time.monotonic() + REDUCER_EXIT_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.reducers_stopped = store_stopped and not any(t.is_alive() for t in threads)
        self.error = self.error or self.async_store.error
        if self.lost_workers and not self.error:
            lost = ", ".join(f"rank {w} ({self.worker_addresses[w]})"
                             for w in sorted(self.lost_workers))
            self.error = (f"tfdist {self.name}: worker {lost} died during asynchronous "
                          "training; the other workers finished.")
        return 1 if self.error else 0
