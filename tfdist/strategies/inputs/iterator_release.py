"""Dropped input iterators are destroyed on a background thread, not in the training loop.

Why: Keras opens a new `tf.data` iterator for every epoch (and every
evaluate, and fit's validation) and drops the previous one where its loop
rebinds a variable, so the old iterator is destroyed on the training
thread. Destroying an iterator stops its pipeline's threads; with tf.data's
autotuning on (the default, and Keras' array, tensor and file pipelines use
it) that includes the tuning thread, which only notices at its next wake-up,
on a schedule that lengthens over the iterator's life. On the digits job at
2 processes one epoch in two or three paused 0.4-1.3 s there (epochs of
0.65 s alternating with 1.25-1.95 s; 1.5-5 ms per destruction with
autotuning off), and under a strategy one rank's pause holds every rank at
the next collective. On a background thread the pause costs nothing: the
new epoch's iterator is already open and the old one only waits.

How: `LocalSliceDataset.__iter__` (the dataset a tfdist strategy hands to
Keras) returns a `ReleasedInBackgroundIterator` when iterated eagerly; when
Python drops it, its iterator resource is queued to one daemon thread,
which drops it there. What any iterator yields is unchanged.

Left alone: pipelines that call Python (`py_function`, `numpy_function`,
`from_generator`, hence Keras' generator and `PyDataset` adapters). An old
iterator of such a pipeline may still be prefetching from a Python object
the new one reads too, so it is destroyed where Keras drops it, as without
tfdist, before the new iterator's first element.

Cost: one thread per process, started when the first such iterator is
made; per dataset, one walk over its transformations' function graphs (well
under a millisecond for Keras' pipelines). `tfdist.runtime.shutdown` drains the queue before the
interpreter tears TensorFlow down (at most `_DRAIN_SECONDS`, longer than
tf.data's tuning interval grows).
"""

import queue
import sys
import threading

import tensorflow as tf
from absl import logging

from tfdist import _tf
from tfdist import runtime

_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})
_DRAIN_SECONDS = 90.0
_STOP = object()


class _Releaser:
    """One daemon thread that drops what it is handed (the objects' destructors run there)."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None
        self._closed = False

    def start(self):
        """Start the thread if it is not running; True if it runs (False once closed).

        Called when an iterator is made, never from a destructor: a destructor
        may run inside any allocation (the garbage collector), this lock held,
        or while the interpreter finalizes, when a new thread never starts.
        """
        with self._lock:
            if self._thread is None and not self._closed:
                thread = threading.Thread(target=self._run, name="tfdist-iterator-release",
                                          daemon=True)
                thread.start()
                self._thread = thread
                runtime.close_at_exit(self)
            return self._thread is not None and not self._closed

    def release(self, resources):
        """Queue `resources` to be dropped on the thread; False (the caller drops them) if it
        is not running, is closed, or the interpreter is finalizing. Takes no lock: it runs in
        destructors (`SimpleQueue.put` is safe there)."""
        if self._thread is None or self._closed or sys.is_finalizing():
            return False
        self._queue.put(resources)
        return True

    def _run(self):
        while True:
            resources = self._queue.get()
            if resources is _STOP:
                return
            del resources  # the iterator's destructor runs here

    def wait_idle(self, timeout):
        """Block until everything queued so far is dropped (tests); True if it was in time."""
        done = threading.Event()
        if not self.release(_Signal(done)):
            return True
        return done.wait(timeout)

    def close(self):
        """Drop what is queued, then stop the thread (bounded by `_DRAIN_SECONDS`)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(_DRAIN_SECONDS)
        if thread.is_alive():
            logging.warning("tfdist: input iterators still being destroyed after %.0f s at exit",
                            _DRAIN_SECONDS)


class _Signal:
    """Sets an event when dropped: `wait_idle`'s marker in the queue."""

    def __init__(self, event):
        self._event = event

    def __del__(self):
        self._event.set()


_releaser = _Releaser()


def wait_idle(timeout=30.0):
    """Block until every iterator dropped so far has been destroyed."""
    return _releaser.wait_idle(timeout)


class ReleasedInBackgroundIterator(_tf.OwnedIterator):
    """`tf.data`'s eager iterator, whose resource is destroyed on the release thread."""

    def __del__(self):
        resource = self.__dict__.pop("_iterator_resource", None)
        dataset = self.__dict__.pop("_dataset", None)
        if resource is None:
            return
        try:
            _releaser.release((resource, dataset))
        except Exception:  # pylint: disable=broad-except  (interpreter exit: drop them here)
            pass


def calls_python(dataset):
    """True if any transformation of `dataset` (or a function nested in one) runs Python."""
    pending, seen = [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if "Generator" in type(current).__name__:
            return True
        for wrapper in current._functions():  # pylint: disable=protected-access
            graph_def = wrapper.function.graph.as_graph_def()
            ops = {node.op for node in graph_def.node}
            ops.update(node.op for function in graph_def.library.function
                       for node in function.node_def)
            if ops & _PYTHON_OPS:
                return True
        pending.extend(current._inputs())  # pylint: disable=protected-access
    return False


def iterate(dataset):
    """An eager iterator of `dataset` released in the background; None inside a `tf.function`.

    For datasets without Python in them (`calls_python`), see the module. None also
    once the release thread has been closed (at exit), and for ranks simulated as threads
    (`runtime.use_communicator`): the pause it saves matters only between processes, and
    there the drain at exit was seen to wait out its whole bound."""
    if (not tf.executing_eagerly() or runtime.bound_to_communicator()
            or not _releaser.start()):
        return None
    with tf.device(dataset._variant_tensor.device):  # pylint: disable=protected-access
        return ReleasedInBackgroundIterator(dataset)
