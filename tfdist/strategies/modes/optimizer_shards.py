"""Optimizer-state sharding (ZeRO stage 1): each rank keeps the optimizer state of 1/P of the
parameters, updates that part, and the parameters are all-gathered.

Algorithm, per training step (`RingAllReduceStrategy(shard_optimizer_state=True)`):

1. The gradients are summed over the ranks, share-weighted, before clipping or
   accumulation. On an engine that reduce-scatters (Horovod's) each gradient
   bucket is reduce-scattered (`reduce_scatter`, called by the step's
   `StepSum`): every rank receives the sum of its own range only. On
   TensorFlow's collectives, which have no reduce-scatter on CPUs, the
   gradients join the step's fused all-reduce as without sharding and every
   rank cuts its slices from the global gradient.
2. The trainable variables, flattened in the optimizer's order and grouped by
   gradient bucket and dtype (the ring's buckets: `ownership.bucket_groups`),
   are cut into P contiguous ranges of ceil(N / P)
   elements per group (the last ones shorter;
   `tfdist.aggregation.ownership.FlatPartition`); rank r owns range r. Each
   rank keeps its slice of each variable in a *shard variable* (a 1-D copy) and
   the optimizer's slots (Adam's moments, momentum, accumulators, EMA) only
   for those slices: every slot created from a model variable has the shape of
   the rank's slice of it, so `optimizer.variables` keeps the plain optimizer's
   order and names with 1/P of the elements (scalars such as `iterations`
   whole).
3. The optimizer's own `apply` runs on the rank's slices of the global
   gradient: clipping (the per-variable and global norms summed over the ranks
   in one all-reduce of a few scalars), loss-scale unscaling (a
   LossScaleOptimizer's finite check of reduce-scattered slices all-reduced: one
   scalar), gradient accumulation, weight decay, the update step, EMA - on its
   slices only.
4. Each group's shard variables are all-gathered (one collective per group,
   each range padded to the first's size: the gathered buffer is the flat
   parameters followed by the padding, cut into the variables without copying
   the whole again) into the model's variables, then constraints apply to the
   whole variables.

Guarantee: for an element-wise update rule (SGD, Adam, AdamW, Adamax, Nadam,
RMSprop, Adagrad, Adadelta, Ftrl, Lion, and a LossScaleOptimizer around one)
every element gets the update one process gives it: the same global gradient,
the same slot values, the same rule; only the norms of clipping are summed in
another order (float reassociation). Every rank ends the step with the same
weights (the gather). Rules whose update of an element depends on other
elements of the variable (Adafactor's factored moments, LAMB's and LARS' trust
ratios, Muon's orthogonalization) are refused.

Cost model, per step of n parameter bytes and s bytes of optimizer state over P
ranks: memory s / P per rank instead of s (plus n / P for the shard variables; the
collectives' buffers are a bucket's, never the whole model's: measured in
benchmarks/results/optimizer_sharding.json);
update compute / P; communication with a reduce-scatter (Horovod): the
gradients' reduce-scatter and the parameters' all-gather, (P - 1) / P n beta and
(P - 1) alpha each - the bytes and latencies of the unsharded ring's all-reduce
(ZeRO's accounting), as one collective more per bucket; without one (TensorFlow's
collectives): the gradient all-reduce of 2 (P - 1) / P n beta as before plus the
all-gather - 1.5x the bytes. Saving gathers the whole state on every rank that
saves (`consolidated`; the slots' side is `sharded_slots.ShardedSlots`), so a
checkpoint is the plain Keras file.
"""

import contextlib
import weakref
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdist.aggregation.ownership import FlatPartition, bucket_groups
from tfdist.profiling.names import communication_scope
from tfdist.strategies.modes.sharded_slots import ShardedSlots
from tfdist.strategies.modes.sharded_slots import elements as _elements, path as _path


def _sparse_range(gradient: tf.IndexedSlices, shape, start: int, stop: int) -> tf.IndexedSlices:
    """The elements of sparse `gradient` (of a variable of `shape`) whose flat positions are
    in [start, stop), as a 1-D IndexedSlices over that range (repeated rows stay repeated)."""
    row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    indices = tf.cast(gradient.indices, tf.int64)
    positions = tf.reshape(indices[:, None] * row + tf.range(row, dtype=tf.int64)[None, :], [-1])
    values = tf.reshape(gradient.values, [-1])
    inside = tf.logical_and(positions >= start, positions < stop)
    return tf.IndexedSlices(tf.boolean_mask(values, inside),
                            tf.boolean_mask(positions, inside) - start,
                            tf.constant([stop - start], tf.int64))


class OptimizerShards:
    """One optimizer's sharded state over `variables`; see the module docstring.

    Args:
        variables: the model variables the optimizer is built for, in its order.
        communicator: the job's `tfdist.comm.base.Communicator`.
        create_local: context manager under which variables are created as this
            rank's own (no broadcast from rank 0: their shapes differ per rank).
        buckets: (bucket_bytes, first_bucket_bytes) of the ring's gradient buckets:
            the partition follows them (`ownership.bucket_groups`), so each collective
            of the step moves one bucket's buffer at most; with an engine that
            reduce-scatters, the gradients are reduce-scattered bucket by bucket.
    """

    def __init__(self, variables: Sequence, communicator, create_local, buckets=None,
                 counters=None, parameter_storage: Optional[Sequence] = None):
        self.variables = list(variables)
        # Stage 3 (`sharded_parameters`): the parameters themselves are stored as this rank's
        # slices, cut per variable; those storage variables are the shard variables, so
        # nothing is copied in before the update nor gathered after it.
        self.holds_parameters = parameter_storage is not None
        self.communicator = communicator
        self.rank = communicator.rank
        self.world_size = communicator.world_size
        # The step reduce-scatters the gradients (`reduce_scatter`): 1x the bytes of the
        # unsharded ring instead of 1.5x.
        self.scatters = bool(communicator.reduces_scatter and buckets is not None
                             or self.holds_parameters)  # stage 3: slices from the backward
        sizes = [_elements(v) for v in self.variables]
        dtypes = [tf.as_dtype(v.dtype) for v in self.variables]
        # Ranges per gradient bucket (one per dtype without buckets): each parameter
        # all-gather, and each reduce-scatter, moves one bucket's buffer at most; stage 3
        # cuts each variable on its own (each is gathered where it is read).
        if self.holds_parameters:
            groups = [f"{d.name}/{i}" for i, d in enumerate(dtypes)]
        elif buckets is None:
            groups = [d.name for d in dtypes]
        else:
            groups = bucket_groups(sizes, [d.name for d in dtypes], [d.size for d in dtypes],
                                   *buckets)
        self.partition = FlatPartition(sizes, groups, self.world_size)
        self.counters = counters  # the process's `CommunicationCounters`, or None
        self._group_dtype = dict(zip(groups, dtypes))
        self._group_members: Dict[str, List[int]] = {}
        for i, group in enumerate(groups):
            self._group_members.setdefault(group, []).append(i)
        self.ranges = [self.partition.slice_of(i, self.rank) for i in range(len(self.variables))]
        self._index: Dict[int, int] = {}
        for i, variable in enumerate(self.variables):
            self._index[id(variable)] = i
            self._index[id(getattr(variable, "value", variable))] = i
        with create_local(), tf.init_scope():
            self.shard_variables = list(parameter_storage) if self.holds_parameters else [
                tf.Variable(tf.zeros([stop - start], tf.as_dtype(v.dtype)), trainable=False,
                            name=f"{_path(v).replace('/', '_')}_shard")
                for v, (start, stop) in zip(self.variables, self.ranges)]
            # Written each step with a scalar read from every global gradient (`keep_all`).
            self._consumed = tf.Variable(0.0, trainable=False, name="tfdist_consumed_gradients")
        for i, shard in enumerate(self.shard_variables):
            self._index[id(shard)] = i
        self.slots = ShardedSlots(self)  # the optimizer's slots of this rank's slices

    # ----------------------------------------------------------- the variables
    def index_of(self, variable) -> Optional[int]:
        """The position of a model variable (or its shard variable), or None."""
        return self._index.get(id(variable), self._index.get(id(getattr(variable, "value", None))))

    def local_size(self, index: int) -> int:
        start, stop = self.ranges[index]
        return stop - start

    def slot_shape(self, reference) -> Optional[List[int]]:
        """The shape of this rank's slot of model variable `reference` (None: not sharded)."""
        index = self.index_of(reference)
        return None if index is None else [self.local_size(index)]

    def local_part(self, tensor, index: int):
        """This rank's slice of a whole-variable tensor (a tensor of the slice's size is that
        slice already: the gradients `reduce_scatter` gave).

        A sparse gradient (`tf.IndexedSlices`, an embedding's) stays sparse: its elements
        in the rank's range, indexed within the range, one entry per row occurrence.
        Densifying would sum a row's repeated occurrences before the update rule sees
        them, and Keras' rules do not treat the two alike (Adam squares each occurrence's
        gradient, `ops.square` of the IndexedSlices, then sums them: not the square of
        the sum), so the sharded update would drift from the plain script's.
        """
        start, stop = self.ranges[index]
        if isinstance(tensor, tf.IndexedSlices):
            return _sparse_range(tensor, self.variables[index].shape, start, stop)
        if tf.convert_to_tensor(tensor).shape.num_elements() == stop - start:
            # Already the slice (`reduce_scatter`'s, maybe unscaled by a LossScaleOptimizer),
            # or the whole gradient of a variable the rank owns whole: the same values.
            return tf.reshape(tensor, [stop - start])
        flat = tf.reshape(tf.convert_to_tensor(tensor), [_elements(self.variables[index])])
        return flat[start:stop]

    def copy_in(self, indices: Optional[Sequence[int]] = None) -> None:
        """The shard variables take their slices of the model variables' current values."""
        if self.holds_parameters:
            return
        for i in range(len(self.variables)) if indices is None else indices:
            if self.local_size(i):
                self.shard_variables[i].assign(self.local_part(self.variables[i], i))

    # ------------------------------------------------------------- the step
    def summed_squares(self, gradients: Sequence) -> tf.Tensor:
        """The squared L2 norm of each whole gradient of which `gradients` are this rank's
        slices (None: 0), summed over the ranks in one all-reduce."""
        squares = [tf.zeros([]) if g is None else
                   tf.reduce_sum(tf.square(tf.cast(getattr(g, "values", g), tf.float32)))
                   for g in gradients]  # a sparse gradient: its occurrences, as Keras' norms
        with tf.name_scope(communication_scope("sharded", "gradient_norms")):
            return self.communicator.all_reduce(tf.stack(squares))

    def keep_all(self, gradients: Sequence) -> None:
        """Every global gradient stays in this rank's step, also those it owns nothing of.

        A rank whose ranges miss a variable uses none of that gradient's sum, and an
        engine whose collectives are stateless ops to TensorFlow (Horovod's) then loses
        the collective: Grappler prunes it, or its dependency optimizer turns a node
        whose results only feed control edges into a NoOp - and the other ranks wait
        for that rank's part of the bucket forever. One element of each gradient
        written to a rank-local scalar (a stateful op: never pruned, runs every step)
        keeps each rank's collectives the same for a few scalar reads.
        """
        firsts = [tf.reduce_sum(tf.cast(tf.reshape(getattr(g, "values", g), [-1])[:1],
                                        tf.float32))
                  for g in gradients if g is not None]
        if firsts:
            self._consumed.assign(tf.add_n(firsts))

    def reduce_scatter(self, gradients: Dict[int, tf.Tensor]) -> Dict[int, tf.Tensor]:
        """This rank's slice of the sum over the ranks of each dense gradient in `gradients`
        (model variable index -> this rank's weighted gradient), as 1-D tensors.

        Per group (a gradient bucket of one dtype, `ownership.bucket_groups`) with a
        gradient given: its members' gradients flattened in order (zeros for members
        without one), padded to P x the group's range width and reduce-scattered; rank r
        receives range r of the group - the union of its slices of the members. One
        collective per group, issued as soon as the group's gradients exist.
        """
        result: Dict[int, tf.Tensor] = {}
        chunks = []
        with tf.name_scope(communication_scope("sharded", "gradients")):
            for group, members in self._group_members.items():
                if not any(i in gradients for i in members):
                    continue
                dtype = self._group_dtype[group]
                flat = tf.concat([tf.reshape(tf.cast(gradients[i], dtype), [self.partition.sizes[i]])
                                  if i in gradients else tf.zeros([self.partition.sizes[i]], dtype)
                                  for i in members], 0)
                width = max(max(self.partition.group_sizes[group]), 1)
                flat = tf.pad(flat, [[0, width * self.world_size - flat.shape[0]]])
                chunk = self._counted([flat], lambda flat=flat: self.communicator.reduce_scatter(
                    flat), width * dtype.size)
                chunks.append(chunk)
                offset = 0
                for i in members:
                    start, stop = self.ranges[i]
                    if i in gradients:
                        begin = offset + start - self.rank * width
                        result[i] = (chunk[begin:begin + stop - start] if stop > start
                                     else tf.zeros([0], dtype))
                    offset += self.partition.sizes[i]
        self.keep_all(chunks)  # a rank whose part of a group is padding reads none of it
        return result

    def gather_into_model(self, indices: Optional[Sequence[int]] = None) -> None:
        """Every rank's shard variables all-gathered into the model variables (one collective
        per group - a gradient bucket of one dtype - each rank's range padded to the
        largest); nothing when the shard variables are the parameters."""
        if self.holds_parameters:
            return
        chosen = set(range(len(self.variables)) if indices is None else indices)
        with tf.name_scope(communication_scope("sharded", "parameters")):
            for group, members in self._group_members.items():
                if not chosen.intersection(members):
                    continue
                whole = self._gather_flat(group, [self.shard_variables[i] for i in members])
                pieces = tf.split(whole, [self.partition.sizes[i] for i in members])
                for i, piece in zip(members, pieces):
                    if i in chosen:
                        variable = self.variables[i]
                        variable.assign(tf.reshape(piece, variable.shape))

    def _gather_flat(self, group: str, locals_: Sequence) -> tf.Tensor:
        """The group's whole flat buffer from every rank's range: one all-gather of the ranges
        padded to the first's size, whose first N elements are the buffer (`ceiling_ranges`:
        only the last ranks' ranges are short)."""
        sizes = self.partition.group_sizes[group]
        dtype = self._group_dtype[group]
        parts = [tf.reshape(tf.convert_to_tensor(v), [-1]) for v in locals_ if v.shape[0]]
        flat = tf.concat(parts, 0) if len(parts) > 1 else (
            parts[0] if parts else tf.zeros([0], dtype))
        width = max(max(sizes), 1)
        if sizes[self.rank] < width:
            flat = tf.pad(flat, [[0, width - sizes[self.rank]]])
        flat = tf.ensure_shape(flat, [width])
        gathered = self._counted([flat], lambda: self.communicator.all_gather_equal(flat),
                                 width * dtype.size)
        return tf.reshape(gathered, [-1])[:sum(sizes)]

    def _counted(self, inputs, run, part_bytes):
        """`run()`, a reduce-scatter or all-gather of P parts of `part_bytes`, timed and
        counted by the communication counters (a ring sends P - 1 parts)."""
        if self.counters is None:
            return run()
        return self.counters.timed(inputs, run, payload_bytes=part_bytes * self.world_size,
                                   sent_bytes=part_bytes * (self.world_size - 1))


# ------------------------------------------------------------------ the registry
_SHARDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> its shards


def register(optimizer, shards: OptimizerShards) -> None:
    _SHARDS[optimizer] = shards


def shards_of(optimizer) -> Optional[OptimizerShards]:
    """The `OptimizerShards` of `optimizer` (None: not sharded)."""
    return _SHARDS.get(optimizer) if optimizer is not None else None


def optimizers_of(model) -> list:
    """`model`'s optimizer and the optimizers it wraps (a LossScaleOptimizer's inner)."""
    optimizer, found = getattr(model, "optimizer", None), []
    while optimizer is not None:
        found.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found


def model_shards(model) -> List[OptimizerShards]:
    return [shards_of(o) for o in optimizers_of(model) if shards_of(o) is not None]


def slot_range(variable):
    """(the parameter's whole shape, (start, stop)) of a slot that holds this rank's slice of
    its parameter, else None."""
    for shards in list(_SHARDS.values()):
        index = shards.slots.index_of(variable)
        if index is not None:
            return tuple(shards.variables[index].shape), shards.ranges[index]
    return None


@contextlib.contextmanager
def consolidated(model):
    """Inside: the whole optimizer state of `model` is known on this rank, for a save in
    Keras' own format (every rank enters together: the slots are all-gathered, bounded by
    the job timeout - a save on rank 0 alone fails there, naming this)."""
    sharded = model_shards(model)
    if not sharded:
        yield
        return
    communicator = sharded[0].communicator
    with contextlib.ExitStack() as stack:
        with communicator.expect_progress(
                "gathering the sharded optimizer state for a save (shard_optimizer_state=True: "
                "every rank must save)"):
            try:
                for shards in sharded:
                    stack.enter_context(shards.slots.consolidated())
            except tf.errors.OpError as error:
                raise RuntimeError(
                    f"tfdist rank {communicator.rank}: this save needs every rank's slices of "
                    "the optimizer state (shard_optimizer_state=True), and gathering them "
                    f"failed: {error.message.splitlines()[0][:300]}. Every rank must call "
                    "the save (model.save, save_weights, ModelCheckpoint, BackupAndRestore: "
                    "the chief writes the file, the others hand over their slices); a save "
                    "on rank 0 alone (Horovod's convention) needs shard_optimizer_state="
                    "False.") from error
        yield


@contextlib.contextmanager
def keeping_loaded(model):
    """Inside: a load keeps the whole optimizer state it read, for `share_loaded_state`."""
    sharded = model_shards(model)
    for shards in sharded:
        shards.slots.keep_loaded = True
    try:
        yield
    finally:
        for shards in sharded:
            shards.slots.keep_loaded = False


def share_loaded_state(model, root: int = 0) -> None:
    """After rank `root` alone loaded `model`'s whole optimizer state (inside
    `keeping_loaded`): every rank takes its slices of it (every rank calls)."""
    for shards in model_shards(model):
        shards.slots.share_loaded(root)
