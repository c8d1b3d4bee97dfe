"""A sharded optimizer's slots: this rank's slices, made whole for a save and cut at a load.

The slots (Adam's moments, momentum, accumulators, EMA) of an optimizer
whose state is sharded (`optimizer_shards.OptimizerShards`) hold this
rank's slice of each model variable's slot. Three ways of saving meet them:

* Keras' own files (`model.save`, `save_weights`, `ModelCheckpoint`, a
  backup): every rank enters `consolidated()` together; each slot's slices
  are all-gathered into its whole value, which the optimizer's
  `save_own_variables` writes in the plain optimizer's order; a load takes
  this rank's slice of each whole value (`load_whole`), and the chief
  loading alone keeps the whole values (`keep_loaded`) for every rank to
  take its slices from (`share_loaded`: one broadcast per slot);
* `tf.train.Checkpoint` (a custom loop's): each slot's own TensorFlow
  variable is given, as Keras creates it (`creating`, through
  `tf.variable_creator_scope`), a subclass whose checkpoint methods save the
  whole slot (consolidated, or all-gathered at the save: every rank saves)
  and restore this rank's slice of it - also the deferred restore that runs
  the moment the optimizer tracks the slot. Every other variable of the
  process checkpoints as TensorFlow does.

Cost: a save all-gathers s bytes of optimizer state once (nested saves
gather once); a load on the chief broadcasts it once.
"""

import contextlib
import weakref
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tfdist import _tf


def elements(variable) -> int:
    return int(np.prod(variable.shape))


def path(variable) -> str:
    return str(getattr(variable, "path", None) or variable.name)


class ShardedSlots:
    """The slots of one sharded optimizer (`shards`: its `OptimizerShards`); see the module
    docstring."""

    def __init__(self, shards):
        self.shards = shards
        self._slots: Dict[int, tuple] = {}  # id(slot) -> (slot, index of its model variable)
        self._slot_of_value: Dict[int, object] = {}  # id(TensorFlow variable) -> its Keras slot
        self._full: Dict[int, np.ndarray] = {}  # id(slot) -> whole value (consolidate / load)
        self.keep_loaded = False  # a load keeps the whole values (the chief restoring a backup)
        self._depth = 0  # nested `consolidated` scopes

    def all(self) -> list:
        return [slot for slot, _ in self._slots.values()]

    def holds(self, variable) -> bool:
        return id(variable) in self._slots

    def index_of(self, slot) -> Optional[int]:
        """The index (in `shards.variables`) of the parameter whose slice `slot` holds."""
        entry = self._slots.get(id(slot))
        return None if entry is None else entry[1]

    def remember(self, slot, reference, created=()) -> None:
        """`slot` (a Keras variable) holds this rank's slice of model variable `reference`;
        `created`: the TensorFlow variables made for it (`creating`)."""
        self._slots[id(slot)] = (slot, self.shards.index_of(reference))
        for value in created:
            self._slot_of_value[id(value)] = slot

    @contextlib.contextmanager
    def creating(self, reference):
        """Inside: the TensorFlow variable Keras creates for the slot of `reference` gets the
        checkpoint methods of a sharded slot (`_sharded_slot_class`); yields the list of
        those created."""
        index, created = self.shards.index_of(reference), []

        def as_sharded_slot(next_creator, **kwargs):
            value = next_creator(**kwargs)
            value.__class__ = _sharded_slot_class(type(value))
            _slot_values[id(value)] = (weakref.ref(self), index)
            created.append(value)
            return value

        with tf.variable_creator_scope(as_sharded_slot):
            yield created

    # ----------------------------------------------------------- tf.train.Checkpoint
    def checkpoint_value(self, value, index: int) -> tf.Tensor:
        """The whole slot (of model variable `index`) whose slice `value` holds, when a
        `tf.train.Checkpoint` writes it: the consolidated one (inside `consolidated`), else
        gathered from every rank now (every rank saves, as the multi-worker guide's loops do; a
        save on one rank alone fails once the others are gone, or at the job timeout)."""
        shape = self.shards.variables[index].shape
        slot = self._slot_of_value.get(id(value))
        whole = self.whole_value(slot) if slot is not None else None
        if whole is not None:
            return tf.constant(np.reshape(whole, shape))
        communicator = self.shards.communicator
        with communicator.expect_progress(
                "gathering a sharded optimizer slot for tf.train.Checkpoint.save "
                "(shard_optimizer_state=True: every rank must save)"):
            gathered = communicator.all_gather(tf.convert_to_tensor(value))
        return tf.reshape(gathered, shape)

    def restore_checkpoint_value(self, value, index: int, restored) -> None:
        """Restore the slice `value` holds of the slot of model variable `index` from a
        checkpoint's whole `restored`."""
        variable = self.shards.variables[index]
        if int(np.prod(restored.shape)) != elements(variable):
            raise ValueError(
                f"tfdist rank {self.shards.rank}: the checkpoint holds {list(restored.shape)} "
                f"for an optimizer slot of {path(variable)}, not the whole "
                f"{list(variable.shape)}: it was written with the state sharded by a version of "
                "tfdist that saved slices. Save it again from the job that wrote it, or train "
                "from its weights alone.")
        whole = restored.numpy() if hasattr(restored, "numpy") else np.asarray(restored)
        start, stop = self.shards.ranges[index]
        with tf.init_scope():  # a slot created in a step's first trace: restored eagerly
            value.assign(np.reshape(whole, [-1])[start:stop])

    # ------------------------------------------------------------- Keras' own files
    def _in_order(self):
        return sorted(self._slots.values(), key=lambda item: str(item[0].path))

    def consolidate(self) -> None:
        """The whole value of every slot, gathered from every rank (eager; every rank calls)."""
        for slot, index in self._in_order():
            whole = self.shards.communicator.all_gather(tf.convert_to_tensor(slot))
            self._full[id(slot)] = np.reshape(whole.numpy(), self.shards.variables[index].shape)

    def release(self) -> None:
        self._full.clear()

    def whole_value(self, slot) -> Optional[np.ndarray]:
        """The whole value of `slot` consolidated (or loaded) here, or None."""
        return self._full.get(id(slot))

    def load_whole(self, slot, value) -> None:
        """Assign this rank's slice of the whole `value` of `slot` (kept for `share_loaded`
        while `keep_loaded`)."""
        value = np.asarray(value)
        index = self._slots[id(slot)][1]
        if self.keep_loaded:
            self._full[id(slot)] = value
        start, stop = self.shards.ranges[index]
        slot.assign(np.reshape(value, [-1])[start:stop])

    def share_loaded(self, root: int = 0) -> None:
        """Every rank takes its slices of the whole slots `root` loaded (eager; every rank)."""
        for slot, index in self._in_order():
            variable = self.shards.variables[index]
            value = self._full.get(id(slot))
            if value is None:
                value = np.zeros(variable.shape, tf.as_dtype(slot.dtype).as_numpy_dtype)
            whole = self.shards.communicator.broadcast(tf.constant(value), root).numpy()
            start, stop = self.shards.ranges[index]
            slot.assign(np.reshape(whole, [-1])[start:stop])
        self.release()

    @contextlib.contextmanager
    def consolidated(self):
        """Inside: the whole slots are known (gathered once: a save inside a save - the
        chief's backup writing its weights file - gathers nothing more)."""
        self._depth += 1
        try:
            if self._depth == 1:
                self.consolidate()
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.release()


# id(TensorFlow variable of a sharded slot) -> (its ShardedSlots, weakly; index of its model
# variable)
_slot_values: Dict[int, tuple] = {}
_SLOT_CLASSES: Dict[type, type] = {}


def _sharded_slot_class(base: type) -> type:
    """`base` (a TensorFlow variable class) with the checkpoint methods of a sharded slot: a
    `tf.train.Checkpoint` saves the whole slot and restores this rank's slice of it, at any
    number of ranks. Only the slots' own variables get it (`ShardedSlots.creating`)."""
    if base not in _SLOT_CLASSES:
        def _owner(value):
            slots, index = _slot_values[id(value)]
            return slots(), index

        def _serialize_to_tensors(self):
            slots, index = _owner(self)
            if slots is None:
                return base._serialize_to_tensors(self)  # pylint: disable=protected-access
            return {"VARIABLE_VALUE": _tf.lazy_save_spec(
                lambda: slots.checkpoint_value(self, index), self.dtype, self.device)}

        def _restore_from_tensors(self, restored_tensors):
            slots, index = _owner(self)
            if slots is None:
                return base._restore_from_tensors(self, restored_tensors)  # pylint: disable=W0212
            slots.restore_checkpoint_value(self, index, restored_tensors["VARIABLE_VALUE"])
            return self.value()

        _SLOT_CLASSES[base] = type(base.__name__, (base,), {
            "__module__": base.__module__, "_serialize_to_tensors": _serialize_to_tensors,
            "_restore_from_tensors": _restore_from_tensors})
    return _SLOT_CLASSES[base]
