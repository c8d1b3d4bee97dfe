"""P ranks in one process: a communicator per thread, for testing algorithms in seconds.

`simulate(world_size, fn)` runs `fn(communicator)` for ranks 0..P-1, each in
its own thread with its own `SimulatedCommunicator`, and returns every
rank's result in rank order. The ranks meet at each collective as separate
processes would: the k-th collective a rank issues is matched with the k-th
of every other rank (so, as with the real engines, every rank must issue
the same collectives in the same order), the sum is computed in rank order
once all P contributions are in, and every rank gets the same tensor.
`send` / `recv` pair by (sender, receiver, instance key), as TensorFlow's
point-to-point transfers do (inside a function, also by how many times
that transfer has run). So an aggregation algorithm (`tfdist.aggregation`)
runs unchanged against P ranks, and a test compares its result with the
exact sum without launching a process.

Collectives run eagerly when called, and inside `tf.function` as a
`tf.py_function` each: as TensorFlow's collective ops carry an instance key
fixed when the function is traced, a collective traced in a function is
matched by the number it got when traced (`trace_counter`: the same on
every rank however often each traced the function) and by how many times
it has run, so ops a step runs in parallel, in any order, still meet their
peers' (a rank's eager collectives are matched in the order it issues
them). Every wait is
bounded: it fails after `timeout` seconds in which no late peer moved (its
Python stack unchanged and its thread using no CPU time: blocked, or waiting
in another collective), and in
any case after `PROGRESS_CAP` times `timeout`, naming where each late peer
is; a peer still tracing a step on a loaded machine is not taken for a
hung one. A rank that raises ends the others' waits with an error naming
it, so a test of a wrong algorithm fails instead of hanging.

`tfdist.simulation.simulate_processes(world_size, fn)` also binds each
thread to its communicator, so the strategies `fn` builds are P ranks of
one job: Keras' `fit`/`evaluate`/`predict` and custom loops run with
tfdist's real patches at P ranks in one process (the in-process Keras test
tier). A compiled step's collectives block
TensorFlow's inter-op threads while they wait for their peers, so the
process needs more of them than ranks: `reserve_inter_op_threads` before
TensorFlow starts.

Cost: one thread per rank and a Python lock per collective; numbers move by
reference, nothing is serialized. Not an engine for training.
"""

import collections
import faulthandler
import gc
import itertools
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Optional, Sequence, TypeVar

import numpy as np
import tensorflow as tf

from tfdist.comm.base import Communicator, checked_static_shape
from tfdist.comm.trace_counter import TraceStableCounter

# A wait gives up after this long without progress. A peer's thread seen sitting at one Python
# line, using no CPU time, for 30-60 s and more was a garbage collection destroying a tf.data
# iterator in that rank (`_CollectionsOnTheWaitingThread` moved them); a failing wait dumps
# every thread's stack to stderr.
DEFAULT_TIMEOUT_SECONDS = 120.0
# A wait whose late peers keep moving ends after at most this many timeouts.
PROGRESS_CAP = 5
# A late peer whose thread used this share of a core between two looks is computing (a long
# native call: the same Python stack, not hung); a waiting one uses far less.
CPU_PROGRESS = 0.05
# Inter-op threads a process of simulated ranks needs (see `reserve_inter_op_threads`).
INTER_OP_THREADS = 16
# While ranks run, Python's cyclic garbage collector runs on the thread that waits for them,
# this often (`_CollectionsOnTheWaitingThread`).
COLLECT_EVERY_SECONDS = 5.0


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
        self.threads = {}   # rank -> its thread (`simulate`), to say where a late peer is

    def wait_for(self, ready, rank, what, waiting_for=()):
        """Wait under the condition until `ready()`; SimulationError on failure, or when the
        ranks of `waiting_for` made no progress for `timeout` seconds (or the wait passed
        `PROGRESS_CAP` timeouts), naming where each of them is."""
        start = idle_since = time.monotonic()
        poll = max(min(5.0, self.timeout / 4), 0.01)
        seen, seen_cpu = None, {}
        while not self.condition.wait_for(lambda: ready() or self.failed, poll):
            now = time.monotonic()
            peers = waiting_for() if callable(waiting_for) else waiting_for
            where = [_where(self.threads.get(peer), frames=16) for peer in peers]
            cpu = {peer: _cpu_seconds(self.threads.get(peer)) for peer in peers}
            computed = any(None not in (cpu[p], seen_cpu.get(p))
                           and cpu[p] - seen_cpu[p] >= CPU_PROGRESS * poll for p in peers)
            if where != seen or computed:  # a late peer moved or computed: not hung
                idle_since = now
            seen, seen_cpu = where, cpu
            if now - idle_since >= self.timeout or now - start >= PROGRESS_CAP * self.timeout:
                late = "".join(
                    f"; rank {peer} is at {_where(self.threads.get(peer))} (its thread's CPU "
                    f"time: {cpu[peer]} s)" for peer in peers)
                _dump_threads(f"simulated rank {rank}: {what} gives up waiting")
                raise SimulationError(
                    f"simulated rank {rank}: {what} waited {now - start:.0f} s for its peers, "
                    f"{now - idle_since:.0f} s of it without progress (timeout "
                    f"{self.timeout:g} s){late}")
        if not ready() and self.failed:
            raise SimulationError(f"simulated rank {rank}: {what} cannot complete: rank "
                                  f"{self.failed[0]} failed ({_describe(self.failed[1])})")

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
            self.wait_for(lambda: number in self.results, rank, f"{kind} {_round_name(number)}",
                          waiting_for=lambda: [r for r in range(self.world_size)
                                               if r not in contributions])
            return self.results[number]

    def post(self, sender, receiver, key, tensor):
        with self.condition:
            self.mailboxes[(sender, receiver, key)] = tensor
            self.condition.notify_all()

    def take(self, sender, receiver, key):
        with self.condition:
            self.wait_for(lambda: (sender, receiver, key) in self.mailboxes, receiver,
                          f"recv from rank {sender} with key {key}", waiting_for=[sender])
            return self.mailboxes.pop((sender, receiver, key))


class SimulatedCommunicator(Communicator):
    """One rank of a simulation (`simulate`); see the module docstring."""

    engine = "simulated"
    supports_point_to_point = True
    reduces_scatter = True  # as Horovod's engine: sharded optimizer tests take that path
    # As Open MPI's engine (a sum of threads' tensors): the in-process tier's ring steps learn
    # the row count first and weight losses (the tree's and the servers' weight after the sum).
    small_all_reduce_is_cheap = True

    def __init__(self, rank: int, meeting: _Meeting) -> None:
        self.rank = rank
        self.world_size = meeting.world_size
        self.timeout = meeting.timeout
        self._meeting = meeting
        self._rounds = itertools.count()
        self._traced = TraceStableCounter()  # numbers of the collectives traced in functions
        self._runs: collections.Counter = collections.Counter()  # traced collective or transfer -> times it has run
        self._keys = TraceStableCounter()  # point-to-point keys (`reserve_instance_keys`)

    def _collective(self, kind: str, tensor: tf.Tensor,
                    combine: Callable[[List[tf.Tensor]], tf.Tensor],
                    shape: Optional[tf.TensorShape] = None) -> tf.Tensor:
        """`combine` of every rank's `tensor`; `shape`: the result's static shape if not the
        tensor's (inside a function)."""
        tensor = tf.convert_to_tensor(tensor)
        if not tf.inside_function():
            return self._meeting.collective(self.rank, ("eager", next(self._rounds)), kind,
                                            tensor, combine)
        traced = self._traced.take()

        def run(value):
            number = ("traced", traced, self._next_run(traced))
            return self._meeting.collective(self.rank, number, kind, value, combine)

        result = tf.py_function(run, [tensor], tensor.dtype, name=f"simulated_{kind.split()[0]}")
        result.set_shape(tensor.shape if shape is None else shape)
        return result

    def all_reduce(self, tensor: tf.Tensor) -> tf.Tensor:
        return self._collective("all_reduce", tensor, _sum_in_rank_order)

    def reduce_scatter(self, tensor: tf.Tensor) -> tf.Tensor:
        tensor = checked_static_shape(tensor, "reduce_scatter")
        width = tensor.shape[0] // self.world_size
        if tensor.shape.rank != 1 or width * self.world_size != tensor.shape[0]:
            raise ValueError(f"reduce_scatter takes a 1-D tensor of a multiple of "
                             f"{self.world_size} elements. Got shape {tensor.shape}")
        total = self._collective("reduce_scatter", tensor, _sum_in_rank_order)
        return total[self.rank * width:(self.rank + 1) * width]

    def all_gather(self, tensor: tf.Tensor) -> tf.Tensor:
        tensor = tf.convert_to_tensor(tensor)
        return self._collective("all_gather", tensor, lambda values: tf.concat(values, axis=0),
                                shape=tf.TensorShape([None]).concatenate(tensor.shape[1:]))

    def broadcast(self, tensor: tf.Tensor, root: int = 0) -> tf.Tensor:
        if not 0 <= root < self.world_size:
            raise ValueError(f"root must be a rank 0..{self.world_size - 1}. Got: {root!r}")
        return self._collective(f"broadcast from {root}", tensor, lambda values: values[root])

    def reserve_instance_keys(self, count: int) -> int:
        return self._keys.take(count)

    def send(self, tensor: tf.Tensor, peer: int, instance_key: int) -> tf.Operation:
        tensor = tf.convert_to_tensor(tensor)
        if not tf.inside_function():
            self._meeting.post(self.rank, peer, (instance_key, "eager"), tensor)
            return tf.no_op()
        transfer = (self.rank, peer, instance_key)

        def post(value):
            self._meeting.post(self.rank, peer, (instance_key, self._next_run(transfer)), value)
            return tf.constant(0)

        return tf.py_function(post, [tensor], tf.int32, name="simulated_send").op

    def recv(self, shape: Sequence[int], dtype: tf.DType, peer: int,
             instance_key: int) -> tf.Tensor:
        if not tf.inside_function():
            return self._checked(self._meeting.take(peer, self.rank, (instance_key, "eager")),
                                 shape, dtype, peer, instance_key)
        transfer = (peer, self.rank, instance_key)

        def take():
            number = self._next_run(transfer)
            return self._checked(self._meeting.take(peer, self.rank, (instance_key, number)),
                                 shape, dtype, peer, instance_key)

        result = tf.py_function(take, [], dtype, name="simulated_recv")
        result.set_shape(shape)
        return result

    def _next_run(self, traced):
        """How many times the traced collective or transfer `traced` ran before this run."""
        number = self._runs[traced]
        self._runs[traced] += 1
        return number

    def _checked(self, tensor, shape, dtype, peer, instance_key):
        if tensor.dtype != dtype or not tf.TensorShape(shape).is_compatible_with(tensor.shape):
            raise SimulationError(
                f"simulated rank {self.rank}: recv from rank {peer} (key {instance_key}) "
                f"expected {dtype.name}{list(tf.TensorShape(shape))}, got "
                f"{tensor.dtype.name}{tensor.shape.as_list()}")
        return tensor


def _round_name(number):
    """An eager round ("eager", n) as n; a traced one as "(traced collective k, run r)"."""
    if number[0] == "eager":
        return str(number[1])
    return f"(traced collective {number[1]}, run {number[2]})"


def _describe(error):
    """`Type: the message's telling line` (TensorFlow's errors have an empty repr; an error
    raised while tracing puts the user-code traceback first and the message last)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[-1] if lines[0].startswith("in user code") else lines[0]
    return f"{type(error).__name__}: {line[:500]}"


def _sum_in_rank_order(values):
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def reserve_inter_op_threads(threads: int = INTER_OP_THREADS) -> None:
    """Give TensorFlow's inter-op pool `threads` threads, before TensorFlow starts.

    A compiled step's simulated collective holds one inter-op thread while
    it waits for its peers (TensorFlow sizes the pool to the CPUs: 2 here),
    so P ranks need more than P. Raises RuntimeError, saying so, once
    TensorFlow has started with fewer.
    """
    try:
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        configured = tf.config.threading.get_inter_op_parallelism_threads()
        if not configured or configured < threads:
            raise RuntimeError(
                "simulated ranks running compiled steps need TensorFlow's inter-op pool to "
                f"have {threads} threads; TensorFlow started with "
                f"{configured or 'one per CPU'}: call reserve_inter_op_threads() before any "
                "TensorFlow op runs") from None


Result = TypeVar("Result")


def simulate(world_size: int, fn: Callable[[SimulatedCommunicator], Result],
             timeout: float = DEFAULT_TIMEOUT_SECONDS) -> List[Result]:
    """`[fn(communicator) for each rank]`, the ranks running concurrently in threads.

    Raises the first rank's exception (chained, named by rank) if any rank raises.
    """
    if int(world_size) < 1:
        raise ValueError(f"world_size must be >= 1. Got: {world_size!r}")
    meeting = _Meeting(int(world_size), float(timeout))
    results: List[Any] = [None] * meeting.world_size

    finished = []

    def run(rank):
        try:
            results[rank] = fn(SimulatedCommunicator(rank, meeting))
        except BaseException as error:  # pylint: disable=broad-except
            with meeting.condition:
                if meeting.failed is None:
                    meeting.failed = (rank, error)
        finally:
            with meeting.condition:
                finished.append(rank)
                meeting.condition.notify_all()

    threads = [threading.Thread(target=run, args=(rank,), name=f"simulated-rank-{rank}",
                                daemon=True) for rank in range(meeting.world_size)]
    meeting.threads = dict(enumerate(threads))
    # Every rank finished, or one failed; a rank computing long outside any collective is
    # waited for up to the cap of a wait (its peers' waits bound the rest).
    limit = PROGRESS_CAP * meeting.timeout
    with _CollectionsOnTheWaitingThread() as collections_here:
        for thread in threads:
            thread.start()
        collections_here.wait(meeting.condition, lambda: (
            meeting.failed is not None or len(finished) == meeting.world_size), limit)
        cleanup = time.monotonic() + meeting.timeout  # the others end at their next collective
        for thread in threads:
            thread.join(max(0.0, cleanup - time.monotonic()))
    if meeting.failed is not None:
        rank, error = meeting.failed
        raise SimulationError(f"simulated rank {rank} failed: {_describe(error)}") from error
    if len(finished) < meeting.world_size:
        _dump_threads("simulated ranks did not finish")
        raise SimulationError(f"simulated ranks did not finish within {limit:g} s (ranks "
                              f"{sorted(set(range(meeting.world_size)) - set(finished))} did "
                              "not)")
    return results


class _CollectionsOnTheWaitingThread:
    """While simulated ranks run, Python's cyclic garbage collector runs on the thread that
    waits for them, never inside a rank.

    Why: left automatic, a collection runs in whichever thread allocates, so in a rank's.
    One that destroys a `tf.data` iterator caught in a reference cycle (seen: a fit stopped
    by an exception, whose traceback holds it) waits there for the pipeline's threads to end
    (`RootDataset::Iterator`'s destructor; autotuning's thread wakes on a schedule that
    lengthens to a minute). That rank then sits at one Python line using no CPU time while its
    peers wait for it: seen 2-5 s in one file of the in-process tier, and past the 120 s wait
    limit once, failing a correct test. Reference counting, which frees nearly everything,
    still runs where an object is dropped.

    How: entering turns automatic collections off (process-wide, counted across concurrent
    simulations); `wait` collects every `COLLECT_EVERY_SECONDS` between its waits; leaving
    turns them back on as they were (the next one runs on the caller's thread).
    Cost: one full collection per period (0.16 s with TensorFlow and a fitted Keras model
    loaded), a few percent of the GIL.
    """

    _lock = threading.Lock()
    _users = 0
    _was_enabled = True

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._users == 0:
                cls._was_enabled = gc.isenabled()
                gc.disable()
            cls._users += 1
        return self

    def __exit__(self, *exc_info):
        cls = type(self)
        with cls._lock:
            cls._users -= 1
            if cls._users == 0 and cls._was_enabled:
                gc.enable()

    @staticmethod
    def wait(condition, done, limit):
        """Wait on `condition` until `done()` or `limit` seconds, collecting between waits
        (outside the condition's lock: a destructor may need it)."""
        deadline = time.monotonic() + limit
        while True:
            with condition:
                if condition.wait_for(done, max(0.0, min(COLLECT_EVERY_SECONDS,
                                                         deadline - time.monotonic()))):
                    return
            if time.monotonic() >= deadline:
                return
            gc.collect()


def _dump_threads(why: str) -> None:
    """`why` and every thread's Python stack on stderr (where a wait gives up)."""
    try:
        print(f"{why}; every thread's stack:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (OSError, ValueError):  # a stderr without a file descriptor
        pass


def _cpu_seconds(thread) -> Optional[float]:
    """CPU seconds `thread` has used (Linux: /proc; None elsewhere or once it ended).

    A late peer in one long native call (a big graph's op creation, a kernel) shows
    the same Python stack sample after sample while its CPU time grows: moving, not hung.
    """
    native_id = getattr(thread, "native_id", None)
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # utime and stime: fields 14 and 15 of stat(5), the 12th and 13th after the name.
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def _where(thread, frames=4):
    """The innermost `frames` Python frames of `thread` outside `threading` ("file:line in
    function" each, innermost first)."""
    frame = sys._current_frames().get(thread.ident) if thread is not None else None  # pylint: disable=protected-access
    if frame is None:
        return "no running thread"
    stack = [f for f in traceback.extract_stack(frame)
             if os.path.basename(f.filename) != "threading.py"][-frames:]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
                       for f in reversed(stack))


def as_numpy(results: Sequence[Any]) -> List[Any]:
    """Each rank's result (a tensor or a list of tensors) as numpy arrays."""
    return [tf.nest.map_structure(lambda t: np.asarray(t), result) for result in results]
