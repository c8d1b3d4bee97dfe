"""Horovod's collectives (`allreduce`, `allgather`, `broadcast`, `reducescatter`) on tfdist.

Each runs on the communicator of the strategy `init()` created (Horovod's
ops or TensorFlow's collectives, whichever the job runs on), eagerly or
inside a `tf.function`, with Horovod's arguments and results:

* `allreduce(value, op=Average | Sum | Min | Max | Product, prescale_factor,
  postscale_factor, compression)`: the element-wise reduction of every
  rank's `value`; `tf.IndexedSlices` are gathered (values and indices of
  every rank; averaged values divided by the size), as Horovod does. Sum and
  Average cost one all-reduce: 2 (P - 1) alpha + 2 (P - 1) / P n beta; Min,
  Max and Product one all-gather of P n bytes.
* `allgather(value)`: every rank's rows concatenated in rank order (the
  first dimension may differ).
* `broadcast(value, root_rank)`: `root_rank`'s value everywhere.
* `reducescatter(value, op=Average | Sum)`: the reduction's rows split over
  the ranks as Horovod splits them (the first `rows % size` ranks get one row
  more); cost as an all-reduce.
* `broadcast_variables(variables, root_rank)`: assigns `root_rank`'s values,
  one broadcast per dtype (the variables flattened together).
* `broadcast_object(obj, root_rank)`, `allgather_object(obj)`: Python objects,
  pickled (eager only).

An eager call is bounded by the job timeout: a peer that never joins is
named (`Communicator.expect_progress`). Adasum and process sets are
refused: tfdist has neither.
"""

import base64
import contextlib
import pickle

import tensorflow as tf

from tfdist.horovod import process
from tfdist.horovod.compression import Compression
from tfdist.strategies.state import variable_broadcast


class ReduceOp:
    """A reduction of Horovod's (`hvd.Average`, `hvd.Sum`, ...)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"hvd.{self.name}"


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
Adasum = ReduceOp("Adasum")
Min = ReduceOp("Min")
Max = ReduceOp("Max")
Product = ReduceOp("Product")

_GATHERED = {"Min": tf.reduce_min, "Max": tf.reduce_max, "Product": tf.reduce_prod}


class ProcessSet:
    """Horovod's process set; tfdist offers only the global one (every rank)."""

    def __init__(self, ranks=None):
        self.ranks = ranks

    def __repr__(self):
        return "hvd.global_process_set" if self.ranks is None else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def add_process_set(process_set):
    """Refused: one group per job."""
    raise ValueError("tfdist.horovod: process sets are not offered (one group per job: every "
                     f"rank takes part in every collective). Got: {process_set!r}")


remove_process_set = add_process_set


def check_process_set(process_set):
    """ValueError unless `process_set` is the global one."""
    if process_set is not None and process_set is not global_process_set:
        add_process_set(process_set)


def check_op(op, allowed):
    """ValueError naming `op` unless it is one of `allowed` (Adasum: said why)."""
    if op is Adasum:
        raise ValueError("tfdist.horovod: op=hvd.Adasum is not offered (tfdist's reductions are "
                         "exact sums: use hvd.Average or hvd.Sum).")
    if op not in allowed:
        raise ValueError(f"tfdist.horovod: op must be one of {list(allowed)}. Got: op={op!r}")


def _communicator():
    return process.strategy().extended.communicator


@contextlib.contextmanager
def bounded(what):
    """Eagerly, the job timeout bounds the wait and names a missing peer."""
    if tf.executing_eagerly():
        with _communicator().expect_progress(f"hvd.{what}"):
            yield
    else:
        yield


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The reduction of `value` over every rank (Horovod's `hvd.allreduce`)."""
    del name
    if average is not None and op is not None:
        raise ValueError("tfdist.horovod: allreduce takes average= (deprecated) or op=, not both")
    if op is None:
        op = Average if average is None or average else Sum
    check_op(op, (Average, Sum, Min, Max, Product))
    size = process.size()
    with bounded("allreduce"):
        if isinstance(value, tf.IndexedSlices):
            values = _communicator().all_gather(value.values)
            indices = _communicator().all_gather(value.indices)
            if op is Average:
                values = values / tf.cast(size, values.dtype)
            elif op is not Sum:
                raise ValueError(f"tfdist.horovod: sparse allreduce takes op=Average or Sum. "
                                 f"Got: op={op!r}")
            return tf.IndexedSlices(values, indices, value.dense_shape)
        tensor = tf.convert_to_tensor(value)
        compressed, context = compression.compress(tensor)
        if prescale_factor != 1.0:
            compressed = compressed * tf.cast(prescale_factor, compressed.dtype)
        if op in (Sum, Average):
            reduced = _communicator().all_reduce(compressed)
            if op is Average:
                reduced = (reduced // size if reduced.dtype.is_integer
                           else reduced / tf.cast(size, reduced.dtype))
        else:
            reduced = _GATHERED[op.name](_communicator().all_gather_equal(compressed), axis=0)
        if postscale_factor != 1.0:
            reduced = reduced * tf.cast(postscale_factor, reduced.dtype)
        return compression.decompress(reduced, context)


def grouped_allreduce(values, op=None, compression=Compression.none):
    """`allreduce` of each value (one list in, one list out)."""
    return [allreduce(v, op=op, compression=compression) for v in values]


def allgather(value, name=None):
    """Every rank's `value` concatenated along the first dimension, in rank order."""
    del name
    value = tf.convert_to_tensor(value)
    with bounded("allgather"):
        return _as(_communicator().all_gather(_on_the_wire(value)), value.dtype)


def broadcast(value, root_rank, name=None):
    """`root_rank`'s `value` on every rank."""
    del name
    _check_root(root_rank)
    value = tf.convert_to_tensor(value)
    with bounded("broadcast"):
        return _as(_communicator().broadcast(_on_the_wire(value), root=root_rank), value.dtype)


def reducescatter(value, name=None, op=Average):
    """This rank's rows of the reduction of `value`: Horovod's split (the first `rows % size`
    ranks get one row more)."""
    del name
    check_op(op, (Average, Sum))
    reduced = allreduce(value, op=op)
    size, rank = process.size(), process.rank()
    rows = tf.shape(reduced)[0]
    smaller, larger_ranks = rows // size, rows % size
    start = rank * smaller + tf.minimum(rank, larger_ranks)
    count = smaller + tf.cast(rank < larger_ranks, rows.dtype)
    return reduced[start:start + count]


def broadcast_variables(variables, root_rank):
    """Assign `root_rank`'s value to each of `variables` (one broadcast per dtype)."""
    _check_root(root_rank)
    with bounded("broadcast_variables"):
        variable_broadcast.broadcast_variables(_communicator(), list(variables), root_rank)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """`root_rank`'s Python object on every rank (pickled, as Horovod's; eager only)."""
    del name
    check_process_set(process_set)
    _check_root(root_rank)
    payload = base64.b64encode(pickle.dumps(obj)).decode("ascii")
    with bounded("broadcast_object"):
        return pickle.loads(base64.b64decode(
            _communicator().broadcast_json(payload if process.rank() == root_rank else "",
                                           root=root_rank)))


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's Python object, in rank order (pickled, as Horovod's; eager only)."""
    del name
    check_process_set(process_set)
    payload = base64.b64encode(pickle.dumps(obj)).decode("ascii")
    communicator = _communicator()
    with bounded("allgather_object"):
        longest = int(tf.reduce_max(communicator.all_gather_equal(
            tf.constant([len(payload)], tf.int64))))
        return [pickle.loads(base64.b64decode(text))
                for text in communicator.all_gather_strings(payload, max_bytes=max(longest, 1))]


def broadcast_global_variables(root_rank):
    """Horovod's TF1 call: refused in eager TensorFlow 2, as Horovod refuses it."""
    del root_rank
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support eager execution (TensorFlow 2 has "
        "no global variables). Use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) "
        "in fit, or hvd.broadcast_variables(model.variables, root_rank).")


# Types TensorFlow's collectives do not move, and the type that carries them exactly.
_WIRE_TYPES = {tf.uint8: tf.int32, tf.int8: tf.int32, tf.uint16: tf.int32, tf.int16: tf.int32,
               tf.uint32: tf.int64, tf.bfloat16: tf.float32}


def _on_the_wire(value):
    """`value` in a type the engine moves (Horovod's small integers and bfloat16 too)."""
    wire = _WIRE_TYPES.get(value.dtype)
    return value if wire is None else tf.cast(value, wire)


def _as(value, dtype):
    return value if value.dtype == dtype else tf.cast(value, dtype)


def _check_root(root_rank):
    size = process.size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < size:
        raise ValueError(f"tfdist.horovod: root_rank must be a rank, 0 .. {size - 1}. "
                         f"Got: root_rank={root_rank!r}")
