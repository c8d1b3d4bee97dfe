"""Input iterators a strategy's dataset hands out are destroyed off the training thread.

In-process: the dataset tfdist gives Keras (`LocalSliceDataset`) yields the
same elements through the background-released iterator, its dropped
iterators are destroyed on the release thread, pipelines that call Python
keep TensorFlow's own iterator, and the release thread drains at close.
"""

import gc
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

from tfdist.strategies.inputs import iterator_release
from tfdist.strategies.inputs.local_input import LocalSliceDataset


def autotuned_pipeline():
    return (tf.data.Dataset.range(40).shuffle(40, seed=1).batch(8)
            .map(lambda rows: rows * 2, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def test_yields_the_same_batches_and_is_destroyed_on_the_release_thread():
    dataset = LocalSliceDataset(autotuned_pipeline())
    iterator = iter(dataset)
    assert isinstance(iterator, iterator_release.ReleasedInBackgroundIterator)
    released = [batch.numpy() for batch in iterator]
    expected = [batch.numpy() for batch in autotuned_pipeline()]
    assert all(np.array_equal(a, b) for a, b in zip(released, expected))
    assert len(released) == len(expected) == 5

    resource = weakref.ref(iterator._iterator_resource)
    del iterator
    gc.collect()
    assert iterator_release.wait_idle(timeout=60)
    assert resource() is None
    assert any(t.name == "tfdist-iterator-release" for t in threading.enumerate())


def test_every_epoch_gets_a_fresh_iterator_like_keras_expects():
    dataset = LocalSliceDataset(tf.data.Dataset.range(6).batch(4))
    epochs = [[batch.numpy().tolist() for batch in dataset] for _ in range(3)]
    assert epochs == [[[0, 1, 2, 3], [4, 5]]] * 3


@pytest.mark.parametrize("pipeline", ["py_function", "numpy_function", "from_generator"])
def test_pipelines_that_call_python_keep_tensorflows_iterator(pipeline):
    source = tf.data.Dataset.range(4)
    if pipeline == "py_function":
        dataset = source.map(lambda v: tf.py_function(lambda w: w + 1, [v], tf.int64))
    elif pipeline == "numpy_function":
        dataset = source.map(lambda v: tf.numpy_function(lambda w: w + 1, [v], tf.int64))
    else:
        dataset = tf.data.Dataset.from_generator(
            lambda: iter(range(1, 5)), output_signature=tf.TensorSpec((), tf.int64))
    dataset = LocalSliceDataset(dataset.batch(2))
    assert iterator_release.calls_python(dataset)
    iterator = iter(dataset)
    assert not isinstance(iterator, iterator_release.ReleasedInBackgroundIterator)
    assert [batch.numpy().tolist() for batch in iterator] == [[1, 2], [3, 4]]


def test_python_free_pipelines_are_recognised():
    assert not iterator_release.calls_python(autotuned_pipeline())
    mapped = tf.data.Dataset.from_tensor_slices(np.arange(6.0)).map(tf.math.square).batch(3)
    assert not iterator_release.calls_python(mapped)


def test_iterating_inside_a_tf_function_is_tensorflows_own():
    dataset = LocalSliceDataset(tf.data.Dataset.range(10).map(lambda v: v * 2))

    @tf.function
    def total():
        result = tf.constant(0, tf.int64)
        for value in dataset:
            result += value
        return result

    @tf.function
    def first(iterator):
        return next(iterator)

    assert int(total()) == 90
    iterator = iter(dataset)  # an eager iterator passed into a function, as Keras' step does
    assert [int(first(iterator)), int(first(iterator))] == [0, 2]


def test_close_drains_the_queue_and_later_releases_are_refused():
    releaser = iterator_release._Releaser()
    assert not releaser.release(object())  # not started: the caller drops it itself
    assert releaser.start()
    dropped = threading.Event()
    assert releaser.release(iterator_release._Signal(dropped))
    releaser.close()
    assert dropped.is_set()
    assert not releaser.release(object()) and not releaser.start()


@pytest.mark.launches  # one Python process that fails
def test_a_job_that_fails_in_training_still_exits(tmp_path):
    """The first release may come from a destructor at interpreter exit, after a failure: the
    thread must not be started there (a thread started while Python finalizes never runs)."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import tensorflow as tf\n"
        "from tfdist.strategies.inputs.local_input import LocalSliceDataset\n"
        "dataset = LocalSliceDataset(tf.data.Dataset.range(8).batch(2).prefetch(2))\n"
        "kept = iter(dataset)\n"  # a global, destroyed while the interpreter finalizes
        "next(kept)\n"
        "raise SystemExit(3)\n")
    done = subprocess.run([sys.executable, str(script)], timeout=120, capture_output=True,
                          text=True)
    assert done.returncode == 3, done.stderr[-2000:]
