"""The worker side of the asynchronous parameter server (Downpour; SSP with a staleness bound).

Per training step of a worker (inside the compiled step; `async_store`
holds the servers' side):

1. gate (SSP only): ask server 0 for a permit to make push c, the worker's
   own push count; it comes once every worker has made at least c - tau
   pushes. The time blocked is the step's `ps_wait` (seconds);
2. pull: each server replies with its variables and their version v (the
   smallest push count over the workers whose updates they hold); the
   worker assigns them to its model's variables, a local cache;
3. the step computes gradients on the worker's slice as usual;
4. push: the gradients go to the servers holding their variables, with the
   worker's current learning rate; each server applies them with the
   user's optimizer as they arrive.

The staleness of an update is c - v (pushes the worker is ahead of the
slowest worker whose updates its parameters contain): 0 in lock-step,
at most tau with SSP (Ho et al. 2013), unbounded in Downpour. With
`staleness_aware_rate` on (`tfdist.callbacks.StalenessAwareLearningRate`),
the learning rate sent is divided by max(1, c - v) (Zhang et al. 2016).
Per-update statistics accumulate in-graph (`statistics`:
`tfdist.callbacks.StalenessMonitor`), without a host sync per step.

Placement: whole variables, so that any Keras optimizer works as on one
process (per-variable norms, slots); each variable goes to the server with
the fewest bytes so far, largest first (deterministic on every worker).

Cost per step: n / K bytes pulled and pushed per server (K servers, n
bytes of parameters), in messages of at most `PIECE_ELEMENTS` float32
values, chained per server; plus one gate message with SSP.
"""

import json
import threading

import keras
import numpy as np
import tensorflow as tf

from tfdist.aggregation.parameter_server.shard_plan import DEFAULT_PIECE_BYTES

HISTOGRAM_BINS = 64  # staleness 0 .. 62, and 63 for 63 or more
PIECE_ELEMENTS = DEFAULT_PIECE_BYTES // 4  # float32 values per message (gRPC caps one at 4 MiB)


def variable_bytes(variable):
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size


def bytes_by_server(variables, servers, num_servers):
    """Bytes of `variables` on each of `num_servers` servers (`servers`: each one's server)."""
    loads = [0] * num_servers
    for variable, server in zip(variables, servers):
        loads[server] += variable_bytes(variable)
    return loads


def placement(variables, num_servers):
    """Server index of each variable: largest first onto the least-loaded server (by bytes)."""
    loads = [0] * num_servers
    servers = [0] * len(variables)
    sizes = [variable_bytes(v) for v in variables]
    for index in sorted(range(len(variables)), key=lambda i: (-sizes[i], i)):
        server = min(range(num_servers), key=lambda k: (loads[k], k))
        servers[index] = server
        loads[server] += sizes[index]
    return servers


class AsyncParameterServerClient:
    """A worker's pulls, pushes and gate; see the module docstring.

    Args:
        rank: this worker's rank.
        clients: one `tfdist.comm.tf_rpc.RpcClient` per server.
        staleness: None (Downpour: no gate) or tau >= 0 (SSP).
        communicator: the workers' communicator (a barrier after set-up).
    """

    def __init__(self, rank, clients, staleness, communicator):
        self.rank = rank
        self.clients = clients
        self.staleness = staleness
        self.communicator = communicator
        self._sets = {}  # id(optimizer) -> (set id, variables, server of each variable)
        self._lock = threading.Lock()
        with tf.init_scope():
            def counter(name, dtype=tf.int64):
                return tf.Variable(tf.zeros([], dtype), trainable=False, name=name)

            self.pushes = counter("tfdist_pushes")  # this worker's pushes (its clock)
            # Since the start (read as differences, `statistics`): updates pushed,
            # their total staleness and histogram, time at the gate.
            self.updates = counter("tfdist_updates")
            self.staleness_sum = counter("tfdist_staleness_sum")
            self.wait_seconds = counter("tfdist_ps_wait", tf.float64)
            self.staleness_counts = tf.Variable(tf.zeros([HISTOGRAM_BINS], tf.int64),
                                                trainable=False, name="tfdist_staleness_counts")
            # StalenessAwareLearningRate: the rate of each update divided by its staleness.
            self.staleness_aware_rate = tf.Variable(False, trainable=False,
                                                    name="tfdist_staleness_aware_rate")
        self._pulled_version = None  # of the step being traced

    # ------------------------------------------------------------ set-up
    def parameter_set(self, optimizer, variables):
        """The set id of `optimizer`'s variables, set up on the servers on first use (eager)."""
        key = id(optimizer)
        with self._lock:
            if key in self._sets:
                return self._sets[key]
            set_id = len(self._sets)
            variables = list(variables)
            servers = placement(variables, len(self.clients))
            with tf.init_scope():
                if self.rank == 0:
                    self._set_up(set_id, optimizer, variables, servers)
                self.communicator.barrier()  # no worker pulls before the chief set up
            self._sets[key] = (set_id, variables, servers)
            return self._sets[key]

    def _set_up(self, set_id, optimizer, variables, servers):
        config = keras.optimizers.serialize(optimizer)
        for server, client in enumerate(self.clients):
            mine = [v for v, k in zip(variables, servers) if k == server]
            spec = {"variables": [[list(v.shape), tf.as_dtype(v.dtype).name] for v in mine],
                    "optimizer": config}
            values = (tf.concat([tf.reshape(tf.cast(v.value, tf.float32), [-1]) for v in mine],
                                axis=0) if mine else tf.zeros([0], tf.float32))
            pieces = _pieces(values)
            for index, piece in enumerate(pieces):
                client.call("async_setup", [tf.constant(set_id), tf.constant(self.rank),
                                            tf.constant(json.dumps(spec)), piece,
                                            tf.constant(index == len(pieces) - 1)],
                            tf.TensorSpec([], tf.int32))

    # ------------------------------------------------------------ a step
    def begin_step(self, set_id, variables, servers, gate=True):
        """Gate (SSP), then pull every server's variables into `variables` (in-graph or eager).

        Returns the assign ops; the step's reads must depend on them.
        """
        dependencies = []
        if gate and self.staleness is not None:
            start = tf.timestamp()
            with tf.control_dependencies([start]):
                permit = self.clients[0].call(
                    "async_gate", [tf.constant(self.rank), self.pushes.read_value(),
                                   tf.constant(int(self.staleness), tf.int64)],
                    tf.TensorSpec([], tf.int64))
            with tf.control_dependencies([permit]):
                dependencies.append(self.wait_seconds.assign_add(tf.timestamp() - start))
        updates, versions = [], []
        with tf.control_dependencies(dependencies):
            for server, client in enumerate(self.clients):
                mine = [v for v, k in zip(variables, servers) if k == server]
                if not mine:
                    continue
                sizes = [int(np.prod(v.shape)) for v in mine]
                version, values = self._pull(client, set_id, sum(sizes))
                versions.append(version)
                pieces = tf.split(values, sizes) if len(sizes) > 1 else [values]
                for variable, piece in zip(mine, pieces):
                    updates.append(variable.assign(
                        tf.cast(tf.reshape(piece, variable.shape), variable.dtype)))
        self._pulled_version = tf.reduce_min(tf.stack(versions)) if versions else \
            tf.constant(0, tf.int64)
        return updates

    def _pull(self, client, set_id, num_elements):
        """(version, values) of one server's variables, in pieces chained one after the other."""
        specs = (tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.float32))
        version, first = client.call(
            "async_pull", [tf.constant(set_id), tf.constant(self.rank),
                           tf.constant(PIECE_ELEMENTS, tf.int64)], specs)
        pieces = [first]
        for _ in range(1, -(-num_elements // PIECE_ELEMENTS)):
            with tf.control_dependencies([pieces[-1]]):
                pieces.append(client.call("async_pull_more", [tf.constant(self.rank)],
                                          specs)[1])
        return version, pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)

    def refresh(self, optimizer):
        """Pull the servers' current values of `optimizer`'s variables (eager; no gate)."""
        if id(optimizer) in self._sets:
            self.begin_step(*self._sets[id(optimizer)], gate=False)

    def leave(self):
        """This worker's `fit` ended: the gate stops waiting for it until it pushes again."""
        self.clients[0].call("async_leave", [tf.constant(self.rank)],
                             tf.TensorSpec([], tf.int32))

    def barrier(self):
        """Return once every live worker has called `barrier` (eager; through server 0).

        Unlike a collective, a dead worker does not block it: the server
        stops waiting for a worker it found gone.
        """
        self.clients[0].call("async_barrier", [tf.constant(self.rank)],
                             tf.TensorSpec([], tf.int64))

    def owns(self, optimizer):
        return id(optimizer) in self._sets

    def push(self, set_id, variables, servers, grads, learning_rate):
        """Send `grads` (one per variable) to their servers with the learning rate (in-graph)."""
        staleness = tf.maximum(self.pushes.read_value() - self._pulled_version, 0)
        rate = tf.cast(learning_rate, tf.float32)
        rate = tf.where(self.staleness_aware_rate,
                        rate / tf.cast(tf.maximum(staleness, 1), tf.float32), rate)
        sends = []
        for server, client in enumerate(self.clients):
            mine = [g for g, k in zip(grads, servers) if k == server]
            if not mine:
                continue
            values = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in mine], axis=0)
            pieces = _pieces(values)
            for index, piece in enumerate(pieces):
                with tf.control_dependencies(sends[-1:] if index else []):
                    sends.append(client.call(
                        "async_push", [tf.constant(set_id), tf.constant(self.rank),
                                       self.pushes.read_value(), rate, piece,
                                       tf.constant(index == len(pieces) - 1)],
                        tf.TensorSpec([], tf.int32)))
        with tf.control_dependencies(sends):
            return [self.pushes.assign_add(1), self.updates.assign_add(1),
                    self.staleness_sum.assign_add(staleness),
                    self.staleness_counts.scatter_nd_add(
                        [[tf.minimum(staleness, HISTOGRAM_BINS - 1)]],
                        tf.constant([1], tf.int64))]

    def snapshot(self):
        """The statistics counters now (eager): pass to `statistics(since=...)`."""
        return {"updates": int(self.updates.numpy()),
                "staleness_sum": int(self.staleness_sum.numpy()),
                "wait_seconds": float(self.wait_seconds.numpy()),
                "staleness_counts": self.staleness_counts.numpy().tolist()}

    def statistics(self, since=None):
        """{"updates", "staleness_mean", "staleness_max", "ps_wait_ms", "staleness_counts"}.

        Of this worker's updates since the snapshot `since` (None: since the
        start). `ps_wait_ms` is the mean time per update this worker was
        blocked at the gate, in milliseconds; `staleness_counts[s]` the
        number of its updates with staleness s (the last bin: s or more, so
        `staleness_max` reads HISTOGRAM_BINS - 1 for anything beyond).
        """
        now = self.snapshot()
        if since is not None:
            now = {"updates": now["updates"] - since["updates"],
                   "staleness_sum": now["staleness_sum"] - since["staleness_sum"],
                   "wait_seconds": now["wait_seconds"] - since["wait_seconds"],
                   "staleness_counts": [a - b for a, b in zip(now["staleness_counts"],
                                                              since["staleness_counts"])]}
        updates, counts = now["updates"], now["staleness_counts"]
        seen = [s for s, count in enumerate(counts) if count > 0]
        return {"updates": updates,
                "staleness_mean": now["staleness_sum"] / max(updates, 1),
                "staleness_max": seen[-1] if seen else 0,
                "ps_wait_ms": 1000.0 * now["wait_seconds"] / max(updates, 1),
                "staleness_counts": counts}


def _pieces(values):
    """`values` (a flat tensor of static length) cut into messages of PIECE_ELEMENTS at most."""
    size = int(values.shape[0])
    if size <= PIECE_ELEMENTS:
        return [values]
    sizes = [PIECE_ELEMENTS] * (size // PIECE_ELEMENTS)
    if size % PIECE_ELEMENTS:
        sizes.append(size % PIECE_ELEMENTS)
    return tf.split(values, sizes)
