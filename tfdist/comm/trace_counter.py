"""Numbers drawn while a step is traced that agree across ranks however often each rank traced.

Collectives are matched across ranks by numbers fixed when a `tf.function`
is traced: TensorFlow's instance keys, tfdist's bucket numbers (Horovod
matches tensors by the names they give), a parameter server's slots. Ranks
run the same script, so they trace the same functions for the first time
in the same order. But a function is traced again when its inputs change
shape, and the slices of one global batch differ by a row between ranks:
`model.predict` on 63 rows in batches of 32 on 2 processes gives slices of
16/16, then 15/16 - rank 0 traces its predict step again, rank 1 does not.
A counter advanced at every trace would then give the same collective
different numbers on the two ranks: each waits for a partner that never
comes.

`TraceStableCounter` therefore draws per `tf.function`: the first trace of
a function reserves spans of the process-wide counter as it needs them
(the same spans on every rank: first traces come in the same order), and
every later trace of the same function walks the same spans from the start
again. The same code traced again makes the same draws in the same order,
so every trace of it - on any rank - gets the same numbers. Draws outside
a `tf.function` (eager collectives, in program order on every rank) come
from the process-wide counter.

Cost: at trace time only, a walk up the Python stack per draw.
"""

import threading
import weakref

from tfdist import _tf


class TraceStableCounter:
    """Consecutive numbers; inside a `tf.function`, the same ones for every trace of it.

    Args:
        first: the first number.
        span: numbers reserved at a time for one function's traces.
    """

    def __init__(self, first=0, span=4096):
        self._next = int(first)
        self._span = int(span)
        self._lock = threading.Lock()
        self._functions = weakref.WeakKeyDictionary()  # tf.function -> _Spans

    def take(self, count=1):
        """The first of `count` consecutive numbers, all reserved for the caller."""
        count = int(count)
        function, graph = _tf.traced_function()
        with self._lock:
            if function is None:
                return self._fresh(count)
            spans = self._functions.get(function)
            if spans is None:
                spans = self._functions[function] = _Spans()
            return spans.take(count, graph, self._reserve)

    def _fresh(self, count):
        first, self._next = self._next, self._next + count
        return first

    def _reserve(self, count):
        """A span for a function's draws: (first, size) of at least `count` numbers."""
        size = max(count, self._span)
        return self._fresh(size), size


class _Spans:
    """The spans one function's traces draw from, walked from the start by every trace."""

    def __init__(self):
        self.spans = []  # (first, size), in the order the first trace reserved them
        self._trace = None  # weak reference to the FuncGraph of the trace drawing now
        self._span = 0
        self._used = 0

    def take(self, count, graph, reserve):
        if self._trace is None or self._trace() is not graph:
            self._trace, self._span, self._used = weakref.ref(graph), 0, 0  # a (re)trace
        while self._span < len(self.spans) and self._used + count > self.spans[self._span][1]:
            self._span, self._used = self._span + 1, 0
        if self._span == len(self.spans):
            self.spans.append(reserve(count))
        first = self.spans[self._span][0] + self._used
        self._used += count
        return first
