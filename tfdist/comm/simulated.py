"""P ranks in one process: a communicator per thread, for testing algorithms in seconds.

`simulate(world_size, fn)` runs `fn(communicator)` for ranks 0..P-1, each in
its own thread with its own `SimulatedCommunicator`, and returns every
rank's result in rank order. The ranks meet at each collective as separate
processes would: the k-th collective a rank issues is matched with the k-th
of every other rank (so, as with the real engines, every rank must issue
the same collectives in the same order), the sum is computed in rank order
once all P contributions are in, and every rank gets the same tensor.
`send` / `recv` pair by (sender, receiver, instance key), as TensorFlow's
point-to-point transfers do. So an aggregation algorithm (`tfdist.aggregation`)
runs unchanged against P ranks, and a test compares its result with the
exact sum without launching a process.

Tensors are eager: collectives run when called (not inside `tf.function`;
the real engines cover compiled steps). Every wait is bounded by `timeout`
seconds; a rank that raises ends the others' waits with an error naming it,
so a test of a wrong algorithm fails instead of hanging.

Cost: one thread per rank and a Python lock per collective; numbers move by
reference, nothing is serialized. Not an engine for training.
"""

import itertools
import threading

import numpy as np
import tensorflow as tf

from tfdist.comm.base import Communicator

DEFAULT_TIMEOUT_SECONDS = 60.0


class SimulationError(RuntimeError):
    """A simulated rank failed or a wait timed out; the message names the rank."""


class _Meeting:
    """State shared by the ranks of one simulation: collective rounds and mailboxes."""

    def __init__(self, world_size, timeout):
        self.world_size = world_size
        self.timeout = timeout
        self.condition = threading.Condition()
        self.rounds = {}    # round number -> {rank: (kind, value)}
        self.results = {}   # round number -> result shared by every rank
        self.mailboxes = {}  # (sender, receiver, key) -> tensor
        self.failed = None  # (rank, exception) of the first rank that raised

    def wait_for(self, ready, rank, what):
        """Wait under the condition until `ready()`; SimulationError on failure or timeout."""
        if not self.condition.wait_for(lambda: ready() or self.failed, self.timeout):
            raise SimulationError(f"simulated rank {rank}: {what} waited more than the "
                                  f"{self.timeout:g} s timeout for its peers")
        if not ready() and self.failed:
            raise SimulationError(f"simulated rank {rank}: {what} cannot complete: rank "
                                  f"{self.failed[0]} failed ({self.failed[1]!r})")

    def collective(self, rank, number, kind, value, combine):
        """Rank `rank`'s contribution `value` to round `number`; the round's result."""
        with self.condition:
            contributions = self.rounds.setdefault(number, {})
            contributions[rank] = (kind, value)
            if len(contributions) == self.world_size:
                kinds = {k for k, _ in contributions.values()}
                if len(kinds) != 1:
                    raise SimulationError(
                        f"simulated collective {number}: ranks issued different collectives "
                        f"({dict(sorted((r, k) for r, (k, _) in contributions.items()))})")
                self.results[number] = combine([contributions[r][1]
                                                for r in range(self.world_size)])
                self.condition.notify_all()
            self.wait_for(lambda: number in self.results, rank, f"{kind} {number}")
            return self.results[number]

    def post(self, sender, receiver, key, tensor):
        with self.condition:
            self.mailboxes[(sender, receiver, key)] = tensor
            self.condition.notify_all()

    def take(self, sender, receiver, key):
        with self.condition:
            self.wait_for(lambda: (sender, receiver, key) in self.mailboxes, receiver,
                          f"recv from rank {sender} with key {key}")
            return self.mailboxes.pop((sender, receiver, key))


class SimulatedCommunicator(Communicator):
    """One rank of a simulation (`simulate`); see the module docstring."""

    engine = "simulated"
    supports_point_to_point = True

    def __init__(self, rank, meeting):
        self.rank = rank
        self.world_size = meeting.world_size
        self._meeting = meeting
        self._rounds = itertools.count()
        self._keys = 0

    def _collective(self, kind, tensor, combine):
        if tf.inside_function():
            raise NotImplementedError("the simulated communicator runs eagerly, not inside "
                                      "tf.function; test compiled steps with real processes")
        return self._meeting.collective(self.rank, next(self._rounds), kind,
                                        tf.convert_to_tensor(tensor), combine)

    def all_reduce(self, tensor):
        return self._collective("all_reduce", tensor, _sum_in_rank_order)

    def all_gather(self, tensor):
        return self._collective("all_gather", tensor, lambda values: tf.concat(values, axis=0))

    def broadcast(self, tensor, root=0):
        if not 0 <= root < self.world_size:
            raise ValueError(f"root must be a rank 0..{self.world_size - 1}. Got: {root!r}")
        return self._collective(f"broadcast from {root}", tensor, lambda values: values[root])

    def reserve_instance_keys(self, count):
        first = self._keys
        self._keys += int(count)
        return first

    def send(self, tensor, peer, instance_key):
        self._meeting.post(self.rank, peer, instance_key, tf.convert_to_tensor(tensor))
        return tf.no_op()

    def recv(self, shape, dtype, peer, instance_key):
        tensor = self._meeting.take(peer, self.rank, instance_key)
        if tensor.dtype != dtype or not tf.TensorShape(shape).is_compatible_with(tensor.shape):
            raise SimulationError(
                f"simulated rank {self.rank}: recv from rank {peer} (key {instance_key}) "
                f"expected {dtype.name}{list(tf.TensorShape(shape))}, got "
                f"{tensor.dtype.name}{tensor.shape.as_list()}")
        return tensor


def _sum_in_rank_order(values):
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def simulate(world_size, fn, timeout=DEFAULT_TIMEOUT_SECONDS):
    """`[fn(communicator) for each rank]`, the ranks running concurrently in threads.

    Raises the first rank's exception (chained, named by rank) if any rank raises.
    """
    if int(world_size) < 1:
        raise ValueError(f"world_size must be >= 1. Got: {world_size!r}")
    meeting = _Meeting(int(world_size), float(timeout))
    results = [None] * meeting.world_size

    def run(rank):
        try:
            results[rank] = fn(SimulatedCommunicator(rank, meeting))
        except BaseException as error:  # pylint: disable=broad-except
            with meeting.condition:
                if meeting.failed is None:
                    meeting.failed = (rank, error)
                meeting.condition.notify_all()

    threads = [threading.Thread(target=run, args=(rank,), name=f"simulated-rank-{rank}",
                                daemon=True) for rank in range(meeting.world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(meeting.timeout * 2)
    if meeting.failed is not None:
        rank, error = meeting.failed
        raise SimulationError(f"simulated rank {rank} failed: {error!r}") from error
    if any(thread.is_alive() for thread in threads):
        raise SimulationError(f"simulated ranks did not finish within {2 * meeting.timeout:g} s")
    return results


def as_numpy(results):
    """Each rank's result (a tensor or a list of tensors) as numpy arrays."""
    return [tf.nest.map_structure(lambda t: np.asarray(t), result) for result in results]
