"""Parameters kept as shards (ZeRO stage 3): each rank stores 1/P of every trainable variable.

Algorithm (`RingAllReduceStrategy(sharding="parameters")`, the storage side;
the mode is `sharded_parameters.ShardedParameters`):

* **Where a parameter lives.** A trainable floating-point variable created
  under the strategy keeps only this rank's range of its flattened elements:
  N elements are cut into P contiguous ranges of ceil(N / P) (the last ones
  shorter, `ownership.ceiling_ranges`), rank r stores range r in the
  TensorFlow variable Keras wraps (its *storage*, 1-D). The Keras variable
  keeps its whole shape, name, path and initializer; only the storage is a
  slice. Its initial value is rank 0's (broadcast as every variable's), cut.
* **Reading it gathers it.** Whatever converts the variable to a tensor (a
  layer's `ops.matmul(x, self.kernel)`, a cast under mixed precision, a
  `tf.gather` of an embedding table, `numpy()`, a save) gets the whole value:
  the P ranges all-gathered (one collective of P x ceil(N / P) elements),
  the padding cut, reshaped. The read happens where the layer reads it, so a
  layer's parameters are gathered just before it runs, in the order the
  layers run; the whole tensor lives while the step's backward pass needs it
  (TensorFlow's tape keeps an op's inputs: there is no storage to free and
  refill, as PyTorch's FSDP does, so the whole parameters of a step's layers
  are transient tensors of that step).
* **Its gradient is reduce-scattered in the backward pass.** The gather's
  gradient (the adjoint of an all-gather) is a reduce-scatter: each rank's
  gradient of the whole parameter, weighted by its share of the global batch
  (`ReplicaStep.parameter_gradient_weight`), is summed over the ranks and
  rank r receives range r - the global batch's gradient of what it stores,
  the moment the layer's backward pass produced it. The step adds nothing
  more to these gradients (`reduced_in_backward`), except the provisional
  rows' correction B / n at its end. An engine without a reduce-scatter
  (TensorFlow's collectives on CPUs) all-reduces and cuts.
* **Updating it.** The optimizer's update runs on the storage in *raw*
  reads (`raw_reads`): reads give the slice, as the optimizer's state
  (sharded as in stage 1, `optimizer_shards`) has the slice's shape.
  Assigning a whole value (a load, `set_weights`, a constraint) keeps this
  rank's range of it.
* **Checkpoints.** A `tf.train.Checkpoint` writes the whole value (gathered
  when written: every rank saves) and restores this rank's range of a
  whole one, at any number of ranks.

Guarantee: every read outside raw reads is the whole parameter, the same on
every rank; the sum of the ranks' shares of a gradient is what one process
computes on the whole batch, so an element-wise update of the ranges equals
the whole update. Every rank must read a parameter together (a collective):
in a step that is so by construction; an eager read on one rank alone (a
`get_weights` on rank 0 only) waits for the others and fails at the job's
timeout naming the gather.

Cost model, per step, for n parameter bytes over P ranks: memory n / P
stored (plus the optimizer state's s / P), and the step's gathered
parameters and one parameter's whole gradient at a time as transient
tensors; communication: one all-gather per parameter read in the forward
pass and one reduce-scatter per parameter in the backward pass,
(P - 1) / P n beta each - the bytes of one ring all-reduce - where the
unsharded step all-reduces once; measured in
benchmarks/results/parameter_sharding.json.
"""

import contextlib
import threading
import weakref
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tfdist import _tf
from tfdist.aggregation.ownership import ceiling_ranges
from tfdist.profiling.names import communication_scope
from tfdist.strategies.step import replica_step

_raw = threading.local()  # .depth: inside `raw_reads`


@contextlib.contextmanager
def raw_reads():
    """Inside: sharded parameters read as this rank's slice (the optimizer's update)."""
    _raw.depth = getattr(_raw, "depth", 0) + 1
    try:
        yield
    finally:
        _raw.depth -= 1


def _reading_raw() -> bool:
    return getattr(_raw, "depth", 0) > 0


class ParameterShard:
    """Where one sharded parameter lives: its whole shape and this rank's range."""

    def __init__(self, shape, dtype, communicator, reshard_after_forward=True):
        self.shape = tf.TensorShape(shape)
        self.reshard_after_forward = reshard_after_forward  # its layer is recomputed
        self.dtype = tf.as_dtype(dtype)
        self.elements = int(np.prod(self.shape.as_list())) if self.shape.rank else 1
        self.world_size = communicator.world_size
        self.rank = communicator.rank
        self.communicator = communicator
        sizes = ceiling_ranges(self.elements, self.world_size)
        self.width = max(sizes[0], 1)
        self.start = min(self.rank * self.width, self.elements)
        self.stop = self.start + sizes[self.rank]
        self.loaded_whole: Optional[np.ndarray] = None  # kept while `keeping_loaded`
        self.keep_loaded = False
        self.consolidated: Optional[np.ndarray] = None  # the whole value, inside `whole_values`

    @property
    def size(self) -> int:
        return self.stop - self.start

    def local_part(self, whole) -> tf.Tensor:
        """This rank's range of a whole value, in a buffer of its own: TensorFlow's slice of
        a contiguous range shares the whole tensor's buffer, and a variable initialized or
        assigned from it would keep the whole value alive (measured: every rank held the
        whole model)."""
        flat = tf.reshape(tf.convert_to_tensor(whole, self.dtype), [-1])
        return tf.raw_ops.DeepCopy(x=flat[self.start:self.stop])

    def gather(self, local: tf.Tensor) -> tf.Tensor:
        """The whole parameter from every rank's range (one all-gather); its gradient is
        the reduce-scatter of the whole gradient (`_scatter_gradient`)."""

        @tf.custom_gradient
        def gathered(part):
            def backward(upstream):
                return self._scatter_gradient(upstream)

            return self._all_gather(part), backward

        return gathered(local)

    def _all_gather(self, part: tf.Tensor) -> tf.Tensor:
        with tf.name_scope(communication_scope("sharded", "parameters")):
            padded = tf.pad(part, [[0, self.width - self.size]]) if self.size < self.width \
                else part
            padded = tf.ensure_shape(padded, [self.width])
            whole = self.communicator.all_gather_equal(padded)
        return tf.reshape(tf.reshape(whole, [-1])[:self.elements], self.shape)

    def _scatter_gradient(self, upstream) -> tf.Tensor:
        """This rank's range of the sum over the ranks of each rank's weighted gradient of
        the whole parameter."""
        if isinstance(upstream, tf.IndexedSlices):
            return self._gathered_slices(upstream)
        gradient = tf.convert_to_tensor(upstream)
        step = replica_step.current()
        if step is not None:
            gradient = tf.math.multiply_no_nan(
                gradient, step.parameter_gradient_weight(gradient.dtype))
        flat = tf.reshape(gradient, [self.elements])  # static, whatever the op gave
        total = self.width * self.world_size
        if total > self.elements:
            flat = tf.pad(flat, [[0, total - self.elements]])
        with tf.name_scope(communication_scope("sharded", "gradients")):
            if self.communicator.reduces_scatter:
                mine = self.communicator.reduce_scatter(flat)
            else:
                mine = tf.reshape(self.communicator.all_reduce(flat),
                                  [self.world_size, self.width])[self.rank]
        return mine[:self.size]


    def _gathered_slices(self, slices: tf.IndexedSlices) -> tf.IndexedSlices:
        """A sparse gradient (an embedding's) stays sparse: the global batch's (index,
        value) pairs of the whole parameter, gathered from every rank as without sharding
        (`GlobalGradients.gather_slices`); the optimizer cuts this rank's range from them
        (`OptimizerShards.local_part`). Densified, a row repeated in the batch would be
        summed before Keras' rules square each occurrence, and the update would drift."""
        step = replica_step.current()
        gradients = getattr(tf.distribute.get_strategy().extended, "gradients", None)
        if step is not None and gradients is not None:
            return gradients.gather_slices(slices, step, step.parameter_gradient_weight)
        with tf.name_scope(communication_scope("sharded", "sparse_gradients")):
            values = self.communicator.all_gather(slices.values)
            indices = self.communicator.all_gather(slices.indices)
        return tf.IndexedSlices(values, indices, tf.constant(self.shape.as_list(), tf.int64))


# id(storage variable) -> (weak reference to it, its ParameterShard)
_STORAGE: Dict[int, tuple] = {}
_CLASSES: Dict[type, type] = {}


def shard_of(variable) -> Optional[ParameterShard]:
    """The `ParameterShard` of a sharded parameter (its Keras variable or its storage)."""
    storage = getattr(variable, "_value", variable)
    if not isinstance(storage, tf.Variable):
        storage = variable
    entry = _STORAGE.get(id(storage))
    if entry is None or entry[0]() is not storage:
        return None
    return entry[1]


def storage_of(variable):
    """The TensorFlow variable that stores a parameter's range (itself if it is one)."""
    value = getattr(variable, "_value", None)
    return value if isinstance(value, tf.Variable) else variable


# Called when a parameter is first sharded: what the Keras adapter above registers
# (`keras_patches.sharded_layer_calls.install`: layers owning one recompute their calls).
ON_FIRST_SHARD = []


def make_sharded(storage, shard: ParameterShard):
    """Give the storage variable (created with this rank's range) a sharded parameter's reads."""
    for hook in ON_FIRST_SHARD:
        hook()
    storage.__class__ = _storage_class(type(storage))
    _STORAGE[id(storage)] = (weakref.ref(storage), shard)
    return storage


def _storage_class(base: type) -> type:
    """`base` (a TensorFlow variable class) whose reads gather the whole parameter, whose
    assignment of a whole value keeps this rank's range, and whose checkpoint entry is the
    whole parameter (see the module docstring)."""
    if base in _CLASSES:
        return _CLASSES[base]

    def _shard(self) -> ParameterShard:
        return _STORAGE[id(self)][1]

    def _whole(self):
        shard = _shard(self)
        if shard.consolidated is not None and not tf.inside_function():
            return tf.constant(shard.consolidated)  # a save reading what was gathered
        return shard.gather(base.read_value(self))

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        if as_ref or _reading_raw():
            return base._dense_var_to_tensor(self, dtype=dtype, name=name, as_ref=as_ref)  # pylint: disable=protected-access
        whole = _whole(self)
        if dtype is not None and not tf.as_dtype(dtype).is_compatible_with(whole.dtype):
            raise ValueError(f"Incompatible type conversion requested to type {dtype} for "
                             f"variable of type {whole.dtype}")
        return whole

    def value(self):
        return base.value(self) if _reading_raw() else _whole(self)

    def read_value(self):
        return base.read_value(self) if _reading_raw() else _whole(self)

    def numpy(self):
        if _reading_raw():
            return base.numpy(self)
        shard = _shard(self)
        with shard.communicator.expect_progress(
                "gathering a sharded parameter (sharding='parameters': every rank reads "
                "a parameter together)"):
            return _whole(self).numpy()

    def sparse_read(self, indices, name=None):
        return tf.gather(self.read_value(), indices, name=name)

    def gather_nd(self, indices, name=None):
        return tf.gather_nd(self.read_value(), indices, name=name)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        shard = _shard(self)
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if value.shape.num_elements() == shard.elements and shard.elements != shard.size:
            if shard.keep_loaded and tf.executing_eagerly():
                shard.loaded_whole = value.numpy()
            value = shard.local_part(value)
        elif (value.shape.num_elements() == shard.elements and value.shape.rank
              and value.shape.rank > 1):
            value = tf.reshape(value, [shard.size])
        return base.assign(self, value, use_locking=use_locking, name=name,
                           read_value=read_value)

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": _tf.lazy_save_spec(lambda: _whole(self), self.dtype,
                                                     self.device)}

    def _restore_from_tensors(self, restored_tensors):
        restored = restored_tensors["VARIABLE_VALUE"]
        shard = _shard(self)
        if int(np.prod(restored.shape)) != shard.elements:
            raise ValueError(
                f"tfdist rank {shard.rank}: the checkpoint holds {list(restored.shape)} for a "
                f"parameter of shape {shard.shape.as_list()} (sharding='parameters'): not "
                "the whole parameter.")
        with tf.init_scope():
            base.assign(self, shard.local_part(restored))
        return base.value(self)

    _CLASSES[base] = type(base.__name__, (base,), {
        "__module__": base.__module__, "_dense_var_to_tensor": _dense_var_to_tensor,
        "value": value, "read_value": read_value, "numpy": numpy,
        "sparse_read": sparse_read, "gather_nd": gather_nd, "assign": assign,
        "_serialize_to_tensors": _serialize_to_tensors,
        "_restore_from_tensors": _restore_from_tensors})
    return _CLASSES[base]


def shards_placed(variables) -> list:
    """The `ParameterShard` of each of `variables` that is a sharded parameter."""
    return [s for s in (shard_of(v) for v in variables) if s is not None]


def _model_shards(model) -> list:
    """(storage, shard) of `model`'s sharded parameters, in the model's order (the same on
    every rank)."""
    found, seen = [], set()
    for variable in getattr(model, "variables", []):
        shard = shard_of(variable)
        storage = storage_of(variable)
        if shard is not None and id(storage) not in seen:
            seen.add(id(storage))
            found.append((storage, shard))
    return found


@contextlib.contextmanager
def whole_values(model):
    """Inside: every sharded parameter of `model` reads as its whole value gathered once on
    entry (eager; every rank enters together), so a save on the chief reads them without a
    collective the other ranks would have to join. Nested entries gather once."""
    pairs = [(storage, shard) for storage, shard in _model_shards(model)
             if shard.consolidated is None]
    try:
        for storage, shard in pairs:
            shard.consolidated = shard.gather(
                type(storage).__mro__[1].read_value(storage)).numpy()
        yield
    finally:
        for _, shard in pairs:
            shard.consolidated = None


@contextlib.contextmanager
def keeping_loaded(model):
    """Inside: a whole value assigned to a sharded parameter of `model` is kept, for
    `share_loaded`."""
    shards = [shard for _, shard in _model_shards(model)]
    for shard in shards:
        shard.keep_loaded = True
    try:
        yield
    finally:
        for shard in shards:
            shard.keep_loaded = False


def share_loaded(model, root: int = 0) -> None:
    """After rank `root` alone loaded `model`'s weights (inside `keeping_loaded`): every rank
    takes its range of each whole value (one broadcast per parameter; every rank calls)."""
    for storage, shard in _model_shards(model):
        value = shard.loaded_whole
        if value is None:
            value = np.zeros(shard.shape.as_list(), shard.dtype.as_numpy_dtype)
        whole = shard.communicator.broadcast(tf.constant(value), root)
        type(storage).__mro__[1].assign(storage, shard.local_part(whole))
        shard.loaded_whole = None
