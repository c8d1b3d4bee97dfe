"""The dataset a tfdist strategy hands to Keras: this process's input, iterated directly.

A tfdist process has one replica on one device, so its distributed dataset is
simply its own slice of the input (`batch_slicing.shard_global_batch`), iterated
the way Keras iterates a dataset on one device without a strategy: a plain
`tf.data` iterator, no per-device buffering.

Why not TensorFlow's `DistributedDataset`: for every iterator it opens a
`MultiDeviceIterator`, whose background thread keeps pulling elements from
the source pipeline. Keras opens a new iterator for every `evaluate` (and for
validation inside `fit`) and drops the previous one; destroying a
`MultiDeviceIterator` while its thread is inside the source iterator's
`GetNext` intermittently crashes the process with SIGSEGV (exit 139; native
stacks: main thread in `MultiDeviceBuffer::Reset` under `~IteratorResource`,
the crashing thread in `DatasetBaseIterator::GetNext` under
`MultiDeviceBuffer::BackgroundThread`). With one device per process the
multi-device buffer buys nothing, so tfdist does not create it.

Cost: none beyond the pipeline's own; a `prefetch` in the user's pipeline
still overlaps input with the step. On a GPU the batch is copied to the
device inside the step, as in single-process Keras. The iterators Keras drops
at each epoch's start are destroyed off the training thread
(`iterator_release`).
"""

from tfdist import _tf
from tfdist.strategies.inputs import iterator_release


class LocalSliceDataset(_tf.UnaryUnchangedStructureDataset):
    """A `tf.data.Dataset` marked as this process's already-distributed input.

    It is the dataset it wraps (same elements, same iterator); the mark lets
    the strategy return it unchanged when it is distributed again - a user's
    `strategy.experimental_distribute_dataset(ds)` passed to `model.fit`,
    which Keras then hands back to the strategy - instead of slicing a slice.
    Keras accepts it wherever it accepts a `tf.data.Dataset`.
    """

    def __init__(self, dataset):
        super().__init__(dataset, dataset._variant_tensor)  # pylint: disable=protected-access
        self._python_free = None  # whether no transformation calls Python (computed once)

    def __iter__(self):
        if self._python_free is None:
            self._python_free = not iterator_release.calls_python(self)
        iterator = iterator_release.iterate(self) if self._python_free else None
        return iterator if iterator is not None else super().__iter__()


def derives_from_local_slice(dataset):
    """True if `dataset` is a `LocalSliceDataset` or a transformation of one.

    Keras maps a dataset it is given (`class_weight` adds a weight per
    example): the result of mapping this process's slice is still this
    process's input and must not be sliced again.
    """
    pending, seen = [dataset], set()
    while pending:
        current = pending.pop()
        if isinstance(current, LocalSliceDataset):
            return True
        if id(current) in seen:
            continue
        seen.add(id(current))
        inputs = getattr(current, "_inputs", None)
        pending.extend(inputs() if callable(inputs) else [])
    return False
