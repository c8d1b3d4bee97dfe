"""Whether a tensor of a step is computed from the step's batch, traced or eager alike.

A sparse gradient (`tf.IndexedSlices`) has one (index, value) pair per
lookup. When the indices come from the batch (an `Embedding` of the input
tokens, a `Dense` layer on a `SparseTensor` input), one process's pairs for
the global batch are every rank's pairs in rank order: tfdist gathers them.
When they do not (keras.io's position embedding,
`Embedding(maxlen)(ops.arange(maxlen))`), one process looks every index up
once and sums the values over the batch; every rank looks up the same
indices, so the global gradient is the same indices with the values summed
over ranks. `BatchLineage.reads_batch` tells the two apart.

The rule: a tensor reads the batch if an op it is computed from took one of
the step's inputs - every component of them: the indices, values and shape
of a `tf.SparseTensor`, the values and row splits of a `tf.RaggedTensor`, in
any nesting of dicts and tuples. Shapes are the exception: every rank holds
rows of the same global batch, so a dimension other than the first
(`tf.shape(x)[1]`, a sequence length) is the same on every rank and does not
count; the first (the slice's rows) does.

The rule is applied the same way to a traced step and to an eager one
(`run_eagerly=True`, an eager custom loop):

* traced: one walk back over the ancestors of the tensor in the graph;
* eager: there is no graph to walk, so the lineage is followed forward while
  the step runs (`recording`): a TensorFlow op callback marks every output of
  an op that took a marked tensor (the inputs' components first), with the
  same exception for shapes. Marks are weak references: a tensor that is
  freed is forgotten, and its id is never mistaken for a later tensor's.
  Lineage that leaves TensorFlow (`.numpy()` in the user's eager code) is
  lost; `GlobalGradients` therefore also checks that indices taken as shared
  are the same on every rank, and gathers them as batch pairs when they are
  not.

Indices may also have been made unique before the lookup: Keras multiplies a
`SparseTensor` input by a kernel through `tf.nn.embedding_lookup_sparse`,
which looks up `tf.unique` of the batch's column ids, so one process holds
each index once, its values summed. `looked_up_once` finds such indices
(a `Unique` op's first output, reshaped or cast at most); their pairs
gathered from the ranks are summed per index the same way.

A denominator counts only when it reads the batch's values (`sum(mask)`,
`count_nonzero(w)`): one computed from sizes alone (`tf.size(losses)`, the
element count Keras' own means divide by) is proportional to the rows, which
the step's share weighting already makes exact.

The same lineage finds the denominator of a hand-written mean over the
batch, a scalar loss computed as `ops.sum(loss * mask) / ops.sum(mask)`
(keras.io's per-token NER loss, a `compute_loss` override, a custom step's
own ratio): a ratio of two values that both read the batch
(`ratio_denominator`), whose global value is the ratio of the sums. A
denominator may guard its sum with a constant, `max(sum(w), 1)` or
`sum(m) + 1e-8`: one process applies the guard to the global sum, so the
`RatioDenominator` says which sum and which guard.

Cost: traced, one walk over the ancestors of the tensor, once per trace;
eager, one Python call per op of the step and one weak reference per
batch-derived tensor while it lives.
"""

import contextlib
import dataclasses
import weakref
from typing import Any, Callable

import tensorflow as tf

from tfdist import _tf

_DIVISIONS = ("RealDiv", "DivNoNan", "Div", "TrueDiv")
_PASS_THROUGH = ("Identity", "Cast")
# Ops a denominator may apply to its batch sum with a constant: max(sum(w), 1), sum(m) + eps.
_WITH_A_CONSTANT = {"Maximum": tf.maximum, "AddV2": tf.add, "Add": tf.add}
_UNIQUE = ("Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2")
_SIZES = ("Shape", "ShapeN", "Size", "Rank")  # read a tensor's sizes, not its values
_VALUES, _SIZES_ONLY = "values", "sizes"  # what of the batch an eager tensor is computed from
_SAME_ELEMENTS = ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims")


def components(inputs):
    """The tensors of a step's inputs, composites (sparse, ragged) expanded, nests flattened."""
    return [t for t in tf.nest.flatten(inputs, expand_composites=True)
            if isinstance(t, tf.Tensor)]


@dataclasses.dataclass
class RatioDenominator:
    """The denominator D_r = f(T_r) of a hand-written ratio on this rank's slice.

    Attributes:
        local: D_r, as the step computed it.
        inner: T_r, the batch sum inside it (D_r itself when there is no guard).
        outer: f, applied to a float32 global sum of `inner`: one process's D.
    """

    local: Any
    inner: Any
    outer: Callable[[Any], Any]


class BatchLineage:
    """Which tensors of one step are computed from its inputs; see the module docstring.

    Args:
        inputs: the step function's arguments (any nest of tensors and composites).
    """

    def __init__(self, inputs=()):
        tensors = components(inputs)
        self._graph_sources = {t.op for t in tensors if not _is_eager(t)}
        self._marked = {}  # id(eager tensor) -> (weak reference, _VALUES or _SIZES_ONLY)
        self._shapes = {}  # id(eager Shape output) -> (weak reference, rank of its input)
        self._ratios = {}  # id(eager scalar) -> (weak reference, op type, input scalars)
        self._unique = {}  # id(eager tensor) -> weak reference (a Unique op's first output)
        for tensor in tensors:
            if _is_eager(tensor):
                self._mark(tensor)

    # ------------------------------------------------------------------ queries
    def reads_batch(self, tensor):
        """True if `tensor` is computed from the inputs (other than their non-batch sizes)."""
        if _is_eager(tensor):
            return self._mark_of(tensor) is not None
        return self._graph_reads(tensor, _is_non_batch_dimension)

    def reads_batch_values(self, tensor):
        """True if `tensor` is computed from the inputs' values, not only from their sizes."""
        if _is_eager(tensor):
            return self._mark_of(tensor) == _VALUES
        return self._graph_reads(tensor, lambda op: op.type in _SIZES
                                 or _is_non_batch_dimension(op))

    def _graph_reads(self, tensor, skip):
        sources = self._graph_sources
        if not sources or not hasattr(tensor, "op"):
            return bool(sources)
        return _tf.has_ancestor(tensor, lambda op: op in sources, skip=skip)

    def looked_up_once(self, indices):
        """True if `indices` are a `Unique` op's first output (reshaped or cast at most)."""
        if _is_eager(indices):
            entry = self._unique.get(id(indices))
            return entry is not None and entry() is indices
        if not hasattr(indices, "op"):
            return False
        while indices.op.type in _SAME_ELEMENTS:
            indices = indices.op.inputs[0]
        return indices.op.type in _UNIQUE and indices.value_index == 0

    def ratio_denominator(self, tensor):
        """The `RatioDenominator` of a scalar `tensor` computed as a ratio of two batch values,
        or None.

        `sum(loss * mask) / sum(mask)` over one process's batch is a ratio of
        sums; on P processes its value is the ratio of the sums over all
        ranks, which the caller computes from this denominator. None when
        `tensor` is not such a division (a `Mean` op, a constant-weighted
        value).
        """
        if getattr(tensor, "shape", None) is None or tensor.shape.rank != 0:
            return None
        node = self._producer(tensor)
        while node is not None and node[0] in _PASS_THROUGH:
            node = self._producer(node[1][0])
        if node is None or node[0] not in _DIVISIONS:
            return None
        numerator, denominator = node[1][0], node[1][1]
        if denominator.shape.rank != 0:
            return None
        if not (self.reads_batch(numerator) and self.reads_batch_values(denominator)):
            return None
        inner, guards = denominator, []
        node = self._producer(inner)
        while node is not None and (node[0] in _PASS_THROUGH or node[0] in _WITH_A_CONSTANT):
            if node[0] in _PASS_THROUGH:
                inner = node[1][0]
            else:
                reading = [t for t in node[1] if self.reads_batch(t)]
                constants = [t for t in node[1] if not self.reads_batch(t)]
                if len(reading) != 1 or len(constants) != 1 or constants[0].shape.rank != 0:
                    break
                guards.append((_WITH_A_CONSTANT[node[0]], constants[0]))
                inner = reading[0]
            node = self._producer(inner)

        def outer(total):
            for guard, constant in reversed(guards):
                total = guard(total, tf.cast(constant, total.dtype))
            return total

        return RatioDenominator(denominator, inner, outer)

    def _producer(self, tensor):
        """(op type, inputs) of the op that made `tensor`, or None (eager: scalars only)."""
        if _is_eager(tensor):
            entry = self._ratios.get(id(tensor))
            if entry is None or entry[0]() is not tensor:
                return None
            return entry[1], entry[2]
        if not hasattr(tensor, "op"):
            return None
        return tensor.op.type, list(tensor.op.inputs)

    # -------------------------------------------------------- eager recording
    @contextlib.contextmanager
    def recording(self):
        """Inside, in eager mode: follow the lineage of every op this thread runs."""
        if not tf.executing_eagerly():
            yield self
            return
        _tf.add_op_callback(self._after_op)
        try:
            yield self
        finally:
            _tf.remove_op_callback(self._after_op)

    def _after_op(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        """TensorFlow's op callback: mark what an eager op computed from marked tensors."""
        del op_name
        if graph is not None or not outputs:
            return None  # an op added to a graph (a function being traced): not run here
        op_type = op_type.decode() if isinstance(op_type, bytes) else op_type
        if ((op_type in _DIVISIONS or op_type in _PASS_THROUGH or op_type in _WITH_A_CONSTANT)
                and outputs[0].shape.rank == 0):
            scalars = [t for t in inputs if t.shape.rank == 0]
            if len(scalars) == len(inputs):
                self._remember(self._ratios, outputs[0], op_type, list(inputs))
        if op_type in _UNIQUE or (op_type in _SAME_ELEMENTS and inputs
                                  and self.looked_up_once(inputs[0])):
            self._remember(self._unique, outputs[0])
        marks = [self._mark_of(t) for t in inputs]
        if not any(marks):
            return None
        if op_type == "Shape":
            self._remember(self._shapes, outputs[0], inputs[0].shape.rank)
        if op_type == "StridedSlice" and self._is_non_batch_size(inputs, attrs):
            return None
        kind = _VALUES if _VALUES in marks and op_type not in _SIZES else _SIZES_ONLY
        for output in outputs:
            self._mark(output, kind)
        return None

    def _is_non_batch_size(self, inputs, attrs):
        """An eager `tf.shape(x)[k]`, k a dimension other than the first."""
        entry = self._shapes.get(id(inputs[0]))
        if entry is None or entry[0]() is not inputs[0]:
            return False
        shrink = dict(zip(attrs[::2], attrs[1::2])).get("shrink_axis_mask", 0)
        begin = inputs[1].numpy().reshape(-1)
        return _is_other_dimension(begin, shrink, entry[1])

    def _mark(self, tensor, kind=_VALUES):
        self._remember(self._marked, tensor, kind)

    def _mark_of(self, tensor):
        """_VALUES or _SIZES_ONLY for an eager tensor computed from the batch, else None."""
        entry = self._marked.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        return entry[1]

    @staticmethod
    def _remember(table, tensor, *details):
        """`table[id(tensor)]` = a weak reference (and `details`), dropped when it is freed."""
        key = id(tensor)

        def forget(reference):
            entry = table.get(key)
            if entry is reference or (isinstance(entry, tuple) and entry[0] is reference):
                del table[key]  # not a later tensor's entry under a reused id

        try:
            reference = weakref.ref(tensor, forget)
        except TypeError:
            return
        table[key] = (reference, *details) if details else reference


def _is_eager(tensor):
    return isinstance(tensor, _tf.EagerTensor)


def _is_other_dimension(begin, shrink_axis_mask, rank):
    """A strided slice of a shape vector that takes one dimension other than the first."""
    if len(begin) != 1 or not shrink_axis_mask & 1:
        return False
    dimension = int(begin[0])
    if dimension < 0:
        if rank is None:
            return False
        dimension += rank
    return dimension >= 1


def _is_non_batch_dimension(op):
    """`tf.shape(x)[k]` for a constant k other than 0 (the same on every rank)."""
    if op.type != "StridedSlice" or op.inputs[0].op.type != "Shape":
        return False
    begin = tf.get_static_value(op.inputs[1])
    if begin is None:
        return False
    return _is_other_dimension(list(begin), op.get_attr("shrink_axis_mask"),
                               op.inputs[0].op.inputs[0].shape.rank)
