"""The server side of the asynchronous parameter server: parameters, the user's optimizer, a clock gate.

In the asynchronous modes (`ParameterServerStrategy(mode="async")`) each
shard server holds whole variables of the model (`async_client.placement`
spreads them over the servers by bytes) and runs the user's Keras
optimizer on them - the same class and configuration, its slot variables
living with the parameters - applying every gradient a worker pushes as it
arrives (DistBelief's Downpour). Workers pull fresh parameters before each
step.

Every request goes through one FIFO queue and one thread (`_serve_requests`)
that handles it, in arrival order:

* setup (the chief, once per optimizer): create the variables from their
  initial values and build the optimizer from its serialized config; a
  chief resuming from a backup also sends the optimizer's state (its step
  count and slot variables, by name), which a set already set up takes too;
* push: apply one worker's gradients with the learning rate it sent, then
  count the push in the worker's clock (pushes applied so far); the flags
  the worker raised (a preemption notice, `agreed_flags`) join the
  server's flags, which every later reply carries: that is how the
  workers, not in step, learn of a notice without a message of their own;
* pull: reply with the parameters and their version, the smallest clock
  over the workers (every update of every worker up to that clock is in
  them);
* state (the chief, when it backs up): reply with the parameters and the
  named slot variables of the optimizer, and its step count, read at one
  moment;
* gate (server 0; Stale Synchronous Parallel, Ho et al. 2013, as in
  Petuum Bosen): a worker about to make push c may go once every worker's
  clock is at least c - tau; until then its permit waits;
* leave (a worker's `fit` ended): the gate no longer waits for that worker
  until it pushes again;
* barrier (server 0; before `evaluate` and `predict`): a worker's permit
  comes once every live worker has arrived at the same barrier;
* gone (the server noticed a dead worker): neither the gate nor a barrier
  waits for it any more, so the other workers finish.

Values travel in pieces of at most `async_client.PIECE_ELEMENTS` floats (gRPC caps a
message at 4 MiB): a set-up or a push is handled once its final piece has
arrived (a worker's pieces arrive in order), and a pull is answered in as
many pieces as the worker asks for.

So no update is lost or applied twice (the queue holds each push once and
the one thread applies it once), a pull sees every push its worker made
before it (a worker's requests arrive in order), and parameters are never
read half-updated. Replies and permits travel through per-worker queues;
waiting on them is an asynchronous TensorFlow kernel, so a waiting request
holds a gRPC thread but no TensorFlow inter-op thread.

Cost per worker step: one push and one pull message per server
(n / K bytes each way for n bytes of parameters over K servers), plus one
gate message with SSP; the server's optimizer does the update's arithmetic.
"""

import json
import threading

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.aggregation.parameter_server import protocol
from tfdist.aggregation.parameter_server.protocol import QUEUE_CAPACITY

SETUP, PULL, PUSH, GATE, LEAVE, BARRIER, GONE, STATE = 0, 1, 2, 3, 4, 5, 6, 7
NO_STATE = -1  # a state reply's step count when the server lacks a slot the chief named
_INT32, _INT64 = tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64)
_FLOAT32, _STRING, _BOOL = (tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.string),
                            tf.TensorSpec([], tf.bool))
_VALUES = tf.TensorSpec([None], tf.float32)
# kind, set, worker, step, tau, learning rate, spec, values, final piece?, elements per piece,
# flags raised
_REQUEST_DTYPES = [tf.int32, tf.int32, tf.int32, tf.int64, tf.int64, tf.float32, tf.string,
                   tf.float32, tf.bool, tf.int64, tf.int64]
# A reply: a version (pull) or step count (state), a piece of values, the server's flags.
_REPLY_DTYPES = [tf.int64, tf.float32, tf.int64]


class _ParameterSet:
    """One optimizer's variables on this server, and the optimizer that updates them.

    A variable is named as the chief named it (its model path, "/" as "_"), so
    the optimizer's slot variables get the names the chief's own optimizer
    gives them (Keras names a slot `<variable path>_<slot>`): the backup's
    state travels by name.
    """

    def __init__(self, spec, values):
        entries = spec["variables"]
        self.shapes = [tuple(entry[0]) for entry in entries]
        self.dtypes = [tf.as_dtype(entry[1]) for entry in entries]
        names = [entry[2] if len(entry) > 2 else f"parameter_{index}"
                 for index, entry in enumerate(entries)]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        pieces = _split(values[:sum(self.sizes)], self.sizes)
        self.variables = [
            keras.Variable(piece.reshape(shape), dtype=dtype.name, name=name)
            for piece, shape, dtype, name in zip(pieces, self.shapes, self.dtypes, names)]
        self.optimizer = keras.optimizers.deserialize(spec["optimizer"])
        self.optimizer.build(self.variables)
        # A float rate is the worker's to set at every step (its callbacks change it); a
        # schedule in the optimizer runs here, on this server's update count.
        self.rate_from_worker = isinstance(self.optimizer.learning_rate, keras.Variable)
        self._apply = tf.function(self._apply_flat)
        self._read = tf.function(self._read_flat)
        if spec.get("state"):
            self.assign_state(spec["state"], values[sum(self.sizes):])

    def _apply_flat(self, values, learning_rate):
        if self.rate_from_worker:
            self.optimizer.learning_rate.assign(learning_rate)
        pieces = tf.split(values, self.sizes) if len(self.sizes) > 1 else [values]
        grads = [tf.cast(tf.reshape(piece, shape), dtype)
                 for piece, shape, dtype in zip(pieces, self.shapes, self.dtypes)]
        self.optimizer.apply(grads, self.variables)

    def _read_flat(self):
        return tf.concat([tf.reshape(tf.cast(v.value, tf.float32), [-1])
                          for v in self.variables], axis=0)

    def apply(self, values, learning_rate):
        self._apply(values, learning_rate)

    def read(self):
        return self._read() if self.variables else tf.zeros([0], tf.float32)

    # ------------------------------------------------------------ backup and resume
    def slots(self):
        """{name: variable} of the optimizer's state but its step count and rate."""
        skip = {id(self.optimizer.iterations), id(getattr(self.optimizer, "_learning_rate", None))}
        return {v.name: v for v in self.optimizer.variables if id(v) not in skip}

    def read_state(self, names):
        """(step count, parameters then the `names`d slots, flat); NO_STATE if one is missing."""
        slots = self.slots()
        if any(name not in slots for name in names):
            return NO_STATE, self.read()
        flat = [self.read()] + [tf.reshape(tf.cast(slots[name].value, tf.float32), [-1])
                                for name in names]
        return int(self.optimizer.iterations.numpy()), tf.concat(flat, axis=0)

    def assign_state(self, state, values):
        """The optimizer's step count and the named slots (`values`, flat, in that order)."""
        slots = self.slots()
        names = [name for name in state["slots"] if name in slots]
        if len(names) != len(state["slots"]):
            logging.error("tfdist: the backup names optimizer slots this server's optimizer does "
                          "not have (%s): its optimizer state starts afresh",
                          sorted(set(state["slots"]) - set(names)))
            return
        sizes = [int(np.prod(slots[name].shape)) for name in names]
        for name, piece in zip(names, _split(values, sizes)):
            slots[name].assign(tf.cast(np.reshape(piece, slots[name].shape), slots[name].dtype))
        self.optimizer.iterations.assign(int(state["iterations"]))

    def assign_all(self, spec, values):
        """A resuming chief's set-up of a set already here: its parameters and state."""
        for variable, piece in zip(self.variables, _split(values[:sum(self.sizes)], self.sizes)):
            variable.assign(tf.cast(np.reshape(piece, variable.shape), variable.dtype))
        self.assign_state(spec["state"], values[sum(self.sizes):])


def _split(values, sizes):
    return np.split(values, np.cumsum(sizes)[:-1]) if sizes else []


class AsyncParameterStore:
    """Parameters, optimizers and worker clocks of one shard server; see the module docstring.

    Args:
        name: how messages name the server.
        num_workers: number of training processes P.
    """

    def __init__(self, name, num_workers):
        self.name = name
        self.num_workers = int(num_workers)
        self.error = None
        self._requests = tf.queue.FIFOQueue(QUEUE_CAPACITY, _REQUEST_DTYPES)
        self._replies = [tf.queue.FIFOQueue(QUEUE_CAPACITY, _REPLY_DTYPES)
                         for _ in range(self.num_workers)]
        self._permits = [tf.queue.FIFOQueue(QUEUE_CAPACITY, [tf.int64])
                         for _ in range(self.num_workers)]
        self._sets = {}
        self._clocks = [0] * self.num_workers
        self._waiting = []  # (worker, push number, tau) of gates not yet open
        self._left = set()  # workers outside `fit`: the gate does not wait for them
        self._gone = set()  # dead workers: nothing waits for them
        self._flags = 0  # bits of the flags any worker raised (`agreed_flags`)
        self._barriers = [0] * self.num_workers  # barriers each worker has arrived at
        self._waiting_barriers = []  # (worker, barrier number)
        self.active = False  # an asynchronous job set parameters up here
        self.applied = tf.Variable(tf.constant(0, tf.int64))  # pushes applied (all workers)
        self._partial = {}  # (kind, set, worker) -> pieces received so far
        self._thread = None
        self._next_request = tf.function(self._requests.dequeue)

    # ------------------------------------------------------------ methods
    def methods(self):
        """{name: tf.function} to register with the server's RPC runtime.

        Each queues one request built from its arguments; those with a reply
        then wait for it in the calling worker's reply or permit queue.
        """
        return {
            "async_setup": self._method(SETUP, set_id=_INT32, worker=_INT32, spec=_STRING,
                                        values=_VALUES, final=_BOOL),
            "async_pull": self._method(PULL, self._replies, set_id=_INT32, worker=_INT32,
                                       piece_elements=_INT64),
            "async_pull_more": self._method(None, self._replies, worker=_INT32),
            "async_push": self._method(PUSH, set_id=_INT32, worker=_INT32, step=_INT64,
                                       learning_rate=_FLOAT32, values=_VALUES, final=_BOOL,
                                       flags=_INT64),
            "async_state": self._method(STATE, self._replies, set_id=_INT32, worker=_INT32,
                                        piece_elements=_INT64, spec=_STRING),
            "async_gate": self._method(GATE, self._permits, worker=_INT32, step=_INT64,
                                       tau=_INT64),
            "async_leave": self._method(LEAVE, worker=_INT32),
            "async_barrier": self._method(BARRIER, self._permits, worker=_INT32),
        }

    def _method(self, kind, replies=None, **arguments):
        """An RPC method: queue a `kind` request of `arguments` (None: none), then answer.

        The answer is the next item of the worker's queue in `replies`, or 0
        once the request is queued when there is no reply.
        """
        names = list(arguments)

        @tf.function(input_signature=list(arguments.values()))
        def method(*values):
            request = dict(zip(names, values))
            queued = [] if kind is None else [self._enqueue(kind, **request)]
            with tf.control_dependencies(queued):
                if replies is None:
                    return tf.constant(0, tf.int32)
                return protocol.by_worker(request["worker"], self.num_workers,
                                          lambda w: _as_tuple(replies[w].dequeue()))

        return method

    def _enqueue(self, kind, worker, set_id=0, step=0, tau=0, learning_rate=0.0, spec="",
                 values=None, final=True, piece_elements=0, flags=0):
        values = tf.zeros([0], tf.float32) if values is None else values
        return self._requests.enqueue((
            tf.constant(kind, tf.int32), tf.cast(set_id, tf.int32), tf.cast(worker, tf.int32),
            tf.cast(step, tf.int64), tf.cast(tau, tf.int64), tf.cast(learning_rate, tf.float32),
            tf.cast(spec, tf.string), values, tf.cast(final, tf.bool),
            tf.cast(piece_elements, tf.int64), tf.cast(flags, tf.int64)))

    def worker_gone(self, worker):
        """A worker died (noticed by the server's probes): stop waiting for it (any thread)."""
        self._enqueue(GONE, worker)

    # ------------------------------------------------------------ serving
    def start(self):
        self._thread = threading.Thread(target=self._serve_requests, daemon=True,
                                        name="tfdist-async-store")
        self._thread.start()

    def stop(self, timeout):
        """Close the queues (pending requests fail) and wait for the thread."""
        for queue in [self._requests] + self._replies + self._permits:
            queue.close(cancel_pending_enqueues=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _serve_requests(self):
        while True:
            try:
                request = self._next_request()
            except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
                return  # queues closed: shutting down
            try:
                self._handle(*request)
            except Exception as e:  # pylint: disable=broad-except
                self.error = f"tfdist {self.name}: asynchronous request failed: {e}"
                logging.error("%s", self.error)
                self.stop(timeout=0)
                return

    def _whole(self, kind, set_id, worker, values, final):
        """The values of a set-up or push once its final piece is in, else None."""
        key = (kind, set_id, worker)
        pieces = self._partial.setdefault(key, [])
        pieces.append(values)
        if not bool(final):
            return None
        del self._partial[key]
        return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)

    def _handle(self, kind, set_id, worker, step, tau, learning_rate, spec, values, final,
                piece_elements, flags):
        kind, set_id, worker = int(kind), int(set_id), int(worker)
        if kind in (SETUP, PUSH):
            values = self._whole(kind, set_id, worker, values, final)
            if values is None:
                return
        if kind == SETUP:
            self.active = True
            spec = json.loads(spec.numpy().decode())
            if set_id not in self._sets:
                self._sets[set_id] = _ParameterSet(spec, values.numpy())
            elif spec.get("state"):  # a resuming chief, on servers that kept running
                self._sets[set_id].assign_all(spec, values.numpy())
        elif kind == PULL:
            self._reply(worker, min(self._clocks), self._parameters(set_id, worker).read(),
                        piece_elements)
        elif kind == STATE:
            names = json.loads(spec.numpy().decode())["slots"]
            self._reply(worker, *self._parameters(set_id, worker).read_state(names),
                        piece_elements)
        elif kind == PUSH:
            self._flags |= int(flags)
            self._parameters(set_id, worker).apply(values, learning_rate)
            self.applied.assign_add(1)
            self._clocks[worker] += 1
            self._left.discard(worker)
            self._open_gates()
        elif kind == GATE:
            self._left.discard(worker)
            self._waiting.append((worker, int(step), int(tau)))
            self._open_gates()
        elif kind == LEAVE:
            self._left.add(worker)
            self._open_gates()
        elif kind == BARRIER:
            self._barriers[worker] += 1
            self._waiting_barriers.append((worker, self._barriers[worker]))
            self._open_barriers()
        elif kind == GONE:
            self._gone.add(worker)
            self._open_gates()
            self._open_barriers()

    def _reply(self, worker, number, flat, piece_elements):
        """(number, piece, the server's flags) for each piece of `flat`, into the worker's
        reply queue."""
        number, flags = tf.constant(number, tf.int64), tf.constant(self._flags, tf.int64)
        size, step_size = int(flat.shape[0]), max(int(piece_elements), 1)
        for start in range(0, max(size, 1), step_size):
            self._replies[worker].enqueue((number, flat[start:start + step_size], flags))

    def _parameters(self, set_id, worker):
        if set_id not in self._sets:
            raise ValueError(f"worker rank {worker} used parameter set {set_id} before the "
                             "chief set it up")
        return self._sets[set_id]

    def _open_gates(self):
        """Let through every waiting worker whose push number is within tau of the slowest."""
        taking_part = [c for w, c in enumerate(self._clocks)
                       if w not in self._left and w not in self._gone]
        slowest = min(taking_part) if taking_part else max(self._clocks)
        still = []
        for worker, step, tau in self._waiting:
            if slowest >= step - tau:
                self._permits[worker].enqueue(tf.constant(slowest, tf.int64))
            else:
                still.append((worker, step, tau))
        self._waiting = still

    def _open_barriers(self):
        """Let through every worker whose barrier every live worker has reached."""
        live = [count for w, count in enumerate(self._barriers) if w not in self._gone]
        reached = min(live) if live else max(self._barriers)
        still = []
        for worker, number in self._waiting_barriers:
            if number <= reached:
                self._permits[worker].enqueue(tf.constant(number, tf.int64))
            else:
                still.append((worker, number))
        self._waiting_barriers = still


def _as_tuple(dequeued):
    """A queue's dequeue: one tensor, or several (returned as a tuple)."""
    return tuple(dequeued) if isinstance(dequeued, (list, tuple)) else dequeued
