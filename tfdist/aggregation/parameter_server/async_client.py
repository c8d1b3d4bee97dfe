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

Backup and resume (`keras.callbacks.BackupAndRestore`, on the chief):
`fetch_state` reads each server's parameters, its optimizer's step count
and slot variables at one moment into the chief's model and its own
optimizer (whose slots a worker otherwise leaves unused), so Keras' backup
file holds the servers' state; resumed, `resume_servers_from` makes the
chief's set-up send that state back (`async_store`). Slots travel by name:
a server names each variable by its model path, so its optimizer names the
slots as the chief's optimizer does.

Flags (`agreed_flags`: a preemption notice): a push carries the flags this
worker raised; every pull reply carries every flag any worker pushed, so a
notice given to one worker reaches every other at its next step.

Placement: whole variables, so that any Keras optimizer works as on one
process (per-variable norms, slots); each variable goes to the server with
the fewest bytes so far, largest first (deterministic on every worker).

Cost per step: n / K bytes pulled and pushed per server (K servers, n
bytes of parameters), in messages of at most `PIECE_ELEMENTS` float32
values, chained per server; plus one gate message with SSP.
"""

import functools
import json
import threading

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist.aggregation.parameter_server.async_store import NO_STATE
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


def server_name(variable):
    """The name a server gives `variable`: its model path ("/" as "_"), as Keras' slot names
    begin."""
    return str(getattr(variable, "path", variable.name)).replace("/", "_").replace(":", "_")


def optimizer_slots(optimizer):
    """The optimizer's state variables but its step count and (float) rate."""
    skip = {id(optimizer.iterations), id(getattr(optimizer, "_learning_rate", None))}
    return [v for v in optimizer.variables if id(v) not in skip]


def slots_by_server(optimizer, variables, servers, num_servers):
    """Each server's slots of `optimizer`, as [(name, variable)], or None if some slot's
    variable cannot be told (names not unique, a slot named after no variable).

    A slot belongs to the variable whose server name is the longest prefix of
    its own (Keras names it `<variable path>_<slot>`).
    """
    names = [server_name(v) for v in variables]
    if len(set(names)) != len(names):
        return None
    by_server = [[] for _ in range(num_servers)]
    for slot in optimizer_slots(optimizer):
        owners = [i for i, name in enumerate(names) if slot.name.startswith(name + "_")]
        if not owners:
            return None
        owner = max(owners, key=lambda i: len(names[i]))
        by_server[servers[owner]].append((slot.name, slot))
    return by_server


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
        self.pulled_flags = None  # the servers' flags, as the step being traced pulled them
        self._resume_state = None  # the backup's server state, for the chief's set-up

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
        state, self._resume_state = self._resume_state, None
        slots = (slots_by_server(optimizer, variables, servers, len(self.clients))
                 if state is not None else None)
        if state is not None and (slots is None or
                                  len(state["iterations"]) != len(self.clients)):
            logging.warning("tfdist: the backup's optimizer state does not fit these %d "
                            "server(s): the servers' optimizer starts afresh", len(self.clients))
            slots = None
        for server, client in enumerate(self.clients):
            mine = [v for v, k in zip(variables, servers) if k == server]
            spec = {"variables": [[list(v.shape), tf.as_dtype(v.dtype).name, server_name(v)]
                                  for v in mine],
                    "optimizer": config}
            if slots is not None:
                spec["state"] = {"iterations": int(state["iterations"][server]),
                                 "slots": [name for name, _ in slots[server]]}
                mine = mine + [slot for _, slot in slots[server]]
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
        updates, versions, pulled_flags = [], [], []
        with tf.control_dependencies(dependencies):
            for server, client in enumerate(self.clients):
                mine = [v for v, k in zip(variables, servers) if k == server]
                if not mine:
                    continue
                sizes = [int(np.prod(v.shape)) for v in mine]
                version, values, flags = self._pull(client, set_id, sum(sizes))
                versions.append(version)
                pulled_flags.append(flags)
                pieces = tf.split(values, sizes) if len(sizes) > 1 else [values]
                for variable, piece in zip(mine, pieces):
                    updates.append(variable.assign(
                        tf.cast(tf.reshape(piece, variable.shape), variable.dtype)))
        self._pulled_version = tf.reduce_min(tf.stack(versions)) if versions else \
            tf.constant(0, tf.int64)
        self.pulled_flags = functools.reduce(tf.bitwise.bitwise_or, pulled_flags,
                                             tf.constant(0, tf.int64))
        return updates

    def _pull(self, client, set_id, num_elements, method="async_pull", extra=()):
        """(version, values, flags) of one server's variables (`method` "async_state": its
        step count, and its slots after them), in pieces chained one after the other."""
        specs = (tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.float32),
                 tf.TensorSpec([], tf.int64))
        version, first, flags = client.call(
            method, [tf.constant(set_id), tf.constant(self.rank),
                     tf.constant(PIECE_ELEMENTS, tf.int64), *extra], specs)
        pieces = [first]
        for _ in range(1, -(-num_elements // PIECE_ELEMENTS)):
            with tf.control_dependencies([pieces[-1]]):
                pieces.append(client.call("async_pull_more", [tf.constant(self.rank)],
                                          specs)[1])
        return version, pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0), flags

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

    # ------------------------------------------------------------ backup and resume
    def fetch_state(self, optimizer):
        """Read the servers' parameters and optimizer state into the model's variables of
        `optimizer`'s set and into `optimizer`'s own slots (eager, the chief backing up). Returns {"iterations": [each server's optimizer step count]}, or
        None (with a warning) where the state cannot travel by name."""
        if id(optimizer) not in self._sets:
            return None
        set_id, variables, servers = self._sets[id(optimizer)]
        slots = slots_by_server(optimizer, variables, servers, len(self.clients))
        if slots is None:
            logging.warning("tfdist: the servers' optimizer state cannot be matched to %s's "
                            "variables by name: the backup holds the parameters only",
                            optimizer.name)
            return None
        iterations = []
        for server, client in enumerate(self.clients):
            mine = [v for v, k in zip(variables, servers) if k == server]
            targets = mine + [slot for _, slot in slots[server]]
            sizes = [int(np.prod(v.shape)) for v in targets]
            if not targets:
                iterations.append(0)
                continue
            names = json.dumps({"slots": [name for name, _ in slots[server]]})
            count, values, _ = self._pull(client, set_id, sum(sizes), "async_state",
                                          [tf.constant(names)])
            if int(count) == NO_STATE:
                logging.warning("tfdist: server %d lacks some of %s's slots: the backup holds "
                                "the parameters only", server, optimizer.name)
                return None
            pieces = tf.split(values, sizes) if len(sizes) > 1 else [values]
            for target, piece in zip(targets, pieces):
                target.assign(tf.cast(tf.reshape(piece, target.shape), target.dtype))
            iterations.append(int(count))
        return {"iterations": iterations}

    def resume_servers_from(self, state):
        """The chief's next set-up sends the backup's server `state` (`fetch_state`'s) with the
        restored slots of its optimizer."""
        self._resume_state = state

    def push(self, set_id, variables, servers, grads, learning_rate, flags=0):
        """Send `grads` (one per variable) to their servers with the learning rate and the
        flags this worker raised (in-graph)."""
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
                                       tf.constant(index == len(pieces) - 1),
                                       tf.cast(flags, tf.int64)],
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
